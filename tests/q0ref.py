"""numpy contract model of the q8_0 / q4_0 / q6_k integer kernels (docs/kernels.md, "q8_0 / q4_0", "q6_k").

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


# ---- q6_k: llama.cpp's Q6_K (the LM head of q4_0 models; docs/kernels.md "q6_k") ----

QK_K = 256                   # inputs per super-block (one fp16 d)
RECORD6 = 1664               # bytes per (tile, block of 32) record: 128 of sub-scales, 1024 low nibbles, 512 high bits
SUPER6 = 128 + 8 * RECORD6   # bytes per (tile, super-block): the 64 d's, then its 8 records (13440)


def tile_bytes_q6k(n_in: int) -> int:
    return n_in // QK_K * SUPER6


def tile_q6k(q: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """(q int8 [n_out][n_in] in -32..31, sc int8 [n_out][n_in/16], d float16 [n_out][n_in/256]) -> uint8
    [n_tiles * n_in/256 * SUPER6] in the kernels' layout (padding outputs: q 0, sc 0, d +0)."""
    n_out, n_in = q.shape
    nb, nsb = n_in // QK, n_in // QK_K
    nt = -(-n_out // TILE)
    qp = np.zeros((nt * TILE, n_in), np.int8); qp[:n_out] = q
    sp = np.zeros((nt * TILE, 2 * nb), np.int8); sp[:n_out] = sc
    dp = np.zeros((nt * TILE, nsb), np.float16); dp[:n_out] = d
    # U[t][b][g][j][k] = q[64t+j][32b+4g+k] + 32
    U = (qp.reshape(nt, TILE, nb, 8, 4).transpose(0, 2, 3, 1, 4).reshape(nt, nb, 2048).astype(np.int16)
         + 32).astype(np.uint8)
    P = (U[..., :1024] & 15) | ((U[..., 1024:] & 15) << np.uint8(4))
    H = ((U[..., 0:512] >> 4) | ((U[..., 512:1024] >> 4) << np.uint8(2)) | ((U[..., 1024:1536] >> 4) << np.uint8(4))
         | ((U[..., 1536:] >> 4) << np.uint8(6)))
    SC = sp.reshape(nt, TILE, nb, 2).transpose(0, 2, 3, 1).reshape(nt, nb, 128).view(np.uint8)
    rec = np.concatenate([SC, P, H], axis=2).reshape(nt, nsb, 8 * RECORD6)
    D = dp.reshape(nt, TILE, nsb).transpose(0, 2, 1).copy().view(np.uint8).reshape(nt, nsb, 128)
    return np.concatenate([D, rec], axis=2).reshape(-1)


def untile_q6k(w: np.ndarray, n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverse of tile_q6k: (q int8 [n_out][n_in], sc int8 [n_out][n_in/16], d float16 [n_out][n_in/256])."""
    nb, nsb = n_in // QK, n_in // QK_K
    nt = -(-n_out // TILE)
    R = np.asarray(w, np.uint8).reshape(nt, nsb, SUPER6)
    d = R[..., :128].copy().view(np.float16).reshape(nt, nsb, TILE).transpose(0, 2, 1).reshape(nt * TILE, nsb)
    rec = R[..., 128:].reshape(nt, nb, RECORD6)
    sc = rec[..., :128].copy().view(np.int8).reshape(nt, nb, 2, TILE).transpose(0, 3, 1, 2).reshape(nt * TILE, 2 * nb)
    P, H = rec[..., 128:1152], rec[..., 1152:]
    lo = np.concatenate([P & 15, P >> 4], axis=2)
    hi = np.concatenate([H & 3, (H >> 2) & 3, (H >> 4) & 3, H >> 6], axis=2)
    U = (lo | (hi << np.uint8(4))).astype(np.int16) - 32
    q = U.astype(np.int8).reshape(nt, nb, 8, TILE, 4).transpose(0, 3, 1, 2, 4).reshape(nt * TILE, n_in)
    return q[:n_out].copy(), sc[:n_out].copy(), d[:n_out].copy()


def matvec_q6k(q: np.ndarray, sc: np.ndarray, d: np.ndarray, xq: np.ndarray, xd: np.ndarray,
               b: np.ndarray | None) -> np.ndarray:
    """y float32 [n_out]: per block b of 32 inputs, S0 / S1 = the int sums over its two halves of 16,
    s = sc[2b] * S0 + sc[2b+1] * S1 (exact int32, |s| < 2^24), t = xd[b] * d[b/8], acc = fma((float)s, t, acc);
    then y = acc + bias."""
    n_out, n_in = q.shape
    nb = n_in // QK
    half = (q.reshape(n_out, 2 * nb, 16).astype(np.int64) * xq.reshape(2 * nb, 16).astype(np.int64)).sum(axis=2)
    s = (half * sc.astype(np.int64)).reshape(n_out, nb, 2).sum(axis=2)
    assert np.abs(s).max(initial=0) < (1 << 24)
    sf = s.astype(np.float32)
    acc = np.zeros(n_out, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for blk in range(nb):
            t = (xd[blk] * d[:, blk // 8].astype(np.float32)).astype(np.float32)
            acc = fma(sf[:, blk], t, acc)
        if b is not None:
            acc = (acc + b.astype(np.float32)).astype(np.float32)
    return acc
