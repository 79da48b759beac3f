"""How llama.cpp splits text into words before BPE, for each `tokenizer.ggml.pre` it knows.

The table follows llm_tokenizer_bpe in llama.cpp's src/llama-vocab.cpp (the version vendored in
llama-cpp-python 0.3.36): the same regexes, applied one after the other, each splitting the pieces the
one before left. We write them for the Oniguruma regexes of `tokenizers`, which match the way
llama.cpp runs them:

- llama.cpp runs most regexes on a "collapsed" copy of the text, where every non-ASCII character stands
  for its Unicode category. There \\p{Lu}, \\p{Ll}, \\p{Lt}, \\p{Lm} and \\p{Lo} all mean "a letter",
  so we write \\p{L} for each (see `_any_letter`).
- \\d and $ mean [0-9] and "end of the piece" there; Oniguruma's \\d takes every decimal digit and its
  $ also matches before a newline, so we write [0-9] and \\z.
- The other regexes (literal non-ASCII ranges, no \\p{..}) run on the text with every non-ASCII space
  replaced by \\v, so such a range never matches U+3000 or another space inside it (`&&[^\\s]`).
- A few regexes llama.cpp does not run at all but replaces by hand-written splitters (GPT-2's, Llama
  3's, Qwen's, Kimi K2's, AFMoE's digit groups, newline runs). Those are written as the regex each
  splitter implements, including what it does differently from the model's tokenizer.json (Kimi K2
  ignores letter case and accent marks; AFMoE's keeps a number's first digits joined to the text
  before them).

tests/test_tokenizer_llama_cpp.py checks every entry against llama.cpp's own output.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

# English contractions, case-insensitive the way llama.cpp spells it ((?i:...) would also fold 'ſ').
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_JAIS2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
          r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
_DEEPSEEK_LLM_LETTERS = (  # \u escapes: characters that Unicode normalization would change
    "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛ"
    "ὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-"
    "ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃")
# llama.cpp runs a regex without \p{..} on the text with every non-ASCII space replaced by \v, so a
# literal range never matches U+3000 and the other spaces in it: `&&[^\s]` takes them out here too.
_CJK_HANGUL = "[[一-龥ࠀ-一가-퟿]&&[^\\s]]+"
_CJK_KANA = "[一-龥぀-ゟ゠-ヿ]+"
_DEEPSEEK3_WORDS = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPARK_WORDS = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+")
_GPT4O_STYLE = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" + _CONTRACTIONS
                + "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" + _CONTRACTIONS
                + "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
# llama.cpp's rewrite of GPT-4o's and Tekken's upper/lower-case runs with look-aheads; on letters
# outside ASCII both halves match, so case only counts for A-Z and a-z.
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
          rf"{_CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER_M, _LOWER_M = r"((?=[\p{L}\p{M}])([^a-z]))", r"((?=[\p{L}\p{M}])([^A-Z]))"
_GRANITE_MULTI = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_M}*{_LOWER_M}+{_CONTRACTIONS}?"
                  rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_M}+{_LOWER_M}*{_CONTRACTIONS}?"
                  r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_POOR_SPLIT = " ?[^(\\s|.,!?…。，、।۔،)]+"
# AFMoE's hand-written digit splitter (Tiny Aya's too): digit runs cut into threes from the right, the
# first group taking the remainder, and that first group still joined to the text before it.
_DIGITS_FROM_RIGHT = r"\P{N}*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
_NEWLINE_RUNS = "[^\\n]+|[\\n]+"
# Kimi K2's hand-written splitter: Han runs, then words of any other letters (no case, no \p{M}).
_HAN = r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]"
_KIMI_K2 = (rf"{_HAN}+|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}&&[^{_HAN[1:-1]}]]+{_CONTRACTIONS}?|\p{{N}}{{1,3}}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_YOUTU_CJK = "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"
_YOUTU_WORDS = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" + _CONTRACTIONS
                + "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
                + _CONTRACTIONS + "?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_AFMOE_CJK = "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+"


def _any_letter(regex: str) -> str:
    """llama.cpp's collapsed text has one code for every letter: \\p{Lu} and the rest mean \\p{L}."""
    return re.sub(r"\\p\{L[ultmo]\}", r"\\p{L}", regex)


@dataclass(frozen=True)
class PreTokenizer:
    """One of llama.cpp's pre-tokenizer types."""

    splits: tuple[str, ...]          # regexes, applied in order, each match (and each gap) a word
    ignore_merges: bool = False      # a word that is a whole token is taken as it is, without merges
    add_bos: bool | None = None      # llama.cpp's default for tokenizer.ggml.add_bos_token, if it sets one
    byte_level: bool = True          # False: BPE over raw UTF-8 with <0xNN> byte tokens, not GPT-2 bytes
    escape_spaces: bool = False      # spaces are written as ▁ before BPE (Gemma 4)


_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"))
_TYPES: dict[tuple[str, ...], PreTokenizer] = {
    ("default",): _DEFAULT,
    ("minicpm5",): PreTokenizer((r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), ignore_merges=True),
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"):
        PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True),
    ("dbrx", "smaug-bpe"): PreTokenizer((_LLAMA3,)),
    ("jais-2",): PreTokenizer((_JAIS2,)),
    ("deepseek-llm",): PreTokenizer(("[\r\n]", rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+", r"\s?[[!-/:-~！-／：-～‘-‟　-。]&&[^\s]]+",
                                     r"\s+\z", _CJK_HANGUL, r"\p{N}+")),
    ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"):
        PreTokenizer((r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3_WORDS)),
    ("spark2_5",): PreTokenizer((r"\p{N}{1,3}", _CJK_KANA, _SPARK_WORDS, r"\p{N}")),
    ("youtu",): PreTokenizer((_YOUTU_CJK, _any_letter(_YOUTU_WORDS)), ignore_merges=True),
    ("deepseek-coder",): PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}")),
    ("falcon",): PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"):
        PreTokenizer((r"\p{N}", _GPT2)),
    ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
     "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4", "trillion",
     "granite-docling"): PreTokenizer((_GPT2,)),
    # "qwen2.5" is not a name llama.cpp knows (it refuses such a file); memra has always read it as qwen2.
    ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan", "solar-open", "grok-2",
     "qwen2.5"): PreTokenizer((_QWEN2,)),
    ("qwen35",): PreTokenizer((_QWEN35,)),
    ("poro-chat", "bloom", "gpt3-finnish"): PreTokenizer((_POOR_SPLIT,)),
    ("chatglm-bpe",): PreTokenizer((_LLAMA3,)),
    ("glm4", "glm5"): PreTokenizer((_LLAMA3,), ignore_merges=True),
    ("viking",): PreTokenizer((_POOR_SPLIT, r"\p{N}")),
    ("tekken",): PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    ("chameleon",): PreTokenizer(("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
                                  r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", _GPT2), add_bos=True),
    ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"): PreTokenizer((_GPT4O,)),
    ("granite-embed-multi-97m",): PreTokenizer((_GRANITE_MULTI,), ignore_merges=True),
    ("tiny_aya", "cohere2moe"): PreTokenizer((_DIGITS_FROM_RIGHT, _any_letter(_GPT4O_STYLE))),
    ("kimi-k2",): PreTokenizer((_KIMI_K2,)),
    ("superbpe",): PreTokenizer((r"\p{N}+", "(?=([0-9]{3})+(?![0-9]))")),
    ("bailingmoe", "bailingmoe2", "llada-moe"):
        PreTokenizer((r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                      r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",)),
    ("seed-coder",): PreTokenizer((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                                   r"|\s*[\r\n]+|\s+(?!\S)|\s+",)),
    ("ufakzeka",): PreTokenizer((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)),
    ("afmoe",): PreTokenizer((_DIGITS_FROM_RIGHT, _AFMOE_CJK, _DEEPSEEK3_WORDS)),
    ("laguna",): PreTokenizer((_NEWLINE_RUNS, _QWEN2)),
    ("exaone-moe",): PreTokenizer((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",)),
    # ▁-escaped BPE over raw UTF-8 (Gemma 4, Sarvam): only newline runs are split off.
    ("gemma4", "granite-embed-multi-311m", "sarvam-moe"):
        PreTokenizer((_NEWLINE_RUNS,), byte_level=False, escape_spaces=True),
    ("whitespace",): PreTokenizer((r"\S+",), byte_level=False),
}
PRE_TOKENIZERS: dict[str, PreTokenizer] = {name: rule for names, rule in _TYPES.items() for name in names}


def pre_tokenizer_for(pre: str) -> PreTokenizer:
    """llama.cpp's pre-tokenizer for a tokenizer.ggml.pre value. llama.cpp refuses a name it does not
    know; we split such text with its default regexes and say so."""
    rule = PRE_TOKENIZERS.get(pre)
    if rule is None:
        log.warning("tokenizer.ggml.pre=%r is not known; splitting text with llama.cpp's default regexes", pre)
        rule = _DEFAULT
    return rule
