"""The generation loop and Engine API.

Part 1 drives the loop with a scripted backend (tests/fake_engine.py) where the tokens are forced,
to pin down stop strings, EOS, length, cancel timing and cache bookkeeping exactly.
Part 2 runs the real CPU engine on a tiny synthetic model and checks the same promises end to end.
"""
from __future__ import annotations

import time

import pytest

from fake_engine import EOS, ScriptedBackend, fake_engine
from memra_engine.events import DoneEvent, StatsEvent, TokenEvent
from memra_engine.generate import StopMatcher, common_prefix_len
from memra_engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


def ids_of(text: str) -> list[int]:
    return [ord(c) for c in text]


# ---------------------------------------------------------------------------------------- units


def test_stop_matcher_holds_back_a_possible_stop_string():
    m = StopMatcher(["</end>", "STOP"])
    assert m.push("abc<") == ("abc", False)
    assert m.push("/en") == ("", False)
    assert m.push("d>tail") == ("", True)
    m = StopMatcher(["STOP"])
    assert m.push("ST") == ("", False)
    assert m.push("ay") == ("STay", False)  # not a stop after all: released
    assert m.push("S") == ("", False)
    assert m.flush() == "S"


def test_stop_matcher_cuts_at_the_earliest_stop():
    m = StopMatcher(["bb", "a"])
    assert m.push("xxbba") == ("xx", True)


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([7], [8]) == 0


# ---------------------------------------------------------------------------------------- scripted backend


def run(engine, prompt: str, params=GREEDY, stop=()):
    return engine.complete(prompt, params, stop=stop).collect()


def test_stop_string_split_across_tokens_is_not_emitted():
    backend = ScriptedBackend(script=ids_of("Hello, world! STOP more text") + [EOS])
    with fake_engine(backend) as eng:
        result = run(eng, "hi", stop=["STOP"])
    assert result.done == DoneEvent("stop")
    assert result.text == "Hello, world! "


def test_held_back_text_is_flushed_at_eos():
    backend = ScriptedBackend(script=ids_of("abxy") + [EOS])
    with fake_engine(backend) as eng:
        result = run(eng, "hi", stop=["xyz"])
    assert result.done.reason == "eos"
    assert result.text == "abxy"


def test_eos_ends_the_reply_without_text():
    backend = ScriptedBackend(script=ids_of("done") + [EOS, ord("!")])
    with fake_engine(backend) as eng:
        result = run(eng, "hi")
    assert result.done.reason == "eos"
    assert result.text == "done"


def test_max_tokens_gives_length_with_exactly_that_many_tokens():
    backend = ScriptedBackend(script=ids_of("a" * 40))
    with fake_engine(backend) as eng:
        result = run(eng, "hi", SamplingParams(temperature=0.0, max_tokens=7))
    assert result.done.reason == "length"
    assert result.text == "aaaaaaa"
    assert len(result.token_ids) == 7


def test_full_context_gives_length():
    backend = ScriptedBackend(n_ctx=20, script=ids_of("z" * 40))
    with fake_engine(backend) as eng:
        result = run(eng, "0123456789", SamplingParams(temperature=0.0, max_tokens=100))  # 11 with BOS
    assert result.done.reason == "length"
    assert 11 + len(result.token_ids) == 21  # 9 decoded to fill the cache, plus the last sampled token
    assert backend.n_past == 20


def test_prompt_longer_than_context_is_an_error_event():
    backend = ScriptedBackend(n_ctx=32)
    with fake_engine(backend) as eng:
        result = run(eng, "x" * 40)
        assert result.done == DoneEvent("error", "prompt is 41 tokens but the context is 32 (use --ctx)")
        assert run(eng, "short").done.reason in ("eos", "length")  # the engine still works


def test_invalid_sampling_is_an_error_event_not_an_exception():
    with fake_engine(ScriptedBackend()) as eng:
        result = run(eng, "hi", SamplingParams(top_p=0.0))
    assert result.done.reason == "error"
    assert "top_p" in result.done.error


def test_cancel_ends_within_a_step_and_the_next_job_matches_a_fresh_engine():
    params = SamplingParams(temperature=0.9, top_k=20, seed=5, max_tokens=200)
    backend = ScriptedBackend(step_s=0.05)
    with fake_engine(backend) as eng:
        job = eng.complete("tell me", params)
        n_tokens = 0
        for event in job:
            if isinstance(event, TokenEvent):
                n_tokens += 1
                if n_tokens == 3:
                    t0 = time.perf_counter()
                    job.cancel()
                    assert time.perf_counter() - t0 < 0.01, "cancel() must return at once"
            if isinstance(event, DoneEvent):
                waited = time.perf_counter() - t0
                assert event.reason == "cancelled"
        assert waited < 0.05 * 2 + 0.1, f"cancel took {waited:.3f}s, more than one decode step"
        after_cancel = run(eng, "another prompt", SamplingParams(temperature=0.9, seed=9, max_tokens=20))
    with fake_engine(ScriptedBackend()) as fresh:
        want = run(fresh, "another prompt", SamplingParams(temperature=0.9, seed=9, max_tokens=20))
    assert after_cancel.text == want.text and after_cancel.done == want.done


def test_kv_prefix_is_reused_and_gives_the_same_reply_as_a_fresh_engine():
    first, second = "The quick brown fox", "The quick brown fox jumps over"
    backend = ScriptedBackend()
    with fake_engine(backend) as eng:
        run(eng, first)
        calls_before = len(backend.prefill_calls)
        reused = run(eng, second)
        # only the new tail is prefilled: common prefix = BOS + first prompt
        assert backend.prefill_calls[calls_before:] == [len(second) - len(first)]
    with fake_engine(ScriptedBackend()) as fresh:
        want = run(fresh, second)
    assert reused.text == want.text and reused.token_ids == want.token_ids


def test_same_prompt_twice_prefills_one_token():
    backend = ScriptedBackend()
    with fake_engine(backend) as eng:
        a = run(eng, "repeat me")
        b = run(eng, "repeat me")
    assert backend.prefill_calls[-1] == 1
    assert a.text == b.text


def test_stats_arrive_with_counts_and_rates():
    backend = ScriptedBackend(step_s=0.02, script=ids_of("x" * 30))
    with fake_engine(backend) as eng:
        events = list(eng.complete("hi", SamplingParams(temperature=0.0, max_tokens=20)))
        final = eng.stats()
    stats = [e.stats for e in events if isinstance(e, StatsEvent)]
    assert len(stats) >= 2, "periodic stats (every 0.25 s) plus the final one"
    last = stats[-1]
    assert last.n_generated == 20 and last.n_prompt_tokens == 3
    assert last.n_ctx_used == 3 + 19 and last.n_ctx == backend.n_ctx
    assert 10 < last.decode_tok_s < 60  # 20 ms per step
    assert last.prefill_tok_s > 0 and last.time_to_first_token_s > 0
    assert final.n_generated == 20
    assert isinstance(events[-1], DoneEvent) and isinstance(events[-2], StatsEvent)


def test_close_stops_the_thread_and_frees_the_backend():
    backend = ScriptedBackend(step_s=0.05)
    eng = fake_engine(backend)
    job = eng.complete("hi", SamplingParams(temperature=0.5, max_tokens=500))
    next(iter(job))
    t0 = time.perf_counter()
    eng.close()
    assert time.perf_counter() - t0 < 1.0
    assert not eng._thread.is_alive()
    assert backend.closed
    assert list(job)[-1].reason == "cancelled"
    assert eng.complete("late", GREEDY).collect().done == DoneEvent("error", "the engine is closed")
