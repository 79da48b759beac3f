"""Microbenchmarks of the quantized weight path on the GPU: matvec GB/s, GEMM TFLOP/s.

    python scripts/bench_kernels.py [--quick] [--gemm-only] [--json FILE]

Matvec: per weight type and shape, each rows-per-warp variant, timed as the median of CUDA-graph
replays of many launches (as in the decode graph), rotating over enough weight copies that the
set is several times the 60 MB L2, so bytes come from HBM. GB/s counts the weight bytes as
stored on the GPU (repacked planes) plus the q8_1 activation; the roofline is the ~4.3 TB/s an
H200 device-to-device copy reaches (measured here too, as "copy").
GEMM: 512 tokens (pp512's chunk), TFLOP/s = 2*tokens*rows*cols / time.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from memra_engine.gpu import quant_ops
from memra_engine.gpu.graph import CudaGraph
from memra_engine.gpu.memory import VramPool
from memra_engine.gpu.quant_ref import random_weight_bytes
from memra_engine.gpu.runtime import GpuRuntime
from memra_engine.model.gguf_file import TensorInfo

ROOFLINE = 4.3e12
ROTATE_BYTES = 400 << 20
MAX_COPIES = 1024
MATVEC_SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (576, 576), (1536, 576), (576, 1536), (49152, 576)]
MATVEC_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.F16]
GEMM_SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (1536, 576), (49152, 576)]
GEMM_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.F16]
GEMM_TOKENS = 512


def time_graph(rt, launches, reps: int = 9) -> float:
    """Median seconds per launch over `reps` replays of one graph holding all `launches`."""
    graph = CudaGraph()
    with graph.capture(rt):
        for launch in launches:
            launch()
    us = graph.replay_us(rt, batches=reps)
    graph.destroy()
    rt.check()
    return us * 1e-6 / len(launches)


def copy_bandwidth(rt, pool) -> float:
    n = 1 << 30
    pool.reset("weights")
    a, b = pool.alloc("weights", n, "a"), pool.alloc("weights", n, "b")
    rt.memset_u32(a.ptr, 0x3F800000, n // 4)
    launches = [lambda: rt.cuda.memcpy_dtod_async(b.ptr, a.ptr, n, rt.stream)] * 4
    return 2 * n / time_graph(rt, launches, reps=5)


def upload_copies(rt, pool, ggml_type, rows, cols, rng):
    """One random weight, uploaded once and copied on the device until the set exceeds L2 several times."""
    data = random_weight_bytes(ggml_type, rows, cols, rng)
    pool.reset("weights")
    first = quant_ops.upload_weight(rt, pool, TensorInfo("w", (rows, cols), ggml_type, data))
    n = max(2, min(MAX_COPIES, -(-ROTATE_BYTES // first.buf.nbytes)))
    weights = [first]
    for i in range(1, n):
        buf = pool.alloc("weights", first.buf.nbytes, f"w{i}")
        rt.cuda.memcpy_dtod(buf.ptr, first.buf.ptr, first.buf.nbytes)
        weights.append(quant_ops.GpuWeight(ggml_type, rows, cols, buf, first.layout))
    return weights


def bench_matvec(rt, pool, quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    rows_out = []
    shapes = MATVEC_SHAPES[:1] + MATVEC_SHAPES[4:5] if quick else MATVEC_SHAPES
    for ggml_type in MATVEC_TYPES:
        for rows, cols in shapes:
            if ggml_type in quant_ops.QUANT_PLANES and cols % GGML_QUANT_SIZES[ggml_type][0]:
                continue
            weights = upload_copies(rt, pool, ggml_type, rows, cols, rng)
            pool.reset("scratch")
            x = pool.alloc("scratch", 16 * cols * 4, "x")
            rt.upload(x.ptr, rng.standard_normal((16, cols)).astype(np.float32))
            xq = pool.alloc("scratch", quant_ops.q8_1_nbytes(cols, 16), "xq")
            y = pool.alloc("scratch", 16 * rows * 4, "y")
            if ggml_type in quant_ops.QUANT_PLANES:
                quant_ops.quantize_q8_1(rt, x.ptr, xq.ptr, cols, 16)
            act_bytes = quant_ops.q8_1_nbytes(cols) if ggml_type in quant_ops.QUANT_PLANES else cols * 4
            wbytes = weights[0].buf.nbytes
            launches = max(len(weights), 64)
            result = {"type": ggml_type.name, "rows": rows, "cols": cols, "weight_bytes": wbytes}
            quant = ggml_type in quant_ops.QUANT_PLANES
            variants = [("", v) for v in quant_ops.ONE_COLUMN_VARIANTS] if quant else [("", None)]
            if quant and cols <= 2048:
                variants += [("fused", v) for v in quant_ops.FUSED_VARIANTS]
            for kind, v in variants:
                fused = kind == "fused"
                fns = [(lambda w=weights[i % len(weights)], v=v, fused=fused:
                        quant_ops.matvec(rt, w, x.ptr, None if fused else xq.ptr, y.ptr, 1, variant=v))
                       for i in range(launches)]
                t = time_graph(rt, fns)
                key = f"{kind}r{v[0]}u{v[1]}" if v else "float"
                result[f"us_{key}"] = t * 1e6
                result[f"gbs_{key}"] = (wbytes + act_bytes) / t / 1e9
            plain = [k for k in result if k.startswith("us_r") or k == "us_float"]
            best = min(plain, key=lambda k: result[k])
            result["best"] = best[3:]
            result["default"] = "r%du%d" % quant_ops.matvec_variant(weights[0]) if quant else "float"
            fused_keys = [k for k in result if k.startswith("us_fused")]
            if fused_keys:
                result["best_fused"] = min(fused_keys, key=lambda k: result[k])[3:]
            # batched verify: 8 and 16 columns in one pass, time per launch (the default path; where
            # that is the tensor-core one, the dp4a one beside it)
            paths = [("", None)] + ([("dp4a", quant_ops.batched_variant(weights[0]))]
                                    if quant and quant_ops.uses_mma(weights[0]) else [])
            for c in (8, 16):
                for tag, v in paths:
                    fns = [(lambda w=weights[i % len(weights)], v=v, c=c: quant_ops.matvec(rt, w, x.ptr, xq.ptr, y.ptr, c, variant=v))
                           for i in range(launches)]
                    result[f"us_c{c}{tag}"] = time_graph(rt, fns) * 1e6
            if quant and quant_ops.uses_k256(weights[0]):  # the q8_k256 decode and verify kernels (k256.cu)
                xk = pool.alloc("scratch", 16 * quant_ops.q8_k256_stride(cols), "xk")
                quant_ops.quantize_q8_k256(rt, x.ptr, xk.ptr, cols, 16)
                for c in (1, 8, 16):
                    fns = [(lambda w=weights[i % len(weights)], c=c: quant_ops.matvec_k256(rt, w, xk.ptr, y.ptr, c))
                           for i in range(launches)]
                    result[f"us_k256_c{c}"] = time_graph(rt, fns) * 1e6
            rows_out.append(result)
            print(f"matvec {ggml_type.name:5s} {rows:6d}x{cols:<6d} " + " ".join(
                f"{k[3:]} {result[k]:6.2f}" for k in result if k.startswith("us_")) + " us", flush=True)
    return rows_out


def bench_quantize(rt, pool) -> list[dict]:
    out = []
    for cols in (576, 1536, 4096, 14336):
        pool.reset("scratch")
        x = pool.alloc("scratch", cols * 4, "x")
        rt.memset_u32(x.ptr, 0x3F800000, cols)
        xq = pool.alloc("scratch", quant_ops.q8_1_nbytes(cols), "xq")
        t = time_graph(rt, [lambda: quant_ops.quantize_q8_1(rt, x.ptr, xq.ptr, cols, 1)] * 64)
        out.append({"cols": cols, "us": t * 1e6})
        print(f"quantize_q8_1 K={cols}: {t * 1e6:.2f} us", flush=True)
    return out


def bench_gemm(rt, pool, quick: bool) -> list[dict]:
    rng = np.random.default_rng(1)
    out = []
    shapes = GEMM_SHAPES[:1] if quick else GEMM_SHAPES
    for ggml_type in GEMM_TYPES:
        for rows, cols in shapes:
            if ggml_type in quant_ops.QUANT_PLANES and cols % GGML_QUANT_SIZES[ggml_type][0]:
                continue
            pool.reset("weights"), pool.reset("scratch")
            data = random_weight_bytes(ggml_type, rows, cols, rng)
            w = quant_ops.upload_weight(rt, pool, TensorInfo("w", (rows, cols), ggml_type, data))
            x = pool.alloc("scratch", GEMM_TOKENS * cols * 4, "x")
            rt.upload(x.ptr, rng.standard_normal((GEMM_TOKENS, cols)).astype(np.float32))
            xh = pool.alloc("scratch", quant_ops.f16_nbytes(cols, GEMM_TOKENS), "xh")
            y = pool.alloc("scratch", GEMM_TOKENS * rows * 4, "y")
            res = {"type": ggml_type.name, "rows": rows, "cols": cols, "tokens": GEMM_TOKENS}
            tiles = quant_ops.gemm_tiles(w, rt.max_shared)
            for prefix in tiles:
                # the pipelined tiles' time includes x's f16 conversion (one launch per GEMM here;
                # in a model one conversion serves every weight that reads x)
                def run(p=prefix):
                    if p in quant_ops.PIPELINED_TILES:
                        quant_ops.to_f16(rt, x.ptr, xh.ptr, cols, GEMM_TOKENS)
                    quant_ops.gemm(rt, w, x.ptr, y.ptr, GEMM_TOKENS, xh.ptr, variant=p)
                run()  # sets the shared-memory opt-in outside the capture
                t = time_graph(rt, [run] * 5, reps=5)
                res[f"us_{prefix}"] = t * 1e6
                res[f"tflops_{prefix}"] = 2 * GEMM_TOKENS * rows * cols / t / 1e12
            res["default"] = quant_ops.gemm_variant(w, GEMM_TOKENS, rt.max_shared)
            res["tflops"] = max(res[f"tflops_{p}"] for p in tiles)
            out.append(res)
            print(f"gemm {ggml_type.name:5s} {rows:6d}x{cols:<6d} T={GEMM_TOKENS}: " + "  ".join(
                f"{p} {res[f'us_{p}']:8.1f} us {res[f'tflops_{p}']:6.1f}" for p in tiles) + " TFLOP/s", flush=True)
    return out


def summary(copy_bw, q, mv, gemm) -> str:
    qus = {e["cols"]: e["us"] for e in q}
    lines = [f"device copy bandwidth (read+write): {copy_bw / 1e9:.0f} GB/s; roofline used: {ROOFLINE / 1e12:.1f} TB/s",
             "", "matvec, 1 token (best rows-per-warp), GB/s and fraction of 4.3 TB/s:",
             f"{'type':6s}" + "".join(f"{f'{r}x{c}':>19s}" for r, c in MATVEC_SHAPES)]
    for t in MATVEC_TYPES:
        cells = []
        for r, c in MATVEC_SHAPES:
            hit = [m for m in mv if m["type"] == t.name and m["rows"] == r and m["cols"] == c]
            if hit:
                g = hit[0][f"gbs_{hit[0]['best']}"]
                cells.append(f"{g:5.0f} {g * 1e9 / ROOFLINE:4.0%} {hit[0]['best']}")
            else:
                cells.append("-")
        lines.append(f"{t.name:6s}" + "".join(f"{s:>19s}" for s in cells))
    lines += ["", "quantize_q8_1 + matvec (default variant) vs fused, us:"]
    for m in mv:
        if "best_fused" in m:
            sep = qus.get(m["cols"], float("nan")) + m[f"us_{m['default']}"]
            lines.append(f"{m['type']:6s} {m['rows']:6d}x{m['cols']:<6d} {sep:6.2f} vs {m['us_' + m['best_fused']]:6.2f} "
                         f"({m['best_fused']}), c8 {m['us_c8']:6.2f}")
    lines += ["", f"gemm, {GEMM_TOKENS} tokens, TFLOP/s (best tile):", f"{'type':6s}" + "".join(f"{f'{r}x{c}':>13s}" for r, c in GEMM_SHAPES)]
    for t in GEMM_TYPES:
        cells = []
        for r, c in GEMM_SHAPES:
            hit = [g for g in gemm if g["type"] == t.name and g["rows"] == r and g["cols"] == c]
            cells.append(f"{hit[0]['tflops']:.1f}" if hit else "-")
        lines.append(f"{t.name:6s}" + "".join(f"{s:>13s}" for s in cells))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two matvec shapes, one GEMM shape")
    ap.add_argument("--gemm-only", action="store_true", help="only the prefill GEMM")
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args()
    rt = GpuRuntime(families=["matvec", "gemm", "k256"])
    pool = VramPool({"weights": 2560 << 20, "scratch": 256 << 20})
    try:
        for name in quant_ops.kernel_names():  # lookups are refused inside a capture
            rt.kernel(name)
        print(f"device: {rt.device_name} ({rt.arch})", flush=True)
        gm = bench_gemm(rt, pool, args.quick)
        if args.gemm_only:
            return 0
        copy_bw = copy_bandwidth(rt, pool)
        q = bench_quantize(rt, pool)
        mv = bench_matvec(rt, pool, args.quick)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"copy_gbs": copy_bw / 1e9, "quantize": q, "matvec": mv, "gemm": gm}, f, indent=1)
        print("\n" + summary(copy_bw, q, mv, gm))
    finally:
        pool.close()
        rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
