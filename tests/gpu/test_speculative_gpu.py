"""Speculative decoding on the GPU: the verify+sample graph, the draft model's back-to-back
drafts, and the engine's rounds (greedy == plain, seeds repeat, the sampled walk keeps the
target's distribution).

Exact guarantees checked: verify_sample's greedy rows are the argmax of verify rows, which equal
decode rows bit for bit (also across a KV bucket boundary); draft_tokens == a decode_sample
chain; greedy speculative replies == plain greedy replies token for token.
"""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.generate import Engine
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import DraftModel, PromptLookup, SpecConfig, SpecCounters
from memra_engine.steps import DeviceSampling, MaskTimer, speculative_for
from spec_checks import chi_square_p, exact_two_token_distribution, repeating_prompt, spec_context

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0, max_tokens=256)
MODELS = {
    "tiny-llama": dict(preset="tiny-llama", head_dim=64, n_head=4, n_kv_head=2, d_model=256),
    "tiny-qwen3": dict(preset="tiny-qwen3"),
    "tiny-gemma3": dict(preset="tiny-gemma3"),
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    out = {}
    for name, kw in MODELS.items():
        out[name] = write_synthetic_gguf(tmp_path_factory.mktemp("m") / f"{name}.gguf", seed=3, **kw)
        # a draft of the same shape and vocabulary, other weights: it disagrees with the target often
        out[name + "-other"] = write_synthetic_gguf(tmp_path_factory.mktemp("m") / f"{name}-other.gguf", seed=11, **kw)
    return out


def cuda_backend(path, n_ctx=256, runtime=None):
    from memra_engine.gpu.backend import CudaBackend
    from memra_engine.model.gguf_file import open_gguf

    return CudaBackend(open_gguf(path), n_ctx=n_ctx, runtime=runtime)


@pytest.mark.parametrize("n_prompt", [50, 60])  # 60 + 8 rows cross the 64-key bucket
def test_verify_sample_greedy_rows_are_the_argmax_of_decode_rows(paths, n_prompt):
    gpu = cuda_backend(paths["tiny-llama"])
    try:
        prompt = [int(t) for t in np.random.default_rng(n_prompt).integers(3, 300, n_prompt)]
        tokens = [5, 9, 11, 300, 2, 2, 7, 1]
        gpu.prefill(prompt)
        decoded = np.stack([gpu.decode(t) for t in tokens])
        gpu.truncate(n_prompt)
        assert np.array_equal(gpu.verify(tokens), decoded)
        gpu.truncate(n_prompt)
        gpu.set_sampling(SamplingParams(temperature=0.0), seed=0)
        rows = gpu.verify_sample(tokens)
        assert gpu.n_past == n_prompt + len(tokens)
        assert [t for t, _ in rows] == [int(np.argmax(r)) for r in decoded]
        assert all(lp <= 0.0 for _, lp in rows)
    finally:
        gpu.close()


def test_draft_tokens_equal_a_decode_sample_chain_and_share_the_target_runtime(paths):
    target = cuda_backend(paths["tiny-llama"])
    draft = cuda_backend(paths["tiny-llama-other"], runtime=target.rt)
    try:
        prompt = list(range(10, 40))
        draft.set_sampling(SamplingParams(temperature=0.0), seed=0)
        draft.prefill(prompt)
        chained = draft.draft_tokens(7, 6)
        assert draft.n_past == len(prompt) + 6
        draft.truncate(len(prompt))
        expected, t = [], 7
        for _ in range(6):
            t, _ = draft.decode_sample(t)
            expected.append(t)
        assert chained == expected
        draft.close()
        target.prefill(prompt)  # the shared context outlives the draft
        assert target.decode(3).shape == (target.config.vocab_size,)
    finally:
        target.close()


def test_decode_sample_without_run_ahead_gives_the_same_draws_and_queues_nothing(paths):
    """decode_sample(ahead=False), the speculative strategy's plain step, draws what the run-ahead
    path draws with the same seed (the Philox counter advances once per step either way), mixed
    with run-ahead steps in any order, and leaves no step queued for a verify to wait out."""
    gpu = cuda_backend(paths["tiny-llama"])
    try:
        prompt = list(range(10, 40))
        runs = []
        for pattern in ([True] * 12, [False] * 12, [True, False, False, True, True, False] * 2):
            gpu.truncate(0)
            gpu.prefill(prompt)
            gpu.set_sampling(SamplingParams(temperature=1.0, top_k=20), seed=5)
            out, t = [], 7
            for ahead in pattern:
                queued = len(gpu._ahead)
                t, _ = gpu.decode_sample(t, ahead=ahead)
                out.append(t)
                if not ahead:  # nothing new queued: only what an earlier run-ahead step left
                    assert len(gpu._ahead) == max(queued - 1, 0)
            runs.append(out)
        assert runs[0] == runs[1] == runs[2]
        assert gpu.n_past == len(prompt) + 12
    finally:
        gpu.close()


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("grammar", [None, "json"])
def test_greedy_speculative_replies_equal_plain_replies(paths, name, grammar):
    g = Grammar.json() if grammar else None
    messages = [{"role": "user", "content": repeating_prompt()}]
    with Engine.load(paths[name], backend="cuda", n_ctx=1024, draft=paths[name + "-other"]) as eng:
        plain = eng.chat(messages, GREEDY, grammar=g).collect()
        # "context": the greedy reply of a random model can run until the context is full
        assert plain.done.reason in ("eos", "length", "context") and len(plain.token_ids) > 16
        for spec in (SpecConfig(mode="lookup"), SpecConfig(mode="draft", draft_max=4)):
            got = eng.chat(messages, GREEDY, grammar=g, spec=spec).collect()
            assert got.token_ids == plain.token_ids, spec
            assert got.stats.spec_rounds > 0
    with Engine.load(paths[name], backend="cuda", n_ctx=1024, draft=paths[name]) as eng:
        got = eng.chat(messages, GREEDY, grammar=g, spec=SpecConfig(mode="draft")).collect()
        assert got.token_ids == plain.token_ids
        # the same model drafts its own argmax; not always bit for bit: its cache of the prompt comes
        # from a GEMM prefill chunked differently from the target's, so near-ties may flip
        assert got.stats.spec_accepted >= 0.9 * got.stats.spec_drafted > 0


def test_sampled_speculative_reply_repeats_with_its_seed(paths):
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=120)
    messages = [{"role": "user", "content": repeating_prompt()}]
    with Engine.load(paths["tiny-llama"], backend="cuda", n_ctx=512) as eng:
        a = eng.chat(messages, params, spec=SpecConfig(mode="lookup")).collect()
        b = eng.chat(messages, params, spec=SpecConfig(mode="lookup")).collect()
    assert a.token_ids == b.token_ids and a.stats.spec_rounds > 0


@pytest.mark.parametrize("case", ["filters", "penalties", "grammar"])
def test_device_rounds_keep_the_target_distribution(paths, case):
    """20,000 draws of the first two tokens after a fixed context from DeviceSpeculative rounds
    (prompt lookup proposes the context's continuation, which the target often rejects), against
    the exact distribution computed on the host from the GPU's own verify rows."""
    params = {"filters": SamplingParams(temperature=1.0, top_k=12, top_p=0.9, min_p=0.0),
              "penalties": SamplingParams(temperature=1.0, top_k=12, top_p=1.0, min_p=0.0, repeat_penalty=1.5,
                                          presence_penalty=0.5, repeat_last_n=8),
              "grammar": SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)}[case]
    gpu = cuda_backend(paths["tiny-llama"])
    try:
        context, make_constraint = spec_context(paths["tiny-llama"], case == "grammar", gpu.config.vocab_size)
        expected = exact_two_token_distribution(gpu, context, params, make_constraint)
        counts: dict[tuple[int, int], int] = {}
        n = 20_000
        gpu.set_sampling(params, seed=1)
        for _ in range(n):
            gpu.truncate(0)
            gpu.prefill(context[:-1])
            history = list(context)
            constraint = make_constraint()
            plain = DeviceSampling(gpu, params, constraint, MaskTimer())  # a fresh random seed per draw
            rounds = speculative_for(plain, history, PromptLookup(), SpecConfig(mode="lookup", draft_max=4),
                                     SpecCounters(), set())
            got = rounds.step(context[-1], 2)
            if len(got) == 1:
                history.append(got[0][0])
                got += rounds.step(got[0][0], 1)
            key = (got[0][0], got[1][0])
            counts[key] = counts.get(key, 0) + 1
        assert chi_square_p(counts, expected, n) > 0.001
    finally:
        gpu.close()
