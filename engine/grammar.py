"""Grammar-constrained replies: llguidance turns a grammar into a token bitmask per step.

A `Grammar` is plain data (its kind and the text the user gave) plus the llguidance grammar it
compiles to. It is checked when it is built, without a model: an invalid grammar, or a JSON
Schema feature llguidance does not support, raises GrammarError with one line that names the
problem and, where llguidance gives one, its position.

A `GrammarConstraint` is one job's matcher. The generation owns it; every step strategy
(engine/steps.py) asks it for the mask of the next position and tells it the token drawn.
Masks are packed uint32 words, bit i of word w = token 32w + i, which is the layout of the GPU
sampler's bitmask (cuda/sampling.cu), so a mask is computed straight into the pinned upload
buffer.

The llguidance tokenizer is built once per model from our `tokenizers` JSON with the model's
logits width and end-of-generation ids (`GrammarTokenizer`), and shared by every job.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memra_engine.errors import GrammarError

KINDS = ("json", "json_schema", "regex", "lark", "gbnf")
KIND_LABELS = {"json": "JSON", "json_schema": "JSON schema", "regex": "regex", "lark": "Lark", "gbnf": "GBNF"}
ANY_JSON_SCHEMA = {"type": "object"}  # llama.cpp's --json: any JSON object


def _llg():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - llguidance is a dependency; a broken install says so
        raise GrammarError("grammars need the llguidance package (pip install llguidance)") from None
    return llguidance


def one_line(message: str) -> str:
    """llguidance's messages span lines (the offending source echoed with a caret under it):
    keep the words, drop the echo, and join what is left into one line."""
    keep = []
    for line in message.splitlines():
        s = line.strip()
        if not s or set(s) <= {"^", " "} or re.match(r"^\d+ \|", s):
            continue
        keep.append(s)
    text = " ".join(keep)
    text = re.sub(r"^at (\d+)\((\d+)\): ", r"line \1, column \2: ", text)
    return text.rstrip(":")


@dataclass(frozen=True)
class Grammar:
    kind: str        # one of KINDS
    source: str      # what the user gave: schema JSON, regex, Lark or GBNF text ("" for json)
    name: str = ""   # where it came from (a file name), for the header and saved chats
    compiled: str = ""  # llguidance's grammar (filled by the constructors)

    # -- constructors: each checks the grammar and raises GrammarError -----------------------
    @classmethod
    def json(cls) -> "Grammar":
        """Any JSON object (llama.cpp's --json)."""
        return cls._build("json", "", "", lambda llg: json_grammar(llg, ANY_JSON_SCHEMA))

    @classmethod
    def json_schema(cls, schema: dict | str, name: str = "") -> "Grammar":
        if isinstance(schema, str):
            try:
                parsed = json.loads(schema)
            except json.JSONDecodeError as err:
                raise GrammarError(f"the JSON schema is not valid JSON: {err}") from None
        else:
            parsed = schema
        if not isinstance(parsed, (dict, bool)):
            raise GrammarError("a JSON schema must be a JSON object")
        source = json.dumps(parsed, separators=(",", ":"))
        return cls._build("json_schema", source, name, lambda llg: json_grammar(llg, parsed))

    @classmethod
    def regex(cls, pattern: str, name: str = "") -> "Grammar":
        if not pattern:
            raise GrammarError("the regex is empty")
        return cls._build("regex", pattern, name, lambda llg: llg.LLMatcher.grammar_from_regex(pattern))

    @classmethod
    def lark(cls, text: str, name: str = "") -> "Grammar":
        if not text.strip():
            raise GrammarError("the Lark grammar is empty")
        return cls._build("lark", text, name, lambda llg: llg.LLMatcher.grammar_from_lark(text))

    @classmethod
    def gbnf(cls, text: str, name: str = "") -> "Grammar":
        """A llama.cpp GBNF grammar, converted to Lark by llguidance's own converter."""
        if not text.strip():
            raise GrammarError("the GBNF grammar is empty")

        def compile_gbnf(llg):
            try:
                return llg.grammar_from("gbnf", text)
            except ValueError as err:
                raise GrammarError(f"invalid GBNF grammar: {one_line(str(err)).removeprefix('Failed to convert the grammar from GBNF to Lark: ')}") from None

        return cls._build("gbnf", text, name, compile_gbnf)

    @classmethod
    def from_file(cls, path: str | Path, kind: str | None = None) -> "Grammar":
        """A grammar file: .json is a JSON schema, .lark Lark, .gbnf/.ebnf (and anything else) GBNF,
        .regex / .re a regex (one pattern, surrounding whitespace dropped). `kind` overrides."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except IsADirectoryError:
            raise GrammarError(f"{path}: is a directory") from None
        except FileNotFoundError:
            raise GrammarError(f"grammar file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as err:
            raise GrammarError(f"cannot read grammar file {path}: {getattr(err, 'strerror', None) or err}") from None
        kind = kind or kind_for_file(path)
        try:
            return cls.from_text(kind, text.strip() if kind == "regex" else text, name=path.name)
        except GrammarError as err:
            raise GrammarError(f"{path.name}: {err}") from None

    @classmethod
    def _build(cls, kind: str, source: str, name: str, compile_fn) -> "Grammar":
        llg = _llg()
        try:
            compiled = compile_fn(llg)
        except GrammarError:
            raise
        except (ValueError, TypeError) as err:
            raise GrammarError(f"invalid {KIND_LABELS[kind]}: {one_line(str(err))}") from None
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(compiled, None)
        if is_error or messages:
            # warnings too: llguidance warns where it would ignore part of a schema (an unknown
            # format, an unsupported keyword), and a reply that ignores the schema is not wanted
            message = one_line(messages[0])
            if kind == "regex" and "regex parse error" in message:
                # the position is inside llguidance's wrapper grammar; the regex crate's words are enough
                message = f"{source!r}: {message.rsplit('error: ', 1)[-1]}"
            raise GrammarError(f"invalid {KIND_LABELS[kind]}: {message}")
        return cls(kind, source, name, compiled)

    # -- plain data ---------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """Short text for the header and the knobs pane, e.g. 'JSON schema person.json'."""
        what = KIND_LABELS[self.kind]
        if self.name:
            return f"{what} {self.name}"
        if self.kind == "regex":
            return f"regex /{self.source if len(self.source) <= 24 else self.source[:23] + '…'}/"
        return what

    def to_dict(self) -> dict:
        return {"kind": self.kind, "source": self.source, "name": self.name}

    @classmethod
    def from_dict(cls, data: dict) -> "Grammar":
        return cls.from_text(data.get("kind"), data.get("source", ""), data.get("name", ""))

    @classmethod
    def from_text(cls, kind: str, text: str, name: str = "") -> "Grammar":
        """A grammar of `kind` (one of KINDS) from its text ("" for json)."""
        if kind == "json":
            return cls.json()
        build = {"json_schema": cls.json_schema, "regex": cls.regex, "lark": cls.lark, "gbnf": cls.gbnf}.get(kind)
        if build is None:
            raise GrammarError(f"unknown grammar kind {kind!r}")
        return build(text, name=name)


def json_grammar(llg, schema) -> str:
    # llguidance's JSON options stay its defaults (flexible whitespace); a schema sets its own in
    # "x-guidance". (A whitespace_pattern in the defaults was tried: it is a repeatable lexeme, so it
    # does not bound whitespace runs, and it overrode a schema's whitespace_flexible: false.)
    return llg.LLMatcher.grammar_from_json_schema(schema)


def kind_for_file(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json_schema"
    if suffix == ".lark":
        return "lark"
    if suffix in (".regex", ".re"):
        return "regex"
    return "gbnf"


class GrammarTokenizer:
    """llguidance's view of one model's vocabulary (built once per model: ~0.2 s for a 49k
    vocabulary, ~2.5 s for Gemma's 262k)."""

    def __init__(self, tokenizer, n_vocab: int):
        llg = _llg()
        self.n_vocab = n_vocab
        self.words = -(-n_vocab // 32)
        eos = sorted(tokenizer.eos_ids)
        try:
            self.ll = llg.LLTokenizer(tokenizer.hf.to_str(), n_vocab=n_vocab, eos_token=eos)
        except TypeError:  # llguidance before 1.7 takes one end-of-text id: the model's own EOS
            main = tokenizer.eos_id if tokenizer.eos_id in tokenizer.eos_ids else eos[0]
            self.ll = llg.LLTokenizer(tokenizer.hf.to_str(), n_vocab=n_vocab, eos_token=main)

    def constraint(self, grammar: Grammar) -> "GrammarConstraint":
        return GrammarConstraint(self, grammar)


class GrammarConstraint:
    """One reply's matcher: mask() for the next position, accept() each token drawn; speculative
    rounds also check drafts (valid_prefix) and undo tentative tokens (rollback)."""

    def __init__(self, tokenizer: GrammarTokenizer, grammar: Grammar):
        llg = _llg()
        self.grammar = grammar
        self.n_vocab = tokenizer.n_vocab
        self.matcher = llg.LLMatcher(tokenizer.ll, grammar.compiled, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"invalid {KIND_LABELS[grammar.kind]}: {one_line(self.matcher.get_error())}")
        self.words = tokenizer.words

    def mask_into(self, out: np.ndarray) -> np.ndarray:
        """Write the next position's mask into `out` (uint32 [words], e.g. a pinned buffer)."""
        assert out.dtype == np.uint32 and out.flags["C_CONTIGUOUS"] and out.size == self.words
        self.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        self._check()
        return out

    def mask(self) -> np.ndarray:
        """The next position's mask as packed uint32 words (a fresh array)."""
        return self.mask_into(np.empty(self.words, np.uint32))

    def allowed(self) -> np.ndarray:
        """The next position's mask as bool [n_vocab]."""
        return unpack_mask(self.mask(), self.n_vocab)

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            self._check()
            raise GrammarError(f"token {token} does not fit the grammar")

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order, the grammar accepts from here (nothing is consumed)."""
        return int(self.matcher.validate_tokens([int(t) for t in tokens])) if tokens else 0

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens (speculative drafts that the target did not keep)."""
        if n and not self.matcher.rollback(int(n)):
            self._check()
            raise GrammarError(f"the grammar matcher cannot roll back {n} tokens")

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but end-of-generation may follow."""
        return self.matcher.is_stopped()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"grammar matcher: {one_line(self.matcher.get_error())}")


def unpack_mask(words: np.ndarray, n_vocab: int) -> np.ndarray:
    bits = np.unpackbits(np.ascontiguousarray(words, np.uint32).view(np.uint8), bitorder="little")
    return bits[:n_vocab].astype(bool)
