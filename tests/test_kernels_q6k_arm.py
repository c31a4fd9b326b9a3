"""checkasm-style tests of the AArch64 q6_k kernels (docs/kernels.md "q6_k", "AArch64"):

    gpt2asm_matvec_q6_k_neon                                     (asm/aarch64/matvec_q6k_neon.S)
    gpt2asm_matmul_q6_k_neon                                     (asm/aarch64/matmul_q6k_neon.S)
    (the tile body both share: asm/aarch64/q6k_neon.h; base ARMv8.0, so every AArch64 CPU runs them)

Bit for bit against the contract's numpy model tests/q0ref.py (tile_q6k, matvec_q6k; NaN-ness compared,
NaN payloads not): n_in = 256, 512, 768 (one to three super-blocks), tile ranges not starting at 0, n_out
not a multiple of 64, NULL / non-NULL bias, the extremes (q = -32 against xq = +-127 and -128, sub-scales
-128 / 127, all-zero blocks, d = 0 / subnormal / 65504 / inf / NaN, non-finite xd: NaN outputs); the matmul
with 0, 1 .. 9 and 33 tokens and row strides larger than needed; every buffer but w at rotating
misalignments inside 4 KiB canaries (inputs unchanged, outputs outside the range untouched), and in a
forked child every buffer butting against PROT_NONE pages on either side.  Every call goes through the
checkasm trampoline ($GPT2ASM_CHECKASM, set by tests/conftest.py): callee-saved x19-x29 / d8-d15, sp and
FPCR are checked on each one.

The kernels do not depend on the SME configuration, so under make test-arm64 the file runs only in the first
CPU configuration (ARM64_TESTS_ONCE).

Run:  python3 tools/arm64/run_tests.py --cpus "nosme" -j 1 tests/test_kernels_q6k_arm.py
"""
from __future__ import annotations

import ctypes
import itertools
import os
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import q0ref  # noqa: E402
from arm64_qemu import neon_once_marks  # noqa: E402
from forked import run_forked  # noqa: E402
from test_kernels_matvec import Guarded, PageFenced, Y_FILL, check_guarded  # noqa: E402
from test_kernels_q0_arm import MISALIGN, same_bits  # noqa: E402

pytestmark = neon_once_marks()

F32, TILE, QK, QK_K = np.float32, 64, 32, q0ref.QK_K
P, S = ctypes.c_void_p, ctypes.c_size_t
MV, MM = "gpt2asm_matvec_q6_k_neon", "gpt2asm_matmul_q6_k_neon"


# --------------------------------------------------------------------------------------------------
# the library

_STATE: dict = {}


def _load() -> ctypes.CDLL:
    if "lib" not in _STATE:
        if os.environ.get("GPT2ASM_TEST_LIB"):
            from gpt2asm.checkasm import open_library
            lib = open_library(os.environ["GPT2ASM_TEST_LIB"])
        else:
            from gpt2asm.kernels import load_library
            lib = load_library()
        fn = getattr(lib, MV)
        fn.argtypes, fn.restype = [P, P, P, P, P, S, S, S], None
        fn = getattr(lib, MM)
        fn.argtypes, fn.restype = [P, P, S, P, S, P, P, S, S, S, S, S], None
        _STATE["lib"] = lib
    return _STATE["lib"]


@pytest.fixture(scope="module")
def lib():
    return _load()


# --------------------------------------------------------------------------------------------------
# weights, references, runners

_mis = itertools.cycle(MISALIGN)


def random_q6k(rng, n_out, n_in, dscale=0.01):
    """q int8 in -32..31, sc int8 (any), d float16 > 0: the shapes of a Q6_K matrix."""
    q = rng.integers(-32, 32, (n_out, n_in)).astype(np.int8)
    sc = rng.integers(-128, 128, (n_out, n_in // 16)).astype(np.int8)
    d = (rng.random((n_out, n_in // QK_K)) * dscale).astype(np.float16)
    return q, sc, d


def random_x(rng, n, scale=1.0):
    return (rng.standard_normal(n) * scale).astype(F32)


def pad(q, sc, d):
    """Padded to whole tiles as tile_q6k pads (q 0, sc 0, d +0.0)."""
    n_out, n_in = q.shape
    nt = -(-n_out // TILE)
    qp = np.zeros((nt * TILE, n_in), np.int8); qp[:n_out] = q
    sp = np.zeros((nt * TILE, n_in // 16), np.int8); sp[:n_out] = sc
    dp = np.zeros((nt * TILE, n_in // QK_K), np.float16); dp[:n_out] = d
    return qp, sp, dp, nt


def ref(qp, sp, dp, xq, xd, b, tb, te):
    """q0ref.matvec_q6k on the outputs of tiles tb .. te-1."""
    lo, hi = TILE * tb, TILE * te
    with np.errstate(all="ignore"):
        return q0ref.matvec_q6k(qp[lo:hi], sp[lo:hi], dp[lo:hi], xq, xd, None if b is None else b[lo:hi])


def matvec(lib, w, xq, xd, b, n_in, nt, tb, te, seed=0) -> np.ndarray:
    """One matvec call with guarded buffers (w 64-byte aligned, the rest misaligned): y [64 nt]."""
    wg = Guarded(w.nbytes, 0, seed).put(w)
    qg = Guarded(xq.nbytes, next(_mis), seed + 1).put(xq)
    dg = Guarded(xd.nbytes, next(_mis), seed + 2).put(xd)
    bg = Guarded(b.nbytes, next(_mis), seed + 3).put(b) if b is not None else None
    y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(F32)
    yg = Guarded(y0.nbytes, next(_mis), seed + 4).put(y0)
    getattr(lib, MV)(wg.addr, qg.addr, dg.addr, bg.addr if bg else None, yg.addr, n_in, tb, te)
    check_guarded(MV, ((wg, w, "w"), (qg, xq, "xq"), (dg, xd, "xd"), (bg, b, "b"), (yg, None, "y")))
    y = yg.get(F32)
    outside = np.r_[0:TILE * tb, TILE * te:nt * TILE]
    assert (y[outside].view(np.uint32) == Y_FILL).all(), f"{MV} wrote outside tiles [{tb}, {te})"
    return y


def check_matvec(lib, q, sc, d, xq, xd, b, tb, te, seed=0):
    w = q0ref.tile_q6k(q, sc, d)
    qp, sp, dp, nt = pad(q, sc, d)
    y = matvec(lib, w, xq, xd, b, q.shape[1], nt, tb, te, seed)
    got, exp = y[TILE * tb:TILE * te], ref(qp, sp, dp, xq, xd, b, tb, te)
    bad = np.flatnonzero(~same_bits(got, exp))
    assert bad.size == 0, (f"{MV}: outputs {bad[:8] + TILE * tb} differ: got {got[bad[:4]]}, "
                           f"expected {exp[bad[:4]]}")
    return y


def matmul(lib, w, xq, ldq, xd, ldd, b, ldy, T, n_in, tb, te, seed=0) -> np.ndarray:
    """One matmul call: xq [T][ldq] int8, xd [T][ldd] float32 (rows padded with junk), y [T][ldy]; guarded
    misaligned buffers; y outside the T x [64 tb, 64 te) block untouched.  Returns y [max(T, 1)][ldy]."""
    wg = Guarded(w.nbytes, 0, seed).put(w)
    qg = Guarded(xq.nbytes, next(_mis), seed + 1).put(xq)
    dg = Guarded(xd.nbytes, next(_mis), seed + 2).put(xd)
    bg = Guarded(b.nbytes, next(_mis), seed + 3).put(b) if b is not None else None
    y0 = np.full(max(T, 1) * ldy, Y_FILL, np.uint32).view(F32)
    yg = Guarded(y0.nbytes, next(_mis), seed + 4).put(y0)
    getattr(lib, MM)(wg.addr, qg.addr, ldq, dg.addr, ldd, bg.addr if bg else None, yg.addr, ldy, T, n_in, tb, te)
    check_guarded(MM, ((wg, w, "w"), (qg, xq, "xq"), (dg, xd, "xd"), (bg, b, "b"), (yg, None, "y")))
    y = yg.get(F32).reshape(max(T, 1), ldy)
    mask = np.ones(y.shape, bool)
    mask[:T, TILE * tb:TILE * te] = False
    assert (y[mask].view(np.uint32) == Y_FILL).all(), f"{MM} wrote outside its block"
    return y


def check_matmul(lib, q, sc, d, rows, b, tb, te, pad_q=0, pad_d=0, pad_y=0, seed=0):
    """rows: T (xq, xd) pairs; stored ldq = n_in + pad_q, ldd = nb + pad_d, ldy = 64 nt + pad_y apart (the
    padding filled with junk)."""
    T, n_in = len(rows), q.shape[1]
    nb = n_in // QK
    rng = np.random.default_rng(seed)
    xq = rng.integers(-128, 128, (max(T, 1), n_in + pad_q)).astype(np.int8)
    xd = rng.standard_normal((max(T, 1), nb + pad_d)).astype(F32)
    for t, (rq, rd) in enumerate(rows):
        xq[t, :n_in], xd[t, :nb] = rq, rd
    w = q0ref.tile_q6k(q, sc, d)
    qp, sp, dp, nt = pad(q, sc, d)
    ldy = nt * TILE + pad_y
    y = matmul(lib, w, xq, n_in + pad_q, xd, nb + pad_d, b, ldy, T, n_in, tb, te, seed)
    for t, (rq, rd) in enumerate(rows):
        got, exp = y[t, TILE * tb:TILE * te], ref(qp, sp, dp, rq, rd, b, tb, te)
        bad = np.flatnonzero(~same_bits(got, exp))
        assert bad.size == 0, f"{MM}: token {t} of {T}, outputs {bad[:8] + TILE * tb} differ"
    return y


def act_rows(rng, T, n_in, scale=1.0):
    return [q0ref.quantize_act(random_x(rng, n_in, scale)) for _ in range(T)]


def test_exports(lib):
    for name in (MV, MM):
        assert hasattr(lib, name), name
    import build
    for fam in ("neon", "sme2"):           # the sme2 family runs neon's q6_k kernels
        assert {MV, MM} <= set(build.variant_symbols("aarch64", fam))


def test_layout_model():
    """The model's layout round-trips (tile_q6k / untile_q6k) and has the contract's sizes."""
    rng = np.random.default_rng(1)
    q, sc, d = random_q6k(rng, 70, 512)
    w = q0ref.tile_q6k(q, sc, d)
    assert w.size == 2 * q0ref.tile_bytes_q6k(512) == 2 * 2 * 13440
    for a, e in zip(q0ref.untile_q6k(w, 70, 512), (q, sc, d)):
        assert np.array_equal(a.view(np.uint8), e.view(np.uint8))


# --------------------------------------------------------------------------------------------------
# matvec

# (n_out, tile_begin, tile_end): partial last tiles, ranges not starting at 0
RANGES = [(64, 0, 1), (100, 0, 2), (200, 1, 4), (130, 2, 3)]


@pytest.mark.parametrize("n_in", [256, 512, 768])
def test_matvec_sizes(lib, n_in):
    rng = np.random.default_rng(n_in)
    for k, (n_out, tb, te) in enumerate(RANGES):
        if n_in == 768 and k > 2:
            break
        q, sc, d = random_q6k(rng, n_out, n_in)
        xq, xd = q0ref.quantize_act(random_x(rng, n_in))
        b = random_x(rng, -(-n_out // TILE) * TILE) if k % 2 == 0 else None
        check_matvec(lib, q, sc, d, xq, xd, b, tb, te, seed=k)


def test_matvec_random_int8(lib):
    """Any int8 xq (not only the quantizer's range) and any xd: the kernel is exact for xq = -128 too."""
    rng = np.random.default_rng(2)
    q, sc, d = random_q6k(rng, 130, 512)
    xq = rng.integers(-128, 128, 512).astype(np.int8)
    xd = random_x(rng, 16, 0.01)
    check_matvec(lib, q, sc, d, xq, xd, random_x(rng, 192), 0, 3)


def test_matvec_empty_range(lib):
    rng = np.random.default_rng(3)
    q, sc, d = random_q6k(rng, 128, 256)
    xq, xd = q0ref.quantize_act(random_x(rng, 256))
    w = q0ref.tile_q6k(q, sc, d)
    for tb, te in ((0, 0), (1, 1), (2, 1)):
        matvec(lib, w, xq, xd, None, 256, 2, tb, te)


def test_matvec_extremes(lib):
    """q = -32 / 31 against xq = +-127 and -128 with sub-scales -128 / 127 (the largest |s|), every q and
    sub-scale value, all-zero blocks of x and of w, +-amax blocks, subnormal xd, non-finite xd (every
    output NaN), d = 0 / -0 / subnormal / 65504 / inf / NaN."""
    rng = np.random.default_rng(17)
    n_out, n_in = 192, 512
    q, sc, d = random_q6k(rng, n_out, n_in)
    q[0] = -32; q[1] = 31; q[2] = np.resize(np.arange(-32, 32), n_in)
    q[3, :32] = 0; q[4, 100:300] = 0
    sc[0] = -128; sc[1] = 127; sc[2] = np.arange(n_in // 16) * 8 - 128; sc[2, -1] = 127; sc[5, 3] = 0
    sc[6, ::2] = -128; sc[6, 1::2] = 127
    d[7] = np.float16(6e-8); d[8] = np.float16(65504); d[9, 1] = np.float16(np.inf); d[10, 0] = np.float16(np.nan)
    d[11] = np.float16(-0.0); d[12] = 0; d[13, 1] = np.float16(-np.inf); d[14] = np.float16(-65504)
    x = random_x(rng, n_in)
    x[32:64] = 0                                                      # an all-zero block: xd = 0, xq = 0
    x[64:96] = np.where(np.arange(32) % 2, F32(-3.0), F32(3.0))       # +-amax: xq = +-127
    x[96:128] = F32(-5.0)                                             # every xq = -127
    x[128:160] = (rng.standard_normal(32) * 1e-40).astype(F32)        # subnormal xd
    x[300] = np.nan                                                   # a non-finite block: every output NaN
    xq, xd = q0ref.quantize_act(x)
    b = random_x(rng, n_out)
    y = check_matvec(lib, q, sc, d, xq, xd, b, 0, 3)
    assert np.isnan(y).all()
    x[300] = np.inf
    xq, xd = q0ref.quantize_act(x)
    assert np.isnan(check_matvec(lib, q, sc, d, xq, xd, None, 0, 3)).all()
    x[300] = 1.0
    xq, xd = q0ref.quantize_act(x)
    for bias in (b, None):
        check_matvec(lib, q, sc, d, xq, xd, bias, 0, 3)
    # the largest block sums: q = -32 / 31 everywhere, xq = +-127 (and -128), sub-scales -128 / 127
    xd = np.full(n_in // QK, F32(1.0))
    for xq in (np.where(np.arange(n_in) % 3 == 0, -127, 127).astype(np.int8), np.full(n_in, -127, np.int8),
               np.full(n_in, 127, np.int8)):
        check_matvec(lib, q, sc, d, xq, xd, None, 0, 3)
        for qv in (-32, 31):
            for s0, s1 in ((-128, -128), (127, 127), (-128, 127)):
                sce = np.tile(np.array([s0, s1], np.int8), (64, n_in // 32))
                check_matvec(lib, np.full((64, n_in), qv, np.int8), sce, np.ones((64, n_in // QK_K), np.float16),
                             xq, xd, None, 0, 1)
    xq = np.full(n_in, -128, np.int8)                                 # |S| = 16 * 32 * 128 = 2^16
    for s0, s1 in ((-128, 127), (127, 127), (127, -128)):
        sce = np.tile(np.array([s0, s1], np.int8), (64, n_in // 32))
        for qv in (-32, 31):
            check_matvec(lib, np.full((64, n_in), qv, np.int8), sce, np.ones((64, n_in // QK_K), np.float16),
                         xq, xd, None, 0, 1)


def test_matvec_halves(lib):
    """Each half of each block, each group, each output lane on its own (one nonzero q): catches a
    mixed-up nibble / high-bit group or sub-scale half."""
    rng = np.random.default_rng(19)
    n_in = 256
    xq = rng.integers(-127, 128, n_in).astype(np.int8)
    xd = random_x(rng, n_in // QK)
    q = np.zeros((64, n_in), np.int8)
    for j in range(64):
        i = (37 * j + 11) % n_in                       # output j: one input, varying group / half / k
        q[j, i] = (-32, 31, 17, -5)[j % 4]
        q[j, (i + 128) % n_in] = (j % 63) - 31
    sc = rng.integers(-128, 128, (64, n_in // 16)).astype(np.int8)
    d = (rng.random((64, 1)) + 0.5).astype(np.float16)
    check_matvec(lib, q, sc, d, xq, xd, None, 0, 1)
    # every (group g, k) position of a block for all outputs at once: q = u - 32 with u spanning 0..63
    q = ((np.arange(64)[:, None] + np.arange(n_in)[None, :] * 7) % 64 - 32).astype(np.int8)
    check_matvec(lib, q, sc, d, xq, xd, random_x(rng, 64), 0, 1)


def test_matvec_split_ranges(lib):
    """Tiles split between callers (as threads do) give the bits of one call over all of them."""
    rng = np.random.default_rng(23)
    q, sc, d = random_q6k(rng, 5 * TILE - 7, 256)
    xq, xd = q0ref.quantize_act(random_x(rng, 256))
    b = random_x(rng, 5 * TILE)
    w = q0ref.tile_q6k(q, sc, d)
    whole = matvec(lib, w, xq, xd, b, 256, 5, 0, 5)
    for lo, hi in ((0, 2), (2, 3), (3, 5)):
        part = matvec(lib, w, xq, xd, b, 256, 5, lo, hi)
        assert np.array_equal(part[TILE * lo:TILE * hi].view(np.uint32), whole[TILE * lo:TILE * hi].view(np.uint32))


# --------------------------------------------------------------------------------------------------
# matmul (prefill): every (token, output) the bits of the matvec on that token's row

@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 6, 7, 8, 9, 33])
def test_matmul_sizes(lib, T):
    """Odd and even token counts (the pair tail), padded row strides, ranges not at 0, NULL bias."""
    rng = np.random.default_rng(100 + T)
    cases = ((256, 64, 0, 1), (512, 200, 1, 4), (256, 130, 0, 3), (768, 70, 1, 2))
    for k, (n_in, n_out, tb, te) in enumerate(cases):
        if T > 9 and k not in (0, 2) or T >= 5 and n_in == 768:
            continue
        q, sc, d = random_q6k(rng, n_out, n_in)
        b = random_x(rng, -(-n_out // TILE) * TILE) if k % 2 == 0 else None
        check_matmul(lib, q, sc, d, act_rows(rng, T, n_in), b, tb, te, pad_q=(0, 5, 32, 1)[k],
                     pad_d=(0, 1, 3, 0)[k], pad_y=(0, 3, 64, 1)[k], seed=k)


def test_matmul_extremes(lib):
    """The extremes of the matvec test, token by token: zero / +-amax / subnormal / non-finite rows, the
    largest block sums, special d."""
    rng = np.random.default_rng(57)
    n_out, n_in = 128, 256
    q, sc, d = random_q6k(rng, n_out, n_in)
    q[0] = -32; q[1] = 31; sc[0, ::2] = -128; sc[0, 1::2] = 127; sc[1] = 127; q[2] = -32; sc[2] = 127
    d[4] = np.float16(6e-8); d[5] = np.float16(65504); d[6] = np.float16(np.inf); d[7] = np.float16(np.nan)
    d[8] = 0
    X = rng.standard_normal((5, n_in)).astype(F32)
    X[0, :32] = 0
    X[1, 32:64] = np.where(np.arange(32) % 2, F32(-3.0), F32(3.0))
    X[2, 64:96] = (rng.standard_normal(32) * 1e-40).astype(F32)
    X[3, 100] = np.nan
    rows = [q0ref.quantize_act(x) for x in X]
    rows.append((np.full(n_in, -127, np.int8), np.ones(n_in // QK, F32)))
    rows.append((np.full(n_in, -128, np.int8), np.full(n_in // QK, F32(0.5))))
    y = check_matmul(lib, q, sc, d, rows, random_x(rng, n_out), 0, 2, pad_q=3, pad_d=2, pad_y=5)
    assert np.isnan(y[3]).all()


def test_matmul_empty(lib):
    rng = np.random.default_rng(61)
    q, sc, d = random_q6k(rng, 128, 256)
    w = q0ref.tile_q6k(q, sc, d)
    xq, xd = np.zeros((2, 256), np.int8), np.zeros((2, 8), F32)
    for T, tb, te in ((0, 0, 2), (2, 1, 1), (2, 2, 1), (0, 1, 1)):
        matmul(lib, w, xq, 256, xd, 8, None, 128, T, 256, tb, te)


def test_matmul_matches_matvec(lib):
    """The same row through both kernels: identical bits."""
    rng = np.random.default_rng(67)
    q, sc, d = random_q6k(rng, 150, 512)
    w = q0ref.tile_q6k(q, sc, d)
    b = random_x(rng, 192)
    rows = act_rows(rng, 3, 512)
    xq, xd = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    Y = matmul(lib, w, xq, 512, xd, 16, b, 192, 3, 512, 0, 3)
    for t in range(3):
        y = matvec(lib, w, rows[t][0], rows[t][1], b, 512, 3, 0, 3)
        assert np.array_equal(Y[t].view(np.uint32), y.view(np.uint32))


# --------------------------------------------------------------------------------------------------
# memory: PROT_NONE pages around every buffer (a forked child); every call through the checkasm trampoline

def test_page_guards(lib):
    rng = np.random.default_rng(31)
    jobs = []
    for n_in, n_out, tb, te in ((256, 64, 0, 1), (512, 200, 1, 4), (256, 192, 2, 3)):
        q, sc, d = random_q6k(rng, n_out, n_in)
        xq, xd = q0ref.quantize_act(random_x(rng, n_in))
        b = random_x(rng, -(-n_out // TILE) * TILE)
        qp, sp, dp, nt = pad(q, sc, d)
        jobs.append((q0ref.tile_q6k(q, sc, d), xq, xd, b, n_in, tb, te, ref(qp, sp, dp, xq, xd, b, tb, te),
                     ref(qp, sp, dp, xq, xd, None, tb, te)))

    def child() -> bool:
        ok = True
        for w, xq, xd, b, n_in, tb, te, exp, exp_nob in jobs:
            tbytes = q0ref.tile_bytes_q6k(n_in)
            nb = n_in // QK
            sub = w[tb * tbytes:te * tbytes]                    # tiles tb .. te-1 only
            bs = b[TILE * tb:TILE * te]
            for at_end in (True, False):
                wg = PageFenced(sub.nbytes, at_end).put(sub)
                qg = PageFenced(n_in, at_end).put(xq)
                dg = PageFenced(4 * nb, at_end).put(xd)
                bg = PageFenced(bs.nbytes, at_end).put(bs)
                yg = PageFenced(bs.nbytes, at_end)
                lib.gpt2asm_matvec_q6_k_neon(wg.addr - tb * tbytes, qg.addr, dg.addr, bg.addr - 4 * TILE * tb,
                                             yg.addr - 4 * TILE * tb, n_in, tb, te)
                ok &= bool(same_bits(yg.get(F32), exp).all())
                lib.gpt2asm_matvec_q6_k_neon(wg.addr - tb * tbytes, qg.addr, dg.addr, None,
                                             yg.addr - 4 * TILE * tb, n_in, tb, te)
                ok &= bool(same_bits(yg.get(F32), exp_nob).all())
                q3 = PageFenced(3 * n_in, at_end).put(np.tile(xq, 3))     # three tokens: a pair and a tail
                d3 = PageFenced(3 * 4 * nb, at_end).put(np.tile(xd, 3))
                y3 = PageFenced(3 * bs.nbytes, at_end)
                nto = TILE * (te - tb)
                lib.gpt2asm_matmul_q6_k_neon(wg.addr - tb * tbytes, q3.addr, n_in, d3.addr, nb,
                                             bg.addr - 4 * TILE * tb, y3.addr - 4 * TILE * tb, nto, 3, n_in, tb, te)
                ok &= bool(same_bits(y3.get(F32), np.tile(exp, 3)).all())
        return ok
    run_forked(child)


def test_calls_are_checked(lib):
    """The clobber check is on (tests/conftest.py): the kernels above ran through gpt2asm_checked_call,
    which fails a call that breaks x19-x29, d8-d15, sp or FPCR."""
    from gpt2asm import checkasm
    if not checkasm.enabled():
        pytest.skip("$GPT2ASM_CHECKASM is off")
    assert isinstance(lib, checkasm.CheckedLibrary)
    assert isinstance(getattr(lib, MV), checkasm.CheckedFunction)
    assert isinstance(getattr(lib, MM), checkasm.CheckedFunction)
