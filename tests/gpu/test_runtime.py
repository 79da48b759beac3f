"""Runtime, kernel registry, VRAM pool and CUDA graph capture on the device."""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.errors import DeviceError, DeviceOutOfMemory
from memra_engine.gpu.graph import CudaGraph

pytestmark = pytest.mark.gpu


def test_available_reports_the_device():
    from memra_engine.gpu import available

    ok, name = available()
    assert ok, name
    assert name


def test_registry_prepares_declared_kernels_and_rejects_unknown(gpu):
    fn = gpu.rt.kernel("add_f32")
    assert gpu.rt.kernel("add_f32") is fn
    with pytest.raises(DeviceError, match="not declared"):
        gpu.rt.kernel("no_such_kernel")


def test_lookup_during_capture_fails_and_capture_recovers(gpu):
    gpu.rt.kernel("scale_f32")
    graph = CudaGraph()
    with pytest.raises(DeviceError, match="during graph capture"):
        with graph.capture(gpu.rt):
            gpu.rt._kernels.pop("softcap_f32", None)
            gpu.rt.kernel("softcap_f32")
    assert not gpu.rt.capturing
    gpu.rt.kernel("softcap_f32")  # usable again once capture ended


def test_graph_replay_matches_eager_and_sees_new_inputs(gpu):
    rng = np.random.default_rng(0)
    n = 1000
    a = gpu.put(rng.standard_normal(n).astype(np.float32))
    b_host = rng.standard_normal(n).astype(np.float32)
    b = gpu.put(b_host)
    y = gpu.empty(n)
    blocks = -(-n // 256)
    gpu.rt.resolve_all()
    graph = CudaGraph()
    with graph.capture(gpu.rt):
        gpu.rt.launch("add_f32", blocks, 256, (y, a, b, n))
        gpu.rt.launch("scale_f32", blocks, 256, (y, y, np.float32(0.5), n))
    assert graph.n_nodes == 2
    graph.launch(gpu.rt)
    first = gpu.get(y, n)
    a_host = gpu.get(a, n)
    assert np.array_equal(first, (a_host + b_host) * np.float32(0.5))
    new_b = rng.standard_normal(n).astype(np.float32)
    gpu.rt.upload(b, new_b)  # same address, new values: the replay reads them
    graph.launch(gpu.rt)
    assert np.array_equal(gpu.get(y, n), (a_host + new_b) * np.float32(0.5))
    graph.destroy()


def test_pool_stats_and_oom_message(gpu):
    from memra_engine.gpu.memory import VramPool

    pool = VramPool({"weights": 1 << 20, "kv": 2 << 20, "scratch": 1 << 20, "graph": 1 << 16})
    try:
        pool.alloc("kv", 1000, "a")
        stats = pool.stats()
        assert stats.reserved["kv"] == 2 << 20 and stats.used["kv"] == 1000
        assert 0 < stats.device_free <= stats.device_total
        with pytest.raises(DeviceOutOfMemory, match="kv region full.*--ctx"):
            pool.alloc("kv", 3 << 20, "big")
        pool.alloc("kv", 1 << 20, "still fits")  # the failed alloc left the region usable
    finally:
        pool.close()
    with pytest.raises(DeviceOutOfMemory, match="budget"):
        VramPool({"weights": 4 << 20}, budget=1 << 20)
    with pytest.raises(DeviceOutOfMemory, match="cannot reserve"):
        VramPool({"kv": 1 << 50})


def test_replay_timing_grows_with_the_work_in_the_graph(gpu):
    """CudaGraph.replay_us (the benchmarks' timing loop): positive, and a graph of 40 launches
    takes longer per replay than a graph of one."""
    n = 1 << 20
    x = gpu.empty(n, poison=False)
    gpu.rt.resolve_all()
    timings = []
    for count in (1, 40):
        graph = CudaGraph()
        with graph.capture(gpu.rt):
            for _ in range(count):
                gpu.rt.launch("scale_f32", -(-n // 256), 256, (x, x, np.float32(1.0), n))
        timings.append(graph.replay_us(gpu.rt, replays=3))
        graph.destroy()
    assert 0 < timings[0] < timings[1]


def test_load_module_runs_a_kernel_built_outside_cuda_dir(gpu, tmp_path):
    """GpuRuntime.load_module (how scripts/proto/ prototypes launch through the runtime): an outside
    cubin's entry point is launched like the engine's own; a family loads once."""
    import subprocess

    from memra_engine.gpu import build

    nvcc = build.find_nvcc()
    assert nvcc is not None, "the GPU machine has nvcc"
    src, out = tmp_path / "twice.cu", tmp_path / "twice.cubin"
    src.write_text('extern "C" __global__ void twice_f32(float* x, int n) {\n'
                   "    const int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) x[i] *= 2.0f;\n}\n")
    subprocess.run([nvcc, "-cubin", f"-arch={gpu.rt.arch}", "-o", str(out), str(src)], check=True)
    gpu.rt.load_module("test_twice", out.read_bytes(), {"twice_f32": "Pi"})
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    buf = gpu.pool.alloc("scratch", x.nbytes, "x")
    gpu.rt.upload(buf.ptr, x)
    gpu.rt.launch("twice_f32", 1, 64, (buf.ptr, 50))
    got = gpu.rt.download(buf.ptr, (64,), np.float32)
    gpu.rt.check()
    assert np.array_equal(got[:50], 2 * x[:50]) and np.array_equal(got[50:], x[50:])
    with pytest.raises(DeviceError, match="already loaded"):
        gpu.rt.load_module("test_twice", out.read_bytes(), {})
