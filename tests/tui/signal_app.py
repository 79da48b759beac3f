"""The chat app on a scripted engine whose replies hold after 5 tokens, run in a real terminal (a
pty) by test_interrupted.py: `python signal_app.py DATA_DIR CHECKPOINT_S`."""
from __future__ import annotations

import sys
from pathlib import Path

from memra_tui.app import MemraApp, setup_logging
from memra_tui.screens import chat
from memra_tui.scripted_engine import Script, ScriptedEngine
from memra_tui.settings import AppPaths

if __name__ == "__main__":
    data = Path(sys.argv[1])
    chat.CHECKPOINT_S = float(sys.argv[2])
    paths = AppPaths(config_dir=data / "config", data_dir=data / "data")
    setup_logging(paths.log_file)
    app = MemraApp(None, "cpu", 4096, False, paths=paths, load_engine=ScriptedEngine.loader(Script(pause_after=5)))
    sys.exit(app.run())
