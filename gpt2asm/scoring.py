"""Scoring text: per-token log-probabilities, windows past the context, perplexity.

    lp = token_logprobs_many(gpt2, [ids_a, ids_b])      # [len(ids)] float64 each; lp[0] is NaN
    ppl = perplexity(lp)                                 # exp(-mean of the scored tokens)

Entry t of a text's array is log p(token t | the tokens before it), t >= 1 (entry 0 has no context: NaN).
A text longer than the model's context (n_ctx) is scored by the sliding-window method transformers
documents for perplexity ("Perplexity of fixed-length models"): windows of n_ctx tokens starting every
`stride` tokens (default min(512, n_ctx // 2)); each window scores only the tokens not scored by the
window before it, each with the context of its window.  Every window is one full-prefix forward
(GPT2.logits: the prefill's row kernels, then the LM head over the rows), and the log-softmax is taken
in float64 over the whole vocabulary.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import InvalidArgumentError, shown
from .sampler import non_finite_error

DEFAULT_STRIDE = 512


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64 (max-shifted)."""
    z = np.asarray(logits, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))


def picked_log_softmax(rows: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """log_softmax(rows)[i, picks[i]] for each row i: the same float64 operations on the same values
    (so the same bits), without the whole log-softmax array (one float64 copy of the rows, worked in
    place: a short text's scoring ~1.4x faster on 124M)."""
    z = np.array(rows, np.float64)                                  # a copy: exp'd in place below
    picked = z[np.arange(len(z)), picks]
    m = z.max(axis=-1, keepdims=True)
    np.subtract(z, m, out=z)
    np.exp(z, out=z)
    return picked - (m[:, 0] + np.log(z.sum(axis=-1)))


def default_stride(n_ctx: int) -> int:
    return max(1, min(DEFAULT_STRIDE, n_ctx // 2))


def windows(n_tokens: int, n_ctx: int, stride: int) -> list[tuple[int, int, int]]:
    """The windows (begin, end, first scored position) covering n_tokens: transformers' loop

        prev_end = 0
        for begin in range(0, n, stride): end = min(begin + n_ctx, n); score [max(prev_end, begin + 1), end);
                                          prev_end = end; stop once end == n
    """
    if stride < 1 or n_ctx < 2:
        raise InvalidArgumentError(f"stride must be >= 1 and n_ctx >= 2, got {stride}, {n_ctx}")
    out, prev_end = [], 0
    for begin in range(0, max(n_tokens, 1), stride):
        end = min(begin + n_ctx, n_tokens)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end >= n_tokens:
            break
    return out


def token_logprobs_many(gpt2, texts, stride: int | None = None,
                        progress: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Per-token log-probabilities of each text (a str, tokenized, or a list of token ids): a float64
    array [len(ids)] per text, NaN at 0 (and at any position no window scores, possible only with
    stride >= n_ctx).  progress(n) is called with the tokens scored after each window.  Non-finite logits
    (weights that overflow) are a NonFiniteLogitsError, as in generation."""
    n_ctx = gpt2.config.n_ctx
    stride = default_stride(n_ctx) if stride is None else stride
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or not 1 <= stride <= n_ctx:
        raise InvalidArgumentError(f"stride must be an integer in 1..{n_ctx}, got {shown(stride)}")
    if isinstance(texts, (str, bytes)) or not isinstance(texts, (list, tuple)):
        raise InvalidArgumentError("logprobs() takes a list of texts or of token id lists")
    id_lists = [gpt2.encode(t) if isinstance(t, str) else gpt2.check_ids(t) for t in texts]
    out = []
    for ids in id_lists:
        lp = np.full(len(ids), np.nan)
        if len(ids) >= 2:
            for begin, end, first in windows(len(ids), n_ctx, int(stride)):
                if first >= end:
                    continue
                logits = gpt2.logits(ids[begin:end])                    # [end - begin][V] float32
                rows = logits[first - 1 - begin:end - 1 - begin]        # predicting tokens first..end-1
                if not np.isfinite(rows).all():                         # no probability to take of them
                    raise non_finite_error(rows, "score the text", f" over tokens {first - 1}..{end - 2}")
                lp[first:end] = picked_log_softmax(rows, np.asarray(ids[first:end]))
                if progress is not None:
                    progress(end - first)
        out.append(lp)
    return out


def perplexity(logprobs) -> float:
    """exp(-mean log p) over every scored token (the NaNs excluded) of one array or a list of arrays."""
    arrs = [logprobs] if isinstance(logprobs, np.ndarray) else list(logprobs)
    v = np.concatenate([a[~np.isnan(a)] for a in arrs]) if arrs else np.empty(0)
    if v.size == 0:
        raise InvalidArgumentError("no token to score (each text needs at least two tokens)")
    return float(np.exp(-v.mean()))
