"""The remote engine's one-line errors, knob fields and API key handling, against the local stub
(tests/remote_stub.py) and closed or silent local ports. The real server's cases are in
tests/test_remote.py."""
from __future__ import annotations

import os
import socket
import time

import pytest
from remote_stub import REPLY, Stub

from memra_engine.errors import RemoteError
from memra_engine.events import DoneEvent, StatsEvent, TokenEvent
from memra_engine.remote import RemoteEngine, base_url
from memra_engine.remote_knobs import LLAMA_CPP, OTHER, VLLM, knob_notes, sampling_fields
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import SpecConfig
from memra_tui import cli

MESSAGES = [{"role": "user", "content": "hi"}]
PARAMS = SamplingParams(temperature=0.0, max_tokens=16)


def reply(engine, params=PARAMS, **kwargs):
    return engine.chat(MESSAGES, params, **kwargs).collect()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stream_events_and_stats_from_the_stub():
    with Stub(timings=True) as stub, RemoteEngine.connect(stub.url) as engine:
        events = list(engine.chat(MESSAGES, PARAMS))
        assert [e.text for e in events if isinstance(e, TokenEvent)] == REPLY
        assert events[-1] == DoneEvent("eos")
        stats = [e for e in events if isinstance(e, StatsEvent)][-1].stats
        assert (stats.decode_tok_s, stats.prefill_tok_s, stats.n_prompt_tokens, stats.n_generated) == (125.0, 480.0, 12, 5)
        assert stats.n_ctx == engine.info.n_ctx == 4096 and stats.time_to_first_token_s > 0
        assert engine.info.backend == "remote" and engine.info.remote and engine.kind == VLLM


@pytest.mark.parametrize("code", [401, 403])
def test_refused_key_is_one_line(code):
    with Stub() as stub, RemoteEngine.connect(stub.url) as engine:
        stub.status = code
        result = reply(engine)
        assert result.done.reason == "error" and result.text == ""
        assert f"the server refused the API key ({code})" in result.done.error and "\n" not in result.done.error


def test_rate_limit_gives_the_retry_hint():
    with Stub() as stub, RemoteEngine.connect(stub.url) as engine:
        stub.status, stub.headers = 429, {"Retry-After": "7"}
        assert reply(engine).done.error.startswith("the server is rate limiting (429): retry in 7 s")


def test_server_error_names_the_status_and_reason():
    with Stub() as stub, RemoteEngine.connect(stub.url) as engine:
        stub.status, stub.error_body = 503, {"error": {"message": "model is\nloading"}}
        assert reply(engine).done.error == "the server failed (503 Service Unavailable): model is loading"
        stub.status = 200  # the engine goes on after an error
        assert reply(engine).done.reason == "eos"


def test_not_found_names_the_model_and_the_url():
    with Stub() as stub, RemoteEngine.connect(stub.url) as engine:
        stub.status = 404
        error = reply(engine).done.error
        assert error.startswith("stub-model at chat/completions: not found (404)") and "/v1" in error


def test_a_stream_broken_mid_reply_keeps_the_partial_reply():
    with Stub() as stub, RemoteEngine.connect(stub.url) as engine:
        stub.break_after = 2
        result = reply(engine)
        assert result.text == "Hello from"
        assert result.done.reason == "error" and "broke mid-reply" in result.done.error
        assert result.done.error.endswith("the reply so far is kept, cut here") and "\n" not in result.done.error


def test_cancel_before_the_server_answers_ends_at_once():
    with Stub() as stub, RemoteEngine.connect(stub.url) as engine:
        stub.delay_s = 1.0
        job = engine.chat(MESSAGES, PARAMS)
        time.sleep(0.1)
        t0 = time.perf_counter()
        job.cancel()
        assert list(job)[-1] == DoneEvent("cancelled") and time.perf_counter() - t0 < 0.1
        stub.delay_s = 0.0
        assert reply(engine).text == "Hello from the stub."  # the next reply, once the dropped one is answered


def test_a_refused_field_is_one_line_with_the_servers_reason():
    with Stub(owned_by="some-proxy") as stub, RemoteEngine.connect(stub.url) as engine:
        stub.status, stub.error_body = 400, {"error": {"message": "Unrecognized request argument supplied: top_k"}}
        assert reply(engine, SamplingParams(top_k=40)).done.error == (
            "the server refused the request (400): Unrecognized request argument supplied: top_k (this server refuses "
            "top_k: set it to off in the knobs)")


def test_unknown_model_lists_what_the_server_serves():
    with Stub() as stub:
        with pytest.raises(RemoteError, match=r"no model 'nope'; it serves: stub-model"):
            RemoteEngine.connect(stub.url, model="nope")


def test_connection_refused_and_dns_failure_are_one_line(monkeypatch):
    with pytest.raises(RemoteError, match=r"^connection refused at 127.0.0.1:\d+: is the server running\?$"):
        RemoteEngine.connect(f"http://127.0.0.1:{free_port()}/v1")

    def no_dns(*args, **kwargs):  # no name server is asked: the lookup fails as it would
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(RemoteError, match=r"^cannot resolve no-such-host.invalid \(DNS lookup failed\)"):
        RemoteEngine.connect("http://no-such-host.invalid:8000/v1")


def test_a_server_that_never_answers_times_out():
    with socket.socket() as silent:  # listens, so connect succeeds, but never accepts or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        with pytest.raises(RemoteError, match=rf"^the server at 127.0.0.1:{port} did not answer within 0.5 s"):
            RemoteEngine.connect(f"http://127.0.0.1:{port}", timeout=0.5)


def test_speculative_decoding_is_refused():
    with Stub() as stub, RemoteEngine.connect(stub.url) as engine:
        done = reply(engine, spec=SpecConfig("lookup")).done
        assert done.reason == "error" and "speculative decoding is the server's" in done.error
        assert len([r for r in stub.requests if r["body"] is not None]) == 0  # nothing was sent


def test_knob_fields_per_server_kind():
    p = SamplingParams(temperature=0.5, top_k=0, top_p=0.9, min_p=0.1, repeat_penalty=1.0, repeat_last_n=32, seed=3)
    assert sampling_fields(p, LLAMA_CPP) == {
        "temperature": 0.5, "top_p": 0.9, "max_tokens": 512, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "seed": 3, "top_k": 0, "min_p": 0.1, "repeat_penalty": 1.0, "repeat_last_n": 32}
    vllm = sampling_fields(p, VLLM)  # off knobs stay out, the window has no field
    assert "top_k" not in vllm and "repetition_penalty" not in vllm and "repeat_last_n" not in vllm
    assert sampling_fields(SamplingParams(repeat_penalty=1.1), VLLM)["repetition_penalty"] == 1.1
    notes = dict(knob_notes(OTHER))
    assert notes["top_k"] == "→ top_k if not off; may be ignored" and notes["repeat_last_n"] == "✗ not sent (no such field)"


def test_knobs_reach_the_request_body():
    with Stub(owned_by="vllm") as stub, RemoteEngine.connect(stub.url) as engine:
        params = SamplingParams(temperature=0.3, top_k=5, top_p=0.8, min_p=0.02, repeat_penalty=1.2, seed=11, max_tokens=9)
        reply(engine, params, stop=["\n\n"])
        body = stub.last_body()
        assert {k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "max_tokens",
                                     "stop", "stream", "model")} == {
            "temperature": 0.3, "top_k": 5, "top_p": 0.8, "min_p": 0.02, "repetition_penalty": 1.2, "seed": 11,
            "max_tokens": 9, "stop": ["\n\n"], "stream": True, "model": "stub-model"}


def test_base_url():
    assert base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert base_url("http://h:1/v1/") == "http://h:1/v1"
    with pytest.raises(RemoteError):
        base_url("127.0.0.1:8000")


# ---------------------------------------------------------------------------------------- the CLI and the key


def test_cli_key_from_the_environment_only(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with Stub(api_key="sk-test-abc") as stub:
        monkeypatch.setenv("STUB_KEY", "sk-test-abc")
        assert cli.main(["--remote", stub.url, "--api-key-env", "STUB_KEY", "-p", "hi", "-n", "5"]) == 0
        assert capsys.readouterr().out == "Hello from the stub.\n"
        assert stub.requests[-1]["headers"]["Authorization"] == "Bearer sk-test-abc"
        assert cli.main(["--remote", stub.url, "-p", "hi"]) == 1  # no key: refused, one line
        err = capsys.readouterr().err
        assert "the server refused the API key (401)" in err and "sk-test-abc" not in err
        monkeypatch.delenv("STUB_KEY")
        assert cli.main(["--remote", stub.url, "--api-key-env", "STUB_KEY", "-p", "hi"]) == 1
        assert "STUB_KEY: that environment variable is not set" in capsys.readouterr().err


def test_cli_key_from_a_private_config_file(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with Stub(api_key="sk-file-key") as stub:
        config = tmp_path / "memra" / "remote.json"
        config.parent.mkdir(parents=True)
        config.write_text('{"api_keys": {"%s": "sk-file-key"}}' % stub.url)
        os.chmod(config, 0o644)
        assert cli.main(["--remote", stub.url, "-p", "hi"]) == 1
        assert f"other users can read it: chmod 600 {config}" in capsys.readouterr().err
        os.chmod(config, 0o600)
        assert cli.main(["--remote", stub.url, "-p", "hi"]) == 0
        assert capsys.readouterr().out == "Hello from the stub.\n"


def test_cli_remote_flags_need_remote(capsys):
    assert cli.main(["--model", "x", "-p", "hi"]) == 1
    assert "--model needs --remote URL" in capsys.readouterr().err
    assert cli.main(["model.gguf", "--remote", "http://127.0.0.1:1", "-p", "hi"]) == 1
    assert "two engines" in capsys.readouterr().err


def test_cli_list_models_and_local_flags_noted(capsys):
    with Stub() as stub:
        assert cli.main(["--remote", stub.url, "--list-models"]) == 0
        assert capsys.readouterr().out == "stub-model\n"
        assert cli.main(["--remote", stub.url, "--ctx", "512", "--lookup", "-p", "hi"]) == 0
        captured = capsys.readouterr()
        assert "--ctx, --lookup do nothing with --remote" in captured.err and captured.out == "Hello from the stub.\n"
