"""The generation loop and Engine API.

Part 1 drives the loop with a scripted backend (tests/fake_engine.py) where the tokens are forced,
to pin down stop strings, EOS, length, cancel timing and cache bookkeeping exactly.
Part 2 runs the real CPU engine on a tiny synthetic model and checks the same promises end to end.
"""
from __future__ import annotations

import time

import numpy as np
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


def test_full_context_says_context_not_length():
    """Issue 17: the reply that hit the context limit says so, not "max tokens"."""
    backend = ScriptedBackend(n_ctx=20, script=ids_of("z" * 40))
    with fake_engine(backend) as eng:
        result = run(eng, "0123456789", SamplingParams(temperature=0.0, max_tokens=100))  # 11 with BOS
        assert run(eng, "0123456789", SamplingParams(temperature=0.0, max_tokens=10)).done.reason == "length"
    assert result.done.reason == "context"
    assert 11 + len(result.token_ids) == 21  # 9 decoded to fill the cache, plus the last sampled token
    assert backend.n_past == 20


def test_prompt_longer_than_context_is_an_error_event():
    backend = ScriptedBackend(n_ctx=32)
    with fake_engine(backend) as eng:
        result = run(eng, "x" * 40)
        assert result.done == DoneEvent("error", "prompt is 41 tokens but the context is 32 (use --ctx)")
        assert run(eng, "short").done.reason in ("eos", "length", "context")  # the engine still works


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
        # the step in flight may finish and one more token may already be queued; no more
        assert n_tokens <= 5, n_tokens
        assert waited < 0.35, f"cancel took {waited:.3f}s; a decode step is 0.05 s"
        after_cancel = run(eng, "another prompt", SamplingParams(temperature=0.9, seed=9, max_tokens=20))
    with fake_engine(ScriptedBackend()) as fresh:
        want = run(fresh, "another prompt", SamplingParams(temperature=0.9, seed=9, max_tokens=20))
    assert after_cancel.text == want.text and after_cancel.done == want.done


@pytest.mark.parametrize("backend_class", ["host sampling", "device sampling"])
def test_kv_prefix_is_reused_and_gives_the_same_reply_as_a_fresh_engine(backend_class):
    from fake_engine import DeviceSamplingBackend

    make = ScriptedBackend if backend_class == "host sampling" else DeviceSamplingBackend
    first, second = "The quick brown fox", "The quick brown fox jumps over"
    backend = make()
    with fake_engine(backend) as eng:
        run(eng, first)
        calls_before = len(backend.prefill_calls)
        reused = run(eng, second)
        # only the new tail is prefilled: common prefix = BOS + first prompt; the prompt's last
        # token goes through the decode step
        assert backend.prefill_calls[calls_before:] == [len(second) - len(first) - 1]
    with fake_engine(make()) as fresh:
        want = run(fresh, second)
    assert reused.text == want.text and reused.token_ids == want.token_ids


def test_same_prompt_twice_prefills_nothing_and_repeats_the_reply():
    backend = ScriptedBackend()
    with fake_engine(backend) as eng:
        a = run(eng, "repeat me")
        calls = len(backend.prefill_calls)
        b = run(eng, "repeat me")
    assert len(backend.prefill_calls) == calls  # all but the last prompt token were cached
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


# ---------------------------------------------------------------------------------------- real CPU engine

from memra_engine.generate import Engine, open_model  # noqa: E402
from memra_engine.model.gguf_file import open_gguf  # noqa: E402
from tiny_models import tiny_llama_path, tiny_no_template_path  # noqa: E402,F401  (fixtures)

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something about cats."}]


class PrefillSpy:
    """Wraps a real backend: records how many tokens each prefill call got, and can slow decode
    down to a step time a consumer can observe (the tiny model decodes in well under 1 ms)."""

    def __init__(self, backend, decode_delay_s: float = 0.0):
        self.inner = backend
        self.prefill_sizes: list[int] = []
        self.decode_delay_s = decode_delay_s

    def prefill(self, tokens, all_logits=False):
        self.prefill_sizes.append(len(tokens))
        return self.inner.prefill(tokens, all_logits)

    def decode(self, token):
        time.sleep(self.decode_delay_s)
        return self.inner.decode(token)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def spied_engine(path, n_ctx=256, decode_delay_s=0.0) -> tuple[Engine, list]:
    spies = []

    def opener():
        model, info = open_model(open_gguf(path), "cpu", n_ctx, None, lambda msg: None)
        model.backend = PrefillSpy(model.backend, decode_delay_s)
        spies.append(model.backend)
        return model, info

    return Engine.start(opener), spies


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama_path):
    eng = Engine.load(tiny_llama_path, backend="cpu", n_ctx=256)
    yield eng
    eng.close()


def test_info_describes_the_model(tiny_engine, tiny_llama_path):
    info = tiny_engine.info
    assert info.arch == "llama" and info.backend == "cpu" and info.n_ctx == 256
    assert info.has_chat_template
    g = open_gguf(tiny_llama_path)
    assert info.n_params == sum(int(np.prod(t.shape)) for t in g.tensors.values())
    assert "Q8_0" in info.quant_mix and info.device_name


def test_no_template_model_reports_completion_mode(tiny_no_template_path):
    with Engine.load(tiny_no_template_path, backend="cpu", n_ctx=128) as eng:
        assert eng.info.has_chat_template is False
        result = eng.chat([{"role": "user", "content": "once upon a time"}], SamplingParams(seed=1, max_tokens=6)).collect()
    assert result.done.reason in ("eos", "length") and result.token_ids


def test_real_stop_string_split_across_tokens(tiny_engine):
    params = SamplingParams(temperature=0.0, max_tokens=40)
    events = [e for e in tiny_engine.complete("the cat sat on", params) if isinstance(e, TokenEvent)]
    pieces = [e.text for e in events]
    boundary = next(i for i in range(1, len(pieces)) if pieces[i - 1] and pieces[i])
    stop = pieces[boundary - 1][-1] + pieces[boundary][0]  # straddles two tokens
    full = "".join(pieces)
    result = tiny_engine.complete("the cat sat on", params, stop=[stop]).collect()
    assert result.done.reason == "stop"
    assert result.text == full[: full.find(stop)]
    assert stop not in result.text


def test_real_max_tokens_and_seeded_reproducibility(tiny_engine, tiny_llama_path):
    params = SamplingParams(temperature=0.8, seed=42, max_tokens=12)
    a = tiny_engine.chat(CHAT, params).collect()
    b = tiny_engine.chat(CHAT, params).collect()
    assert a.done.reason == "length" and len(a.token_ids) == 12
    assert a.text == b.text and a.token_ids == b.token_ids
    c = tiny_engine.chat(CHAT, SamplingParams(temperature=0.8, seed=43, max_tokens=12)).collect()
    assert c.token_ids != a.token_ids


def test_real_prompt_longer_than_context(tiny_llama_path):
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=32) as eng:
        result = eng.complete("the cat sat on the mat " * 20, GREEDY).collect()
        assert result.done.reason == "error"
        assert result.done.error.startswith("prompt is ") and "but the context is 32 (use --ctx)" in result.done.error
        assert eng.complete("hi", SamplingParams(temperature=0.0, max_tokens=3)).collect().done.reason in ("eos", "length")


def test_real_cancel_then_next_job_matches_a_fresh_engine(tiny_llama_path):
    follow_up = SamplingParams(temperature=0.7, seed=3, max_tokens=16)
    eng, _ = spied_engine(tiny_llama_path, decode_delay_s=0.05)
    with eng:
        job = eng.chat(CHAT, SamplingParams(temperature=1.0, seed=1, max_tokens=200))
        n = 0
        for event in job:
            if isinstance(event, TokenEvent):
                n += 1
                if n == 3:
                    job.cancel()
            last = event
        assert last == DoneEvent("cancelled") and n <= 5, n
        after = eng.chat(CHAT[:1] + [{"role": "user", "content": "And dogs?"}], follow_up).collect()
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as fresh:
        want = fresh.chat(CHAT[:1] + [{"role": "user", "content": "And dogs?"}], follow_up).collect()
    assert after.token_ids == want.token_ids and after.text == want.text


def test_real_kv_prefix_reuse_matches_a_fresh_engine(tiny_llama_path):
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    eng, spies = spied_engine(tiny_llama_path)
    with eng:
        first = eng.chat(CHAT, greedy).collect()
        turn2 = CHAT + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "More."}]
        n_before = len(spies[0].prefill_sizes)
        second = eng.chat(turn2, greedy).collect()
        reused_prefill = sum(spies[0].prefill_sizes[n_before:])
    fresh, fresh_spies = spied_engine(tiny_llama_path)
    with fresh:
        want = fresh.chat(turn2, greedy).collect()
        full_prefill = sum(fresh_spies[0].prefill_sizes)
    assert second.token_ids == want.token_ids
    assert reused_prefill < full_prefill / 2, (reused_prefill, full_prefill)


def test_real_close_stops_the_thread(tiny_llama_path):
    eng = Engine.load(tiny_llama_path, backend="cpu", n_ctx=256)
    job = eng.chat(CHAT, SamplingParams(temperature=1.0, max_tokens=200))
    t0 = time.perf_counter()
    eng.close()
    assert time.perf_counter() - t0 < 1.0 and not eng._thread.is_alive()
    assert list(job)[-1].reason in ("cancelled", "length", "eos")


@pytest.mark.slow
def test_default_model_chats(smollm2_path):
    with Engine.load(None, backend="cpu", n_ctx=512) as eng:
        assert eng.info.has_chat_template and eng.info.arch == "llama"
        assert 100e6 < eng.info.n_params < 200e6
        result = eng.chat([{"role": "user", "content": "What is 2 + 2?"}], SamplingParams(temperature=0.0, max_tokens=24)).collect()
        stats = eng.stats()
    assert result.done.reason in ("eos", "length") and result.text.strip()
    assert stats.decode_tok_s > 0 and stats.vram.process_rss > 0


def test_sampling_update_applies_at_the_next_step():
    with fake_engine(ScriptedBackend(step_s=0.02)) as eng:
        job = eng.complete("hi", SamplingParams(temperature=0.8, seed=1, max_tokens=200))
        n = 0
        for event in job:
            if isinstance(event, TokenEvent):
                n += 1
                if n == 2:
                    with pytest.raises(ValueError):
                        job.update_sampling(SamplingParams(top_k=-1))
                    job.update_sampling(SamplingParams(temperature=0.8, max_tokens=6))
            last = event
    assert last.reason == "length" and n == 6


def test_context_is_capped_at_the_training_context(tiny_llama_path):
    notes = []
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=4096, progress=notes.append) as eng:
        assert eng.info.n_ctx == 256
    assert any("256-token context" in note for note in notes)


def test_long_prompts_are_prefilled_in_the_backends_chunks():
    for chunk in (128, 512):
        backend = ScriptedBackend(n_ctx=2048)
        backend.prefill_chunk = chunk
        with fake_engine(backend) as eng:
            run(eng, "y" * (2 * chunk + 9), SamplingParams(temperature=0.0, max_tokens=2))
        # BOS + prompt, less the last token, which the decode step feeds
        assert backend.prefill_calls == [chunk, chunk, 9]


def test_device_sampling_backend_samples_in_its_decode_step():
    """A backend with decode_sample (cuda) gets one call per token and never a host decode; greedy
    output equals the host-sampling path's, and a fixed seed reproduces the reply."""
    from fake_engine import DeviceSamplingBackend

    backend = DeviceSamplingBackend()
    with fake_engine(backend) as eng:
        greedy = run(eng, "The quick brown fox", GREEDY)
    assert backend.calls["decode"] == 0 and backend.calls["sample_logits"] == 0
    assert backend.calls["decode_sample"] == len(greedy.token_ids)  # the first feeds the prompt's last token
    with fake_engine(ScriptedBackend()) as host:
        assert run(host, "The quick brown fox", GREEDY).token_ids == greedy.token_ids

    seeded = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7, max_tokens=24)
    replies = []
    for _ in range(2):
        with fake_engine(DeviceSamplingBackend()) as eng:
            replies.append(run(eng, "hello", seeded).token_ids)
    assert replies[0] == replies[1] and len(replies[0]) == 24


def test_device_sampling_update_rewrites_the_parameter_block():
    from fake_engine import DeviceSamplingBackend

    backend = DeviceSamplingBackend(step_s=0.02)
    with fake_engine(backend) as eng:
        job = eng.complete("hi", SamplingParams(temperature=0.8, seed=1, max_tokens=200))
        n = 0
        for event in job:
            if isinstance(event, TokenEvent):
                n += 1
                if n == 2:
                    job.update_sampling(SamplingParams(temperature=0.8, seed=1, max_tokens=6))
            last = event
    assert last.reason == "length" and n == 6
    assert backend.calls["set_sampling"] == 2 and backend.seeds[0] == 1 and backend.seeds[1] != 1


def test_count_tokens_is_the_conversation_as_a_reply_builds_it(tiny_engine, tiny_llama_path):
    """count_tokens: the messages through the template without a generation prompt; a reply to
    the same messages prefills them with one (n_prompt_tokens)."""
    from memra_engine.chat_template import ChatTemplate
    from memra_engine.generate import prompt_ids
    from memra_engine.tokenizer import load_tokenizer

    g = open_gguf(tiny_llama_path)
    tokenizer, template = load_tokenizer(g), ChatTemplate.from_gguf(g)
    messages = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! How can I help?"},
                {"role": "user", "content": "Tell me more"}]
    assert tiny_engine.count_tokens(messages) == len(prompt_ids(tokenizer, template, messages, add_generation_prompt=False))
    assert tiny_engine.count_tokens([]) == 0
    result = tiny_engine.chat(messages, SamplingParams(max_tokens=2, seed=1)).collect()
    assert result.stats.n_prompt_tokens == len(prompt_ids(tokenizer, template, messages)) > tiny_engine.count_tokens(messages)
