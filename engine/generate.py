"""The generation loop and the engine API the UI and CLI use (docs/design.md §3).

One Engine owns one background thread. That thread opens the model, creates the backend (a CUDA
context belongs to the thread that made it) and runs jobs one after another. chat()/complete()
enqueue a Job and return at once; a Job is an iterator over the events the thread puts on its queue.

Choices this module makes, so callers know what to expect:
- KV cache reuse: the engine remembers the tokens held in the cache. A new prompt keeps the common
  prefix with them and prefills only the rest, so a multi-turn chat re-reads only the new turn.
- A prompt that leaves no room to generate (>= n_ctx tokens) ends the job with
  DoneEvent("error", "prompt is N tokens but the context is C (use --ctx)"). Old turns are never
  dropped silently; the UI decides what to cut. Generation stops with "length" when max_tokens
  are out, and with "context" when the context is full first.
- Out of memory (the VRAM pool, the CPU backend's memory check, or numpy's MemoryError) is an
  OutOfMemory error with one line that names the way out (a smaller --ctx): Engine.load raises it,
  and in a reply it ends the job with DoneEvent("error", ..., error_kind="out_of_memory"), forgets
  the cache and leaves the engine usable. A prompt that does not fit has error_kind "prompt_too_long".
- A model without a chat template runs in completion mode: chat() joins the message contents with
  blank lines and continues that text; Engine.info.has_chat_template is False so the UI/CLI say so.
- Stop strings are matched on the decoded text, also across token boundaries: text that might be
  the start of a stop string is held back until it is clear. The stop string itself is not emitted.
  EOS/EOT tokens yield no text; if text was held back when one arrives, a last TokenEvent carrying
  it (with the EOS id) is sent first.
- Sampling knobs are read at the start of a job; Job.update_sampling() swaps them at the next step.
- A grammar (engine/grammar.py) constrains every token of the reply. When it is complete the
  reply ends with "eos"; when max_tokens or the context cut it first, with "length" or "context" (the reply is
  then an incomplete structure, which the UI and the CLI say). Stop strings still apply.
- How one step turns the fed token into the next is a step strategy (engine/steps.py).
- Speculative decoding (engine/speculative.py): spec=SpecConfig(mode="lookup") drafts from the
  prompt and the reply so far; mode="draft" uses the draft model given to Engine.load(draft=).
  The draft model runs on the same backend and thread with its own KV cache; its vocabulary must
  be the target's. A reply's first token is always a plain step (it is the prefill's); after
  that a step may yield several tokens. Job.update_spec() applies new knobs from the next round.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from memra_engine.backend import common_prefix_len
from memra_engine.backend_select import choose_backend, create_backend
from memra_engine.errors import ContextOverflowError, GrammarError, HostOutOfMemory, MemraError, OutOfMemory
from memra_engine.events import DoneEvent, EngineInfo, EngineStats, StatsEvent, TokenEvent
from memra_engine.grammar import Grammar, GrammarConstraint, GrammarTokenizer
from memra_engine.kv_type import DEFAULT_KV_TYPE, check_kv_type
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import DraftModel, PromptLookup, SpecConfig, SpecCounters, check_draft_vocab
from memra_engine.steps import MaskTimer, speculative_for, strategy_for

log = logging.getLogger("memra.engine")

Progress = Callable[[str], None]
Event = TokenEvent | StatsEvent | DoneEvent

STATS_INTERVAL_S = 0.25
OOM_HINT = "try a smaller --ctx or a smaller model"


def host_out_of_memory(err: MemoryError, doing: str) -> HostOutOfMemory:
    """numpy's MemoryError as the one-line error a user can act on."""
    detail = " ".join(str(err).split())[:120]
    return HostOutOfMemory(f"out of host memory {doing}" + (f" ({detail})" if detail else "") + f"; {OOM_HINT}")


# ---------------------------------------------------------------------------------------- jobs


@dataclass
class JobRequest:
    sampling: SamplingParams
    messages: list[dict] | None = None  # chat: rendered with the template
    prompt: str | None = None  # complete: raw text
    stop: tuple[str, ...] = ()
    grammar: Grammar | None = None
    spec: SpecConfig | None = None  # None: off
    # a reply that goes on from these tokens (a branch from a token of an earlier reply: its
    # tokens up to there, then the one picked); they are fed, not streamed, and the grammar and
    # the penalties see them as the reply's own
    reply_prefix: tuple[int, ...] = ()


@dataclass
class JobResult:
    text: str
    token_ids: list[int]
    done: DoneEvent
    stats: EngineStats | None = None


class Job:
    """An iterator over TokenEvent / StatsEvent / DoneEvent; always ends with exactly one DoneEvent."""

    def __init__(self, request: JobRequest):
        self.request = request
        self._events: queue.Queue[Event] = queue.Queue()
        self._cancel = threading.Event()
        self._sampling_update: SamplingParams | None = None
        self._spec_update: SpecConfig | None = None

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self._events.get()
            yield event
            if isinstance(event, DoneEvent):
                return

    def update_sampling(self, sampling: SamplingParams) -> None:
        """New knobs for the rest of this job, taken at the next step (the random stream goes on).
        Raises ValueError at once if they are invalid."""
        sampling.validate()
        self._sampling_update = sampling

    def take_sampling_update(self) -> SamplingParams | None:
        update, self._sampling_update = self._sampling_update, None
        return update

    def update_spec(self, spec: SpecConfig) -> None:
        """New speculative knobs for the rest of this job, from the next round. Raises ValueError at
        once if they are invalid."""
        spec.validate()
        self._spec_update = spec

    def take_spec_update(self) -> SpecConfig | None:
        update, self._spec_update = self._spec_update, None
        return update

    def cancel(self) -> None:
        """Ask the engine to stop this job; returns at once. The job ends within one decode step."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def collect(self) -> JobResult:
        """Run the job to its end and return the whole reply (for scripts and tests)."""
        pieces, ids, stats = [], [], None
        for event in self:
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
                ids.append(event.id)
            elif isinstance(event, StatsEvent):
                stats = event.stats
            else:
                return JobResult("".join(pieces), ids, event, stats)
        raise AssertionError("unreachable: a job always ends with a DoneEvent")

    def _put(self, event: Event) -> None:
        self._events.put(event)


# ---------------------------------------------------------------------------------------- stop strings


class StopMatcher:
    """Finds stop strings in streamed text, holding back what could still become one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Feed new text; returns (text safe to emit, whether a stop string was hit)."""
        buf = self.held + text
        hits = [buf.find(s) for s in self.stops if s in buf]
        if hits:
            self.held = ""
            return buf[: min(hits)], True
        keep = max((self._partial_suffix(buf, s) for s in self.stops), default=0)
        self.held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held

    @staticmethod
    def _partial_suffix(buf: str, stop: str) -> int:
        for n in range(min(len(stop) - 1, len(buf)), 0, -1):
            if buf.endswith(stop[:n]):
                return n
        return 0


# ---------------------------------------------------------------------------------------- model state


@dataclass
class LoadedModel:
    """What the engine thread holds: everything here is used only on that thread."""

    gguf: object
    tokenizer: object
    template: object | None
    backend: object
    cached_tokens: list[int] = field(default_factory=list)  # exactly what the KV cache holds
    draft: DraftModel | None = None  # the draft model for speculative decoding, if one was given
    _grammar_tokenizer: GrammarTokenizer | None = None

    def grammar_tokenizer(self) -> GrammarTokenizer:
        """llguidance's view of the vocabulary: built on the first grammar, reused by every job."""
        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = GrammarTokenizer(self.tokenizer, self.backend.config.vocab_size)
        return self._grammar_tokenizer


def prompt_ids(tokenizer, template, messages: list[dict] | None, prompt: str | None = None,
               add_generation_prompt: bool = True) -> list[int]:
    """The token ids of a prompt: raw text, or the messages through the chat template (in
    completion mode, the turns as plain text, continued by the model)."""
    if prompt is not None:
        text = prompt
    elif template is not None:
        text = template.render(messages, add_generation_prompt=add_generation_prompt)
    else:
        text = "\n\n".join(str(m.get("content", "")) for m in messages)
    ids = tokenizer.encode(text, add_special=True)
    bos = tokenizer.bos_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]  # the template wrote BOS itself and the tokenizer added another
    return ids


def open_model(g, kind: str, n_ctx: int, vram_budget, say: Progress,
               kv_type: str = DEFAULT_KV_TYPE, draft_g=None,
               moe_vram: int | None = None) -> tuple[LoadedModel, EngineInfo]:
    """Build tokenizer, template and backend for an open GGUF (and the draft model's backend on
    the same device, draft_g given). Runs on the engine thread."""
    from memra_engine.chat_template import ChatTemplate
    from memra_engine.tokenizer import load_tokenizer

    path = Path(g.path)
    say(f"loading {path.name} on the {kind} backend…")
    tokenizer = load_tokenizer(g)
    template = ChatTemplate.from_gguf(g)
    backend = create_backend(kind, g, n_ctx, vram_budget, kv_type, moe_vram=moe_vram, say=say)
    draft = None
    if draft_g is not None:
        say(f"loading the draft model {Path(draft_g.path).name}…")
        try:
            draft_backend = create_backend(kind, draft_g, n_ctx, None, kv_type, share_with=backend)
        except BaseException:
            backend.close()
            raise
        draft = DraftModel(model_name(draft_g, Path(draft_g.path)), draft_backend)
    info = describe_model(g, path, n_ctx, kind, backend, template is not None)
    if draft is not None:
        info = replace(info, draft_model_name=draft.name)
    return LoadedModel(g, tokenizer, template, backend, draft=draft), info


def open_draft(path: str | Path, target) -> object:
    """The draft model's GGUF, checked against the target's vocabulary (MemraError if they differ)."""
    from memra_engine.model.config import config_from_gguf
    from memra_engine.model.gguf_file import open_gguf

    path = Path(path)
    if not path.is_file():
        raise MemraError(f"draft model file not found: {path}")
    draft = open_gguf(path)
    mismatch = check_draft_vocab(target, draft, config_from_gguf(target).vocab_size, config_from_gguf(draft).vocab_size)
    if mismatch is not None:
        raise MemraError(f"{path.name} cannot draft for this model: {mismatch}")
    return draft


def model_name(g, path: Path) -> str:
    return str(g.metadata.get("general.name") or path.stem)


def describe_model(g, path: Path, n_ctx: int, backend_kind: str, backend, has_template: bool) -> EngineInfo:
    tensors = g.tensors.values()
    n_params = sum(int(np.prod(t.shape)) for t in tensors)
    mix = Counter(getattr(t.ggml_type, "name", str(t.ggml_type)) for t in tensors)
    quant_mix = ", ".join(f"{name} x{count}" for name, count in mix.most_common())
    return EngineInfo(
        model_name=model_name(g, path),
        arch=backend.config.arch,  # the forward program: "mixtral" for a llama file with experts
        n_params=n_params,
        quant_mix=quant_mix,
        n_ctx=n_ctx,
        backend=backend_kind,
        device_name=str(backend.device_name),
        has_chat_template=has_template,
        kv_type=backend.kv_type,
    )


# ---------------------------------------------------------------------------------------- engine


class Engine:
    """Load with Engine.load(); then chat()/complete() return Jobs. close() when done."""

    def __init__(self) -> None:  # use Engine.load
        self.info: EngineInfo | None = None
        self._prompt_parts = None  # (tokenizer, template) once loaded: count_tokens uses them
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._current: Job | None = None
        self._stats = EngineStats()
        self._stats_lock = threading.Lock()

    @classmethod
    def load(
        cls,
        path: str | Path | None,
        backend: str = "auto",
        n_ctx: int = 4096,
        draft: str | Path | None = None,
        vram_budget: int | None = None,
        progress: Progress | None = None,
        kv_type: str = DEFAULT_KV_TYPE,
        moe_vram: int | None = None,
    ) -> "Engine":
        """Open the model and start the engine thread. Raises MemraError with a one-line message.
        kv_type: the KV cache's element type, "f16" or "q8_0" (engine/kv_type.py).
        draft: a draft model's GGUF for speculative decoding (spec mode "draft"); its vocabulary
        must be the target's.
        moe_vram: bytes of VRAM for MoE experts (the expert cache, engine/gpu/expert_cache.py);
        None: all experts resident when they fit, else a budget that fits (said through progress)."""
        if n_ctx < 16:
            raise MemraError(f"context size {n_ctx} is too small (use --ctx 16 or more)")
        check_kv_type(kv_type)
        say = progress or (lambda msg: None)
        if path is None:
            from memra_engine.default_model import ensure_default_model

            path = ensure_default_model(say)
        path = Path(path)
        if not path.is_file():
            raise MemraError(f"model file not found: {path}")
        from memra_engine.model.gguf_file import open_gguf

        g = open_gguf(path)  # cheap (memory-mapped): a bad file fails here, before any notice
        n_ctx_train = g.metadata.get(f"{g.metadata.get('general.architecture')}.context_length")
        if isinstance(n_ctx_train, int) and 16 <= n_ctx_train < n_ctx:
            # positions past the training context give garbage without rope scaling, which we lack
            say(f"the model was trained with a {n_ctx_train}-token context: using --ctx {n_ctx_train}")
            n_ctx = n_ctx_train
        draft_g = open_draft(draft, g) if draft is not None else None
        kind = choose_backend(backend, say)
        if moe_vram is not None and moe_vram <= 0:
            raise MemraError(f"--moe-vram must be a positive size, not {moe_vram} bytes")
        return cls.start(lambda: open_model(g, kind, n_ctx, vram_budget, say, kv_type, draft_g, moe_vram))

    @staticmethod
    def remote(url: str, model: str | None = None, api_key: str | None = None, timeout: float | None = None,
               progress: Progress | None = None):
        """A RemoteEngine (engine/remote.py) on the OpenAI-compatible server at `url`: the same
        seam (chat, complete, info, stats, count_tokens, close) with the model on the server."""
        from memra_engine.remote import DEFAULT_TIMEOUT_S, RemoteEngine

        return RemoteEngine.connect(url, model=model, api_key=api_key, progress=progress,
                                    timeout=DEFAULT_TIMEOUT_S if timeout is None else timeout)

    @classmethod
    def start(cls, opener: Callable[[], tuple["LoadedModel", EngineInfo]]) -> "Engine":
        """Start the engine thread, which calls `opener` to build its model state (tests pass fakes)."""
        engine = cls()
        ready: queue.Queue[BaseException | None] = queue.Queue()
        engine._thread = threading.Thread(target=engine._serve, args=(opener, ready), name="memra-engine", daemon=True)
        engine._thread.start()
        failure = ready.get()
        if failure is not None:
            engine._thread.join(timeout=5)
            raise failure
        return engine

    # -- the public API (any thread) --------------------------------------------------------------

    def count_tokens(self, messages: list[dict]) -> int:
        """Tokens the conversation takes in the context after its last turn (no generation
        prompt), as a reply would build it. Runs on the caller's thread: the tokenizer and
        template are read-only, so this never waits for a reply in flight."""
        if self._prompt_parts is None:
            raise MemraError("the engine has no model loaded")
        if not messages:
            return 0
        tokenizer, template = self._prompt_parts
        return len(prompt_ids(tokenizer, template, messages, add_generation_prompt=False))

    def chat(
        self, messages: list[dict], sampling: SamplingParams, grammar: Grammar | None = None, spec=None,
        stop: Sequence[str] = (), reply_prefix: Sequence[int] = (),
    ) -> Job:
        """The assistant's reply to `messages`. reply_prefix: token ids the reply starts with
        (a branch: the KV cache keeps what it shares with the last reply); only what follows them
        is streamed, and max_tokens counts what follows."""
        request = JobRequest(sampling, messages=[dict(m) for m in messages], stop=tuple(stop), grammar=grammar, spec=spec,
                             reply_prefix=tuple(int(t) for t in reply_prefix))
        return self._submit(Job(request))

    def complete(self, prompt: str, sampling: SamplingParams, stop: Sequence[str] = (),
                 grammar: Grammar | None = None, spec: SpecConfig | None = None, reply_prefix: Sequence[int] = ()) -> Job:
        return self._submit(Job(JobRequest(sampling, prompt=prompt, stop=tuple(stop), grammar=grammar, spec=spec,
                                           reply_prefix=tuple(int(t) for t in reply_prefix))))

    def stats(self) -> EngineStats:
        with self._stats_lock:
            return replace(self._stats)

    def close(self) -> None:
        """Cancel what runs, stop the thread (within a decode step) and free the backend."""
        if self._closed:
            return
        self._closed = True
        current = self._current
        if current is not None:
            current.cancel()
        self._jobs.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _submit(self, job: Job) -> Job:
        if self._closed:
            job._put(DoneEvent("error", "the engine is closed"))
        else:
            self._jobs.put(job)
        return job

    # -- the engine thread -----------------------------------------------------------------------

    def _serve(self, opener, ready: queue.Queue) -> None:
        try:
            model, self.info = opener()
            self._prompt_parts = (model.tokenizer, model.template)
            # the MoE pane starts from the load-time totals (replies then report their own share)
            self._publish(EngineStats(n_ctx=model.backend.n_ctx, vram=model.backend.memory_stats(),
                                      moe=model.backend.moe_stats()))
        except MemoryError as err:
            ready.put(host_out_of_memory(err, "while loading the model"))
            return
        except BaseException as err:  # handed to load(), which raises it on the caller's thread
            ready.put(err)
            return
        ready.put(None)
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    break
                if self._closed:
                    job._put(DoneEvent("cancelled"))
                    continue
                self._current = job
                if self._closed:  # close() ran between get() and here and may have missed the job
                    job.cancel()
                self._run(model, job)
                self._current = None
            while not self._jobs.empty():  # jobs submitted while closing
                job = self._jobs.get()
                if job is not None:
                    job._put(DoneEvent("cancelled"))
        finally:
            if model.draft is not None:
                model.draft.backend.close()  # before the target: on the GPU it shares the target's context
            model.backend.close()

    def _publish(self, stats: EngineStats) -> None:
        with self._stats_lock:
            self._stats = stats

    def _run(self, model: LoadedModel, job: Job) -> None:
        try:
            Generation(model, job, self._publish).run()
        except GrammarError as err:  # the cache holds exactly what was fed: keep it
            job._put(DoneEvent("error", str(err)))
        except ContextOverflowError as err:  # refused before any change to the cache
            self._forget_cache(model)
            job._put(DoneEvent("error", str(err), error_kind="prompt_too_long"))
        except OutOfMemory as err:
            self._forget_cache(model)
            job._put(DoneEvent("error", str(err), error_kind="out_of_memory"))
        except MemoryError as err:  # numpy on the CPU backend, or a host buffer of the GPU one
            self._forget_cache(model)
            job._put(DoneEvent("error", str(host_out_of_memory(err, "during the reply")), error_kind="out_of_memory"))
        except MemraError as err:
            self._forget_cache(model)
            job._put(DoneEvent("error", str(err)))
        except ValueError as err:  # SamplingParams.validate
            job._put(DoneEvent("error", str(err)))
        except Exception as err:  # a bug: log it, keep the engine alive, never raise into the UI
            log.exception("job failed")
            self._forget_cache(model)
            job._put(DoneEvent("error", f"internal error: {type(err).__name__}: {err}"))

    @staticmethod
    def _forget_cache(model: LoadedModel) -> None:
        # after a failure inside the backend we cannot trust what the cache holds
        model.cached_tokens = []
        try:
            model.backend.truncate(0)
            if model.draft is not None:
                model.draft.forget()
        except Exception:
            log.exception("truncate(0) failed after an error")


# ---------------------------------------------------------------------------------------- one job


class Generation:
    """Runs one job on the engine thread: tokenize, prefill what the cache lacks, decode, stream."""

    def __init__(self, model: LoadedModel, job: Job, publish: Callable[[EngineStats], None]):
        self.model = model
        self.job = job
        self.publish = publish
        self.sampling = job.request.sampling
        self.stats = EngineStats(n_ctx=model.backend.n_ctx)
        self.started = time.perf_counter()
        self.prefill_s = 0.0
        self.n_prefilled = 0
        self.decode_s = 0.0
        self.n_decoded = 0
        self.last_stats = self.started
        self.mask_timer = MaskTimer()
        self.spec_counters = SpecCounters()
        self.moe_base = model.backend.moe_stats()  # the expert-cache totals when this reply began

    def run(self) -> None:
        self.sampling.validate()
        request = self.job.request
        if request.spec is not None:
            request.spec.validate()
            self.check_spec(request.spec)
        # the matcher first: a grammar that cannot start ends the job before any work
        constraint = None
        if request.grammar is not None:
            constraint = self.model.grammar_tokenizer().constraint(request.grammar)
        if request.reply_prefix:
            vocab = self.model.backend.config.vocab_size
            if any(not 0 <= t < vocab for t in request.reply_prefix):
                raise ValueError(f"the reply prefix holds a token id outside the vocabulary (0..{vocab - 1})")
            for t in request.reply_prefix if constraint is not None else ():
                constraint.accept(t)  # GrammarError (one line) if the grammar refuses the branch
        prompt = self.prompt_tokens() + list(request.reply_prefix)
        n_ctx = self.model.backend.n_ctx
        if not prompt:
            raise MemraError("the prompt is empty")
        if len(prompt) >= n_ctx:
            raise ContextOverflowError(f"prompt is {len(prompt)} tokens but the context is {n_ctx} (use --ctx)")
        self.stats.n_prompt_tokens = len(prompt)

        if not self.prefill(prompt[:-1]):
            return self.finish("cancelled")
        self.decode_loop(prompt, constraint)

    # -- prompt ------------------------------------------------------------------------------------

    def prompt_tokens(self) -> list[int]:
        request = self.job.request
        return prompt_ids(self.model.tokenizer, self.model.template, request.messages, request.prompt)

    def prefill(self, head: list[int]) -> bool:
        """Bring the KV cache to `head` (the prompt less its last token), reusing the common prefix.
        The last prompt token always goes through the one-token decode step, so a reply depends only
        on the conversation, not on what the cache held before (same seed, same reply on the GPU too).
        False if cancelled meanwhile."""
        model, backend = self.model, self.model.backend
        keep = common_prefix_len(model.cached_tokens, head)
        backend.truncate(keep)
        model.cached_tokens = model.cached_tokens[:keep]
        step = backend.prefill_chunk
        for start in range(keep, len(head), step):
            if self.job.cancelled:
                return False
            chunk = head[start : start + step]
            t0 = time.perf_counter()
            backend.prefill(chunk)
            self.prefill_s += time.perf_counter() - t0
            self.n_prefilled += len(chunk)
            model.cached_tokens.extend(chunk)
        return True

    # -- decode ------------------------------------------------------------------------------------

    def check_spec(self, spec: SpecConfig) -> None:
        if spec.mode == "draft" and self.model.draft is None:
            raise ValueError("spec mode 'draft' needs a draft model, and none is loaded (use --draft FILE)")

    def decode_loop(self, prompt: list[int], constraint: GrammarConstraint | None) -> None:
        """Feed a token, get the next ones from the step strategy (engine/steps.py), stream them.
        A fixed seed repeats a reply on the same backend (docs/design.md §5 rule 6), not across backends."""
        model, backend, params = self.model, self.model.backend, self.sampling
        tokenizer = model.tokenizer
        eos_ids = set(tokenizer.eos_ids)
        history = list(prompt)
        plain = strategy_for(backend, params, history, constraint, self.mask_timer)
        spec = self.job.request.spec
        strategy = self.speculative(plain, history, spec, eos_ids) if spec is not None and spec.enabled else plain
        decoder = tokenizer.stream_decoder()
        for t in self.job.request.reply_prefix:  # already on screen: the text goes on after them
            decoder.push(t)
        stops = StopMatcher(self.job.request.stop)
        fed, n_generated = prompt[-1], 0
        while True:
            if self.job.cancelled:
                return self.finish("cancelled")
            update = self.job.take_sampling_update()
            if update is not None:
                params = update
                strategy.set_params(params, n_generated)
            new_spec = self.job.take_spec_update()
            if new_spec is not None:
                self.check_spec(new_spec)
                if not new_spec.enabled:
                    strategy = plain
                elif strategy is not plain and new_spec.mode == spec.mode:
                    strategy.set_spec(new_spec)
                else:
                    strategy = self.speculative(plain, history, new_spec, eos_ids)
                spec = new_spec
            # the first step feeds the prompt's last token: one token, timed as prefill
            budget = 1 if n_generated == 0 else params.max_tokens - n_generated
            t0 = time.perf_counter()
            steps = strategy.step(fed, budget)
            dt = time.perf_counter() - t0
            model.cached_tokens.append(fed)
            model.cached_tokens.extend(step.token for step in steps[:-1])  # a round's kept drafts are cached too
            if n_generated == 0:
                self.prefill_s += dt
                self.n_prefilled += 1
            else:
                self.decode_s += dt
                self.n_decoded += len(steps)
            for i, (token, logprob, candidates) in enumerate(steps):
                if candidates is not None:
                    candidates = candidates.with_texts(self.model.tokenizer.token_text)
                n_generated += 1
                if n_generated == 1:
                    self.stats.time_to_first_token_s = time.perf_counter() - self.started
                self.stats.n_generated = n_generated
                if token in eos_ids:
                    held = stops.flush() + decoder.flush()
                    if held:
                        self.job._put(TokenEvent(held, token, logprob, candidates))
                    return self.finish("eos")
                history.append(token)
                text, stopped = stops.push(decoder.push(token))
                if stopped:
                    if text:
                        self.job._put(TokenEvent(text, token, logprob, candidates))
                    return self.finish("stop")
                # The constraint has taken the whole step (a round's tokens), so whether it is
                # complete (only end-of-text may follow) is known at the step's last token; the last
                # token is also the one fed back at position n_past: stop when it no longer fits.
                end_of_step = i == len(steps) - 1
                complete = end_of_step and constraint is not None and constraint.done
                full = end_of_step and backend.n_past >= backend.n_ctx
                last = complete or n_generated >= params.max_tokens or full
                if last:
                    # a cut (token limit, full context) leaves a character unfinished, not invalid:
                    # drop its bytes rather than show U+FFFD; a finished structure flushes as eos does
                    if not complete:
                        decoder.drop()
                    text += stops.flush() + decoder.flush()
                self.job._put(TokenEvent(text, token, logprob, candidates))
                if last:
                    return self.finish("eos" if complete else "length" if n_generated >= params.max_tokens else "context")
            fed = steps[-1][0]
            if time.perf_counter() - self.last_stats >= STATS_INTERVAL_S:
                self.job._put(StatsEvent(self.snapshot()))

    def speculative(self, plain, history: list[int], spec: SpecConfig, eos_ids: set[int]):
        drafter = self.model.draft if spec.mode == "draft" else PromptLookup()
        return speculative_for(plain, history, drafter, spec, self.spec_counters, eos_ids)

    # -- stats -------------------------------------------------------------------------------------

    def snapshot(self) -> EngineStats:
        backend, stats = self.model.backend, self.stats
        self.last_stats = time.perf_counter()
        stats.prefill_tok_s = self.n_prefilled / self.prefill_s if self.prefill_s > 0 else 0.0
        stats.decode_tok_s = self.n_decoded / self.decode_s if self.decode_s > 0 else 0.0
        stats.n_ctx_used = backend.n_past
        stats.vram = backend.memory_stats()
        moe = backend.moe_stats()
        stats.moe = moe.since(self.moe_base) if moe is not None and self.moe_base is not None else moe
        c = self.spec_counters
        stats.spec_rounds, stats.spec_drafted, stats.spec_accepted = c.rounds, c.drafted, c.accepted
        stats.spec_drafted_by_pos, stats.spec_accepted_by_pos = list(c.drafted_by_pos), list(c.accepted_by_pos)
        if self.mask_timer.seconds:
            ms = np.asarray(self.mask_timer.seconds) * 1e3
            stats.grammar_mask_ms_median = float(np.median(ms))
            stats.grammar_mask_ms_p99 = float(np.percentile(ms, 99))
        snap = replace(stats)
        self.publish(snap)
        return snap

    def finish(self, reason: str) -> None:
        self.job._put(StatsEvent(self.snapshot()))
        self.job._put(DoneEvent(reason))
