"""llama.cpp's Q8_0 / Q4_0 weights for the integer kernels (docs/kernels.md "q8_0 / q4_0"; numpy model tests/q0ref.py).

Weight quantizers: exactly ggml's reference quantizers (quantize_row_q8_0_ref / quantize_row_q4_0_ref; the
same ints and fp16 scales as the `gguf` package's gguf.quants and as a GGUF Q8_0 / Q4_0 written by
llama.cpp), per block of QK = 32 consecutive inputs of one output, every step an exactly rounded binary32
operation:

    q8_0:  amax = max|x|;  d = amax / 127;  id = d ? 1/d : 0;  q = roundf(x * id)     (half away from zero)
    q4_0:  m = the x of largest |x| (the first such);  d = m / -8;  id = d ? 1/d : 0;
           q = min(15, trunc(x * id + 8.5)) - 8                                       (-8 .. 7)
    the block's scale is d rounded to binary16 (to nearest even); the ints come from the binary32 d.

A matrix W[n_out][n_in] (an HF Conv1D weight transposed; the output head E[V][C] as it is) gives
q int8 [n_out][n_in] and d float16 [n_out][n_in/32]; the kernels take them tiled (tile(): 64 outputs per
tile, one RECORD per (tile, block) = 128 bytes of binary16 scales then the ints in groups of 4 inputs x 64
outputs; q4_0 packs two groups per byte), as uint8 [n_tiles][nb][RECORD], 64-byte aligned; padding outputs
have q = 0 and d = +0.

Which tensors: as llama.cpp's converter writes a GPT-2 Q8_0 GGUF -- the four block matrices and the tied
token embedding / LM head in Q8_0; position embedding, LayerNorms and biases in F32.  For q4_0 the block
matrices are Q4_0 and the embedding / head stays Q8_0 (HEAD_KIND): llama-quantize keeps GPT-2's output
tensor (the tied token embedding when there is no output.weight) at Q6_K for a Q4_0 model
(src/llama-quant.cpp, llama_tensor_get_type_impl: output -> Q6_K unless the row length is not a multiple of
256, then Q8_0); we have integer kernels for Q8_0 and Q4_0 only, and Q8_0 is the closest type at least as
precise as Q6_K.  The embedding rows the lookup uses are the same q8_0 blocks dequantized as ggml does:
e[i] = float32(q[i]) * float32(d) (one exactly rounded multiply).

Non-finite weights, and weights whose scale would overflow binary16 (|x| > 65504 * 127 for q8_0, 65504 * 8
for q4_0), are refused (InvalidArgumentError; the loaders turn it into a CheckpointError naming the tensor).

    quantize(w_out_in, kind)        -> (q, d)                ggml's blocks
    quantize_tiled(w_out_in, kind)  -> uint8 [nt][nb][RECORD] (row chunks: bounded temporaries)
    tile(q, d, kind) / untile(w, kind, n_out, n_in)          the kernels' layout and its inverse
    dequantize(q, d)                -> float32 [n_out][n_in]  as ggml's dequantize_row_q8_0 / q4_0
    from_ggml(raw, kind, n_in)      -> (q, d)                GGUF block bytes [n_out][row bytes], lossless
    to_ggml(q, d, kind)             -> uint8 [n_out][row bytes]   (the inverse; tests, GGUF writers)
"""
from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentError, shown
from .weights import aligned_empty

QK = 32                                   # inputs per block
TILE = 64                                 # outputs per tile
KINDS = ("q8_0", "q4_0")
RECORD = {"q8_0": 2176, "q4_0": 1152}     # bytes per (tile, block) record: 128 bytes of scales + the ints
BLOCK_BYTES = {"q8_0": 2 + QK, "q4_0": 2 + QK // 2}   # ggml's block_q8_0 / block_q4_0
HEAD_KIND = "q8_0"                        # the embedding / LM head of both kinds (see above)
F16_MAX = np.float32(65504.0)
_ROWS = 256                               # rows quantized per step (a multiple of TILE)

__all__ = ["QK", "TILE", "KINDS", "RECORD", "BLOCK_BYTES", "HEAD_KIND", "quantize", "quantize_tiled", "tile",
           "untile", "dequantize", "from_ggml", "to_ggml", "n_tiles", "tiled_shape", "head_kind"]


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


def head_kind(kind: str) -> str:
    """The kind of the embedding / LM head that goes with block matrices of `kind`."""
    _check_kind(kind)
    return HEAD_KIND


def n_tiles(n_out: int) -> int:
    return -(-n_out // TILE)


def tiled_shape(n_out: int, n_in: int, kind: str) -> tuple[int, int, int]:
    """Shape of the tiled uint8 array of a [n_out][n_in] matrix."""
    return (n_tiles(n_out), n_in // QK, RECORD[kind])


def _check_kind(kind) -> None:
    if kind not in KINDS:
        raise InvalidArgumentError(f"kind must be one of {', '.join(KINDS)}, got {shown(kind)}")


def _as_matrix(w, what: str) -> np.ndarray:
    w = float_matrix(w, what)                           # [n_out][n_in]
    if w.shape[1] % QK:
        raise InvalidArgumentError(f"{what}: n_in must be a positive multiple of {QK} and n_out positive, "
                                   f"got shape {w.shape}")
    return w


def _roundf(x: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero), exactly: floor(a) + floor(2 (a - floor a)) with a = |x| (every step
    exact in binary32; floor(a + 0.5) is not: 0.49999997f + 0.5f rounds to 1)."""
    a = np.abs(x)
    f = np.floor(a)
    return np.copysign(f + np.floor(2 * (a - f)), x)


def _quantize_rows(blk: np.ndarray, kind: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """blk float32 [m][nb][32] -> (q int8 [m][nb*32], d float16 [m][nb])."""
    if not np.isfinite(blk).all():
        bad = np.argwhere(~np.isfinite(blk))[0]
        raise InvalidArgumentError(f"{what}: weights must be finite (NaN or inf at output {int(bad[0])}, "
                                   f"input {int(bad[1]) * QK + int(bad[2])})")
    m, nb, _ = blk.shape
    if kind == "q8_0":
        d = np.abs(blk).max(axis=2, keepdims=True) / np.float32(127)
    else:
        imax = np.abs(blk).argmax(axis=2)[..., None]            # the first of equal |x|, as ggml's loop
        d = np.take_along_axis(blk, imax, axis=2) / np.float32(-8)
    d = d.astype(np.float32, copy=False)
    if np.abs(d).max() > F16_MAX:
        o = int(np.argwhere(np.abs(d[..., 0]) > F16_MAX)[0][0])
        raise InvalidArgumentError(f"{what}: output {o} has weights up to {float(np.abs(blk[o]).max()):.6g}, "
                                   f"beyond {kind}'s range (its scale would overflow float16)")
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.float32(1) / d
    # d = 0: id = 0 (ggml). 1/d overflowing (|d| < 2^-128, all |x| < 4e-37): ggml converts roundf(x * inf) to
    # int8, undefined behaviour in C; here id = 0 and q = 0 -- the same weights, as such a d is 0 in binary16.
    idv[~np.isfinite(idv)] = 0
    x = (blk * idv).astype(np.float32, copy=False)
    if kind == "q8_0":
        q = _roundf(x)                                           # |q| <= 127
    else:
        q = np.minimum(np.trunc(x + np.float32(8.5)), np.float32(15)) - np.float32(8)   # x*id >= -8: >= 0.5
    return q.astype(np.int8).reshape(m, nb * QK), d[..., 0].astype(np.float16)


def quantize(w_out_in, kind: str, what: str = "quantize") -> tuple[np.ndarray, np.ndarray]:
    """W [n_out][n_in] (float16/float32; n_in % 32 == 0) -> (q int8 [n_out][n_in], d float16 [n_out][nb]),
    the ints and scales of ggml's reference quantizer of `kind`."""
    _check_kind(kind)
    w = _as_matrix(w_out_in, what)
    n_out, n_in = w.shape
    q = np.empty((n_out, n_in), np.int8)
    d = np.empty((n_out, n_in // QK), np.float16)
    for o in range(0, n_out, _ROWS):
        blk = np.asarray(w[o:o + _ROWS], dtype=np.float32).reshape(-1, n_in // QK, QK)
        q[o:o + _ROWS], d[o:o + _ROWS] = _quantize_rows(blk, kind, what)
    return q, d


def _records(q: np.ndarray, d: np.ndarray, kind: str) -> np.ndarray:
    """q int8 [64 t][n_in], d float16 [64 t][nb] (whole tiles) -> uint8 [t][nb][RECORD]."""
    rows, n_in = q.shape
    nt, nb = rows // TILE, n_in // QK
    # L[t][b][g][j][k] = q[64t + j][32b + 4g + k]
    L = q.reshape(nt, TILE, nb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(nt, nb, 2048)
    S = np.ascontiguousarray(d.reshape(nt, TILE, nb).transpose(0, 2, 1), "<f2").view(np.uint8).reshape(nt, nb, 128)
    if kind == "q8_0":
        body = L.view(np.uint8)
    else:
        u = (L + np.int8(8)).view(np.uint8)                       # 0 .. 15
        body = u[..., :1024] | (u[..., 1024:] << np.uint8(4))
    return np.concatenate([S, body], axis=2)


def _pad_tiles(q: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = n_tiles(q.shape[0]) * TILE
    if rows == q.shape[0]:
        return q, d
    qp = np.zeros((rows, q.shape[1]), np.int8)
    qp[:q.shape[0]] = q
    dp = np.zeros((rows, d.shape[1]), np.float16)
    dp[:d.shape[0]] = d
    return qp, dp


def tile(q: np.ndarray, d: np.ndarray, kind: str) -> np.ndarray:
    """(q int8 [n_out][n_in], d float16 [n_out][nb]) -> uint8 [n_tiles][nb][RECORD], 64-byte aligned: record
    (t, b) = 64 binary16 scales dw[64t + j][b] (little-endian), then L[256 g + 4 j + k] = q[64t+j][32b+4g+k]
    (q8_0), or P[m] = (L[m] + 8) | (L[m + 1024] + 8) << 4 for m < 1024 (q4_0). Padding outputs: 0 and +0."""
    _check_kind(kind)
    q, d = np.asarray(q), np.asarray(d)
    if q.ndim != 2 or q.dtype != np.int8 or q.shape[1] % QK or d.dtype != np.float16 \
            or d.shape != (q.shape[0], q.shape[1] // QK):
        raise InvalidArgumentError(f"tile expects q int8 [n_out][n_in] (n_in % {QK} == 0) and d float16 "
                                   f"[n_out][n_in/{QK}], got {q.dtype} {q.shape} and {d.dtype} {d.shape}")
    if kind == "q4_0" and q.size and (int(q.min()) < -8 or int(q.max()) > 7):
        raise InvalidArgumentError("tile: q4_0 ints must be in -8..7")
    n_out, n_in = q.shape
    out = aligned_empty(tiled_shape(n_out, n_in, kind), np.uint8)
    step = _ROWS // TILE
    for t in range(0, out.shape[0], step):
        qp, dp = _pad_tiles(q[t * TILE:(t + step) * TILE], d[t * TILE:(t + step) * TILE])
        out[t:t + step] = _records(qp, dp, kind)
    return out


def quantize_tiled(w_out_in, kind: str, what: str = "quantize") -> np.ndarray:
    """tile(*quantize(w, kind), kind), a chunk of rows at a time."""
    _check_kind(kind)
    w = _as_matrix(w_out_in, what)
    n_out, n_in = w.shape
    out = aligned_empty(tiled_shape(n_out, n_in, kind), np.uint8)
    step = _ROWS // TILE
    for t in range(0, out.shape[0], step):
        blk = np.asarray(w[t * TILE:(t + step) * TILE], dtype=np.float32).reshape(-1, n_in // QK, QK)
        try:
            q, d = _quantize_rows(blk, kind, what)
        except InvalidArgumentError as e:                      # name the output in the whole matrix
            raise InvalidArgumentError(_shift_output(str(e), t * TILE)) from None
        out[t:t + step] = _records(*_pad_tiles(q, d), kind)
    return out


def _shift_output(msg: str, base: int) -> str:
    import re
    return re.sub(r"output (\d+)", lambda m: f"output {int(m.group(1)) + base}", msg, count=1)


def untile(w: np.ndarray, kind: str, n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of tile(): (q int8 [n_out][n_in], d float16 [n_out][nb])."""
    _check_kind(kind)
    nt, nb = n_tiles(n_out), n_in // QK
    R = np.asarray(w).reshape(nt, nb, RECORD[kind])
    d = R[..., :128].copy().view("<f2").reshape(nt, nb, TILE).transpose(0, 2, 1).reshape(nt * TILE, nb)
    body = R[..., 128:]
    if kind == "q8_0":
        L = body.view(np.int8)
    else:
        L = np.concatenate([body & 15, body >> 4], axis=2).astype(np.int8) - np.int8(8)
    q = L.reshape(nt, nb, 8, TILE, 4).transpose(0, 3, 1, 2, 4).reshape(nt * TILE, n_in)
    return q[:n_out].copy(), d[:n_out].astype(np.float16)


def dequantize(q: np.ndarray, d: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [n_out][n_in]: e[o][i] = float32(q[o][i]) * float32(d[o][i // 32]) -- one exactly rounded
    binary32 multiply per value, as ggml's dequantize_row_q8_0 / q4_0 (q4_0's q already minus 8)."""
    q, d = np.asarray(q), np.asarray(d)
    n_out, n_in = q.shape
    if out is None:
        out = aligned_empty((n_out, n_in), np.float32)
    for o in range(0, n_out, 4 * _ROWS):
        qb = q[o:o + 4 * _ROWS].reshape(-1, n_in // QK, QK).astype(np.float32)
        db = d[o:o + 4 * _ROWS].astype(np.float32)[..., None]
        np.multiply(qb, db, out=out[o:o + 4 * _ROWS].reshape(qb.shape))
    return out


def from_ggml(raw: np.ndarray, kind: str, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF tensor bytes uint8 [n_out][n_in/32 * BLOCK_BYTES] (ggml blocks: binary16 d, then 32 int8 (q8_0) or
    16 bytes of nibbles, byte j = element j | element j + 16 << 4, offset 8 (q4_0)) -> (q int8, d float16)."""
    _check_kind(kind)
    nb = n_in // QK
    raw = np.asarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] != nb * BLOCK_BYTES[kind] or n_in % QK:
        raise InvalidArgumentError(f"from_ggml: {kind} rows of {n_in} inputs are {nb * BLOCK_BYTES[kind]} bytes, "
                                   f"got shape {raw.shape}")
    n_out = raw.shape[0]
    blk = raw.reshape(n_out, nb, BLOCK_BYTES[kind])
    d = np.ascontiguousarray(blk[..., :2]).view("<f2").reshape(n_out, nb).astype(np.float16)
    body = blk[..., 2:]
    if kind == "q8_0":
        q = np.ascontiguousarray(body).view(np.int8)
    else:
        q = np.concatenate([body & 15, body >> 4], axis=2).astype(np.int8) - np.int8(8)
    return q.reshape(n_out, n_in), d


def to_ggml(q: np.ndarray, d: np.ndarray, kind: str) -> np.ndarray:
    """(q, d) -> ggml's block bytes uint8 [n_out][nb * BLOCK_BYTES] (the inverse of from_ggml)."""
    _check_kind(kind)
    n_out, n_in = q.shape
    nb = n_in // QK
    qb = q.reshape(n_out, nb, QK)
    if kind == "q8_0":
        body = qb.view(np.uint8)
    else:
        u = (qb + np.int8(8)).view(np.uint8)
        body = u[..., :16] | (u[..., 16:] << np.uint8(4))
    S = np.asarray(d, np.float16).astype("<f2").view(np.uint8).reshape(n_out, nb, 2)
    return np.concatenate([S, body], axis=2).reshape(n_out, nb * BLOCK_BYTES[kind])
