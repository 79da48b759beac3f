"""Tokenizer parity with llama.cpp itself, on llama.cpp's own vocabularies.

The expected ids in tests/data/llama_cpp_tokens/ come from llama.cpp's llama_tokenize (add_special
off, parse_special on), written by scripts/make_tokenizer_fixtures.py from the llama.cpp that
llama-cpp-python 0.3.36 vendors. The vocabularies are that release's vocab-only test files
(models/ggml-vocab-*.gguf, about 70 MB): the sdist is fetched once with pip into memra's cache
directory. CI has PyPI, so a failed download fails the tests rather than skipping them.

Each file is one vocabulary: the real ones (SentencePiece, byte-level BPE with its own pre-tokenizer,
Gemma 4), GPT-2's and Llama 3's with tokenizer.ggml.pre set to each value llama.cpp knows (names that
gave llama.cpp the same ids share a file), and the SmolLM2 and Gemma 3 models the other tests use.
"""
from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from memra_engine.model.gguf_file import open_gguf
from memra_engine.pretokenizers import PRE_TOKENIZERS, pre_tokenizer_for
from memra_engine.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
FIXTURES = Path(__file__).parent / "data" / "llama_cpp_tokens"
FIXTURE_FILES = sorted(FIXTURES.glob("*.jsonl"))
LLAMA_CPP_IN_SDIST = "llama_cpp_python-0.3.36/vendor/llama.cpp/"


def read_fixture(path: Path) -> tuple[dict, list[tuple[str, list[int]]]]:
    lines = path.read_text(encoding="utf-8").split("\n")
    return json.loads(lines[0]), [tuple(json.loads(line)) for line in lines[1:] if line]


@pytest.fixture(scope="session")
def llama_cpp_files() -> Path:
    """llama.cpp's vocab files and src/llama-vocab.cpp from the llama-cpp-python sdist, cached."""
    import platformdirs

    cache = Path(platformdirs.user_cache_dir("memra")) / "llama-cpp-vocab" / LLAMA_CPP_PYTHON.split("==")[1]
    if cache.is_dir():
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache.parent) as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--retries", "2", "--no-binary", ":all:",
               "--no-deps", LLAMA_CPP_PYTHON, "-d", tmp]
        result = subprocess.run(pip, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.fail(f"cannot fetch {LLAMA_CPP_PYTHON} from PyPI for llama.cpp's vocab files "
                        f"(pip download exit {result.returncode}): {result.stderr.strip()[-500:]}")
        (sdist,) = Path(tmp).glob("*.tar.gz")
        wanted = re.compile(re.escape(LLAMA_CPP_IN_SDIST) + r"(models/ggml-vocab-[\w.-]+\.gguf|src/llama-vocab\.cpp)")
        files = Path(tmp) / "files"
        files.mkdir()
        with tarfile.open(sdist) as tar:
            for member in tar:
                match = wanted.fullmatch(member.name)
                if match and member.isfile():
                    (files / Path(match.group(1)).name).write_bytes(tar.extractfile(member).read())
        # Renamed into place whole, so a cache directory that exists is complete.
        if not cache.is_dir():
            files.rename(cache)
    return cache


@pytest.fixture(scope="session")
def vocab_metadata(llama_cpp_files, request):
    """The GGUF metadata of a vocabulary by its fixture name, read once per session."""
    cache: dict[str, dict] = {}

    def metadata(name: str) -> dict:
        if name not in cache:
            models = {"smollm2": "smollm2_path", "gemma3": "gemma3_path"}
            path = request.getfixturevalue(models[name]) if name in models else llama_cpp_files / name
            cache[name] = dict(open_gguf(path).metadata)
        return dict(cache[name])

    return metadata


def encode_cases() -> list:
    """One case per vocabulary file; for a file of pre names, one per distinct rule memra has among
    them (llama.cpp gave every name in the file the same ids, so each rule must give them too)."""
    cases = []
    for path in FIXTURE_FILES:
        header, _ = read_fixture(path)
        if "pre" not in header:
            cases.append(pytest.param(path, None, id=path.stem))
            continue
        rules = {}
        for name in header["pre"]:
            rules.setdefault(PRE_TOKENIZERS.get(name), name)
        cases += [pytest.param(path, name, id=f"{path.stem}:{name}") for name in rules.values()]
    return cases


@pytest.mark.parametrize("fixture, pre", encode_cases())
def test_encode_matches_llama_cpp(fixture, pre, vocab_metadata):
    header, cases = read_fixture(fixture)
    metadata = vocab_metadata(header["vocab"])
    if pre is not None:
        metadata["tokenizer.ggml.pre"] = pre
    tok = load_tokenizer(metadata)
    differ = []
    for text, expected in cases:
        got = tok.encode(text)
        if got != expected:
            differ.append(f"{text!r}: llama.cpp {[tok.token_piece(i) for i in expected]}, "
                          f"memra {[tok.token_piece(i) for i in got]}")
    assert not differ, f"{len(differ)} of {len(cases)} texts differ, the first:\n" + "\n".join(differ[:5])
    assert tok.add_bos == header["add_bos"]


def test_the_fixtures_cover_every_vocabulary_shape():
    cases = sum(len(read_fixture(f)[1]) for f in FIXTURE_FILES)
    assert len(FIXTURE_FILES) >= 68 and cases >= 9000
    kinds = {read_fixture(f)[0]["vocab"] for f in FIXTURE_FILES}
    assert {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gemma-4.gguf",
            "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen35.gguf", "gemma3"} <= kinds


def test_every_pre_tokenizer_llama_cpp_knows_is_in_the_table(llama_cpp_files):
    source = (llama_cpp_files / "llama-vocab.cpp").read_text(encoding="utf-8")
    names = set(re.findall(r'tokenizer_pre == "([^"]+)"', source))
    assert len(names) > 80
    assert sorted(names - set(PRE_TOKENIZERS)) == []


def test_unknown_pre_tokenizer_warns_and_splits_like_default(caplog):
    with caplog.at_level(logging.WARNING, logger="memra_engine.pretokenizers"):
        assert pre_tokenizer_for("no-such-pre") == PRE_TOKENIZERS["default"]
    assert "no-such-pre" in caplog.text


# --- the cases issue 17 names, spelled out --------------------------------------------------------

@pytest.fixture(scope="session")
def llama_spm(llama_cpp_files):
    return load_tokenizer(llama_cpp_files / "ggml-vocab-llama-spm.gguf")


@pytest.mark.parametrize("text, pieces", [
    (" Hello", ["▁", "▁Hello"]),
    ("  ", ["▁▁▁"]),
    ("Hello", ["▁Hello"]),
    ("<s> Hello", ["<s>", "▁", "▁Hello"]),
    ("<s>Hello</s>world", ["<s>", "▁Hello", "</s>", "▁world"]),
])
def test_sentencepiece_space_prefix_as_llama_cpp(llama_spm, text, pieces):
    assert [llama_spm.token_piece(i) for i in llama_spm.encode(text)] == pieces


def test_sentencepiece_leading_spaces_survive_a_round_trip(llama_spm):
    for text in (" Hello", "  two spaces", "\tTab", " "):
        assert llama_spm.decode(llama_spm.encode(text)) == text


def test_phi3_special_tokens_eat_the_whitespace_after_them(llama_cpp_files):
    phi3 = load_tokenizer(llama_cpp_files / "ggml-vocab-phi-3.gguf")
    assert phi3.encode("<|user|>\nHi") == phi3.encode("<|user|>Hi") == phi3.encode("<|user|> \t\v\f\r\nHi")
    # only ASCII whitespace, as C's isspace: U+3000 stays, and the piece after it gets its ▁
    assert [phi3.token_piece(i) for i in phi3.encode("<|user|>\u3000Hi")][:2] == ["<|user|>", "▁"]
    assert phi3.encode("<s>\nHi") != phi3.encode("<s>Hi")        # <s> keeps it, as in llama.cpp


def test_llama3_takes_whole_words_without_merges(llama_cpp_files):
    """Llama 3's pre-tokenizer ignores merges for a word that is a token (tokenizer.json's
    ignore_merges): " Việt" is one token, where the merges alone give ĠVi + á»ĩ + t (issue 17)."""
    tok = load_tokenizer(llama_cpp_files / "ggml-vocab-llama-bpe.gguf")
    assert [tok.token_piece(i) for i in tok.encode("Cửa Việt")] == ["C", "á»Ńa", "ĠViá»ĩt"]


def test_gemma4_vocabulary_loads_and_starts_with_bos(llama_cpp_files):
    tok = load_tokenizer(llama_cpp_files / "ggml-vocab-gemma-4.gguf")
    assert tok.add_bos
    text = "Hello  world\n\n\tcafé 😀 \U00013000"
    assert tok.decode(tok.encode(text)) == text
