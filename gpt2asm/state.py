"""Per-sequence state: the KV cache and the activation buffers of one forward step.

KV cache layout (docs/kernels.md, attention): k, v [n_layer][n_head][n_ctx][64] float32, or binary16
(by default with every weight dtype but f32: model.Transformer's kv) — each head's keys and values contiguous, so
attention streams them in position order.

The step plan (model.Transformer.build_plan) holds the addresses of these arrays: they are allocated
once here and only ever written in place (restore() copies into them), never replaced.  The row buffers
of a prefill (Rows, and the prefill plan over them) are allocated on the first prefill.
"""
from __future__ import annotations

import numpy as np

from .config import GPT2Config
from .errors import InvalidArgumentError
from .validate import HEAD_DIM, TILE
from .weights import aligned_zeros


def padded(n: int) -> int:
    """n rounded up to a whole number of 64-output tiles."""
    return -(-n // TILE) * TILE


def zeros(shape) -> np.ndarray:
    return aligned_zeros(shape, np.float32)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def best_reuse(states: list["State"], ids: list[int] | None) -> int:
    """Index of the idle State whose cached tokens share the longest prefix with ids (the latest of equals;
    the last without ids)."""
    if not ids:
        return len(states) - 1
    return max(range(len(states)), key=lambda j: (common_prefix(states[j].tokens, ids), j))


def reuse(s: "State", ids: list[int] | None) -> None:
    """Set an idle State up for a call feeding ids: n past the prefix of ids it caches, at most
    len(ids) - 1 (the last token is always fed: its logits are needed), its tokens cut there; no ids:
    n = 0.  Reused positions hold the bits a fresh cache would (a key or value depends only on the
    tokens up to it, and prefill = steps = batched steps), and kernels read only positions below n."""
    s.n = min(common_prefix(s.tokens, ids), len(ids) - 1) if ids else 0
    del s.tokens[s.n:]


class State:
    def __init__(self, cfg: GPT2Config, threads: int = 1, kv_dtype=np.float32):
        C, L, H, T = cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_ctx
        self.cfg = cfg
        self.k = aligned_zeros((L, H, T, HEAD_DIM), kv_dtype)      # [layer][head][pos][64]
        self.v = aligned_zeros((L, H, T, HEAD_DIM), kv_dtype)
        self.x = zeros(C)                           # residual stream
        self.h = zeros(C)                           # LayerNorm output
        self.qkv = zeros(padded(3 * C))             # q | k | v, heads side by side
        self.att = zeros(C)                         # attention output
        self.proj = zeros(padded(C))                # c_proj output, added to x
        self.fc = zeros(padded(4 * C))              # MLP hidden
        self.logits = zeros(padded(cfg.vocab_size))  # [vocab padded to 64]
        self.logits_view = self.logits[:cfg.vocab_size]
        self.scratch = [zeros(H * (-(-T // 16) * 16)) for _ in range(threads)]  # scores: a row per head
        self.n = 0                                          # positions held in the cache
        self.tokens: list[int] = []     # idle (Transformer.lease_state): the tokens cached at 0, 1, ...
        self.made_by = None             # the mark of the Transformer whose new_state made it
        self.plan = None                                    # the step plan over these buffers (model.py),
        self.plan_owner = None                              # built by this Transformer on first use
        self.rows = None                                    # prefill row buffers (prefill_rows)
        self.prefill_plan = None                            # the prefill plan over them and the cache,
        self.prefill_owner = None                           # built by this Transformer on first use

    def prefill_rows(self, rows: int) -> "Rows":
        """The prefill row buffers, allocated once (min(rows, n_ctx) rows) and never replaced."""
        if self.rows is None:
            self.rows = Rows(self.cfg, min(rows, self.cfg.n_ctx))
        return self.rows

    def reset(self) -> None:
        self.n = 0

    @property
    def nbytes(self) -> int:
        """Bytes of its cache and buffers (the prefill rows once made)."""
        arrays = [a for a in vars(self).values() if isinstance(a, np.ndarray)] + self.scratch
        if self.rows is not None:
            arrays += [a for a in vars(self.rows).values() if isinstance(a, np.ndarray)]
        return sum(a.nbytes for a in arrays)

    def snapshot(self) -> tuple[int, np.ndarray, np.ndarray]:
        """(n, k, v): copies of the filled part of the cache."""
        return self.n, self.k[:, :, :self.n].copy(), self.v[:, :, :self.n].copy()

    def restore(self, snap: tuple[int, np.ndarray, np.ndarray]) -> None:
        n, k, v = snap
        if k.dtype != self.k.dtype or v.dtype != self.k.dtype:
            raise InvalidArgumentError(f"snapshot of a {k.dtype} cache, this one is {self.k.dtype}")
        self.k[:, :, :n] = k
        self.v[:, :, :n] = v
        self.n = n


class Rows:
    """Row buffers of a prefill run: one row per token, R rows (model.Transformer.prefill)."""

    def __init__(self, cfg: GPT2Config, R: int):
        C = cfg.n_embd
        self.x = zeros((R, C))                      # residual stream
        self.h = zeros((R, C))                      # LayerNorm output
        self.q = zeros((R, C))                      # queries (keys and values go straight to the cache)
        self.att = zeros((R, C))                    # attention output
        self.y = zeros((R, C))                      # c_proj outputs, added to x
        self.fc = zeros((R, 4 * C))                 # MLP hidden
        self.R, self.C = R, C
        self.xq = self.xd = None                    # q8_0 / q4_0: quantized rows (q0_rows)

    def q0_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The quantized input rows of the q8_0 / q4_0 prefill matmuls, allocated on first use and never
        replaced: xq int8 [R][4C], xd float32 [R][4C/32] (each ROWQUANT job overwrites them)."""
        if self.xq is None:
            self.xq = aligned_zeros((self.R, 4 * self.C), np.int8)
            self.xd = zeros((self.R, 4 * self.C // 32))
        return self.xq, self.xd


class BatchRows:
    """Row buffers of a batched decode run: one row per sequence, R rows (model.Transformer.step_batch)."""

    def __init__(self, cfg: GPT2Config, R: int):
        C = cfg.n_embd
        self.x = zeros((R, C))                      # residual stream (row t: wte[token_t] + wpe[pos_t] first)
        self.h = zeros((R, C))                      # LayerNorm output
        self.qkv = zeros((R, padded(3 * C)))        # c_attn outputs q | k | v (k, v copied into the caches)
        self.att = zeros((R, C))                    # attention output
        self.y = zeros((R, padded(C)))              # c_proj outputs, added to x
        self.fc = zeros((R, padded(4 * C)))         # MLP hidden
        self.logits = zeros((R, padded(cfg.vocab_size)))   # [R][vocab padded to 64]
        self.R, self.C = R, C
        self.xq = self.xd = None                    # q8_0 / q4_0: quantized rows (q0_rows)

    q0_rows = Rows.q0_rows                          # the quantized input rows of the q0 batched matmuls
