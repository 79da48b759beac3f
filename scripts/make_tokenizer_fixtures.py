"""Write tests/data/llama_cpp_tokens/: llama.cpp's own token ids for many texts, per vocabulary.

tests/test_tokenizer_llama_cpp.py checks memra's tokenizer against these files. The vocabularies are
llama.cpp's vocab-only test files (models/ggml-vocab-*.gguf in the llama-cpp-python sdist, which the
tests fetch with pip), the same files with tokenizer.ggml.pre set to each other value llama.cpp knows,
and the two models the rest of the tests use (SmolLM2, Gemma 3).

Run once, by hand, when the texts or the pinned llama-cpp-python version change (about 5 minutes of
build on two cores, then seconds):

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/lcpp
    tar xzf /tmp/lcpp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcpp
    L=/tmp/lcpp/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -S $L -B $L/build -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=ON \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build $L/build --target llama -j2
    python scripts/make_tokenizer_fixtures.py $L
"""
from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "llama_cpp_tokens"
ORACLE_SOURCE = ROOT / "scripts" / "llama_cpp_oracle" / "tokenize_texts.cpp"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

# llama.cpp's vocab files that memra's tokenizer types cover (bert-bge and nomic-bert-moe are WordPiece
# and Unigram vocabularies, which memra does not load).
VOCABS = ["aquila", "baichuan", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
          "gpt-neox", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]

# Every tokenizer.ggml.pre name llama.cpp's llama-vocab.cpp accepts for a BPE vocabulary. Each is also
# checked on GPT-2's and Llama 3's vocabularies with only that field changed. Not here: "gemma4",
# "granite-embed-multi-311m", "sarvam-moe" and "whitespace" split raw UTF-8, not GPT-2's bytes, and
# llama.cpp aborts on such a byte-level vocabulary (a word with a space reaches its merge lookup);
# Gemma 4's own file checks the ▁-escaped kind on a vocabulary made for it.
PRE_NAMES = [
    "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
    "lfm2", "jina-v5-nano", "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "falcon",
    "mpt", "starcoder", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
    "a.x-4.0", "mellum", "modern-bert", "jais-2", "jina-v1-en", "jina-v2-code", "roberta-bpe", "refact",
    "command-r", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "stablelm2", "olmo", "dbrx",
    "smaug-bpe", "poro-chat", "chatglm-bpe", "glm4", "glm5", "viking", "jais", "tekken", "smollm",
    "codeshell", "bloom", "gpt3-finnish", "exaone", "exaone4", "exaone-moe", "chameleon", "minerva-7b",
    "megrez", "gpt-4o", "llama4", "kanana2", "talkie", "granite-embed-multi-97m", "tiny_aya", "cohere2moe",
    "superbpe", "trillion", "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder",
    "hunyuan", "hunyuan-dense", "hy_v4", "joyai-llm", "kimi-k2", "ufakzeka", "grok-2", "afmoe", "laguna",
    "minimax-m2", "solar-open", "mellum2",
]

SCRIPTS = [
    "Tiếng Việt có dấu: Việt Nam, người, được, những, ở đâu?",
    "Vie\u0302\u0301t Nam (decomposed) nguo\u031b\u0300i",
    "हिन्दी भाषा में लिखा गया वाक्य। क्षत्रिय",
    "বাংলা ভাষা, தமிழ் மொழி, తెలుగు, ಕನ್ನಡ, മലയാളം, ગુજરાતી, ਪੰਜਾਬੀ",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ ພາສາລາວ ភាសាខ្មែរ မြန်မာဘာသာ",
    "བོད་ཡིག་ ქართული ენა Հայերեն լեզու አማርኛ ቋንቋ",
    "العربية: مرحبا بالعالم، كيف حالك؟ فارسی: سلام دنیا ٠١٢٣٤٥٦٧٨٩",
    "עברית: שָׁלוֹם עוֹלָם, ײִדיש",
    "Ελληνικά: Καλημέρα κόσμε! Русский: Привет, мир! Українська: ґїє",
    "한국어 문장입니다. 한글 자모: \u1112\u1161\u11ab",
    "日本語の文章です。カタカナ、ひらがな、漢字。ｈａｌｆ－ｗｉｄｔｈ ｶﾀｶﾅ",
    "中文简体和繁體中文，标点符号：「引号」《书名》……——",
    "ᠮᠣᠩᠭᠣᠯ ᏣᎳᎩ ᐃᓄᒃᑎᑐᑦ ꦗꦮ 𐌰𐌱𐌲 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ℌ𝔢𝔩𝔩𝔬",
    "Türkçe: İstanbul ılık; Deutsch: Straße ÄÖÜ; Français: œuvre déjà; Čeština ŽŠ; Ærø Øst",
    "IPA: ˈɪntərˌnæʃənəl ʃ ʒ θ ð ŋ; math: ∀x∈ℝ, ∑ᵢ xᵢ² ≤ ∞ ≠ ½ ⅓ ①②",
]
EMOJI = [
    "Emoji: 😀 😃 🎉 👍🏽 👍🏿 🇫🇷🇯🇵 1️⃣ #️⃣ ❤️ ❤️‍🔥 🏳️‍🌈",
    "family 👨‍👩‍👧‍👦 and 👩🏽‍💻, text😀without spaces😀",
    "🤖🦀🐍🚀✨ ☃ ☕ ⌚ 🧑‍🤝‍🧑",
]
CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "const f = async (x) => { await x?.y ?? 0; }; // arrow\n\n\n",
    '{"key": [1, 2.5, -3e10], "nested": {"a": null, "b": "\\u00e9"}}',
    "<div class=\"a\">&nbsp;<br/></div>\n  <!-- comment -->",
    "for i in $(seq 1 10); do echo \"$i\" | grep -E '^[0-9]+$'; done",
    "SELECT a.b, COUNT(*) FROM t WHERE x >= 10 AND y <> 'it''s' GROUP BY 1;",
    "    indented\n\tTabbed\n  \t mixed\n\n\n    \n",
]
WHITESPACE = [
    " Hello", "  Hello", "   Hello", "    Hello", " ", "  ", "   ", "    ", "\t", " \t", "\n", " \n", "\n ",
    "\n\n", "\n\n\n", " \n\n ", "\r\n", "\r\n\r\n", "Hello  world", "Hello   world", "Hello    world",
    "Hello world ", "Hello world  ", "trailing   ", " \t \n  mixed whitespace \t\n ", "\n\nHello\n\n  world  \n",
    "word\u00a0nbsp\u3000ideographic\u2009thin\u200bzero-width\u2028line sep",
    "a\u0085b\u000bc\u000cd\u001ce\u001ff", "  \u00a0  leading nbsp", "   ...   ", " 'll 's 'LL 'S",
]
WORDS = [
    "Hello world", "Hello, world! How are you today?", "it's they're we've I'm you'll he'd IT'S DON'T",
    "Numbers: 0 7 42 2024 1234567890 3.14159 1,000,000 -17 1e-9 0x1F ²½",
    "1 12 123 1234 12345 123456 1234567 12345678 123456789 ١٢٣٤ १२३",
    "URL https://example.com/path?q=1&r=2#frag and email a.b@c.org",
    "CamelCaseWord snake_case_word kebab-case-word UPPER lower MiXeD", "a", "A.", "...",
    "ÀÉÎÕÜ àéîõü ÇçÑñ — “quotes” ‘single’ «guillemets» „low“",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
]

# Where llama.cpp's pre-tokenizers differ from each other: runs of whitespace of many lengths before
# a word, letter case inside words, accents, apostrophes, slashes, digit runs, CJK next to Latin.
PRE_BASES = ["gpt-2", "llama-bpe"]
SPLITTER_EDGES = [
    "a" + "".join(" " * n + "w" for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 65)),
    "x" + " " * 20 + "\n" + " " * 7 + "\ty" + "\t" * 5 + "z" + " \r\n" * 3 + "  ",
    "CamelCaseWord camelCase HTTPServer getHTTPResponse ÉCOLEÉcole ĞüzelÇok ǅungla ᾈ XMLHttpRequest",
    "l'homme d'état, Ankara'nın, they'RE we'Ve it'S don't rock'n'roll O'Neil's '90s",
    "path/to/file//x /usr/bin/ a/b/c/ ///\n// comment\n/*x*/ https://a.b/c?d=e",
    "12 123 1234 12345 123456 1234567 x1y22z333 ٣٤٥ ۱۲۳ ๑๒๓ ½¼ ①② 12.5% $1,234.56",
    "abc1234567 def  42\n      1234 end", "      418942 after spaces", "x\u3000\u3000y \u00a0\u00a0z\u2009 \u2028w",
    "Hel\x0blo wo\x1frld \x0b\u1680 a\x07b\x1b[0m",
    "English中文混合Text日本語とEnglish한국어Mixed ｆｕｌｌ　ｗｉｄｔｈ　ｓｐａｃｅ「括弧」、句読点。",
    "e\u0301 a\u0308o\u0308 n\u0303 \u0915\u094d\u0937 \u0e01\u0e34\u0e48 x\u20dd \u05e9\u05c1\u05b8",
    "foo--bar a.b.c x...y !!!?? (a)[b]{c} <tag> @user #hash $var %d ^_^ ~/.rc `code` \\n",
    "<sentinel:12> IMGIMGABZ IMGIMGAAAAAZ \t\t    ok  two",
]

# Character pools for seeded random strings, the same as tests/test_tokenizer.py's.
POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789²½٣", "     \t\n\r",
    ".,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`", "日本語中文字한국어", "éèàçñüößøå", "שלוםمرحبا",
    "😀🎉👍🏽👨‍👩‍👧‍👦🇫🇷", "\u0301\u0308\u200d\ufe0f", "ΑΒΓαβγабвгд", "'s 'll 'VE n't",
    "ệếờữạảấầẩẫậắằẳẵặ", "กขคงจฉชซ่้๊๋ิีึืุู", "क्षत्रज्ञािीुूेैोौं",
]


def random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        runs = (rng.choice(POOLS) for _ in range(rng.randint(1, 20)))
        texts.append("".join("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))) for pool in runs))
    return texts


def ggml_vocab_test_texts(models: Path) -> list[str]:
    """The texts of llama.cpp's own tokenizer tests (models/*.inp), each once."""
    texts: list[str] = []
    for inp in sorted(models.glob("ggml-vocab-*.gguf.inp")):
        for text in inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n"):
            if text not in texts:
                texts.append(text)
    return texts


def special_texts(tokens: list[str], token_types: list[int]) -> list[str]:
    """Texts around the vocabulary's own control and user-defined tokens: a space prefix, whitespace
    and other special tokens right after one of them."""
    preferred = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>", "<|endoftext|>",
                 "<start_of_turn>", "<end_of_turn>", "<bos>", "<|user|>", "<|assistant|>", "<|end|>", "<unk>"]
    special = [t for t, kind in zip(tokens, token_types) if kind in (2, 3, 4) and t.strip() == t and t]
    chosen = [t for t in preferred if t in special][:3]
    chosen += [t for t in special if t not in chosen and len(t) > 2][: 3 - len(chosen)]
    if not chosen:
        return []
    a = chosen[0]
    b = chosen[1] if len(chosen) > 1 else chosen[0]
    c = chosen[-1]
    return [a, f"{a}Hello", f"{a} Hello", f"{a}  Hello", f"{a}\nHello", f"{a}\n\n  Hello", f"{a} ",
            f" {a} ", f"Hello{a} world", f"Hello {a}world", f"{a}{b} x", f"{a} {b}  {c}", f"{a}\t{b}\n",
            f"x {a}   y {b}\n z", f"{a}user\nWhat is 2+2?{b}\n{a}assistant\n", f"{c}日本語 {c} 😀",
            f"{a}\u3000\u00a0x {b}\x0c\x0b y{c} \u2009"]


def base_texts(models: Path) -> list[str]:
    return ggml_vocab_test_texts(models) + SPLITTER_EDGES + WHITESPACE + WORDS + SCRIPTS + EMOJI + CODE + random_texts(40, 17)


def pre_override_texts() -> list[str]:
    """A shorter list for the pre-tokenizer variants: each splitter's cases, not every script."""
    return SPLITTER_EDGES + WHITESPACE + WORDS + SCRIPTS + EMOJI + CODE + random_texts(20, 29)


def with_pre(src: Path, pre: str, dst: Path) -> None:
    """A copy of a vocab-only GGUF (no tensors) with tokenizer.ggml.pre set to pre."""
    data = src.read_bytes()
    key = b"tokenizer.ggml.pre"
    at = data.find(struct.pack("<Q", len(key)) + key)
    if at < 0:
        raise SystemExit(f"{src}: no tokenizer.ggml.pre to replace")
    value_at = at + 8 + len(key) + 4  # key length, key, value type (string)
    (old_len,) = struct.unpack_from("<Q", data, value_at)
    new = pre.encode()
    dst.write_bytes(data[:value_at] + struct.pack("<Q", len(new)) + new + data[value_at + 8 + old_len:])


def run_oracle(tool: Path, vocab: Path, texts: list[str]) -> tuple[list[list[int]], bool]:
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(b"\0".join(t.encode() for t in texts))
        f.flush()
        out = subprocess.run([str(tool), str(vocab), f.name], check=True, capture_output=True).stdout.decode()
    lines = out.split("\n")
    ids = [[int(x) for x in line.split()] for line in lines[: len(texts)]]
    assert lines[len(texts)].startswith("add_bos "), lines[len(texts)]
    return ids, lines[len(texts)] == "add_bos 1"


def write_fixture(name: str, header: dict, texts: list[str], ids: list[list[int]]) -> None:
    # One case a line keeps the files reviewable in a diff (json escapes every control character, so
    # a text never spans lines).
    lines = [json.dumps(header, ensure_ascii=False)]
    lines += [json.dumps([text, case], ensure_ascii=False) for text, case in zip(texts, ids)]
    (OUT / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    llama_cpp = Path(sys.argv[1]).resolve()
    models = llama_cpp / "models"
    sys.path.insert(0, str(ROOT))
    from memra_engine.model.gguf_file import open_gguf

    tool = Path(tempfile.gettempdir()) / "memra_tokenize_texts"
    lib = llama_cpp / "build" / "bin"
    subprocess.run(["g++", "-O1", "-std=c++17", f"-I{llama_cpp}/include", f"-I{llama_cpp}/ggml/include",
                    str(ORACLE_SOURCE), f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}", "-o", str(tool)], check=True)
    OUT.mkdir(parents=True, exist_ok=True)
    texts = base_texts(models)

    def oracle(path: Path, cases: list[str]) -> tuple[list[str], list[list[int]], bool]:
        md = open_gguf(path).metadata
        all_texts = cases + special_texts(md["tokenizer.ggml.tokens"], md.get("tokenizer.ggml.token_type") or [])
        return all_texts, *run_oracle(tool, path, all_texts)

    for f in OUT.glob("*.jsonl"):
        f.unlink()
    for vocab in VOCABS:
        file = f"ggml-vocab-{vocab}.gguf"
        cases, ids, add_bos = oracle(models / file, texts)
        write_fixture(vocab, {"vocab": file, "add_bos": add_bos}, cases, ids)
    # Pre-tokenizer names that give llama.cpp the same ids share one file. Two base vocabularies:
    # GPT-2's short tokens hide some differences between splitters that Llama 3's long ones show.
    with tempfile.TemporaryDirectory() as tmp:
        for base in PRE_BASES:
            groups: dict[str, tuple[list[str], list[str], list[list[int]], bool]] = {}
            for pre in PRE_NAMES:
                path = Path(tmp) / f"{pre}.gguf"
                with_pre(models / f"ggml-vocab-{base}.gguf", pre, path)
                cases, ids, add_bos = oracle(path, pre_override_texts())
                key = json.dumps([ids, add_bos])
                groups.setdefault(key, ([], cases, ids, add_bos))[0].append(pre)
            for names, cases, ids, add_bos in groups.values():
                header = {"vocab": f"ggml-vocab-{base}.gguf", "pre": names, "add_bos": add_bos}
                write_fixture(f"pre-{names[0]}-on-{base}", header, cases, ids)
    cache = Path.home() / ".cache" / "memra" / "models"
    for name, file in (("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), ("gemma3", "gemma-3-270m-q4_k_m.gguf")):
        cases, ids, add_bos = oracle(cache / file, texts)
        write_fixture(name, {"vocab": name, "add_bos": add_bos}, cases, ids)
    total = sum(len(f.read_text().split("\n")) - 2 for f in OUT.glob("*.jsonl"))
    print(f"{len(list(OUT.glob('*.jsonl')))} files, {total} cases")

if __name__ == "__main__":
    main()
