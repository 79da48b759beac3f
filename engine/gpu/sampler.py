"""The device sampler (cuda/sampling.cu): penalties, bitmask, greedy / Gumbel-max / filtered draw.

All its knobs live in a device parameter block (PARAMS_DTYPE mirrors `struct SampleParams`), so a
new temperature or seed is one small host-to-device copy, not a recapture. The Philox counter in
that block advances on the device once per sampled token.

Launch order (all on rt.stream, graph-capturable): sample_penalize, sample_stage1, sample_finish.

Filtered draws (any of top_k / top_p / min_p on): stage 1 leaves each 4096-token block's best
local_k logits sorted; sample_finish merges those runs (all of them with top_k off, the best
top_k with it on) and cuts top_p / min_p / the draw with block-wide scans. Exact against
engine/sampling.py as long as no block holds more than local_k of the kept tokens; a wider
nucleus is cut to the candidates (docs/gpu-engine.md, "The sampler").
"""
from __future__ import annotations

import os

import numpy as np

from memra_engine.sampling import SamplingParams

PARAMS_DTYPE = np.dtype([
    ("temperature", "<f4"), ("top_k", "<i4"), ("top_p", "<f4"), ("min_p", "<f4"),
    ("repeat_penalty", "<f4"), ("presence_penalty", "<f4"), ("frequency_penalty", "<f4"),
    ("repeat_last_n", "<i4"), ("seed_lo", "<u4"), ("seed_hi", "<u4"), ("counter", "<u4"),
    ("use_mask", "<i4"),
])
OUT_DTYPE = np.dtype([("token", "<i4"), ("logprob", "<f4")])
STAGE1_CHUNK = 4096      # S1_CHUNK in sampling.cu
STAGE2_MAX_CANDIDATES = 8192
LOCAL_K_MAX = 128


def local_k_for(vocab: int) -> int:
    """Candidates kept per stage-1 block: 128, fewer when the vocabulary has > 64 blocks.

    A power of two with n_blocks * k <= STAGE2_MAX_CANDIDATES, so the runs padded to a power-of-
    two count (what sample_finish merges) fit too: next_pow2(n_blocks) * k <= STAGE2_MAX_CANDIDATES.
    """
    n_blocks = -(-vocab // STAGE1_CHUNK)
    k = LOCAL_K_MAX
    while k * n_blocks > STAGE2_MAX_CANDIDATES:
        k //= 2
    assert k >= 1 and (1 << (n_blocks - 1).bit_length()) * k <= STAGE2_MAX_CANDIDATES, vocab
    return k


def params_record(p: SamplingParams, seed: int, use_mask: bool = False, counter: int = 0) -> np.ndarray:
    rec = np.zeros(1, PARAMS_DTYPE)
    rec["temperature"], rec["top_k"], rec["top_p"], rec["min_p"] = p.temperature, p.top_k, p.top_p, p.min_p
    rec["repeat_penalty"], rec["presence_penalty"] = p.repeat_penalty, p.presence_penalty
    rec["frequency_penalty"], rec["repeat_last_n"] = p.frequency_penalty, p.repeat_last_n
    rec["seed_lo"], rec["seed_hi"] = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    rec["counter"], rec["use_mask"] = counter, int(use_mask)
    return rec


class GpuSampler:
    """Device buffers of the sampler, allocated from the pool's graph region."""

    @staticmethod
    def nbytes(vocab: int) -> int:
        n_blocks = -(-vocab // STAGE1_CHUNK)
        k = local_k_for(vocab)
        return 4 * 256 + n_blocks * 8 * 4 + 2 * n_blocks * k * 4 + (-(-vocab // 32)) * 4 + 6 * 256

    def __init__(self, rt, pool, vocab: int):
        self.rt, self.vocab = rt, vocab
        self.n_blocks = -(-vocab // STAGE1_CHUNK)
        self.local_k = local_k_for(vocab)
        alloc = lambda n, name: pool.alloc("graph", n, name).ptr  # noqa: E731
        self.params_ptr = alloc(PARAMS_DTYPE.itemsize, "sample_params")
        self.out_ptr = alloc(OUT_DTYPE.itemsize, "sample_out")
        self.part_ptr = alloc(self.n_blocks * 8 * 4, "sample_part")
        self.cand_v = alloc(self.n_blocks * self.local_k * 4, "sample_cand_v")
        self.cand_i = alloc(self.n_blocks * self.local_k * 4, "sample_cand_i")
        self.mask_words = -(-vocab // 32)
        self.mask_ptr = alloc(self.mask_words * 4, "token_mask")
        rt.memset_u32(self.mask_ptr, 0xFFFFFFFF, self.mask_words)
        rt.set_max_dynamic_shared("sample_finish", self.finish_shared)
        self._params_host = rt.pinned(1, PARAMS_DTYPE)  # one staging buffer: copies stay ordered
        self.set_params(SamplingParams(temperature=0.0))

    @property
    def finish_shared(self) -> int:
        return STAGE2_MAX_CANDIDATES * 8

    def set_params(self, p: SamplingParams, seed: int | None = None, use_mask: bool = False) -> int:
        """Write the parameter block (counter reset to 0). Returns the seed used."""
        if seed is None:
            seed = p.seed if p.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self.rt.synchronize()  # the previous copy out of the staging buffer has finished
        self._params_host[:] = params_record(p, seed, use_mask)
        self.rt.upload_async(self.params_ptr, self._params_host)
        return seed

    def rewind_counter(self, steps: int) -> None:
        """Undo `steps` sampled tokens' Philox counter advance (steps queued ahead that nobody
        asked for; see CudaBackend.decode_sample). Waits for the stream."""
        off = PARAMS_DTYPE.fields["counter"][1]
        counter = self.rt.download(self.params_ptr + off, (1,), np.uint32)
        self.rt.upload(self.params_ptr + off, counter - np.uint32(steps))

    def set_mask(self, allowed: np.ndarray | None) -> None:
        """allowed: bool [vocab] or packed uint32 words (bit i of word w = token 32w + i); None = all."""
        if allowed is None:
            self.rt.memset_u32(self.mask_ptr, 0xFFFFFFFF, self.mask_words)
            return
        if allowed.dtype == np.bool_:
            bits = np.packbits(allowed.astype(np.uint8), bitorder="little")
            words = np.zeros(self.mask_words * 4, np.uint8)
            words[: bits.size] = bits
            allowed = words.view(np.uint32)
        self.rt.upload(self.mask_ptr, np.ascontiguousarray(allowed, dtype=np.uint32))

    def launch(self, logits_ptr: int, history_ptr: int, pos_ptr: int, token_io_ptr: int = 0, pos_io_ptr: int = 0,
               mask_ptr: int | None = None, out_ptr: int | None = None) -> None:
        """Sample from logits (penalised in place). pos_ptr: device int, the position of the last
        token in the history (penalty window ends there). token_io/pos_io: the decode graph's
        step state, updated for the next step (0: leave alone). mask_ptr / out_ptr: another
        bitmask and result slot than the sampler's own (a verify pass has one per row)."""
        rt = self.rt
        mask_ptr = self.mask_ptr if mask_ptr is None else mask_ptr
        out_ptr = self.out_ptr if out_ptr is None else out_ptr
        rt.launch("sample_penalize", 1, 256, (logits_ptr, self.params_ptr, history_ptr, pos_ptr, self.vocab))
        rt.launch("sample_stage1", self.n_blocks, 1024,
                  (logits_ptr, mask_ptr, self.params_ptr, self.part_ptr, self.cand_v, self.cand_i,
                   self.vocab, self.local_k))
        rt.launch("sample_finish", 1, 1024,
                  (logits_ptr, self.params_ptr, self.part_ptr, self.cand_v, self.cand_i, self.n_blocks,
                   self.local_k, self.vocab, token_io_ptr, pos_io_ptr, out_ptr), shared=self.finish_shared)
