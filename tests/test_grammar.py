"""Grammar-constrained replies (engine/grammar.py, engine/steps.py): building and checking grammars,
the mask in the CPU sampler, and the generation loop with a constraint, on tiny synthetic models.
The default-model runs at temperature 1.5 are in tests/test_grammar_replies.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memra_engine.errors import GrammarError
from memra_engine.events import DoneEvent, TokenEvent
from memra_engine.generate import Engine
from memra_engine.grammar import Grammar, GrammarTokenizer, unpack_mask
from memra_engine.model.gguf_file import open_gguf
from memra_engine.sampling import SamplingParams, final_distribution, make_rng, sample
from memra_engine.tokenizer import load_tokenizer
from tiny_models import tiny_llama_path  # noqa: F401  (fixture)

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "grammars"
CHAT = [{"role": "user", "content": "Answer."}]


# ---------------------------------------------------------------------------------------- building


@pytest.mark.parametrize("build, words", [
    (lambda: Grammar.regex("[a-"), "unclosed character class"),
    (lambda: Grammar.regex(""), "empty"),
    (lambda: Grammar.lark('start: "a" foo'), 'unknown name: "foo"'),
    (lambda: Grammar.lark("start: (("), "lark"),
    (lambda: Grammar.gbnf('root ::= "yes" | missing'), "missing"),
    (lambda: Grammar.gbnf('root ::= "unterminated'), "GBNF"),
    (lambda: Grammar.json_schema("{not json"), "not valid JSON"),
    (lambda: Grammar.json_schema('{"type": "strin"}'), "strin"),
    (lambda: Grammar.json_schema({"type": "string", "format": "no-such-format"}), "no-such-format"),
    (lambda: Grammar.json_schema({"$ref": "https://example.com/remote.json"}), "invalid JSON schema"),
    (lambda: Grammar.json_schema([1, 2]), "JSON object"),
])
def test_invalid_grammars_raise_one_line_errors(build, words):
    with pytest.raises(GrammarError) as err:
        build()
    message = str(err.value)
    assert "\n" not in message and words.lower() in message.lower(), message


def test_grammar_files_by_suffix_and_bad_paths(tmp_path):
    kinds = {p.name: Grammar.from_file(p).kind for p in ASSETS.iterdir()}
    assert kinds == {"person.json": "json_schema", "shopping_list.gbnf": "gbnf", "arithmetic.lark": "lark",
                     "iso_date.regex": "regex"}
    with pytest.raises(GrammarError, match="is a directory"):
        Grammar.from_file(tmp_path)
    with pytest.raises(GrammarError, match="not found"):
        Grammar.from_file(tmp_path / "nope.gbnf")
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= (")
    with pytest.raises(GrammarError, match=r"^bad\.gbnf: "):
        Grammar.from_file(bad)


def test_grammar_round_trips_as_plain_data():
    for g in [Grammar.json(), Grammar.regex("[0-9]+"), Grammar.from_file(ASSETS / "person.json"),
              Grammar.from_file(ASSETS / "arithmetic.lark"), Grammar.from_file(ASSETS / "shopping_list.gbnf")]:
        back = Grammar.from_dict(json.loads(json.dumps(g.to_dict())))
        assert back == g and back.label == g.label
    with pytest.raises(GrammarError):
        Grammar.from_dict({"kind": "regex", "source": "(("})


# ---------------------------------------------------------------------------------------- the mask


@pytest.fixture(scope="module")
def tiny_grammar_tokenizer(tiny_llama_path):
    g = open_gguf(tiny_llama_path)
    tok = load_tokenizer(g)
    n_vocab = int(g.metadata["llama.vocab_size"]) if "llama.vocab_size" in g.metadata else tok.vocab_size
    return tok, GrammarTokenizer(tok, n_vocab)


def test_mask_allows_exactly_the_tokens_that_keep_the_text_in_the_language(tiny_grammar_tokenizer):
    tok, gt = tiny_grammar_tokenizer
    c = gt.constraint(Grammar.regex("(cat|cow)s?"))
    allowed = c.allowed()
    assert allowed.dtype == bool and allowed.shape == (gt.n_vocab,)
    pieces = {i: tok.token_text(i) for i in np.flatnonzero(allowed)}
    assert pieces and all("cats".startswith(p) or "cows".startswith(p) for p in pieces.values()), pieces
    # the same set, tested the other way: every token whose text is a prefix is allowed
    expected = {i for i in range(tok.vocab_size) if tok.token_text(i) and
                any(w.startswith(tok.token_text(i)) for w in ("cat", "cats", "cow", "cows"))
                and i not in tok.eos_ids}
    assert set(pieces) == expected
    for t in tok.encode("cat"):
        c.accept(t)
    after = c.allowed()
    assert all(after[e] for e in tok.eos_ids)  # "cat" is complete: end of text may follow
    assert not c.done  # ... and so may "s"
    c.accept(tok.encode("s")[0])
    assert c.done
    with pytest.raises(GrammarError):
        c.accept(tok.encode("x")[0])


def test_cpu_sampler_never_draws_a_masked_token_and_filters_see_only_allowed_ones():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=500).astype(np.float32) * 3
    allowed = rng.random(500) < 0.1
    best_masked = int(np.argmax(np.where(allowed, -np.inf, logits)))
    logits[best_masked] = 50.0  # the model's favourite is not allowed
    history = [best_masked] * 5 + list(np.flatnonzero(allowed)[:3])
    params = SamplingParams(temperature=1.5, top_k=5, top_p=0.9, min_p=0.05, presence_penalty=-2.0,
                            repeat_penalty=0.5)
    draws = [sample(logits, params, history, make_rng(s), allowed)[0] for s in range(300)]
    assert all(allowed[d] for d in draws)
    # top_k 5 counts allowed tokens only: the 5 best allowed (after penalties), not the 5 best overall
    ids, probs = final_distribution(logits, SamplingParams(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0),
                                    [], allowed)
    best_allowed = np.flatnonzero(allowed)[np.argsort(-logits[allowed])[:5]]
    assert sorted(ids.tolist()) == sorted(best_allowed.tolist())
    assert np.isclose(probs.sum(), 1.0)
    greedy, _ = sample(logits, SamplingParams(temperature=0.0), [], make_rng(0), allowed)
    assert greedy == best_allowed[0]
    # fewer allowed tokens than top_k: the draw still only sees them
    one = np.zeros(500, bool)
    one[7] = True
    assert {sample(logits, SamplingParams(temperature=2.0, top_k=40), [], make_rng(s), one)[0] for s in range(20)} == {7}


# ---------------------------------------------------------------------------------------- the loop


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama_path):
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as eng:
        yield eng


def run(job):
    events = list(job)
    done = events[-1]
    assert isinstance(done, DoneEvent)
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    return text, done


HOT = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, max_tokens=64)


def test_constrained_replies_match_at_any_seed_and_end_with_eos(tiny_engine):
    g = Grammar.regex("(yes|no|maybe)[.!]")
    for seed in range(10):
        text, done = run(tiny_engine.chat(CHAT, HOT.__class__(**{**HOT.to_dict(), "seed": seed}), grammar=g))
        assert done.reason == "eos" and re.fullmatch("(yes|no|maybe)[.!]", text), (text, done)
    text, done = run(tiny_engine.complete("x", SamplingParams(temperature=0.0, max_tokens=32), grammar=g))
    assert done.reason == "eos" and re.fullmatch("(yes|no|maybe)[.!]", text)


def test_a_reply_cut_by_max_tokens_ends_with_length(tiny_engine):
    g = Grammar.regex("[a-z]{40,60}")
    text, done = run(tiny_engine.chat(CHAT, SamplingParams(temperature=1.0, seed=1, max_tokens=5), grammar=g))
    assert done.reason == "length" and re.fullmatch("[a-z]+", text) and len(text) < 40


def test_stop_strings_work_beside_a_grammar(tiny_engine):
    g = Grammar.regex("(ab)+c")
    text, done = run(tiny_engine.chat(CHAT, SamplingParams(temperature=0.0, max_tokens=40), grammar=g, stop=["bab"]))
    assert done.reason == "stop" and "bab" not in text and re.fullmatch("(ab)*a?", text), text


def test_knob_change_and_cancel_mid_reply_keep_the_grammar(tiny_llama_path):
    from test_generate import spied_engine

    g = Grammar.regex("[a-z]{20}!")
    eng, _ = spied_engine(tiny_llama_path, decode_delay_s=0.01)
    with eng:
        job = eng.chat(CHAT, SamplingParams(temperature=0.5, seed=3, max_tokens=100), grammar=g)
        pieces = []
        for event in job:
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
                if len(pieces) == 3:
                    job.update_sampling(SamplingParams(temperature=2.0, top_k=0, min_p=0.0, seed=3, max_tokens=100))
            done = event
        assert done.reason == "eos" and re.fullmatch("[a-z]{20}!", "".join(pieces))

        job = eng.chat(CHAT, SamplingParams(temperature=1.0, seed=4, max_tokens=100), grammar=g)
        for event in job:
            if isinstance(event, TokenEvent):
                job.cancel()
        assert event.reason == "cancelled"
        text, done = run(eng.chat(CHAT, SamplingParams(temperature=1.0, seed=5, max_tokens=100), grammar=g))
        assert done.reason == "eos" and re.fullmatch("[a-z]{20}!", text)


def test_engine_reports_mask_time(tiny_engine):
    job = tiny_engine.chat(CHAT, SamplingParams(temperature=0.0, max_tokens=40), grammar=Grammar.regex("[a-z]{10}"))
    result = job.collect()
    assert result.done.reason == "eos"
    assert 0 < result.stats.grammar_mask_ms_median <= result.stats.grammar_mask_ms_p99


class HostAsDevice:
    """A cpu backend presented as one that samples on the device, so the DeviceSampling strategy
    and its masked step pair run on CI: the 'device' draws with the CPU sampler and the mask the
    strategy wrote into the buffer begin_masked_step returned."""

    samples_on_device = True

    def __init__(self, inner):
        self.inner = inner
        self.n_vocab = inner.config.vocab_size
        self.mask = np.zeros(-(-self.n_vocab // 32), np.uint32)
        self.calls = {"begin": 0, "decode_sample": 0}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def set_sampling(self, params, seed=None, use_mask=False):
        self.params, self.rng, self.use_mask = params, make_rng(seed), use_mask
        return 0 if seed is None else seed

    def decode_sample(self, token, ahead=True):
        self.calls["decode_sample"] += 1
        return sample(self.inner.decode(token), self.params, [], self.rng)

    def begin_masked_step(self, token):
        self.calls["begin"] += 1
        self.logits = self.inner.decode(token)
        self.mask[:] = 0  # what the strategy does not write stays all-masked
        return self.mask

    def finish_masked_step(self, ahead=True):
        assert self.use_mask
        return sample(self.logits, self.params, [], self.rng, unpack_mask(self.mask, self.n_vocab))

    def step_candidates(self):
        return None


def test_device_sampling_strategy_fills_the_mask_buffer_each_step(tiny_llama_path):
    from fake_engine import wrapped_engine

    g = Grammar.regex("(red|green|blue)( (red|green|blue)){2}")
    eng, backends = wrapped_engine(tiny_llama_path, "cpu", 256, HostAsDevice)
    with eng:
        for seed in range(5):
            text, done = run(eng.chat(CHAT, SamplingParams(temperature=1.5, top_k=0, seed=seed, max_tokens=40), grammar=g))
            assert done.reason == "eos" and re.fullmatch("(red|green|blue)( (red|green|blue)){2}", text), text
        assert backends[0].calls["decode_sample"] == 0 and backends[0].calls["begin"] > 0
        text, done = run(eng.chat(CHAT, SamplingParams(temperature=1.0, seed=1, max_tokens=4)))
        assert backends[0].calls["decode_sample"] > 0  # no grammar: the one-launch step


def test_backends_declare_the_whole_protocol():
    """generate.py and bench.py read these from any backend; a backend that lacked one (the cuda
    backend had no device_name and no prefill_chunk) silently got the wrong device name or
    128-token prefill chunks."""
    import ast
    import inspect

    from memra_engine.backend import Backend
    from memra_engine.cpu.backend import CpuBackend
    from memra_engine.gpu.backend import CudaBackend

    members = set(Backend.__annotations__) | {n for n, v in vars(Backend).items()
                                               if callable(v) and not n.startswith("_")}
    assert {"device_name", "prefill_chunk", "kv_type", "samples_on_device", "moe_stats"} <= members
    def assigned_on_self(cls) -> set[str]:
        names = set()
        for node in ast.walk(ast.parse(inspect.getsource(inspect.getmodule(cls)))):
            for target in getattr(node, "targets", []):
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.add(t.attr)
        return names

    for cls in (CpuBackend, CudaBackend):
        assigned = assigned_on_self(cls)
        missing = [m for m in members if not hasattr(cls, m) and m not in assigned]
        assert not missing, f"{cls.__name__} lacks {missing}"
    assert CudaBackend.prefill_chunk == 512 and CudaBackend.samples_on_device and not CpuBackend.samples_on_device
    assert "self.device_name = rt.device_name" in inspect.getsource(CudaBackend)


def test_cli_rejects_an_invalid_grammar_before_loading_the_model(tmp_path):
    missing_model = tmp_path / "no-such-model.gguf"
    for flags, words in [(["--regex", "[a-"], "unclosed character class"),
                         (["--json-schema", '{"type": "strin"}'], "strin"),
                         (["--grammar-file", str(tmp_path)], "is a directory"),
                         (["--json-schema-file", str(tmp_path / "none.json")], "not found")]:
        run_ = subprocess.run([sys.executable, "-m", "memra_tui.cli", str(missing_model), "--prompt", "hi", *flags],
                              capture_output=True, text=True, timeout=120)
        lines = run_.stderr.strip().splitlines()
        assert run_.returncode == 1 and len(lines) == 1 and words in lines[0], run_.stderr
        assert "no-such-model" not in run_.stderr  # checked before the model is opened


def test_cli_says_when_a_structured_reply_is_cut(tiny_llama_path):
    run_ = subprocess.run([sys.executable, "-m", "memra_tui.cli", str(tiny_llama_path), "--backend", "cpu",
                           "--prompt", "hi", "--regex", "[a-z]{50}", "--max-tokens", "3", "--seed", "1"],
                          capture_output=True, text=True, timeout=120)
    assert run_.returncode == 0, run_.stderr
    assert re.fullmatch("[a-z]+\n", run_.stdout)
    assert "structured reply (regex /[a-z]{50}/) is incomplete" in run_.stderr
