"""The model's tokenizer, rebuilt from the vocabulary a GGUF file carries, as a `tokenizers.Tokenizer`.

A GGUF has no tokenizer.json. It stores the tokens, their types, and either BPE merges (byte-level
"gpt2" vocabularies, and "gemma4" ones over ▁-escaped UTF-8) or per-token scores (SentencePiece
"llama" vocabularies), under llama.cpp's key names. Users bring files that llama.cpp tokenizes, so
llama.cpp is the reference: the ids must be the ones its llama_tokenize gives, which
tests/test_tokenizer_llama_cpp.py checks on its own vocabularies. We build the HF `tokenizers`
objects much as transformers' GGUF loader does (its tokenizer is the second oracle in
tests/test_tokenizer.py), and follow llama.cpp where the two differ: the pre-tokenizer of each
`tokenizer.ggml.pre` (engine/pretokenizers.py), SentencePiece's ▁ prefix in front of every piece of text
between special tokens, and which added tokens are matched in text.

Decoding for display goes through `StreamDecoder`: each token's raw bytes are fed to an incremental
UTF-8 decoder, so a character spread over several tokens (byte-level BPE pieces, or SentencePiece
<0xNN> byte-fallback tokens) is emitted only once it is whole.
"""
from __future__ import annotations

import codecs
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from memra_engine.errors import ModelFormatError, UnsupportedModelError
from memra_engine.pretokenizers import PreTokenizer, pre_tokenizer_for

log = logging.getLogger(__name__)

# llama.cpp's token types (tokenizer.ggml.token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Tokens that end a turn in common chat formats. llama.cpp treats each of these as end-of-generation
# when the vocabulary has it, whatever eos_token_id says (SmolLM2's <|endoftext|>, Gemma's <end_of_turn>).
END_OF_GENERATION_TEXTS = frozenset({
    "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "<end_of_utterance>",
})

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character (byte-level BPE's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


@dataclass(frozen=True)
class Vocabulary:
    """What the GGUF says about its tokenizer, checked, in python values."""

    kind: str                       # tokenizer.ggml.model: "gpt2", "llama" or "gemma4"
    pre: str                        # tokenizer.ggml.pre ("gemma4" for a gemma4 vocabulary, as llama.cpp sets)
    architecture: str
    name: str                       # general.name, lower case (llama.cpp keys Phi-3's token attributes on it)
    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    unk_id: int | None
    add_bos: bool
    add_space_prefix: bool

    @property
    def is_gemma(self) -> bool:
        return self.architecture.startswith("gemma")

    @property
    def prepends_space(self) -> bool:
        """Llama-style SentencePiece: ▁ goes in front of the text and of the text after each special
        token, and decoding strips it again from the very start."""
        return self.kind == "llama" and self.add_space_prefix

    @property
    def is_byte_level(self) -> bool:
        return self.kind != "llama" and self.pre_tokenizer.byte_level

    @property
    def pre_tokenizer(self) -> PreTokenizer:
        return pre_tokenizer_for(self.pre)

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any], source: str) -> Vocabulary:
        kind = md.get("tokenizer.ggml.model")
        if kind is None:
            raise ModelFormatError(f"{source}: no tokenizer in the file (tokenizer.ggml.model missing)")
        if kind not in ("gpt2", "llama", "gemma4"):
            raise UnsupportedModelError(
                f"{source}: tokenizer type {kind!r} is not supported (supported: gpt2, llama, gemma4)")
        tokens = md.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise ModelFormatError(f"{source}: tokenizer.ggml.tokens missing or not a list of strings")
        n = len(tokens)
        token_types = md.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * n
        scores = md.get("tokenizer.ggml.scores")
        merges = md.get("tokenizer.ggml.merges")
        for key, values in (("token_type", token_types), ("scores", scores)):
            if values is not None and len(values) != n:
                raise ModelFormatError(f"{source}: tokenizer.ggml.{key} has {len(values)} entries for {n} tokens")
        if kind != "llama" and not merges:
            raise ModelFormatError(f"{source}: BPE vocabulary without tokenizer.ggml.merges")

        def token_id(key: str) -> int | None:
            value = md.get(f"tokenizer.ggml.{key}")
            if value is None:
                return None
            if not isinstance(value, int) or not 0 <= value < n:
                raise ModelFormatError(f"{source}: tokenizer.ggml.{key}={value!r} is not a token id below {n}")
            return value

        # A gemma4 vocabulary always uses the gemma4 pre-tokenizer, whatever the file says.
        pre = "gemma4" if kind == "gemma4" else str(md.get("tokenizer.ggml.pre", "default"))
        # llama.cpp's default for add_bos: on for SentencePiece and for the pre-tokenizers that set it
        # (Llama 3, Tekken, ...); the file's own key wins, except that Gemma 4 always starts with BOS.
        default_bos = kind == "llama" or bool(pre_tokenizer_for(pre).add_bos)
        add_bos = bool(md.get("tokenizer.ggml.add_bos_token", default_bos)) or pre == "gemma4"
        return cls(
            kind=kind, pre=pre, architecture=str(md.get("general.architecture", "")),
            name=str(md.get("general.name", "")).lower(),
            tokens=tokens, token_types=[int(t) for t in token_types],
            scores=None if scores is None else [float(s) for s in scores], merges=merges,
            bos_id=token_id("bos_token_id"), eos_id=token_id("eos_token_id"), eot_id=token_id("eot_token_id"),
            eom_id=token_id("eom_token_id"), unk_id=token_id("unknown_token_id"),
            add_bos=add_bos, add_space_prefix=bool(md.get("tokenizer.ggml.add_space_prefix", kind == "llama")),
        )


# --- building the HF tokenizer ------------------------------------------------------------------

def _merge_pairs(merges: Sequence[str]) -> list[tuple[str, str]]:
    """"left right" merge strings, cut where llama.cpp cuts them: at the first space after the first
    character (a merge of a space token is " x"). One without a space can never apply; it is left out."""
    return [(merge[:cut], merge[cut + 1:]) for merge in merges if (cut := merge.find(" ", 1)) >= 0]


def _build_bpe(v: Vocabulary) -> HFTokenizer:
    """BPE with the file's vocab and merges and llama.cpp's pre-tokenizer for v.pre: over GPT-2's byte
    alphabet for most, over raw UTF-8 with ▁ for spaces and <0xNN> byte tokens for gemma4's.

    Tokens spelled outside the byte alphabet (added tokens such as "<｜begin▁of▁sentence｜>", or a run
    of spaces) keep their spelling: as in llama.cpp, only the added-token match reaches them."""
    rule = v.pre_tokenizer
    vocab = {t: i for i, t in enumerate(v.tokens)}
    model = models.BPE(vocab=vocab, merges=_merge_pairs(v.merges),
                       byte_fallback=not rule.byte_level, ignore_merges=rule.ignore_merges)
    hf = HFTokenizer(model)
    words = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in rule.splits]
    if rule.byte_level:
        # An ASCII character the vocabulary has no token for (Falcon's lack control characters) is
        # dropped by both, but in llama.cpp it still stands between its neighbours, which never merge
        # across it; `tokenizers` would merge them. A word of its own keeps them apart.
        spelling = bytes_to_unicode()
        missing = "".join(f"\\x{{{b:02x}}}" for b in range(128) if spelling[b] not in vocab)
        if missing:
            words.append(pre_tokenizers.Split(Regex(f"[{missing}]"), behavior="isolated"))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [*words, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        hf.decoder = decoders.ByteLevel()
        return hf
    if rule.escape_spaces:
        hf.normalizer = normalizers.Replace(" ", "\u2581")
    hf.pre_tokenizer = pre_tokenizers.Sequence(words)
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return hf


def _merges_by_score(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a scored SentencePiece vocabulary: every split of a token into two
    tokens is a merge, ranked by the merged token's score (best first), then longer left piece first,
    ties kept in vocabulary order. The same order as transformers' generate_merges, which is what
    makes our ids match its tokenizer."""
    vocab = set(tokens)
    ranked = []
    for token, score in dict(zip(tokens, scores)).items():
        for k in range(len(token) - 1, 0, -1):
            left, right = token[:k], token[k:]
            if left in vocab and right in vocab:
                ranked.append((score, k, len(token) - k, left, right))
    ranked.sort(key=lambda r: r[:3], reverse=True)  # stable: equal keys stay in vocabulary order
    return [(left, right) for *_, left, right in ranked]


def _build_sentencepiece(v: Vocabulary) -> HFTokenizer:
    """SentencePiece vocabulary as BPE over ▁-escaped text with <0xNN> byte fallback."""
    tokens = v.tokens
    scores = v.scores
    if v.is_gemma:
        # Gemma's scores do not follow its merge order; the order of the tokens in the file does.
        scores = [-float(i) for i in range(len(tokens))]
    elif scores is None:
        raise ModelFormatError("SentencePiece vocabulary without tokenizer.ggml.scores")
    unk = tokens[v.unk_id] if v.unk_id is not None else None
    hf = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=_merges_by_score(tokens, scores),
                                unk_token=unk, fuse_unk=True, byte_fallback=True))
    # ▁ for every space, and (add_space_prefix) one more in front of the text and of the text after
    # each special token, as llama.cpp does; the tokenizer splits the added tokens off before it
    # normalizes the pieces between them. Decoding strips the first one again.
    escape = normalizers.Replace(" ", "\u2581")
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), escape]) if v.prepends_space else escape
    decode_steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if v.prepends_space:
        decode_steps.append(decoders.Strip(content=" ", left=1, right=0))
    hf.decoder = decoders.Sequence(decode_steps)
    return hf


_MATCHED_IN_TEXT = (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED)


def _add_special_tokens(hf: HFTokenizer, v: Vocabulary) -> None:
    """Control and unknown tokens become special added tokens and user-defined ones plain added
    tokens: text that contains them is matched whole, as written (not byte- or ▁-encoded), before the
    rest is split and merged, as llama.cpp does."""
    control = [AddedToken(t, normalized=False, special=True)
               for t, kind in zip(v.tokens, v.token_types) if kind in (TOKEN_CONTROL, TOKEN_UNKNOWN)]
    if control:
        hf.add_special_tokens(control)
    user_defined = [AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(v.tokens, v.token_types) if kind == TOKEN_USER_DEFINED]
    if user_defined:
        hf.add_tokens(user_defined)


def _space_after_special_tokens(v: Vocabulary) -> re.Pattern | None:
    """llama.cpp's one per-model token attribute that changes chat prompts: for Phi-3 (by general.name)
    the special tokens other than <unk>, <s> and <|endoftext|> eat the ASCII whitespace after them
    (C's isspace, so not U+00A0 or U+3000, which the added tokens' own rstrip would also take)."""
    if "phi-3" not in v.name and "phi3" not in v.name:
        return None
    names = sorted({t for t, kind in zip(v.tokens, v.token_types) if kind in _MATCHED_IN_TEXT
                    and t not in ("<unk>", "<s>", "<|endoftext|>")}, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, names)) + ")[ \t\n\v\f\r]+") if names else None


def _token_bytes(v: Vocabulary, hf: HFTokenizer) -> list[bytes]:
    """The bytes each token id stands for when decoded, in the same way hf.decode spells them."""
    added = {i: t.content for i, t in hf.get_added_tokens_decoder().items()}
    if v.is_byte_level:
        # Each alphabet character stands for its byte, any other character for its UTF-8 bytes:
        # one str.translate to latin-1 characters does it for every token without a character above
        # U+00FF outside the alphabet; the rest (few) go character by character.
        to_byte = {ord(c): b for b, c in bytes_to_unicode().items()}
        table = {c: chr(to_byte[c]) if c in to_byte else chr(c).encode().decode("latin-1") for c in range(256)}
        table.update({c: chr(b) for c, b in to_byte.items()})
        out = []
        for i, token in enumerate(v.tokens):
            if i in added:
                out.append(added[i].encode())
                continue
            try:
                out.append(token.translate(table).encode("latin-1"))
            except UnicodeEncodeError:
                out.append(b"".join(bytes([to_byte[ord(c)]]) if ord(c) in to_byte else c.encode() for c in token))
        return out
    out = []
    for i, (token, kind) in enumerate(zip(v.tokens, v.token_types)):
        match = _BYTE_TOKEN.fullmatch(token) if kind == TOKEN_BYTE else None
        if match:
            out.append(bytes([int(match.group(1), 16)]))
        else:
            out.append(added.get(i, token).replace("\u2581", " ").encode())
    return out


class StreamDecoder:
    """Turns generated ids into text piece by piece, never emitting half a UTF-8 character.

    Concatenating every push (and a final flush) gives the same text as Tokenizer.decode(all ids)
    (with control tokens: Tokenizer.stream_decoder(control=True)).
    """

    def __init__(self, token_bytes: list[bytes], strip_first_space: bool):
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_first_space = strip_first_space
        self._started = False

    def push(self, token_id: int) -> str:
        data = self._token_bytes[token_id]
        if not self._started and data:
            self._started = True
            if self._strip_first_space and data.startswith(b" "):
                data = data[1:]
        return self._utf8.decode(data)

    def flush(self) -> str:
        """Whatever is left of an incomplete character at the end, as U+FFFD."""
        return self._utf8.decode(b"", final=True)

    def drop(self) -> None:
        """Forget an incomplete character's bytes. For a reply cut by its token limit: the character
        is not invalid, only unfinished, and a continued reply (reply_prefix) finishes it."""
        self._utf8.reset()


class Tokenizer:
    """Encode/decode for one model. `hf` is the full tokenizers.Tokenizer (llguidance takes its JSON)."""

    def __init__(self, hf: HFTokenizer, vocab: Vocabulary, token_bytes: list[bytes]):
        self.hf = hf
        self.vocab_size = len(vocab.tokens)
        self.bos_id = vocab.bos_id
        self.add_bos = vocab.add_bos and vocab.bos_id is not None
        self.eos_ids = _end_of_generation_ids(vocab)
        self.eos_id = vocab.eos_id
        self.kind = vocab.kind
        self._token_bytes = token_bytes
        # A reply shows control tokens (<|im_start|>, <start_of_turn>, ...) as nothing, as llama.cpp
        # does unless asked for them; user-defined ones (<think>) stay text.
        self._reply_bytes = [b"" if kind == TOKEN_CONTROL else data
                             for data, kind in zip(token_bytes, vocab.token_types)]
        self._tokens = vocab.tokens
        self._strip_first_space = vocab.prepends_space
        self._space_after_special = _space_after_special_tokens(vocab)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids for text. Special tokens written in the text are matched whole.
        add_special prepends BOS when the model asks for it (tokenizer.ggml.add_bos_token)."""
        if self._space_after_special is not None:
            text = self._space_after_special.sub(r"\1", text)
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids, control tokens spelled out (encode(decode(ids)) gives them back)."""
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """One token as text; a partial UTF-8 byte shows as U+FFFD."""
        return self._token_bytes[token_id].decode("utf-8", errors="replace")

    def token_piece(self, token_id: int) -> str:
        """The token as the vocabulary spells it (e.g. 'Ġthe', '▁the', '<0x0A>')."""
        return self._tokens[token_id]

    def stream_decoder(self, control: bool = False) -> StreamDecoder:
        """A decoder for a reply; control=True spells control tokens out, as decode() does."""
        return StreamDecoder(self._token_bytes if control else self._reply_bytes, self._strip_first_space)


def _end_of_generation_ids(v: Vocabulary) -> set[int]:
    ids = {i for i in (v.eos_id, v.eot_id, v.eom_id) if i is not None}
    for i, (token, kind) in enumerate(zip(v.tokens, v.token_types)):
        if token in END_OF_GENERATION_TEXTS and kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            ids.add(i)
    return ids


def load_tokenizer(source: Any) -> Tokenizer:
    """Tokenizer for a GGUF model. source: a path, an open GGUFFile, or a GGUF metadata mapping.

    Raises ModelFormatError (no or broken vocabulary) or UnsupportedModelError (unknown tokenizer type).
    """
    if isinstance(source, (str, os.PathLike)):
        from memra_engine.model.gguf_file import open_gguf

        g = open_gguf(source)
        metadata, name = g.metadata, g.path.name
    elif hasattr(source, "metadata"):
        metadata, name = source.metadata, getattr(getattr(source, "path", None), "name", "model")
    else:
        metadata, name = source, "model"
    vocab = Vocabulary.from_metadata(metadata, name)
    try:
        build = _build_sentencepiece if vocab.kind == "llama" else _build_bpe
        hf = build(vocab)
        _add_special_tokens(hf, vocab)
    except ModelFormatError as e:
        raise ModelFormatError(f"{name}: {e}") from None
    except Exception as e:  # tokenizers rejects a malformed vocab/merge list with its own exceptions
        raise ModelFormatError(f"{name}: cannot build the tokenizer ({type(e).__name__}: {e})") from None
    return Tokenizer(hf, vocab, _token_bytes(vocab, hf))
