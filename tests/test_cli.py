"""`memra-chat` end to end, as a user runs it: a subprocess of the installed console script; and
in-process, on the scripted engine, what the flags hand to Engine.load and to the job."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memra_engine.backend_select import gpu_available
from memra_engine.speculative import DEFAULT_DRAFT_MAX, DEFAULT_DRAFT_MIN, SpecConfig
from memra_tui.scripted_engine import Script, ScriptedEngine
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
                 "--seed", "--backend", "--ctx", "--pull-default", "--resume", "--system", "--stop", "MODEL",
                 "--draft", "-md", "--lookup", "--draft-max", "--draft-min"):
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
    assert calls == [(("model.gguf", "cpu", 2048, True, "f16"), {"grammar": None, "draft": None, "spec": SpecConfig()})]
    calls.clear()
    assert cli.main(["model.gguf", "--regex", "[0-9]+"]) == 7
    assert calls[0][1]["grammar"].kind == "regex" and calls[0][1]["grammar"].source == "[0-9]+"
    calls.clear()
    assert cli.main(["model.gguf", "--lookup", "--draft-max", "4"]) == 7
    assert calls[0][1]["spec"] == SpecConfig("lookup", draft_max=4) and calls[0][1]["draft"] is None


# -- speculative decoding: the flags, in-process on the scripted engine --------------------------


@pytest.fixture
def scripted_load(monkeypatch):
    """Engine.load replaced by the scripted engine's; the list gets (kwargs, engine) per load."""
    from memra_engine.generate import Engine

    loads = []
    load = ScriptedEngine.loader(Script(tokens_per_s=5000, n_tokens=60))

    def recording_load(path=None, **kw):
        engine = load(path, **kw)
        loads.append((kw, engine))
        return engine

    monkeypatch.setattr(Engine, "load", staticmethod(recording_load))
    return loads


@pytest.fixture
def draft_file(tmp_path) -> Path:
    path = tmp_path / "small-draft.gguf"
    path.write_bytes(b"")  # the scripted engine does not read it; the CLI checks it exists
    return path


def spec_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("spec:")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("draft_flag", ["--draft", "-md", "--model-draft"])
def test_a_draft_model_reaches_the_load_and_drafts_the_reply(scripted_load, draft_file, capsys, draft_flag):
    from memra_tui import cli

    assert cli.main(["model.gguf", "--prompt", "hi", draft_flag, str(draft_file), "--draft-max", "5", "--stats"]) == 0
    ((kw, engine),) = scripted_load
    assert kw["draft"] == str(draft_file)
    assert engine.info.draft_model_name == "small-draft"
    (job,) = engine.jobs
    assert job.messages == [{"role": "user", "content": "hi"}]
    assert job.spec == SpecConfig("draft", draft_max=5, draft_min=DEFAULT_DRAFT_MIN)
    out = capsys.readouterr()
    assert out.out == job.emitted_text + "\n"
    r = job.spec_rounds.counters
    assert r.rounds > 0
    assert spec_line(out.err) == f"spec: accepted {r.accepted} of {r.drafted} drafted, mean length {r.accepted / r.rounds:.2f}"


def test_lookup_reaches_a_raw_completion(scripted_load, capsys):
    from memra_tui import cli

    assert cli.main(["--raw", "--prompt", "the cat", "--lookup", "--draft-min", "2", "--stats"]) == 0
    ((kw, engine),) = scripted_load
    assert kw["draft"] is None
    (job,) = engine.jobs
    assert job.prompt == "the cat" and job.spec == SpecConfig("lookup", draft_max=DEFAULT_DRAFT_MAX, draft_min=2)
    assert re.fullmatch(r"spec: accepted \d+ of \d+ drafted, mean length \d+\.\d\d", spec_line(capsys.readouterr().err))


def test_no_spec_flag_decodes_plainly_and_says_nothing_about_spec(scripted_load, capsys):
    from memra_tui import cli

    assert cli.main(["--prompt", "hi", "--stats"]) == 0
    ((kw, engine),) = scripted_load
    assert kw["draft"] is None and engine.jobs[0].spec == SpecConfig()
    err = capsys.readouterr().err
    assert "tok/s" in err and "spec:" not in err


@pytest.mark.parametrize("args, words", [
    (["--lookup", "--draft", "{draft}"], "--lookup and --draft are two ways to draft: give one"),
    (["--draft-max", "16"], "--draft-max must be in [1, 15]"),
    (["--lookup", "--draft-max", "0"], "--draft-max must be in [1, 15]"),
    (["--lookup", "--draft-max", "4", "--draft-min", "5"], "--draft-min must be in [1, --draft-max]"),
    (["-md", "{missing}"], "draft model file not found: "),
])
@pytest.mark.parametrize("mode", [["--prompt", "hi"], []])  # headless, and before the UI opens
def test_a_bad_spec_flag_is_a_one_line_error_before_the_model_loads(scripted_load, monkeypatch, draft_file, tmp_path,
                                                                    capsys, args, words, mode):
    import memra_tui.app
    from memra_tui import cli

    monkeypatch.setattr(memra_tui.app, "run_app", lambda *a, **kw: pytest.fail("the UI opened"))
    args = [a.format(draft=draft_file, missing=tmp_path / "nope.gguf") for a in args]
    assert cli.main(mode + args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"memra-chat: error: {words}" + (str(tmp_path / "nope.gguf") if "not found" in words else "")]
    assert scripted_load == []  # nothing was loaded


def test_spec_mode_draft_needs_the_draft_model_loaded(capsys):
    # what the engine says when a job asks for a draft model that was not loaded (the UI never
    # offers it; the CLI always loads --draft): the job ends with an error, which --prompt prints
    from memra_tui import cli

    engine = ScriptedEngine(Script(tokens_per_s=5000))
    try:
        job = engine.chat([{"role": "user", "content": "hi"}], cli.SamplingParams(), spec=SpecConfig("draft"))
        with pytest.raises(cli.MemraError, match="no draft model loaded"):
            cli.stream(job, show_stats=True, spec=SpecConfig("draft"))
    finally:
        engine.close()


# -- speculative decoding end to end, on a tiny model --------------------------------------------


@pytest.mark.parametrize("flags", [["--lookup"], ["--draft", "{model}", "--draft-max", "4"]])
def test_speculative_decoding_on_a_tiny_model(tiny_llama_path, flags):
    flags = [f.format(model=tiny_llama_path) for f in flags]  # the model drafting for itself
    args = (str(tiny_llama_path), "--raw", "--prompt", "the cat sat on the mat, the cat sat on the", "--temperature",
            "0", "--max-tokens", "16", "--backend", "cpu", "--stats")
    plain = memra_chat(*args)
    assert plain.returncode == 0, plain.stderr
    assert "spec:" not in plain.stderr
    run = memra_chat(*args, *flags)
    assert run.returncode == 0, run.stderr
    assert run.stdout == plain.stdout  # greedy: the same reply, drafted or not
    match = re.fullmatch(r"spec: accepted (\d+) of (\d+) drafted, mean length (\d+\.\d\d)", spec_line(run.stderr))
    assert match and int(match[1]) <= int(match[2])
