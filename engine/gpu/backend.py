"""CudaBackend: the Backend protocol (engine/backend.py) on one GPU, running the same forward
programs as the numpy backend (engine/model/<arch>.py) with GpuOps.

This is the runner: it owns the device state (runtime, pool, weights, KV cache, sampler) and is
the only place that captures CUDA graphs. A one-token decode is captured once per KV-length
attention grid (ops.attn_splits of the power-of-two KV bucket) and replayed with the
token id and position at fixed device addresses. `decode_sample` captures the sampler too, so a
step is one graph launch plus an 8-byte readback (token id and its logprob).

decode_sample keeps AHEAD_STEPS steps queued past the one it returns: each step's graph writes
the sampled token and the next position into the device step buffer, so the next step needs
nothing from the host, and the GPU never waits for the caller to stream a token. If the caller
feeds the token it was given, its step is already queued or done; anything else (another token,
truncate, prefill, new knobs, ...) first settles the queue: waits for it and rewinds the Philox
counter by the steps dropped, their one lasting effect (their KV rows and history entries sit at
positions >= n_past, which real steps overwrite before anything reads them).

With a grammar the sampling of step t+1 needs a mask the host computes from token t, so a step is
two graphs: the forward (the token is already in the device step buffer) and the sampler. The
masked step pair (begin_masked_step / finish_masked_step) uploads the mask, launches the sampler
and then, before it waits for the token, the next step's forward: while the host advances the
matcher and computes the next mask, the GPU runs that forward. Only the forward runs ahead, so
there is no Philox counter to rewind.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from memra_engine.backend import check_tokens
from memra_engine.errors import ContextOverflowError, UnsupportedModelError
from memra_engine.events import MoeStats, VramStats
from memra_engine.gpu.expert_cache import ExpertCache
from memra_engine.gpu.graph import CudaGraph
from memra_engine.gpu.kv_cache import GpuKvCache
from memra_engine.gpu.memory import MIB, OOM_HINT, OOM_HINT_Q8_0, VramPool
from memra_engine.gpu import quant_ops
from memra_engine.gpu.ops import Arena, DArray, GpuOps, attn_max_splits, attn_splits, kv_bucket
from memra_engine.gpu.runtime import GpuRuntime
from memra_engine.gpu.sampler import MAX_ROWS, OUT_DTYPE, RESULT_DTYPE, GpuSampler
from memra_engine.gpu.weights import GpuWeights
from memra_engine.kv_type import DEFAULT_KV_TYPE, check_kv_type
from memra_engine.model import arch_module
from memra_engine.model.config import config_from_gguf
from memra_engine.candidates import TokenCandidates
from memra_engine.sampling import SamplingParams

PREFILL_CHUNK = 512      # tokens per prefill forward (bounds the scratch arena)
ALL_LOGITS_CHUNK = 64    # tokens per forward when every row's logits come back
HEAD_DIMS = (64, 128, 256)
VERIFY_ROWS = MAX_ROWS   # most rows of a speculative verify pass (ops.BATCHED_MATVEC_MAX; the sampler samples them in one launch)
AHEAD_STEPS = 2          # decode_sample steps queued past the one returned (one hides the host's
                         # work per token; the second also the wake-up and launch after the sync)
SCRATCH_SLACK = 4 * MIB
EXPERT_HEADROOM = 512 * MIB  # VRAM left free when choosing an expert budget (the driver, graphs, other users)


class CudaBackend:
    def __init__(self, g, n_ctx: int, vram_budget: int | None = None, progress=None, use_graphs: bool = True,
                 kv_type: str = DEFAULT_KV_TYPE, runtime: GpuRuntime | None = None, moe_vram: int | None = None):
        """runtime: another backend's (a draft model beside its target shares the context and
        stream, since one thread has one current context); closing this one leaves it open.
        moe_vram: VRAM bytes for MoE experts: fewer than all of them turns the expert cache on
        (engine/gpu/expert_cache.py); None: all resident if they fit, else a budget that fits."""
        cfg = self.config = config_from_gguf(g)
        self.kv_type = check_kv_type(kv_type, cfg.head_dim)
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise ContextOverflowError(f"n_ctx must be a positive number of tokens, got {n_ctx!r}")
        if cfg.head_dim not in HEAD_DIMS:
            raise UnsupportedModelError(f"head dimension {cfg.head_dim} has no CUDA attention kernel (have {HEAD_DIMS})")
        self.n_ctx, self.n_past, self.use_graphs = n_ctx, 0, use_graphs
        # the attention split cap is a model constant: derived once, shared with GpuOps
        self.attn_max_splits = attn_max_splits(cfg.n_kv_head, cfg.n_head // cfg.n_kv_head, cfg.head_dim, self.kv_type)
        self.forward = arch_module(cfg.arch).forward
        self.graphs: dict[tuple, CudaGraph] = {}
        self.run_ahead = True   # decode_sample queues steps ahead; masked steps queue the next forward
        self._ahead: list[tuple[int, int]] = []  # queued steps: (position, out slot), oldest first
        self._fed = -1          # the token the oldest queued step decodes (the one last returned)
        self._forward_ahead: tuple[int, int] | None = None  # masked path: (position, token) queued
        self._queued_logits_ptr = 0  # where the last queued forward leaves its logits
        self.pool = None
        self.experts: ExpertCache | None = None
        self.tokens_run = 0  # tokens forwarded and kept (MoE counters when every expert is resident)
        self._owns_rt = runtime is None
        self.rt = runtime if runtime is not None else GpuRuntime(progress=progress)
        try:
            self._build(g, vram_budget, progress, moe_vram)
        except BaseException:
            self.close()
            raise

    def _build(self, g, vram_budget, progress, moe_vram=None) -> None:
        cfg, rt = self.config, self.rt
        n_slots = self._expert_slots(g, moe_vram, progress) if cfg.is_moe else 0
        weights = GpuWeights(g, cfg, experts_resident=not n_slots)
        regions = {
            "weights": weights.nbytes(),
            "kv": GpuKvCache.bytes_needed(cfg.n_layer, cfg.n_kv_head, self.n_ctx, cfg.head_dim, self.kv_type),
            "scratch": sum(scratch_parts := self._scratch_parts(g)),
            "graph": GpuSampler.nbytes(cfg.vocab_size) + 4 * (self.n_ctx + 2 * PREFILL_CHUNK) + 16 * 256
                     + VERIFY_ROWS * (4 * -(-cfg.vocab_size // 32) + OUT_DTYPE.itemsize) + 2 * 256,
        }
        if n_slots:
            regions["experts"] = cfg.n_layer * n_slots * self._slot_bytes
            regions["graph"] += 4 * cfg.n_layer * PREFILL_CHUNK * cfg.n_expert_used  # the routing log
        self.pool = VramPool(regions, budget=vram_budget, oom_hint=OOM_HINT_Q8_0 if self.kv_type == "q8_0" else OOM_HINT)
        if progress:
            progress(f"uploading weights ({regions['weights'] / MIB:.0f} MiB)")
        self.weights = weights.upload(rt, self.pool)
        self.kv = GpuKvCache(self.pool, cfg.n_layer, cfg.n_kv_head, self.n_ctx, cfg.head_dim, self.kv_type)
        scratch = self.pool.alloc("scratch", regions["scratch"], "arena")
        self.ops = GpuOps(rt, cfg, self.kv, Arena(scratch.ptr, scratch_parts), cluster=rt.cluster_attention,
                          split_cap=self.attn_max_splits, k256_outputs=quant_ops.k256_model(g.tensors.values()))
        alloc = lambda n, name: self.pool.alloc("graph", n, name).ptr  # noqa: E731
        if n_slots:
            log = alloc(4 * cfg.n_layer * PREFILL_CHUNK * cfg.n_expert_used, "routing log")
            self.ops.moe_log_ptr, self.ops.moe_log_tokens = log, PREFILL_CHUNK
            if progress:
                progress(f"expert cache: {n_slots} of {cfg.n_expert} experts per layer in VRAM")
            stacks = [(L.ffn_gate_up_exps, L.ffn_down_exps) for L in self.weights.layers]
            self.experts = ExpertCache(rt, self.pool, cfg, stacks, n_slots, log, PREFILL_CHUNK)
            self.run_ahead = False  # the cache acts between steps: after each one, before the next
        self.history_ptr = alloc(4 * self.n_ctx, "token_history")
        self.tokens_ptr = alloc(4 * PREFILL_CHUNK, "tokens")
        self.positions_ptr = alloc(4 * PREFILL_CHUNK, "positions")
        self.step_ptr = alloc(8, "step")  # decode graph inputs: int32 token, int32 position
        self.sampler = GpuSampler(rt, self.pool, cfg.vocab_size)
        self.step_host = rt.pinned(2, np.int32)
        # a step's result (the token; the candidates too when on: sampler.result_bytes of it are read)
        self.out_host = rt.pinned(1, RESULT_DTYPE)
        self.out_slots = [rt.pinned(1, RESULT_DTYPE) for _ in range(AHEAD_STEPS)]  # one per queued step
        self._candidates: TokenCandidates | None = None  # of the token the last step returned
        self.out_events = [rt.cuda.Event() for _ in range(AHEAD_STEPS)]
        self.logits_host = rt.pinned((1, cfg.vocab_size), np.float32)
        self.mask_host = rt.pinned(self.sampler.mask_words, np.uint32)  # the masked step's bitmask
        # speculative rounds: per-row masks and results of a verify pass, a draft model's tokens
        self.verify_masks_ptr = alloc(VERIFY_ROWS * self.sampler.mask_words * 4, "verify_masks")
        self.verify_out_ptr = alloc(VERIFY_ROWS * OUT_DTYPE.itemsize, "verify_out")
        self.verify_tokens_host = rt.pinned(VERIFY_ROWS, np.int32)
        self.verify_positions_host = rt.pinned(VERIFY_ROWS, np.int32)
        self.verify_masks_host = rt.pinned((VERIFY_ROWS, self.sampler.mask_words), np.uint32)
        self.verify_out_host = rt.pinned(VERIFY_ROWS, OUT_DTYPE)
        self.device_name = rt.device_name
        rt.resolve_all()
        rt.synchronize()

    def _expert_slots(self, g, moe_vram: int | None, progress) -> int:
        """Slots per layer for the expert cache, 0 for all experts resident. Without moe_vram,
        experts that do not fit in free VRAM (beside everything else) get the budget that fits."""
        from memra_engine.gpu.expert_cache import slot_layout, slots_for_budget
        from memra_engine.gpu.moe import check_routing

        cfg = self.config
        check_routing(cfg)
        dry = GpuWeights(g, cfg).upload(None, None, dry=True)
        parts, self._slot_bytes = slot_layout([(L.ffn_gate_up_exps, L.ffn_down_exps) for L in dry.layers])
        all_bytes = cfg.n_expert * sum(sum(p) for p in parts)
        if moe_vram is None:
            free, _ = self.rt.mem_info()
            others = (GpuWeights(g, cfg, experts_resident=False).nbytes() + sum(self._scratch_parts(g))
                      + GpuKvCache.bytes_needed(cfg.n_layer, cfg.n_kv_head, self.n_ctx, cfg.head_dim, self.kv_type))
            room = free - others - EXPERT_HEADROOM
            if all_bytes <= room:
                return 0
            moe_vram = max(room, 0)
            if progress:
                progress(f"the experts ({all_bytes / 2**30:.1f} GiB) do not fit in free VRAM: caching "
                         f"{moe_vram / 2**30:.1f} GiB of them (--moe-vram sets the budget)")
        if moe_vram >= all_bytes:
            return 0
        return slots_for_budget(moe_vram, cfg.n_layer, cfg.n_expert, cfg.n_expert_used, self._slot_bytes)

    def _ran(self, n_tokens: int, logged: int | None = None) -> None:
        """A forward of n_tokens finished and the host has synchronized: MoE bookkeeping."""
        self.tokens_run += n_tokens
        if self.experts is not None:
            self.experts.after_forward(n_tokens if logged is None else logged)

    def _scratch_parts(self, g) -> list[int]:
        """Run the forward dry (no launches) at the largest shapes and take each arena part's peak."""
        cfg = self.config
        dry_weights = GpuWeights(g, cfg).upload(None, None, dry=True)
        kv = GpuKvCache(None, cfg.n_layer, cfg.n_kv_head, self.n_ctx, cfg.head_dim, self.kv_type)
        arena = Arena.unbounded()
        ops = GpuOps(None, cfg, kv, arena, dry=True, cluster=self.rt.cluster_attention,
                     split_cap=self.attn_max_splits, max_shared=self.rt.max_shared,
                     k256_outputs=quant_ops.k256_model(g.tensors.values()))
        for T, last_only in ((min(PREFILL_CHUNK, self.n_ctx), True), (min(ALL_LOGITS_CHUNK, self.n_ctx), False)):
            ops.begin(self.splits_for(self.n_ctx), prefill_splits=self.prefill_splits_for(self.n_ctx))
            tokens = DArray(0, (T,), 1)
            self.forward(ops, dry_weights, cfg, tokens, tokens, last_only)
        return arena.part_sizes(SCRATCH_SLACK // Arena.PARTS)

    # ---- Backend protocol ------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        self._settle()
        ids = self._check(tokens)
        chunk = ALL_LOGITS_CHUNK if all_logits else PREFILL_CHUNK
        rows = []
        for a in range(0, len(ids), chunk):
            part = ids[a:a + chunk]
            last = a + chunk >= len(ids)
            if len(part) == 1 and not all_logits:
                rows.append(self.decode(int(part[0]))[None])
                continue
            logits = self._run_eager(part, last_only=not all_logits, want_logits=all_logits or last)
            if all_logits or last:
                rows.append(logits)
        return np.concatenate(rows) if all_logits else rows[-1][0]

    def decode(self, token: int) -> np.ndarray:
        self._settle()
        ids = self._check([token])
        if not self.use_graphs:
            return self._run_eager(ids, last_only=True, want_logits=True)[0]
        graph = self._graph(self.splits_for(self.n_past + 1), sample=False)
        self._write_step(int(ids[0]))
        graph.launch(self.rt)
        self.rt.cuda.memcpy_dtoh_async(self.logits_host, graph.logits_ptr, self.rt.stream)
        self.rt.synchronize()
        self.n_past += 1
        self._ran(1)
        return self.logits_host[0].copy()

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        """All rows in one forward: batched matvec columns and attention rows are computed as in
        one-token decode, so each row equals the decode of that token (tests/gpu/test_backend.py)."""
        self._settle()
        ids = self._check(tokens)
        if len(ids) > 16:
            return self.prefill(ids, all_logits=True)
        return self._run_eager(ids, last_only=False, want_logits=True)

    def truncate(self, n: int) -> None:
        self._settle()
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot truncate to {n}: the cache holds {self.n_past} tokens")
        self.n_past = n

    def memory_stats(self) -> VramStats:
        return self.pool.stats() if self.pool is not None else VramStats()

    def close(self) -> None:
        rt = getattr(self, "rt", None)
        if rt is None:
            return
        try:
            if rt.context is not None:
                rt.synchronize()
                self._ahead = []
        finally:
            for graph in self.graphs.values():
                graph.destroy()
            self.graphs.clear()
            self.experts = None  # its pinned host memory goes while the context is alive
            if self.pool is not None:
                self.pool.close()
                self.pool = None
            if self._owns_rt:
                rt.close()
            self.rt = None

    prefill_chunk = PREFILL_CHUNK
    samples_on_device = True

    def moe_stats(self) -> MoeStats | None:
        """Totals since load (the generation loop takes each reply's share)."""
        cfg = self.config
        if not cfg.is_moe:
            return None
        experts = cfg.n_layer * cfg.n_expert
        c = self.experts
        if c is None:  # every expert resident: each routed (token, expert) is a hit
            n = self.tokens_run * cfg.n_layer * cfg.n_expert_used
            return MoeStats(hits=n, total_hits=n, resident_experts=experts, total_experts=experts)
        p = c.policy
        return MoeStats(hits=p.hits, misses=p.misses, bytes_moved=c.bytes_moved, copy_seconds=c.copy_seconds,
                        resident_experts=p.resident, total_experts=experts,
                        slot_bytes=self.pool.region_size("experts"), total_hits=p.hits, total_misses=p.misses,
                        total_bytes_moved=c.bytes_moved, total_copy_seconds=c.copy_seconds)

    # ---- sampling on the device --------------------------------------------------------------
    def set_sampling(self, params: SamplingParams, seed: int | None = None, use_mask: bool = False) -> int:
        """Write the device parameter block (no recapture); returns the seed in use. use_mask: the
        sampler applies the bitmask (the masked step pair uploads it per step)."""
        self._settle()
        return self.sampler.set_params(params, seed, use_mask=use_mask)

    def begin_masked_step(self, token: int) -> np.ndarray:
        """Queue the forward of `token` at n_past (already queued when it is the token the last
        finish_masked_step returned) and return the pinned mask buffer for its sampling. The buffer
        is free: the last upload from it ran before the last sampler, which the host waited for."""
        ids = self._check([token])
        if self._forward_ahead != (self.n_past, int(ids[0])):
            self._settle()
            self._write_step(int(ids[0]))
            self._launch_forward(self.n_past)
        return self.mask_host

    def finish_masked_step(self, ahead: bool = True) -> tuple[int, float]:
        """Upload the mask, sample, queue the next forward (its token is written by the sampler on
        the device; not when ahead is False), then wait for this step's token."""
        rt = self.rt
        rt.upload_async(self.sampler.mask_ptr, self.mask_host)
        if self.use_graphs:
            self._sample_graph(self._queued_logits_ptr).launch(rt)
        else:
            self._launch_sampler(self._queued_logits_ptr)
        self._read_result(self.out_host)
        self.out_events[0].record(rt.stream)
        pos = self.n_past + 1
        ahead = ahead and self.run_ahead and pos < self.n_ctx
        if ahead:
            self._launch_forward(pos)
        self.out_events[0].synchronize()
        self.n_past = pos
        self._ran(1)
        token, logprob = int(self.out_host[0]["token"]), float(self.out_host[0]["logprob"])
        self._candidates = self.sampler.candidates(self.out_host, token)
        self._forward_ahead = (pos, token) if ahead else None
        return token, logprob

    def _launch_forward(self, pos: int) -> None:
        """Queue the forward of the token in the device step buffer, at position pos; its logits
        stay on the device for the sampler."""
        n_splits = self.splits_for(pos + 1)
        if self.use_graphs:
            graph = self._graph(n_splits, sample=False)
            graph.launch(self.rt)
            self._queued_logits_ptr = graph.logits_ptr
        else:
            logits = self._forward(1, self.step_ptr, self.step_ptr + 4, n_splits, last_only=True)
            self._queued_logits_ptr = logits.ptr

    def _launch_sampler(self, logits_ptr: int) -> None:
        self.sampler.launch(logits_ptr, self.history_ptr, self.step_ptr + 4,
                            token_io_ptr=self.step_ptr, pos_io_ptr=self.step_ptr + 4)

    def _sample_graph(self, logits_ptr: int) -> CudaGraph:
        """The sampler alone, on the logits a forward graph leaves at logits_ptr."""
        key = ("sample", logits_ptr, self.sampler.top_logprobs > 0)
        graph = self.graphs.get(key)
        if graph is None:
            graph = CudaGraph()
            self.rt.synchronize()
            with graph.capture(self.rt):
                self._launch_sampler(logits_ptr)
            self.graphs[key] = graph
        return graph

    def decode_sample(self, token: int, ahead: bool = True) -> tuple[int, float]:
        """Decode `token` at n_past and sample the next one on the device, in one graph launch.
        Returns (next token id, its logprob) with the semantics of memra_engine.sampling.sample.
        With ahead, steps that decode the returned token and its successor stay queued (see the
        module doc); without, nothing new is queued, so a verify next has no step to wait out."""
        ids = self._check([token])
        if not (self._ahead and self._ahead[0][0] == self.n_past and int(ids[0]) == self._fed):
            self._settle()
            self._write_step(int(ids[0]))
            self._queue_step(self.n_past)
        if ahead:
            self._fill_queue()
        _, slot = self._ahead.pop(0)
        self.out_events[slot].synchronize()
        self.n_past += 1
        self._ran(1)
        out = self.out_slots[slot][0]
        token_out, logprob = int(out["token"]), float(out["logprob"])
        self._candidates = self.sampler.candidates(self.out_slots[slot], token_out)  # before the slot is reused
        self._fed = token_out
        if ahead:
            self._fill_queue()
        return token_out, logprob

    # ---- speculative rounds ------------------------------------------------------------------
    def verify_sample(self, tokens: Sequence[int], masks: np.ndarray | None = None) -> list[tuple[int, float]]:
        """One graph: the forward of the round's tokens (rows computed as decode computes them,
        like verify) and the device sampler on each row, row i's penalty window ending at
        tokens[i] (the embed records the tokens in the device history) and its mask masks[i].
        Only the rows' (token, logprob) come back."""
        self._settle()
        ids = self._check(tokens)
        T, rt = len(ids), self.rt
        if T > VERIFY_ROWS:
            raise ValueError(f"a verify pass takes at most {VERIFY_ROWS} tokens, got {T}")
        self.verify_tokens_host[:T] = ids
        self.verify_positions_host[:T] = np.arange(self.n_past, self.n_past + T, dtype=np.int32)
        rt.upload_async(self.tokens_ptr, self.verify_tokens_host)
        rt.upload_async(self.positions_ptr, self.verify_positions_host)
        if masks is not None:
            self.verify_masks_host[:T] = masks
            rt.upload_async(self.verify_masks_ptr, self.verify_masks_host[:T])
        n_keys = self.n_past + T
        splits, prefill_splits = self.splits_for(n_keys), self.prefill_splits_for(n_keys)
        if self.use_graphs:
            key = ("verify", T, splits, prefill_splits)
            graph = self.graphs.get(key)
            if graph is None:
                graph = CudaGraph()
                rt.synchronize()
                with graph.capture(rt):
                    self._verify_launches(T, splits, prefill_splits)
                self.graphs[key] = graph
            graph.launch(rt)
        else:
            self._verify_launches(T, splits, prefill_splits)
        rt.cuda.memcpy_dtoh_async(self.verify_out_host, self.verify_out_ptr, rt.stream)
        rt.synchronize()
        self.n_past += T
        self._ran(T)
        return [(int(o["token"]), float(o["logprob"])) for o in self.verify_out_host[:T]]

    def _verify_launches(self, T: int, splits: int, prefill_splits: int) -> None:
        logits = self._forward(T, self.tokens_ptr, self.positions_ptr, splits, last_only=False,
                               prefill_splits=prefill_splits)
        self.sampler.launch_rows(logits.ptr, self.history_ptr, self.positions_ptr, self.verify_masks_ptr,
                                 self.verify_out_ptr, T)

    def draft_tokens(self, token: int, k: int) -> list[int]:
        """k decode+sample graph launches back to back (each writes the next step's token on the
        device) and one wait: a draft model's drafts with no host round trip between them."""
        self._settle()
        self._check([token] * k)
        if k > VERIFY_ROWS:
            raise ValueError(f"at most {VERIFY_ROWS} draft tokens a call, got {k}")
        rt = self.rt
        self._write_step(int(token))
        for i in range(k):
            self._graph(self.splits_for(self.n_past + i + 1), sample=True).launch(rt)
            rt.cuda.memcpy_dtoh_async(self.verify_out_host[i:i + 1], self.sampler.out_ptr, rt.stream)
        rt.synchronize()
        self.n_past += k
        self._ran(k, logged=1)  # the log holds the last of the k steps only
        return [int(t) for t in self.verify_out_host["token"][:k]]

    def _fill_queue(self) -> None:
        while self.run_ahead and 0 < len(self._ahead) < AHEAD_STEPS and self._ahead[-1][0] + 1 < self.n_ctx:
            self._queue_step(self._ahead[-1][0] + 1)  # its token: written by the step before, on the device

    def _queue_step(self, pos: int) -> None:
        """One decode+sample graph launch at position pos and the async readback of its result."""
        slot = next(i for i in range(AHEAD_STEPS) if all(s != i for _, s in self._ahead))
        graph = self._graph(self.splits_for(pos + 1), sample=True)
        graph.launch(self.rt)
        self._read_result(self.out_slots[slot])
        self.out_events[slot].record(self.rt.stream)
        self._ahead.append((pos, slot))

    def _settle(self) -> None:
        """Drop the queued steps: wait for them and rewind the Philox counter they advanced. A
        queued masked-path forward only wrote rows past n_past: wait for it (its step buffer
        upload must not be overwritten early)."""
        if self._ahead:
            self.sampler.rewind_counter(len(self._ahead))
            self._ahead = []
        if self._forward_ahead is not None:
            self.rt.synchronize()
            self._forward_ahead = None

    def sample_logits(self, logits: np.ndarray) -> tuple[int, float]:
        """Sample from host logits (the prefill's last row) with the device sampler."""
        self._settle()
        self._check([0])
        buf = self.ops.arena.alloc(logits.nbytes)  # arena is free between forwards
        self.rt.upload(buf, np.ascontiguousarray(logits, np.float32))
        self._write_step(0, pos=self.n_past - 1)
        self.sampler.launch(buf, self.history_ptr, self.step_ptr + 4)
        self._read_result(self.out_host)
        self.rt.synchronize()
        self.ops.arena.reset()
        token = int(self.out_host[0]["token"])
        self._candidates = self.sampler.candidates(self.out_host, token)
        return token, float(self.out_host[0]["logprob"])

    def step_candidates(self) -> TokenCandidates | None:
        """Why the token the last decode_sample / finish_masked_step / sample_logits returned was
        drawn (set_sampling's params.top_logprobs > 0), read back with it; None when off."""
        return self._candidates

    def _read_result(self, host: np.ndarray) -> None:
        """Queue the readback of the sampler's result into a pinned RESULT_DTYPE buffer: the token,
        and the candidates when they are on (a few hundred bytes more)."""
        self.rt.cuda.memcpy_dtoh_async(host.view(np.uint8)[:self.sampler.result_bytes], self.sampler.out_ptr,
                                       self.rt.stream)

    # ---- internals ---------------------------------------------------------------------------
    def _check(self, tokens) -> np.ndarray:
        return check_tokens(tokens, self.config.vocab_size, self.n_past, self.n_ctx)

    def _write_step(self, token: int, pos: int | None = None) -> None:
        self.step_host[0] = token
        self.step_host[1] = self.n_past if pos is None else pos
        self.rt.upload_async(self.step_ptr, self.step_host)

    def splits_for(self, n_keys: int) -> int:
        """The attention grid for rows of up to n_keys keys: a captured graph's key."""
        return attn_splits(kv_bucket(n_keys), self.config.head_dim, self.rt.cluster_attention, self.kv_type,
                           self.attn_max_splits)

    def prefill_splits_for(self, n_keys: int) -> int:
        """The split-path grid that prefill forwards take (GpuOps.begin)."""
        return attn_splits(kv_bucket(n_keys), self.config.head_dim, False, self.kv_type)

    def _forward(self, n_tokens: int, tokens_ptr: int, positions_ptr: int, n_splits: int, last_only: bool,
                 prefill_splits: int = 0) -> DArray:
        self.ops.begin(n_splits, self.history_ptr, prefill_splits)
        self.ops._positions_ptr = positions_ptr
        tokens = DArray(tokens_ptr, (n_tokens,), 1)
        positions = DArray(positions_ptr, (n_tokens,), 1)
        logits = self.forward(self.ops, self.weights, self.config, tokens, positions, last_only)
        self.ops.flush()
        return logits

    def _run_eager(self, ids: np.ndarray, last_only: bool, want_logits: bool) -> np.ndarray | None:
        T = len(ids)
        self.rt.upload(self.tokens_ptr, ids)
        self.rt.upload(self.positions_ptr, np.arange(self.n_past, self.n_past + T, dtype=np.int32))
        n_keys = self.n_past + T
        logits = self._forward(T, self.tokens_ptr, self.positions_ptr, self.splits_for(n_keys), last_only,
                               self.prefill_splits_for(n_keys))
        out = self.rt.download(logits.ptr, (logits.rows, self.config.vocab_size), np.float32) if want_logits else None
        self.rt.synchronize()
        self.n_past += T
        self._ran(T)
        return out

    def _graph(self, n_splits: int, sample: bool) -> CudaGraph:
        # contexts past ATTN_MAX_SPLITS chunks share one graph; candidates add launches
        key = (n_splits, sample, sample and self.sampler.top_logprobs > 0)
        graph = self.graphs.get(key)
        if graph is not None:
            return graph
        graph = CudaGraph()
        self.rt.synchronize()
        with graph.capture(self.rt):
            logits = self._forward(1, self.step_ptr, self.step_ptr + 4, n_splits, last_only=True)
            if sample:
                self.sampler.launch(logits.ptr, self.history_ptr, self.step_ptr + 4,
                                    token_io_ptr=self.step_ptr, pos_io_ptr=self.step_ptr + 4)
        graph.logits_ptr = logits.ptr
        self.graphs[key] = graph
        return graph

    # ---- memra-bench extras (engine/bench.py calls bench_extras(runs, depth)) -------------------------
    def graph_step_us(self, n: int = 128, params: SamplingParams | None = None) -> tuple[float, int]:
        """Device time per replayed decode+sample graph (events around n back-to-back replays, no
        host work in between) and the graph's node count. params: greedy unless given."""
        self._settle()
        self.set_sampling(params or SamplingParams(temperature=0.0), seed=0)
        n = min(n, self.n_ctx - self.n_past - 1)
        graph = self._graph(self.splits_for(self.n_past + n), sample=True)
        self._write_step(1)
        us = graph.replay_us(self.rt, replays=n, batches=1, warmup=False)  # each replay is a step
        self.n_past += n
        return us, graph.n_nodes

    def _decode_sample_s(self, steps: int, params: SamplingParams, prompt: Sequence[int] = (1,)) -> float:
        """Wall seconds per decode_sample call over `steps` tokens after `prompt`."""
        self.truncate(0)
        self.prefill(list(prompt))
        self.set_sampling(params, seed=0)
        token, t0 = 1, time.perf_counter()
        for _ in range(steps):
            token, _ = self.decode_sample(token)
        return (time.perf_counter() - t0) / steps

    def _graph_us(self, steps: int, params: SamplingParams | None = None, prompt: Sequence[int] = (1,)) -> tuple[float, int]:
        """graph_step_us over `steps` tokens after `prompt`: (device µs per replay, graph nodes)."""
        self.truncate(0)
        self.prefill(list(prompt))
        return self.graph_step_us(steps, params)

    def bench_extras(self, runs: int, depth: int) -> dict:
        """memra-bench's GPU figures, each the median of `runs` runs: graph replays (device time)
        and the engine path (decode_sample wall time) at greedy and default knobs, after `depth`
        tokens of context (graph, and the engine path at default knobs: what the app's pane shows
        after a long prompt), with 10 candidates per token, and the VRAM pool."""
        from statistics import median

        out: dict = {}
        steps = min(128, self.n_ctx - 2)
        greedy = [self._graph_us(steps) for _ in range(runs)]
        graph_us = median(us for us, _ in greedy)
        out["tg128_graph_tok_s"] = 1e6 / graph_us
        out["graph_kernels_per_token"] = greedy[0][1]
        if self.n_ctx >= depth + steps + 1:
            prompt = np.random.default_rng(0).integers(0, self.config.vocab_size, depth).tolist()
            out[f"tg128_graph_at_{depth}_tok_s"] = 1e6 / median(
                self._graph_us(steps, prompt=prompt)[0] for _ in range(runs))
            out[f"tg128_decode_sample_default_sampling_at_{depth}_tok_s"] = 1 / median(
                self._decode_sample_s(steps, SamplingParams(), prompt) for _ in range(runs))
        # the engine path: wall time per decode_sample call (what a user gets), against the
        # device time per replay for the host's share
        wall_s = median(self._decode_sample_s(steps, SamplingParams(temperature=0.0)) for _ in range(runs))
        out["tg128_decode_sample_tok_s"] = 1 / wall_s
        out["outside_graph_share"] = max(0.0, 1.0 - graph_us * 1e-6 / wall_s)
        # the engine's default knobs (temperature, top_k 40, top_p, min_p): the filtered sampler
        out["tg128_graph_default_sampling_tok_s"] = 1e6 / median(self._graph_us(steps, SamplingParams())[0] for _ in range(runs))
        out["tg128_decode_sample_default_sampling_tok_s"] = 1 / median(
            self._decode_sample_s(steps, SamplingParams()) for _ in range(runs))
        # the token inspector's cost: default knobs with 10 candidates per token, against without,
        # interleaved runs (issue 18: at most 3% of decode_sample)
        with_cand = SamplingParams(top_logprobs=10)
        graph_on, wall = [], {0: [], 10: []}
        for _ in range(runs):
            graph_on.append(self._graph_us(steps, with_cand)[0])
            for params in (SamplingParams(), with_cand):
                wall[params.top_logprobs].append(self._decode_sample_s(steps, params))
        out["tg128_graph_top_logprobs10_tok_s"] = 1e6 / median(graph_on)
        off, on = median(wall[0]), median(wall[10])
        out["tg128_decode_sample_top_logprobs10_tok_s"] = 1 / on
        out["top_logprobs10_cost"] = round(1 - off / on, 4)
        stats = self.memory_stats()
        out["vram_used_mib"] = round(sum(stats.used.values()) / MIB, 1)
        out["vram_reserved_mib"] = round(sum(stats.reserved.values()) / MIB, 1)
        # per pool region (weights, KV cache, scratch, expert slots, ...), as the VRAM pane shows them
        out["vram_regions_mib"] = {region: {"used": round(stats.used.get(region, 0) / MIB, 1),
                                            "reserved": round(n / MIB, 1)} for region, n in stats.reserved.items()}
        self.truncate(0)
        return out
