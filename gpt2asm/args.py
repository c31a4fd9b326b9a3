"""The validators of user arguments: one per kind, used by the CLI, the API, the model and the sampler.

    token_id(t, vocab)            one token id: an integer (int or numpy integer, not bool) in 0..vocab-1
    token_ids(ids, vocab)         a 1-D sequence of them -> list[int] (empty=False: at least one)
    sampling(temperature, top_k, top_p, repetition_penalty, seed) -> dict
                                  the sampling arguments, checked and normalised (seed None: random)
    integer(name, v, lo, hi)      an integer argument in lo..hi (max_new_tokens, threads, ...)
    number(name, v, lo, hi)       a finite real argument in [lo, hi] (or (lo, hi] with lo_open)
    not_retired(dtype)            a weight dtype that is no more (RETIRED_DTYPES) is refused, naming its successor

Each raises InvalidArgumentError naming the argument; nothing is called before all are checked.
Arrays that reach assembly by address are checked by validate.py.
"""
from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterable, Mapping, Set

import numpy as np

from .errors import InvalidArgumentError, shown

MAX_SEED = (1 << 64) - 1
MAX_TOP_K = 1 << 20
MIN_TEMPERATURE = 1e-4          # below this (0 included) sampling is greedy: see tiny_value_rule
MIN_REPETITION_PENALTY = 1e-4   # below this a repetition penalty is refused
# weight dtypes retired (docs/notes.md), and what to use instead: int8 weights with one fp32 scale per
# output row, FMA'd in float -- less accurate and slower to prefill than llama.cpp's Q8_0 blocks
RETIRED_DTYPES = {"q8": "q8_0", "int8": "q8_0"}
_SUCCESSORS = {"q8_0": "llama.cpp's Q8_0 blocks, integer dot products, exact"}


def not_retired(dtype) -> None:
    """InvalidArgumentError naming the successor if dtype (any case, blanks around) is a retired weight dtype."""
    new = RETIRED_DTYPES.get(dtype.strip().lower()) if isinstance(dtype, str) else None
    if new is not None:
        raise InvalidArgumentError(f"dtype {shown(dtype)} was retired: use {new!r} ({_SUCCESSORS[new]})")


def integer(name: str, v, lo: int, hi: int | None = None) -> int:
    if isinstance(v, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be an integer, got {shown(v)}")
    try:
        n = operator.index(v)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, got {type(v).__name__} {shown(v)}") from None
    if n < lo or (hi is not None and n > hi):
        raise InvalidArgumentError(f"{name} must be in {lo}..{hi if hi is not None else '∞'}, got {shown(v)}")
    return n


def _is_real(v) -> bool:
    """An int or float (numpy's too), not a bool: what number() takes."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def number(name: str, v, lo: float, hi: float, lo_open: bool = False) -> float:
    if not _is_real(v):
        raise InvalidArgumentError(f"{name} must be a number, got {type(v).__name__} {shown(v)}")
    try:
        f = float(v)
    except OverflowError:                  # an int beyond the float range (10**400)
        f = math.inf
    if not math.isfinite(f) or not (lo < f if lo_open else lo <= f) or f > hi:
        raise InvalidArgumentError(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], got {shown(v)}")
    return f


def token_id(t, vocab: int) -> int:
    """A token id in 0..vocab-1."""
    return integer("token id", t, 0, vocab - 1)


def token_ids(ids, vocab: int, empty: bool = True) -> list[int]:
    """A list of token ids in 0..vocab-1 from a 1-D sequence or an iterator (no str, bytes, float, bool or
    numpy floats; no dict or set, whose order is not the text's)."""
    if isinstance(ids, (str, bytes, bytearray, Mapping, Set)) or not isinstance(ids, Iterable):
        raise InvalidArgumentError(f"expected a sequence of token ids, got {type(ids).__name__}")
    if isinstance(ids, np.ndarray) and ids.ndim != 1:
        raise InvalidArgumentError(f"expected a 1-D sequence of token ids, got shape {ids.shape}")
    out = [token_id(t, vocab) for t in ids]
    if not out and not empty:
        raise InvalidArgumentError("at least one token id is needed")
    return out


def tiny_value_rule(temperature: float, repetition_penalty: float) -> tuple[float, float]:
    """THE rule for tiny temperatures and repetition penalties, for every caller (API, CLI, server, Sampler):
    (temperature, repetition_penalty) as sampling will use them, already range-checked as numbers.

    The sampler divides float32 logits by both; a value near zero (1e-39 is a float32 subnormal, 1e-300
    rounds to 0.0) sends logits to inf and the softmax to NaN.  So:
    - temperature in (0, MIN_TEMPERATURE) is greedy, as 0 is (the limit of sampling as T -> 0: the
      most likely token; ties go to the first, as with 0) -- returned as 0.0;
    - repetition_penalty in (0, MIN_REPETITION_PENALTY) is an InvalidArgumentError (no limit makes sense).
    Logits up to 3e34 in magnitude stay finite after either division at the smallest accepted value."""
    if 0.0 < repetition_penalty < MIN_REPETITION_PENALTY:
        raise _penalty_error(repetition_penalty)
    return (0.0 if temperature < MIN_TEMPERATURE else temperature), repetition_penalty


def _penalty_error(v) -> InvalidArgumentError:
    """The one message of an out-of-range repetition_penalty (0, tiny, negative, inf, > 100 alike)."""
    return InvalidArgumentError(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, 100] (1 = off), "
                                f"got {shown(v)}")


def _penalty(v) -> float:
    """repetition_penalty as a number in (0, 100] (tiny_value_rule then refuses (0, MIN_REPETITION_PENALTY))."""
    try:
        return number("repetition_penalty", v, 0.0, 100.0, lo_open=True)
    except InvalidArgumentError:
        if not _is_real(v):
            raise                               # not a number at all: that message
        raise _penalty_error(v) from None


def sampling(temperature=0.8, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=None) -> dict:
    """The sampling arguments, checked: temperature in [0, 100] (0 = greedy, as is anything below
    MIN_TEMPERATURE), top_k in 0..2^20 (0 = off), top_p in (0, 1], repetition_penalty in
    [MIN_REPETITION_PENALTY, 100], seed in 0..2^64-1 (None: a fresh random seed); tiny_value_rule."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    t, r = tiny_value_rule(number("temperature", temperature, 0.0, 100.0),
                           _penalty(repetition_penalty))
    return dict(temperature=t,
                top_k=integer("top_k", top_k, 0, MAX_TOP_K),
                top_p=number("top_p", top_p, 0.0, 1.0, lo_open=True),
                repetition_penalty=r,
                seed=integer("seed", seed, 0, MAX_SEED))
