"""numpy contract model of the q8_0 / q4_0 integer kernels (docs/kernels.md, "q8_0 / q4_0").

The executable form of the contract: the tiled weight layouts, the run-time activation quantizer and the
per-output operation sequence.  Every kernel variant (x86, Arm) must give exactly these bits (NaN-ness aside for
payloads).  Deliberately plain loops over blocks in numpy, float32 throughout.
"""
from __future__ import annotations

import numpy as np

QK = 32                      # inputs per block
TILE = 64                    # outputs per tile
RECORD = {"q8_0": 2176, "q4_0": 1152}
FLT_MIN = np.float32(np.finfo(np.float32).tiny)
FLT_MAX = np.float32(np.finfo(np.float32).max)


# ---- weights: ggml's reference quantizers (the same ints and scales as gguf.quants) ----

def quantize_blocks_q8_0(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W float32 [n_out][n_in] -> (q int8 [n_out][n_in], d float16 [n_out][nb]) as ggml's quantize_row_q8_0_ref."""
    W = np.ascontiguousarray(W, dtype=np.float32)
    n_out, n_in = W.shape
    blk = W.reshape(n_out, n_in // QK, QK)
    d = (np.abs(blk).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    x = (blk * idv).astype(np.float32)
    a = np.abs(x)
    f = np.floor(a)
    q = np.sign(x) * (f + np.floor(2 * (a - f)))            # roundf: half away from zero, exactly (as gguf.quants;
                                                            # floor(a + 0.5) is not: 0.49999997f + 0.5f == 1.0f)
    return q.astype(np.int8).reshape(n_out, n_in), d[..., 0].astype(np.float16)


def quantize_blocks_q4_0(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W float32 [n_out][n_in] -> (q int8 in -8..7 [n_out][n_in], d float16 [n_out][nb]) as quantize_row_q4_0_ref."""
    W = np.ascontiguousarray(W, dtype=np.float32)
    n_out, n_in = W.shape
    blk = W.reshape(n_out, n_in // QK, QK)
    imax = np.abs(blk).argmax(axis=2)[..., None]
    mx = np.take_along_axis(blk, imax, axis=2)
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    u = np.trunc((blk * idv).astype(np.float32) + np.float32(8.5)).astype(np.int32)
    u = np.minimum(u, 15)
    return (u - 8).astype(np.int8).reshape(n_out, n_in), d[..., 0].astype(np.float16)


# ---- the tiled layouts ----

def tile(q: np.ndarray, d: np.ndarray, kind: str) -> np.ndarray:
    """(q int8 [n_out][n_in], d float16 [n_out][nb]) -> uint8 [n_tiles*nb*RECORD] in the kernels' layout."""
    n_out, n_in = q.shape
    nb = n_in // QK
    nt = -(-n_out // TILE)
    qp = np.zeros((nt * TILE, n_in), np.int8); qp[:n_out] = q
    dp = np.zeros((nt * TILE, nb), np.float16); dp[:n_out] = d
    # L[t][b][g][j][k] = q[64t+j][32b+4g+k]
    L = qp.reshape(nt, TILE, nb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(nt, nb, 2048)
    S = dp.reshape(nt, TILE, nb).transpose(0, 2, 1).copy().view(np.uint8).reshape(nt, nb, 128)
    if kind == "q8_0":
        body = L.view(np.uint8)
    elif kind == "q4_0":
        u = (L.astype(np.int16) + 8).astype(np.uint8)
        body = u[..., :1024] | (u[..., 1024:] << np.uint8(4))
    else:
        raise ValueError(kind)
    return np.concatenate([S, body], axis=2).reshape(-1)


def untile(w: np.ndarray, kind: str, n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of tile(): (q int8 [n_out][n_in], d float16 [n_out][nb])."""
    nb = n_in // QK
    nt = -(-n_out // TILE)
    R = w.reshape(nt, nb, RECORD[kind])
    d = R[..., :128].copy().view(np.float16).reshape(nt, nb, TILE).transpose(0, 2, 1).reshape(nt * TILE, nb)
    body = R[..., 128:]
    if kind == "q8_0":
        L = body.view(np.int8)
    else:
        L = np.concatenate([body & 15, body >> 4], axis=2).astype(np.int8) - 8
    q = L.reshape(nt, nb, 8, TILE, 4).transpose(0, 3, 1, 2, 4).reshape(nt * TILE, n_in)
    return q[:n_out].copy(), d[:n_out].copy()


# ---- activations ----

def quantize_act(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [n_in] -> (xq int8 [n_in], xd float32 [nb]): the run-time rule of gpt2asm_quantize_q8_0."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    bits = x.view(np.int32) & np.int32(0x7FFFFFFF)
    amax = bits.max(axis=1).astype(np.int32).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        d = (amax / np.float32(127)).astype(np.float32)
        ok = (d >= FLT_MIN) & (d <= FLT_MAX)
        idv = np.where(ok, np.float32(1) / np.where(ok, d, np.float32(1)), np.float32(0)).astype(np.float32)
        p = (x * idv[:, None]).astype(np.float32)
        q = np.where(ok[:, None], np.rint(np.where(ok[:, None], p, 0)), 0)       # rint: ties to even
    return q.astype(np.int8).reshape(-1), d


# ---- the per-output sequence ----

def matvec(q: np.ndarray, dw: np.ndarray, xq: np.ndarray, xd: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """y float32 [n_out] from weight ints q [n_out][n_in], dw float16 [n_out][nb], xq int8 [n_in], xd float32 [nb]."""
    n_out, n_in = q.shape
    nb = n_in // QK
    s = (q.reshape(n_out, nb, QK).astype(np.int64) * xq.reshape(nb, QK).astype(np.int64)).sum(axis=2)
    assert np.abs(s).max(initial=0) < (1 << 24)
    sf = s.astype(np.float32)                                  # exact
    acc = np.zeros(n_out, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for blk in range(nb):
            t = (xd[blk] * dw[:, blk].astype(np.float32)).astype(np.float32)
            acc = fma(sf[:, blk], t, acc)
        if b is not None:
            acc = (acc + b.astype(np.float32)).astype(np.float32)
    return acc


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded binary32 fma, elementwise (the harness's fma32)."""
    from test_kernels_matvec import fma32
    return fma32(a, b, c)
