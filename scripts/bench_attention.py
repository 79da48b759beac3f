"""Decode attention alone: µs per launch inside a graph, by head dim and key count.

Each figure is the median of 5 batches of 50 back-to-back launches of one captured graph (so the
launch gap is included, as in the decode graph); attention and its merge launch count as one. A
one-element add_f32 is the floor: what any kernel costs in this graph. Both attention paths
(split + merge kernel; clusters, sm_90+). Then, on the SmolLM2 shape, the cluster path taken
apart: the attention kernel without its merge launch, with one layer's cache (L2-resident after
the first launch) and with 30 layers' caches in turn (90 MB at 4096 keys: read from HBM, as in
the decode graph); the same for the Llama-8B shape (30 caches of 17 MB at 4096 keys).
Run on the GPU machine: python scripts/bench_attention.py
`--once SHAPE KEYS` makes one cluster-path launch (attention and merge) and nothing else, for ncu:
    ncu --clock-control none -k regex:attn python scripts/bench_attention.py --once llama-8b 4224
"""
from __future__ import annotations

import sys

import numpy as np

from memra_engine.gpu.graph import CudaGraph
from memra_engine.gpu.memory import VramPool
from memra_engine.gpu.ops import attention_launch, attn_max_splits, attn_slots, attn_splits, kv_bucket
from memra_engine.gpu.runtime import GpuRuntime

SHAPES = {"smollm2 hd64 9/3": (9, 3, 64), "gemma3 hd256 4/1": (4, 1, 256), "qwen3 hd128 16/8": (16, 8, 128),
          "llama-8b hd128 32/8": (32, 8, 128), "qwen3-moe hd128 32/4": (32, 4, 128)}
KEYS = (1, 33, 129, 513, 1025, 2049, 3073, 4097, 4224, 8192)
N_LAYERS = 30  # the cold rows: SmolLM2's layer count
REPS = 50


def time_launches(rt, body) -> float:
    """µs per body() call: REPS calls captured in one graph, median of 5 replays."""
    graph = CudaGraph()
    rt.synchronize()
    with graph.capture(rt):
        for _ in range(REPS):
            body()
    us = graph.replay_us(rt) / REPS
    graph.destroy()
    return us


def main() -> None:
    rt = GpuRuntime(families=["attention", "activation"])
    rt.resolve_all()
    try:
        if len(sys.argv) == 4 and sys.argv[1] == "--once":
            once(rt, sys.argv[2], int(sys.argv[3]))
        else:
            run(rt)
    finally:
        rt.close()


def once(rt, shape: str, n: int) -> None:
    """One launch of the cluster path on the first shape whose name starts with `shape`."""
    H, n_kv, hd = next(v for k, v in SHAPES.items() if k.startswith(shape))
    put, rng = uploader(rt, 256 << 20), np.random.default_rng(0)
    n_ctx = max(n, 8200)
    kc = put(rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16))
    vc = put(rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16))
    q = put(rng.standard_normal(H * hd).astype(np.float32))
    out = put(np.zeros(H * hd, np.float32))
    cap = attn_max_splits(n_kv, H // n_kv, hd)
    S = attn_splits(kv_bucket(n), hd, True, "f16", cap)
    opart = put(np.zeros(attn_slots(S, True, hd) * H * hd, np.float32))
    ml = put(np.zeros(attn_slots(S, True, hd) * H * 2, np.float32))
    pos = put(np.array([n - 1], np.int32))
    attention_launch(rt, q, H * hd, kc, vc, 0, 0, opart, ml, pos, 1, H, n_kv, hd, n_ctx, 0, 0.125, 0.0, out,
                     0, 0, S, "f16", True, max_splits=cap)
    rt.synchronize()
    print(f"{shape} {n} keys: grid y {S}, cap {cap}")


def uploader(rt, nbytes: int):
    """put(array) -> device pointer: a copy of the array in a scratch pool of nbytes."""
    pool = VramPool({"scratch": nbytes})

    def put(a: np.ndarray) -> int:
        buf = pool.alloc("scratch", a.nbytes, "x")
        rt.upload(buf.ptr, a)
        return buf.ptr

    return put


def run(rt) -> None:
    put, rng = uploader(rt, 2048 << 20), np.random.default_rng(0)
    one = put(np.ones(4, np.float32))
    floor = time_launches(rt, lambda: rt.launch("add_f32", 1, 32, (one, one, one, 1)))
    print(f"floor (add_f32 of 1 element): {floor:.2f} µs per launch")
    print(f"{'shape':28s}" + "".join(f"{k:>9d}" for k in KEYS) + "   keys")
    n_ctx = 8200
    paths = (False, True) if rt.cluster_attention else (False,)
    for name, (H, n_kv, hd) in SHAPES.items():
        kc = put(rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16))
        vc = put(rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16))
        q = put(rng.standard_normal(H * hd).astype(np.float32))
        out = put(np.zeros(H * hd, np.float32))
        cap = attn_max_splits(n_kv, H // n_kv, hd)
        for cluster in paths:
            row = []
            for n in KEYS:
                S = attn_splits(kv_bucket(n), hd, cluster, "f16", cap)
                slots = attn_slots(S, cluster, hd)
                opart = put(np.zeros(slots * H * hd, np.float32))
                ml = put(np.zeros(slots * H * 2, np.float32))
                pos = put(np.array([n - 1], np.int32))
                row.append(time_launches(rt, lambda: attention_launch(
                    rt, q, H * hd, kc, vc, 0, 0, opart, ml, pos, 1, H, n_kv, hd, n_ctx, 0, 0.125, 0.0, out,
                    0, 0, S, "f16", cluster, max_splits=cap)))
            label = f"{name} {'cluster' if cluster else 'split'}"
            print(f"{label:28s}" + "".join(f"{x:9.2f}" for x in row) + "   µs")
    if rt.cluster_attention:
        for name in ("smollm2 hd64 9/3", "llama-8b hd128 32/8"):
            taken_apart(rt, put, rng, n_ctx, name, SHAPES[name])


def taken_apart(rt, put, rng, n_ctx, name, q_shape) -> None:
    H, n_kv, hd = q_shape
    caches = [(put(rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16)),
               put(rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16))) for _ in range(N_LAYERS)]
    q = put(rng.standard_normal(H * hd).astype(np.float32))
    out = put(np.zeros(H * hd, np.float32))
    rows = {"attention+merge, hot": (True, 1), "attention+merge, cold": (True, N_LAYERS),
            "attention only, hot": (False, 1), "attention only, cold": (False, N_LAYERS)}
    cap = attn_max_splits(n_kv, H // n_kv, hd)
    for label, (merge, n_caches) in rows.items():
        row = []
        for n in KEYS:
            S = attn_splits(kv_bucket(n), hd, True, "f16", cap)
            opart = put(np.zeros(attn_slots(S, True, hd) * H * hd, np.float32))
            ml = put(np.zeros(attn_slots(S, True, hd) * H * 2, np.float32))
            pos = put(np.array([n - 1], np.int32))
            turn = iter(range(10**9))

            def body():
                kc, vc = caches[next(turn) % n_caches]
                attention_launch(rt, q, H * hd, kc, vc, 0, 0, opart, ml, pos, 1, H, n_kv, hd, n_ctx, 0, 0.125, 0.0,
                                 out, 0, 0, S, "f16", True, merge=merge, max_splits=cap)

            row.append(time_launches(rt, body))
        print(f"{name.split()[0] + ' cl ' + label:28s}" + "".join(f"{x:9.2f}" for x in row) + "   µs")


if __name__ == "__main__":
    main()
