"""CpuBackend: the numpy reference backend (Backend protocol, engine/backend.py)."""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import psutil
from threadpoolctl import ThreadpoolController

from memra_engine.backend import check_tokens
from memra_engine.cpu.kv_cache import KvCache
from memra_engine.cpu.ops import CpuOps
from memra_engine.cpu.weights import DEFAULT_BUDGET_BYTES, CpuWeights
from memra_engine.errors import ContextOverflowError, HostOutOfMemory
from memra_engine.events import MoeStats, VramStats
from memra_engine.kv_type import DEFAULT_KV_TYPE, check_kv_type
from memra_engine.model import arch_module
from memra_engine.model.config import config_from_gguf
from memra_engine.model.gguf_file import GGUFFile

# Prefill runs the prompt in batches of this many tokens: attention scores are
# [n_head, chunk, n_past + chunk] floats, so this bounds scratch memory on long prompts.
PREFILL_CHUNK = 512

# Decode is a chain of small matrix-vector products, bound by memory bandwidth. Split over
# BLAS threads each product waits for the slowest thread, and on a busy machine a descheduled
# thread turned a 0.1 ms matvec into 10-20 ms (measured on 2 shared cores): SmolLM2 decoded at
# 5-17 tok/s on two threads against 17-22 on one, at the same load. At light load one thread
# was no slower (29 vs 30 ms for the layer matvecs): the product is bound by memory bandwidth.
# Prefill (matrix-matrix) keeps BLAS's default thread count: each call has work enough to split.
DECODE_BLAS_THREADS = 1


class CpuBackend:
    prefill_chunk = 128        # per generation-loop call: bounds how long cancel() waits in a prefill
    samples_on_device = False  # the generation loop samples on the host (engine/sampling.py)

    def __init__(self, g: GGUFFile, n_ctx: int, weight_budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 kv_type: str = DEFAULT_KV_TYPE):
        cfg = self.config = config_from_gguf(g)
        self.kv_type = check_kv_type(kv_type, cfg.head_dim)
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise ContextOverflowError(f"n_ctx must be a positive number of tokens, got {n_ctx!r}")
        kv_bytes = KvCache.bytes_needed(cfg.n_layer, cfg.n_kv_head, n_ctx, cfg.head_dim)
        available = psutil.virtual_memory().available
        if kv_bytes > available:
            raise HostOutOfMemory(
                f"a {n_ctx}-token context needs {kv_bytes / 2**30:.1f} GiB of KV cache but only "
                f"{available / 2**30:.1f} GiB of memory is free; try a smaller --ctx"
            )
        self.n_ctx = n_ctx
        self.n_past = 0
        self.weights = CpuWeights(g, cfg, weight_budget_bytes)
        self.kv = KvCache(cfg.n_layer, cfg.n_kv_head, n_ctx, cfg.head_dim, kv_type)
        self.ops = CpuOps(self.kv)
        self.forward = arch_module(cfg.arch).forward
        self.blas = ThreadpoolController()
        self.device_name = cpu_name()

    def prefill(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        ids = self.check_tokens(tokens)
        rows = []
        for a in range(0, len(ids), PREFILL_CHUNK):
            chunk = ids[a:a + PREFILL_CHUNK]
            is_last_chunk = a + PREFILL_CHUNK >= len(ids)
            if all_logits or is_last_chunk:
                rows.append(self.run(chunk, last_only=not all_logits))
            else:
                self.run(chunk, last_only=True)   # the logits are thrown away; the cache is kept
        return np.concatenate(rows) if all_logits else rows[-1][0]

    def decode(self, token: int) -> np.ndarray:
        ids = self.check_tokens([token])
        with self.blas.limit(limits=DECODE_BLAS_THREADS, user_api="blas"):
            return self.run(ids, last_only=True)[0]

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        # One decode per row: the rows are then bit-identical to plain decoding, which greedy
        # speculative decoding needs (docs/design.md §5 rule 3). A batched pass would round differently.
        self.check_tokens(tokens)
        return np.stack([self.decode(t) for t in tokens])

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot truncate to {n}: the cache holds {self.n_past} tokens")
        self.n_past = n   # later writes overwrite the stale positions; attention never reads them

    def memory_stats(self) -> VramStats:
        return VramStats(process_rss=psutil.Process().memory_info().rss)

    def moe_stats(self) -> MoeStats | None:
        """Every expert sits in host memory here, so each routed (token, expert) is a hit."""
        cfg = self.config
        if not cfg.is_moe or self.ops is None:
            return None
        n = self.ops.routed
        experts = cfg.n_layer * cfg.n_expert
        return MoeStats(hits=n, total_hits=n, resident_experts=experts, total_experts=experts)

    def bench_extras(self, runs: int, depth: int) -> dict:
        return {}

    def close(self) -> None:
        self.weights = self.kv = self.ops = None

    # the host samples for this backend (Backend protocol: samples_on_device is False)
    def set_sampling(self, params, seed=None, use_mask=False) -> int:
        raise NotImplementedError("the cpu backend samples on the host")

    def decode_sample(self, token: int, ahead: bool = True) -> tuple[int, float]:
        raise NotImplementedError("the cpu backend samples on the host")

    def begin_masked_step(self, token: int) -> np.ndarray:
        raise NotImplementedError("the cpu backend samples on the host")

    def finish_masked_step(self, ahead: bool = True) -> tuple[int, float]:
        raise NotImplementedError("the cpu backend samples on the host")

    def step_candidates(self):
        return None  # host sampling computes them (engine/steps.py HostSampling)

    def verify_sample(self, tokens, masks=None) -> list[tuple[int, float]]:
        raise NotImplementedError("the cpu backend samples on the host")

    def draft_tokens(self, token: int, k: int) -> list[int]:
        raise NotImplementedError("the cpu backend samples on the host")

    # --- internals ------------------------------------------------------------------------------
    def check_tokens(self, tokens: Sequence[int]) -> np.ndarray:
        return check_tokens(tokens, self.config.vocab_size, self.n_past, self.n_ctx)

    def run(self, ids: np.ndarray, last_only: bool) -> np.ndarray:
        positions = np.arange(self.n_past, self.n_past + len(ids), dtype=np.int32)
        logits = self.forward(self.ops, self.weights, self.config, ids, positions, last_only)
        self.n_past += len(ids)
        return logits


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} threads)"
    except OSError:
        pass
    return f"CPU ({os.cpu_count()} threads)"
