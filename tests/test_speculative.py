"""Speculative decoding on the CPU (engine/speculative.py, engine/steps.py, engine/generate.py).

- Greedy: speculative replies equal plain replies token for token (prompt lookup, a draft model
  that disagrees, a draft model that agrees), with and without a grammar, on llama-, qwen3- and
  gemma3-shaped synthetic models and on the default model; also through the device strategy's
  logic (tests/spec_backends.HostDevice).
- Distribution: 20,000 draws of the first two tokens from speculative rounds against the exact
  distribution (chi-square, p > 0.001): filters, penalties, a grammar, a draft model sampled
  from its own q that often disagrees (min(1, p/q) and residual draws), and the device logic.
- Rollback and cancel: the KV cache holds exactly the kept tokens (the next reply equals a fresh
  engine's), for both models.
- A draft with another vocabulary is a one-line error.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from memra_engine.cpu.backend import CpuBackend
from memra_engine.errors import MemraError
from memra_engine.events import DoneEvent, TokenEvent
from memra_engine.generate import Engine, open_draft, open_model
from memra_engine.grammar import Grammar
from memra_engine.model.gguf_file import open_gguf
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import (
    LOOKUP_WEAK_DRAFT, DraftLength, DraftModel, PromptLookup, SpecConfig, SpecCounters, accept_sampled,
    check_draft_vocab,
)
from memra_engine.steps import HostSampling, MaskTimer, speculative_for, strategy_for
from spec_backends import HostDevice, MemoBackend
from spec_checks import chi_square_p, exact_two_token_distribution, repeating_prompt, spec_context

GREEDY = SamplingParams(temperature=0.0, max_tokens=256)
SHAPES = ["tiny-llama", "tiny-qwen3", "tiny-gemma3"]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    d = tmp_path_factory.mktemp("spec")
    out = {}
    for name in SHAPES:
        out[name] = write_synthetic_gguf(d / f"{name}.gguf", preset=name, seed=3)
        out[name + "-other"] = write_synthetic_gguf(d / f"{name}-other.gguf", preset=name, seed=11)
    out["tiny-llama-400"] = write_synthetic_gguf(d / "tiny-llama-400.gguf", preset="tiny-llama", seed=3, vocab=400)
    return out


def chat(eng, params=GREEDY, spec=None, grammar=None, content=None):
    messages = [{"role": "user", "content": content or repeating_prompt()}]
    return eng.chat(messages, params, grammar=grammar, spec=spec).collect()


# ---------------------------------------------------------------------------------------- units


def test_prompt_lookup_drafts_the_continuation_of_the_longest_latest_match():
    lookup = PromptLookup()
    history = [1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 8, 2, 3, 4]
    assert lookup.propose(history, 3) == [6, 7, 8]  # "2 3 4" last seen before 6 7 8
    assert lookup.propose(history + [6], 2) == [7, 8]  # the index grows with the history
    assert PromptLookup().propose([1, 2, 3], 4) == []  # nothing repeats (a lookup follows one history)
    assert PromptLookup().propose([5, 1, 2, 9, 9, 2], 2) == []  # one repeated token is no match
    assert PromptLookup(ngram_min=1).propose([5, 1, 2, 9, 9, 2], 2) == [9, 9]  # unless asked for


def test_prompt_lookup_follows_the_occurrence_whose_context_agrees_longest():
    """A reply copying a passage continues that passage, not a later echo of its last words."""
    passage = [10, 11, 12, 13, 1, 2, 3, 20, 21, 22, 23]
    echo = [30, 31, 1, 2, 3, 40, 41, 42]  # the same 3-gram later, after other words
    history = passage + echo + [11, 12, 13, 1, 2, 3]  # copying the passage again
    assert PromptLookup().propose(history, 4) == [20, 21, 22, 23]
    assert PromptLookup().propose(echo + echo[:5], 3) == [40, 41, 42]  # one occurrence: that one
    # on equal context the latest occurrence wins
    assert PromptLookup().propose([7, 1, 2, 3, 4, 5, 7, 1, 2, 3, 6, 8, 7, 1, 2, 3], 2) == [6, 8]


def test_a_weak_prompt_lookup_match_drafts_few_tokens():
    """Only the 2-gram matches (no earlier 3-gram): at most LOOKUP_WEAK_DRAFT tokens, however
    many the round would take; a 3-gram match drafts all k."""
    history = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 2, 3]  # (0, 2, 3) never seen before, (2, 3) is
    assert PromptLookup().propose(history, 8) == [4, 5, 6, 7, 8, 9, 0, 2][:LOOKUP_WEAK_DRAFT]
    assert PromptLookup().propose(history[:3] + [9, 9] + history[:3], 8) == [9, 9, 1, 2, 3]


def test_prompt_lookup_knows_when_no_draft_can_follow():
    """may_draft_next(h) is True exactly when some next token t gives propose(h + [t]) a draft,
    on random histories over a small vocabulary (so repeats are common), grown token by token
    with propose called in between, as the rounds do."""
    rng = np.random.default_rng(4)
    for trial in range(40):
        vocab = int(rng.integers(3, 9))
        history = [int(t) for t in rng.integers(0, vocab, 2)]
        live = PromptLookup()
        for _ in range(30):
            predicted = live.may_draft_next(history)
            possible = any(PromptLookup().propose(history + [t], 4) for t in range(vocab))
            assert predicted == possible, (trial, history)
            history.append(int(rng.integers(0, vocab)))
            live.propose(history, 4)


def test_spec_config_validates_with_one_line_messages():
    SpecConfig(mode="lookup", draft_max=15, draft_min=15).validate()
    for bad, field in [(SpecConfig(mode="medusa"), "mode"), (SpecConfig(draft_max=0), "draft_max"),
                       (SpecConfig(draft_max=16), "draft_max"), (SpecConfig(draft_max=4, draft_min=5), "draft_min")]:
        with pytest.raises(ValueError, match=field):
            bad.validate()


def test_draft_length_follows_acceptance_within_its_bounds():
    length = DraftLength(SpecConfig(mode="lookup", draft_max=8, draft_min=2))
    for _ in range(20):
        length.update(0)
    while length.resting():  # nothing kept twice in a row: a rest first (the next test)
        length.next()
    assert length.next() == 2
    for _ in range(20):
        length.update(8)
    assert length.next() == 8
    assert DraftLength(SpecConfig(mode="lookup", draft_max=5, adaptive=False)).next() == 5


def test_draft_length_rests_a_drafter_that_keeps_missing():
    """Two rounds in a row that keep nothing rest the drafter 1 step, then 2, 4 ... up to REST_MAX
    (next() is 0, resting() says so beforehand); a round that keeps a draft ends the rest."""
    length = DraftLength(SpecConfig(mode="lookup", draft_max=8))

    def rest_after_miss() -> int:
        length.update(0)
        n = 0
        while length.resting():
            assert length.next() == 0
            n += 1
        assert length.next() >= 1
        return n

    assert [rest_after_miss() for _ in range(7)] == [0, 1, 2, 4, 8, 16, DraftLength.REST_MAX]
    length.update(3)
    assert not length.resting() and length.next() >= 1
    assert rest_after_miss() == 0  # one miss after a kept draft: no rest
    fixed = DraftLength(SpecConfig(mode="lookup", draft_max=5, adaptive=False))
    for _ in range(5):
        fixed.update(0)
    assert not fixed.resting() and fixed.next() == 5  # a fixed length is what the user asked for


def test_counters_record_acceptance_by_position():
    c = SpecCounters()
    c.record(4, 2)
    c.record(2, 2)
    assert (c.rounds, c.drafted, c.accepted) == (2, 6, 4)
    assert c.drafted_by_pos == [2, 2, 1, 1] and c.accepted_by_pos == [2, 2, 0, 0]


def test_accept_sampled_keeps_p_exactly():
    """Draft x ~ q, then accept_sampled: the token's law is p, whatever q is (100k draws)."""
    rng = np.random.default_rng(0)
    ids = np.arange(5)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    q = np.array([0.05, 0.1, 0.15, 0.2, 0.5])  # disagrees: most drafts are rejected
    n = 100_000
    counts = np.zeros(5)
    for x in rng.choice(5, size=n, p=q):
        token, _ = accept_sampled(int(x), ids, p, ids, q, rng, 5)
        counts[token] += 1
    expected = {(i,): float(pi) for i, pi in enumerate(p)}
    assert chi_square_p({(i,): int(c) for i, c in enumerate(counts)}, expected, n) > 0.001


def test_check_draft_vocab_says_how_vocabularies_differ():
    def g(tokens):
        return SimpleNamespace(metadata={"tokenizer.ggml.tokens": tokens})

    assert check_draft_vocab(g(["a", "b"]), g(["a", "b"]), 2, 2) is None
    assert "has 3 tokens, the target's 2" in check_draft_vocab(g(["a", "b"]), g(["a", "b", "c"]), 2, 3)
    assert "differ at token 1: 'x' in the draft model, 'b' in the target" in check_draft_vocab(
        g(["a", "b"]), g(["a", "x"]), 2, 2)


def test_a_draft_with_another_vocabulary_is_a_one_line_error(paths):
    with pytest.raises(MemraError) as err:
        Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=256, draft=paths["tiny-llama-400"])
    message = str(err.value)
    assert "\n" not in message and "cannot draft for this model" in message and "400 tokens, the target's 384" in message
    with pytest.raises(MemraError, match="draft model file not found"):
        Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=256, draft=paths["tiny-llama"].parent / "nope.gguf")


def test_draft_mode_without_a_draft_model_ends_the_job_with_an_error(paths):
    with Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=256) as eng:
        r = chat(eng, spec=SpecConfig(mode="draft"))
        assert r.done.reason == "error" and "no" in r.done.error and "draft" in r.done.error
        assert chat(eng, SamplingParams(temperature=0.0, max_tokens=8)).done.reason == "length"  # still fine


# ---------------------------------------------------------------------------------------- greedy == plain


GRAMMARS = {None: None, "json": Grammar.json(), "regex": Grammar.regex("[a-e]{4,10}")}  # regex: completes inside a round


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("grammar", list(GRAMMARS))
def test_greedy_speculative_replies_equal_plain_replies(paths, name, grammar):
    g = GRAMMARS[grammar]
    with Engine.load(paths[name], backend="cpu", n_ctx=1024, draft=paths[name + "-other"]) as eng:
        assert eng.info.draft_model_name
        plain = chat(eng, grammar=g)
        assert len(plain.token_ids) > (2 if grammar == "regex" else 32)
        lookup = chat(eng, spec=SpecConfig(mode="lookup"), grammar=g)
        assert lookup.token_ids == plain.token_ids and lookup.done == plain.done
        if grammar != "regex":  # a few letters do not repeat
            assert lookup.stats.spec_accepted > 0  # the reply repeats itself: lookup drafts are kept
        other = chat(eng, spec=SpecConfig(mode="draft", draft_max=4), grammar=g)
        assert other.token_ids == plain.token_ids and other.done == plain.done
        if grammar != "regex":
            assert other.stats.spec_drafted > other.stats.spec_accepted  # this draft disagrees: rejections
    with Engine.load(paths[name], backend="cpu", n_ctx=1024, draft=paths[name]) as eng:
        same = chat(eng, spec=SpecConfig(mode="draft"), grammar=g)
        assert same.token_ids == plain.token_ids and same.done == plain.done
        assert same.stats.spec_accepted == same.stats.spec_drafted > 0


def device_logic_engine(path, draft_path) -> Engine:
    """A cpu engine whose backends show the device-sampling surface: the generation loop then
    runs DeviceSampling and DeviceSpeculative, as on the GPU."""
    def opener():
        g = open_gguf(path)
        model, info = open_model(g, "cpu", 1024, None, lambda m: None, draft_g=open_draft(draft_path, g))
        model.backend = HostDevice(model.backend)
        model.draft.backend = HostDevice(model.draft.backend)
        return model, info

    return Engine.start(opener)


@pytest.mark.parametrize("grammar", [None, "json"])
def test_device_rounds_greedy_equal_plain(paths, grammar):
    g = Grammar.json() if grammar else None
    with device_logic_engine(paths["tiny-llama"], paths["tiny-llama-other"]) as eng:
        plain = chat(eng, grammar=g)
        for spec in (SpecConfig(mode="lookup"), SpecConfig(mode="draft", draft_max=5)):
            got = chat(eng, spec=spec, grammar=g)
            assert got.token_ids == plain.token_ids, spec
            assert got.stats.spec_rounds > 0
    with device_logic_engine(paths["tiny-llama"], paths["tiny-llama"]) as eng:
        same = chat(eng, spec=SpecConfig(mode="draft"), grammar=g)  # greedy drafts under the grammar's masks
        assert same.token_ids == plain.token_ids
        assert same.stats.spec_accepted == same.stats.spec_drafted > 0


def test_plain_steps_queue_ahead_only_where_no_round_can_follow(paths):
    """On the GPU decode_sample queues the steps after the one it returns (run-ahead), and a
    verify next waits them out and drops them: two decode steps lost at every switch from a plain
    step to a round. The speculative strategy's plain steps (no draft found) queue ahead only where
    prompt lookup knows the next step drafts nothing; a plain reply's steps always do. Also with a
    grammar (the masked step pair)."""
    made = []

    def opener():
        model, info = open_model(open_gguf(paths["tiny-llama"]), "cpu", 1024, None, lambda m: None)
        model.backend = HostDevice(model.backend)
        made.append(model.backend)
        return model, info

    with Engine.start(opener) as eng:
        backend = made[0]
        plain = chat(eng)
        assert len(backend.calls) > 8 and all(call == ("step", True) for call in backend.calls)
        for grammar in (None, Grammar.json()):
            backend.calls.clear()
            reply = chat(eng, spec=SpecConfig(mode="lookup"), grammar=grammar)
            if grammar is None:
                assert reply.token_ids == plain.token_ids
            calls = backend.calls
            assert reply.stats.spec_rounds > 0
            assert ("step", True) in calls and ("step", False) in calls   # both kinds of plain step
            assert all(not (a == ("step", True) and b == ("verify",)) for a, b in zip(calls, calls[1:])), \
                "steps were queued ahead of a round"


@pytest.mark.slow
@pytest.mark.parametrize("grammar", [None, "json"])
def test_default_model_greedy_speculative_equals_plain(smollm2_path, grammar):
    g = Grammar.json() if grammar else None
    code = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n" \
           "    return 2 * (width + height)\n"
    content = f"Rename the parameter width to w in this code and show the whole code.\n\n{code}"
    with Engine.load(smollm2_path, backend="cpu", n_ctx=1024, draft=smollm2_path) as eng:
        plain = chat(eng, content=content, grammar=g)
        for spec in (SpecConfig(mode="lookup"), SpecConfig(mode="draft", draft_max=4)):
            got = chat(eng, content=content, grammar=g, spec=spec)
            assert got.token_ids == plain.token_ids, spec
            assert got.stats.spec_accepted > 0


# ---------------------------------------------------------------------------------------- distribution

CASES = {
    "filters": SamplingParams(temperature=1.0, top_k=12, top_p=0.9, min_p=0.0),
    "penalties": SamplingParams(temperature=1.0, top_k=12, top_p=1.0, min_p=0.0, repeat_penalty=1.5,
                                presence_penalty=0.5, repeat_last_n=8),
    "grammar": SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
}


def two_token_draws(target, draft, context, params, make_constraint, spec, n):
    counts: dict[tuple[int, int], int] = {}
    rng = np.random.default_rng(5)
    for _ in range(n):
        target.truncate(0)
        target.prefill(context[:-1])
        history, constraint = list(context), make_constraint()
        seeded = SamplingParams(**{**params.to_dict(), "seed": int(rng.integers(2**62))})
        plain = strategy_for(target, seeded, history, constraint, MaskTimer())
        drafter = PromptLookup() if draft is None else DraftModel("draft", draft)
        rounds = speculative_for(plain, history, drafter, spec, SpecCounters(), set())
        got = rounds.step(context[-1], 3)
        if len(got) == 1:
            history.append(got[0][0])
            got = got + rounds.step(got[0][0], 1)
        counts[(got[0][0], got[1][0])] = counts.get((got[0][0], got[1][0]), 0) + 1
    return counts


@pytest.fixture(scope="module")
def memo(paths):
    made = {}

    def get(name):
        if name not in made:
            made[name] = MemoBackend(CpuBackend(open_gguf(paths[name]), 64))
        return made[name]

    return get


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("drafter", ["lookup", "draft", "device-lookup"])
def test_speculative_rounds_keep_the_target_distribution(paths, memo, case, drafter):
    params = CASES[case]
    target = memo("tiny-llama")
    context, make_constraint = spec_context(paths["tiny-llama"], case == "grammar", target.config.vocab_size)
    expected = exact_two_token_distribution(target, context, params, make_constraint)
    spec = SpecConfig(mode="draft" if drafter == "draft" else "lookup", draft_max=4)
    n = 20_000
    if drafter == "device-lookup":
        device = HostDevice(target)
        counts = two_token_draws(device, None, context, params, make_constraint, spec, n)
    else:
        draft = memo("tiny-llama-other") if drafter == "draft" else None  # sampled from its q: it disagrees
        counts = two_token_draws(target, draft, context, params, make_constraint, spec, n)
    assert sum(counts.values()) == n
    assert chi_square_p(counts, expected, n) > 0.001


def test_a_wrong_walk_fails_the_distribution_check(paths, memo):
    """The check has power: keeping every draft (no acceptance test) is caught."""
    params = CASES["filters"]
    target = memo("tiny-llama")
    context, make_constraint = spec_context(paths["tiny-llama"], False, target.config.vocab_size)
    expected = exact_two_token_distribution(target, context, params, make_constraint)
    lookup = PromptLookup().propose(context, 2)
    counts = {(lookup[0], lookup[1]): 2000}
    assert chi_square_p(counts, expected, 2000) < 0.001


# ---------------------------------------------------------------------------------------- rollback, cancel


def test_after_rejections_the_cache_holds_the_kept_tokens_only(paths):
    params = SamplingParams(temperature=1.2, seed=9, max_tokens=80)
    follow = [{"role": "user", "content": "and again"}]
    with Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=1024, draft=paths["tiny-llama-other"]) as eng:
        first = chat(eng, params, spec=SpecConfig(mode="draft", draft_max=6))
        assert first.stats.spec_drafted > first.stats.spec_accepted  # there were rejections
        convo = [{"role": "user", "content": repeating_prompt()}, {"role": "assistant", "content": first.text}] + follow
        after = eng.chat(convo, GREEDY).collect()
        after_spec = eng.chat(convo + [{"role": "assistant", "content": after.text}] + follow, GREEDY,
                              spec=SpecConfig(mode="draft")).collect()
    with Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=1024) as fresh:
        assert fresh.chat(convo, GREEDY).collect().token_ids == after.token_ids
        again = fresh.chat(convo + [{"role": "assistant", "content": after.text}] + follow, GREEDY).collect()
        assert again.token_ids == after_spec.token_ids


def test_cancel_in_a_round_leaves_both_models_ready(paths):
    with Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=1024, draft=paths["tiny-llama-other"]) as eng:
        job = eng.chat([{"role": "user", "content": repeating_prompt()}], SamplingParams(temperature=0.0, max_tokens=200),
                       spec=SpecConfig(mode="draft", draft_max=6))
        for event in job:
            if isinstance(event, TokenEvent):
                job.cancel()  # the engine is inside the next round by now, or about to start it
                break
        assert job.collect().done.reason == "cancelled"
        after = chat(eng, spec=SpecConfig(mode="draft"))
        after_plain = chat(eng, content="something else entirely")
    with Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=1024) as fresh:
        assert chat(fresh).token_ids == after.token_ids
        assert chat(fresh, content="something else entirely").token_ids == after_plain.token_ids


def test_spec_can_be_switched_on_in_a_running_reply(paths):
    with Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=1024) as eng:
        plain = chat(eng)
        job = eng.chat([{"role": "user", "content": repeating_prompt()}], GREEDY)
        job.update_spec(SpecConfig(mode="lookup", draft_max=6))
        with pytest.raises(ValueError):
            job.update_spec(SpecConfig(mode="lookup", draft_max=99))
        got = job.collect()
    assert got.token_ids == plain.token_ids
    assert got.stats.spec_rounds > 0
    assert sum(got.stats.spec_drafted_by_pos) == got.stats.spec_drafted
    assert max(len(got.stats.spec_drafted_by_pos), 1) <= 6


def test_cancel_storm_in_speculative_replies_leaves_the_caches_exact(paths):
    """30 cancels at random points of lookup / draft-model replies, with and without a grammar;
    then greedy replies, plain and speculative, equal a fresh engine's token for token."""
    rng = np.random.default_rng(4)
    sampled = SamplingParams(temperature=1.0, max_tokens=120)
    with Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=1024, draft=paths["tiny-llama-other"]) as eng:
        for i in range(30):
            spec = SpecConfig(mode=("lookup", "draft")[i % 2], draft_max=int(rng.integers(1, 9)))
            job = eng.chat([{"role": "user", "content": repeating_prompt()[: int(rng.integers(20, 140))]}], sampled,
                           spec=spec, grammar=Grammar.json() if i % 3 == 0 else None)
            stop_after, done = int(rng.integers(0, 12)), None
            for n, event in enumerate(job):
                if isinstance(event, DoneEvent):
                    done = event
                elif n >= stop_after:
                    job.cancel()
                    done = job.collect().done
                    break
            assert done is not None and done.reason in ("cancelled", "eos", "length")
        after = [chat(eng, spec=s) for s in (None, SpecConfig(mode="lookup"), SpecConfig(mode="draft"))]
    with Engine.load(paths["tiny-llama"], backend="cpu", n_ctx=1024) as fresh:
        expected = chat(fresh).token_ids
    assert all(r.token_ids == expected for r in after)
