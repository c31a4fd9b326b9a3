"""Choosing the next token from the logits: greedy, temperature, top-k, top-p, repetition penalty.

Deterministic everywhere: the PRNG is our own (xorshift64*, seeded through splitmix64), the softmax is
the assembly kernel, and cumulative sums run in a fixed order, so the same seed gives the same text on
every machine.
"""
from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentError, NonFiniteLogitsError

MASK64 = (1 << 64) - 1


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


MIN_TEMPERATURE = 1e-4          # below this (0 included) sampling is greedy: see tiny_value_rule
MIN_REPETITION_PENALTY = 1e-4   # below this a repetition penalty is refused


def tiny_value_rule(temperature: float, repetition_penalty: float) -> tuple[float, float]:
    """THE rule for tiny temperatures and repetition penalties, for every caller (API, CLI, Sampler):
    (temperature, repetition_penalty) as sampling will use them, already range-checked as numbers.

    The sampler divides float32 logits by both; a value near zero (1e-39 is a float32 subnormal, 1e-300
    rounds to 0.0) sends logits to inf and the softmax to NaN.  So:
    - temperature in (0, MIN_TEMPERATURE) is greedy, as 0 is (the limit of sampling as T -> 0: the
      most likely token; ties go to the first, as with 0) -- returned as 0.0;
    - repetition_penalty in (0, MIN_REPETITION_PENALTY) is an InvalidArgumentError (no limit makes sense).
    Logits up to 3e34 in magnitude stay finite after either division at the smallest accepted value."""
    if 0.0 < repetition_penalty < MIN_REPETITION_PENALTY:
        raise InvalidArgumentError(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, 100] "
                                   f"(1 = off), got {repetition_penalty!r}")
    return (0.0 if temperature < MIN_TEMPERATURE else temperature), repetition_penalty


def check_params(temperature: float, top_k: int, top_p: float, repetition_penalty: float) -> tuple[float, float]:
    """Range checks, then tiny_value_rule: the (temperature, repetition_penalty) to sample with."""
    if not (isinstance(temperature, (int, float)) and 0.0 <= temperature <= 100.0):
        raise InvalidArgumentError(f"temperature must be in [0, 100], got {temperature!r}")
    if not (isinstance(top_k, int) and top_k >= 0):
        raise InvalidArgumentError(f"top_k must be an integer ≥ 0 (0 = off), got {top_k!r}")
    if not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise InvalidArgumentError(f"top_p must be in (0, 1], got {top_p!r}")
    if not (isinstance(repetition_penalty, (int, float)) and 0.0 < repetition_penalty <= 100.0):
        raise InvalidArgumentError(f"repetition_penalty must be in (0, 100], got {repetition_penalty!r}")
    return tiny_value_rule(float(temperature), float(repetition_penalty))


class Sampler:
    def __init__(self, softmax, temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int = 0, argmax=None):
        temperature, repetition_penalty = check_params(temperature, top_k, top_p, repetition_penalty)
        if not (isinstance(seed, int) and 0 <= seed < 1 << 64):
            raise InvalidArgumentError(f"seed must be an integer in [0, 2^64), got {seed!r}")
        self.softmax = softmax                   # the assembly softmax: float32 [n] -> float32 [n]
        self.argmax = argmax                     # the assembly argmax: float32 [n] -> first max, None if
                                                 # any NaN/inf (greedy: one pass over the cold logits)
        self.temperature, self.top_k, self.top_p = float(temperature), top_k, float(top_p)
        self.penalty = float(repetition_penalty)
        self.rng = Rng(seed)

    def __call__(self, logits: np.ndarray, history: list[int] | None = None, first_max=None) -> int:
        """logits [vocab] float32 (not modified) -> token id.  first_max: None, or a function giving the
        argmax of these logits as self.argmax would (an int, None if any is non-finite), already computed
        (the step's LM head job: no second pass over the logits)."""
        greedy = self.temperature == 0.0 and (self.penalty == 1.0 or not history)
        if greedy and (first_max is not None or self.argmax is not None):
            i = first_max() if first_max is not None else self.argmax(logits)     # plain greedy: first max
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
        bad = int(np.count_nonzero(~np.isfinite(logits)))
        raise NonFiniteLogitsError(f"the model produced {bad} non-finite logits (NaN/inf); "
                                   "the weights may be corrupt — refusing to sample")

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
