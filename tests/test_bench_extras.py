"""CudaBackend.bench_extras' bookkeeping without a GPU: every figure is the median of `runs` runs,
the engine-path ones (decode_sample wall time) included, on a fake backend whose runs have scripted
durations (one slow outlier among them, which a median ignores and a single run or a mean would not)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from memra_engine.events import VramStats
from memra_engine.gpu import backend as gpu_backend
from memra_engine.gpu.backend import CudaBackend
from memra_engine.sampling import SamplingParams

STEPS = 128


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class FakeCuda:
    """The surface bench_extras uses. Run r of a kind takes step_s[r % 5] per step: the first run is slow."""

    def __init__(self, clock: Clock, step_s=(5e-3, 1e-3, 1e-3, 1e-3, 1e-3)):
        self.clock, self.step_s = clock, step_s
        self.n_ctx, self.config = 8192, SimpleNamespace(vocab_size=1000)
        self.decode_runs = {}  # (temperature, top_logprobs) -> runs begun
        self.graph_runs = 0
        self.params = None
        self.prompts = []  # each prefill's length

    _decode_sample_s = CudaBackend._decode_sample_s
    _graph_us = CudaBackend._graph_us

    def truncate(self, n):
        pass

    def prefill(self, tokens):
        self.prompts.append(len(tokens))

    def set_sampling(self, params, seed=None, use_mask=False):
        self.params = params
        key = (params.temperature, params.top_logprobs)
        self.run = self.decode_runs.get(key, 0)
        self.decode_runs[key] = self.run + 1
        return 0

    def decode_sample(self, token):
        self.clock.now += self.step_s[self.run % len(self.step_s)]
        return token, 0.0

    def graph_step_us(self, n=128, params=None):
        us = 1e6 * self.step_s[self.graph_runs % len(self.step_s)] / 2
        self.graph_runs += 1
        return us, 300

    def memory_stats(self):
        return VramStats(reserved={"weights": 3 << 20, "kv": 5 << 19}, used={"weights": 2 << 20, "kv": 1 << 20})


@pytest.fixture
def extras(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(gpu_backend, "time", clock)
    fake = FakeCuda(clock)
    return CudaBackend.bench_extras(fake, runs=5, depth=4096), fake


def test_every_engine_path_figure_is_the_median_of_its_runs(extras):
    out, fake = extras
    # median step 1 ms (the 5 ms run is the outlier): 1,000 tok/s, where a mean would say 555
    for key in ("tg128_decode_sample_tok_s", "tg128_decode_sample_default_sampling_tok_s",
                "tg128_decode_sample_default_sampling_at_4096_tok_s", "tg128_decode_sample_top_logprobs10_tok_s"):
        assert out[key] == pytest.approx(1000.0), key
    default = SamplingParams().temperature
    # default knobs at depth 4096; greedy; default knobs (their own figure, then the candidates'
    # "off" side); with 10 candidates
    assert fake.decode_runs == {(default, 0): 15, (0.0, 0): 5, (default, 10): 5}
    assert fake.prompts.count(4096) == 10  # the graph and the engine path at depth, 5 runs each


def test_every_graph_figure_is_the_median_of_its_runs(extras):
    out, _ = extras
    for key in ("tg128_graph_tok_s", "tg128_graph_at_4096_tok_s", "tg128_graph_default_sampling_tok_s",
                "tg128_graph_top_logprobs10_tok_s"):
        assert out[key] == pytest.approx(2000.0), key   # half a step's time: 0.5 ms
    assert out["graph_kernels_per_token"] == 300
    assert out["outside_graph_share"] == pytest.approx(0.5)
    assert out["top_logprobs10_cost"] == 0.0
    assert out["vram_used_mib"] == 3.0 and out["vram_reserved_mib"] == 5.5
    assert out["vram_regions_mib"] == {"weights": {"used": 2.0, "reserved": 3.0}, "kv": {"used": 1.0, "reserved": 2.5}}
