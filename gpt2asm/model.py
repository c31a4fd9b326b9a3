"""The GPT-2 forward pass: a sequence of assembly kernel calls on validated, preallocated buffers.

Python does only bookkeeping here, plus exactly rounded elementwise float32 numpy ops (embedding add,
residual adds, cache copies), so the logits are the same bits on every kernel family and thread count.
"""
from __future__ import annotations

import numpy as np

from .errors import ContextOverflowError, InvalidArgumentError
from .kernels import HEAD_DIM, Kernels, addr, check
from .state import State
from .weights import Weights


class Transformer:
    def __init__(self, weights: Weights, kernels: Kernels):
        self.w, self.k, self.cfg = weights, kernels, weights.config
        C, V = self.cfg.n_embd, self.cfg.vocab_size
        self._validate()
        self.n_tiles_head = -(-V // 64)

    def _validate(self) -> None:
        """Every weight array reaches assembly by address: check each once, here."""
        C, w = self.cfg.n_embd, self.w
        mat = np.float16 if w.dtype == "f16" else np.float32
        for name, a, n_in, n_out in self._matrices():
            check(a, name, mat, aligned=True)
            if a.shape != (-(-n_out // 64), n_in, 64):
                raise InvalidArgumentError(f"{name}: tiled shape {a.shape} does not fit {n_in}x{n_out}")
        for i, L in enumerate(w.layers):
            for name in ("ln1_g", "ln1_b", "ln2_g", "ln2_b"):
                check(getattr(L, name), f"h.{i}.{name}", np.float32, C)
            for name, n in (("attn_b", 3 * C), ("attn_proj_b", C), ("fc_b", 4 * C), ("proj_b", C)):
                check(getattr(L, name), f"h.{i}.{name}", np.float32, -(-n // 64) * 64)
        check(w.ln_f_g, "ln_f_g", np.float32, C)
        check(w.ln_f_b, "ln_f_b", np.float32, C)
        check(w.wte, "wte", np.float32, self.cfg.vocab_size * C)
        check(w.wpe, "wpe", np.float32, self.cfg.n_ctx * C)

    def _matrices(self):
        C = self.cfg.n_embd
        for i, L in enumerate(self.w.layers):
            yield f"h.{i}.attn_w", L.attn_w, C, 3 * C
            yield f"h.{i}.attn_proj_w", L.attn_proj_w, C, C
            yield f"h.{i}.fc_w", L.fc_w, C, 4 * C
            yield f"h.{i}.proj_w", L.proj_w, 4 * C, C
        yield "head_w", self.w.head_w, C, self.cfg.vocab_size

    def new_state(self) -> State:
        return State(self.cfg, self.k.threads)

    # ----------------------------------------------------------------------------------------------

    def _matvec(self, w: np.ndarray, x: int, b: np.ndarray | None, y: int, n_in: int) -> None:
        self.k.run(*self.k.matvec_job(w, x, None if b is None else addr(b), y, n_in, w.shape[0]))

    def _block(self, s: State, i: int, pos: int) -> None:
        """Transformer block i for the token at position pos; s.x is the residual stream."""
        L, C, H = self.w.layers[i], self.cfg.n_embd, self.cfg.n_head
        K = self.k
        K.layernorm_f32(addr(s.x), addr(L.ln1_g), addr(L.ln1_b), addr(s.h), C)
        self._matvec(L.attn_w, addr(s.h), L.attn_b, addr(s.qkv), C)      # qkv [3C] = h W + b
        s.k[i, :, pos] = s.qkv[C:2 * C].reshape(H, HEAD_DIM)               # cache this position
        s.v[i, :, pos] = s.qkv[2 * C:3 * C].reshape(H, HEAD_DIM)
        K.run(*K.attention_job(addr(s.qkv), addr(s.k[i]), addr(s.v[i]), addr(s.att),
                               [addr(a) for a in s.scratch], pos + 1, self.cfg.n_ctx * HEAD_DIM, H))
        self._matvec(L.attn_proj_w, addr(s.att), L.attn_proj_b, addr(s.proj), C)
        np.add(s.x, s.proj[:C], out=s.x)                                   # x += attn
        K.layernorm_f32(addr(s.x), addr(L.ln2_g), addr(L.ln2_b), addr(s.h), C)
        self._matvec(L.fc_w, addr(s.h), L.fc_b, addr(s.fc), C)             # fc [4C]
        K.gelu_f32(addr(s.fc), addr(s.fc), 4 * C)
        self._matvec(L.proj_w, addr(s.fc), L.proj_b, addr(s.proj), 4 * C)
        np.add(s.x, s.proj[:C], out=s.x)                                   # x += mlp

    def _embed(self, s: State, token: int, pos: int) -> None:
        if not 0 <= token < self.cfg.vocab_size:
            raise InvalidArgumentError(f"token id {token} out of range 0..{self.cfg.vocab_size - 1}")
        np.add(self.w.wte[token], self.w.wpe[pos], out=s.x)

    def _head(self, s: State) -> np.ndarray:
        C = self.cfg.n_embd
        self.k.layernorm_f32(addr(s.x), addr(self.w.ln_f_g), addr(self.w.ln_f_b), addr(s.h), C)
        self._matvec(self.w.head_w, addr(s.h), self.w.head_b, addr(s.logits), C)
        return s.logits[:self.cfg.vocab_size]

    def step(self, s: State, token: int) -> np.ndarray:
        """Feed one token at position s.n, extend the cache; return the logits [vocab] (a view of s)."""
        pos = s.n
        if pos >= self.cfg.n_ctx:
            raise ContextOverflowError(pos + 1, self.cfg.n_ctx)
        self._embed(s, int(token), pos)
        for i in range(self.cfg.n_layer):
            self._block(s, i, pos)
        s.n = pos + 1
        return self._head(s)

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Full-prefix forward from an empty cache, layer by layer over all tokens (a different loop
        order from cached steps, same per-output operations): logits [T][vocab] for every position."""
        T, C = len(tokens), self.cfg.n_embd
        if T > self.cfg.n_ctx:
            raise ContextOverflowError(T, self.cfg.n_ctx)
        s = self.new_state()
        xs = np.empty((T, C), np.float32)                                  # residual stream per token
        for t, tok in enumerate(tokens):
            self._embed(s, int(tok), t)
            xs[t] = s.x
        for i in range(self.cfg.n_layer):
            for t in range(T):
                s.x[:] = xs[t]
                self._block(s, i, t)
                xs[t] = s.x
        out = np.empty((T, self.cfg.vocab_size), np.float32)
        for t in range(T):
            s.x[:] = xs[t]
            out[t] = self._head(s)
        return out
