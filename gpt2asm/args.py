"""The validators of user arguments: one per kind, used by the CLI, the API, the model and the sampler.

    token_id(t, vocab)            one token id: an integer (int or numpy integer, not bool) in 0..vocab-1
    token_ids(ids, vocab)         a 1-D sequence of them -> list[int] (empty=False: at least one)
    sampling(temperature, top_k, top_p, repetition_penalty, seed) -> dict
                                  the sampling arguments, checked and normalised (seed None: random)
    integer(name, v, lo, hi)      an integer argument in lo..hi (max_new_tokens, threads, ...)
    number(name, v, lo, hi)       a finite real argument in [lo, hi] (or (lo, hi] with lo_open)

Each raises InvalidArgumentError naming the argument; nothing is called before all are checked.
Arrays that reach assembly by address are checked by validate.py.
"""
from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterable

import numpy as np

from .errors import InvalidArgumentError

MAX_SEED = (1 << 64) - 1
MAX_TOP_K = 1 << 20


def integer(name: str, v, lo: int, hi: int | None = None) -> int:
    if isinstance(v, (bool, np.bool_)):
        raise InvalidArgumentError(f"{name} must be an integer, got {v!r}")
    try:
        v = operator.index(v)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, got {type(v).__name__} {v!r}") from None
    if v < lo or (hi is not None and v > hi):
        raise InvalidArgumentError(f"{name} must be in {lo}..{hi if hi is not None else '∞'}, got {v}")
    return v


def number(name: str, v, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(f"{name} must be a number, got {type(v).__name__} {v!r}")
    f = float(v)
    if not math.isfinite(f) or not (lo < f if lo_open else lo <= f) or f > hi:
        raise InvalidArgumentError(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return f


def token_id(t, vocab: int) -> int:
    """A token id in 0..vocab-1."""
    return integer("token id", t, 0, vocab - 1)


def token_ids(ids, vocab: int, empty: bool = True) -> list[int]:
    """A list of token ids in 0..vocab-1 from a 1-D sequence (no str, bytes, float, bool or numpy floats)."""
    if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Iterable):
        raise InvalidArgumentError(f"expected a sequence of token ids, got {type(ids).__name__}")
    if isinstance(ids, np.ndarray) and ids.ndim != 1:
        raise InvalidArgumentError(f"expected a 1-D sequence of token ids, got shape {ids.shape}")
    out = [token_id(t, vocab) for t in ids]
    if not out and not empty:
        raise InvalidArgumentError("at least one token id is needed")
    return out


def sampling(temperature=0.8, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=None) -> dict:
    """The sampling arguments, checked: temperature in [0, 100] (0 = greedy), top_k in 0..2^20 (0 = off),
    top_p in (0, 1], repetition_penalty in (0, 100], seed in 0..2^64-1 (None: a fresh random seed)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    return dict(temperature=number("temperature", temperature, 0.0, 100.0),
                top_k=integer("top_k", top_k, 0, MAX_TOP_K),
                top_p=number("top_p", top_p, 0.0, 1.0, lo_open=True),
                repetition_penalty=number("repetition_penalty", repetition_penalty, 0.0, 100.0, lo_open=True),
                seed=integer("seed", seed, 0, MAX_SEED))
