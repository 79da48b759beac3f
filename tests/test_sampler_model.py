"""A numpy model of the device sampler's filtered path (cuda/sampling.cu), checked on the CPU.

The model follows the kernels step by step: stage 1's per-warp register bitonic sort
(`warp_sort128`, lanes as numpy columns) and merge rounds (`merge_round`: stable rank merge with
a keep-the-best-`cap` cut) leave each 4096-token block's best local_k sorted; stage 2 pads the
runs to a power of two and merges them (fully with top_k off, the best top_k with it on);
`filtered_draw` cuts prefixes by top_k, a running sum for top_p and a count for min_p. These tests
prove the algorithm (the sorts are exact, the kept set is the CPU reference's) before any device
run; tests/gpu/test_sampling_gpu.py checks the kernels themselves against the CPU reference.
"""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.gpu.sampler import STAGE1_CHUNK, STAGE2_MAX_CANDIDATES, local_k_for
from memra_engine.sampling import SamplingParams, filtered_candidates, final_distribution

RUN = 128
PAD = 0x7FFFFFFF


def before(va, ia, vb, ib):
    """The kernels' total order: larger value first, then lower index."""
    return (va > vb) | ((va == vb) & (ia < ib))


def warp_sort128(v, ix):
    """v, ix: [4, 32 * n_warps] (register r of lane l of warp w = position l * 4 + r of warp w's
    run), each warp's 128 sorted best first in place."""
    col = np.arange(v.shape[1])
    lane = col & 31
    k = 2
    while k <= RUN:
        j = k >> 1
        while j > 0:
            for r in range(4):
                i = lane * 4 + r
                up = (i & k) == 0
                if j < 4:
                    ro = r ^ j
                    if ro > r:
                        swap = np.where(up, before(v[ro], ix[ro], v[r], ix[r]), before(v[r], ix[r], v[ro], ix[ro]))
                        v[r], v[ro] = np.where(swap, v[ro], v[r]), np.where(swap, v[r], v[ro])
                        ix[r], ix[ro] = np.where(swap, ix[ro], ix[r]), np.where(swap, ix[r], ix[ro])
                else:
                    ov, oi = v[r][col ^ (j >> 2)], ix[r][col ^ (j >> 2)]  # __shfl_xor_sync in the warp
                    wants_better = ((i & j) == 0) == up
                    take = np.where(wants_better, before(ov, oi, v[r], ix[r]), before(v[r], ix[r], ov, oi))
                    v[r], ix[r] = np.where(take, ov, v[r]), np.where(take, oi, ix[r])
            j >>= 1
        k <<= 1


def warp_run(v, ix, w):
    """Warp w's run in position order (position lane * 4 + r)."""
    return v[:, w * 32:(w + 1) * 32].T.ravel(), ix[:, w * 32:(w + 1) * 32].T.ravel()


def merge_round(v, ix, n_runs, L, cap):
    """Run pairs (2q, 2q+1) of length L -> run q of length min(2L, cap) at q * Lo, in place."""
    Lo = min(2 * L, cap)
    n = n_runs * L
    e = np.arange(n)
    xv, xi = v[:n].copy(), ix[:n].copy()
    other = ((e // L) ^ 1) * L
    odd = other < e
    active = e % L < Lo  # the kernel skips the search for places that cannot make the cut
    cnt = np.zeros(n, np.int64)
    step = 1 << (L.bit_length() - 1)
    while step > 0:
        ok = active & (cnt + step <= L)
        b = np.where(ok, other + cnt + step - 1, 0)
        vb = v[b]  # as the kernel: the index decides only on equal values
        first = (vb > xv) | ((vb == xv) & np.where(odd, ix[b] <= xi, ix[b] < xi))
        cnt += np.where(ok & first, step, 0)
        step >>= 1
    pos = e - (e // L) * L + cnt
    keep = active & (pos < Lo)
    dst = (e // L >> 1) * Lo + pos
    assert len(set(dst[keep].tolist())) == keep.sum(), "two elements written to one place"
    v[dst[keep]], ix[dst[keep]] = xv[keep], xi[keep]


def stage1(logits, local_k, top_k=0):
    """Per block: its best local_k (value, index) pairs sorted best first, as the kernel leaves
    them; top_k on (< local_k): the best top_k, then empty places."""
    vocab = logits.shape[0]
    n_blocks = -(-vocab // STAGE1_CHUNK)
    # thread t of block b holds token b * 4096 + t + r * 1024 in register r; warp w = threads 32w..
    tok = (np.arange(n_blocks)[:, None] * STAGE1_CHUNK + np.arange(1024)[None, :]).ravel()
    tok = tok[None, :] + 1024 * np.arange(4)[:, None]  # [4, n_blocks * 1024]
    lv = np.where(tok < vocab, logits[np.minimum(tok, vocab - 1)], -np.inf).astype(np.float32)
    li = np.where(tok < vocab, tok, PAD)
    warp_sort128(lv, li)
    cand_v = np.empty(n_blocks * local_k, np.float32)
    cand_i = np.empty(n_blocks * local_k, np.int64)
    for blk in range(n_blocks):
        cols = slice(blk * 1024, (blk + 1) * 1024)
        # sv[warp * RUN + lane * 4 + r] = register r of that lane
        sv = lv[:, cols].reshape(4, 32, 32).transpose(1, 2, 0).ravel().copy()
        si = li[:, cols].reshape(4, 32, 32).transpose(1, 2, 0).ravel().copy()
        cap = top_k if 0 < top_k < local_k else local_k
        L, runs = RUN, STAGE1_CHUNK // RUN
        while runs > 1:
            merge_round(sv, si, runs, L, cap)
            L, runs = min(2 * L, cap), runs >> 1
        sv[cap:local_k], si[cap:local_k] = -np.inf, PAD
        cand_v[blk * local_k: (blk + 1) * local_k] = sv[:local_k]
        cand_i[blk * local_k: (blk + 1) * local_k] = si[:local_k]
    return cand_v, cand_i


def stage2_sorted(cand_v, cand_i, n_blocks, local_k, cap_top_k):
    n_runs = 1 << (n_blocks - 1).bit_length()
    n_all = n_runs * local_k
    assert n_all <= STAGE2_MAX_CANDIDATES
    cv = np.full(n_all, -np.inf, np.float32)
    ci = np.full(n_all, PAD, np.int64)
    cv[: cand_v.size], ci[: cand_i.size] = cand_v, cand_i
    cap = min(cap_top_k, n_all) if cap_top_k else n_all
    L, runs = local_k, n_runs
    while runs > 1:
        merge_round(cv, ci, runs, L, cap)
        L, runs = min(2 * L, cap), runs >> 1
    n = min(L, cap)
    return cv[:n], ci[:n]


NONE = 0x7FFFFFFF  # the kernel's "no place found" for a block min


def filtered_kept(cv, ci, p: SamplingParams, vocab, Z1, M, threads=1024):
    """filtered_draw's cuts on the sorted candidates, written as the kernel does them (thread t
    owns places [t * per, (t + 1) * per), exclusive scan of the per-thread sums in double, block
    min of the first crossing): (kept ids, kept logits)."""
    n = cv.size
    per = -(-n // threads)
    k_on = 0 < p.top_k < vocab
    kept = int(np.sum(cv > -np.inf))  # __syncthreads_count
    if k_on:
        kept = min(kept, p.top_k)
    c0 = cv[0]
    if kept == 0:
        return ci[:1], cv[:1]
    if p.top_p < 1.0 and kept > 1:
        w = np.where(np.arange(n) < kept, np.exp(cv - c0), 0).astype(np.float32)  # expf
        w = np.pad(w, (0, per * threads - n)).reshape(threads, per).astype(np.float64)
        sums = w.sum(axis=1)
        excl = np.concatenate([[0.0], np.cumsum(sums)[:-1]])  # block_excl_scan
        total = sums.sum()
        cum = excl[:, None] + np.cumsum(w, axis=1)
        target = float(np.float32(p.top_p)) * (total if k_on else Z1 * np.exp(float(M) - float(c0)))
        place = np.arange(per * threads).reshape(threads, per)
        hit = (place < kept) & (cum >= target)
        cross = int(place[hit].min()) if hit.any() else NONE  # block_min_int
        if cross != NONE:
            kept = cross + 1
    if p.min_p > 0.0:
        floor_l = c0 + np.float32(np.log(np.float32(p.min_p)))
        kept = max(int(np.sum(cv[:kept] >= floor_l)), 1)
    return ci[:kept], cv[:kept]


_STAGE1_CACHE: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}


def model(logits, p: SamplingParams):
    vocab = logits.shape[0]
    local_k = local_k_for(vocab)
    n_blocks = -(-vocab // STAGE1_CHUNK)
    top_k = p.top_k if 0 < p.top_k < vocab else 0
    key = logits.tobytes() + bytes(str(min(top_k, local_k)), "ascii")  # once per logits case and cap
    if key not in _STAGE1_CACHE:
        if len(_STAGE1_CACHE) > 4:
            _STAGE1_CACHE.clear()
        _STAGE1_CACHE[key] = stage1(logits, local_k, top_k)
    cand_v, cand_i = _STAGE1_CACHE[key]
    cv, ci = stage2_sorted(cand_v, cand_i, n_blocks, local_k, p.top_k if 0 < p.top_k < vocab else 0)
    M = float(logits.max())
    Z1 = float(np.exp(logits.astype(np.float64) - M).sum())
    return filtered_kept(cv, ci, p, vocab, Z1, M)


def exact_order(v, ix):
    o = np.lexsort((ix, -v.astype(np.float64)))
    return v[o], ix[o]


@pytest.mark.parametrize("seed", range(4))
def test_warp_sort128_sorts(seed):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((4, 64)).astype(np.float32)  # two warps
    v[rng.random((4, 64)) < 0.2] = -np.inf        # masked tokens
    v[rng.integers(0, 4, 10), rng.integers(0, 64, 10)] = 1.5  # ties broken by index
    ix = rng.permutation(4096)[:256].reshape(4, 64)
    ix[3, -5:] = PAD                              # padding duplicates
    want = [exact_order(*warp_run(v, ix, w)) for w in range(2)]
    warp_sort128(v, ix)
    for w, (want_v, want_i) in enumerate(want):
        got_v, got_i = warp_run(v, ix, w)
        assert np.array_equal(got_v, want_v) and np.array_equal(got_i, want_i)


@pytest.mark.parametrize("L,n_runs,cap", [(128, 32, 128), (128, 16, 40), (64, 128, 8192), (40, 8, 40), (128, 2, 500)])
def test_merge_rounds_give_the_best_cap_sorted(L, n_runs, cap):
    rng = np.random.default_rng(L + n_runs + cap)
    n = L * n_runs
    v = np.round(rng.standard_normal(n) * 2, 1).astype(np.float32)  # many ties
    v[rng.random(n) < 0.05] = -np.inf
    ix = rng.permutation(n).astype(np.int64)
    ix[rng.random(n) < 0.02] = PAD
    for r in range(n_runs):
        v[r * L:(r + 1) * L], ix[r * L:(r + 1) * L] = exact_order(v[r * L:(r + 1) * L], ix[r * L:(r + 1) * L])
    want_v, want_i = exact_order(v, ix)
    runs = n_runs
    while runs > 1:
        merge_round(v, ix, runs, L, cap)
        L, runs = min(2 * L, cap), runs >> 1
    k = min(L, cap)
    assert k == min(cap, n)
    assert np.array_equal(v[:k], want_v[:k]) and np.array_equal(ix[:k], want_i[:k])


def test_stage1_keeps_each_blocks_best_sorted():
    rng = np.random.default_rng(7)
    vocab = 2 * STAGE1_CHUNK + 1000  # ragged last block
    logits = (rng.standard_normal(vocab) * 3).astype(np.float32)
    local_k = local_k_for(vocab)
    cand_v, cand_i = stage1(logits, local_k)
    cut_v, cut_i = stage1(logits, local_k, top_k=40)
    for blk in range(3):
        ids = np.arange(blk * STAGE1_CHUNK, min(vocab, (blk + 1) * STAGE1_CHUNK))
        want_v, want_i = exact_order(logits[ids], ids)
        assert np.array_equal(cand_i[blk * local_k:(blk + 1) * local_k], want_i[:local_k])
        run_v, run_i = cut_v[blk * local_k:(blk + 1) * local_k], cut_i[blk * local_k:(blk + 1) * local_k]
        assert np.array_equal(run_i[:40], want_i[:40]) and np.all(run_i[40:] == PAD) and np.all(run_v[40:] == -np.inf)


def logits_case(kind, vocab, seed):
    rng = np.random.default_rng(seed)
    if kind == "peaked":  # a few likely tokens over a noisy floor, as real logits
        x = rng.standard_normal(vocab) * 1.5
        x[rng.choice(vocab, 12, replace=False)] += rng.uniform(12, 17, 12)
    else:  # "flat": top_p 0.9 keeps ~1% of the vocabulary (hundreds to thousands of tokens)
        x = rng.standard_normal(vocab) * 3.6
    return x.astype(np.float32)


CASES = {
    "top_p": SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0),
    "min_p": SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.02),
    "top_p+min_p": SamplingParams(temperature=0.7, top_k=0, top_p=0.95, min_p=0.01),
    "default": SamplingParams(),
    "top_k 300": SamplingParams(temperature=1.0, top_k=300, top_p=0.9, min_p=0.0),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", ["peaked", "flat"])
@pytest.mark.parametrize("vocab", [49152, 262144])
def test_model_keeps_the_cpu_reference_set(vocab, kind, name):
    p = CASES[name]
    logits = logits_case(kind, vocab, seed=vocab % 97)
    ids, kept = model(logits, p)
    ref_ids, _ = filtered_candidates(logits, p, [])
    assert ids.size > 1 or ref_ids.size == 1
    assert set(ids.tolist()) == set(ref_ids.tolist()), (ids.size, ref_ids.size)
    # and the draw's distribution: softmax of the kept logits at T, as final_distribution's
    ref_ids2, ref_probs = final_distribution(logits, p, [])
    order = np.argsort(ref_ids2)
    probs = np.exp((kept - kept[0]) / p.temperature)
    probs /= probs.sum()
    np.testing.assert_allclose(probs[np.argsort(ids)], ref_probs[order], rtol=1e-4, atol=1e-7)


def test_flat_cases_have_wide_nuclei():
    """The 'flat' case is the one the old serial code was slow on: hundreds of kept tokens."""
    for vocab in (49152, 262144):
        ids, _ = model(logits_case("flat", vocab, seed=1), CASES["top_p"])
        assert ids.size > 300


def test_a_nucleus_wider_than_the_candidates_keeps_them_all():
    """The documented bound: stage 1 keeps local_k per block; a nucleus with more than that in
    one block is cut to the candidates (N(0, 3^2) logits at top_p 0.95: ~23k tokens of 262k)."""
    vocab = 262144
    logits = (np.random.default_rng(0).standard_normal(vocab) * 3).astype(np.float32)
    p = SamplingParams(temperature=1.0, top_k=0, top_p=0.95, min_p=0.0)
    ids, _ = model(logits, p)
    ref_ids, _ = filtered_candidates(logits, p, [])
    assert ids.size == STAGE2_MAX_CANDIDATES < ref_ids.size
    assert set(ids.tolist()) <= set(ref_ids.tolist())


@pytest.mark.parametrize("vocab", [100, 4096, 5000, 32000, 49152, 151936, 262144, 262145, 1_000_000])
def test_padded_runs_fit_stage2(vocab):
    """sample_finish pads the stage-1 runs to a power-of-two count: they must fit its buffer."""
    k = local_k_for(vocab)
    n_blocks = -(-vocab // STAGE1_CHUNK)
    assert (1 << (n_blocks - 1).bit_length()) * k <= STAGE2_MAX_CANDIDATES
    assert k == 128 or n_blocks * 2 * k > STAGE2_MAX_CANDIDATES  # as many as fit


@pytest.mark.parametrize("name", ["top_p", "top_p+min_p"])
def test_model_with_most_tokens_masked(name):
    """The grammar bitmask leaves -inf logits: they sort last, tie among themselves, never kept."""
    vocab = 49152
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal(vocab) * 3.6).astype(np.float32)
    logits[rng.random(vocab) < 0.97] = -np.inf
    ids, _ = model(logits, CASES[name])
    ref_ids, _ = filtered_candidates(logits, CASES[name], [])
    assert np.isfinite(logits[ids]).all()
    assert set(ids.tolist()) == set(ref_ids.tolist())
