"""Branching from a token (issue 18, item 3, the engine side): Engine.chat(..., reply_prefix=ids)
continues a reply from its first tokens (and the token picked there), reusing the KV cache's
shared prefix. Greedy, the continuation is exactly the rest of the reply; a branch equals a fresh
engine's; the grammar sees the prefix as the reply's own."""
from __future__ import annotations

import re

from memra_engine.events import TokenEvent
from memra_engine.generate import Engine
from memra_engine.grammar import Grammar
from memra_engine.model.gguf_file import open_gguf
from memra_engine.sampling import SamplingParams
from memra_engine.tokenizer import load_tokenizer
from tiny_models import tiny_llama_path  # noqa: F401  (fixture)

MESSAGES = [{"role": "user", "content": "count with me"}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def test_a_greedy_reply_goes_on_from_its_own_prefix(tiny_llama_path):
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as eng:
        whole = eng.chat(MESSAGES, GREEDY).collect()
        assert len(whole.token_ids) == GREEDY.max_tokens
        for t in (1, 7):
            rest = eng.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=GREEDY.max_tokens - t),
                            reply_prefix=whole.token_ids[:t]).collect()
            assert rest.token_ids == whole.token_ids[t:]
            assert whole.text.endswith(rest.text) and rest.text


def test_a_branch_equals_a_fresh_engines_branch(tiny_llama_path):
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as eng:
        first = eng.chat(MESSAGES, GREEDY).collect().token_ids
        picked = (first[4] + 1) % 200  # another candidate at token 4
        branch = eng.chat(MESSAGES, GREEDY, reply_prefix=first[:4] + [picked]).collect()
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as fresh:
        again = fresh.chat(MESSAGES, GREEDY, reply_prefix=first[:4] + [picked]).collect()
    assert branch.token_ids == again.token_ids and len(branch.token_ids) == GREEDY.max_tokens
    assert branch.token_ids != first[5:5 + len(branch.token_ids)]


def test_the_grammar_sees_the_prefix_as_the_replys_own(tiny_llama_path):
    digits = Grammar.regex("[0-9]{8}")
    params = SamplingParams(temperature=0.9, seed=3, max_tokens=40)
    letters = load_tokenizer(open_gguf(tiny_llama_path)).encode("xyz", add_special=False)
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as eng:
        events = [e for e in eng.chat(MESSAGES, params, grammar=digits) if isinstance(e, TokenEvent)]
        whole = "".join(e.text for e in events)
        assert re.fullmatch("[0-9]{8}", whole), whole
        head = "".join(e.text for e in events[:2])
        rest = eng.chat(MESSAGES, params, grammar=digits, reply_prefix=[e.id for e in events[:2]]).collect()
        refused = eng.chat(MESSAGES, params, grammar=digits, reply_prefix=letters).collect()
        outside = eng.chat(MESSAGES, params, reply_prefix=[10**9]).collect()
    # the branch completes the same 8 digits: the grammar counted the prefix's digits
    assert rest.done.reason == "eos" and re.fullmatch("[0-9]{8}", head + rest.text), (head, rest.text)
    assert refused.done.reason == "error" and "grammar" in refused.done.error and "\n" not in refused.done.error
    assert outside.done.reason == "error" and "vocabulary" in outside.done.error


def test_a_reply_cut_inside_a_character_drops_its_bytes_and_a_continuation_finishes_it(tiny_llama_path):
    # The grammar makes the reply one four-byte character (U+13000, spelled as byte tokens), and the
    # token limit cuts it after two: the cut reply shows nothing (not U+FFFD), and the reply
    # continued from those two tokens shows the whole character once.
    glyph = Grammar.regex("\U00013000")
    tokens = load_tokenizer(open_gguf(tiny_llama_path)).encode("\U00013000", add_special=False)
    assert len(tokens) == 4
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as eng:
        cut = eng.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=2), grammar=glyph).collect()
        assert cut.done.reason == "length" and cut.token_ids == tokens[:2]
        assert cut.text == ""
        rest = eng.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=8), grammar=glyph,
                        reply_prefix=cut.token_ids).collect()
    assert rest.done.reason == "eos" and rest.token_ids[:2] == tokens[2:]
    assert rest.text == "\U00013000"
