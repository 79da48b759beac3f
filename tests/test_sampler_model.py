"""A numpy model of the device sampler's filtered path (cuda/sampling.cu), checked on the CPU.

The model follows the kernels step by step: stage 1's per-warp register bitonic sort
(`warp_sort128`, lanes as numpy columns) and merge rounds (`merge_round`: stable rank merge with
a keep-the-best-`cap` cut) leave each block's (stage1_chunk: 1024 to 4096 tokens) best local_k
sorted; stage 2 pads the runs to a power of two, cuts them to top_k when it is on, and merges
them (fully with top_k off, the best top_k with it on);
`filtered_draw` cuts prefixes by top_k, a running sum for top_p and a count for min_p. These tests
prove the algorithm (the sorts are exact, the kept set is the CPU reference's) before any device
run; tests/gpu/test_sampling_gpu.py checks the kernels themselves against the CPU reference.
"""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.gpu.sampler import STAGE2_MAX_CANDIDATES, local_k_for, stage1_blocks, stage1_chunk
from memra_engine.sampling import SamplingParams, filtered_candidates, final_distribution

RUN = 128
PAD = 0x7FFFFFFF


def before(va, ia, vb, ib):
    """The kernels' total order: larger value first, then lower index."""
    return (va > vb) | ((va == vb) & (ia < ib))


def bitonic_stage(v, ix, k):
    """warp_bitonic_stage<P>: stage k of the network over [P, 32 * n_warps] (register r of lane l
    of warp w = position l * P + r of warp w's 32 * P), in place."""
    P = v.shape[0]
    col = np.arange(v.shape[1])
    lane = col & 31
    j = k >> 1
    while j > 0:
        for r in range(P):
            i = lane * P + r
            up = (i & k) == 0
            if j < P:
                ro = r ^ j
                if ro > r:
                    swap = np.where(up, before(v[ro], ix[ro], v[r], ix[r]), before(v[r], ix[r], v[ro], ix[ro]))
                    v[r], v[ro] = np.where(swap, v[ro], v[r]), np.where(swap, v[r], v[ro])
                    ix[r], ix[ro] = np.where(swap, ix[ro], ix[r]), np.where(swap, ix[r], ix[ro])
            else:
                ov, oi = v[r][col ^ (j // P)], ix[r][col ^ (j // P)]  # __shfl_xor_sync in the warp
                wants_better = ((i & j) == 0) == up
                take = np.where(wants_better, before(ov, oi, v[r], ix[r]), before(v[r], ix[r], ov, oi))
                v[r], ix[r] = np.where(take, ov, v[r]), np.where(take, oi, ix[r])
        j >>= 1


def warp_sort128(v, ix):
    """v, ix: [4, 32 * n_warps], each warp's 128 sorted best first in place."""
    k = 2
    while k <= RUN:
        bitonic_stage(v, ix, k)
        k <<= 1


TOP, TOP_MAX = 64, 128


def merge_tree(v, ix, stride, n_runs, n_real, T=TOP):
    """merge_tree<T>: runs r < n_real of T at r * stride (the rest empty) -> their best T, sorted,
    by levels of warp_merge<T> (run a in lanes 0-15, run b reversed in lanes 16-31, P = T / 16 a
    lane, the network's last stage)."""
    P = T // 16
    if n_runs == 1:
        return (v[:T].copy(), ix[:T].copy()) if n_real else (np.full(T, -np.inf, np.float32), np.full(T, PAD))
    runs_v = [v[r * stride: r * stride + T] if r < n_real else np.full(T, -np.inf, np.float32) for r in range(n_runs)]
    runs_i = [ix[r * stride: r * stride + T] if r < n_real else np.full(T, PAD) for r in range(n_runs)]
    while len(runs_v) > 1:
        q = len(runs_v) // 2
        seq_v = np.stack([np.concatenate([runs_v[2 * w], runs_v[2 * w + 1][::-1]]) for w in range(q)])  # [q, 2T]
        seq_i = np.stack([np.concatenate([runs_i[2 * w], runs_i[2 * w + 1][::-1]]) for w in range(q)])
        wv = seq_v.reshape(q, 32, P).transpose(2, 0, 1).reshape(P, q * 32).copy()  # position lane * P + r
        wi = seq_i.reshape(q, 32, P).transpose(2, 0, 1).reshape(P, q * 32).copy()
        bitonic_stage(wv, wi, 2 * T)
        out_v = wv.reshape(P, q, 32).transpose(1, 2, 0).reshape(q, 2 * T)
        out_i = wi.reshape(P, q, 32).transpose(1, 2, 0).reshape(q, 2 * T)
        runs_v, runs_i = [out_v[w, :T] for w in range(q)], [out_i[w, :T] for w in range(q)]
    return runs_v[0], runs_i[0]


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
    chunk, n_blocks = stage1_chunk(vocab), stage1_blocks(vocab)
    nt = chunk // 4
    # thread t of block b holds token b * chunk + t + r * nt in register r; warp w = threads 32w..
    tok = (np.arange(n_blocks)[:, None] * chunk + np.arange(nt)[None, :]).ravel()
    tok = tok[None, :] + nt * np.arange(4)[:, None]  # [4, n_blocks * nt]
    lv = np.where(tok < vocab, logits[np.minimum(tok, vocab - 1)], -np.inf).astype(np.float32)
    li = np.where(tok < vocab, tok, PAD)
    warp_sort128(lv, li)
    cand_v = np.empty(n_blocks * local_k, np.float32)
    cand_i = np.empty(n_blocks * local_k, np.int64)
    nw = nt // 32
    for blk in range(n_blocks):
        cols = slice(blk * nt, (blk + 1) * nt)
        # sv[warp * RUN + lane * 4 + r] = register r of that lane
        sv = lv[:, cols].reshape(4, nw, 32).transpose(1, 2, 0).ravel().copy()
        si = li[:, cols].reshape(4, nw, 32).transpose(1, 2, 0).ravel().copy()
        cap = top_k if 0 < top_k < local_k else local_k
        if cap <= TOP:  # each warp's best 64, then the warp-merge tree
            best_v, best_i = sv.reshape(nw, RUN)[:, :TOP].ravel(), si.reshape(nw, RUN)[:, :TOP].ravel()
            sv, si = (np.concatenate([x, np.zeros(local_k, x.dtype)]) for x in merge_tree(best_v, best_i, TOP, nw, nw))
        else:
            L, runs = RUN, nw
            while runs > 1:
                merge_round(sv, si, runs, L, cap)
                L, runs = min(2 * L, cap), runs >> 1
        sv[cap:local_k], si[cap:local_k] = -np.inf, PAD
        cand_v[blk * local_k: (blk + 1) * local_k] = sv[:local_k]
        cand_i[blk * local_k: (blk + 1) * local_k] = si[:local_k]
    return cand_v, cand_i


def stage2_sorted(cand_v, cand_i, n_blocks, local_k, cap_top_k, cut_runs=True, tree=True, floor=None):
    """sample_finish's merge; cut_runs=False: the runs copied whole, as before they were cut to
    top_k; tree=False: merge_round's path where the warp-merge tree would run (the same result,
    more work); floor: min_p's floor (M + log min_p), under which places are cut from each run
    before the merge (the kernel does it when it writes no cuts record)."""
    n_runs = 1 << (n_blocks - 1).bit_length()
    Lc = min(local_k, cap_top_k) if cap_top_k else local_k
    live = cap_top_k if cap_top_k else STAGE2_MAX_CANDIDATES
    if floor is not None and live > TOP:
        over = (cand_v.reshape(n_blocks, local_k)[:, :Lc] >= floor).sum(axis=1)
        Lc, live = max(int(over.max()), 1), min(live, int(over.sum()))
    tree64, tree128 = live <= TOP and local_k >= TOP, live <= TOP_MAX and local_k >= TOP_MAX
    if tree and (tree64 or tree128) and n_runs <= 64:
        v, i = merge_tree(cand_v, cand_i, local_k, n_runs, n_blocks, TOP if tree64 else TOP_MAX)
        return v[:live], i[:live]
    if not cut_runs:
        Lc = local_k
    n_all = n_runs * Lc
    assert n_all <= STAGE2_MAX_CANDIDATES
    cv = np.full(n_all, -np.inf, np.float32)
    ci = np.full(n_all, PAD, np.int64)
    runs_v, runs_i = cand_v.reshape(n_blocks, local_k)[:, :Lc], cand_i.reshape(n_blocks, local_k)[:, :Lc]
    cv[: n_blocks * Lc], ci[: n_blocks * Lc] = runs_v.ravel(), runs_i.ravel()
    cap = min(cap_top_k, n_all) if cap_top_k else n_all
    L, runs = Lc, n_runs
    while runs > 1:
        merge_round(cv, ci, runs, L, cap)
        L, runs = min(2 * L, cap), runs >> 1
    n = min(L, cap)
    return cv[:n], ci[:n]


NONE = 0x7FFFFFFF  # the kernel's "no place found" for a block min


def filtered_kept(cv, ci, p: SamplingParams, vocab, Z1, M):
    """filtered_draw's cuts on the sorted candidates, written as the kernel does them (thread t
    owns places [t * per, (t + 1) * per), exclusive scan of the per-thread sums in double, block
    min of the first crossing; up to 64 candidates, filtered_draw_warp: 32 lanes of 2 places):
    (kept ids, kept logits)."""
    n = cv.size
    threads, per = (32, 2) if n <= TOP else (1024, -(-n // 1024))
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


def model(logits, p: SamplingParams, prefilter=True):
    """The kernels' kept set; prefilter=False: min_p's floor not applied before the merge (the
    path that writes a cuts record)."""
    vocab = logits.shape[0]
    local_k = local_k_for(vocab)
    n_blocks = stage1_blocks(vocab)
    top_k = p.top_k if 0 < p.top_k < vocab else 0
    key = logits.tobytes() + bytes(str(min(top_k, local_k)), "ascii")  # once per logits case and cap
    if key not in _STAGE1_CACHE:
        if len(_STAGE1_CACHE) > 4:
            _STAGE1_CACHE.clear()
        _STAGE1_CACHE[key] = stage1(logits, local_k, top_k)
    cand_v, cand_i = _STAGE1_CACHE[key]
    M = float(logits.max())
    floor = np.float32(M) + np.float32(np.log(np.float32(p.min_p))) if p.min_p > 0 else None
    prefilter = prefilter and not (top_k and p.top_p < 1.0)  # top_p's mass is then the top k's
    cv, ci = stage2_sorted(cand_v, cand_i, n_blocks, local_k, top_k, floor=floor if prefilter else None)
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


@pytest.mark.parametrize("vocab", [2 * 1024 + 700, 49152 + 1000, 151936])  # ragged last blocks
def test_stage1_keeps_each_blocks_best_sorted(vocab):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(vocab) * 3).astype(np.float32)
    local_k, chunk, n_blocks = local_k_for(vocab), stage1_chunk(vocab), stage1_blocks(vocab)
    cand_v, cand_i = stage1(logits, local_k)
    cut_v, cut_i = stage1(logits, local_k, top_k=40)
    for blk in range(n_blocks):
        ids = np.arange(blk * chunk, min(vocab, (blk + 1) * chunk))
        want_v, want_i = exact_order(logits[ids], ids)
        assert np.array_equal(cand_i[blk * local_k:(blk + 1) * local_k], want_i[:local_k])
        run_v, run_i = cut_v[blk * local_k:(blk + 1) * local_k], cut_i[blk * local_k:(blk + 1) * local_k]
        assert np.array_equal(run_i[:40], want_i[:40]) and np.all(run_i[40:] == PAD) and np.all(run_v[40:] == -np.inf)


@pytest.mark.parametrize("vocab", [3000, 49152 + 1000, 262144])
@pytest.mark.parametrize("top_k", [1, 40, 64, 65, 127, 128, 129, 300])
def test_stage2_paths_merge_to_the_same_list(top_k, vocab):
    """sample_finish copies the runs cut to top_k, or (top_k <= 128) merges them by a tree of
    warp merges (of 64 or of 128): the same sorted list, bit for bit, as merging them whole (ties and masked
    tokens included), and the CPU's best top_k."""
    rng = np.random.default_rng(top_k)
    logits = np.round(rng.standard_normal(vocab) * 2, 1).astype(np.float32)  # many ties
    logits[rng.random(vocab) < 0.3] = -np.inf
    local_k, n_blocks = local_k_for(vocab), stage1_blocks(vocab)
    cand_v, cand_i = stage1(logits, local_k, top_k)
    cut = stage2_sorted(cand_v, cand_i, n_blocks, local_k, top_k, tree=False)
    whole = stage2_sorted(cand_v, cand_i, n_blocks, local_k, top_k, cut_runs=False, tree=False)
    tree = stage2_sorted(cand_v, cand_i, n_blocks, local_k, top_k)
    assert np.array_equal(cut[0], whole[0]) and np.array_equal(cut[1], whole[1])
    assert np.array_equal(tree[0], whole[0]) and np.array_equal(tree[1], whole[1])
    want_v, want_i = exact_order(logits, np.arange(vocab))
    assert np.array_equal(cut[1], want_i[:top_k])


@pytest.mark.parametrize("vocab,chunk", [(384, 1024), (32000, 1024), (49152, 1024), (65537, 2048),
                                         (151936, 4096), (262144, 4096), (1_000_000, 4096)])
def test_stage1_chunk_is_the_smallest_that_fits(vocab, chunk):
    assert stage1_chunk(vocab) == chunk


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
    "top_k 64": SamplingParams(temperature=1.0, top_k=64, top_p=1.0, min_p=0.0),  # the 64-wide trees' widest
    "top_k 128": SamplingParams(temperature=1.0, top_k=128, top_p=1.0, min_p=0.0),  # sample_finish's widest
    "creative": SamplingParams(temperature=1.0, top_k=100, top_p=0.98, min_p=0.02),  # the app's preset
    "top_k off, min_p": SamplingParams(temperature=0.7, top_k=0, top_p=0.95, min_p=0.05),
}


@pytest.mark.parametrize("vocab", [3000, 49152 + 1000, 262144])
@pytest.mark.parametrize("kind", ["peaked", "flat", "ties"])
@pytest.mark.parametrize("name", ["min_p", "top_p+min_p", "creative", "top_k off, min_p", "top_k 300"])
def test_min_p_floor_before_the_merge_keeps_the_same_tokens(vocab, kind, name):
    """sample_finish cuts each run at min_p's floor before merging (no cuts record to write, and
    not top_k with top_p: "creative" fails here without that rule): the same kept tokens, in the
    same order, as merging the runs whole; and a shorter list to merge."""
    p = CASES[name]
    if kind == "ties":  # many equal logits, a third of the vocabulary masked
        rng = np.random.default_rng(vocab)
        logits = np.round(rng.standard_normal(vocab) * 2, 1).astype(np.float32)
        logits[rng.random(vocab) < 0.3] = -np.inf
    else:
        logits = logits_case(kind, vocab, seed=vocab % 89)
    ids, kept = model(logits, p)
    ids_whole, kept_whole = model(logits, p, prefilter=False)
    assert np.array_equal(ids, ids_whole) and np.array_equal(kept, kept_whole)
    if p.min_p > 0 and kind == "peaked" and not (p.top_k and p.top_p < 1):  # a dozen likely tokens: the tree
        local_k, n_blocks = local_k_for(vocab), stage1_blocks(vocab)
        top_k = p.top_k if 0 < p.top_k < vocab else 0
        cand_v, cand_i = stage1(logits, local_k, top_k)
        floor = np.float32(logits.max()) + np.float32(np.log(np.float32(p.min_p)))
        assert stage2_sorted(cand_v, cand_i, n_blocks, local_k, top_k, floor=floor)[0].size <= TOP


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
    n_blocks = stage1_blocks(vocab)
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
