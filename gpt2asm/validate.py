"""Validators of the arrays and sizes that reach assembly by address (the kernels trust their arguments).

Each raises InvalidArgumentError naming the argument, before anything is called: Kernels' numpy API and
Plan's job builders validate every array with these.  Token ids and sampling arguments: args.py.
"""
from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentError, shown

ALIGN = 64
TILE = 64
HEAD_DIM = 64
SIZE_MAX = (1 << 64) - 1          # what a size_t kernel returns for "none" (gpt2asm_argmax_f32)
# the dtypes a KV cache may have, by name: float32, or binary16 (State, Transformer(kv=...))
KV_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}
# the dtypes of tiled weight matrices
MATRIX_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


def is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def addr(a: np.ndarray) -> int:
    return a.ctypes.data


def check(a, name: str, dtype, size: int | None = None, aligned: bool = False, writable: bool = False):
    """Validate one array argument before its address reaches assembly."""
    if not isinstance(a, np.ndarray):
        raise InvalidArgumentError(f"{name}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise InvalidArgumentError(f"{name}: dtype {a.dtype}, expected {np.dtype(dtype)}")
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(f"{name}: array must be C-contiguous")
    if size is not None and a.size != size:
        raise InvalidArgumentError(f"{name}: {a.size} elements, expected {size}")
    if aligned and addr(a) % ALIGN:
        raise InvalidArgumentError(f"{name}: address must be {ALIGN}-byte aligned")
    if writable and not a.flags.writeable:
        raise InvalidArgumentError(f"{name}: array is read-only")
    return addr(a)


def check_cache(k, v, writable: bool = False) -> tuple[int, int]:
    """Validate one layer's key and value caches k, v [H][n_ctx][64] (both float32, or both float16):
    (H, n_ctx)."""
    if not (isinstance(k, np.ndarray) and k.ndim == 3 and k.shape[2] == HEAD_DIM):
        raise InvalidArgumentError("k: expected a cache [n_head][n_ctx][64]")
    if k.dtype not in KV_DTYPES.values():
        raise InvalidArgumentError(f"k: dtype {k.dtype}, expected float32 or float16")
    H, n_ctx, _ = k.shape
    check(k, "k", k.dtype, writable=writable)
    check(v, "v", k.dtype, k.size, writable=writable)
    if v.shape != k.shape:
        raise InvalidArgumentError(f"v: shape {v.shape}, expected {k.shape}")
    return H, n_ctx


def check_attention(q, k, v, n_pos) -> tuple[int, int]:
    """Validate attention arguments (q [H*64], k, v [H][n_ctx][64], 1 <= n_pos <= n_ctx): (H, n_ctx)."""
    H, n_ctx = check_cache(k, v)
    check(q, "q", np.float32, H * HEAD_DIM)
    if not (is_int(n_pos) and 1 <= n_pos <= n_ctx):
        raise InvalidArgumentError(f"n_pos must be in 1..{n_ctx}, got {shown(n_pos)}")
    return H, n_ctx


def check_matrix(w, name: str = "w", n_tiles: int | None = None) -> tuple[int, int, np.dtype]:
    """Validate a tiled weight matrix [n_tiles][n_in][64] (float32 or float16): (n_tiles, n_in, dtype)."""
    if not (isinstance(w, np.ndarray) and w.ndim == 3 and w.shape[2] == TILE and w.shape[0] >= 1
            and w.shape[1] >= 1 and w.dtype in MATRIX_DTYPES):
        raise InvalidArgumentError(f"{name}: expected a tiled float32/float16 matrix [n_tiles][n_in][64]")
    nt, n_in, _ = w.shape
    if n_tiles is not None and nt != n_tiles:
        raise InvalidArgumentError(f"{name}: {nt} tiles, expected {n_tiles}")
    check(w, name, w.dtype, aligned=True)
    return nt, n_in, w.dtype


def check_rows(a, name: str, width: int, writable: bool = False, dtype=np.float32) -> tuple[int, int]:
    """Validate a row buffer [rows][>= width] of float32 (or dtype: the int8 xq rows of the q0 jobs), its
    elements contiguous within a row and rows ld elements apart (a C-contiguous array, or a column slice
    of one): (rows, ld)."""
    if not (isinstance(a, np.ndarray) and a.ndim == 2 and a.shape[0] >= 1):
        raise InvalidArgumentError(f"{name}: expected rows [n][{width}+]")
    dt = np.dtype(dtype)
    if a.dtype != dt:
        raise InvalidArgumentError(f"{name}: dtype {a.dtype}, expected {dt}")
    if a.shape[1] < width:
        raise InvalidArgumentError(f"{name}: rows of {a.shape[1]} elements, need {width}")
    rs, cs = a.strides
    es = dt.itemsize
    if not (cs == es and rs >= es * a.shape[1] and rs % es == 0):
        raise InvalidArgumentError(f"{name}: rows must be contiguous and in increasing address order")
    if writable and not a.flags.writeable:
        raise InvalidArgumentError(f"{name}: array is read-only")
    return a.shape[0], rs // es


# q8_0 / q4_0 / q6_k tiled records (docs/kernels.md, "q8_0 / q4_0" and "q6_k"; gpt2asm/quant0.py): bytes per
# record and the inputs one record covers -- q8_0 / q4_0: a (tile, block of 32) record; q6_k: a (tile,
# super-block of 256) super-record (the 64 d's and 8 records of 1664 bytes)
Q0_RECORD = {"q8_0": 2176, "q4_0": 1152, "q6_k": 13440}
Q0_UNIT = {"q8_0": 32, "q4_0": 32, "q6_k": 256}
Q0_QK = 32                      # inputs per block (of the activations, and of q8_0 / q4_0 weights)
Q0_MAX_IN = 1 << 15             # the kernels' stack tables (q0kernels.Q0_MAX_IN)


def check_q0_matrix(w, name: str = "w", n_tiles: int | None = None) -> tuple[int, int, str]:
    """Validate q8_0 / q4_0 / q6_k tiled records uint8 [n_tiles][n_in/UNIT][RECORD] (64-byte aligned,
    C-contiguous): (n_tiles, n_in, kind) -- the kind is told by the record size."""
    kinds = {r: k for k, r in Q0_RECORD.items()}
    if not (isinstance(w, np.ndarray) and w.ndim == 3 and w.dtype == np.uint8 and w.shape[2] in kinds
            and w.shape[0] >= 1 and w.shape[1] >= 1):
        raise InvalidArgumentError(f"{name}: expected q8_0 / q4_0 / q6_k records uint8 [n_tiles][n_in/unit]"
                                   f"[{' or '.join(map(str, kinds))}]")
    nt, nr, rec = w.shape
    n_in = nr * Q0_UNIT[kinds[rec]]
    if n_in > Q0_MAX_IN:
        raise InvalidArgumentError(f"{name}: {n_in} inputs, at most {Q0_MAX_IN}")
    if n_tiles is not None and nt != n_tiles:
        raise InvalidArgumentError(f"{name}: {nt} tiles, expected {n_tiles}")
    check(w, name, np.uint8, aligned=True)
    return nt, n_in, kinds[rec]


def aligned_bytes(nbytes: int) -> np.ndarray:
    """Zeroed, 64-byte aligned uint8 buffer (its base array keeps the memory alive)."""
    buf = np.zeros(nbytes + ALIGN, np.uint8)
    start = (-buf.ctypes.data) % ALIGN
    return buf[start:start + nbytes]
