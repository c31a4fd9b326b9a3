"""The GPT-2 forward pass: a plan of assembly jobs over validated, preallocated buffers.

A cached step is one call into the library (Kernels.run_plan): the plan (built once per State, every
pointer and size checked here and in kernels.Plan) holds, per layer,

    QKV     LayerNorm 1 (each thread into its own buffer; layer 0 first adds wte[token] + wpe[pos]),
            then per head h: the q, k, v tiles of c_attn (k, v straight into the cache at pos) and the
            attention of head h
    MATVEC  attn c_proj, epilogue x += y (the residual add)
    MATVEC  LayerNorm 2, c_fc, epilogue y = gelu(y)
    MATVEC  mlp c_proj, epilogue x += y

and then LayerNorm f + the LM head.  Every output is computed by one thread with the kernels' own
operation sequence (docs/kernels.md), so the logits are the same bits on every kernel family and thread
count; the embedding and residual adds are single binary32 additions, like numpy's.

`step_reference` is the same computation as a sequence of single kernel calls from Python (numpy for the
adds and cache copies): the reference the plan is tested against, the per-kernel comparison of the
emulated AVX-512 test, and the path of a kernel family without a plan executor.
"""
from __future__ import annotations

import numpy as np

from .errors import ContextOverflowError, InvalidArgumentError
from .kernels import HEAD_DIM, Kernels, Plan, addr, check
from .state import State
from .weights import Weights

JOBS_PER_LAYER = 4


class Transformer:
    def __init__(self, weights: Weights, kernels: Kernels):
        self.w, self.k, self.cfg = weights, kernels, weights.config
        self._validate()
        self.n_tiles_head = -(-self.cfg.vocab_size // 64)

    def _validate(self) -> None:
        """Every weight array reaches assembly by address: check each once, here."""
        C, w = self.cfg.n_embd, self.w
        if self.cfg.n_embd != self.cfg.n_head * HEAD_DIM:
            raise InvalidArgumentError(f"n_embd {C} must be n_head * {HEAD_DIM}")
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
        if w.head_b is not None:
            check(w.head_b, "head_b", np.float32, -(-self.cfg.vocab_size // 64) * 64)

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

    # -- the plan ------------------------------------------------------------------------------------

    def build_plan(self, s: State, embed: bool = True) -> Plan:
        """The forward step of the token at the plan's position on state s: JOBS_PER_LAYER jobs per layer
        (jobs [4i, 4i+4) are layer i), then the head job (LayerNorm f + LM head into s.logits).  With
        embed, the first job starts with x = wte[token] + wpe[pos]; without, it normalises s.x as it is."""
        cfg, w = self.cfg, self.w
        C, V = cfg.n_embd, cfg.vocab_size
        wte, wpe = w.wte.reshape(V, C), w.wpe.reshape(cfg.n_ctx, C)
        p = self.k.new_plan()
        p.set_embedding(wte, wpe, s.x)
        for i, L in enumerate(w.layers):
            p.qkv_attention(L.attn_w, L.attn_b, s.qkv, s.k[i], s.v[i], s.att, ln=(s.x, L.ln1_g, L.ln1_b),
                            embed=embed and i == 0)
            p.matvec(L.attn_proj_w, s.att, L.attn_proj_b, s.proj, resid=s.x)
            p.matvec(L.fc_w, None, L.fc_b, s.fc, ln=(s.x, L.ln2_g, L.ln2_b), gelu=True)
            p.matvec(L.proj_w, s.fc, L.proj_b, s.proj, resid=s.x)
        p.matvec(w.head_w, None, w.head_b, s.logits, ln=(s.x, w.ln_f_g, w.ln_f_b))
        return p.build()

    def _step_plan(self, s: State) -> Plan:
        if s.plan is None or s.plan_owner is not self:
            s.plan, s.plan_owner = None, None
            s.plan = self.build_plan(s, embed=True)
            s.plan_owner = self
        return s.plan

    def _check_step(self, s: State, token) -> tuple[int, int]:
        pos = s.n
        if pos >= self.cfg.n_ctx:
            raise ContextOverflowError(pos + 1, self.cfg.n_ctx)
        try:
            token = int(token)
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgumentError(f"token id {token!r} is not an integer") from None
        if not 0 <= token < self.cfg.vocab_size:
            raise InvalidArgumentError(f"token id {token} out of range 0..{self.cfg.vocab_size - 1}")
        return token, pos

    def step(self, s: State, token: int) -> np.ndarray:
        """Feed one token at position s.n, extend the cache; return the logits [vocab] (a view of s)."""
        if not self.k.has_plan:
            return self.step_reference(s, token)
        token, pos = self._check_step(s, token)
        plan = s.plan if s.plan_owner is self else self._step_plan(s)
        plan.set_step(token, pos)                  # checked again against the plan's own limits
        self.k.run_plan(plan)                      # the whole forward step: one call into the library
        s.n = pos + 1
        return s.logits_view

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Full-prefix forward from an empty cache, layer by layer over all tokens (a different loop
        order from cached steps, same per-output operations): logits [T][vocab] for every position."""
        T, C, V = len(tokens), self.cfg.n_embd, self.cfg.vocab_size
        if T > self.cfg.n_ctx:
            raise ContextOverflowError(T, self.cfg.n_ctx)
        tokens = [int(t) for t in tokens]
        for t in tokens:
            if not 0 <= t < V:
                raise InvalidArgumentError(f"token id {t} out of range 0..{V - 1}")
        if not self.k.has_plan:
            return self._forward_reference(tokens)
        s = self.new_state()
        p = self.build_plan(s, embed=False)
        xs = np.empty((T, C), np.float32)                                  # residual stream per token
        for t, tok in enumerate(tokens):
            np.add(self.w.wte[tok], self.w.wpe[t], out=xs[t])              # the same exact adds
        L = self.cfg.n_layer
        for i in range(L):
            for t in range(T):
                s.x[:] = xs[t]
                p.set_step(tokens[t], t)
                self.k.run_plan(p, JOBS_PER_LAYER * i, JOBS_PER_LAYER * (i + 1))
                xs[t] = s.x
        out = np.empty((T, V), np.float32)
        for t in range(T):
            s.x[:] = xs[t]
            self.k.run_plan(p, JOBS_PER_LAYER * L, JOBS_PER_LAYER * L + 1)
            out[t] = s.logits[:V]
        return out

    # -- the per-call reference path -----------------------------------------------------------------

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
        np.add(self.w.wte[token], self.w.wpe[pos], out=s.x)

    def _head(self, s: State) -> np.ndarray:
        C = self.cfg.n_embd
        self.k.layernorm_f32(addr(s.x), addr(self.w.ln_f_g), addr(self.w.ln_f_b), addr(s.h), C)
        self._matvec(self.w.head_w, addr(s.h), self.w.head_b, addr(s.logits), C)
        return s.logits[:self.cfg.vocab_size]

    def step_reference(self, s: State, token: int) -> np.ndarray:
        """step() as single kernel calls from Python: the same logits bits, more overhead."""
        token, pos = self._check_step(s, token)
        self._embed(s, token, pos)
        for i in range(self.cfg.n_layer):
            self._block(s, i, pos)
        s.n = pos + 1
        return self._head(s)

    def _forward_reference(self, tokens: list[int]) -> np.ndarray:
        T, C = len(tokens), self.cfg.n_embd
        s = self.new_state()
        xs = np.empty((T, C), np.float32)
        for t, tok in enumerate(tokens):
            self._embed(s, tok, t)
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
