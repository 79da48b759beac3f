"""The remote engine against a real OpenAI-compatible server on the CPU: llama.cpp's llama-server
(the xllamacpp wheel runs its C++ server in a process of its own) serving the default model.

One server for the session (llama_server); the test that kills a server mid-reply starts its own.
A server that cannot start fails these tests with the reason: it is never a skip.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import pytest

from memra_engine.default_model import ensure_default_model
from memra_engine.errors import RemoteError
from memra_engine.events import DoneEvent, StatsEvent, TokenEvent
from memra_engine.generate import Engine
from memra_engine.grammar import Grammar
from memra_engine.remote import RemoteEngine
from memra_engine.remote_knobs import LLAMA_CPP
from memra_engine.sampling import SamplingParams
from memra_tui import cli

N_CTX = 2048
START_TIMEOUT_S = 120
SERVE = """
import sys, time
import xllamacpp as xlc
p = xlc.CommonParams()
p.model.path = sys.argv[1]
p.port = int(sys.argv[2])
p.hostnames = ["127.0.0.1"]
p.n_ctx = int(sys.argv[3])
p.n_parallel = 1
p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 2
server = xlc.Server(p)
print("listening", flush=True)
while True:
    time.sleep(3600)
"""
MESSAGES = [{"role": "user", "content": "Name three colours."}]


class Server:
    def __init__(self, tmp: Path):
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            pytest.fail("the remote tests run llama.cpp's server from the xllamacpp wheel, which is not installed: "
                        "pip install -e '.[test]'")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = tmp / f"llama-server-{self.port}.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", SERVE, str(ensure_default_model()), str(self.port),
                                          str(N_CTX)], stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.fail(f"exited with status {self.proc.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        self.fail(f"did not answer /health within {START_TIMEOUT_S} s")

    def fail(self, why: str) -> None:
        tail = self.log.read_text(errors="replace").strip().splitlines()[-15:]
        pytest.fail(f"llama-server {why}; the end of its log ({self.log}):\n" + "\n".join(tail), pytrace=False)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("llama-server"))
    yield server
    server.stop()


@pytest.fixture
def engine(llama_server):
    with Engine.remote(llama_server.url) as eng:
        yield eng


def direct_reply(server: Server, **fields) -> str:
    """The server's own reply to a plain (not streamed) request, without memra in between."""
    body = {"messages": MESSAGES, "stream": False, **fields}
    response = httpx.post(f"{server.url}/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def test_streams_a_reply_with_stats(engine):
    assert engine.kind == LLAMA_CPP and engine.info.n_ctx == N_CTX and engine.info.remote
    events = list(engine.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=12)))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert len(tokens) >= 5 and events[-1] == DoneEvent("length")
    stats = [e for e in events if isinstance(e, StatsEvent)][-1].stats
    assert stats.n_generated == 12 and stats.n_prompt_tokens > 10 and stats.n_ctx_used == stats.n_prompt_tokens + 12
    assert stats.time_to_first_token_s > 0 and stats.decode_tok_s > 0 and stats.prefill_tok_s > 0
    assert engine.count_tokens(MESSAGES) >= stats.n_prompt_tokens - 1 > 0


def test_knobs_reach_the_server(engine, llama_server):
    """temperature 0 with a seed is the server's own greedy text; top_k 1 at temperature 1 is the
    same text, so top_k reached it; a seed repeats a sampled reply, as the server's does."""
    greedy = engine.chat(MESSAGES, SamplingParams(temperature=0.0, seed=7, max_tokens=24)).collect()
    assert greedy.text == direct_reply(llama_server, temperature=0.0, seed=7, max_tokens=24)
    top_k_1 = SamplingParams(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, seed=3, max_tokens=24)
    assert engine.chat(MESSAGES, top_k_1).collect().text == greedy.text
    hot = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=5, max_tokens=24)
    sampled = engine.chat(MESSAGES, hot).collect().text
    assert sampled == direct_reply(llama_server, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=5, max_tokens=24)
    assert sampled != greedy.text


def test_cancel_closes_the_stream_at_once(engine):
    job = engine.chat(MESSAGES, SamplingParams(temperature=1.0, max_tokens=1500, seed=1))
    events = iter(job)
    assert isinstance(next(e for e in events if isinstance(e, TokenEvent)), TokenEvent)
    t0 = time.perf_counter()
    job.cancel()
    done = next(e for e in events if isinstance(e, DoneEvent))
    assert done.reason == "cancelled" and time.perf_counter() - t0 < 0.5
    # one slot: the next reply starts only once the server has dropped the cancelled one
    t0 = time.perf_counter()
    assert engine.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=2)).collect().done.reason == "length"
    assert time.perf_counter() - t0 < 10


def test_json_schema_reply_validates(engine):
    schema = {"type": "object", "properties": {"colour": {"type": "string"}, "count": {"type": "integer"}},
              "required": ["colour", "count"], "additionalProperties": False}
    result = engine.chat([{"role": "user", "content": "Give a colour and a count as JSON."}],
                         SamplingParams(temperature=0.0, max_tokens=60), grammar=Grammar.json_schema(schema)).collect()
    assert result.done.reason == "eos"
    jsonschema.validate(json.loads(result.text), schema)


def test_gbnf_goes_as_llama_servers_grammar(engine):
    result = engine.chat([{"role": "user", "content": "Is the sky blue?"}], SamplingParams(temperature=0.0, max_tokens=8),
                         grammar=Grammar.gbnf('root ::= "yes" | "no"')).collect()
    assert result.text in ("yes", "no")


def test_a_model_the_server_lacks_is_one_line(llama_server):
    with pytest.raises(RemoteError, match=r"^the server has no model 'gpt-7'; it serves: .*SmolLM2"):
        RemoteEngine.connect(llama_server.url, model="gpt-7")


def test_cli_prompt_and_model_list(llama_server, capsys):
    assert cli.main(["--remote", llama_server.url, "--list-models"]) == 0
    model = capsys.readouterr().out.strip()
    assert model.endswith(".gguf")
    assert cli.main(["--remote", llama_server.url, "--model", model, "-p", "Name three colours.", "-n", "24",
                     "-t", "0", "--seed", "7"]) == 0
    assert capsys.readouterr().out == direct_reply(llama_server, temperature=0.0, seed=7, max_tokens=24) + "\n"


def test_server_killed_mid_reply(tmp_path):
    server = Server(tmp_path)
    try:
        with Engine.remote(server.url) as engine:
            job = engine.chat(MESSAGES, SamplingParams(temperature=1.0, max_tokens=1500, seed=1))
            events = iter(job)
            first = next(e for e in events if isinstance(e, TokenEvent))
            os.kill(server.proc.pid, signal.SIGKILL)
            rest = list(events)
            text = first.text + "".join(e.text for e in rest if isinstance(e, TokenEvent))
            done = rest[-1]
            assert text and done.reason == "error" and "mid-reply" in done.error
            assert done.error.endswith("the reply so far is kept, cut here") and "\n" not in done.error
            # the server is gone: the next reply is refused at once, and the engine is still usable
            after = engine.chat(MESSAGES, SamplingParams(max_tokens=4)).collect().done
            assert after.reason == "error" and after.error.startswith("connection refused at 127.0.0.1:")
    finally:
        server.stop()
