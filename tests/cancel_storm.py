"""Cancel storms (issue 17 §4), shared by the CPU test and the GPU one: many replies cancelled at
random points (before the job starts, inside the prefill, after a few tokens, after a random
delay), over conversations that share, extend and abandon each other's prefixes, so the KV
cache is cut at every kind of place. After the storm the next greedy reply must equal a fresh
engine's, token for token."""
from __future__ import annotations

import random
import threading
import time

from memra_engine.events import DoneEvent, TokenEvent
from memra_engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
TOPICS = ["the fox", "a river in spring", "why the sky is blue", "the cat sat on the mat", "abcab abcab"]
FINAL_CHAT = [{"role": "user", "content": "Tell me about the fox and the river."}]


def storm_chat(rng: random.Random) -> list[dict]:
    """A conversation of 1-4 turns on a few shared topics: replies often share a prefix with the
    conversation the cache holds, and sometimes a long one that takes several prefill chunks."""
    turns: list[dict] = []
    long_turn = rng.randrange(6) if rng.random() < 0.3 else -1  # at most one: past 128 tokens, it takes two prefill chunks; the context is 256
    for i in range(rng.randint(1, 3)):
        topic = TOPICS[rng.randrange(len(TOPICS))]
        text = (f"{topic}, " * 40)[: rng.randint(130, 170)] if i == long_turn else f"Tell me about {topic}."
        turns.append({"role": "user", "content": text})
        if i < 2 and rng.random() < 0.7:
            turns.append({"role": "assistant", "content": f"About {topic}: it is {rng.choice(['old', 'new', 'red'])}."})
    if turns[-1]["role"] == "assistant":
        turns.pop()
    return turns


def run_cancel_storm(engine, n_cancels: int, seed: int, grammar=None, spec=None) -> dict[str, int]:
    """Cancel n_cancels replies at random points; returns how the replies ended (by reason) and
    where they were cut ("before", "tokens", "delay"). Every job ends with exactly one DoneEvent."""
    rng = random.Random(seed)
    tally: dict[str, int] = {}
    for _ in range(n_cancels):
        params = SamplingParams(temperature=rng.choice([0.0, 0.7, 1.2]), seed=rng.randrange(1 << 30),
                                max_tokens=rng.randint(4, 40))
        job = engine.chat(storm_chat(rng), params, grammar=grammar, spec=spec)
        point = rng.choice(["before", "tokens", "tokens", "delay"])
        tally[point] = tally.get(point, 0) + 1
        timer = None
        if point == "before":
            job.cancel()
        elif point == "delay":
            timer = threading.Timer(rng.uniform(0.0, 0.02), job.cancel)
            timer.start()
        cut_after = rng.randint(0, 6)
        n_tokens, dones = 0, []
        for event in job:
            if isinstance(event, TokenEvent):
                n_tokens += 1
                if point == "tokens" and n_tokens == cut_after + 1:
                    t0 = time.perf_counter()
                    job.cancel()
                    assert time.perf_counter() - t0 < 0.01, "cancel() must return at once"
            elif isinstance(event, DoneEvent):
                dones.append(event)
        if timer is not None:
            timer.join()
        assert len(dones) == 1, dones
        assert dones[0].reason in ("cancelled", "eos", "length", "stop", "context"), dones[0]
        tally[dones[0].reason] = tally.get(dones[0].reason, 0) + 1
    return tally


def greedy_ids(engine, grammar=None, spec=None) -> tuple[list[int], DoneEvent]:
    result = engine.chat(FINAL_CHAT, GREEDY, grammar=grammar, spec=spec).collect()
    return result.token_ids, result.done
