"""llama.cpp's Q8_0 / Q4_0 / Q6_K weights for the integer kernels (docs/kernels.md "q8_0 / q4_0", "q6_k"; numpy
model tests/q0ref.py).

Weight quantizers: exactly ggml's reference quantizers (quantize_row_q8_0_ref / quantize_row_q4_0_ref; the
same ints and fp16 scales as the `gguf` package's gguf.quants and as a GGUF Q8_0 / Q4_0 written by
llama.cpp), per block of QK = 32 consecutive inputs of one output, every step an exactly rounded binary32
operation:

    q8_0:  amax = max|x|;  d = amax / 127;  id = d ? 1/d : 0;  q = roundf(x * id)     (half away from zero)
    q4_0:  m = the x of largest |x| (the first such);  d = m / -8;  id = d ? 1/d : 0;
           q = min(15, trunc(x * id + 8.5)) - 8                                       (-8 .. 7)
    the block's scale is d rounded to binary16 (to nearest even); the ints come from the binary32 d.

q6_k is ggml's quantize_row_q6_K_ref (llama-quantize without an imatrix), per super-block of QK_K = 256
inputs: each sub-block of 16 gets a float scale from make_qx_quants(16, 32, x, L, 1, NULL) (a weighted
least-squares search over 19 trial scales -(32 + 0.1 is)/max, weights x^2, nearest_int = round half to even
via + 12582912.0f); the super-block's d = 1 / (-128 / max_scale) (binary16), the int8 sub-scales
sc = min(127, nearest_int(-128 / max_scale * scale)), and q = clamp(nearest_int(x / (d * sc)), -32, 31) --
where d * sc == 0 the ints make_qx_quants chose stay (q = L - 32; all-zero groups have L = 0, q = -32).
Every binary32 step in C's order (no contraction: ggml-base is built for baseline x86-64), vectorised over
all sub-blocks at once.  The value is (d * sc) * q.

A matrix W[n_out][n_in] (an HF Conv1D weight transposed; the output head E[V][C] as it is) gives
q int8 [n_out][n_in] and d float16 [n_out][n_in/32]; the kernels take them tiled (tile(): 64 outputs per
tile, one RECORD per (tile, block) = 128 bytes of binary16 scales then the ints in groups of 4 inputs x 64
outputs; q4_0 packs two groups per byte), as uint8 [n_tiles][nb][RECORD], 64-byte aligned; padding outputs
have q = 0 and d = +0.  q6_k gives (q int8 in -32..31, sc int8 [n_out][n_in/16], d float16 [n_out][n_in/256]),
tiled (tile_q6k) as uint8 [n_tiles][n_in/256][SUPER6]: per super-block the 64 binary16 d, then 8 records of
RECORD6 (sub-scales, low nibbles as q4_0's, high 2-bit pairs of u = q + 32).

Which tensors: as llama.cpp's converter writes a GPT-2 Q8_0 GGUF -- the four block matrices and the tied
token embedding / LM head in Q8_0; position embedding, LayerNorms and biases in F32.  For q4_0 the block
matrices are Q4_0 and the embedding / head is Q6_K (head_kind), as llama-quantize makes a Q4_0 model: it
keeps GPT-2's output tensor (the tied token embedding when there is no output.weight) at Q6_K unless the row
length is not a multiple of 256, then Q8_0 (src/llama-quant.cpp, llama_tensor_get_type_impl and its
fallback) -- head_kind(kind, n_in) mirrors that; q6_k needs n_in % 256 == 0.  The embedding rows the lookup
uses are the head's blocks dequantized as ggml does (q8_0: e[i] = float32(q[i]) * float32(d), one exactly
rounded multiply; q6_k: dequantize_q6k).

Non-finite weights, and weights whose scale would overflow binary16 (|x| > 65504 * 127 for q8_0, 65504 * 8
for q4_0, |d| = |max_scale| / 128 > 65504 for q6_k, about |x| > 65504 * 4096), are refused
(InvalidArgumentError; the loaders turn it into a CheckpointError naming the tensor).

    quantize(w_out_in, kind)        -> (q, d)                ggml's blocks (q8_0 / q4_0)
    quantize_q6k(w_out_in)          -> (q, sc, d)            ggml's q6_K blocks
    quantize_tiled(w_out_in, kind)  -> uint8 [nt][nb][RECORD] (q6_k: [nt][nsb][SUPER6]; row chunks: bounded
                                                              temporaries)
    tile(q, d, kind) / untile(w, kind, n_out, n_in)          the kernels' layout and its inverse
    tile_q6k(q, sc, d) / untile_q6k(w, n_out, n_in)          q6_k's
    tiled_shape(n_out, n_in, kind), tile_bytes(n_in, kind)   q8_0 / q4_0 / q6_k
    dequantize(q, d)                -> float32 [n_out][n_in]  as ggml's dequantize_row_q8_0 / q4_0
    dequantize_q6k(q, sc, d)        -> float32 [n_out][n_in]  as ggml's dequantize_row_q6_K
    from_ggml(raw, kind, n_in)      -> (q, d)                GGUF block bytes [n_out][row bytes], lossless
    to_ggml(q, d, kind)             -> uint8 [n_out][row bytes]   (the inverse; tests, GGUF writers)
    from_ggml_q6k(raw, n_in) / to_ggml_q6k(q, sc, d)         the same for block_q6_K (210 bytes / 256 inputs)
    head_kind(kind, n_in=None)      -> "q6_k" for q4_0 (q8_0 if n_in % 256), "q8_0" for q8_0
"""
from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentError, shown
from .validate import Q0_RECORD, Q0_UNIT
from .weights import aligned_empty

QK = 32                                   # inputs per block
TILE = 64                                 # outputs per tile
KINDS = ("q8_0", "q4_0")
RECORD = {k: Q0_RECORD[k] for k in KINDS}  # bytes per (tile, block) record: 128 bytes of scales + the ints
BLOCK_BYTES = {"q8_0": 2 + QK, "q4_0": 2 + QK // 2}   # ggml's block_q8_0 / block_q4_0
QK_K = 256                                # q6_k: inputs per super-block (one binary16 d, 16 int8 sub-scales)
SUPER6 = Q0_RECORD["q6_k"]                # q6_k bytes per (tile, super-block): 64 binary16 d, 8 records (13440)
RECORD6 = (SUPER6 - 128) // 8             # q6_k bytes per (tile, block of 32): 128 of sub-scales, 1024 + 512 of u
BLOCK_BYTES_Q6K = 2 + QK_K // 16 + 3 * QK_K // 4    # ggml's block_q6_K: ql[128], qh[64], scales[16], d (210)
TILED_KINDS = KINDS + ("q6_k",)           # the kinds of tiled_shape / tile_bytes / quantize_tiled
F16_MAX = np.float32(65504.0)
_GROUP_MAX_EPS = np.float32(1e-15)        # ggml-quants.c GROUP_MAX_EPS: smaller max |x| (|scale|) = all zero
_MAGIC = np.float32(12582912.0)           # nearest_int's 1.5 * 2^23
_ROWS = 256                               # rows quantized per step (a multiple of TILE)

__all__ = ["QK", "TILE", "KINDS", "RECORD", "BLOCK_BYTES", "QK_K", "RECORD6", "SUPER6",
           "BLOCK_BYTES_Q6K", "TILED_KINDS", "quantize", "quantize_tiled", "tile", "untile", "dequantize",
           "from_ggml", "to_ggml", "n_tiles", "tiled_shape", "tile_bytes", "head_kind", "quantize_q6k",
           "dequantize_q6k", "from_ggml_q6k", "to_ggml_q6k", "tile_q6k", "untile_q6k", "row_bytes",
           "tile_blocks", "dequantize_blocks"]


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


def head_kind(kind: str, n_in: int | None = None) -> str:
    """The kind of the embedding / LM head [V][n_in] that goes with block matrices of `kind`, as llama-quantize
    chooses it: q6_k for q4_0 (q8_0 when n_in is given and not a multiple of 256), q8_0 for q8_0."""
    _check_kind(kind)
    if kind == "q4_0" and (n_in is None or n_in % QK_K == 0):
        return "q6_k"
    return "q8_0"


def n_tiles(n_out: int) -> int:
    return -(-n_out // TILE)


def tiled_shape(n_out: int, n_in: int, kind: str) -> tuple[int, int, int]:
    """Shape of the tiled uint8 array of a [n_out][n_in] matrix: (n_tiles, n_in/32, RECORD[kind]) for q8_0 /
    q4_0, (n_tiles, n_in/256, SUPER6) for q6_k."""
    _check_kind(kind, TILED_KINDS)
    return (n_tiles(n_out), n_in // Q0_UNIT[kind], Q0_RECORD[kind])


def tile_bytes(n_in: int, kind: str) -> int:
    """Bytes per tile of 64 outputs: n_in/32 * RECORD[kind] (q8_0 / q4_0), n_in/256 * SUPER6 (q6_k)."""
    _check_kind(kind, TILED_KINDS)
    return n_in // Q0_UNIT[kind] * Q0_RECORD[kind]


def _check_kind(kind, kinds=KINDS) -> None:
    if kind not in kinds:
        raise InvalidArgumentError(f"kind must be one of {', '.join(kinds)}, got {shown(kind)}")


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


def quantize(w_out_in, kind: str, what: str = "quantize") -> tuple[np.ndarray, ...]:
    """W [n_out][n_in] (float16/float32; n_in % 32 == 0) -> (q int8 [n_out][n_in], d float16 [n_out][nb]),
    the ints and scales of ggml's reference quantizer of `kind`; q6_k: quantize_q6k's (q, sc, d)."""
    if kind == "q6_k":
        return quantize_q6k(w_out_in, what)
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
    """tile(*quantize(w, kind), kind) (q6_k: tile_q6k(*quantize_q6k(w))), a chunk of rows at a time."""
    _check_kind(kind, TILED_KINDS)
    w = _as_q6k_matrix(w_out_in, what) if kind == "q6_k" else _as_matrix(w_out_in, what)
    n_out, n_in = w.shape
    out = aligned_empty(tiled_shape(n_out, n_in, kind), np.uint8)
    step = _ROWS // TILE
    for t in range(0, out.shape[0], step):
        rows = np.asarray(w[t * TILE:(t + step) * TILE], dtype=np.float32)
        try:
            if kind == "q6_k":
                out[t:t + step] = _records_q6k(*_pad_tiles_q6k(*_q6k_rows(rows, what)))
                continue
            q, d = _quantize_rows(rows.reshape(-1, n_in // QK, QK), kind, what)
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


def from_ggml(raw: np.ndarray, kind: str, n_in: int) -> tuple[np.ndarray, ...]:
    """GGUF tensor bytes uint8 [n_out][n_in/32 * BLOCK_BYTES] (ggml blocks: binary16 d, then 32 int8 (q8_0) or
    16 bytes of nibbles, byte j = element j | element j + 16 << 4, offset 8 (q4_0)) -> (q int8, d float16);
    q6_k: from_ggml_q6k's (q, sc, d)."""
    if kind == "q6_k":
        return from_ggml_q6k(raw, n_in)
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


# ---------------------------------------------------------------------------------------------------
# q6_k: llama.cpp's Q6_K (the LM head of q4_0 models; docs/kernels.md "q6_k")

def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int, bit for bit: the bits of v + 12582912.0f (one binary32 add, ties to even), & 0x7fffff,
    - 0x400000 (int32). Round half to even for |v| <= 4194303 (ggml asserts that range)."""
    t = np.add(v, _MAGIC, dtype=np.float32)
    return (t.view(np.int32) & np.int32(0x7FFFFF)) - np.int32(0x400000)


def _fit(X: np.ndarray, W: np.ndarray, WX: np.ndarray, iscale: np.ndarray, l: np.ndarray):
    """One trial of make_qx_quants for every sub-block: l[i] = MAX(-32, MIN(31, nearest_int(iscale * x[i])))
    (float32 [16][ns], in l), sumlx = sum_i (w x[i]) * l, suml2 = sum_i (w l) * l in order i = 0..15 (float32
    [ns]; w = x[i]*x[i], WX = w*x[i]).  |iscale * x[i]| <= 32.9 (|x[i]| <= |max|), so nearest_int is
    fl(v + 12582912) - 12582912, and the clamp is done on v + 12582912 (exact integers there)."""
    sumlx = np.zeros(X.shape[1], np.float32)
    suml2 = np.zeros(X.shape[1], np.float32)
    tmp = np.empty(X.shape[1], np.float32)
    for i in range(16):
        li = l[i]
        np.multiply(iscale, X[i], out=li)
        np.add(li, _MAGIC, out=li)
        np.minimum(li, _MAGIC + np.float32(31), out=li)
        np.maximum(li, _MAGIC - np.float32(32), out=li)
        np.subtract(li, _MAGIC, out=li)
        np.multiply(WX[i], li, out=tmp)
        np.add(sumlx, tmp, out=sumlx)
        np.multiply(W[i], li, out=tmp)
        np.multiply(tmp, li, out=tmp)
        np.add(suml2, tmp, out=suml2)
    return sumlx, suml2


def _make_qx_quants(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_qx_quants(16, 32, x, L, rmse_type 1, NULL) for every sub-block at once: X float32 [16][ns]
    (input i of sub-block s at X[i][s]) -> (scale float32 [ns], l float32 [16][ns] = L - 32 in -32..31)."""
    ns = X.shape[1]
    cols = np.arange(ns)
    A = np.abs(X)
    imax = A.argmax(axis=0)                                  # the first largest |x| (ggml's strict >)
    zero = A[imax, cols] < _GROUP_MAX_EPS                    # all zero: L = 0, scale 0
    mx = np.where(zero, np.float32(1), X[imax, cols])        # max (1 for all-zero groups: no inf / NaN)
    W = X * X                                                # rmse_type 1: w = x[i] * x[i]
    WX = W * X                                               # w * x[i]
    l = np.empty_like(X)
    sumlx, suml2 = _fit(X, W, WX, np.float32(-32) / mx, l)   # iscale = -nmax / max
    L = l.copy()
    scale = np.where(suml2 != 0, sumlx / np.where(suml2 != 0, suml2, np.float32(1)), np.float32(0))
    best = scale * sumlx
    for s in range(-9, 10):
        if s == 0:
            continue
        iscale = -(np.float32(32) + np.float32(0.1) * np.float32(s)) / mx      # -(nmax + 0.1f*is) / max
        sumlx, suml2 = _fit(X, W, WX, iscale, l)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        if better.any():
            np.copyto(L, l, where=better)
            scale = np.where(better, sumlx / np.where(better, suml2, np.float32(1)), scale)
            best = np.where(better, scale * sumlx, best)
    L[:, zero] = -32
    scale[zero] = 0
    return scale.astype(np.float32, copy=False), L


def _q6k_rows(x: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [m][n_in] (n_in % 256 == 0) -> (q int8 [m][n_in], sc int8 [m][n_in/16], d float16
    [m][n_in/256]): quantize_row_q6_K_ref on every row."""
    if not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x))[0]
        raise InvalidArgumentError(f"{what}: weights must be finite (NaN or inf at output {int(bad[0])}, "
                                   f"input {int(bad[1])})")
    m, n_in = x.shape
    nsb = n_in // QK_K
    X = np.ascontiguousarray(x.reshape(-1, 16).T)                          # [16][m * n_in/16]
    with np.errstate(all="ignore"):                                        # over/underflow as in C
        scales, L = _make_qx_quants(X)
        S = scales.reshape(m * nsb, 16)                                    # [super-block][16]
        imax = np.abs(S).argmax(axis=1)                                    # the first largest |scale|
        max_scale = S[np.arange(m * nsb), imax]
        bad = ~np.isfinite(S).all(axis=1)
        zero = (np.abs(max_scale) < _GROUP_MAX_EPS) & ~bad                 # all-zero super-block
        iscale = np.float32(-128) / np.where(zero, np.float32(1), max_scale)   # -128.f / max_scale
        d32 = np.float32(1) / iscale                                       # 1 / iscale
        bad |= ~np.isfinite(d32) | (np.abs(d32) > F16_MAX)
        if bad.any():
            o = int(np.argwhere(bad)[0][0]) // nsb
            raise InvalidArgumentError(f"{what}: output {o} has weights up to {float(np.abs(x[o]).max()):.6g}, "
                                       f"beyond q6_k's range (its scale would overflow float16)")
        d = d32.astype(np.float16)                                         # GGML_FP32_TO_FP16: nearest even
        sc = np.minimum(_nearest_int(iscale[:, None] * S), 127).astype(np.int8)   # MIN(127, ...), int8_t
        dd = np.repeat(d.astype(np.float32), 16) * sc.reshape(-1).astype(np.float32)   # fp16 d * scales[j]
        nz = dd != 0                                                       # if (!d) continue: L stays
        v = X / np.where(nz, dd, np.float32(1))                            # x / d
        q = np.clip(_nearest_int(v), -32, 31).astype(np.float32)
        np.copyto(L, q, where=nz)
    q = L.T.reshape(m, n_in).astype(np.int8)
    sc = sc.reshape(m * nsb, 16)
    q.reshape(m * nsb, QK_K)[zero] = -32                                   # memset 0: u = 0
    sc[zero] = 0
    d[zero] = 0
    return q, sc.reshape(m, n_in // 16), d.reshape(m, nsb)


def _as_q6k_matrix(w, what: str) -> np.ndarray:
    w = float_matrix(w, what)                                              # [n_out][n_in]
    if w.shape[1] % QK_K:
        raise InvalidArgumentError(f"{what}: q6_k needs n_in a positive multiple of {QK_K}, got shape {w.shape}")
    return w


def quantize_q6k(w_out_in, what: str = "quantize_q6k") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W [n_out][n_in] (float16/32/64; n_in % 256 == 0) -> (q int8 [n_out][n_in] in -32..31, sc int8
    [n_out][n_in/16], d float16 [n_out][n_in/256]): exactly ggml's quantize_row_q6_K_ref (q = L - 32)."""
    w = _as_q6k_matrix(w_out_in, what)
    n_out, n_in = w.shape
    q = np.empty((n_out, n_in), np.int8)
    sc = np.empty((n_out, n_in // 16), np.int8)
    d = np.empty((n_out, n_in // QK_K), np.float16)
    for o in range(0, n_out, _ROWS):
        try:
            q[o:o + _ROWS], sc[o:o + _ROWS], d[o:o + _ROWS] = _q6k_rows(np.asarray(w[o:o + _ROWS], np.float32), what)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(_shift_output(str(e), o)) from None
    return q, sc, d


def _check_q6k(q, sc, d, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, sc, d = np.asarray(q), np.asarray(sc), np.asarray(d)
    if q.ndim != 2 or q.dtype != np.int8 or q.shape[1] % QK_K or 0 in q.shape or sc.dtype != np.int8 \
            or sc.shape != (q.shape[0], q.shape[1] // 16) or d.dtype != np.float16 \
            or d.shape != (q.shape[0], q.shape[1] // QK_K):
        raise InvalidArgumentError(f"{what} expects q int8 [n_out][n_in] (n_in % {QK_K} == 0), sc int8 "
                                   f"[n_out][n_in/16] and d float16 [n_out][n_in/{QK_K}], got {q.dtype} {q.shape}, "
                                   f"{sc.dtype} {sc.shape} and {d.dtype} {d.shape}")
    if int(q.min()) < -32 or int(q.max()) > 31:
        raise InvalidArgumentError(f"{what}: q6_k ints must be in -32..31")
    return q, sc, d


def dequantize_q6k(q: np.ndarray, sc: np.ndarray, d: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [n_out][n_in]: y = (float32(d) * float32(sc)) * float32(q), as ggml's dequantize_row_q6_K
    (`d * sc[is] * q`, left to right; the first product is exact)."""
    q, sc, d = _check_q6k(q, sc, d, "dequantize_q6k")
    n_out, n_in = q.shape
    if out is None:
        out = aligned_empty((n_out, n_in), np.float32)
    for o in range(0, n_out, 4 * _ROWS):
        ds = (np.repeat(d[o:o + 4 * _ROWS].astype(np.float32), 16, axis=1)
              * sc[o:o + 4 * _ROWS].astype(np.float32))[..., None]           # [m][n_in/16][1]
        qb = q[o:o + 4 * _ROWS].reshape(-1, n_in // 16, 16).astype(np.float32)
        np.multiply(ds, qb, out=out[o:o + 4 * _ROWS].reshape(qb.shape))
    return out


def from_ggml_q6k(raw: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF Q6_K tensor bytes uint8 [n_out][n_in/256 * 210] (block_q6_K: ql[128], qh[64], scales[16], d) ->
    (q, sc, d), lossless.  In each half h of 128 inputs, input h*128 + 32s + l (s = 0..3, l < 32) is
    u = (ql[64h + l + 32(s & 1)] >> 4 (s >= 2) & 15) | ((qh[32h + l] >> 2s) & 3) << 4, q = u - 32."""
    nsb = n_in // QK_K
    raw = np.asarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or n_in <= 0 or n_in % QK_K or raw.shape[1] != nsb * BLOCK_BYTES_Q6K:
        raise InvalidArgumentError(f"from_ggml_q6k: rows of {n_in} inputs (a multiple of {QK_K}) are "
                                   f"{nsb * BLOCK_BYTES_Q6K} bytes, got shape {raw.shape}")
    n_out = raw.shape[0]
    blk = raw.reshape(n_out, nsb, BLOCK_BYTES_Q6K)
    ql = blk[..., :128].reshape(n_out, nsb, 2, 64)
    qh = blk[..., 128:192].reshape(n_out, nsb, 2, 1, 32)
    lo = np.concatenate([ql & 15, ql >> 4], axis=3)                                    # [..][h][128]
    hi = ((qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3).reshape(n_out, nsb, 2, 128)
    q = ((lo | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(n_out, n_in)
    sc = np.ascontiguousarray(blk[..., 192:208]).view(np.int8).reshape(n_out, nsb * 16)
    d = np.ascontiguousarray(blk[..., 208:210]).view("<f2").reshape(n_out, nsb).astype(np.float16)
    return q, sc, d


def to_ggml_q6k(q: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """(q, sc, d) -> GGUF Q6_K bytes uint8 [n_out][n_in/256 * 210] (the inverse of from_ggml_q6k)."""
    q, sc, d = _check_q6k(q, sc, d, "to_ggml_q6k")
    n_out, n_in = q.shape
    nsb = n_in // QK_K
    U = (q + np.int8(32)).view(np.uint8).reshape(n_out, nsb, 2, 128)                  # L = q + 32: 0..63
    ql = (U[..., :64] & 15) | ((U[..., 64:] & 15) << np.uint8(4))
    H = (U >> np.uint8(4)).reshape(n_out, nsb, 2, 4, 32)
    qh = H[..., 0, :] | (H[..., 1, :] << np.uint8(2)) | (H[..., 2, :] << np.uint8(4)) | (H[..., 3, :] << np.uint8(6))
    S = sc.reshape(n_out, nsb, 16).view(np.uint8)
    D = np.asarray(d, np.float16).astype("<f2").view(np.uint8).reshape(n_out, nsb, 2)
    return np.concatenate([ql.reshape(n_out, nsb, 128), qh.reshape(n_out, nsb, 64), S, D],
                          axis=2).reshape(n_out, nsb * BLOCK_BYTES_Q6K)


def _records_q6k(q: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """q int8 [64 t][n_in], sc int8 [64 t][n_in/16], d float16 [64 t][n_in/256] (whole tiles) -> uint8
    [t][n_in/256][SUPER6]."""
    rows, n_in = q.shape
    nt, nb, nsb = rows // TILE, n_in // QK, n_in // QK_K
    # U[t][b][g][j][k] = q[64t + j][32b + 4g + k] + 32
    U = (q.reshape(nt, TILE, nb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(nt, nb, 2048) + np.int8(32)).view(np.uint8)
    P = (U[..., :1024] & 15) | ((U[..., 1024:] & 15) << np.uint8(4))
    H = ((U[..., 0:512] >> 4) | ((U[..., 512:1024] >> 4) << np.uint8(2)) | ((U[..., 1024:1536] >> 4) << np.uint8(4))
         | ((U[..., 1536:] >> 4) << np.uint8(6)))
    SC = sc.reshape(nt, TILE, nb, 2).transpose(0, 2, 3, 1).reshape(nt, nb, 128).view(np.uint8)
    rec = np.concatenate([SC, P, H], axis=2).reshape(nt, nsb, 8 * RECORD6)
    D = np.ascontiguousarray(d.reshape(nt, TILE, nsb).transpose(0, 2, 1), "<f2").view(np.uint8).reshape(nt, nsb, 128)
    return np.concatenate([D, rec], axis=2)


def _pad_tiles_q6k(q, sc, d):
    rows = n_tiles(q.shape[0]) * TILE
    if rows == q.shape[0]:
        return q, sc, d
    out = []
    for a in (q, sc, d):
        p = np.zeros((rows, a.shape[1]), a.dtype)
        p[:a.shape[0]] = a
        out.append(p)
    return tuple(out)


def tile_q6k(q: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """(q int8 [n_out][n_in] in -32..31, sc int8 [n_out][n_in/16], d float16 [n_out][n_in/256]) -> uint8
    [n_tiles][n_in/256][SUPER6], 64-byte aligned: super-record (t, S) = the 64 binary16 d[64t + j][S], then 8
    records of RECORD6 (docs/kernels.md "q6_k": sub-scales, P low nibbles, H high bits of u = q + 32).
    Padding outputs: q 0, sc 0, d +0."""
    q, sc, d = _check_q6k(q, sc, d, "tile_q6k")
    n_out, n_in = q.shape
    out = aligned_empty(tiled_shape(n_out, n_in, "q6_k"), np.uint8)
    step = _ROWS // TILE
    for t in range(0, out.shape[0], step):
        rows = slice(t * TILE, (t + step) * TILE)
        out[t:t + step] = _records_q6k(*_pad_tiles_q6k(q[rows], sc[rows], d[rows]))
    return out


def untile_q6k(w: np.ndarray, n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverse of tile_q6k(): (q int8 [n_out][n_in], sc int8 [n_out][n_in/16], d float16 [n_out][n_in/256])."""
    nt, nb, nsb = n_tiles(n_out), n_in // QK, n_in // QK_K
    R = np.asarray(w, np.uint8).reshape(nt, nsb, SUPER6)
    d = R[..., :128].copy().view("<f2").reshape(nt, nsb, TILE).transpose(0, 2, 1).reshape(nt * TILE, nsb)
    rec = R[..., 128:].reshape(nt, nb, RECORD6)
    sc = rec[..., :128].copy().view(np.int8).reshape(nt, nb, 2, TILE).transpose(0, 3, 1, 2).reshape(nt * TILE, 2 * nb)
    P, H = rec[..., 128:1152], rec[..., 1152:]
    lo = np.concatenate([P & 15, P >> 4], axis=2)
    hi = np.concatenate([H & 3, (H >> 2) & 3, (H >> 4) & 3, H >> 6], axis=2)
    U = (lo | (hi << np.uint8(4))).view(np.int8) - np.int8(32)
    q = U.reshape(nt, nb, 8, TILE, 4).transpose(0, 3, 1, 2, 4).reshape(nt * TILE, n_in)
    return q[:n_out].copy(), sc[:n_out].copy(), d[:n_out].astype(np.float16)


# ---- one interface over the kinds (the loaders: blocks = (q, d), or (q, sc, d) for q6_k) ----

def row_bytes(n_in: int, kind: str) -> int:
    """Bytes of one row of n_in inputs in ggml's blocks of `kind` (as a GGUF stores them)."""
    if kind == "q6_k":
        return n_in // QK_K * BLOCK_BYTES_Q6K
    _check_kind(kind)
    return n_in // QK * BLOCK_BYTES[kind]


def tile_blocks(blocks: tuple, kind: str) -> np.ndarray:
    """quantize()'s / from_ggml()'s blocks of `kind` -> the kernels' records (tile / tile_q6k)."""
    return tile_q6k(*blocks) if kind == "q6_k" else tile(*blocks, kind)


def dequantize_blocks(blocks: tuple, kind: str) -> np.ndarray:
    """The blocks of `kind` dequantized as ggml does: float32 [n_out][n_in] (dequantize / dequantize_q6k)."""
    return dequantize_q6k(*blocks) if kind == "q6_k" else dequantize(*blocks)
