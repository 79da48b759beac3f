"""A stand-in for memra_engine.generate.Engine that follows the seam (docs/design.md §3) exactly.

It plays scripted replies at a set token rate from its own background thread, with fake but
deterministic stats (decode/prefill speed, VRAM pool or process memory, an optional MoE expert
cache whose hit rate climbs as it warms up), so the UI can be developed, snapshot-tested and
benchmarked without a model. Every job records the messages, SamplingParams and Grammar it was
given (job.grammar); a grammar does not change the scripted reply, which ends with "length" when
max_tokens cuts it, as a constrained one would.
A SpecConfig (job.spec) does not change the reply either; it makes the stats report speculative
rounds, drafted and accepted with a seeded walk whose acceptance falls with the draft position,
as real drafts do (lookup drafts shorter and is accepted less than a draft model).
With SamplingParams.top_logprobs > 0 (from the start or an update_sampling mid-reply), every
TokenEvent carries candidates (scripted_candidates): logits made up per token position, mostly
sure, sometimes torn between a few words, now and then a long tail the draw lands in, run through
the engine's own sampler chain (engine/candidates.py), so the stages and probabilities are what
the real chain would say and the token's logprob is its probability in the final distribution.
A reply_prefix (a branch from a token) is honoured deterministically: the reply goes on with the
scripted reply's tokens from position len(reply_prefix) on, so the prefix is not streamed again.
"""
from __future__ import annotations

import queue
import random
import re
import threading
import time
import zlib
from functools import lru_cache
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from memra_engine.candidates import TokenCandidates, token_candidates
from memra_engine.errors import DeviceOutOfMemory, MemraError, ModelFormatError
from memra_engine.events import DoneEvent, EngineInfo, EngineStats, MoeStats, StatsEvent, TokenEvent, VramStats
from memra_engine.sampling import SamplingParams, final_distribution
from memra_engine.speculative import DraftLength, SpecConfig, SpecCounters

MiB = 1 << 20
GiB = 1 << 30

# The scripted MoE model: 24 layers of 64 experts, 8 routed per token, and an expert cache of 384
# VRAM slots (a quarter of the experts) filled by the misses.
MOE_LAYERS, MOE_EXPERTS, MOE_TOP_K, MOE_SLOTS = 24, 64, 8, 384
EXPERT_BYTES = 1_179_648  # one expert's gate, up and down matrices

DEFAULT_REPLIES = [
    "Hello! I am a **scripted** engine. Here is a tiny function:\n\n"
    "```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```\n\n"
    "Ask me anything else.",
    "Sure. Three things to check:\n\n1. the *prompt*,\n2. the knobs,\n3. the `engine` panes.\n\n"
    "That is all.",
    "A short answer this time.",
]

_TOKEN_RE = re.compile(r"\s*\S+|\s+")


def split_tokens(text: str) -> list[str]:
    """Words with their leading whitespace: joining them gives the text back exactly."""
    return _TOKEN_RE.findall(text)


# The other tokens of the scripted vocabulary (ids 200 + index): the candidates a token competes with.
OTHER_TOKENS = [" the", " a", " and", ",", ".", " to", " of", " is", " it", " that", " in", " you", " for",
                " this", " with", " on", " be", " as", " are", " can", "\n", " I", " not", " or", " but",
                " here", " one", " more", " some", " so", " if", " just", " an", " all", " do", " we", " at",
                " by", " from", " they", " has", " was", " will", " my", " what", " there", " which", " when",
                " also", " how", " your", "!", ":", " *", "`", " -", " then", " first", " other", " each",
                " only", " any", " about", " its"]
SCRIPTED_VOCAB = 48  # logits per token: the drawn one and 47 others


@lru_cache(maxsize=4096)
def _scripted_draw(position: int, text: str, token_id: int, temperature: float, top_k: int, top_p: float,
                   min_p: float, grammar: bool, n: int) -> tuple[TokenCandidates, float]:
    h = zlib.crc32(f"{position}:{text}".encode())
    rng = np.random.default_rng(h)
    mood, r = h % 10, np.arange(SCRIPTED_VOCAB, dtype=np.float64)
    if mood < 7:  # sure: one word stands out
        logits = -2.5 * r + rng.normal(0.0, 0.2, r.size)
    elif mood < 9:  # torn between a few
        logits = -0.9 * r + rng.normal(0.0, 0.1, r.size)
    else:  # a few likely words, then a long flat tail
        logits = np.where(r < 3, -0.3 * r, -2.6 - 0.005 * r) + rng.normal(0.0, 0.01, r.size)
    logits = logits.astype(np.float32)
    allowed = None
    if grammar:  # a grammar forbids a quarter of the others
        allowed = np.ones(SCRIPTED_VOCAB, bool)
        allowed[rng.choice(np.arange(1, SCRIPTED_VOCAB), SCRIPTED_VOCAB // 4, replace=False)] = False
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if temperature <= 0.0:
        masked = logits if allowed is None else np.where(allowed, logits, -np.inf)
        drawn = int(np.argmax(masked))
        logprob = float(masked[drawn] - np.log(np.exp(masked - masked[drawn]).sum(dtype=np.float64)))
    else:
        ids, probs = final_distribution(logits, params, [], allowed)
        order = np.lexsort((ids, -probs))
        pick = 0 if mood < 7 else 1 + (h >> 8) % 2 if mood < 9 else len(order) * 3 // 4
        j = int(order[min(pick, len(order) - 1)])
        drawn, logprob = int(ids[j]), float(np.log(probs[j]))
    others = [t for t in OTHER_TOKENS if t != text]
    shift = (h >> 12) % len(others)

    def name(local: int) -> tuple[int, str]:
        if local == drawn:
            return token_id, text
        k = (local - (local > drawn) + shift) % len(others)
        return 200 + OTHER_TOKENS.index(others[k]), others[k]

    cands = token_candidates(logits, params, [], allowed, drawn, n)
    named = TokenCandidates(*(tuple(replace(c, id=name(c.id)[0], text=name(c.id)[1]) for c in side)
                              for side in (cands.model, cands.final)), cands.rank)
    return named, logprob


def scripted_candidates(position: int, text: str, token_id: int, params: SamplingParams, grammar: bool
                        ) -> tuple[TokenCandidates | None, float]:
    """The candidates of the scripted token `text` at `position` of its reply (None when
    params.top_logprobs is 0) and its logprob, under `params`; the same arguments give the same answer."""
    candidates, logprob = _scripted_draw(position, text, token_id, params.temperature, params.top_k, params.top_p,
                                         params.min_p, grammar, params.top_logprobs)
    return (candidates if params.top_logprobs > 0 else None), logprob


@dataclass
class Script:
    replies: list[str] = field(default_factory=lambda: list(DEFAULT_REPLIES))
    tokens_per_s: float = 400.0
    n_tokens: int | None = None  # cycle the reply's tokens up to this many (benchmarks)
    pause_after: int | None = None  # every job: emit this many tokens, then hold until cancelled or released
    pause_at: dict[int, int] = field(default_factory=dict)  # job index -> tokens before holding
    backend: str = "cpu"  # "cpu" shows process memory, "cuda" a VRAM pool
    moe: bool = False
    stats_every: int = 8
    n_ctx: int | None = None  # None: the n_ctx passed to load
    fail_paths: dict[str, str] = field(default_factory=dict)  # model path -> ModelFormatError message
    fail_drafts: dict[str, str] = field(default_factory=dict)  # draft path -> MemraError message (say, another vocabulary)
    load_delay_s: float = 0.0
    chat_template: bool = True  # False: a model without one (completion mode)
    # faults: loading with a context above oom_above_ctx runs out of VRAM (the KV cache does not
    # fit); with one above reply_oom_above_ctx, every reply runs out after 3 tokens (the scratch)
    oom_above_ctx: int | None = None
    reply_oom_above_ctx: int | None = None


class ScriptedJob:
    def __init__(self, engine: "ScriptedEngine", index: int, messages: list[dict] | None, prompt: str | None,
                 sampling: SamplingParams, grammar, spec, stop, reply_prefix=()):
        self.index = index
        self.reply_prefix = tuple(int(t) for t in reply_prefix)  # the branch's first token ids
        self.messages = [dict(m) for m in messages] if messages is not None else None
        self.prompt = prompt
        self.sampling = sampling
        self.grammar = grammar
        self.spec = spec
        self.stop = tuple(stop)
        self.sampling_updates: list[SamplingParams] = []  # from update_sampling, in order
        self._sampling_update: SamplingParams | None = None  # taken at the next token, as the engine does
        self.spec_updates: list[SpecConfig] = []  # from update_spec, in order
        self._spec_update: SpecConfig | None = None  # taken at the next round, as the engine does
        self.spec_rounds = SpecRounds()
        self.moe_base: MoeStats | None = None  # the expert-cache totals when the job began
        self.emitted: list[str] = []  # token texts in the order they were put on the queue
        self.last_token_time = 0.0
        self.done_reason = ""
        self._events: queue.Queue = queue.Queue()
        self._cancelled = threading.Event()
        self._released = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def update_sampling(self, sampling: SamplingParams) -> None:
        sampling.validate()
        self.sampling_updates.append(sampling)
        self._sampling_update = sampling

    def update_spec(self, spec: SpecConfig) -> None:
        spec.validate()
        self.spec_updates.append(spec)
        self._spec_update = spec

    def release(self) -> None:
        """Let a job held by Script.pause_after run to its end."""
        self._released.set()

    @property
    def emitted_text(self) -> str:
        return "".join(self.emitted)

    def __iter__(self) -> Iterator[TokenEvent | StatsEvent | DoneEvent]:
        while True:
            ev = self._events.get()
            yield ev
            if isinstance(ev, DoneEvent):
                return


@dataclass
class SpecRounds:
    """The speculative rounds of one reply: the engine's own counters and draft length, with a
    seeded acceptance walk instead of a model."""

    counters: SpecCounters = field(default_factory=SpecCounters)
    length: DraftLength | None = None
    tokens_left: int = 0  # tokens of the current round not yet emitted

    def play_round(self, spec: SpecConfig, rng: random.Random) -> None:
        if self.length is None:
            self.length = DraftLength(spec)
        self.length.spec = spec
        k = self.length.next()
        if k < spec.draft_min:  # the drafter rests: a plain step, as the engine's rounds take one
            self.tokens_left = 1
            return
        # lookup's matches run out at varied lengths and are right less often; a draft model keeps
        # most of a draft
        if spec.mode == "lookup":
            k, keep, decay = 1 + (self.counters.rounds * 5) % k, 0.7, 0.85
        else:
            keep, decay = 0.95, 0.95
        accepted = 0
        while accepted < k and rng.random() < keep * decay ** accepted:
            accepted += 1
        self.counters.record(k, accepted)
        self.length.update(accepted)
        self.tokens_left = accepted + 1  # the kept drafts and the target's own token


class ScriptedEngine:
    def __init__(self, script: Script | None = None, model_path: str = "scripted-tiny.gguf", n_ctx: int = 4096,
                 kv_type: str = "f16", draft_path: str | None = None, moe_vram: int | None = None):
        self.script = script or Script()
        self.moe_vram = moe_vram  # recorded for tests; the scripted cache keeps its MOE_SLOTS
        n_ctx = self.script.n_ctx or n_ctx
        self.info = EngineInfo(
            model_name=Path(model_path).stem,
            arch="qwen3moe" if self.script.moe else "llama",
            n_params=135_000_000,
            quant_mix="Q4_1 x210, Q8_0 x1, F32 x61",
            n_ctx=n_ctx,
            backend=self.script.backend,
            device_name="NVIDIA H200 (scripted)" if self.script.backend == "cuda" else "CPU (scripted)",
            has_chat_template=self.script.chat_template,
            kv_type=kv_type,
            draft_model_name=Path(draft_path).stem if draft_path else "",
        )
        self.jobs: list[ScriptedJob] = []
        self.counted: list[list[dict]] = []  # the conversations count_tokens was asked about
        # the expert cache's totals since load (the engine thread's); None: a dense model
        self._moe = (MoeStats(total_experts=MOE_LAYERS * MOE_EXPERTS, slot_bytes=MOE_SLOTS * EXPERT_BYTES)
                     if self.script.moe else None)
        self._moe_tokens = 0  # tokens routed since load
        self._stats = EngineStats(n_ctx=n_ctx, vram=self._memory(0), moe=replace(self._moe) if self._moe else None)
        self._inbox: queue.Queue = queue.Queue()
        self._current: ScriptedJob | None = None
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="scripted-engine", daemon=True)
        self.thread.start()

    # -- the seam ---------------------------------------------------------------------------
    @classmethod
    def loader(cls, script: Script | None = None) -> Callable[..., "ScriptedEngine"]:
        """A function with Engine.load's signature that builds a ScriptedEngine."""
        script = script or Script()

        def load(path=None, backend="auto", n_ctx=4096, draft=None, vram_budget=None, progress=None, kv_type="f16",
                 moe_vram=None):
            report = progress or (lambda msg: None)
            shown = str(path) if path else "scripted-tiny.gguf"
            for step in ("fetch: using " + shown, "kernel build: nothing to build (scripted)",
                         "weight upload: 92.0 MiB"):
                report(step)
                time.sleep(script.load_delay_s / 3)
            if shown in script.fail_paths:
                raise ModelFormatError(script.fail_paths[shown])
            if script.oom_above_ctx is not None and n_ctx > script.oom_above_ctx:
                raise DeviceOutOfMemory(
                    f"cannot reserve {n_ctx // 8} MiB for the kv region (weights 4258.0 MiB, kv {n_ctx // 8}.0 MiB; "
                    f"device free {script.oom_above_ctx // 8 + 100}.0 MiB of 8192.0 MiB); try a smaller --ctx, "
                    "--kv-type q8_0, or a smaller model")
            if draft is not None and str(draft) in script.fail_drafts:
                raise MemraError(script.fail_drafts[str(draft)])
            return cls(script, shown, n_ctx, kv_type, str(draft) if draft is not None else None, moe_vram)

        return load

    def chat(self, messages: list[dict], sampling: SamplingParams, grammar=None, spec=None, stop=(),
             reply_prefix=()) -> ScriptedJob:
        return self._submit(ScriptedJob(self, len(self.jobs), messages, None, sampling, grammar, spec, stop,
                                        reply_prefix))

    def complete(self, prompt: str, sampling: SamplingParams, stop=(), grammar=None, spec=None) -> ScriptedJob:
        return self._submit(ScriptedJob(self, len(self.jobs), None, prompt, sampling, grammar, spec, stop))

    def stats(self) -> EngineStats:
        return self._stats

    def count_tokens(self, messages: list[dict]) -> int:
        """The scripted prompt size of a conversation (the count its replies report)."""
        self.counted.append([dict(m) for m in messages])
        return len(split_tokens("".join(m["content"] for m in messages))) + 4 * len(messages)

    def close(self) -> None:
        self._closed = True
        if self._current is not None:
            self._current.cancel()
        self._inbox.put(None)
        self.thread.join(timeout=1.0)

    # -- the engine thread ------------------------------------------------------------------
    def _submit(self, job: ScriptedJob) -> ScriptedJob:
        self.jobs.append(job)
        if self._closed:
            job._events.put(DoneEvent("error", "engine is closed"))
        else:
            self._inbox.put(job)
        return job

    def _run(self) -> None:
        while (job := self._inbox.get()) is not None:
            self._current = job
            try:
                self._play(job)
            except Exception as e:  # a bug here ends the job with an error, not a test that hangs
                if not job.done_reason:
                    self._finish(job, DoneEvent("error", f"scripted engine: {e!r}"))
            finally:
                self._current = None

    def _prompt_tokens(self, job: ScriptedJob) -> int:
        if job.prompt is not None:
            return len(split_tokens(job.prompt))
        return len(split_tokens("".join(m["content"] for m in job.messages))) + 4 * len(job.messages)

    def _play(self, job: ScriptedJob) -> None:
        job.moe_base = replace(self._moe) if self._moe else None
        try:
            job.sampling.validate()
            if job.spec is not None:
                job.spec.validate()
        except ValueError as e:
            return self._finish(job, DoneEvent("error", str(e)))
        if job.spec is not None and job.spec.mode == "draft" and not self.info.draft_model_name:
            return self._finish(job, DoneEvent("error", "spec mode draft: no draft model loaded (use --draft)"))
        n_prompt = self._prompt_tokens(job)
        if n_prompt >= self.info.n_ctx:
            return self._finish(job, DoneEvent("error", f"prompt of {n_prompt} tokens does not fit in n_ctx={self.info.n_ctx}",
                                               error_kind="prompt_too_long"))
        tokens = split_tokens(self.script.replies[job.index % len(self.script.replies)])
        if self.script.n_tokens is not None:
            tokens = [tokens[i % len(tokens)] for i in range(self.script.n_tokens)]
        skip = len(job.reply_prefix)  # a branch: the reply goes on after its prefix's positions
        n_prompt += skip
        tokens = tokens[skip:]
        reason = "eos"
        if len(tokens) > job.sampling.max_tokens:
            tokens, reason = tokens[: job.sampling.max_tokens], "length"
        # A steady, deterministic speed per job so the sparkline has a shape.
        rate = self.script.tokens_per_s * (1.0 - 0.04 * (job.index % 5))
        hold_at = self.script.pause_at.get(job.index, self.script.pause_after)
        spec, rng = job.spec, random.Random(job.index)
        params, n_script = job.sampling, len(split_tokens(self.script.replies[job.index % len(self.script.replies)]))
        self._route(job, n_prompt)
        start = time.perf_counter()
        for i, text in enumerate(tokens):
            if hold_at is not None and i == hold_at:
                job._events.put(StatsEvent(self._make_stats(job, n_prompt, i, rate)))
                while not (job._cancelled.is_set() or job._released.is_set()):
                    job._cancelled.wait(0.01)
                start = time.perf_counter() - i / rate
            due = start + i / rate
            while (wait := due - time.perf_counter()) > 0 and not job._cancelled.is_set():
                time.sleep(min(wait, 0.005))
            if job._cancelled.is_set():
                return self._finish(job, DoneEvent("cancelled"), n_prompt, i, rate)
            if i == 3 and self.script.reply_oom_above_ctx is not None and self.info.n_ctx > self.script.reply_oom_above_ctx:
                return self._finish(job, DoneEvent(
                    "error", "scratch region full: attention needs 96.0 MiB, 12.0 MiB of 96.0 MiB left; try a smaller "
                    "--ctx, --kv-type q8_0, or a smaller model", error_kind="out_of_memory"))
            if job.spec_rounds.tokens_left == 0:  # a round is over: a new spec applies from here
                if job._spec_update is not None:
                    spec, job._spec_update = job._spec_update, None
                if spec is not None and spec.enabled:
                    job.spec_rounds.play_round(spec, rng)
            job.spec_rounds.tokens_left = max(0, job.spec_rounds.tokens_left - 1)
            if job._sampling_update is not None:  # new knobs: they change the candidates, not the reply
                params, job._sampling_update = job._sampling_update, None
            job.emitted.append(text)
            job.last_token_time = time.perf_counter()
            position = (skip + i) % n_script  # a cycled reply (Script.n_tokens) repeats its tokens and their ids
            token_id = 1000 + position
            candidates, logprob = scripted_candidates(position, text, token_id, params, job.grammar is not None)
            job._events.put(TokenEvent(text, token_id, logprob, candidates))
            self._route(job, 1)
            if (i + 1) % self.script.stats_every == 0:
                job._events.put(StatsEvent(self._make_stats(job, n_prompt, i + 1, rate)))
        self._finish(job, DoneEvent(reason), n_prompt, len(tokens), rate)

    def _finish(self, job: ScriptedJob, done: DoneEvent, n_prompt: int = 0, n_gen: int = 0, rate: float = 0.0) -> None:
        if done.reason != "error":
            job._events.put(StatsEvent(self._make_stats(job, n_prompt, n_gen, rate)))
        job.done_reason = done.reason
        job._events.put(done)

    def _route(self, job: ScriptedJob, n_tokens: int) -> None:
        """Route n tokens through the scripted expert cache. The miss share falls from about a third
        as the cache warms up, with a wobble (the topic shifts); each miss copies one expert in, at
        24-27 GB/s (a plausible pinned host -> VRAM rate), into a free slot while there is one."""
        m = self._moe
        if m is None:
            return
        gb_s = 24.0 + 1.5 * (job.index % 3)
        for _ in range(n_tokens):
            t = self._moe_tokens
            share = 0.03 + 0.3 * 0.5 ** (t / 64) + 0.02 * (t // 16 % 3)
            lookups = MOE_LAYERS * MOE_TOP_K
            misses = round(lookups * share)
            m.total_hits += lookups - misses
            m.total_misses += misses
            m.total_bytes_moved += misses * EXPERT_BYTES
            m.total_copy_seconds += misses * EXPERT_BYTES / (gb_s * 1e9)
            m.resident_experts = min(MOE_SLOTS, m.total_misses)
            self._moe_tokens += 1

    def _make_stats(self, job: ScriptedJob, n_prompt: int, n_gen: int, rate: float) -> EngineStats:
        moe = self._moe.since(job.moe_base) if self._moe else None  # this reply's counters, as the engine's
        r = job.spec_rounds.counters
        self._stats = EngineStats(
            decode_tok_s=rate, prefill_tok_s=1500.0 + 50.0 * (job.index % 3), time_to_first_token_s=0.042,
            n_prompt_tokens=n_prompt, n_generated=n_gen, n_ctx_used=n_prompt + n_gen, n_ctx=self.info.n_ctx,
            spec_rounds=r.rounds, spec_drafted=r.drafted, spec_accepted=r.accepted,
            spec_drafted_by_pos=list(r.drafted_by_pos), spec_accepted_by_pos=list(r.accepted_by_pos),
            moe=moe, vram=self._memory(n_prompt + n_gen),
        )
        return self._stats

    def _memory(self, n_tokens: int) -> VramStats:
        if self.script.backend != "cuda":
            return VramStats(process_rss=412 * MiB)
        reserved = {"weights": 4258 * MiB, "kv": 512 * MiB, "scratch": 96 * MiB, "graph": 8 * MiB}
        used = dict(reserved, kv=min(reserved["kv"], n_tokens * 128 * 1024))
        if self._moe is not None:  # the expert cache's slots: a region of their own, used as they fill
            reserved["experts"] = self._moe.slot_bytes
            used["experts"] = self._moe.resident_experts * EXPERT_BYTES
        total = 141 * GiB
        return VramStats(reserved=reserved, used=used, device_total=total,
                         device_free=total - sum(reserved.values()) - 600 * MiB)
