"""CudaBackend against CpuBackend on the real SmolLM2-135M-Instruct Q4_1 (the default model).

The GPU issue asks that GPU decode pick the CPU reference's top-1 token at >= 99% of positions.
Random-weight models cannot show that (flat logits: near-ties flip, see test_backend.py), so this
runs 4 real chats through the model's chat template (tests/real_chat_agreement.py): each prompt's
prefill row, then 64 decode steps teacher-forced with the CPU's greedy token, 260 positions.
Asserted over ALL positions, near-ties included: top-1 agreement >= 99% (at most 2 flips);
first, >= 99% on decisive positions (reference top-1 ahead by > 5x the row's RMS logit error, as in
test_backend.py), so a failure of the last assert alone means near-ties flipped, not a kernel bug.

Per-row bounds, ||gpu - cpu|| / ||cpu||: decode steps <= 0.02, prefill rows <= 0.01. The GPU
quantizes every decode matmul's activation to the two-term q8_1 (an int8 term and an int8 term for
its rounding residual, ~16 bits) and the prefill's last row meets the LM head as a one-token
matvec. Measured on the H200 (commit 42aba05): top-1 259/260 = 99.6% (256/256 decisive; the one
flip at a reference margin of 0.001 logits), decode max 0.0042 (mean 0.0007), prefill rows max
0.0026; the bounds leave ~4-5x. A real kernel bug (a wrong block, a dropped offset) gives errors
of order one. With one int8 term (the format llama.cpp uses) the same test measured 249/260 =
95.8% and decode max 0.263: that is why the residual term exists (tests/test_q8_1_emulation.py).

The model comes from $MEMRA_REAL_SMOLLM2 (scripts/device_run.sh sets it after joining the parts
carried in .models/, scripts/model_parts.py) or the default model's cache; never downloaded here.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from memra_engine.default_model import cached_default_model
from memra_engine.model.gguf_file import open_gguf
from real_chat_agreement import chat_prompt_ids, compare_teacher_forced

pytestmark = pytest.mark.gpu
TOP1_BOUND = 0.99        # the bar, over all 260 positions
DECODE_BOUND = 0.02      # two-term q8_1 activations: measured max 0.0042
PREFILL_ROW_BOUND = 0.01  # f16 GEMM layers + the LM head's one-token row: measured max 0.0026
N_CTX = 512              # the longest chat is ~70 tokens, + 64 steps


def real_smollm2() -> Path:
    env = os.environ.get("MEMRA_REAL_SMOLLM2")
    if env:
        if not Path(env).is_file():
            pytest.fail(f"MEMRA_REAL_SMOLLM2={env} is not a file")
        return Path(env)
    cached = cached_default_model()
    if cached is None:
        pytest.skip("real SmolLM2 not present: set MEMRA_REAL_SMOLLM2 or carry its parts in .models/ "
                    "(scripts/model_parts.py; README, GPU tests)")
    return cached


@pytest.fixture
def backends():
    from memra_engine.cpu.backend import CpuBackend
    from memra_engine.gpu.backend import CudaBackend

    g = open_gguf(real_smollm2())
    gpu = CudaBackend(g, n_ctx=N_CTX)
    try:
        yield g, CpuBackend(g, N_CTX), gpu
    finally:
        gpu.close()


def test_real_chats_follow_the_cpu_backend(backends):
    g, cpu, gpu = backends
    result = compare_teacher_forced(cpu, gpu, chat_prompt_ids(g))
    print(f"\nSmolLM2 Q4_1 real chats, cuda vs cpu: {result.summary()}")
    assert result.max_err(prefill=True) <= PREFILL_ROW_BOUND, result.summary()
    assert result.max_err(prefill=False) <= DECODE_BOUND, result.summary()
    assert result.decisive().sum() >= 50, "too few decisive positions to judge top-1"
    assert result.decisive_rate() >= TOP1_BOUND, f"flips where no near-tie explains them: {result.summary()}"
    assert result.rate >= TOP1_BOUND, result.summary()
