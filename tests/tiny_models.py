"""Session fixtures: tiny synthetic models for the generate/CLI/bench tests (written in milliseconds).

Import the fixtures into a test module: `from tiny_models import tiny_llama_path`.
"""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory) -> Path:
    from memra_engine.model.synthetic import write_synthetic_gguf

    return write_synthetic_gguf(tmp_path_factory.mktemp("models") / "tiny-llama.gguf", preset="tiny-llama", seed=7)


@pytest.fixture(scope="session")
def tiny_no_template_path(tmp_path_factory) -> Path:
    from memra_engine.model.synthetic import write_synthetic_gguf

    path = tmp_path_factory.mktemp("models") / "tiny-llama-no-template.gguf"
    return write_synthetic_gguf(path, preset="tiny-llama", seed=8, chat_template=False)
