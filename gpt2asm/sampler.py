"""Choosing the next token from the logits: greedy, temperature, top-k, top-p, repetition penalty.

Deterministic everywhere: the PRNG is our own (xorshift64*, seeded through splitmix64), the softmax is
the assembly kernel, and cumulative sums run in a fixed order, so the same seed gives the same text on
every machine.
"""
from __future__ import annotations

import numpy as np

from .args import sampling, tiny_value_rule  # noqa: F401 (tiny_value_rule: the rule sampling() applies)
from .errors import NonFiniteLogitsError

MASK64 = (1 << 64) - 1
UNKNOWN = object()           # Sampler(first_max=...): no argmax computed with the logits


class Rng:
    """xorshift64* seeded with splitmix64: uniform floats in [0, 1) with 53 bits."""

    def __init__(self, seed: int):
        z = (seed + 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        self.state = (z ^ (z >> 31)) or 1

    def random(self) -> float:
        x = self.state
        x ^= x >> 12
        x ^= (x << 25) & MASK64
        x ^= x >> 27
        self.state = x
        return (((x * 0x2545F4914F6CDD1D) & MASK64) >> 11) * (1.0 / (1 << 53))


def non_finite_error(logits: np.ndarray, doing: str, where: str = "") -> NonFiniteLogitsError:
    """The error for logits with NaN or inf (the weights overflowed or are corrupt: there is no token to
    sample or score); `doing` is what is refused, `where` e.g. " over the prompt"."""
    bad = int(np.count_nonzero(~np.isfinite(logits)))
    return NonFiniteLogitsError(f"the model produced {bad} non-finite logits (NaN/inf){where}; "
                                f"the weights may be corrupt — refusing to {doing}")


class Sampler:
    def __init__(self, softmax, temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int | None = 0, argmax=None):
        """Arguments checked by args.sampling (seed None: random)."""
        a = sampling(temperature, top_k, top_p, repetition_penalty, seed)
        self.softmax = softmax                   # the assembly softmax: float32 [n] -> float32 [n]
        self.argmax = argmax                     # the assembly argmax: float32 [n] -> first max, None if
                                                 # any NaN/inf (greedy: one pass over the cold logits)
        self.temperature, self.top_k, self.top_p = a["temperature"], a["top_k"], a["top_p"]
        self.penalty, self.seed = a["repetition_penalty"], a["seed"]
        self.rng = Rng(self.seed)

    def __call__(self, logits: np.ndarray, history: list[int] | None = None, first_max=UNKNOWN) -> int:
        """logits [vocab] float32 (not modified) -> token id.  first_max: the index of the first maximum
        of these logits as self.argmax would give it (None if any is non-finite), already computed (the
        argmax a model step returns, found by its LM head job: no second pass over the logits), or
        UNKNOWN."""
        greedy = self.temperature == 0.0 and (self.penalty == 1.0 or not history)
        if greedy and (first_max is not UNKNOWN or self.argmax is not None):
            i = first_max if first_max is not UNKNOWN else self.argmax(logits)    # plain greedy: first max
            if i is None:
                self._non_finite(logits)
            return i
        if not np.isfinite(logits).all():
            self._non_finite(logits)
        if greedy:
            return int(np.argmax(logits))
        return self._sample(logits, history)

    @staticmethod
    def _non_finite(logits: np.ndarray) -> None:
        raise non_finite_error(logits, "sample")

    def _sample(self, logits: np.ndarray, history: list[int] | None) -> int:
        z = logits.astype(np.float32, copy=True)
        if self.penalty != 1.0 and history:
            seen = np.unique(np.asarray(history, np.int64))
            p = np.float32(self.penalty)
            z[seen] = np.where(z[seen] > 0, z[seen] / p, z[seen] * p)   # as transformers does
        if self.temperature == 0.0:
            return int(np.argmax(z))                                      # first maximum
        z /= np.float32(self.temperature)
        if self.top_k and self.top_k < z.size:
            kth = np.partition(z, z.size - self.top_k)[z.size - self.top_k]
            z[z < kth] = -np.inf                                           # ties at the kth value stay
        probs = self.softmax(z)
        order = np.argsort(-probs, kind="stable")                           # most likely first
        p_sorted = probs[order].astype(np.float64)
        cum = np.cumsum(p_sorted)                                          # sequential, fixed order
        keep = p_sorted.size
        if self.top_p < 1.0:
            keep = int(np.searchsorted(cum, self.top_p, side="left")) + 1   # smallest set reaching top_p
            keep = min(keep, p_sorted.size)
        total = cum[keep - 1]
        r = self.rng.random() * total
        i = int(np.searchsorted(cum[:keep], r, side="right"))
        return int(order[min(i, keep - 1)])
