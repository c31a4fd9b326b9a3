"""checkasm-style tests of the AArch64 q8_0 / q4_0 integer kernels (docs/kernels.md "q8_0 / q4_0", "AArch64"):

    gpt2asm_quantize_q8_0_neon                                   (asm/aarch64/quant_neon.S)
    gpt2asm_matvec_{q8_0,q4_0}_{neon,dotprod}                    (asm/aarch64/matvec_q0_neon.S)
    gpt2asm_matmul_{q8_0,q4_0}_{neon,dotprod,i8mm}               (asm/aarch64/matmul_q0_neon.S)

Every variant the CPU has (the plain-NEON one always: it is called by name, whatever the probe says) is
checked bit for bit against the contract's numpy model tests/q0ref.py (NaN-ness compared, NaN payloads not):
odd block counts (n_in = 32, 64, 96, 800), tile ranges that do not start at 0, NULL bias, all-zero blocks,
+-amax blocks, weights of -128 and every int8 value, NaN / inf / subnormals in x, subnormal scales; every
buffer but w at rotating misalignments inside 4 KiB canaries (inputs unchanged, outputs outside the range
untouched); and in a forked child every buffer butting against PROT_NONE pages on either side.

The kernels do not depend on the SME configuration, so under make test-arm64 the file runs only in the first
CPU configuration (ARM64_TESTS_ONCE).  qemu's -cpu max has FEAT_DotProd and FEAT_I8MM.

Run:  python3 tools/arm64/run_tests.py --cpus "sme512 nosme" -j 1 tests/test_kernels_q0_arm.py
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
from arm64_qemu import IS_ARM, neon_once_marks  # noqa: E402
from forked import run_forked  # noqa: E402
from test_kernels_matvec import Guarded, PageFenced, Y_FILL, check_guarded  # noqa: E402

pytestmark = neon_once_marks()

F32, TILE, QK = np.float32, 64, 32
P, S = ctypes.c_void_p, ctypes.c_size_t
KINDS = ("q8_0", "q4_0")
MATVEC_ISAS = ("neon", "dotprod")
MATMUL_ISAS = ("neon", "dotprod", "i8mm")
NEEDS = {"neon": "asimd", "dotprod": "asimddp", "i8mm": "i8mm"}      # cpu_arm feature names
MISALIGN = (1, 4, 0, 3, 60, 2, 12, 5, 8, 63)


# --------------------------------------------------------------------------------------------------
# the library

_STATE: dict = {}


def _load() -> ctypes.CDLL:
    if "lib" not in _STATE:
        if os.environ.get("GPT2ASM_TEST_LIB"):
            lib = ctypes.CDLL(os.environ["GPT2ASM_TEST_LIB"])
        else:
            from gpt2asm.kernels import load_library
            lib = load_library()
        fn = lib.gpt2asm_quantize_q8_0_neon
        fn.argtypes, fn.restype = [P, P, P, S], None
        for kind in KINDS:
            for isa in MATVEC_ISAS:
                fn = getattr(lib, f"gpt2asm_matvec_{kind}_{isa}", None)
                if fn is not None:
                    fn.argtypes, fn.restype = [P, P, P, P, P, S, S, S], None
            for isa in MATMUL_ISAS:
                fn = getattr(lib, f"gpt2asm_matmul_{kind}_{isa}", None)
                if fn is not None:
                    fn.argtypes, fn.restype = [P, P, S, P, S, P, P, S, S, S, S, S], None
        _STATE["lib"] = lib
    return _STATE["lib"]


@pytest.fixture(scope="module")
def lib():
    return _load()


def _has(isa: str) -> bool:
    from gpt2asm import cpu as cpu_arm
    return bool(cpu_arm.arm_features(_load()).get(NEEDS[isa]))


def _isa_param(isa):
    return pytest.param(isa, marks=pytest.mark.skipif(IS_ARM and not _has(isa),
                                                      reason=f"this CPU lacks {NEEDS[isa]}"))


# --------------------------------------------------------------------------------------------------
# references and runners

def same_bits(got, exp) -> np.ndarray:
    return (got.view(np.uint32) == exp.view(np.uint32)) | (np.isnan(got) & np.isnan(exp))


_mis = itertools.cycle(MISALIGN)


def quantize(lib, x: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """gpt2asm_quantize_q8_0_neon on x in guarded, misaligned buffers: (xq, xd)."""
    n = x.size
    xg = Guarded(x.nbytes, next(_mis), seed).put(x)
    qg = Guarded(n, next(_mis), seed + 1).put(np.full(n, 0x55, np.uint8))
    dg = Guarded(4 * (n // QK), next(_mis), seed + 2).put(np.full(n // QK, 0x7FC0BEEF, np.uint32))
    lib.gpt2asm_quantize_q8_0_neon(xg.addr, qg.addr, dg.addr, n)
    check_guarded("quantize_q8_0_neon", ((xg, x, "x"), (qg, None, "xq"), (dg, None, "xd")))
    return qg.get(np.int8), dg.get(F32)


def check_quantize(lib, x, seed=0):
    xq, xd = quantize(lib, x, seed)
    eq, ed = q0ref.quantize_act(x)
    assert np.array_equal(xq, eq), f"xq differs at {np.flatnonzero(xq != eq)[:8]}"
    assert same_bits(xd, ed).all(), f"xd differs at {np.flatnonzero(~same_bits(xd, ed))[:8]}"
    assert xq.min(initial=0) >= -127
    return xq, xd


def matvec(lib, kind, isa, w, xq, xd, b, n_in, nt, tb, te, seed=0) -> np.ndarray:
    """One matvec call with guarded buffers (w 64-byte aligned, the rest misaligned): y [64 nt]."""
    wg = Guarded(w.nbytes, 0, seed).put(w)
    qg = Guarded(xq.nbytes, next(_mis), seed + 1).put(xq)
    dg = Guarded(xd.nbytes, next(_mis), seed + 2).put(xd)
    bg = Guarded(b.nbytes, next(_mis), seed + 3).put(b) if b is not None else None
    y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(F32)
    yg = Guarded(y0.nbytes, next(_mis), seed + 4).put(y0)
    name = f"gpt2asm_matvec_{kind}_{isa}"
    getattr(lib, name)(wg.addr, qg.addr, dg.addr, bg.addr if bg else None, yg.addr, n_in, tb, te)
    check_guarded(name, ((wg, w, "w"), (qg, xq, "xq"), (dg, xd, "xd"), (bg, b, "b"), (yg, None, "y")))
    y = yg.get(F32)
    outside = np.r_[0:TILE * tb, TILE * te:nt * TILE]
    assert (y[outside].view(np.uint32) == Y_FILL).all(), f"{name} wrote outside tiles [{tb}, {te})"
    return y


def ref_matvec(q, d, xq, xd, b, tb, te):
    """q0ref.matvec on the outputs of tiles tb .. te-1 (q, d padded to whole tiles)."""
    lo, hi = TILE * tb, TILE * te
    with np.errstate(all="ignore"):
        return q0ref.matvec(q[lo:hi], d[lo:hi], xq, xd, None if b is None else b[lo:hi])


def pad(q, d):
    """Pad the weight ints and scales to whole tiles (as tile() does: quants 0, scales +0.0)."""
    n_out, n_in = q.shape
    nt = -(-n_out // TILE)
    qp = np.zeros((nt * TILE, n_in), np.int8); qp[:n_out] = q
    dp = np.zeros((nt * TILE, n_in // QK), np.float16); dp[:n_out] = d
    return qp, dp, nt


def check_matvec(lib, kind, isa, q, d, xq, xd, b, tb, te, seed=0):
    w = q0ref.tile(q, d, kind)
    qp, dp, nt = pad(q, d)
    y = matvec(lib, kind, isa, w, xq, xd, b, q.shape[1], nt, tb, te, seed)
    got, exp = y[TILE * tb:TILE * te], ref_matvec(qp, dp, xq, xd, b, tb, te)
    bad = np.flatnonzero(~same_bits(got, exp))
    assert bad.size == 0, (f"{kind}_{isa}: outputs {bad[:8] + TILE * tb} differ: got {got[bad[:4]]}, "
                           f"expected {exp[bad[:4]]}")
    return y


def random_weights(rng, kind, n_out, n_in, scale=0.05):
    W = (rng.standard_normal((n_out, n_in)) * scale).astype(F32)
    return (q0ref.quantize_blocks_q8_0 if kind == "q8_0" else q0ref.quantize_blocks_q4_0)(W)


def random_x(rng, n_in, scale=1.0):
    return (rng.standard_normal(n_in) * scale).astype(F32)


# --------------------------------------------------------------------------------------------------
# the activation quantizer

def test_exports(lib):
    for name in ["gpt2asm_quantize_q8_0_neon"] + [f"gpt2asm_matvec_{k}_{i}" for k in KINDS for i in MATVEC_ISAS]:
        assert hasattr(lib, name), name


@pytest.mark.parametrize("n_in", [0, 32, 64, 96, 800])
def test_quantize_random(lib, n_in):
    rng = np.random.default_rng(n_in)
    for scale in (1.0, 1e-3, 3e4):
        check_quantize(lib, random_x(rng, n_in, scale), seed=n_in)


def test_quantize_special(lib):
    """NaN / +-inf (the block's q = 0, d NaN / inf), all-zero and -0 blocks, subnormals (d below FLT_MIN:
    q = 0), FLT_MAX (d finite, id normal), ties of x * id at .5 (round to even), +-amax at either end."""
    rng = np.random.default_rng(5)
    blocks = []
    b = random_x(rng, 32); b[3] = np.nan; blocks.append(b)
    b = random_x(rng, 32); b[31] = -np.inf; blocks.append(b)
    b = random_x(rng, 32); b[0] = np.inf; b[1] = np.nan; blocks.append(b)
    blocks.append(np.zeros(32, F32))
    blocks.append(np.full(32, -0.0, F32))
    blocks.append((rng.standard_normal(32) * 1e-39).astype(F32))                  # subnormals only
    blocks.append(np.full(32, np.finfo(F32).tiny, F32))                            # d subnormal
    b = np.full(32, np.float32(127 * np.finfo(F32).tiny), F32); b[::2] *= -1; blocks.append(b)  # d = FLT_MIN
    b = random_x(rng, 32) * F32(1e38); b[5] = np.finfo(F32).max; blocks.append(b.astype(F32))
    b = np.arange(-16, 16, dtype=F32) + F32(0.5); b[0] = F32(127); blocks.append(b)     # x * id = k + .5 ties
    b = np.arange(32, dtype=F32) * F32(0.5) - F32(8); b[31] = F32(-127); blocks.append(b)
    b = random_x(rng, 32); b[0] = F32(-4.0); b[1:] = np.clip(b[1:], -3.9, 3.9); blocks.append(b)  # -amax
    b = random_x(rng, 32); b[31] = F32(4.0); b[:31] = np.clip(b[:31], -3.9, 3.9); blocks.append(b)  # +amax
    b = np.full(32, F32(-2.5)); blocks.append(b)                                   # every q = -127
    b = rng.integers(-(1 << 31), 1 << 31, 32, dtype=np.int64).astype(np.uint32).view(F32); blocks.append(b)
    x = np.concatenate(blocks).astype(F32)
    xq, xd = check_quantize(lib, x)
    assert (xq[:96] == 0).all() and np.isnan(xd[0]) and np.isinf(xd[1]) and np.isnan(xd[2])
    assert (xq.reshape(-1, 32)[13] == -127).all()


def test_quantize_random_bits(lib):
    """Blocks of arbitrary bit patterns (NaNs, infinities, subnormals, any exponent)."""
    rng = np.random.default_rng(11)
    for k in range(4):
        bits = rng.integers(0, 1 << 32, 32 * 25, dtype=np.uint64).astype(np.uint32)
        bits[rng.random(bits.size) < 0.5] &= np.uint32(0x83FFFFFF)       # many small exponents too
        check_quantize(lib, bits.view(F32), seed=k)


# --------------------------------------------------------------------------------------------------
# matvec

# (n_out, tile_begin, tile_end): partial last tiles, ranges not starting at 0
RANGES = [(64, 0, 1), (100, 0, 2), (200, 1, 4), (320, 2, 3), (130, 0, 3)]


@pytest.mark.parametrize("isa", [_isa_param(i) for i in MATVEC_ISAS])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_in", [32, 64, 96, 800])
def test_matvec_sizes(lib, kind, isa, n_in):
    rng = np.random.default_rng(n_in + len(kind + isa))
    for k, (n_out, tb, te) in enumerate(RANGES):
        if n_in == 800 and k > 2:
            break
        q, d = random_weights(rng, kind, n_out, n_in)
        xq, xd = q0ref.quantize_act(random_x(rng, n_in))
        b = random_x(rng, -(-n_out // TILE) * TILE) if k % 2 == 0 else None
        check_matvec(lib, kind, isa, q, d, xq, xd, b, tb, te, seed=k)


@pytest.mark.parametrize("isa", [_isa_param(i) for i in MATVEC_ISAS])
@pytest.mark.parametrize("kind", KINDS)
def test_matvec_empty_range(lib, kind, isa):
    rng = np.random.default_rng(3)
    q, d = random_weights(rng, kind, 128, 64)
    xq, xd = q0ref.quantize_act(random_x(rng, 64))
    w = q0ref.tile(q, d, kind)
    for tb, te in ((0, 0), (1, 1), (2, 1)):
        matvec(lib, kind, isa, w, xq, xd, None, 64, 2, tb, te)


@pytest.mark.parametrize("isa", [_isa_param(i) for i in MATVEC_ISAS])
@pytest.mark.parametrize("kind", KINDS)
def test_matvec_extremes(lib, kind, isa):
    """Every weight int (-128 .. 127 / -8 .. 7) against xq = +-127 (the largest block sums), all-zero
    blocks of x and of w, +-amax blocks, NaN / inf / subnormal / zero activation scales, scales of every
    binary16 class (subnormal, max, inf, NaN, -0)."""
    rng = np.random.default_rng(17)
    n_out, n_in = 192, 256
    lo, hi = (-128, 127) if kind == "q8_0" else (-8, 7)
    q = rng.integers(lo, hi + 1, (n_out, n_in)).astype(np.int8)
    q[0] = lo; q[1] = hi; q[2, :] = np.resize(np.arange(lo, hi + 1), n_in)
    q[3, :32] = 0
    d = (rng.random((n_out, n_in // QK)) * 0.01).astype(np.float16)
    d[4] = np.float16(6e-8); d[5] = np.float16(65504); d[6, 1] = np.float16(np.inf); d[7, 2] = np.float16(np.nan)
    d[8] = np.float16(-0.0); d[9, 3] = np.float16(-np.inf)
    x = random_x(rng, n_in)
    x[32:64] = 0                                        # an all-zero block: d = 0, q = 0
    x[64:96] = np.where(np.arange(32) % 2, F32(-3.0), F32(3.0))       # +-amax: q = +-127
    x[96:128] = F32(-5.0)                               # every q = -127
    x[128:160] = (rng.standard_normal(32) * 1e-40).astype(F32)        # subnormal d
    x[200] = np.nan if kind == "q8_0" else np.inf       # a non-finite block: every output NaN
    xq, xd = q0ref.quantize_act(x)
    b = random_x(rng, n_out)
    y = check_matvec(lib, kind, isa, q, d, xq, xd, b, 0, 3)
    assert np.isnan(y).all()
    x[200] = 1.0
    xq, xd = q0ref.quantize_act(x)
    for bias in (b, None):
        check_matvec(lib, kind, isa, q, d, xq, xd, bias, 0, 3)
    # the largest block sums: every weight at the extreme, every xq = +-127
    xq = np.where(np.arange(n_in) % 3 == 0, -127, 127).astype(np.int8)
    xd = np.full(n_in // QK, F32(1.0))
    check_matvec(lib, kind, isa, q, d, xq, xd, None, 0, 3)
    xq = np.full(n_in, -127, np.int8)
    check_matvec(lib, kind, isa, np.full((64, n_in), lo, np.int8), np.ones((64, n_in // QK), np.float16),
                 xq, xd, None, 0, 1)


@pytest.mark.parametrize("isa", [_isa_param(i) for i in MATVEC_ISAS])
def test_matvec_split_ranges(lib, isa):
    """Tiles split between callers (as threads do) give the bits of one call over all of them."""
    rng = np.random.default_rng(23)
    for kind in KINDS:
        q, d = random_weights(rng, kind, 7 * TILE, 96)
        xq, xd = q0ref.quantize_act(random_x(rng, 96))
        b = random_x(rng, 7 * TILE)
        w = q0ref.tile(q, d, kind)
        whole = matvec(lib, kind, isa, w, xq, xd, b, 96, 7, 0, 7)
        for lo, hi in ((0, 3), (3, 4), (4, 7)):
            part = matvec(lib, kind, isa, w, xq, xd, b, 96, 7, lo, hi)
            assert np.array_equal(part[TILE * lo:TILE * hi].view(np.uint32),
                                  whole[TILE * lo:TILE * hi].view(np.uint32))


def test_matvec_variants_agree(lib):
    """neon and dotprod give the same bits on the same (random, full-range) inputs."""
    isas = [i for i in MATVEC_ISAS if _has(i)]
    rng = np.random.default_rng(29)
    for kind in KINDS:
        q, d = random_weights(rng, kind, 130, 160)
        xq, xd = q0ref.quantize_act(random_x(rng, 160))
        w = q0ref.tile(q, d, kind)
        ys = [matvec(lib, kind, isa, w, xq, xd, None, 160, 3, 0, 3) for isa in isas]
        for y in ys[1:]:
            assert np.array_equal(y.view(np.uint32), ys[0].view(np.uint32))


# --------------------------------------------------------------------------------------------------
# matmul (prefill): every (token, output) the bits of the matvec on that token's row

def matmul_isas():
    return [_isa_param(i) for i in MATMUL_ISAS]


def matmul(lib, kind, isa, w, xq, ldq, xd, ldd, b, ldy, T, n_in, nt, tb, te, seed=0) -> np.ndarray:
    """One matmul call: xq [T][ldq] int8, xd [T][ldd] float32 (rows padded with junk), y [T][ldy]; guarded
    misaligned buffers; y outside the T x [64 tb, 64 te) block untouched.  Returns y [T][ldy]."""
    name = f"gpt2asm_matmul_{kind}_{isa}"
    if not hasattr(lib, name):
        pytest.skip(f"{name} is not in this library")
    wg = Guarded(w.nbytes, 0, seed).put(w)
    qg = Guarded(xq.nbytes, next(_mis), seed + 1).put(xq)
    dg = Guarded(xd.nbytes, next(_mis), seed + 2).put(xd)
    bg = Guarded(b.nbytes, next(_mis), seed + 3).put(b) if b is not None else None
    y0 = np.full(max(T, 1) * ldy, Y_FILL, np.uint32).view(F32)
    yg = Guarded(y0.nbytes, next(_mis), seed + 4).put(y0)
    getattr(lib, name)(wg.addr, qg.addr, ldq, dg.addr, ldd, bg.addr if bg else None, yg.addr, ldy, T, n_in,
                       tb, te)
    check_guarded(name, ((wg, w, "w"), (qg, xq, "xq"), (dg, xd, "xd"), (bg, b, "b"), (yg, None, "y")))
    y = yg.get(F32).reshape(max(T, 1), ldy)
    mask = np.ones(y.shape, bool)
    mask[:T, TILE * tb:TILE * te] = False
    assert (y[mask].view(np.uint32) == Y_FILL).all(), f"{name} wrote outside its block"
    return y


def check_matmul(lib, kind, isa, q, d, X, b, tb, te, pad_q=0, pad_d=0, pad_y=0, seed=0):
    """X float32 [T][n_in]: quantized per row by the model; rows stored ldq = n_in + pad_q etc. apart."""
    T, n_in = X.shape
    nb = n_in // QK
    rng = np.random.default_rng(seed)
    xq = rng.integers(-128, 128, (max(T, 1), n_in + pad_q)).astype(np.int8)
    xd = rng.standard_normal((max(T, 1), nb + pad_d)).astype(F32)
    rows = [q0ref.quantize_act(X[t]) for t in range(T)]
    for t, (rq, rd) in enumerate(rows):
        xq[t, :n_in], xd[t, :nb] = rq, rd
    w = q0ref.tile(q, d, kind)
    qp, dp, nt = pad(q, d)
    ldy = nt * TILE + pad_y
    y = matmul(lib, kind, isa, w, xq, n_in + pad_q, xd, nb + pad_d, b, ldy, T, n_in, nt, tb, te, seed)
    for t, (rq, rd) in enumerate(rows):
        got, exp = y[t, TILE * tb:TILE * te], ref_matvec(qp, dp, rq, rd, b, tb, te)
        bad = np.flatnonzero(~same_bits(got, exp))
        assert bad.size == 0, f"{kind}_{isa}: token {t} of {T}, outputs {bad[:8] + TILE * tb} differ"
    return y


@pytest.mark.parametrize("isa", matmul_isas())
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 7])
def test_matmul_sizes(lib, kind, isa, T):
    """Odd and even token counts (the pair tail), padded row strides, ranges not at 0, NULL bias."""
    rng = np.random.default_rng(100 * T + len(kind + isa))
    for k, (n_in, n_out, tb, te) in enumerate(((32, 64, 0, 1), (96, 200, 1, 4), (64, 130, 0, 3), (800, 70, 1, 2))):
        if T >= 5 and n_in == 800:
            continue
        q, d = random_weights(rng, kind, n_out, n_in)
        X = (rng.standard_normal((T, n_in))).astype(F32)
        b = random_x(rng, -(-n_out // TILE) * TILE) if k % 2 == 0 else None
        check_matmul(lib, kind, isa, q, d, X, b, tb, te, pad_q=(0, 5, 32, 1)[k], pad_d=(0, 1, 3, 0)[k],
                     pad_y=(0, 3, 64, 1)[k], seed=k)


@pytest.mark.parametrize("isa", matmul_isas())
@pytest.mark.parametrize("kind", KINDS)
def test_matmul_extremes(lib, kind, isa):
    """Every weight int, all-zero / +-amax / subnormal / non-finite rows, special binary16 scales."""
    rng = np.random.default_rng(57)
    n_out, n_in = 128, 128
    lo, hi = (-128, 127) if kind == "q8_0" else (-8, 7)
    q = rng.integers(lo, hi + 1, (n_out, n_in)).astype(np.int8)
    q[0] = lo; q[1] = hi; q[2] = np.resize(np.arange(lo, hi + 1), n_in)
    d = (rng.random((n_out, n_in // QK)) * 0.01).astype(np.float16)
    d[4] = np.float16(6e-8); d[5] = np.float16(65504); d[6, 1] = np.float16(np.inf); d[7, 2] = np.float16(np.nan)
    X = rng.standard_normal((4, n_in)).astype(F32)
    X[0, :32] = 0
    X[1, 32:64] = np.where(np.arange(32) % 2, F32(-3.0), F32(3.0))
    X[2, 64:96] = (rng.standard_normal(32) * 1e-40).astype(F32)
    X[3, 100] = np.nan
    y = check_matmul(lib, kind, isa, q, d, X, random_x(rng, n_out), 0, 2)
    assert np.isnan(y[3]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_matmul_empty(lib, kind):
    rng = np.random.default_rng(61)
    q, d = random_weights(rng, kind, 128, 64)
    w = q0ref.tile(q, d, kind)
    xq, xd = np.zeros((2, 64), np.int8), np.zeros((2, 2), F32)
    for isa in [i for i in MATMUL_ISAS if _has(i)]:
        for T, tb, te in ((0, 0, 2), (2, 1, 1), (2, 2, 1)):
            matmul(lib, kind, isa, w, xq, 64, xd, 2, None, 128, T, 64, 2, tb, te)


# --------------------------------------------------------------------------------------------------
# memory: PROT_NONE pages around every buffer (a forked child)

def test_page_guards(lib):
    rng = np.random.default_rng(31)
    jobs = []
    for kind in KINDS:
        for n_in, n_out, tb, te in ((32, 64, 0, 1), (96, 200, 1, 4), (64, 192, 2, 3)):
            q, d = random_weights(rng, kind, n_out, n_in)
            x = random_x(rng, n_in)
            xq, xd = q0ref.quantize_act(x)
            b = random_x(rng, -(-n_out // TILE) * TILE)
            qp, dp, nt = pad(q, d)
            jobs.append((kind, q0ref.tile(q, d, kind), x, xq, xd, b, n_in, tb, te,
                         ref_matvec(qp, dp, xq, xd, b, tb, te)))
    isas = [i for i in MATVEC_ISAS if _has(i)]
    mm_isas = [i for i in MATMUL_ISAS if _has(i) and hasattr(lib, f"gpt2asm_matmul_q8_0_{i}")]

    def child() -> bool:
        ok = True
        for kind, w, x, xq, xd, b, n_in, tb, te, exp in jobs:
            rec = q0ref.RECORD[kind]
            nb = n_in // QK
            for at_end in (True, False):
                xg = PageFenced(x.nbytes, at_end).put(x)
                qg = PageFenced(n_in, at_end)
                dg = PageFenced(4 * nb, at_end)
                lib.gpt2asm_quantize_q8_0_neon(xg.addr, qg.addr, dg.addr, n_in)
                ok &= bool(np.array_equal(qg.get(np.int8), xq)) and bool(same_bits(dg.get(F32), xd).all())
                for isa in isas:
                    sub = w[tb * nb * rec:te * nb * rec]
                    wg = PageFenced(sub.nbytes, at_end).put(sub)        # tiles tb .. te-1 only
                    bs = b[TILE * tb:TILE * te]
                    bg = PageFenced(bs.nbytes, at_end).put(bs)
                    yg = PageFenced(bs.nbytes, at_end)
                    getattr(lib, f"gpt2asm_matvec_{kind}_{isa}")(
                        wg.addr - tb * nb * rec, qg.addr, dg.addr, bg.addr - 4 * TILE * tb,
                        yg.addr - 4 * TILE * tb, n_in, tb, te)
                    ok &= bool(same_bits(yg.get(F32), exp).all())
                for isa in mm_isas:                             # three tokens: a pair and a tail
                    sub = w[tb * nb * rec:te * nb * rec]
                    wg = PageFenced(sub.nbytes, at_end).put(sub)
                    q3 = PageFenced(3 * n_in, at_end).put(np.tile(xq, 3))
                    d3 = PageFenced(3 * 4 * nb, at_end).put(np.tile(xd, 3))
                    bs = b[TILE * tb:TILE * te]
                    bg = PageFenced(bs.nbytes, at_end).put(bs)
                    yg = PageFenced(3 * bs.nbytes, at_end)
                    nto = TILE * (te - tb)
                    getattr(lib, f"gpt2asm_matmul_{kind}_{isa}")(
                        wg.addr - tb * nb * rec, q3.addr, n_in, d3.addr, nb, bg.addr - 4 * TILE * tb,
                        yg.addr - 4 * TILE * tb, nto, 3, n_in, tb, te)
                    ok &= bool(same_bits(yg.get(F32), np.tile(exp, 3)).all())
        return ok
    run_forked(child)


# --------------------------------------------------------------------------------------------------
# the Python side: probing and the checked wrappers of gpt2asm.kernels.ArmQ0

def test_probe_q0_isa(monkeypatch):
    from gpt2asm import cpu as cpu_arm
    f = cpu_arm.arm_features()
    assert cpu_arm.q0_isa("quantize") == "neon"
    assert cpu_arm.q0_isa("matvec") == ("dotprod" if f["asimddp"] else "neon")
    monkeypatch.setenv("GPT2ASM_ARM_Q0", "neon")
    assert {cpu_arm.q0_isa(op) for op in cpu_arm.Q0_OPS} == {"neon"}
    feats = {"asimd": True, "asimddp": True, "i8mm": True}
    assert cpu_arm.q0_isa_from("matmul", feats) == "i8mm"
    assert cpu_arm.q0_isa_from("matmul", feats, "dotprod") == "dotprod"
    assert cpu_arm.q0_isa_from("matvec", feats) == "dotprod"
    assert cpu_arm.q0_isa_from("matvec", {"asimd": True, "i8mm": True}) == "neon"
    assert cpu_arm.decode_hwcaps(1 << 20, 1 << 13)["asimddp"] and cpu_arm.decode_hwcaps(0, 1 << 13)["i8mm"]


@pytest.mark.parametrize("cap", ["neon", None])
def test_wrappers(lib, cap):
    from gpt2asm.q0kernels import ArmQ0
    from gpt2asm.validate import aligned_bytes as _aligned_zeros
    k = ArmQ0(cap=cap)
    if cap == "neon":
        assert set(k.isa.values()) == {"neon"}
    rng = np.random.default_rng(41)
    x = random_x(rng, 96)
    xq, xd = k.quantize_q8_0(x)
    eq, ed = q0ref.quantize_act(x)
    assert np.array_equal(xq, eq) and same_bits(xd, ed).all()
    for kind in KINDS:
        q, d = random_weights(rng, kind, 130, 96)
        flat = q0ref.tile(q, d, kind)
        w = _aligned_zeros(flat.size)
        w[:] = flat
        b = random_x(rng, 192)
        qp, dp, _ = pad(q, d)
        y = getattr(k, f"matvec_{kind}")(w, 96, xq, xd, b, 1, 3)
        assert same_bits(y[64:], ref_matvec(qp, dp, xq, xd, b, 1, 3)).all()
        Y = getattr(k, f"matmul_{kind}")(w, 96, np.stack([xq, xq, xq]), np.stack([xd, xd, xd]), b, 1, 3)
        assert all(np.array_equal(Y[t, 64:].view(np.uint32), y[64:].view(np.uint32)) for t in range(3))


def test_wrappers_refuse(lib):
    from gpt2asm.errors import InvalidArgumentError
    from gpt2asm.q0kernels import ArmQ0
    from gpt2asm.validate import aligned_bytes as _aligned_zeros
    k = ArmQ0()
    w = _aligned_zeros(2 * 2176)
    xq, xd = np.zeros(64, np.int8), np.zeros(2, F32)
    bad = [lambda: k.quantize_q8_0(np.zeros(33, F32)), lambda: k.quantize_q8_0(np.zeros(32, np.float64)),
           lambda: k.matvec_q8_0(w, 48, xq, xd), lambda: k.matvec_q8_0(w[1:2177], 32, xq[:32], xd[:1]),
           lambda: k.matvec_q8_0(w, 64, xq[:32], xd), lambda: k.matvec_q8_0(w, 64, xq, xd, None, 0, 2),
           lambda: k.matvec_q4_0(w, 64, xq, xd), lambda: k.matvec_q8_0(w, 64, xq, xd, np.zeros(63, F32)),
           lambda: k.matvec("q5_0", w, 64, xq, xd), lambda: k.matmul_q8_0(w, 64, xq, xd),
           lambda: k.matmul_q8_0(w, 64, xq.reshape(1, 64), xd), lambda: k.matmul_q8_0(w, 64, xq[None], xd[None], None, 1, 0)]
    for call in bad:
        with pytest.raises(InvalidArgumentError):
            call()
    assert k.matvec_q8_0(w, 64, xq, xd).shape == (64,)
