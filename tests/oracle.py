"""Test oracles: the forward pass of gpt2asm.model as single kernel calls from Python.

`step_reference` is a cached step done as a sequence of single kernel calls (Kernels' per-call path:
matvec_job / attention_job over Kernels.run, numpy for the adds and cache copies): the reference the
step plan is tested against (tests/test_plan.py) and the per-kernel comparison of the emulated AVX-512
test (tests/test_emulated_model.py).  `prefill_reference` is the prefill done so (LayerNorm, attention
and GELU kernel calls per row, the matmul kernels over the rows with the tiles split over Kernels.run):
the path of a family with the matmul kernels but without a plan executor (tests/test_prefill.py forces
every family onto it).  `forward_reference` is the full-prefix forward (GPT2.logits) done so.  Each gives
the logits bits of Transformer.step / prefill / forward, and step / prefill return (logits, argmax) as
they do (the argmax by numpy).
"""
from __future__ import annotations

import ctypes

import numpy as np

from gpt2asm.model import PREFILL_ROWS, Transformer
from gpt2asm.state import State
from gpt2asm.validate import HEAD_DIM, addr


_Q0: dict = {}


class ArmQ0Checked:
    """gpt2asm.q0kernels.ArmQ0 of an AArch64 family with Q0Kernels's API (quantize, matvec, matmul): the
    variants the plan jobs use ($GPT2ASM_ARM_Q0 as for them)."""

    def __init__(self, family: str):
        from gpt2asm.q0kernels import ArmQ0
        self.k = ArmQ0(family=family)

    def quantize(self, x, xq=None, xd=None):
        q, d = self.k.quantize_q8_0(np.ascontiguousarray(x, np.float32))
        if xq is None:
            return q, d
        xq[:], xd[:] = q, d
        return xq, xd

    def matvec(self, kind, w, xq, xd, b, y):
        y[:] = self.k.matvec(kind, w, xq.size, xq, xd, b)

    def matmul(self, kind, w, xq, xd, b, out):
        out[:] = self.k.matmul(kind, w, xq.shape[1], xq, xd, b)


def q0_kernels(family: str):
    """The checked q8_0 / q4_0 kernels of a kernel family: x86 gpt2asm.q0kernels.Q0Kernels (the variant of
    $GPT2ASM_Q0_PLAIN), AArch64 ArmQ0Checked (the variants of $GPT2ASM_ARM_Q0), as the plan jobs use."""
    import os
    from gpt2asm.lib import ARCH
    if ARCH == "aarch64":
        key = (family, os.environ.get("GPT2ASM_ARM_Q0"))
        if key not in _Q0:
            _Q0[key] = ArmQ0Checked(family)
        return _Q0[key]
    from gpt2asm.q0kernels import Q0Kernels, q0_variant
    key = (family, q0_variant(family))
    if key not in _Q0:
        _Q0[key] = Q0Kernels(family)
    return _Q0[key]


def q0(m: Transformer):
    """The checked q8_0 / q4_0 kernels of m's family (q0_kernels)."""
    return q0_kernels(m.k.family)


def _floats(a: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(a))


def _q0_kind(w: np.ndarray) -> str:
    from gpt2asm.validate import Q0_RECORD
    return {r: k for k, r in Q0_RECORD.items()}[w.shape[2]]


def _matvec(m: Transformer, w: np.ndarray, x: int, b: np.ndarray | None, y: int,
            n_in: int) -> None:
    if w.dtype == np.uint8:                  # q8_0 / q4_0 records: quantize the input, then the matvec
        K = q0(m)
        xq, xd = K.quantize(_floats(x, n_in).copy())
        K.matvec(_q0_kind(w), w, xq, xd, b, _floats(y, 64 * w.shape[0]))
        return
    m.k.run(*m.k.matvec_job(w, x, None if b is None else addr(b), y, n_in, w.shape[0]))


def _matmul(m: Transformer, w: np.ndarray, x: np.ndarray, b: np.ndarray | None,
            y: np.ndarray, T: int, n_in: int) -> None:
    """y[t] = W x[t] + b for the rows t < T of the C-contiguous row buffers x, y (the matmul kernels)."""
    if w.dtype == np.uint8:                  # q8_0 / q4_0: every row quantized, then the q0 matmul
        K = q0(m)
        xq = np.empty((T, n_in), np.int8)
        xd = np.empty((T, n_in // 32), np.float32)
        for t in range(T):
            K.quantize(np.ascontiguousarray(x[t, :n_in]), xq[t], xd[t])
        out = np.empty((T, 64 * w.shape[0]), np.float32)
        K.matmul(_q0_kind(w), w, xq, xd, b, out)
        y[:T, :out.shape[1]] = out
        return
    m.k.run(*m.k.matmul_job(w, addr(x), x.shape[1], None if b is None else addr(b), addr(y), y.shape[1],
                            T, n_in, w.shape[0]))


def block(m: Transformer, s: State, i: int, pos: int) -> None:
    """Transformer block i for the token at position pos; s.x is the residual stream."""
    L, C, H, K = m.w.layers[i], m.cfg.n_embd, m.cfg.n_head, m.k
    K.layernorm_f32(addr(s.x), addr(L.ln1_g), addr(L.ln1_b), addr(s.h), C)
    _matvec(m, L.attn_w, addr(s.h), L.attn_b, addr(s.qkv), C)   # qkv [3C] = h W + b
    s.k[i, :, pos] = s.qkv[C:2 * C].reshape(H, HEAD_DIM)               # cache this position (a binary16
    s.v[i, :, pos] = s.qkv[2 * C:3 * C].reshape(H, HEAD_DIM)           # cache: rounded to nearest even)
    K.run(*K.attention_job(addr(s.qkv), addr(s.k[i]), addr(s.v[i]), addr(s.att), [addr(a) for a in s.scratch],
                           pos + 1, m.cfg.n_ctx * HEAD_DIM, H, s.k.dtype == np.float16))
    _matvec(m, L.attn_proj_w, addr(s.att), L.attn_proj_b, addr(s.proj), C)
    np.add(s.x, s.proj[:C], out=s.x)                                   # x += attn
    K.layernorm_f32(addr(s.x), addr(L.ln2_g), addr(L.ln2_b), addr(s.h), C)
    _matvec(m, L.fc_w, addr(s.h), L.fc_b, addr(s.fc), C)  # fc [4C]
    K.gelu_f32(addr(s.fc), addr(s.fc), 4 * C)
    _matvec(m, L.proj_w, addr(s.fc), L.proj_b, addr(s.proj), 4 * C)
    np.add(s.x, s.proj[:C], out=s.x)                                   # x += mlp


def embed(m: Transformer, s: State, token: int, pos: int) -> None:
    np.add(m.w.wte[token], m.w.wpe[pos], out=s.x)


def head(m: Transformer, s: State) -> np.ndarray:
    """LayerNorm f and the LM head of s.x into s.logits: logits [vocab] (a view of s)."""
    C = m.cfg.n_embd
    m.k.layernorm_f32(addr(s.x), addr(m.w.ln_f_g), addr(m.w.ln_f_b), addr(s.h), C)
    _matvec(m, m.w.head_w, addr(s.h), m.w.head_b, addr(s.logits), C)
    return s.logits[:m.cfg.vocab_size]


def _with_argmax(m: Transformer, logits: np.ndarray) -> tuple[np.ndarray, int | None]:
    """(logits, numpy's first maximum of them, None if any is NaN or infinite): what step() returns."""
    return logits, int(np.argmax(logits)) if np.isfinite(logits).all() else None


def step_reference(m: Transformer, s: State, token: int) -> tuple[np.ndarray, int | None]:
    """Transformer.step as single kernel calls from Python: the same logits bits, more overhead."""
    token, pos = m.check_step(s, token)
    embed(m, s, token, pos)
    for i in range(m.cfg.n_layer):
        block(m, s, i, pos)
    s.n = pos + 1
    return _with_argmax(m, head(m, s))


def rows_block(m: Transformer, s: State, qkv: np.ndarray, i: int, T: int, pos: int) -> None:
    """Transformer block i for the rows t < T of s.rows (the tokens at positions pos + t): block's
    kernel calls and numpy adds, with the matmul kernels for the T rows at once."""
    L, C, H, K, r = m.w.layers[i], m.cfg.n_embd, m.cfg.n_head, m.k, s.rows
    x = r.x[:T]
    for t in range(T):
        K.layernorm_f32(addr(x[t]), addr(L.ln1_g), addr(L.ln1_b), addr(r.h[t]), C)
    _matmul(m, L.attn_w, r.h, L.attn_b, qkv, T, C)     # qkv [T][3C]
    s.k[i, :, pos:pos + T] = qkv[:T, C:2 * C].reshape(T, H, HEAD_DIM).transpose(1, 0, 2)   # cache rows
    s.v[i, :, pos:pos + T] = qkv[:T, 2 * C:3 * C].reshape(T, H, HEAD_DIM).transpose(1, 0, 2)
    for t in range(T):                                                   # row t: positions 0 .. pos + t
        K.run(*K.attention_job(addr(qkv[t]), addr(s.k[i]), addr(s.v[i]), addr(r.att[t]),
                               [addr(a) for a in s.scratch], pos + t + 1, m.cfg.n_ctx * HEAD_DIM, H,
                               s.k.dtype == np.float16))
    _matmul(m, L.attn_proj_w, r.att, L.attn_proj_b, r.y, T, C)
    np.add(x, r.y[:T, :C], out=x)                                        # x += attn
    for t in range(T):
        K.layernorm_f32(addr(x[t]), addr(L.ln2_g), addr(L.ln2_b), addr(r.h[t]), C)
    _matmul(m, L.fc_w, r.h, L.fc_b, r.fc, T, C)       # fc [T][4C]
    K.gelu_f32(addr(r.fc), addr(r.fc), T * 4 * C)
    _matmul(m, L.proj_w, r.fc, L.proj_b, r.y, T, 4 * C)
    np.add(x, r.y[:T, :C], out=x)                                        # x += mlp


def prefill_reference(m: Transformer, s: State, tokens) -> tuple[np.ndarray, int | None]:
    """Transformer.prefill as single kernel calls from Python (a family with the matmul kernels but
    without a plan executor): layer by layer over up to PREFILL_ROWS tokens, then the head for the last
    token; the logits and cache bits of cached steps.  One token: a step, as prefill does."""
    tokens = m.check_tokens(s, tokens)
    if len(tokens) == 1:
        return step_reference(m, s, tokens[0])
    cfg, r = m.cfg, s.prefill_rows(PREFILL_ROWS)
    wte, wpe = m.w.wte.reshape(cfg.vocab_size, -1), m.w.wpe.reshape(cfg.n_ctx, -1)
    qkv = np.empty((min(len(r.x), len(tokens)), 3 * cfg.n_embd), np.float32)
    for c0 in range(0, len(tokens), len(r.x)):
        ids = tokens[c0:c0 + len(r.x)]
        T, pos = len(ids), s.n
        np.add(wte[ids], wpe[pos:pos + T], out=r.x[:T])                # x[t] = wte[token] + wpe[pos + t]
        for i in range(cfg.n_layer):
            rows_block(m, s, qkv, i, T, pos)
        s.n = pos + T
    s.x[:] = r.x[T - 1]
    return _with_argmax(m, head(m, s))


def forward_reference(m: Transformer, tokens: list[int]) -> np.ndarray:
    """Transformer.forward (logits [T][vocab] of every position from an empty cache) per kernel call."""
    T, C = len(tokens), m.cfg.n_embd
    s = m.new_state()
    xs = np.empty((T, C), np.float32)
    for t, tok in enumerate(tokens):
        embed(m, s, tok, t)
        xs[t] = s.x
    for i in range(m.cfg.n_layer):
        for t in range(T):
            s.x[:] = xs[t]
            block(m, s, i, t)
            xs[t] = s.x
    out = np.empty((T, m.cfg.vocab_size), np.float32)
    for t in range(T):
        s.x[:] = xs[t]
        out[t] = head(m, s)
    return out
