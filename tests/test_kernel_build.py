"""CI compile check (no GPU needed): every cuda/*.cu builds for every target arch plus PTX.

All families compile in parallel, one nvcc call each with every -gencode flag, into a temporary
cache, once per session; each family then passes or fails on its own with nvcc's errors.
"""
from __future__ import annotations

import pytest

from memra_engine.errors import DeviceError
from memra_engine.gpu import build

pytestmark = pytest.mark.skipif(not build.nvcc_available(), reason="nvcc not installed")


@pytest.fixture(scope="session")
def all_arch_builds(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernels")
    return build.build_all(archs=None, cache_dir=cache, jobs=2), cache


def test_there_are_kernel_families():
    assert build.kernel_families(), "no cuda/*.cu found through memra_engine.kernels"


@pytest.mark.parametrize("family", build.kernel_families())
def test_family_compiles_for_every_arch(all_arch_builds, family):
    results, _ = all_arch_builds
    result = results[family]
    if isinstance(result, DeviceError):
        pytest.fail(str(result))
    assert len(result) > 1000


def test_fatbin_holds_every_arch_and_ptx(all_arch_builds):
    results, _ = all_arch_builds
    for family, data in results.items():
        if isinstance(data, DeviceError):
            continue  # reported by its own test
        entries = set(build.fatbin_contents(data))
        for arch in build.ALL_ARCHS:
            sm = int(arch.removeprefix("sm_").rstrip("a"))
            assert ("elf", sm) in entries, f"{family}: no SASS for {arch} in {sorted(entries)}"
        assert ("ptx", 80) in entries, f"{family}: no compute_80 PTX"


def test_sm8x_sass_shares_one_front_end_pass():
    """sm_86 and sm_89 are built from compute_80's PTX (one cicc run for sm_8x, the slow phase of
    nvcc), which is the same code only while no kernel branches on an __CUDA_ARCH__ between 800
    and 900: every comparison in cuda/ must be against 900."""
    import re

    flags = build.gencode_flags(build.ALL_ARCHS, ptx=True)
    assert flags[0] == "-gencode=arch=compute_80,code=[sm_80,sm_86,sm_89,compute_80]", flags
    assert len(flags) == 3, flags  # then compute_90a and compute_120
    for src in sorted(build.source_dir().glob("*.cu*")):
        for value in re.findall(r"__CUDA_ARCH__\s*[<>=!]=?\s*(\d+)", src.read_text()):
            assert value == "900", f"{src.name} branches on __CUDA_ARCH__ {value}: give sm_8x their own PTX"


def test_second_build_comes_from_the_cache(all_arch_builds):
    results, cache = all_arch_builds
    family = build.kernel_families()[0]
    assert build.build_fatbin(family, cache_dir=cache) == results[family]


def test_compile_error_is_reported(tmp_path, monkeypatch):
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n')
    monkeypatch.setattr(build, "source_dir", lambda: tmp_path)
    with pytest.raises(DeviceError, match="broken.cu"):
        build.build_fatbin("broken", archs=("sm_80",), cache_dir=tmp_path / "cache")


def test_signatures_are_parsed_from_sources():
    sigs = build.parse_signatures(
        'extern "C" __global__ void __launch_bounds__(256) a(const float* __restrict__ x, int n, float eps,\n'
        '    uint32_t* out) {}\n// memra-kernel: gen_q4_0(PPi)\n')
    assert sigs == {"a": "PifP", "gen_q4_0": "PPi"}
    every = build.kernel_signatures()
    assert every, "no extern \"C\" __global__ entry points found"


def test_sm90_features_follow_the_built_arch():
    """PDL and cluster attention are switched on by the arch the kernels were built for: a GPU
    newer than our SASS targets (compute 10.x) runs the sm_80 build, without griddepcontrol."""
    assert build.arch_for_capability(10, 0) == "sm_80" and not build.has_sm90_features("sm_80")
    assert not build.has_sm90_features("sm_86") and not build.has_sm90_features("sm_89")
    assert build.has_sm90_features(build.arch_for_capability(9, 0)) and build.has_sm90_features("sm_120")


def test_build_prebuilt_writes_what_the_loader_takes(tmp_path, monkeypatch):
    """scripts/build_prebuilt.py's output is taken by build._prebuilt: each family's fatbin with its
    own `<family>.key` (a single .key for the folder was silently ignored, so the device compiled
    everything itself). nvcc is stubbed: the layout is what is under test."""
    import runpy
    from pathlib import Path

    families, key = build.kernel_families(), build.source_hash()
    monkeypatch.setattr(build, "build_all", lambda archs, jobs: {f: f"fatbin of {f}".encode() for f in families})
    pkg = tmp_path / "kernels"
    monkeypatch.setattr("sys.argv", ["build_prebuilt.py", str(pkg / "prebuilt")])
    runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "build_prebuilt.py"), run_name="__main__")
    monkeypatch.setattr(build, "source_dir", lambda: pkg)  # the loader looks in pkg/prebuilt
    monkeypatch.setattr(build, "source_hash", lambda: key)  # (it hashes the sources beside it)
    for family in families:
        assert build._prebuilt(family) == f"fatbin of {family}".encode(), family
    (pkg / "prebuilt" / f"{families[0]}.key").write_text("stale")
    assert build._prebuilt(families[0]) is None  # a key from other sources: not taken
