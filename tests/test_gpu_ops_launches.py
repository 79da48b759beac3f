"""GpuOps and the sampler without a GPU: every launch a forward program makes names a kernel
declared in cuda/*.cu, with the right number and kinds of arguments and legal launch shapes.

A recording runtime stands in for GpuRuntime (as in the backend's dry run), so an argument-list
or kernel-name mismatch between engine/gpu/*.py and cuda/*.cu fails here in CI, not on the device.
Also checks the kernel count per decode step that docs/gpu-engine.md states (8 per llama layer, 9 with a merge launch).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from memra_engine.gpu import build, quant_ops
from memra_engine.gpu.kv_cache import GpuKvCache
from memra_engine.gpu.ops import (ATTN_MAX_SPLITS, ATTN_MAX_SPLITS_CL, Arena, DArray, GpuOps, attention_launch,
                                  attn_max_splits, attn_plan, attn_row_splits, attn_slots, attn_splits,
                                  kv_bucket)
from memra_engine.gpu.sampler import GpuSampler, candidate_passes
from memra_engine.gpu.weights import GpuWeights
from memra_engine.model import arch_module
from memra_engine.model.config import config_from_gguf
from memra_engine.model.gguf_file import open_gguf
from memra_engine.sampling import SamplingParams

SIGNATURES = build.kernel_signatures()
MODELS = {
    "tiny-llama": dict(preset="tiny-llama", head_dim=64, n_head=4, n_kv_head=2, d_model=256),
    "tiny-qwen2": dict(preset="tiny-qwen2", head_dim=64, n_head=4, n_kv_head=2, d_model=256),
    "tiny-qwen3": dict(preset="tiny-qwen3"),
    "tiny-gemma3": dict(preset="tiny-gemma3"),
}


class RecordingRuntime:
    """Checks each launch against the parsed kernel signature instead of launching."""

    max_shared = 227 * 1024  # an H100's opt-in limit

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []  # (kernel, args) in launch order
        self.grids: list[tuple] = []  # each kernel launch's grid, in the same order

    def launch(self, name, grid, block, args, shared=0):
        assert name in SIGNATURES, f"{name} is not declared in cuda/*.cu"
        sig = SIGNATURES[name][1]
        assert len(args) == len(sig), f"{name}: {len(args)} args for signature {sig}"
        for code, arg in zip(sig, args):
            if code == "f":
                assert isinstance(arg, np.float32), f"{name}: float argument passed as {type(arg).__name__}"
            else:
                assert isinstance(arg, (int, np.integer)) and not isinstance(arg, bool), f"{name}: {arg!r} for {code}"
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        block = (block,) if isinstance(block, int) else tuple(block)
        assert all(g >= 1 for g in grid) and grid[0] < 2**31 and all(g < 65536 for g in grid[1:]), (name, grid)
        assert 1 <= int(np.prod(block)) <= 1024 and int(np.prod(block)) % 32 == 0, (name, block)
        assert 0 <= shared <= self.max_shared, (name, shared)
        self.calls.append((name, tuple(args)))
        self.grids.append(grid)

    def clear(self) -> None:
        self.calls.clear()
        self.grids.clear()

    @property
    def launches(self) -> list[str]:
        return [name for name, _ in self.calls]

    def set_max_dynamic_shared(self, name, nbytes):
        assert name in SIGNATURES

    def memset_u32(self, *args):
        pass

    def pinned(self, shape, dtype):
        return np.zeros(shape, dtype)

    def upload_async(self, *args):
        pass

    def copy_async(self, dst, src, nbytes):
        assert dst and src and nbytes > 0
        self.calls.append(("copy", (dst, src, nbytes)))

    def synchronize(self):
        pass


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    root = tmp_path_factory.mktemp("models")
    return {name: write_synthetic_gguf(root / f"{name}.gguf", **kw) for name, kw in MODELS.items()}


def run_forward(path, T: int, n_ctx: int = 300, cluster: bool = False, kv_type: str = "f16",
                rt: "RecordingRuntime | None" = None, moe_log: tuple[int, int] = (0, 0),
                arena: Arena | None = None, dry_max_shared: int | None = None, k256: bool = False) -> list[str]:
    """One forward of T tokens on a recording runtime (its launches returned), or with
    dry_max_shared on ops' own stand-in runtime for a device of that much shared memory, as the
    backend sizes its scratch (no launches to return)."""
    g = open_gguf(path)
    cfg = config_from_gguf(g)
    weights = GpuWeights(g, cfg).upload(None, None, dry=True)
    kv = GpuKvCache(None, cfg.n_layer, cfg.n_kv_head, n_ctx, cfg.head_dim, kv_type)
    ops = GpuOps(None, cfg, kv, arena or Arena.unbounded(), dry=True, cluster=cluster,
                 max_shared=dry_max_shared or quant_ops.SM90_SHARED, k256_outputs=k256)
    if dry_max_shared is None:
        rt = ops.rt = rt or RecordingRuntime()
    ops.moe_log_ptr, ops.moe_log_tokens = moe_log
    ops.begin(attn_splits(kv_bucket(n_ctx), cfg.head_dim, cluster, kv_type), history_ptr=4096,
              prefill_splits=attn_splits(kv_bucket(n_ctx), cfg.head_dim, False, kv_type))
    ids = DArray(1 << 20, (T,), 1)
    arch_module(cfg.arch).forward(ops, weights, cfg, ids, ids, last_only=T == 1)
    ops.flush()
    return [] if dry_max_shared else rt.launches


@pytest.mark.parametrize("T", [1, 300])
def test_dry_forward_runs_on_the_stand_in_runtime(model_paths, T):
    """The backend sizes its scratch with a dry forward on ops' own stand-in runtime, which must
    answer everything a forward asks of GpuRuntime (a GEMM prefill's tile choice reads max_shared)."""
    arena = Arena.unbounded()
    run_forward(model_paths["tiny-llama"], T, n_ctx=512, arena=arena, dry_max_shared=quant_ops.SM90_SHARED)
    assert max(arena.peaks) > 0


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("T", [1, 5, 40])  # decode, batched-matvec verify, GEMM prefill
def test_every_launch_matches_its_kernel(model_paths, name, T):
    launches = run_forward(model_paths[name], T)
    assert launches[0].startswith("embed_")
    assert any(n.startswith("attn_hd") or n.startswith("attn_prefill_hd") for n in launches)


def test_decode_is_nine_kernels_per_llama_layer(model_paths):
    launches = run_forward(model_paths["tiny-llama"], 1)
    n_layer = 2
    # embed, the first layer's norm and the LM head, then per layer: qkv with rope and the KV
    # write, attention, merge (the 300-token bucket has several splits), o, add+norm, gate_up,
    # silu, down, add+next norm
    per_layer = (len(launches) - 3) / n_layer
    assert per_layer == 9, launches
    assert sum(n.startswith("attn_merge_") for n in launches) == n_layer
    assert sum(n.endswith("_qkv_rope") for n in launches) == n_layer
    assert not any(n.startswith(("rope_", "kv_write_", "add_bias_", "quantize_q8_1", "add_f32")) for n in launches)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("T", [1, 5, 40])
def test_qkv_rope_fusion_takes_decode_and_verify_rows_without_qk_norm(model_paths, name, T):
    """matvec_qkv_rope replaces qkv matvec (+ bias) + rope_qk_kv for llama/qwen2 decode and verify
    rows (one launch, a token per grid row: the small weights of these models stay in L2);
    prefill batches and q/k-normed archs (qwen3, gemma3) keep rope_qk_kv."""
    rt = RecordingRuntime()
    launches = run_forward(model_paths[name], T, rt=rt)
    fused = T <= 16 and name in ("tiny-llama", "tiny-qwen2")
    if fused:
        grids = [g for (n, _), g in zip(rt.calls, rt.grids) if n.endswith("_qkv_rope")]
        assert all(len(g) == 2 and g[1] == T for g in grids), grids
    n_layer = sum(n.startswith("attn_hd") or n.startswith("attn_prefill_hd") for n in launches)
    assert sum(n.endswith("_qkv_rope") for n in launches) == (n_layer if fused else 0), launches
    assert sum(n.startswith("rope_qk_kv_") for n in launches) == (0 if fused else n_layer), launches
    if name == "tiny-qwen2":
        assert ("add_bias_f32" in launches) != fused


@pytest.mark.parametrize("T", [1, 16, 17, 40])
def test_prefill_ropes_a_few_heads_a_block_decode_one(model_paths, T):
    """rope_qk_kv: decode and verify rows (up to 16 tokens) a head a block; prefill PREFILL_ROPE_HEADS
    of a token's heads a block (their angles once), every head covered."""
    from memra_engine.gpu.ops import PREFILL_ROPE_HEADS

    rt = RecordingRuntime()
    run_forward(model_paths["tiny-qwen3"], T, rt=rt)
    ropes = [(args, g) for (n, args), g in zip(rt.calls, rt.grids) if n.startswith("rope_qk_kv_")]
    assert ropes
    hpb = 1 if T <= 16 else PREFILL_ROPE_HEADS
    for args, grid in ropes:
        n_heads = args[8] + args[9]  # n_q + n_kv
        assert args[-1] == hpb and grid == (-(-n_heads // hpb), T), (args, grid)


def test_qkv_rope_fusion_writes_f16_caches_only(model_paths):
    """The fused epilogue writes f16 rows; a q8_0 cache keeps rope_qk_kv (block scales)."""
    launches = run_forward(model_paths["tiny-llama"], 1, kv_type="q8_0")
    assert not any(n.endswith("_qkv_rope") for n in launches)
    assert launches.count("rope_qk_kv_q8_0") == 2


def test_cluster_attention_merges_in_the_cluster_until_rows_need_several(model_paths):
    """sm_90+: splits merge inside their cluster, so a decode step whose rows fit one cluster
    (head dim 64, f16 cache: clusters of 16, up to 8192 keys) has no merge launch; past that,
    attn_cl_merge merges the clusters' partials."""
    short = run_forward(model_paths["tiny-llama"], 1, n_ctx=300, cluster=True)
    assert sum(n.startswith("attn_cl_hd64") for n in short) == 2
    assert not any("merge" in n for n in short)
    assert (len(short) - 3) / 2 == 8
    mid = run_forward(model_paths["tiny-llama"], 1, n_ctx=8192, cluster=True)
    assert not any("merge" in n for n in mid)
    long = run_forward(model_paths["tiny-llama"], 1, n_ctx=9000, cluster=True)
    assert sum(n.startswith("attn_cl_merge_hd64_g") and n.endswith("_f16") for n in long) == 2
    assert attn_splits(kv_bucket(4096), 64, cluster=True) == 16 and attn_splits(kv_bucket(100), 256, cluster=True) == 8
    assert attn_splits(kv_bucket(4096), 256, cluster=True) == 64 and attn_splits(kv_bucket(9000), 64, cluster=True) == 32
    assert attn_splits(kv_bucket(4096), 64, True, "q8_0") == 32  # attn_rows: clusters of 8, splits of 2 chunks


def test_cluster_split_rule():
    """attention.cu's cluster rule: a row's chunks spread evenly over one cluster while a split walks
    at most cl_chunks; past that, splits of cl_chunks over several clusters (at most 64 splits)."""
    assert attn_plan(64).cluster == 16 and attn_plan(64, "q8_0").cluster == 8 and attn_plan(256).cluster == 8
    assert attn_row_splits(4224, 64, True) == 14  # 66 chunks: 14 splits of 5 (the tg128-at-4096 rows)
    assert attn_row_splits(8192, 64, True) == 16 and attn_row_splits(8193, 64, True) == 17
    assert attn_row_splits(512, 256, True) == 8 and attn_row_splits(700, 256, True) == 11
    assert attn_row_splits(4224, 256, True) == 44  # 132 chunks: splits of 3 (64 at most)
    assert attn_row_splits(10**6, 64, True) <= 64 and attn_row_splits(10**6, 256, True) <= 64
    for n in range(1, 20_000, 7):
        for hd, kv in ((64, "f16"), (64, "q8_0"), (256, "f16")):
            plan, chunks = attn_plan(hd, kv), -(-n // (64 if hd == 64 else 32))
            splits = attn_row_splits(n, hd, True, kv)
            if chunks <= plan.cluster * plan.cl_chunks:  # one cluster, splits within one chunk of each other
                assert splits <= plan.cluster and -(-chunks // splits) <= plan.cl_chunks, (n, hd, kv)


def test_a_split_cap_bounds_long_rows(monkeypatch):
    """A model's cap (attn_max_splits) bounds a long row's splits on the cluster path, clamped to one
    cluster .. 64; short rows and the split path ignore it; MEMRA_ATTN_MAX_SPLITS sets it."""
    assert attn_row_splits(4224, 128, True) == 44  # 132 chunks of 32: splits of 3
    assert attn_row_splits(4224, 128, True, "f16", 40) == 33  # splits of 4
    assert attn_row_splits(4224, 128, True, "f16", 32) == 27  # splits of 5
    assert attn_row_splits(4224, 128, True, "f16", 1) == attn_row_splits(4224, 128, True, "f16", 8) == 8
    assert attn_row_splits(4224, 128, True, "f16", 500) == 44
    assert attn_row_splits(200, 128, True, "f16", 8) == attn_row_splits(200, 128, True)
    assert attn_row_splits(4224, 128, False, "f16", 8) == attn_row_splits(4224, 128, False)
    for cap in (8, 24, 40, 64):
        for n in range(1, 20_000, 13):
            assert attn_row_splits(n, 128, True, "f16", cap) <= max(cap, 8)
        assert attn_splits(kv_bucket(8192), 128, True, "f16", cap) % 8 == 0
    # the models' caps: 40 splits where a row's clusters over all kv heads would pass 40 (the 8B,
    # qwen3-moe, qwen3), the most for few kv heads (gemma3) and for hd64 f16 (clusters of 16)
    assert attn_max_splits(8, 4, 128) == 40 and attn_max_splits(4, 8, 128) == 40 and attn_max_splits(8, 2, 128) == 40
    assert attn_max_splits(1, 4, 256) == 64 and attn_max_splits(4, 2, 256) == 64 and attn_max_splits(8, 4, 64) == 64
    assert attn_max_splits(16, 4, 128) == 16 and attn_max_splits(64, 1, 128) == 8 and attn_max_splits(8, 4, 64, "q8_0") == 40
    monkeypatch.setenv("MEMRA_ATTN_MAX_SPLITS", "24")
    assert attn_max_splits(8, 4, 128) == 24


@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("hd,kv_type", [(64, "f16"), (64, "q8_0"), (128, "f16"), (256, "f16")])
def test_attention_grid_covers_every_row_of_its_bucket(hd, kv_type, cluster):
    """A graph captured for a KV bucket serves every row up to it: its grid.y must cover each
    row's split count (whole clusters on the cluster path), and the partial slots that many."""
    cs = attn_plan(hd, kv_type).cluster
    for cap in (ATTN_MAX_SPLITS_CL, 40, 16):  # the models' caps (attn_max_splits)
        for n in list(range(1, 3000)) + list(range(3000, 140_000, 997)):
            S = attn_splits(kv_bucket(n), hd, cluster, kv_type, cap)
            need = attn_row_splits(n, hd, cluster, kv_type, cap)
            assert need <= S, (n, need, S)
            if cluster:
                assert S % cs == 0 and attn_slots(S, True, hd, kv_type) * cs >= need
                assert attn_slots(S, True, hd, kv_type) <= 8  # attn_cl_merge merges at most 8


@pytest.mark.parametrize("cluster", [False, True])
def test_attention_group_tile_follows_the_grid(cluster):
    """An hd128 group of 8 heads (qwen3-moe: 32 over 4 kv heads) runs in 4-head blocks while 8-head
    blocks would leave the grid under ops.ATTN_SMALL_GRID blocks (decode rows up to a 2,048-key
    bucket on the cluster path), in 8-head blocks past it (a 4,096-key bucket; a verify pass of 16
    rows); hd64 groups keep 8-head blocks."""
    def launched(hd, n_keys, T=1, H=32, n_kv=4):
        rt = RecordingRuntime()
        S = attn_splits(kv_bucket(n_keys), hd, cluster)
        attention_launch(rt, 0x1000, H * hd, 0x2000, 0x3000, 0, 0, 0x4000, 0x5000, 0x6000, T, H, n_kv, hd, 8192,
                         0, np.float32(0.1), 0.0, 0x7000, 0, 0, S, "f16", cluster)
        (name, _), *_ = rt.calls
        return name.split("_")[-2], rt.grids[0][0]
    assert launched(128, 128) == ("g4", 8)
    assert launched(128, 2048) == ("g4", 8)
    # the split path's 32 splits at most keep 4 kv heads' grid at 128 blocks of 8 heads
    assert launched(128, 4096) == (("g8", 4) if cluster else ("g4", 8))
    assert launched(128, 128, T=16) == ("g8", 4)
    assert launched(64, 128) == ("g8", 4)
    assert launched(128, 128, H=32, n_kv=8) == ("g4", 8)  # the 8B's group of 4: unchanged


@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("hd,kv_type", [(64, "f16"), (64, "q8_0"), (256, "f16")])
def test_attention_grid_of_a_sliding_window_covers_its_rows(hd, kv_type, cluster):
    """A sliding-window layer takes the grid of its window (GpuOps.attention): every row of at
    most `window` keys must fit it, for windows that are not powers of two too."""
    for window in (16, 300, 512, 700, 2112, 4096, 5000):
        S = attn_splits(window, hd, cluster, kv_type)
        assert S <= attn_splits(kv_bucket(window), hd, cluster, kv_type)
        for n in range(1, window + 1):
            assert attn_row_splits(n, hd, cluster, kv_type) <= S, (window, n)


@pytest.mark.parametrize("cluster", [False, True])
def test_sliding_window_layers_need_no_merge_launch(model_paths, cluster):
    """gemma3 at a long context: only the global layers' rows have several partials, so only they
    launch a merge. (Every layer used to launch one, and a merge launch whose blocks all had
    nothing to do also broke the PDL chain: see attention.cu's attn_merge_rows.)"""
    cfg = config_from_gguf(open_gguf(model_paths["tiny-gemma3"]))
    n_global = sum(not cfg.is_sliding(layer) for layer in range(cfg.n_layer))
    assert 0 < n_global < cfg.n_layer
    launches = run_forward(model_paths["tiny-gemma3"], 1, n_ctx=4096, cluster=cluster)
    merge = "attn_cl_merge_hd256" if cluster else "attn_merge_hd256"
    assert sum(n.startswith(merge) for n in launches) == n_global, launches
    assert sum(n.startswith("attn_cl_hd256" if cluster else "attn_hd256") for n in launches) == cfg.n_layer


def test_sampler_launches_match_their_kernels():
    rt = RecordingRuntime()

    class Pool:
        def alloc(self, region, nbytes, name=""):
            return type("Buf", (), {"ptr": 1 << 30})()

    for vocab in (384, 49152, 262144, 300000):
        sampler = GpuSampler(rt, Pool(), vocab)
        assert sampler.n_blocks * sampler.local_k <= 8192
        sampler.launch(1 << 20, 1 << 21, 1 << 22, 1 << 23, 1 << 23 + 4)
    assert rt.launches.count("sample_finish") == 4
    assert "sample_candidates" not in rt.launches
    # candidates on: the raw copy and its stage-1 pass first, the penalised pass and
    # sample_candidates after the draw, the cuts written next to the token
    rt.calls.clear()
    sampler.set_params(SamplingParams(top_logprobs=10))
    sampler.launch(1 << 20, 1 << 21, 1 << 22)
    assert rt.launches == ["copy", "sample_stage1", "sample_penalize", "sample_stage1", "sample_finish",
                           "sample_stage1", "sample_candidates"]
    finish = dict(rt.calls)["sample_finish"]
    assert finish[-1] == sampler.out_ptr + 8
    # which candidates passes do work (the others return at once): default knobs reuse the draw's
    # sorted list; penalties, a mask, greedy or a top_k below n need the raw pass; plain
    # temperature draws the penalised one
    def passes(use_mask=False, **knobs):
        return candidate_passes(SamplingParams(top_logprobs=10, **knobs), 49152, use_mask)
    assert passes() == (False, False)
    assert passes(top_k=0) == (False, False)
    assert passes(repeat_penalty=1.1) == (True, False)
    assert passes(repeat_penalty=1.1, repeat_last_n=0) == (False, False)
    assert passes(use_mask=True) == (True, False)
    assert passes(temperature=0.0) == (True, False)
    assert passes(top_k=5) == (True, False)
    assert passes(top_k=0, top_p=1.0, min_p=0.0) == (True, True)
    sampler.set_params(SamplingParams(top_logprobs=10, repeat_penalty=1.1))
    assert sampler._cand_params_host["skip"].tolist() == [0, 1] and sampler._params_host["cand_reuse"][0] == 0
    sampler.set_params(SamplingParams(top_logprobs=10))
    assert sampler._cand_params_host["skip"].tolist() == [1, 1] and sampler._params_host["cand_reuse"][0] == 1
    # a verify row's slot (out_ptr given) has room for the token only: no candidates there
    rt.calls.clear()
    sampler.launch(1 << 20, 1 << 21, 1 << 22, out_ptr=1 << 24)
    assert "sample_candidates" not in rt.launches and dict(rt.calls)["sample_finish"][-1] == 0


def test_a_verify_pass_samples_its_rows_in_one_launch_each():
    """launch_rows: penalize, stage 1 and finish once for all rows (row = the grid's second
    dimension), then the counter moves past the rows; no decode step state, no candidates."""
    rt = RecordingRuntime()

    class Pool:
        def alloc(self, region, nbytes, name=""):
            return type("Buf", (), {"ptr": 1 << 30})()

    sampler = GpuSampler(rt, Pool(), 49152)
    for rows in (1, 9, 16):
        rt.clear()
        sampler.launch_rows(1 << 20, 1 << 21, 1 << 22, 1 << 23, 1 << 24, rows)
        expected = ["sample_penalize", "sample_stage1", "sample_finish"] + (["sample_advance"] if rows > 1 else [])
        assert rt.launches == expected
        assert [g[1] if len(g) > 1 else 1 for g in rt.grids[:3]] == [rows] * 3
        assert rt.grids[1][0] == sampler.n_blocks
        finish = dict(rt.calls)["sample_finish"]
        assert finish[-4:] == (0, 0, 1 << 24, 0)  # token_io, pos_io, out, cand
        if rows > 1:
            assert dict(rt.calls)["sample_advance"] == (sampler.params_ptr, rows)
    with pytest.raises(ValueError):
        sampler.launch_rows(1 << 20, 1 << 21, 1 << 22, 1 << 23, 1 << 24, 17)


@pytest.mark.parametrize("T", [1, 40])
def test_gemma3_embedding_scale_rides_on_the_embed_launch(model_paths, T):
    """gemma3 scales the embedding by sqrt(d_model): the embed kernel's scale argument, not a
    scale_f32 launch (the GPU backend tests compare the logits with the CPU reference)."""
    launches = run_forward(model_paths["tiny-gemma3"], T)
    assert launches[0].startswith("embed_") and "scale_f32" not in launches


def test_moe_unit_values_mirror_quants_cuh():
    """moe.unit_values restates each type's T::UE (quants.cuh): the half-warp expert matvec is
    picked by a row's unit count, so a drift would put rows of more than 16 units in half-warps."""
    from memra_engine.gpu import moe

    src = (Path(__file__).parents[1] / "cuda" / "quants.cuh").read_text()
    ue = dict(re.findall(r"struct (\w+)_t \{[^\n]*\n\s*static constexpr int [^;]*UE = (\d+);", src))
    quant = {kind for kind, _, _ in quant_ops.QUANT_PLANES.values()}
    assert quant <= set(ue), quant - set(ue)
    for kind in quant:
        assert moe.unit_values(kind) == int(ue[kind]), kind


def test_attention_plan_mirrors_attention_cu():
    """ops.attn_plan and the split constants are attention.cu's, restated: the grid and the
    partial buffers are sized from them, so a drift would launch too few blocks."""
    src = (Path(__file__).parents[1] / "cuda" / "attention.cu").read_text()
    defines = {k: int(v) for k, v in re.findall(r"#define (ATTN_\w+) (\d+)", src)}
    assert defines["ATTN_MAX_SPLITS"] == ATTN_MAX_SPLITS and defines["ATTN_MAX_SPLITS_CL"] == ATTN_MAX_SPLITS_CL
    assert defines["ATTN_THREADS"] == attn_plan(128).threads
    mma, other = attn_plan(64), attn_plan(64, "q8_0")
    assert attn_plan(256) == other and attn_plan(128) == other
    for fn, a, b in (("attn_threads", mma.threads, "ATTN_THREADS"), ("attn_cluster", mma.cluster, other.cluster),
                     ("attn_cl_chunks", mma.cl_chunks, other.cl_chunks)):
        assert f"constexpr int {fn}(int hd, bool q8) {{ return attn_mma(hd, q8) ? {a} : {b}; }}" in src, fn
    assert "constexpr bool attn_mma(int hd, bool q8) { return hd == 64 && !q8; }" in src


def test_prefill_takes_the_split_path_where_clusters_are_on(model_paths, monkeypatch):
    """Decode and verify rows (up to BATCHED_MATVEC_MAX tokens) attend in clusters; a prefill
    forward takes attn_prefill (tensor cores, one launch a layer, no merge), and with
    MEMRA_PREFILL_ATTN=0 or a q8_0 cache the split path (a 16-block cluster per row made prefill
    2x slower), with the grid of begin's prefill_splits and attn_merge for rows of several splits."""
    for T in (1, 5, 16):
        launches = run_forward(model_paths["tiny-llama"], T, n_ctx=300, cluster=True)
        assert sum(n.startswith("attn_cl_hd64") for n in launches) == 2, T
        assert not any(n.startswith("attn_prefill") for n in launches)
    launches = run_forward(model_paths["tiny-llama"], 40, n_ctx=300, cluster=True)
    assert launches.count("attn_prefill_hd64") == 2
    assert not any(n.startswith("attn_cl") or n.startswith("attn_hd") or "merge" in n for n in launches)
    for kv_type, switch in (("f16", "0"), ("q8_0", "1")):
        monkeypatch.setenv("MEMRA_PREFILL_ATTN", switch)
        launches = run_forward(model_paths["tiny-llama"], 40, n_ctx=300, cluster=True, kv_type=kv_type)
        assert not any(n.startswith("attn_cl") or n.startswith("attn_prefill") for n in launches)
        assert sum(n.startswith("attn_hd64") for n in launches) == 2
        assert sum(n.startswith("attn_merge_hd64") for n in launches) == 2


def test_prefill_gemms_read_f16_copies_their_producers_wrote(model_paths):
    """A prefill forward's pipelined GEMMs read x as f16: the attention output's and the gated
    activation's copies are written by attn_prefill and silu_mul themselves, so only the two norms'
    outputs a layer take an f32_to_f16_rows launch (one each, shared by q|k|v and gate, up), and
    the final norm's for the LM head over every row (this forward keeps all rows' logits)."""
    rt = RecordingRuntime()
    run_forward(model_paths["tiny-llama"], 40, rt=rt)
    written = {}
    for kernel, args in rt.calls:
        if kernel == "f32_to_f16_rows":
            written[args[1]] = kernel
        elif kernel.startswith("attn_prefill_hd") and args[13]:
            written[args[13]] = kernel
        elif kernel == "silu_mul_f32" and args[7]:
            written[args[7]] = kernel
    gemms = [(kernel, args) for kernel, args in rt.calls if kernel.startswith(("gemm3_", "gemm4_"))]
    assert len(gemms) >= 4 * 2, "q|k|v, o, gate|up (or gate, up) and down, two layers"
    readers = [written.get(args[2]) for _, args in gemms]
    assert None not in readers, "a GEMM read an f16 copy that nothing wrote"
    assert {"attn_prefill_hd64", "silu_mul_f32"} <= set(readers)
    assert [k for k, _ in rt.calls].count("f32_to_f16_rows") == 2 * 2 + 1


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_attention_partials_are_one_buffer_per_forward(model_paths, name, monkeypatch):
    """Every layer's attention writes its partials to the same opart/ml pair (a layer's are merged
    before the next layer's attention starts), so the scratch arena does not grow with the layer
    count: a 30-layer prefill on the split path once took 1.7 GB. Sliding-window layers, with
    fewer splits, share it too. (hd64 prefill takes attn_prefill, which has no partials: the split
    path is forced here.)"""
    monkeypatch.setenv("MEMRA_PREFILL_ATTN", "0")
    g = open_gguf(model_paths[name])
    cfg = config_from_gguf(g)
    weights = GpuWeights(g, cfg).upload(None, None, dry=True)
    kv = GpuKvCache(None, cfg.n_layer, cfg.n_kv_head, 4096, cfg.head_dim, "f16")
    rt = RecordingRuntime()
    ops = GpuOps(None, cfg, kv, Arena.unbounded(), dry=True, cluster=True)
    ops.rt = rt
    ops.begin(attn_splits(4096, cfg.head_dim, True), prefill_splits=attn_splits(4096, cfg.head_dim, False))
    ids = DArray(1 << 20, (40,), 1)
    arch_module(cfg.arch).forward(ops, weights, cfg, ids, ids, last_only=True)
    ops.flush()
    parts = {(args[6], args[7]) for kernel, args in rt.calls if kernel.startswith("attn_hd")}
    assert cfg.n_layer >= 2 and len(parts) == 1


MOE_MODELS = {  # head_dim 64: the GPU attention kernels' smallest
    "tiny-qwen3moe": dict(preset="tiny-qwen3moe", head_dim=64),
    "tiny-mixtral": dict(preset="tiny-mixtral", head_dim=64, n_head=4, n_kv_head=2, d_model=256),
    "tiny-olmoe": dict(preset="tiny-olmoe", head_dim=64, quant="Q4_0"),
}


@pytest.fixture(scope="module")
def moe_paths(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    root = tmp_path_factory.mktemp("moe")
    return {name: write_synthetic_gguf(root / f"{name}.gguf", **kw) for name, kw in MOE_MODELS.items()}


@pytest.mark.parametrize("forced", [None, "gemm4", "gemm7"])
def test_moe_prefill_gemm_tiles_cover_every_slot_tile_of_every_expert(moe_paths, monkeypatch, forced):
    """The MoE prefill GEMM: moe_gemm7 (128-slot tiles, grid (slot tiles, row tiles, experts), 384
    threads) where it fits, moe_gemm4 (grid (row tiles, 64-slot tiles, experts), 128 threads) when
    MEMRA_MOE_GEMM forces it; either grid covers T slots of one expert (no expert has more: a
    token's experts are distinct) and every row of the weight."""
    if forced:
        monkeypatch.setenv("MEMRA_MOE_GEMM", forced)
    T = 300
    rt = RecordingRuntime()
    run_forward(moe_paths["tiny-qwen3moe"], T, n_ctx=512, rt=rt)
    cfg = config_from_gguf(open_gguf(moe_paths["tiny-qwen3moe"]))
    tile = forced or "gemm7"
    gemms = [(name, grid) for (name, _), grid in zip(rt.calls, rt.grids) if name.startswith("moe_gemm")]
    assert len(gemms) == 2 * cfg.n_layer and all(n.startswith(f"moe_{tile}_") for n, _ in gemms)
    slots = {"gemm7": 128, "gemm4": 64}[tile]
    for (name, grid), rows in zip(gemms, [2 * cfg.d_ff_expert, cfg.d_model] * cfg.n_layer):
        slot_tiles, row_tiles = (grid[0], grid[1]) if tile == "gemm7" else (grid[1], grid[0])
        assert slot_tiles * slots >= T > (slot_tiles - 1) * slots, (name, grid)
        assert row_tiles * 128 >= rows > (row_tiles - 1) * 128 and grid[2] == cfg.n_expert, (name, grid)


@pytest.mark.parametrize("name", list(MOE_MODELS))
@pytest.mark.parametrize("T", [1, 5, 40])
def test_moe_layers_route_on_the_device(moe_paths, name, T):
    """Per layer: the router matmul, moe_topk, then for up to 16 tokens one expert matvec for
    gate|up and one for down over all T * top_k slots, and for prefill moe_sort and one grouped
    tensor-core GEMM each; silu, and moe_combine; no host round trip in between."""
    launches = run_forward(moe_paths[name], T)
    cfg = config_from_gguf(open_gguf(moe_paths[name]))
    assert launches.count("moe_topk") == launches.count("moe_combine") == cfg.n_layer
    if T <= 16:
        assert sum(n.startswith("moe_matvec_") for n in launches) == 2 * cfg.n_layer
        assert "moe_sort" not in launches and not any(n.startswith("moe_gemm") for n in launches)
    else:
        assert launches.count("moe_sort") == cfg.n_layer
        # gemm7's warp-specialized tile (227 KB here), after one f16 copy each of x and of the
        # gated activation
        assert sum(n.startswith("moe_gemm7_") for n in launches) == 2 * cfg.n_layer
        assert not any(n.startswith("moe_matvec_") for n in launches)
    # the F32 router never takes the f16 GEMM (close calls between experts would flip): f32
    # matvecs up to 16 tokens, the f32 GEMM (sgemm_f32, one launch a layer) beyond
    f32_matvecs = sum(launches.count(f"matvec_f32_c{c}") for c in (1, 2, 4, 8, 16))
    if T <= 16:
        assert f32_matvecs >= cfg.n_layer and "sgemm_f32" not in launches
    else:
        assert launches.count("sgemm_f32") == cfg.n_layer and f32_matvecs == 0
    assert not any(n.startswith("gemm") and n.endswith("_f32") for n in launches)


def test_short_expert_rows_take_half_warps():
    """Rows of at most 16 units (the down of an FFN-768 expert: 12 K-quant units of 64 values) run
    in half-warps (moe_matvec_<type>_r4h: 32 rows a block); longer rows keep r4u1 (16 rows a block)."""
    from types import SimpleNamespace

    from memra_engine.gpu import moe

    def launched(kind, rows, cols):
        rt = RecordingRuntime()
        stack = SimpleNamespace(rows=rows, cols=cols, layout=SimpleNamespace(kernel_type=kind), table_ptr=0x1000,
                                meta_offset=64)
        moe.expert_matvec(rt, stack, 0x2000, 0x3000, 0x4000, 8, 8, True)
        (name, _), = rt.calls
        return name, rt.grids[0]
    assert launched("q4_K", 2048, 768) == ("moe_matvec_q4_K_r4h", (64, 8))
    assert launched("q6_K", 2048, 1024) == ("moe_matvec_q6_K_r4h", (64, 8))
    assert launched("q4_K", 1536, 2048) == ("moe_matvec_q4_K_r4u1", (96, 8))
    assert launched("q8_0", 2048, 768) == ("moe_matvec_q8_0_r4u1", (128, 8))  # 24 units of 32
    assert launched("q8_0", 2048, 512) == ("moe_matvec_q8_0_r4h", (64, 8))


@pytest.mark.parametrize("T", [1, 5, 40])
def test_the_routing_log_of_a_forward_is_one_block(moe_paths, T):
    """moe_topk writes layer l's ids at log + 4 * k * T * l: the forward's n_layer * T * k ids in
    one block, which is all the expert cache downloads after a step (engine/gpu/expert_cache.py)."""
    rt, base = RecordingRuntime(), 1 << 36
    run_forward(moe_paths["tiny-qwen3moe"], T, rt=rt, moe_log=(base, 64))
    cfg = config_from_gguf(open_gguf(moe_paths["tiny-qwen3moe"]))
    logs = [args[3] for kernel, args in rt.calls if kernel == "moe_topk"]
    assert logs == [base + 4 * cfg.n_expert_used * T * layer for layer in range(cfg.n_layer)]


class PoisoningArena(Arena):
    """Never reuses an address: begin_layer leaves what the emptied part held dead (with the
    launch count at that moment) and allocates past it. A launch that reads or writes a dead
    range is a use after free that the real arena would turn into another array's bytes."""

    def __init__(self, rt: RecordingRuntime):
        super().__init__(0, [1 << 56] * Arena.PARTS)
        self.rt, self.dead, self.since = rt, [], [0] * Arena.PARTS

    def begin_layer(self, layer: int) -> tuple[int, int]:
        self.part = k = 1 + layer % 2
        freed = (self.starts[k] + self.since[k], self.starts[k] + self.used[k])
        self.dead.append((*freed, len(self.rt.calls)))
        self.since[k] = self.used[k]
        return freed

    def violations(self) -> list[str]:
        out = []
        for i, (name, args) in enumerate(self.rt.calls):
            for code, arg in zip(SIGNATURES[name][1], args):
                if code == "P" and any(lo <= arg < hi and died <= i for lo, hi, died in self.dead):
                    out.append(f"launch {i} {name} reads a dead layer's scratch")
        return out


@pytest.fixture(scope="module")
def four_layer_paths(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    root = tmp_path_factory.mktemp("four")
    return {name: write_synthetic_gguf(root / f"{name}.gguf", **{**kw, "n_layer": 4})
            for name, kw in {**MODELS, **MOE_MODELS}.items()}


@pytest.mark.parametrize("name", [*MODELS, *MOE_MODELS])
@pytest.mark.parametrize("T,cluster", [(1, True), (1, False), (5, True), (40, False)])
def test_no_launch_touches_the_scratch_of_a_layer_two_back(four_layer_paths, name, T, cluster):
    """The arena's layer parts alternate (Ops.begin_layer): every layer may only touch its own,
    the previous layer's and the forward-wide scratch. Checked at every launch of a 4-layer
    forward, decode (graph and cluster attention), verify rows and GEMM prefill."""
    rt = RecordingRuntime()
    arena = PoisoningArena(rt)
    poisoned = run_forward(four_layer_paths[name], T, cluster=cluster, rt=rt, arena=arena)
    assert len(arena.dead) == 4 and any(hi > lo for lo, hi, _ in arena.dead[2:])
    assert arena.violations() == []
    # with addresses reused, nothing cached about a dead array (a q8_1 copy) is found again for
    # a new one at its address: the same launches as when no address repeats
    assert run_forward(four_layer_paths[name], T, cluster=cluster) == poisoned


def test_the_scratch_holds_two_layers_not_all(four_layer_paths):
    """Part 0 holds what comes before the first layer and the forward-wide buffers; each layer
    part holds one layer's intermediates whatever the number of layers."""
    from memra_engine.model.synthetic import write_synthetic_gguf

    peaks = {}
    for n_layer in (2, 6):
        path = write_synthetic_gguf(four_layer_paths["tiny-llama"].with_name(f"l{n_layer}.gguf"),
                                    **{**MODELS["tiny-llama"], "n_layer": n_layer})
        arena = Arena.unbounded()
        run_forward(path, 40, arena=arena)
        peaks[n_layer] = arena.peaks
    assert peaks[2] == peaks[6] and all(peaks[2])


def test_wide_rows_add_and_norm_over_several_blocks(tmp_path):
    """At d = 2048 (the 1B shape; 4096 on the 8B) decode and verify rows take the split add + norm
    (n / 256 blocks a row, norm.cu), which needs h apart from a and b; prefill keeps one block a row."""
    from memra_engine.model.synthetic import write_synthetic_gguf

    path = write_synthetic_gguf(tmp_path / "wide.gguf", preset="tiny-llama", d_model=2048, head_dim=64, n_head=32,
                                n_kv_head=8, d_ff=256)
    for T, split in ((1, True), (5, True), (16, True), (40, False)):
        rt = RecordingRuntime()
        run_forward(path, T, rt=rt)
        norms = [(name, args) for name, args in rt.calls if name.startswith("add_rms_norm")]
        assert norms and all(name == ("add_rms_norm_split_f32" if split else "add_rms_norm_f32") for name, _ in norms), T
        assert all(args[0] not in (args[1], args[2]) for _, args in norms)


def test_verify_matvecs_slice_short_rows_in_pairs_of_columns(monkeypatch):
    """Verify columns over the grid's second dimension (quant_ops.verify_slice): weights with rows
    shorter than 2048 in slices of 2 (the small models, where a warp's column loop is the
    latency), longer ones unsliced (the weight read once: Q4_K on the tensor cores, 16 columns
    past 8); MEMRA_VERIFY_SLICE forces a slice (the kernel offsets each slice's x and y itself)."""
    from gguf.constants import GGMLQuantizationType as QT

    from memra_engine.gpu import quant_ops

    rt = RecordingRuntime()
    buf = type("Buf", (), {"ptr": 1 << 30})()

    def weight(t, rows, cols):
        return quant_ops.GpuWeight(t, rows, cols, buf, quant_ops.weight_layout(t, rows, cols))

    def launched(w, n):
        rt.clear()
        quant_ops.matvec(rt, w, 1 << 20, 1 << 21, 1 << 22, n, slice_columns=quant_ops.verify_slice(w))
        return [(name, args[-2], g[1] if len(g) > 1 else 1) for (name, args), g in zip(rt.calls, rt.grids)]

    small, big = weight(QT.Q4_1, 1536, 576), weight(QT.Q4_K, 4096, 4096)
    assert launched(small, 9) == [("matvec_q4_1_r2u1_c2", 9, 5)]
    assert launched(small, 2) == [("matvec_q4_1_r2u1_c2", 2, 1)]
    assert launched(big, 8) == [("matvec_q4_K_mma_c8", 8, 1)]
    assert launched(big, 9) == [("matvec_q4_K_mma_c16", 9, 1)]
    assert launched(weight(QT.Q6_K, 4096, 14336), 9) == [("matvec_q6_K_mma_c16", 9, 1)]
    monkeypatch.setenv("MEMRA_VERIFY_SLICE", "8")
    assert launched(big, 9) == [("matvec_q4_K_mma_c8", 9, 2)]
    assert launched(small, 9) == [("matvec_q4_1_r2u1_c8", 9, 2)]


def test_q4_k_decode_and_verify_take_the_k256_matvecs(tmp_path, monkeypatch):
    """A Q4_K_M model's Q4_K matrices at 1-16 tokens run on k256.cu (decode c1, verify c8 up to 8
    tokens and c16 up to 16, one block row: each block reads its weight tile once), reading q8_k256
    copies their producers wrote: the norms and the gated activation write them (xk set), so the only
    quantize_q8_k256 launches are one a layer for attention's output (the o matvec); Q6_K parts keep
    the q8_1 kernels. Without MEMRA_K256=1 (the default): none of it."""
    from memra_engine.model.synthetic import write_synthetic_gguf

    path = write_synthetic_gguf(tmp_path / "q4k.gguf", preset="tiny-llama", head_dim=64, n_head=4, n_kv_head=2,
                                d_model=256, d_ff=512, quant="Q4_K_M")
    g = open_gguf(path)
    n_layer = config_from_gguf(g).n_layer
    monkeypatch.setenv("MEMRA_K256", "1")
    assert quant_ops.k256_model(g.tensors.values())
    for T, kind in ((1, "c1"), (5, "c8"), (8, "c8"), (9, "c16"), (16, "c16")):
        rt = RecordingRuntime()
        run_forward(path, T, rt=rt, k256=True)
        k256 = [(args, grid) for (name, args), grid in zip(rt.calls, rt.grids) if name.startswith("matvec_q4_K_k256")]
        assert k256 and all(name == f"matvec_q4_K_k256_{kind}_w16" for name in rt.launches
                            if name.startswith("matvec_q4_K_k256")), T
        assert all(args[2] and grid[1] == 1 for args, grid in k256), T  # x's copy set; one block row
        assert rt.launches.count("quantize_q8_k256") == n_layer, T
        writers = [args[-1] for name, args in rt.calls if name in ("add_rms_norm_f32", "add_rms_norm_split_f32",
                                                                   "rms_norm_f32", "silu_mul_f32")]
        assert writers and all(writers), T
        assert any(name.startswith("matvec_q6_K_") for name in rt.launches), T
    monkeypatch.delenv("MEMRA_K256")
    assert not quant_ops.k256_model(g.tensors.values())
    launches = run_forward(path, 1)
    assert not any("k256" in name for name in launches)


class SmallSharedRuntime(RecordingRuntime):
    """A GPU whose blocks may opt into 99 KB of shared memory (sm_86, sm_89: RTX 30xx/40xx, L40)."""

    max_shared = 99 * 1024


@pytest.mark.parametrize("T", [40, 300])
def test_every_launch_fits_a_99_kb_gpu(model_paths, moe_paths, T):
    """On a 99 KB GPU every launch of a prefill forward stays within the device's shared memory
    (RecordingRuntime checks each launch against max_shared): dense GEMMs take gemm4/gemm6, and an
    MoE layer whose weight type's moe_gemm4 tile does not fit (Q8_0 here: 102-135 KB) runs its
    slots on the expert matvec instead; one that fits (Q4_0) keeps the grouped GEMM."""
    from gguf.constants import GGMLQuantizationType as QT

    launched = {path: run_forward(path, T, rt=SmallSharedRuntime()) for path in [*model_paths.values(),
                                                                                  *moe_paths.values()]}
    for path, launches in launched.items():
        assert not any(n.startswith(("gemm3_", "gemm5_", "gemm7_")) for n in launches), path
    cfg = config_from_gguf(open_gguf(moe_paths["tiny-mixtral"]))
    big = launched[moe_paths["tiny-mixtral"]]
    assert sum(n.startswith("moe_matvec_q8_0") for n in big) == 2 * cfg.n_layer and "moe_sort" not in big
    assert any(n.startswith("moe_gemm4_q4_0") for n in launched[moe_paths["tiny-olmoe"]])
    assert quant_ops.gemm_shared("gemm4", quant_ops.weight_layout(QT.Q8_0, 64, 256)) > 99 * 1024 >= \
        quant_ops.gemm_shared("gemm4", quant_ops.weight_layout(QT.Q4_0, 64, 256))


def test_the_dry_run_sizes_the_scratch_of_the_device_at_hand(moe_paths):
    """The backend sizes its arena with a dry forward that takes the device's max_shared
    (GpuOps(..., max_shared=rt.max_shared)), so on a 99 KB GPU it counts the q8_1 copies the MoE
    prefill's matvec path needs, which an H100-sized dry run would leave out."""
    path, T = moe_paths["tiny-mixtral"], 300

    def sizes(max_shared, recorded):
        arena = Arena.unbounded()
        if recorded:  # a real forward's allocations (launches checked against max_shared)
            run_forward(path, T, rt=SmallSharedRuntime() if max_shared < 227 * 1024 else RecordingRuntime(), arena=arena)
        else:  # the backend's dry run
            run_forward(path, T, arena=arena, dry_max_shared=max_shared)
        return arena.part_sizes(0)

    for max_shared in (99 * 1024, 227 * 1024):
        assert sizes(max_shared, recorded=False) == sizes(max_shared, recorded=True), max_shared
    assert sizes(99 * 1024, recorded=False) != sizes(227 * 1024, recorded=False)
