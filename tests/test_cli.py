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
                 "--draft", "-md", "--lookup", "--draft-max", "--draft-min", "--moe-vram"):
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
    assert calls == [(("model.gguf", "cpu", 2048, True, "f16"),
                      {"grammar": None, "draft": None, "spec": SpecConfig(), "moe_vram": None, "sampling": {},
                       "system": None})]
    calls.clear()
    assert cli.main(["model.gguf", "--regex", "[0-9]+"]) == 7
    assert calls[0][1]["grammar"].kind == "regex" and calls[0][1]["grammar"].source == "[0-9]+"
    calls.clear()
    assert cli.main(["model.gguf", "--lookup", "--draft-max", "4"]) == 7
    assert calls[0][1]["spec"] == SpecConfig("lookup", draft_max=4) and calls[0][1]["draft"] is None
    calls.clear()
    assert cli.main(["model.gguf", "--moe-vram", "6GiB"]) == 7
    assert calls[0][1]["moe_vram"] == 6 << 30
    calls.clear()
    # the sampling flags given (a default value written out included) are the knobs the UI starts with
    assert cli.main(["model.gguf", "-t", "0.2", "--top-k", "40", "-n", "64", "--seed", "9", "--system", "be brief"]) == 7
    assert calls[0][1]["sampling"] == {"temperature": 0.2, "top_k": 40, "max_tokens": 64, "seed": 9}
    assert calls[0][1]["system"] == "be brief"


def test_a_bad_sampling_value_for_the_ui_is_one_line_before_it_opens(monkeypatch, capsys):
    import memra_tui.app
    from memra_tui import cli

    monkeypatch.setattr(memra_tui.app, "run_app", lambda *a, **kw: pytest.fail("the UI opened"))
    assert cli.main(["model.gguf", "--top-p", "0"]) == 1
    assert capsys.readouterr().err.splitlines() == ["memra-chat: error: top_p must be in (0, 1]"]


def test_a_missing_ui_library_is_one_line_not_an_internal_error(monkeypatch, capsys):
    """The GPU machine of a session had no Textual: the UI then says what is missing, in one line."""
    import sys

    from memra_tui import cli

    monkeypatch.delitem(sys.modules, "memra_tui.app", raising=False)
    monkeypatch.setitem(sys.modules, "textual", None)  # import textual now raises ModuleNotFoundError
    assert cli.main(["model.gguf", "--backend", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'textual' package, which is not installed" in err[0], err
    assert err[0].startswith("memra-chat: error:")


# -- speculative decoding: the flags, in-process on the scripted engine --------------------------


def record_loads(monkeypatch, script: Script) -> list:
    """Engine.load replaced by the scripted engine's; the list gets (kwargs, engine) per load."""
    from memra_engine.generate import Engine

    loads = []
    load = ScriptedEngine.loader(script)

    def recording_load(path=None, **kw):
        engine = load(path, **kw)
        loads.append((kw, engine))
        return engine

    monkeypatch.setattr(Engine, "load", staticmethod(recording_load))
    return loads


@pytest.fixture
def scripted_load(monkeypatch):
    return record_loads(monkeypatch, Script(tokens_per_s=5000, n_tokens=60))


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


# -- the MoE expert cache: --moe-vram and the --stats line ---------------------------------------


@pytest.mark.parametrize("text, n", [
    ("6GiB", 6 << 30), ("512MiB", 512 << 20), ("64KiB", 64 << 10), ("1TiB", 1 << 40),
    ("6G", 6 << 30), ("800M", 800 << 20), ("4k", 4 << 10),  # bare letters are binary, as in llama.cpp
    ("1.5GB", 1_500_000_000), ("800MB", 800_000_000), ("2kb", 2000),  # KB/MB/GB are decimal
    ("4096", 4096), ("4096B", 4096), ("1.5GiB", 3 << 29), (" 6 gib ", 6 << 30), (".5M", 1 << 19),
])
def test_parse_size(text, n):
    from memra_tui.format import parse_size

    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "GiB", "6XB", "6 GiBs", "-1G", "1e9", "six", "6G6", "0", "0.0GiB", "1,5G"])
def test_parse_size_refuses(text):
    from memra_tui.format import parse_size

    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("mode", [["--prompt", "hi"], []])  # headless, and before the UI opens
def test_a_bad_moe_vram_is_argparse_s_one_line_error(scripted_load, monkeypatch, capsys, mode):
    import memra_tui.app
    from memra_tui import cli

    monkeypatch.setattr(memra_tui.app, "run_app", lambda *a, **kw: pytest.fail("the UI opened"))
    for size, says in (("6XB", "not a size: '6XB' (say 6GiB, 512MiB, 6G or 1.5GB; K/M/G and KiB/MiB/GiB are "
                                "binary, KB/MB/GB decimal)"),
                       ("0", "the size must be more than 0 bytes, not '0'")):
        with pytest.raises(SystemExit) as exit:
            cli.main([*mode, "--moe-vram", size])
        assert exit.value.code == 1
        err = capsys.readouterr().err
        assert err.splitlines()[-1] == f"memra-chat: error: argument --moe-vram: {says}"
        assert err.startswith("usage: memra-chat") and "Traceback" not in err
    assert scripted_load == []


def test_a_bad_moe_vram_exits_1_without_a_traceback():
    run = memra_chat("--moe-vram", "lots", "--prompt", "hi", timeout=60)
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1].startswith("memra-chat: error: argument --moe-vram: not a size: 'lots'")
    assert "Traceback" not in run.stderr


def test_moe_vram_reaches_the_load_and_stats_prints_the_moe_line(monkeypatch, capsys):
    from memra_tui import cli

    loads = record_loads(monkeypatch, Script(tokens_per_s=5000, n_tokens=60, moe=True, backend="cuda"))
    assert cli.main(["--prompt", "hi", "--moe-vram", "1.5GB", "--stats"]) == 0
    assert cli.main(["--prompt", "again", "--stats"]) == 0
    (kw, first), (kw2, second) = loads
    assert kw["moe_vram"] == 1_500_000_000 and first.moe_vram == 1_500_000_000
    assert kw2["moe_vram"] is None
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("moe:")]
    assert len(lines) == 2
    m = first.stats().moe  # the last stats of the reply, which --stats prints
    assert lines[0] == cli.moe_line(m)
    assert re.fullmatch(r"moe: hits \d+ of \d+ \(\d+\.\d%; \d+\.\d% since load\), copied \d+\.\d [KMG]iB at \d+\.\d GB/s, "
                        r"resident \d+/\d+ experts", lines[0]), lines[0]
    assert f"hits {m.hits} of {m.hits + m.misses} ({m.hit_rate:.1%}; {m.total_hit_rate:.1%} since load)" in lines[0]
    assert f"at {m.copy_gb_s:.1f} GB/s, resident {m.resident_experts}/{m.total_experts} experts" in lines[0]


def test_stats_on_a_dense_model_prints_no_moe_line(scripted_load, capsys):
    from memra_tui import cli

    assert cli.main(["--prompt", "hi", "--stats"]) == 0
    err = capsys.readouterr().err
    assert "tok/s" in err and "moe:" not in err


@pytest.mark.parametrize("argv, says", [
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--temperature", "abc", "--prompt", "hi"], "argument --temperature/-t: invalid float value: 'abc'"),
    (["--moe-vram", "6XB"], "argument --moe-vram: not a size: '6XB'"),
    (["--backend", "tpu"], "argument --backend: invalid choice: 'tpu'"),
    (["--json", "--regex", "x"], "argument --regex: not allowed with argument --json"),
])
def test_a_command_line_mistake_exits_1_with_one_line(monkeypatch, capsys, argv, says):
    """2 is for bugs (README): every mistake on the command line is the user's, exit 1."""
    import memra_tui.app
    from memra_tui import cli

    monkeypatch.setattr(memra_tui.app, "run_app", lambda *a, **kw: pytest.fail("the UI opened"))
    monkeypatch.setattr(cli, "run_headless", lambda args: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("usage: memra-chat") and "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"memra-chat: error: {says}"), err


def test_an_unknown_flag_exits_1_in_a_subprocess():
    run = memra_chat("--temprature", "0.5", timeout=60)
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[-1] == "memra-chat: error: unrecognized arguments: --temprature"


@pytest.mark.parametrize("argv, note", [
    (["--raw"], "memra-chat: note: --raw does nothing without --prompt"),
    (["--raw", "--stats", "--temperature", "0.2", "--seed", "4"],
     "memra-chat: note: --raw, --stats do nothing without --prompt"),
    (["--system", "be brief", "--stop", "x"], "memra-chat: note: --stop does nothing without --prompt"),
    (["--top-logprobs", "5"], "memra-chat: note: --top-logprobs does nothing without --prompt (in the UI: the token "
                              "inspector, F7)"),
])
def test_a_flag_the_ui_does_not_use_is_named_on_stderr(monkeypatch, capsys, argv, note):
    import memra_tui.app
    from memra_tui import cli

    calls = []
    monkeypatch.setattr(memra_tui.app, "run_app", lambda *a, **kw: calls.append(a) or 0)
    assert cli.main(argv) == 0
    assert len(calls) == 1  # the UI still opens
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(note) and err[0].endswith("; ignored"), err


def test_resume_with_prompt_is_named_on_stderr(scripted_load, capsys):
    from memra_tui import cli

    assert cli.main(["--prompt", "hi", "--resume"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == ("memra-chat: note: --resume does nothing with --prompt "
                                           "(it reopens a chat in the UI); ignored")
    assert captured.out.strip()  # the reply still came


def test_flags_that_fit_the_mode_say_nothing(scripted_load, monkeypatch, capsys):
    import memra_tui.app
    from memra_tui import cli

    monkeypatch.setattr(memra_tui.app, "run_app", lambda *a, **kw: 0)
    assert cli.main(["--resume", "--ctx", "2048"]) == 0
    assert cli.main(["--prompt", "hi", "--raw", "--temperature", "0", "--stats"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_a_reply_cut_by_a_full_context_says_so(tiny_llama_path):
    """Issue 17: the reply that hit the context limit says "context full", not max tokens."""
    run = memra_chat(str(tiny_llama_path), "--backend", "cpu", "--ctx", "24", "--prompt", "hi", "--max-tokens", "500",
                     "--temperature", "0", "--stats")
    assert run.returncode == 0, run.stderr
    assert "the context is full (24 tokens)" in run.stderr and "[context]" in run.stderr
