"""Weight-only int8 quantisation for the q8 kernels (docs/kernels.md, gpt2asm_matvec_q8 / gpt2asm_matmul_q8).

Symmetric, one float32 scale per output (per row of W as the kernels see it, per column of an HF Conv1D
weight):

    scale[o] = max_i |W[i][o]| / 127                         (float32 division, correctly rounded)
    q[i][o]  = clip(rint(W[i][o] / scale[o]), -127, 127)      (float32 division, round half to even)
    all-zero output (and any output whose scale underflows to 0): scale 0, q 0

The weights are first converted to float32 (exact for float16 / float32 input; float64 is rounded to
nearest).  Every step is an exactly rounded IEEE float32 operation (abs, max, divide, rint, clip), so the
result is the same bits on every machine, numpy version and SIMD width.  The kernels compute
`y[o] = (sum_i fma(q[i][o], x[i], .)) * scale[o] + b[o]`, so the effective weight is q * scale with
|W - q*scale| <= scale/2 (+ a float32 rounding): a relative error of at most 1/254 of the output's largest
weight.

Layout (the kernels' tiled one, as gpt2asm.weights.tile_matrix): q is int8 [n_tiles][n_in][64] with
q[t][i][j] = q(W[i][64t + j]) (0 for the padding outputs 64t + j >= n_out), scale is float32
[64 * n_tiles] (0 for the padding).  Both are C-contiguous and 64-byte aligned.

    quantize_q8(w_in_out)        HF Conv1D weight W[in][out] (c_attn, c_proj, c_fc, mlp.c_proj)
    quantize_q8_head(w_out_in)   the output head from wte / lm_head.weight E[V][C] (in = C, out = V),
                                 without materialising E.T: exactly quantize_q8(E.T)
    dequantize_q8(q, scale)      the effective weights q * scale as float32 [n_tiles*64][n_in] (tests)
"""
from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentError
from .weights import aligned_empty

TILE = 64
QMAX = 127
_CHUNK = 16                      # tiles quantised per step (bounds the float32 temporaries)

__all__ = ["quantize_q8", "quantize_q8_head", "dequantize_q8", "TILE", "QMAX"]


def float_matrix(w, what: str) -> np.ndarray:
    """w as a non-empty 2-D floating-point array, or InvalidArgumentError naming `what`."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise InvalidArgumentError(f"{what} expects a 2-D matrix, got shape {w.shape}")
    if w.dtype.kind != "f":
        raise InvalidArgumentError(f"{what} expects float16/float32/float64 weights, got {w.dtype}")
    if 0 in w.shape:
        raise InvalidArgumentError(f"{what}: empty matrix (shape {w.shape})")
    return w


def _quantize_block(blk: np.ndarray, axis: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """blk: float32 block with the inputs along `axis`; returns (q int8 like blk, scale per output)."""
    if not np.isfinite(blk).all():
        raise InvalidArgumentError(f"{what}: weights must be finite (found NaN or inf)")
    amax = np.max(np.abs(blk), axis=axis)                       # exact
    scale = amax / np.float32(QMAX)                             # one float32 division per output
    zero = scale == 0                                           # all-zero output, or scale underflow
    div = np.where(zero, np.float32(1), scale)
    qf = blk / (div[None, :] if axis == 0 else div[:, None])    # float32 division per weight
    np.rint(qf, out=qf)                                         # round half to even (exact)
    np.clip(qf, -QMAX, QMAX, out=qf)
    if zero.any():
        if axis == 0:
            qf[:, zero] = 0
        else:
            qf[zero, :] = 0
    return qf.astype(np.int8), np.where(zero, np.float32(0), scale).astype(np.float32)


def quantize_q8(w_in_out) -> tuple[np.ndarray, np.ndarray]:
    """HF Conv1D weight W[in][out] -> (q int8 [n_tiles][in][64], scale float32 [64*n_tiles]), both
    64-byte aligned; n_tiles = ceil(out/64), padding outputs have q = 0 and scale = 0."""
    return _quantize_tiles(float_matrix(w_in_out, "quantize_q8"), 0, "quantize_q8")


def quantize_q8_head(w_out_in) -> tuple[np.ndarray, np.ndarray]:
    """Output head E[V][C] (wte or lm_head.weight; logits = x @ E.T) -> exactly quantize_q8(E.T):
    q int8 [ceil(V/64)][C][64] with q[t][i][j] = q(E[64t+j][i]), scale float32 [64*ceil(V/64)]."""
    return _quantize_tiles(float_matrix(w_out_in, "quantize_q8_head"), 1, "quantize_q8_head")


def _quantize_tiles(w: np.ndarray, axis: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The tiles and scales of w, whose inputs run along `axis` (0: W[in][out]; 1: E[out][in]), a block
    of _CHUNK tiles at a time."""
    n_in, n_out = w.shape[axis], w.shape[1 - axis]
    n_tiles = -(-n_out // TILE)
    q = aligned_empty((n_tiles, n_in, TILE), np.int8)
    scale = aligned_empty((n_tiles * TILE,), np.float32)
    for t0 in range(0, n_tiles, _CHUNK):
        t1 = min(t0 + _CHUNK, n_tiles)
        o0, o1 = t0 * TILE, min(t1 * TILE, n_out)
        blk = np.asarray(w[:, o0:o1] if axis == 0 else w[o0:o1], dtype=np.float32)   # [in][m] or [m][in]
        qb, sb = _quantize_block(blk, axis, what)
        pad = (t1 - t0) * TILE - (o1 - o0)
        if pad:                                                 # last, partial tile: zero padding
            qb = np.concatenate([qb, np.zeros((n_in, pad) if axis == 0 else (pad, n_in), np.int8)], axis=1 - axis)
            sb = np.concatenate([sb, np.zeros(pad, np.float32)])
        q[t0:t1] = (qb.reshape(n_in, t1 - t0, TILE).transpose(1, 0, 2) if axis == 0 else
                    qb.reshape(t1 - t0, TILE, n_in).transpose(0, 2, 1))
        scale[o0:o0 + sb.size] = sb
    return q, scale


def dequantize_q8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The effective weights of a quantised matrix, float32 [n_tiles*64][n_in] (row o = output o):
    q * scale rounded to float32 (for error reports; the kernels apply the scale after the sum)."""
    q = np.asarray(q)
    if q.ndim != 3 or q.shape[2] != TILE or q.dtype != np.int8:
        raise InvalidArgumentError(f"dequantize_q8 expects int8 [n_tiles][n_in][64], got {q.dtype} {q.shape}")
    nt, n_in, _ = q.shape
    s = np.asarray(scale, np.float32).reshape(-1)
    if s.size != nt * TILE:
        raise InvalidArgumentError(f"dequantize_q8: scale has {s.size} entries, expected {nt * TILE}")
    rows = q.transpose(0, 2, 1).reshape(nt * TILE, n_in).astype(np.float32)
    return rows * s[:, None]
