"""Real chat prompts through the model's own template, and a teacher-forced comparison of a backend
against the numpy reference: the shared half of tests/gpu/test_real_model_gpu.py (CudaBackend) and
tests/test_q8_1_emulation.py (the GPU's decode numerics emulated in numpy).

Teacher-forced: both backends get the reference's greedy token at every step, so one flip does not
send the two down different continuations, and every position is compared on the same context.
Positions: each prompt's prefill row (the logits of its last token) and each of n_decode steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CHATS = [
    [{"role": "user", "content": "Explain how a refrigerator keeps food cold, step by step."}],
    [{"role": "system", "content": "You are a friendly assistant who writes for children."},
     {"role": "user", "content": "Write a short story about a robot who learns to paint."}],
    [{"role": "user", "content": "What is the difference between a list and a tuple in Python? "
                                 "Give an example of each."}],
    [{"role": "user", "content": "Plan a three-day trip to Rome for a family with two kids."},
     {"role": "assistant", "content": "Happy to help! Do you prefer museums or outdoor activities?"},
     {"role": "user", "content": "Mostly outdoor activities, and we love food."}],
]
N_DECODE = 64


def chat_prompt_ids(g) -> list[list[int]]:
    """Token ids of each of CHATS, rendered and encoded as the generation loop does (generate.py)."""
    from memra_engine.chat_template import ChatTemplate
    from memra_engine.tokenizer import load_tokenizer

    tokenizer, template = load_tokenizer(g), ChatTemplate.from_gguf(g)
    assert template is not None, "the real-model check needs a model with a chat template"
    prompts = []
    for messages in CHATS:
        ids = tokenizer.encode(template.render(messages, add_generation_prompt=True), add_special=True)
        if tokenizer.bos_id is not None and ids[:2] == [tokenizer.bos_id] * 2:
            ids = ids[1:]  # the template wrote BOS itself and the tokenizer added another
        prompts.append(ids)
    return prompts


@dataclass
class Agreement:
    """Per compared position, in order: prompt by prompt, its prefill row then its decode steps."""
    agree: list[bool] = field(default_factory=list)
    rel_err: list[float] = field(default_factory=list)   # ||got - ref|| / ||ref||
    is_prefill: list[bool] = field(default_factory=list)
    ref_margin: list[float] = field(default_factory=list)  # reference's top-1 minus top-2 logit
    rms_err: list[float] = field(default_factory=list)     # sqrt(mean((got - ref)^2))

    def record(self, got: np.ndarray, ref: np.ndarray, is_prefill: bool) -> None:
        assert np.all(np.isfinite(got)), "non-finite logits"
        top2 = np.sort(ref)[-2:]
        self.agree.append(bool(np.argmax(got) == np.argmax(ref)))
        self.rel_err.append(float(np.linalg.norm(got - ref) / np.linalg.norm(ref)))
        self.is_prefill.append(is_prefill)
        self.ref_margin.append(float(top2[1] - top2[0]))
        self.rms_err.append(float(np.sqrt(np.mean((got - ref) ** 2))))

    @property
    def rate(self) -> float:
        return float(np.mean(self.agree))

    def decisive(self, k: float = 5.0) -> np.ndarray:
        """Positions whose reference top-1 leads by more than k times the row's RMS logit error:
        a flip there is not a near-tie (the measure of tests/gpu/test_backend.py)."""
        return np.array(self.ref_margin) > k * np.array(self.rms_err)

    def decisive_rate(self) -> float:
        return float(np.mean(np.array(self.agree)[self.decisive()]))

    def max_err(self, prefill: bool) -> float:
        return max(e for e, p in zip(self.rel_err, self.is_prefill) if p == prefill)

    def summary(self) -> str:
        decode = [e for e, p in zip(self.rel_err, self.is_prefill) if not p]
        flips = [f"{m:.3f}" for m, a in zip(self.ref_margin, self.agree) if not a]
        decisive = self.decisive()
        return (f"top-1 agreement {sum(self.agree)}/{len(self.agree)} = {100 * self.rate:.1f}% "
                f"({np.array(self.agree)[decisive].sum()}/{decisive.sum()} decisive); "
                f"rel err prefill max {self.max_err(True):.4f}, decode max {max(decode):.4f} "
                f"mean {np.mean(decode):.4f}; reference margins at flips: [{', '.join(flips)}]")


def compare_teacher_forced(ref, got, prompts: list[list[int]], n_decode: int = N_DECODE) -> Agreement:
    """Run every prompt through both backends (fresh caches) and n_decode greedy steps of ref."""
    result = Agreement()
    for ids in prompts:
        ref.truncate(0)
        got.truncate(0)
        r, o = ref.prefill(ids), got.prefill(ids)
        result.record(o, r, is_prefill=True)
        for _ in range(n_decode):
            token = int(np.argmax(r))
            r, o = ref.decode(token), got.decode(token)
            result.record(o, r, is_prefill=False)
    return result
