"""Prototype for issue 14: scripts/proto/mma_q4k.cu (a Q4_K matvec on int8 tensor cores whose
float steps do not depend on the column count) against the engine's decode and verify kernels,
on the same random Q4_K weights, µs a launch (graphs of 64 launches over copies that exceed L2,
as scripts/bench_kernels.py times). Checks the prototype's output first, in float64 numpy, on
the first 256 rows. Run on the GPU machine after device_run.sh installed memra:
    PYTHONPATH=/tmp/site:scripts python3 scripts/proto/mma_q4k.py [ROWSxCOLS ...]
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as QT

import bench_kernels as bk
from memra_engine.gpu import quant_ops
from memra_engine.gpu.memory import VramPool
from memra_engine.gpu.quant_ref import q8_k256_bytes, quantize_q8_1_ref, quantize_q8_k256_ref, random_weight_bytes
from memra_engine.gpu.runtime import GpuRuntime

SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]
COLUMNS = (1, 2, 4, 8)
CHECK_ROWS = 256
WIDTHS = (4, 8, 16)  # warps a block, for the width sweep


def repack_weight(data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """GGUF Q4_K bytes (rows, nb * 144) -> the prototype's tiles (rows / 16, nb, 2304), see the .cu."""
    nb, tiles = cols // 256, rows // 16
    blocks = data.reshape(rows, nb, 144)
    qs = blocks[:, :, 16:].reshape(tiles, 2, 8, nb, 4, 2, 4, 4)  # (tile, row half, g, b, pair i, k half, t, byte)
    nib = qs.transpose(0, 3, 4, 2, 6, 5, 1, 7).reshape(tiles, nb, 2048)  # (tile, b, i, g, t, k half, row half, byte)
    hdr = blocks[:, :, :16].reshape(tiles, 16, nb, 16).transpose(0, 2, 1, 3).reshape(tiles, nb, 256)
    return np.ascontiguousarray(np.concatenate([nib, hdr], axis=2))


def repack_terms(q1: np.ndarray, q2: np.ndarray) -> np.ndarray:
    """Both int8 terms of n <= 8 columns -> the B fragments, xq [nb, 2, 4, 32] int4 (as bytes)."""
    n, k = q1.shape
    nb = k // 256
    terms = []
    for q in (q1, q2):
        full = np.zeros((8, k), np.int8)
        full[:n] = q
        # k = b * 256 + (2i + hh) * 32 + half * 16 + t * 4 + byte -> (b, i, g, t, hh, half, byte)
        terms.append(full.reshape(8, nb, 4, 2, 2, 4, 4).transpose(1, 2, 0, 5, 3, 4, 6).reshape(nb, 4, 32, 16))
    return np.ascontiguousarray(np.stack(terms, axis=1))


def repack_act(q1: np.ndarray, q2: np.ndarray, ds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q8_1 rows of n <= 8 columns -> (xq, xs [nb, 8, 8, 2] float32 (d2, sum))."""
    n, k = q1.shape
    nb = k // 256
    xq = repack_terms(q1, q2)
    xs = np.zeros((8, nb * 8, 2), np.float32)
    xs[:n, :, 0] = ds[:, :, 2]  # d2
    xs[:n, :, 1] = ds[:, :, 1]  # sum
    xs = np.ascontiguousarray(xs.reshape(8, nb, 8, 2).transpose(1, 2, 0, 3))
    return xq, xs


def repack_act_int(q1, q2, d2, bs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (xq, xd [nb, 8] float32 d2, xb [nb, 8, 8] int32 bs), columns padded to 8."""
    n, k = q1.shape
    nb = k // 256
    xd = np.zeros((nb, 8), np.float32)
    xd[:, :n] = d2.T
    xb = np.zeros((nb, 8, 8), np.int32)
    xb[:, :, :n] = bs.reshape(n, nb, 8).transpose(1, 2, 0)
    return repack_terms(q1, q2), xd, np.ascontiguousarray(xb)


def q4k_fields(data: np.ndarray, rows: int, cols: int):
    """d, dmin [rows, nb] float64; sc, m [rows, nb, 8] int64; quant values [rows, nb * 8, 32] float64."""
    nb = cols // 256
    blocks = data[:rows].reshape(rows, nb, 144)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    dmin = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    s = blocks[:, :, 4:16].astype(np.int64)
    sc = np.empty((rows, nb, 8), np.int64)
    mn = np.empty((rows, nb, 8), np.int64)
    sc[..., :4], mn[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    qs = blocks[:, :, 16:].reshape(rows, nb, 4, 32)
    vals = np.stack([qs & 0xF, qs >> 4], axis=3).reshape(rows, nb * 8, 32).astype(np.float64)  # sub-blocks in order
    return d, dmin, sc, mn, vals


def reference_int(data: np.ndarray, rows: int, cols: int, q1, q2, d2, bs) -> np.ndarray:
    """mvq4k_int's formula in float64: y[n, r]."""
    d, dmin, sc, mn, vals = q4k_fields(data, rows, cols)
    n, nb = q1.shape[0], cols // 256
    c = np.einsum("rsk,nsk->rns", vals, q1.reshape(n, -1, 32).astype(np.float64))
    e = np.einsum("rsk,nsk->rns", vals, q2.reshape(n, -1, 32).astype(np.float64))
    scr = sc.reshape(rows, 1, -1)
    v = (scr * (254 * c + e)).reshape(rows, n, nb, 8).sum(-1)
    mins = (mn.reshape(rows, 1, -1) * bs.astype(np.float64)[None]).reshape(rows, n, nb, 8).sum(-1)
    return (d2.astype(np.float64)[None] * (d[:, None] * v - dmin[:, None] * mins)).sum(-1).T


def reference(data: np.ndarray, rows: int, cols: int, q1, q2, ds) -> np.ndarray:
    """The prototype's formula in float64: y[n, r] (see the .cu's header)."""
    nb = cols // 256
    d, dmin, sc, mn, vals = q4k_fields(data, rows, cols)
    n = q1.shape[0]
    c = np.einsum("rsk,nsk->rns", vals, q1.reshape(n, -1, 32).astype(np.float64))
    e = np.einsum("rsk,nsk->rns", vals, q2.reshape(n, -1, 32).astype(np.float64))
    d2, sums = ds[:, :, 2].astype(np.float64), ds[:, :, 1].astype(np.float64)
    dot = (sc.reshape(rows, 1, -1) * d2[None] * (254 * c + e)).reshape(rows, n, nb, 8).sum(-1)
    mins = (mn.reshape(rows, 1, -1) * sums[None]).reshape(rows, n, nb, 8).sum(-1)
    return (d[:, None] * dot - dmin[:, None] * mins).sum(-1).T


def build_cubin() -> bytes:
    src = Path(__file__).with_suffix(".cu")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "proto.cubin"
        subprocess.run(["nvcc", "-cubin", "-O3", "-std=c++17", "-Xptxas=-O3,-v", "-arch=sm_90a", "-o", str(out),
                        str(src)], check=True)
        return out.read_bytes()


def register(rt: GpuRuntime, cubin: bytes) -> None:
    """The prototype's kernels launched through the engine's runtime (PDL in graphs as the engine's)."""
    sigs = {f"mvq4k_mma_{nc}": "PPPPii" for nc in COLUMNS}
    sigs |= {f"mvq4k_int_{nc}": "PPPPPii" for nc in COLUMNS}
    sigs |= {f"mvq4k_int2_{nc}": "PPPPPii" for nc in (1, 8)}
    sigs["mvq4k_dp4a_1"] = "PPPPPii"
    sigs |= {f"mvq4k_{k}_w{nw}": "PPPPPii" for k in ("int_8", "dp4a_1") for nw in WIDTHS}
    rt.load_module("proto", cubin, sigs)
    for name in sigs:
        rt.kernel(name)


def main() -> None:
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1:]] or SHAPES
    rt = GpuRuntime(families=["matvec", "k256"])
    pool = VramPool({"weights": 2560 << 20, "scratch": 256 << 20})
    register(rt, build_cubin())
    rng = np.random.default_rng(0)
    print("µs a launch; proto = q8_1 activations (a scale per 32), int = a scale per 256 and integer sums")
    print("shape         engine c1    c8 |  proto c1    c2    c4    c8 |   int c1    c2    c4    c8 | "
          "c8 / engine c1: engine proto int | max rel err proto, int")
    try:
        for name in quant_ops.kernel_names():
            if name.startswith("matvec_") or name == "quantize_q8_1":
                rt.kernel(name)
        for rows, cols in shapes:
            nb = cols // 256
            # the engine's kernels on its own layout (bench_kernels' copies: the same random bytes)
            engine = bk.upload_copies(rt, pool, QT.Q4_K, rows, cols, np.random.default_rng(7))
            data = random_weight_bytes(QT.Q4_K, rows, cols, np.random.default_rng(7))
            pool.reset("scratch")
            x = rng.standard_normal((8, cols)).astype(np.float32)
            xd = pool.alloc("scratch", x.nbytes, "x")
            rt.upload(xd.ptr, x)
            xqe = pool.alloc("scratch", quant_ops.q8_1_nbytes(cols, 8), "xqe")
            ye = pool.alloc("scratch", 8 * rows * 4, "ye")
            quant_ops.quantize_q8_1(rt, xd.ptr, xqe.ptr, cols, 8)
            launches = max(len(engine), 64)
            t_e = {c: bk.time_graph(rt, [(lambda w=engine[i % len(engine)], c=c: quant_ops.matvec(
                rt, w, xd.ptr, xqe.ptr, ye.ptr, c)) for i in range(launches)]) * 1e6 for c in (1, 8)}
            # the prototype: repacked copies (pool.alloc after the engine's: both sets stay resident)
            packed = repack_weight(data, rows, cols)
            bufs = []
            for i in range(len(engine)):
                buf = pool.alloc("weights", packed.nbytes, f"p{i}")
                if i == 0:
                    rt.upload(buf.ptr, packed)
                else:
                    rt.cuda.memcpy_dtod(buf.ptr, bufs[0].ptr, packed.nbytes)
                bufs.append(buf)
            y = pool.alloc("scratch", 16 * rows * 4, "y")  # 16 columns for the engine's c16
            t_p, t_i, t_i2, t_d, err, err_i = {}, {}, {}, {}, 0.0, 0.0

            def run(name, args, want, times, threads=128):
                rt.launch(name, rows // 16, threads, args(bufs[0]))
                got = rt.download(y.ptr, (want.shape[0], rows), np.float32)[:, :CHECK_ROWS]
                times[want.shape[0]] = bk.time_graph(rt, [(lambda b=bufs[i % len(bufs)]: rt.launch(
                    name, rows // 16, threads, args(b))) for i in range(launches)]) * 1e6
                return float(np.abs(got - want).max() / np.abs(want).max())

            for nc in COLUMNS:
                q1, q2, ds = quantize_q8_1_ref(x[:nc])
                xq, xs = repack_act(q1, q2, ds)
                xqd, xsd = pool.alloc("scratch", xq.nbytes, "xq"), pool.alloc("scratch", xs.nbytes, "xs")
                rt.upload(xqd.ptr, xq)
                rt.upload(xsd.ptr, xs)
                err = max(err, run(f"mvq4k_mma_{nc}", lambda b: (b.ptr, xqd.ptr, xsd.ptr, y.ptr, rows, nb),
                                   reference(data, CHECK_ROWS, cols, q1, q2, ds), t_p))
                k1, k2, d2, bs = quantize_q8_k256_ref(x[:nc])
                xq, xd, xb = repack_act_int(k1, k2, d2, bs)
                xqi, xdi, xbi = (pool.alloc("scratch", a.nbytes, "xi") for a in (xq, xd, xb))
                for dev, host in ((xqi, xq), (xdi, xd), (xbi, xb)):
                    rt.upload(dev.ptr, host)
                want = reference_int(data, CHECK_ROWS, cols, k1, k2, d2, bs)
                args_i = lambda b: (b.ptr, xqi.ptr, xdi.ptr, xbi.ptr, y.ptr, rows, nb)  # noqa: E731
                err_i = max(err_i, run(f"mvq4k_int_{nc}", args_i, want, t_i))
                if nc in (1, 8):
                    err_i = max(err_i, run(f"mvq4k_int2_{nc}", args_i, want, t_i2))
                if nc == 1:
                    int1_bits = rt.download(y.ptr, (rows,), np.float32).view(np.uint32).copy()
                if nc == 1:  # the same arithmetic on dp4a: the same bits, by integer exactness
                    rt.launch("mvq4k_int_1", rows // 16, 128, args_i(bufs[0]))
                    mma_bits = rt.download(y.ptr, (rows,), np.float32)
                    err_i = max(err_i, run("mvq4k_dp4a_1", args_i, want, t_d))
                    same = bool((rt.download(y.ptr, (rows,), np.float32).view(np.uint32) == mma_bits.view(np.uint32)).all())
            print(f"{rows:5d}x{cols:<6d} {t_e[1]:9.2f} {t_e[8]:5.2f} | {t_p[1]:8.2f} {t_p[2]:5.2f} {t_p[4]:5.2f} "
                  f"{t_p[8]:5.2f} | {t_i[1]:8.2f} {t_i[2]:5.2f} {t_i[4]:5.2f} {t_i[8]:5.2f} | "
                  f"{t_e[8] / t_e[1]:5.2f} {t_p[8] / t_e[1]:5.2f} {t_i[8] / t_e[1]:5.2f} | {err:.1e} {err_i:.1e}  "
                  f"| dp4a c1 {t_d[1]:.2f} ({'same bits as int c1' if same else 'BITS DIFFER from int c1'}; "
                  f"weights at int c1: {packed.nbytes / t_i[1] / 1e3:.0f} GB/s) | two-deep int2 c1 {t_i2[1]:.2f} "
                  f"c8 {t_i2[8]:.2f}", flush=True)
            # the width sweep on the 8-column buffers: verify (int_8) and decode (dp4a_1, column 0) at
            # 4, 8, 16 warps a block; column 0 of int_8 must have int_1's / dp4a_1's bits at the same width
            t_w8, t_w1, same_w = {}, {}, []
            # the engine's k256.cu kernels on its own planes (no repack), q8_k256 rows
            stride = quant_ops.q8_k256_stride(cols)
            xn = pool.alloc("scratch", 16 * stride, "xn")  # the 8 columns twice, for the engine's c16
            rt.upload(xn.ptr, np.tile(q8_k256_bytes(k1, k2, d2, bs, stride), (2, 1)))
            for nw in WIDTHS:
                t8, t1 = {}, {}
                err_i = max(err_i, run(f"mvq4k_int_8_w{nw}", args_i, want, t8, 32 * nw))
                col0 = rt.download(y.ptr, (rows,), np.float32).view(np.uint32).copy()
                err_i = max(err_i, run(f"mvq4k_dp4a_1_w{nw}", args_i, want[:1], t1, 32 * nw))
                dec = rt.download(y.ptr, (rows,), np.float32).view(np.uint32)
                same_w.append(bool((dec == col0).all()) and (nw != 4 or bool((col0 == int1_bits).all())))
                t_w8[nw], t_w1[nw] = t8[8], t1[1]
            print(f"{'':13s} widths w4/w8/w16: int c8 " + " ".join(f"{t_w8[w]:.2f}" for w in WIDTHS)
                  + " | dp4a c1 " + " ".join(f"{t_w1[w]:.2f}" for w in WIDTHS)
                  + f" | c8 column 0 = c1 bits: {same_w} | max rel err {err_i:.1e}", flush=True)
            nw = quant_ops.k256_width(engine[0])
            t_k, bits = {}, {}
            for name, c in ((f"c1_w{nw}", 1), (f"c8_w{nw}", 8), (f"c16_w{nw}", 16)):
                args = lambda w, c=c: (w.q_ptr, w.meta_ptr, xn.ptr, y.ptr, rows, cols, c, stride)  # noqa: E731
                rt.launch(f"matvec_q4_K_k256_{name}", (rows // 16, 1), 32 * nw, args(engine[0]))
                bits[name] = rt.download(y.ptr, (c, rows), np.float32).view(np.uint32).copy()
                t_k[name] = bk.time_graph(rt, [(lambda w=engine[i % len(engine)], name=name, args=args: rt.launch(
                    f"matvec_q4_K_k256_{name}", (rows // 16, 1), 32 * nw, args(w))) for i in range(launches)]) * 1e6
            k_err = float(np.abs(bits[f"c8_w{nw}"].view(np.float32)[:, :CHECK_ROWS] - want).max() / np.abs(want).max())
            same_k = (bool((bits[f"c16_w{nw}"] == np.tile(bits[f"c8_w{nw}"], (2, 1))).all())
                      and bool((bits[f"c8_w{nw}"][0] == bits[f"c1_w{nw}"][0]).all()))
            print(f"{'':13s} ENGINE k256 w{nw}: " + " ".join(f"{k} {v:.2f}" for k, v in t_k.items())
                  + f" | q8_1 engine c1 {t_e[1]:.2f} c8 {t_e[8]:.2f} | c16 = c8 twice bits, col 0 = c1: {same_k} | "
                  f"rel err {k_err:.1e}", flush=True)
            pool.reset("weights")
    finally:
        pool.close()
        rt.close()


if __name__ == "__main__":
    main()
