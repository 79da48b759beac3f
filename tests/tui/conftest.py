"""Fixtures for the app tests: tmp dirs for chats and settings, a fixed clock, a scripted engine."""
from __future__ import annotations

from pathlib import Path

import pytest
from tui_helpers import MODELS_DIR, FixedClock

from memra_tui.app import MemraApp
from memra_tui.scripted_engine import Script, ScriptedEngine
from memra_tui.settings import AppPaths


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def paths(tmp_path: Path) -> AppPaths:
    return AppPaths(config_dir=tmp_path / "config", data_dir=tmp_path / "data")


@pytest.fixture
def make_app(paths: AppPaths):
    def make(script: Script | None = None, model: str | None = None, resume: bool = False,
             clock: FixedClock | None = None, grammar=None, draft: str | None = None, spec=None,
             moe_vram: int | None = None, sampling: dict | None = None, system: str | None = None) -> MemraApp:
        return MemraApp(model, "cpu", 4096, resume, paths=paths, load_engine=ScriptedEngine.loader(script or Script()),
                        clock=clock or FixedClock(), picker_root=MODELS_DIR, grammar=grammar, draft=draft, spec=spec,
                        moe_vram=moe_vram, sampling=sampling, system=system)

    return make


