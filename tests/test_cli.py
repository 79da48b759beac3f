"""`memra-chat` end to end, as a user runs it: a subprocess of the installed console script."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memra_engine.backend_select import gpu_available
from tiny_models import tiny_llama_path, tiny_no_template_path  # noqa: F401  (fixtures)


def memra_chat(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "memra-chat"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "memra_tui.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def assert_one_line_error(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 1, run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[-1].startswith("memra-chat: error: "), run.stderr
    assert "Traceback" not in run.stderr
    for word in words:
        assert word in lines[-1], lines[-1]


def test_help_documents_every_flag():
    run = memra_chat("--help", timeout=60)
    assert run.returncode == 0
    for flag in ("--prompt", "--raw", "--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
                 "--repeat-penalty", "--repeat-last-n", "--presence-penalty", "--frequency-penalty",
                 "--seed", "--backend", "--ctx", "--pull-default", "--resume", "--system", "--stop", "MODEL"):
        assert flag in run.stdout, flag


def test_missing_model_file_is_a_one_line_error(tmp_path):
    assert_one_line_error(memra_chat(str(tmp_path / "nope.gguf"), "--prompt", "hi", timeout=60), "not found")


def test_corrupt_model_file_is_a_one_line_error(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    assert_one_line_error(memra_chat(str(junk), "--prompt", "hi", timeout=60))


def test_truncated_model_file_is_a_one_line_error(tmp_path, tiny_llama_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_llama_path.read_bytes()[: tiny_llama_path.stat().st_size * 2 // 3])
    assert_one_line_error(memra_chat(str(cut), "--prompt", "hi", timeout=60))


def test_bad_sampling_value_is_a_one_line_error(tiny_llama_path):
    assert_one_line_error(memra_chat(str(tiny_llama_path), "--prompt", "hi", "--top-p", "0", timeout=60), "top_p")


def test_cuda_without_a_gpu_is_a_one_line_error(tiny_llama_path):
    ok, _ = gpu_available()
    run = memra_chat(str(tiny_llama_path), "--prompt", "hi", "--backend", "cuda", "--max-tokens", "2", timeout=120)
    if ok:
        assert run.returncode == 0, run.stderr
    else:
        assert_one_line_error(run, "CUDA")


def test_prompt_too_long_for_the_context_is_a_one_line_error(tiny_llama_path):
    run = memra_chat(str(tiny_llama_path), "--prompt", "hello world " * 60, "--ctx", "32", "--backend", "cpu")
    assert_one_line_error(run, "but the context is 32 (use --ctx)")


def test_raw_completion_on_a_tiny_model(tiny_llama_path):
    run = memra_chat(str(tiny_llama_path), "--raw", "--prompt", "the cat", "--temperature", "0",
                     "--max-tokens", "12", "--backend", "cpu", "--stats")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    assert "tok/s" in run.stderr


def test_model_without_template_says_completion_mode(tiny_no_template_path):
    run = memra_chat(str(tiny_no_template_path), "--prompt", "the cat", "--max-tokens", "8", "--seed", "3",
                     "--backend", "cpu")
    assert run.returncode == 0, run.stderr
    assert "completion mode (model has no chat template)" in run.stderr


@pytest.mark.slow
def test_default_model_replies_and_a_seed_reproduces(smollm2_path):
    args = ("--prompt", "What is the capital of France?", "--seed", "1", "--max-tokens", "16", "--backend", "cpu")
    first = memra_chat(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip(), "the reply is empty"
    assert "Traceback" not in first.stderr
    second = memra_chat(*args)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout


def test_a_bug_prints_one_line_and_logs_the_traceback(monkeypatch, tmp_path, capsys):
    from memra_tui import cli

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setattr(cli, "run_headless", broken)
    assert cli.main(["--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memra-chat: internal error: RuntimeError: boom")
    logs = list(tmp_path.rglob("memra-chat.log"))
    assert len(logs) == 1 and "Traceback" in logs[0].read_text() and "boom" in logs[0].read_text()


def test_no_prompt_hands_over_to_the_ui(monkeypatch):
    import memra_tui.app
    from memra_tui import cli

    calls = []
    monkeypatch.setattr(memra_tui.app, "run_app", lambda *args, **kw: calls.append((args, kw)) or 7)
    assert cli.main(["model.gguf", "--backend", "cpu", "--ctx", "2048", "--resume"]) == 7
    assert calls == [(("model.gguf", "cpu", 2048, True, "f16"), {"grammar": None})]
    calls.clear()
    assert cli.main(["model.gguf", "--regex", "[0-9]+"]) == 7
    assert calls[0][1]["grammar"].kind == "regex" and calls[0][1]["grammar"].source == "[0-9]+"
