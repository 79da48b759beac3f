"""The device sampler (cuda/sampling.cu): penalties, bitmask, greedy / Gumbel-max / filtered draw.

All its knobs live in a device parameter block (PARAMS_DTYPE mirrors `struct SampleParams`), so a
new temperature or seed is one small host-to-device copy, not a recapture. The Philox counter in
that block advances on the device once per sampled token.

Launch order (all on rt.stream, graph-capturable): sample_penalize, sample_stage1, sample_finish.
With candidates on (SamplingParams.top_logprobs > 0, the sampling workbench) the raw logits are
copied and passed through stage 1 first, sample_finish records its cuts and its sorted list's
best, a stage-1 pass over the penalised logits runs for plain temperature draws, and
sample_candidates fills a CAND_DTYPE record next to the token: the host reads it with the token
(candidates_from_record). A pass a knob set does not need returns at once (candidate_passes).

Filtered draws (any of top_k / top_p / min_p on): stage 1 leaves each block's (1024 to 4096
tokens, stage1_chunk) best local_k logits sorted; sample_finish merges those runs (all of them with top_k off, the best
top_k with it on) and cuts top_p / min_p / the draw with block-wide scans. Exact against
engine/sampling.py as long as no block holds more than local_k of the kept tokens; a wider
nucleus is cut to the candidates (docs/gpu-engine.md, "The sampler").
"""
from __future__ import annotations

import os

import numpy as np

from memra_engine.candidates import KEPT, Candidate, TokenCandidates
from memra_engine.sampling import SamplingParams

PARAMS_DTYPE = np.dtype([
    ("temperature", "<f4"), ("top_k", "<i4"), ("top_p", "<f4"), ("min_p", "<f4"),
    ("repeat_penalty", "<f4"), ("presence_penalty", "<f4"), ("frequency_penalty", "<f4"),
    ("repeat_last_n", "<i4"), ("seed_lo", "<u4"), ("seed_hi", "<u4"), ("counter", "<u4"),
    ("use_mask", "<i4"), ("top_logprobs", "<i4"), ("skip", "<i4"), ("cand_reuse", "<i4"),
])
MAX_ROWS = 16  # most rows one launch_rows samples (a verify pass: backend.VERIFY_ROWS)
OUT_DTYPE = np.dtype([("token", "<i4"), ("logprob", "<f4")])
CAND_MAX, CAND_RUN, CAND_MAX_RUNS = 20, 32, 128  # in sampling.cu
CAND_DTYPE = np.dtype([  # struct SampleCandidates
    ("mode", "<i4"), ("c0", "<f4"), ("log_z", "<f4"), ("kept", "<i4"), ("cut_v", "<f4", 3), ("cut_i", "<i4", 3),
    ("n", "<i4"), ("rank", "<i4"), ("model_max", "<f4"), ("model_z", "<f4"),
    ("model_id", "<i4", CAND_MAX), ("model_logit", "<f4", CAND_MAX), ("model_final", "<f4", CAND_MAX),
    ("final_id", "<i4", CAND_MAX), ("final_logit", "<f4", CAND_MAX), ("final_raw", "<f4", CAND_MAX),
])
SORT_BEST = SamplingParams(temperature=1.0, top_k=CAND_RUN)  # a stage-1 pass that keeps each block's best
RESULT_DTYPE = np.dtype([("token", "<i4"), ("logprob", "<f4"), ("cand", CAND_DTYPE)])  # one step's readback
MODE_GREEDY, MODE_PLAIN, MODE_FILTERED, MODE_NONE = range(4)
STAGE1_CHUNKS = (1024, 2048, 4096)  # sample_stage1's block: chunk / 4 threads, <= S1_CHUNK_MAX
STAGE2_MAX_CANDIDATES = 8192
LOCAL_K_MAX = 128


def stage1_chunk(vocab: int) -> int:
    """Logits per stage-1 block: the smallest chunk that leaves at most 64 blocks, the most whose
    padded runs of LOCAL_K_MAX fit sample_finish (64 * 128 = 8192). Small blocks spread the pass
    over more SMs (49,152 tokens: 48 blocks of 256 threads, not 12 of 1024) and keep more
    candidates per token, so a block is never less exact than a larger one."""
    for chunk in STAGE1_CHUNKS:
        if -(-vocab // chunk) * LOCAL_K_MAX <= STAGE2_MAX_CANDIDATES:
            return chunk
    return STAGE1_CHUNKS[-1]


def stage1_blocks(vocab: int) -> int:
    return -(-vocab // stage1_chunk(vocab))


def local_k_for(vocab: int) -> int:
    """Candidates kept per stage-1 block: 128, fewer when the vocabulary has > 64 blocks of 4096.

    A power of two with n_blocks * k <= STAGE2_MAX_CANDIDATES, so the runs padded to a power-of-
    two count (what sample_finish merges) fit too: next_pow2(n_blocks) * k <= STAGE2_MAX_CANDIDATES.
    """
    n_blocks = stage1_blocks(vocab)
    k = LOCAL_K_MAX
    while k * n_blocks > STAGE2_MAX_CANDIDATES:
        k //= 2
    assert k >= 1 and (1 << (n_blocks - 1).bit_length()) * k <= STAGE2_MAX_CANDIDATES, vocab
    return k


def params_record(p: SamplingParams, seed: int, use_mask: bool = False, counter: int = 0, skip: bool = False,
                  cand_reuse: bool = False) -> np.ndarray:
    rec = np.zeros(1, PARAMS_DTYPE)
    rec["temperature"], rec["top_k"], rec["top_p"], rec["min_p"] = p.temperature, p.top_k, p.top_p, p.min_p
    rec["repeat_penalty"], rec["presence_penalty"] = p.repeat_penalty, p.presence_penalty
    rec["frequency_penalty"], rec["repeat_last_n"] = p.frequency_penalty, p.repeat_last_n
    rec["seed_lo"], rec["seed_hi"] = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    rec["counter"], rec["use_mask"], rec["top_logprobs"] = counter, int(use_mask), p.top_logprobs
    rec["skip"], rec["cand_reuse"] = int(skip), int(cand_reuse)
    return rec


def candidate_passes(p: SamplingParams, vocab: int, use_mask: bool) -> tuple[bool, bool]:
    """Which stage-1 passes the candidates need (sampling.cu): (raw, penalised). The raw pass is
    not needed when the raw logits are the penalised ones (no penalty, no mask) and sample_finish's
    sorted list holds the best n (a filtered draw, top_k off or >= n); the penalised pass only for
    plain temperature draws (greedy and filtered ones get theirs from sample_finish)."""
    k_on = 0 < p.top_k < vocab
    filtered = p.temperature > 0 and (k_on or p.top_p < 1.0 or p.min_p > 0.0)
    penalties = p.repeat_last_n != 0 and (p.repeat_penalty != 1.0 or p.presence_penalty != 0.0
                                          or p.frequency_penalty != 0.0)  # as sample_penalize
    reuse = filtered and not penalties and not use_mask and (not k_on or p.top_k >= min(p.top_logprobs, CAND_MAX))
    return not reuse, p.temperature > 0 and not filtered


def candidates_from_record(rec: np.void, params: SamplingParams, token: int, vocab: int) -> TokenCandidates:
    """engine/candidates.py's TokenCandidates from the device record of the step that drew `token`
    (the same stages: a masked token is -inf after the mask, the cuts are (value, index) bounds
    in the sorted order, so a token passes a stage when it sorts no later than its cut)."""
    c = rec["cand"]
    n, mode = int(c["n"]), int(c["mode"])
    temp = params.temperature if params.temperature > 0 else 1.0
    cuts = [(float(v), int(i)) for v, i in zip(c["cut_v"], c["cut_i"])]

    def final_prob(v: float) -> float:
        return float(np.exp((np.float64(v) - c["c0"]) / temp - c["log_z"]))

    def removed(i: int, v: float) -> str:
        if not np.isfinite(v):
            return "grammar"
        if mode == MODE_GREEDY:
            return KEPT if i == token else "greedy"
        if mode == MODE_FILTERED:
            for stage, (cv, ci) in zip(("top_k", "top_p", "min_p"), cuts):
                if not (v > cv or (v == cv and i <= ci)):
                    return stage
        return KEPT

    def candidate(i: int, raw: float, v: float) -> Candidate:
        why = removed(i, v)
        prob = 0.0 if why != KEPT else (1.0 if mode == MODE_GREEDY else final_prob(v))
        return Candidate(i, float(np.exp(np.float64(raw) - c["model_max"]) / c["model_z"]), prob, why)

    model = [candidate(int(i), raw, v) for i, raw, v in zip(c["model_id"][:n], c["model_logit"][:n],
                                                             c["model_final"][:n]) if i < vocab]
    # the final distribution's best: greedy, the argmax alone (the penalised list's first)
    count = {MODE_GREEDY: 1, MODE_PLAIN: n, MODE_FILTERED: min(n, int(c["kept"]))}.get(mode, 0)
    finals = [candidate(int(i), raw, v) for i, raw, v in zip(c["final_id"][:count], c["final_raw"][:count],
                                                              c["final_logit"][:count]) if i < vocab and np.isfinite(v)]
    return TokenCandidates(tuple(model), tuple(finals), int(c["rank"]))


class GpuSampler:
    """Device buffers of the sampler, allocated from the pool's graph region."""

    @staticmethod
    def nbytes(vocab: int) -> int:
        n_blocks = stage1_blocks(vocab)
        k = local_k_for(vocab)
        # the raw copy, its partials, four runs buffers, two parameter blocks: 7 allocations
        candidates = 4 * vocab + n_blocks * 8 * 4 + 4 * n_blocks * CAND_RUN * 4 + 2 * PARAMS_DTYPE.itemsize
        return (4 * 256 + MAX_ROWS * (n_blocks * 8 * 4 + 2 * n_blocks * k * 4) + (-(-vocab // 32)) * 4 + 6 * 256
                + RESULT_DTYPE.itemsize + candidates + 7 * 256)

    def __init__(self, rt, pool, vocab: int):
        self.rt, self.vocab = rt, vocab
        self.n_blocks, self.stage1_threads = stage1_blocks(vocab), stage1_chunk(vocab) // 4
        self.local_k = local_k_for(vocab)
        alloc = lambda n, name: pool.alloc("graph", n, name).ptr  # noqa: E731
        self.params_ptr = alloc(PARAMS_DTYPE.itemsize, "sample_params")
        self.out_ptr = alloc(RESULT_DTYPE.itemsize, "sample_out")  # the token, then the candidates
        # stage 1's partials and runs, a set per row (launch_rows; a decode step uses the first)
        self.part_ptr = alloc(MAX_ROWS * self.n_blocks * 8 * 4, "sample_part")
        self.cand_v = alloc(MAX_ROWS * self.n_blocks * self.local_k * 4, "sample_cand_v")
        self.cand_i = alloc(MAX_ROWS * self.n_blocks * self.local_k * 4, "sample_cand_i")
        self.mask_words = -(-vocab // 32)
        self.mask_ptr = alloc(self.mask_words * 4, "token_mask")
        rt.memset_u32(self.mask_ptr, 0xFFFFFFFF, self.mask_words)
        # candidates: a copy of the raw logits and two stage-1 passes' outputs (raw, penalised)
        self.raw_ptr = alloc(4 * vocab, "cand_raw")
        self.cand_part = alloc(self.n_blocks * 8 * 4, "cand_part")
        runs = self.n_blocks * CAND_RUN * 4
        self.model_v, self.model_i = alloc(runs, "cand_model_v"), alloc(runs, "cand_model_i")
        self.final_v, self.final_i = alloc(runs, "cand_final_v"), alloc(runs, "cand_final_i")
        # their stage-1 knobs: T = 1, top_k = CAND_RUN, nothing else; the penalised pass sorts only
        # for plain temperature draws (set_params), the others' best come from sample_finish
        assert self.n_blocks <= CAND_MAX_RUNS, vocab
        self.cand_params_ptr = alloc(2 * PARAMS_DTYPE.itemsize, "cand_params")  # the raw pass's, the penalised one's
        self.final_params_ptr = self.cand_params_ptr + PARAMS_DTYPE.itemsize
        self._cand_params_host = rt.pinned(2, PARAMS_DTYPE)  # set_params writes both
        self.top_logprobs = 0
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
        raw_pass, penalised_pass = candidate_passes(p, self.vocab, use_mask)
        self._params_host[:] = params_record(p, seed, use_mask, cand_reuse=not raw_pass)
        self.rt.upload_async(self.params_ptr, self._params_host)
        self._cand_params_host[0] = params_record(SORT_BEST, seed=0, skip=not raw_pass)[0]
        self._cand_params_host[1] = params_record(SORT_BEST, seed=0, skip=not penalised_pass)[0]
        self.rt.upload_async(self.cand_params_ptr, self._cand_params_host)  # the two blocks lie side by side
        self.params, self.top_logprobs = p, p.top_logprobs
        return seed

    @property
    def result_bytes(self) -> int:
        """Bytes of sample_out a step reads back: the token, and the candidates when on."""
        return RESULT_DTYPE.itemsize if self.top_logprobs else OUT_DTYPE.itemsize

    def candidates(self, result: np.ndarray, token: int) -> TokenCandidates | None:
        """The candidates in a step's readback (RESULT_DTYPE), None when off."""
        return candidates_from_record(result[0], self.params, token, self.vocab) if self.top_logprobs else None

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
        # candidates only into the sampler's own result (a verify row's slot has room for the token)
        cand = self.top_logprobs > 0 and out_ptr is None
        out_ptr = self.out_ptr if out_ptr is None else out_ptr
        if cand:
            rt.copy_async(self.raw_ptr, logits_ptr, 4 * self.vocab)
            self._stage1(self.raw_ptr, self.cand_params_ptr, self.cand_part, self.model_v, self.model_i, CAND_RUN)
        rt.launch("sample_penalize", 1, 256, (logits_ptr, self.params_ptr, history_ptr, pos_ptr, self.vocab))
        self._stage1(logits_ptr, self.params_ptr, self.part_ptr, self.cand_v, self.cand_i, self.local_k, mask_ptr)
        cuts_ptr = out_ptr + OUT_DTYPE.itemsize if cand else 0
        rt.launch("sample_finish", 1, 1024,
                  (logits_ptr, self.params_ptr, self.part_ptr, self.cand_v, self.cand_i, self.n_blocks,
                   self.local_k, self.vocab, token_io_ptr, pos_io_ptr, out_ptr, cuts_ptr), shared=self.finish_shared)
        if cand:
            # the penalised logits' best: the masked ones were written -inf in place by stage 1
            self._stage1(logits_ptr, self.final_params_ptr, self.part_ptr, self.final_v, self.final_i, CAND_RUN)
            rt.launch("sample_candidates", 1, 1024,
                      (self.raw_ptr, logits_ptr, self.params_ptr, self.cand_part, self.model_v, self.model_i,
                       self.final_v, self.final_i, self.part_ptr, self.n_blocks, self.vocab, out_ptr, cuts_ptr))

    def launch_rows(self, logits_ptr: int, history_ptr: int, pos_ptr: int, mask_ptr: int, out_ptr: int,
                    rows: int) -> None:
        """Sample `rows` rows of logits (a verify pass), each as launch() would with its own
        logits row, penalty window ending at pos[r], mask row and result slot out[r], drawn at
        Philox counter + r; then the counter moves past them. One launch of each kernel for all
        rows instead of three a row."""
        if not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"the sampler takes 1..{MAX_ROWS} rows a launch, got {rows}")
        rt = self.rt
        rt.launch("sample_penalize", (1, rows), 256, (logits_ptr, self.params_ptr, history_ptr, pos_ptr, self.vocab))
        self._stage1(logits_ptr, self.params_ptr, self.part_ptr, self.cand_v, self.cand_i, self.local_k, mask_ptr,
                     rows=rows)
        rt.launch("sample_finish", (1, rows), 1024,
                  (logits_ptr, self.params_ptr, self.part_ptr, self.cand_v, self.cand_i, self.n_blocks,
                   self.local_k, self.vocab, 0, 0, out_ptr, 0), shared=self.finish_shared)
        if rows > 1:
            rt.launch("sample_advance", 1, 32, (self.params_ptr, rows))

    def _stage1(self, logits_ptr: int, params_ptr: int, part_ptr: int, v_ptr: int, i_ptr: int, k: int,
                mask_ptr: int | None = None, rows: int = 1) -> None:
        self.rt.launch("sample_stage1", (self.n_blocks, rows), self.stage1_threads,
                       (logits_ptr, self.mask_ptr if mask_ptr is None else mask_ptr, params_ptr, part_ptr,
                        v_ptr, i_ptr, self.vocab, k))
