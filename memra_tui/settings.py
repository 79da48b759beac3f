"""Where the app keeps its files, and the sampling defaults it remembers between starts.

Paths are a dataclass passed down from `run_app` (tests pass tmp dirs); nothing here is global.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from memra_engine.sampling import SamplingParams


@dataclass(frozen=True)
class AppPaths:
    config_dir: Path  # settings.json
    data_dir: Path  # chats/, exports/, screenshots/
    log_dir: Path | None = None  # memra-chat.log (the CLI logs crashes there too); None: data_dir

    @classmethod
    def default(cls) -> "AppPaths":
        return cls(Path(platformdirs.user_config_dir("memra")), Path(platformdirs.user_data_dir("memra")),
                   Path(platformdirs.user_log_dir("memra")))

    @property
    def settings_file(self) -> Path:
        return self.config_dir / "settings.json"

    @property
    def chats_dir(self) -> Path:
        return self.data_dir / "chats"

    @property
    def exports_dir(self) -> Path:
        return self.data_dir / "exports"

    @property
    def screenshots_dir(self) -> Path:
        return self.data_dir / "screenshots"

    @property
    def log_file(self) -> Path:
        return (self.log_dir or self.data_dir) / "memra-chat.log"


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temp file in the same directory, fsync, then rename: a kill mid-write leaves the old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


PRESETS: dict[str, SamplingParams] = {
    "precise": SamplingParams(temperature=0.2, top_k=20, top_p=0.9, min_p=0.1, repeat_penalty=1.05),
    "balanced": SamplingParams(),
    "creative": SamplingParams(temperature=1.0, top_k=100, top_p=0.98, min_p=0.02, presence_penalty=0.3),
}


def load_sampling_defaults(paths: AppPaths) -> tuple[SamplingParams, str]:
    """The knobs saved at the last change, or the balanced preset. Returns (params, note); note is
    a one-line reason when the saved file could not be used."""
    try:
        data = json.loads(paths.settings_file.read_text(encoding="utf-8"))
        params = SamplingParams.from_dict(data["sampling"])
        params.validate()
        return params, ""
    except FileNotFoundError:
        return PRESETS["balanced"], ""
    except (OSError, ValueError, KeyError, TypeError) as e:
        return PRESETS["balanced"], f"settings file {paths.settings_file} ignored: {e}"


def save_sampling_defaults(paths: AppPaths, params: SamplingParams) -> None:
    text = json.dumps({"sampling": params.to_dict()}, indent=2, sort_keys=True) + "\n"
    atomic_write_text(paths.settings_file, text)


REMOTE_CONFIG = "remote.json"  # {"api_keys": {"http://host:8000/v1": "KEY", ...}}, mode 0600


def config_api_key(paths: AppPaths, url: str) -> str | None:
    """The API key for the server at `url` (its API base) from the config file, or None. The file
    holds secrets: one that other users can read is refused (MemraError naming the chmod)."""
    from memra_engine.errors import MemraError

    path = paths.config_dir / REMOTE_CONFIG
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & 0o077:
        raise MemraError(f"{path} holds API keys but other users can read it: chmod 600 {path}")
    try:
        keys = json.loads(path.read_text(encoding="utf-8")).get("api_keys", {})
    except (OSError, ValueError, AttributeError) as e:
        raise MemraError(f"{path} is not a JSON object with \"api_keys\": {type(e).__name__}") from None
    key = keys.get(url) or keys.get(url.removesuffix("/v1")) if isinstance(keys, dict) else None
    return str(key) if key else None
