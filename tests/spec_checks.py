"""Helpers for the speculative-decoding tests (CPU and GPU): the exact distribution of the first
two generated tokens, a chi-square goodness-of-fit p-value, and prompts that give drafts."""
from __future__ import annotations

import math

from memra_engine.sampling import final_distribution


def repeating_prompt() -> str:
    """An input-grounded prompt: the reply can copy from it, so prompt lookup has drafts."""
    text = "the quick brown fox jumps over the lazy dog; " * 3
    return f"Repeat this text exactly, twice: {text}"


def spec_context(path, with_grammar: bool, n_vocab: int):
    """A context whose prompt-lookup drafts the target often rejects, and the constraint maker
    for the grammar case: regex [a-e]{1,3} over one-letter tokens, the context "abcab" so lookup
    drafts "c", which the grammar allows."""
    if not with_grammar:
        return [3, 4, 5, 6, 3, 4, 5, 6, 3, 4], (lambda: None)  # lookup drafts 5, 6, 3, 4
    from memra_engine.grammar import Grammar, GrammarTokenizer
    from memra_engine.model.gguf_file import open_gguf
    from memra_engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(open_gguf(path))
    letters = [tokenizer.encode(c, add_special=False) for c in "abcab"]
    assert all(len(ids) == 1 for ids in letters)
    grammar_tok, grammar = GrammarTokenizer(tokenizer, n_vocab), Grammar.regex("[a-e]{1,3}")
    return [ids[0] for ids in letters], (lambda: grammar_tok.constraint(grammar))  # one compile, a fresh matcher per draw


def exact_two_token_distribution(backend, context: list[int], params, make_constraint) -> dict[tuple[int, int], float]:
    """P(t1, t2) = P(t1 | context) P(t2 | context, t1) under the full sampling chain (mask,
    penalties, filters, temperature), from the backend's decode logits. Temperature > 0."""
    out: dict[tuple[int, int], float] = {}
    backend.truncate(0)
    backend.prefill(context[:-1])
    first = backend.decode(context[-1])
    constraint = make_constraint()
    allowed = constraint.allowed() if constraint is not None else None
    ids1, p1 = final_distribution(first, params, context, allowed)
    for t1, pr1 in zip(ids1.tolist(), p1.tolist()):
        backend.truncate(len(context))
        second = backend.decode(t1)
        allowed = None
        if constraint is not None:
            constraint.accept(t1)
            allowed = constraint.allowed()
            constraint.rollback(1)
        ids2, p2 = final_distribution(second, params, context + [t1], allowed)
        for t2, pr2 in zip(ids2.tolist(), p2.tolist()):
            out[(t1, t2)] = pr1 * pr2
    return out


def chi_square_p(counts: dict, expected: dict, n: int, min_expected: float = 5.0) -> float:
    """p-value of observed counts against expected probabilities: cells expected >= min_expected
    times stand alone, the rest are pooled into one. A draw outside the support gives 0."""
    if any(expected.get(key, 0.0) <= 0.0 for key in counts):
        return 0.0
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for key, p in expected.items():
        e, o = n * p, counts.get(key, 0)
        if e >= min_expected:
            stat += (o - e) ** 2 / e
            cells += 1
        else:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
    if pooled_exp >= min_expected:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    assert cells >= 2, "too few cells for a chi-square test"
    return upper_gamma_q((cells - 1) / 2, stat / 2)


def upper_gamma_q(a: float, x: float) -> float:
    """The regularized upper incomplete gamma Q(a, x) (the chi-square survival function is
    Q(df/2, stat/2)): a series below a + 1, a continued fraction above (Numerical Recipes 6.2)."""
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h
