"""A tiny deterministic stand-in for the model pieces (tokenizer, backend), to test the generation
loop's own logic (stop strings, cancel timing, cache bookkeeping) with full control of the tokens."""
from __future__ import annotations

import time
import zlib

import numpy as np

from memra_engine.events import EngineInfo, VramStats
from memra_engine.generate import Engine, LoadedModel

EOS = 0
BOS = 1


class CharTokenizer:
    """One token per ASCII character (ids 32..126); 0 = EOS, 1 = BOS."""

    bos_id = BOS
    eos_ids = {EOS}
    vocab_size = 128

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return ([BOS] if add_special else []) + [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids if i >= 32)

    def stream_decoder(self):
        tok = self

        class Decoder:
            def push(self, token: int) -> str:
                return tok.decode([token])

            def flush(self) -> str:
                return ""

            def drop(self) -> None:
                pass

        return Decoder()


class ScriptedBackend:
    """Logits that depend on everything in the cache, so a wrong cache shows up as different text.

    `script`, if given, forces the reply: after the prompt, position i gets a peak at script[i].
    """

    kv_type = "f16"
    device_name = "scripted"
    prefill_chunk = 128
    samples_on_device = False

    def __init__(self, n_ctx: int = 256, script: list[int] | None = None, step_s: float = 0.0):
        self.n_ctx = n_ctx
        self.n_past = 0
        self.tokens: list[int] = []
        self.script = script
        self.step_s = step_s
        self.prompt_len = 0
        self.prefill_calls: list[int] = []
        self.closed = False

    def _logits(self) -> np.ndarray:
        seed = zlib.crc32(np.asarray(self.tokens, dtype=np.int64).tobytes())
        logits = np.random.default_rng(seed).normal(size=128).astype(np.float32)
        logits[:32] = -30.0
        logits[BOS] = -30.0
        logits[EOS] = -5.0
        if self.script is not None:
            i = len(self.tokens) - self.prompt_len
            if 0 <= i < len(self.script):
                logits[self.script[i]] = 50.0
        return logits

    def prefill(self, tokens, all_logits: bool = False):
        assert self.n_past + len(tokens) <= self.n_ctx
        self.prefill_calls.append(len(tokens))
        self.tokens.extend(tokens)
        self.n_past = len(self.tokens)
        self.prompt_len = self.n_past + 1  # the engine feeds the prompt's last token through decode
        return self._logits()

    def decode(self, token: int):
        assert self.n_past < self.n_ctx
        time.sleep(self.step_s)
        self.tokens.append(token)
        self.n_past = len(self.tokens)
        return self._logits()

    def truncate(self, n: int) -> None:
        self.tokens = self.tokens[:n]
        self.n_past = n
        self.prompt_len = n + 1

    def memory_stats(self) -> VramStats:
        return VramStats(process_rss=1)

    def moe_stats(self):
        return None

    def close(self) -> None:
        self.closed = True


def fake_engine(backend: ScriptedBackend) -> Engine:
    info = EngineInfo("fake", "fake", 0, "", backend.n_ctx, "cpu", "none", has_chat_template=False)
    return Engine.start(lambda: (LoadedModel(None, CharTokenizer(), None, backend), info))


class DeviceSamplingBackend(ScriptedBackend):
    """ScriptedBackend with the cuda backend's sampling surface (set_sampling / sample_logits /
    decode_sample). Sampling here uses the CPU sampler with a seeded rng and the cache as history,
    as the device does, and counts calls so tests can see which path the engine took."""

    samples_on_device = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = {"set_sampling": 0, "sample_logits": 0, "decode_sample": 0, "decode": 0}
        self.seeds: list[int] = []

    def set_sampling(self, params, seed=None, use_mask=False) -> int:
        from memra_engine.sampling import make_rng

        self.calls["set_sampling"] += 1
        seed = 1234 if seed is None else seed
        self.params, self.rng = params, make_rng(seed)
        self.seeds.append(seed)
        return seed

    def _draw(self, logits):
        from memra_engine.sampling import sample

        return sample(logits, self.params, self.tokens, self.rng)

    def sample_logits(self, logits):
        self.calls["sample_logits"] += 1
        return self._draw(logits)

    def decode(self, token: int):
        self.calls["decode"] += 1
        return super().decode(token)

    def decode_sample(self, token: int, ahead: bool = True):
        self.calls["decode_sample"] += 1
        return self._draw(super().decode(token))

    def step_candidates(self):
        return None


def wrapped_engine(path, kind: str, n_ctx: int, wrap) -> tuple[Engine, list]:
    """An Engine on a real model whose backend is wrap(backend), made on the engine thread; the
    list receives the wrapped backend, for the test to read."""
    from memra_engine.generate import open_model
    from memra_engine.model.gguf_file import open_gguf

    made = []

    def opener():
        model, info = open_model(open_gguf(path), kind, n_ctx, None, lambda msg: None)
        model.backend = wrap(model.backend)
        made.append(model.backend)
        return model, info

    return Engine.start(opener), made
