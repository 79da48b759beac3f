"""The remote engine: the same seam as Engine (docs/design.md §3), on an OpenAI-compatible server
(vLLM, SGLang, llama-server) over HTTP with server-sent events.

    eng = RemoteEngine.connect("http://127.0.0.1:8080/v1", model=None, api_key=None)  # or Engine.remote(...)
    job = eng.chat(messages, sampling, grammar=None)   # POST /chat/completions, stream=true
    job = eng.complete(prompt, sampling)               # POST /completions, stream=true
    job.cancel()                                       # shuts the socket: the server sees the client go

Choices this module makes:
- `connect` reads /models on the caller's thread, so a wrong URL, a refused key or an unknown
  model fails there with one line. The server kind (llama.cpp, vLLM, SGLang, another) comes from
  `owned_by`, and decides how the knobs are sent (engine/remote_knobs.py). The context size comes
  from llama-server's /props or vLLM's `max_model_len`, when the server gives one.
- One thread, `memra-remote`, runs jobs one after another, as the local engine does.
- Every failure ends the job with DoneEvent("error", one line): connection refused, DNS, timeouts,
  401/403, 404, 429 (with the server's Retry-After), 5xx, 400. A stream that breaks after text
  came ends with an error that says the reply is partial; the text already sent stays sent.
- Stats come from the stream: time to first token and tok/s between the first and the last
  token, as the client sees them. When the server sends its own figures (llama-server's
  `timings`, `usage`), those replace the counts and rates.
- Speculative decoding is the server's business: a job that asks for it is refused.
- The API key goes only in the Authorization header; it is in no message, log line or EngineInfo.
"""
from __future__ import annotations

import email.utils
import json
import logging
import queue
import re
import socket
import threading
import time
from dataclasses import replace
from typing import Callable, Iterable, Iterator, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx

from memra_engine.errors import GrammarError, MemraError, RemoteError
from memra_engine.events import DoneEvent, EngineInfo, EngineStats, StatsEvent, TokenEvent
from memra_engine.generate import STATS_INTERVAL_S, Job, JobRequest
from memra_engine.grammar import Grammar
from memra_engine.remote_knobs import (LLAMA_CPP, VLLM, extra_names, grammar_fields, knob_notes, sampling_fields,
                                       server_kind)
from memra_engine.sampling import SamplingParams

log = logging.getLogger("memra.remote")

DEFAULT_TIMEOUT_S = 60.0  # connect, and each read: the wait for the first token and between tokens
FINISH_REASONS = {"stop": "eos", "length": "length", "eos": "eos"}


# ---------------------------------------------------------------------------------------- URLs and errors


def base_url(url: str) -> str:
    """The API base: a URL with no path gets /v1, as vLLM, SGLang and llama-server serve it."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteError(f"--remote needs an http:// or https:// URL, not {url!r}")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def host_of(url: str) -> str:
    """host:port, without any user:password@ the URL carries."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def server_message(response: httpx.Response) -> str:
    """The server's own reason, one line: {"error": {"message"}}, {"error": "..."}, {"detail"} or the text."""
    try:
        body = json.loads(response.read() or b"null")
    except (ValueError, httpx.HTTPError):
        body = None
    message = ""
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body.get("message")))
        if isinstance(error, dict):
            error = error.get("message", "")
        message = str(error or "")
    elif not body:
        try:
            message = response.text
        except httpx.HTTPError:
            message = ""
    message = " ".join(message.split())
    return message[:200] + "…" if len(message) > 200 else message


def retry_after(response: httpx.Response) -> str:
    """The Retry-After hint as "retry in N s" (seconds or an HTTP date), or a plain "retry later"."""
    value = response.headers.get("retry-after", "").strip()
    if value.isdigit():
        return f"retry in {int(value)} s"
    when = email.utils.parsedate_to_datetime(value) if value else None
    if when is not None:
        return f"retry in {max(0, round(when.timestamp() - time.time()))} s"
    return "retry later"


def status_error(response: httpx.Response, what: str) -> RemoteError:
    """One line for an HTTP error status."""
    code, said = response.status_code, server_message(response)
    said_part = f": {said}" if said else ""
    if code in (401, 403):
        return RemoteError(f"the server refused the API key ({code}){said_part}; give the key with --api-key-env VAR "
                           "or the config file")
    if code == 404:
        return RemoteError(f"{what}: not found (404){said_part}; check the model name (--list-models) and that the "
                           "URL is the API base, e.g. http://host:8000/v1")
    if code == 429:
        return RemoteError(f"the server is rate limiting (429): {retry_after(response)}{said_part}")
    if code >= 500:
        return RemoteError(f"the server failed ({code} {response.reason_phrase}){said_part}")
    return RemoteError(f"the server refused the request ({code}){said_part}")


def transport_error(err: httpx.TransportError, url: str, timeout: float) -> RemoteError:
    """One line for a request that got no HTTP answer."""
    host, chain, cause = host_of(url), [], err
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(c, socket.gaierror) for c in chain) or "Name or service not known" in str(err):
        return RemoteError(f"cannot resolve {urlsplit(url).hostname} (DNS lookup failed): check the URL")
    if isinstance(err, httpx.ConnectTimeout):
        return RemoteError(f"timed out connecting to {host} after {timeout:g} s")
    if isinstance(err, httpx.TimeoutException):
        return RemoteError(f"the server at {host} did not answer within {timeout:g} s (--timeout)")
    if any(isinstance(c, ConnectionRefusedError) for c in chain) or "refused" in str(err).lower():
        return RemoteError(f"connection refused at {host}: is the server running?")
    return RemoteError(f"cannot reach {host}: {' '.join(str(err).split()) or type(err).__name__}")


# ---------------------------------------------------------------------------------------- server-sent events


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The data of each server-sent event (its `data:` lines joined); comments and other fields skipped."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


# ---------------------------------------------------------------------------------------- jobs


class RemoteJob(Job):
    """A Job whose cancel also shuts the socket of its stream, so the read in flight ends at once
    and the server sees the client leave (llama-server, vLLM and SGLang then stop generating).
    Cancelled before the server has answered (still connecting, or waiting for the headers), it
    ends at once: the engine thread drops the request when the answer comes."""

    def __init__(self, request: JobRequest):
        super().__init__(request)
        self._lock = threading.Lock()
        self._response: httpx.Response | None = None
        self._done = False

    def cancel(self) -> None:
        super().cancel()
        with self._lock:
            response = self._response
        if response is not None:
            shut_stream(response)
        else:
            self._put(DoneEvent("cancelled"))

    def _put(self, event) -> None:
        with self._lock:  # exactly one DoneEvent, and nothing after it
            if self._done:
                return
            self._done = isinstance(event, DoneEvent)
        super()._put(event)

    def attach(self, response: httpx.Response | None) -> None:
        with self._lock:
            self._response = response
        if response is not None and self.cancelled:
            shut_stream(response)


def shut_stream(response: httpx.Response) -> None:
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


class ReplyStats:
    """A reply's stats as the client sees the stream, replaced by the server's own when it sends them."""

    def __init__(self, n_ctx: int, clock: Callable[[], float]):
        self.clock = clock
        self.started = clock()
        self.first = self.last = 0.0
        self.n_chunks = 0
        self.stats = EngineStats(n_ctx=n_ctx)
        self.server_rates = False
        self.answered = False  # the server's response headers came

    def token(self) -> None:
        now = self.clock()
        if self.n_chunks == 0:
            self.first = now
            self.stats.time_to_first_token_s = now - self.started
        self.last = now
        self.n_chunks += 1

    def server(self, chunk: dict) -> None:
        """llama-server's `timings` and any server's `usage`."""
        usage = chunk.get("usage") or {}
        if isinstance(usage, dict) and "completion_tokens" in usage:
            self.stats.n_prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.stats.n_generated = int(usage["completion_tokens"])
        timings = chunk.get("timings") or {}
        if isinstance(timings, dict) and timings.get("predicted_per_second"):
            self.server_rates = True
            self.stats.decode_tok_s = float(timings["predicted_per_second"])
            self.stats.prefill_tok_s = float(timings.get("prompt_per_second") or 0.0)
            self.stats.n_prompt_tokens = int(timings.get("prompt_n") or 0) + int(timings.get("cache_n") or 0)
            self.stats.n_generated = int(timings.get("predicted_n") or self.stats.n_generated)

    def snapshot(self) -> EngineStats:
        s = self.stats
        if not self.server_rates:
            n = max(s.n_generated, self.n_chunks)
            s.n_generated = n
            span = self.last - self.first
            s.decode_tok_s = (n - 1) / span if n > 1 and span > 0 else 0.0
            ttft = s.time_to_first_token_s
            s.prefill_tok_s = s.n_prompt_tokens / ttft if s.n_prompt_tokens and ttft > 0 else 0.0
        s.n_ctx_used = s.n_prompt_tokens + s.n_generated
        return replace(s)


# ---------------------------------------------------------------------------------------- engine


class RemoteEngine:
    """Connect with RemoteEngine.connect() (or Engine.remote()); then chat()/complete() return Jobs."""

    def __init__(self, client: httpx.Client, url: str, model: str, kind: str, info: EngineInfo,
                 models: list[str], timeout: float, clock: Callable[[], float]):
        self.client = client
        self.url = url
        self.model = model
        self.kind = kind
        self.info = info
        self.models = models  # every id /models lists
        self.timeout = timeout
        self.clock = clock
        self._jobs: queue.Queue[RemoteJob | None] = queue.Queue()
        self._current: RemoteJob | None = None
        self._closed = False
        self._stats = EngineStats(n_ctx=info.n_ctx)
        self._stats_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="memra-remote", daemon=True)
        self._thread.start()

    @classmethod
    def connect(cls, url: str, model: str | None = None, api_key: str | None = None,
                timeout: float = DEFAULT_TIMEOUT_S, progress: Callable[[str], None] | None = None,
                clock: Callable[[], float] = time.perf_counter) -> "RemoteEngine":
        """Ask the server which models it serves and pick `model` (None: the first). RemoteError
        with one line when the server cannot be reached, refuses the key or lacks the model."""
        url = base_url(url)
        say = progress or (lambda msg: None)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout), follow_redirects=True)
        try:
            say(f"asking {host_of(url)} for its models")
            listed = cls._get(client, f"{url}/models", "the model list", timeout).get("data") or []
            entries = {str(m.get("id")): m for m in listed if isinstance(m, dict) and m.get("id")}
            if not entries:
                raise RemoteError(f"the server at {host_of(url)} lists no models at {url}/models")
            if model is None:
                model = next(iter(entries))
            elif model not in entries:
                raise RemoteError(f"the server has no model {model!r}; it serves: {', '.join(entries)}")
            entry = entries[model]
            kind = server_kind(str(entry.get("owned_by") or ""))
            n_ctx = cls._context_size(client, url, kind, entry, timeout)
        except BaseException:
            client.close()
            raise
        meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
        info = EngineInfo(model_name=model.rsplit("/", 1)[-1], arch=f"{kind} server", n_params=int(meta.get("n_params") or 0),
                          quant_mix="", n_ctx=n_ctx, backend="remote", device_name=host_of(url),
                          has_chat_template=True, knob_notes=knob_notes(kind))
        say(f"{info.model_name} on a {kind} server at {host_of(url)}")
        return cls(client, url, model, kind, info, list(entries), timeout, clock)

    @staticmethod
    def _get(client: httpx.Client, url: str, what: str, timeout: float) -> dict:
        try:
            response = client.get(url)
        except httpx.TransportError as err:
            raise transport_error(err, url, timeout) from None
        if response.status_code >= 400:
            raise status_error(response, what)
        try:
            body = response.json()
        except ValueError:
            raise RemoteError(f"{url} did not answer with JSON: is it an OpenAI-compatible API base?") from None
        return body if isinstance(body, dict) else {}

    @classmethod
    def _context_size(cls, client: httpx.Client, url: str, kind: str, entry: dict, timeout: float) -> int:
        """The server's context in tokens, 0 when it does not say."""
        if kind == VLLM or "max_model_len" in entry:
            return int(entry.get("max_model_len") or 0)
        if kind == LLAMA_CPP:
            try:
                props = cls._get(client, f"{root_of(url)}/props", "the server's properties", timeout)
            except RemoteError:
                return 0
            settings = props.get("default_generation_settings") or {}
            return int(settings.get("n_ctx") or props.get("n_ctx") or 0)
        return 0

    # -- the public API (any thread) --------------------------------------------------------------

    def chat(self, messages: list[dict], sampling: SamplingParams, grammar: Grammar | None = None, spec=None,
             stop: Sequence[str] = ()) -> RemoteJob:
        request = JobRequest(sampling, messages=[dict(m) for m in messages], stop=tuple(stop), grammar=grammar, spec=spec)
        return self._submit(RemoteJob(request))

    def complete(self, prompt: str, sampling: SamplingParams, stop: Sequence[str] = (),
                 grammar: Grammar | None = None, spec=None) -> RemoteJob:
        return self._submit(RemoteJob(JobRequest(sampling, prompt=prompt, stop=tuple(stop), grammar=grammar, spec=spec)))

    def stats(self) -> EngineStats:
        with self._stats_lock:
            return replace(self._stats)

    def count_tokens(self, messages: list[dict]) -> int:
        """llama-server renders and tokenizes on request (/apply-template, /tokenize); other servers
        do not say, and this raises RemoteError."""
        if not messages:
            return 0
        if self.kind != LLAMA_CPP:
            raise RemoteError(f"a {self.kind} server does not count tokens")
        root = root_of(self.url)
        try:
            prompt = self.client.post(f"{root}/apply-template", json={"messages": messages}).json()["prompt"]
            tokens = self.client.post(f"{root}/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
            raise RemoteError(f"the server could not count the chat's tokens: {err}") from None
        return len(tokens)

    def close(self) -> None:
        """Cancel what runs (its stream is shut at once), stop the thread, close the connections."""
        if self._closed:
            return
        self._closed = True
        current = self._current
        if current is not None:
            current.cancel()
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self.client.close()

    def __enter__(self) -> "RemoteEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _submit(self, job: RemoteJob) -> RemoteJob:
        if self._closed:
            job._put(DoneEvent("error", "the engine is closed"))
        else:
            self._jobs.put(job)
        return job

    # -- the engine thread -----------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            self._current = job
            if self._closed:
                job.cancel()
            try:
                self._run(job)
            except Exception as err:  # a bug: log it, keep the engine alive, never raise into the UI
                log.exception("remote job failed")
                job._put(DoneEvent("error", f"internal error: {type(err).__name__}: {err}"))
            self._current = None
        while not self._jobs.empty():
            job = self._jobs.get()
            if job is not None:
                job._put(DoneEvent("cancelled"))

    def _publish(self, stats: EngineStats) -> None:
        with self._stats_lock:
            self._stats = stats

    def request_body(self, request: JobRequest) -> tuple[str, dict]:
        """The endpoint and JSON body of a job (GrammarError, ValueError before anything is sent)."""
        request.sampling.validate()
        if request.spec is not None and request.spec.enabled:
            raise ValueError("speculative decoding is the server's to do: it is not available with --remote")
        body = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                **sampling_fields(request.sampling, self.kind), **grammar_fields(request.grammar, self.kind)}
        if request.stop:
            body["stop"] = list(request.stop)
        if request.prompt is not None:
            return "completions", {**body, "prompt": request.prompt}
        return "chat/completions", {**body, "messages": request.messages}

    def _run(self, job: RemoteJob) -> None:
        try:
            endpoint, body = self.request_body(job.request)
        except (GrammarError, ValueError) as err:
            job._put(DoneEvent("error", str(err)))
            return
        url = f"{self.url}/{endpoint}"
        reply = ReplyStats(self.info.n_ctx, self.clock)

        def finish(reason: str, error: str = "") -> None:
            stats = reply.snapshot()
            self._publish(stats)
            job._put(StatsEvent(stats))
            job._put(DoneEvent(reason, error))

        for attempt in (1, 2):
            if job.cancelled:
                return finish("cancelled")
            try:
                return finish(*self._stream(job, url, body, reply, endpoint))
            except (httpx.HTTPError, RemoteError) as err:
                if job.cancelled:
                    return finish("cancelled")
                text_sent = reply.n_chunks > 0
                if isinstance(err, httpx.TransportError):
                    # a kept-alive connection the server closed meanwhile fails before any answer:
                    # once, on a new connection (not after a timeout: that one already waited)
                    if attempt == 1 and not reply.answered and not isinstance(err, httpx.TimeoutException):
                        log.info("retrying on a new connection after %s", type(err).__name__)
                        continue
                    err = broken_stream(err, url, self.timeout) if text_sent else transport_error(err, url, self.timeout)
                kept = "; the reply so far is kept, cut here" if text_sent and "kept" not in str(err) else ""
                return finish("error", str(err) + kept)
            finally:
                job.attach(None)

    def _stream(self, job: RemoteJob, url: str, body: dict, reply: ReplyStats, endpoint: str) -> tuple[str, str]:
        """One streamed request: its events onto the job; returns (done reason, error)."""
        with self.client.stream("POST", url, json=body) as response:
            reply.answered = True
            job.attach(response)
            if response.status_code >= 400:
                error = str(status_error(response, f"{self.model} at {endpoint}"))
                if response.status_code == 400:
                    error += refused_knobs(error, body, self.kind)
                return "error", error
            reason, last_stats = None, reply.started
            for data in sse_data(response.iter_lines()):
                if job.cancelled:
                    return "cancelled", ""
                if data.strip() == "[DONE]":
                    return reason or "eos", ""
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise RemoteError(f"the server sent an event that is not JSON: {data[:80]!r}") from None
                if isinstance(chunk.get("error"), (dict, str)):
                    error = chunk["error"]
                    message = error.get("message", "") if isinstance(error, dict) else error
                    raise RemoteError(f"the server stopped the reply: {' '.join(str(message).split())[:200]}")
                reply.server(chunk)
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = delta.get("content") if "delta" in choice else choice.get("text")
                    if text:
                        reply.token()
                        job._put(TokenEvent(text, -1, 0.0))
                    if choice.get("finish_reason"):
                        reason = FINISH_REASONS.get(choice["finish_reason"], "eos")
                if self.clock() - last_stats >= STATS_INTERVAL_S:
                    last_stats = self.clock()
                    job._put(StatsEvent(reply.snapshot()))
            if reason is None:  # the body ended without [DONE] or a finish_reason
                raise httpx.RemoteProtocolError("the server closed the stream before the reply's end")
            return reason, ""


def broken_stream(err: httpx.TransportError, url: str, timeout: float) -> RemoteError:
    if isinstance(err, httpx.TimeoutException):
        return RemoteError(f"the stream from {host_of(url)} stalled for {timeout:g} s mid-reply; the reply so far is "
                           "kept, cut here")
    detail = " ".join(str(err).split()) or type(err).__name__
    return RemoteError(f"the stream from {host_of(url)} broke mid-reply ({detail}); the reply so far is kept, cut here")


def refused_knobs(error: str, body: dict, kind: str) -> str:
    """When a 400 names extra fields that were sent, the knobs to turn off (in the knobs pane)."""
    names = {name: knob for knob, name in extra_names(kind).items() if name is not None and name in body}
    named = [knob for name, knob in names.items() if re.search(rf"\b{name}\b", error)]
    if not named:
        return ""
    return f" (this server refuses {', '.join(named)}: set {'it' if len(named) == 1 else 'them'} to off in the knobs)"


def root_of(url: str) -> str:
    """The server's root, where llama-server serves /props, /tokenize and /apply-template."""
    return url.removesuffix("/v1")
