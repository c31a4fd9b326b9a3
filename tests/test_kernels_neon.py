"""checkasm-style tests of the AArch64 NEON kernels (asm/aarch64/*_neon.S), run under qemu-aarch64 on x86
(make test-arm64, tools/arm64/run_tests.py) or natively on Arm.

    gpt2asm_matvec_f32_neon, gpt2asm_matvec_f16_neon, gpt2asm_layernorm_f32_neon,
    gpt2asm_gelu_f32_neon, gpt2asm_expf_f32_neon, gpt2asm_softmax_f32_neon, gpt2asm_attention_f32_neon,
    gpt2asm_attention_f16_neon, gpt2asm_argmax_f32_neon, gpt2asm_matmul_{f32,f16}_neon (docs/kernels.md)

The contract is the x86 one: every output is the same sequence of IEEE binary32 operations.  Each call is
checked against

  * the exact numpy models of tests/test_kernels_matvec.py and
    tests/test_kernels_ops.py (imported, not copied: most checks here ARE those files' test functions, run
    on a NEON runner), bit for bit, NaN-ness included; their float64 references within the documented
    bounds; special values;
  * the x86 kernels themselves: FINGERPRINTS are SHA-256 digests of the outputs of gpt2asm_*_avx2 on
    deterministic inputs made from integer bits only (splitmix64, no libm, no numpy random streams),
    recorded natively on x86-64 (`python tests/test_kernels_neon.py --fingerprints` prints them).  On Arm
    test_fingerprints_match_x86 checks NEON against them, on x86 test_fingerprints_x86 checks AVX2 and
    AVX-512.  NaN payloads are canonicalised first: they are not part of the contract;
  * the memory contract: canary-guarded buffers at rotating misalignments (odd byte offsets included),
    inputs unchanged, and a forked child running every kernel with every buffer butting against a
    PROT_NONE page on either side (any over-read or over-write faults).

qemu is slow (numpy runs emulated too), so the shapes are small: the file takes a few minutes emulated.
NEON does not depend on the SME configuration, so under make test-arm64 the Arm tests run only in the first
CPU configuration (arm64_qemu.first_config()); the Makefile lists the file in ARM64_TESTS_ONCE.

Run:  python tools/arm64/run_tests.py --cpus sme512 --once tests/test_kernels_neon.py
      (natively on Arm: pytest tests/test_kernels_neon.py)
"""
from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import platform
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))

from arm64_qemu import IS_ARM, neon_once_marks  # noqa: E402
from gpt2asm.checkasm import open_library  # noqa: E402
from forked import run_forked  # noqa: E402
import test_kernels_matvec as mv  # noqa: E402   (matvec models, harness and test functions)
import test_kernels_ops as ops  # noqa: E402     (elementwise / attention models, harness, test functions)

IS_X86 = platform.machine().lower() in ("x86_64", "amd64")
LIB_NAME = "libgpt2asm.dylib" if sys.platform == "darwin" else "libgpt2asm.so"
# GPT2ASM_TEST_LIB=path tests a library built elsewhere
LIB_PATH = Path(os.environ.get("GPT2ASM_TEST_LIB") or ROOT / "gpt2asm" / LIB_NAME)

F32 = np.float32
HEAD = 64
TILE = 64
P, S = ctypes.c_void_p, ctypes.c_size_t
NEON_SYMBOLS = ["gpt2asm_matvec_f32_neon", "gpt2asm_matvec_f16_neon", "gpt2asm_layernorm_f32_neon", "gpt2asm_gelu_f32_neon", "gpt2asm_expf_f32_neon",
                "gpt2asm_softmax_f32_neon", "gpt2asm_attention_f32_neon", "gpt2asm_attention_f16_neon",
                "gpt2asm_argmax_f32_neon"]


def arm_test(fn):
    """AArch64 only, and only in the first emulated CPU configuration (NEON is SVL-independent)."""
    for mark in neon_once_marks():
        fn = mark(fn)
    return fn


def bind(lib: ctypes.CDLL, family: str) -> ctypes.CDLL:
    """Set the prototypes (docs/kernels.md) of one family's kernels on lib."""
    for dtype in ("f32", "f16"):
        fn = getattr(lib, f"gpt2asm_matvec_{dtype}_{family}")
        fn.argtypes, fn.restype = [P, P, P, P, S, S, S], None
    for op in ops.SIGS:
        if op in ops.F32_OPS or (op, family) in ops.SYMBOLS:
            fn = getattr(lib, ops.symbol(op, family))
            fn.argtypes, fn.restype = [S if k == "n" else P for k in ops.SIGS[op]], None
    return lib


_LIB: list = []


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    if not _LIB:
        _LIB.append(bind(open_library(LIB_PATH), "neon"))      # checked when $GPT2ASM_CHECKASM
    return _LIB[0]


# --------------------------------------------------------------------------------------------------
# runners: the other files' harnesses, pointed at the NEON symbols

class OpsRunner(ops.Native):
    """test_kernels_ops.Native for the family `neon`: every array in its own canary-guarded buffer at a
    rotating misalignment (odd byte offsets too); canaries and unchanged inputs checked after each call."""

    def __init__(self, lib: ctypes.CDLL):                   # (Native.__init__ would build the x86 library)
        self.isa, self.lib = "neon", lib
        self.name = "neon"
        self._mis = itertools.cycle(ops.MISALIGN)
        self._seed = itertools.count(1)


class MatvecRunner:
    """gpt2asm_matvec_<dtype>_neon in the harness of test_kernels_matvec.NativeRunner: w 64-byte aligned;
    x, b, y at rotating misalignments (odd ones too); 4 KiB canaries on each side; inputs unchanged."""

    MISALIGN = (4, 1, 0, 2, 60, 3, 12, 5, 8)

    def __init__(self, lib: ctypes.CDLL, dtype: str):
        self.fn = getattr(lib, f"gpt2asm_matvec_{dtype}_neon")
        self.name = f"gpt2asm_matvec_{dtype}_neon"
        self._mis = itertools.cycle(self.MISALIGN)

    def __call__(self, wt, x, b, y0, tb, te, *, seed=0):
        nt, n_in, _ = wt.shape
        w = mv.Guarded(wt.nbytes, 0, seed).put(wt)
        xg = mv.Guarded(x.nbytes, next(self._mis), seed + 1).put(x)
        bg = mv.Guarded(b.nbytes, next(self._mis), seed + 2).put(b) if b is not None else None
        yg = mv.Guarded(y0.nbytes, next(self._mis), seed + 3).put(y0)
        self.fn(w.addr, xg.addr, bg.addr if bg else None, yg.addr, n_in, tb, te)
        mv.check_guarded(self.name, ((w, wt, "w"), (xg, x, "x"), (bg, b, "b"), (yg, None, "y")))
        return yg.get(np.float32)


@pytest.fixture
def variant(lib, monkeypatch):
    """The NEON runner for test_kernels_ops' test functions.  Their run() would also compare with native
    AVX2 (ops.baseline()); there is none here: the x86 comparison is test_fingerprints_match_x86."""
    monkeypatch.setattr(ops, "baseline", lambda: None)
    return OpsRunner(lib)


@pytest.fixture(params=["f32", "f16"])
def mvariant(request, lib):
    """(dtype, [runner]), as test_kernels_matvec's `variant` fixture."""
    return request.param, [MatvecRunner(lib, request.param)]


@arm_test
def test_exports(lib):
    for name in NEON_SYMBOLS:
        assert hasattr(lib, name), name


# --------------------------------------------------------------------------------------------------
# matvec

@arm_test
@pytest.mark.parametrize("n_in", [1, 2, 3, 4, 5, 7, 17, 65, 200])
def test_matvec_sizes(mvariant, n_in):
    """Odd sizes (n_in mod 4 = 0..3: the by-element block of 4 inputs and its ld1r tail), 1..5 tiles,
    ranges not starting at 0, with and without bias: bit-exact vs the contract model and the f64 bound."""
    mv.test_sizes(mvariant, n_in)


@arm_test
def test_matvec_empty_range(mvariant):
    mv.test_empty_range(mvariant)


@arm_test
def test_matvec_exact_integers(mvariant):
    mv.test_exact_integers(mvariant)


@arm_test
def test_matvec_signed_zeros(mvariant):
    mv.test_signed_zeros(mvariant)


@arm_test
def test_matvec_nan_inf(mvariant):
    mv.test_nan_inf_propagation(mvariant)


@arm_test
def test_matvec_large_magnitudes(mvariant):
    mv.test_large_magnitudes(mvariant)


@arm_test
def test_matvec_denormals(mvariant):
    mv.test_denormals(mvariant)


@arm_test
def test_matvec_f16_every_half(lib):
    """Every binary16 bit pattern (subnormals, +-0, +-inf, NaNs) widened by fcvtl/fcvtl2 and multiplied
    by 1: y = fma(w, 1, +0) is the exact widening (-0 gives +0), NaN stays NaN."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    wt = halves.reshape(-1, 1, TILE)                          # 1024 tiles of one row
    run = MatvecRunner(lib, "f16")
    y0 = np.full(wt.shape[0] * TILE, mv.Y_FILL, np.uint32).view(F32)
    y = run(wt, np.ones(1, F32), None, y0, 0, wt.shape[0])
    with np.errstate(invalid="ignore"):
        exp = halves.astype(F32) + F32(0)                     # exact; -0 + +0 = +0
    assert mv.same_bits(y, exp).all(), np.flatnonzero(~mv.same_bits(y, exp))[:8]
    assert np.isnan(y).sum() == 2 * (1 << 10) - 2


@arm_test
def test_matvec_f16_equals_f32_on_widened_weights(lib):
    """-h gives the same outputs as fp32 weights holding the widened halves, bit for bit."""
    rng = np.random.default_rng(21)
    for n_in, nt, tb, te in ((1, 2, 0, 2), (6, 3, 1, 3), (67, 2, 0, 2)):
        wt, x, b = mv.random_case(rng, "f16", n_in, nt)
        wt.reshape(-1)[rng.integers(0, wt.size, 3)] = np.float16(65504)
        wt.reshape(-1)[rng.integers(0, wt.size, 3)] = np.float16(6e-8)       # subnormal halves
        y0 = np.full(nt * TILE, mv.Y_FILL, np.uint32).view(F32)
        y16 = MatvecRunner(lib, "f16")(wt, x, b, y0, tb, te)
        y32 = MatvecRunner(lib, "f32")(wt.astype(F32), x, b, y0, tb, te)
        assert np.array_equal(y16.view(np.uint32), y32.view(np.uint32))


@arm_test
def test_matvec_page_guards(lib):
    """w (only the tiles of the range), x, b and y butting against PROT_NONE pages on either side."""
    rng = np.random.default_rng(9)
    jobs = []
    for dtype in ("f32", "f16"):
        for n_in, nt, tb, te in ((1, 3, 1, 3), (2, 2, 0, 2), (3, 2, 1, 2), (7, 4, 2, 3), (65, 2, 0, 2)):
            wt, x, b = mv.random_case(rng, dtype, n_in, nt)
            jobs.append((dtype, wt, x, b, tb, te, mv.contract_ref(wt, x, b, tb, te)))

    def child() -> bool:
        ok = True
        for dtype, wt, x, b, tb, te, exp in jobs:
            fn = getattr(lib, f"gpt2asm_matvec_{dtype}_neon")
            tile_bytes = wt[0].nbytes
            for at_end in (True, False):
                for bias in (b, None):
                    sub = np.ascontiguousarray(wt[tb:te])
                    wg = mv.PageFenced(sub.nbytes, at_end).put(sub)
                    xg = mv.PageFenced(x.nbytes, at_end).put(x)
                    bs = b[TILE * tb:TILE * te]
                    bg = mv.PageFenced(bs.nbytes, at_end).put(bs)
                    yg = mv.PageFenced(bs.nbytes, at_end)
                    # pointers biased back to tile 0 / output 0: only [tb, te) may be touched
                    fn(wg.addr - tb * tile_bytes, xg.addr, (bg.addr - 4 * TILE * tb) if bias is not None else None,
                       yg.addr - 4 * TILE * tb, wt.shape[1], tb, te)
                    want = exp if bias is not None else mv.contract_ref(wt, x, None, tb, te)
                    ok &= bool(mv.same_bits(yg.get(np.float32), want).all())
        return ok
    run_forked(child)


# --------------------------------------------------------------------------------------------------
# matmul (batched prefill): gpt2asm_matmul_{f32,f16}_neon in test_kernels_matmul's harness (its contract
# model, cases and test functions), and bit for bit against the NEON matvec row by row

import test_kernels_matmul as mm  # noqa: E402   (matmul contract model, cases and test functions)

MM_DTYPES = ("f32", "f16")


def bind_matmul(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the prototypes of gpt2asm_matmul_<dtype>_{neon,sme2} (docs/kernels.md, gpt2asm_matmul) on lib."""
    for d in MM_DTYPES:
        for isa in ("neon", "sme2"):
            fn = getattr(lib, f"gpt2asm_matmul_{d}_{isa}", None)
            if fn is not None:
                fn.argtypes = [P, P, S, P, P, S, S, S, S, S]
                fn.restype = None
    return lib


class MatmulRunner:
    """gpt2asm_matmul_<dtype>_<isa> (NEON's by default; test_kernels_sme2 runs SME2's) in the harness of
    test_kernels_matmul.NativeRunner: w 64-byte aligned;
    X, b, Y at rotating misalignments (odd byte offsets too); 4 KiB canaries on each side; inputs
    unchanged.  mm.run_and_check checks Y's row gaps (ldy > outputs) and the other tiles untouched; X's row
    gaps hold NaN (mm.Case), so reading one would show in the results."""

    MISALIGN = (4, 1, 0, 2, 60, 3, 12, 5, 8, 63)

    def __init__(self, lib: ctypes.CDLL, dtype: str, isa: str = "neon"):
        self.fn = getattr(bind_matmul(lib), f"gpt2asm_matmul_{dtype}_{isa}")
        self.dtype = dtype
        self.name = f"gpt2asm_matmul_{dtype}_{isa}"
        self._mis = itertools.cycle(self.MISALIGN)

    def __call__(self, c, tb, te, *, seed=0, T=None):
        T = c.T if T is None else T
        wg = mv.Guarded(c.wt.nbytes, 0, seed).put(c.wt)
        xg = mv.Guarded(c.X.nbytes, next(self._mis), seed + 2).put(c.X)
        bg = mv.Guarded(c.b.nbytes, next(self._mis), seed + 3).put(c.b) if c.b is not None else None
        Y0 = c.Y0()
        yg = mv.Guarded(Y0.nbytes, next(self._mis), seed + 4).put(Y0)
        self.fn(wg.addr, xg.addr, c.ldx, bg.addr if bg else None, yg.addr, c.ldy, T, c.n_in, tb, te)
        mv.check_guarded(self.name, ((wg, c.wt, "w"), (xg, c.X, "x"), (bg, c.b, "b"),
                                     (yg, None, "y")))
        return yg.get(np.float32).reshape(c.T, c.ldy)


@pytest.fixture(params=MM_DTYPES)
def mmvariant(request, lib):
    """(dtype, [runner]), as test_kernels_matmul's `variant` fixture."""
    return request.param, [MatmulRunner(lib, request.param)]


@arm_test
def test_matmul_exports(lib):
    for d in MM_DTYPES:
        assert hasattr(lib, f"gpt2asm_matmul_{d}_neon"), d


@arm_test
@pytest.mark.parametrize("T", list(range(1, 14)))
def test_matmul_token_counts(mmvariant, T):
    """T = 1..13: blocks of 8 tokens (8 outputs a strip), tails of 5-7 tokens, tails of 1-4 (16 outputs a
    strip); n_in mod 4 = 0..3 (odd n_in: the ld1r rows), tile ranges not starting at 0, row gaps in X and
    Y, bias or NULL: bit-exact vs the contract model, within the float64 bound, nothing else written."""
    matmul_token_counts(mmvariant, T, ((1, 1, 0, 1), (3, 2, 0, 2), (6, 3, 1, 3), (17, 3, 1, 3), (64, 2, 1, 2),
                                       (65, 4, 1, 3)), seed=700)


def matmul_token_counts(mmvariant, T: int, shapes, seed: int) -> None:
    """T tokens on each (n_in, n_tiles, tile_begin, tile_end) of shapes, with row gaps in X and Y of
    varying width and a bias on every other one: mm.run_and_check (the contract's bits, the float64 bound,
    nothing else written)."""
    dtype, runners = mmvariant
    rng = np.random.default_rng(seed + T)
    for k, (n_in, nt, tb, te) in enumerate(shapes):
        c = mm.Case(rng, dtype, n_in, nt, T, ldx_pad=(0, 1, 5, 16)[k % 4], ldy_pad=(3, 0, 64, 1)[k % 4],
                    bias=k % 2 == 0)
        mm.run_and_check(runners, c, tb, te, seed=k + T)


@arm_test
@pytest.mark.parametrize("n_in", [2, 7, 129, 768])
def test_matmul_sizes(mmvariant, n_in):
    """Larger n_in with T = 29 (3 blocks of 8 + 5) and T = 8."""
    mm.test_sizes(mmvariant, n_in)


@arm_test
def test_matmul_empty(mmvariant):
    """n_tokens = 0 or an empty tile range: nothing is written."""
    mm.test_empty(mmvariant)


@arm_test
def test_matmul_special_values(mmvariant):
    """NaN / inf in one token's X reach only that token's outputs, NaN / inf weights only
    their output in every token; overflowing partial sums in the contract's order."""
    mm.test_special_values(mmvariant)


@arm_test
def test_matmul_denormals_and_zeros(mmvariant):
    mm.test_denormals_and_zeros(mmvariant)


@arm_test
@pytest.mark.parametrize("dtype", MM_DTYPES)
def test_matmul_equals_neon_matvec_rows(lib, dtype):
    """Every row of Y has exactly the bits of gpt2asm_matvec_<dtype>_neon on that row of X, NaN payloads
    included: quiet and signalling NaNs with payloads and infinities in X, NaN weights, NaN biases, and NULL bias; every token block shape (T = 1, 4, 5, 9, 13, 20)."""
    run = MatmulRunner(lib, dtype)
    mvfn = getattr(lib, f"gpt2asm_matvec_{dtype}_neon")
    rng = np.random.default_rng(800 + MM_DTYPES.index(dtype))
    for k, (n_in, nt, T, tb, te) in enumerate(((33, 4, 9, 1, 4), (1, 2, 5, 0, 2), (130, 2, 13, 0, 2),
                                               (7, 3, 20, 2, 3), (4, 1, 4, 0, 1), (6, 2, 1, 0, 2))):
        c = mm.Case(rng, dtype, n_in, nt, T, ldx_pad=3, ldy_pad=5, bias=k % 3 != 2)
        Xi = c.X[:, :n_in].copy()
        Xi[rng.integers(0, T), rng.integers(0, n_in)] = -np.inf
        Xi.reshape(-1).view(np.uint32)[rng.integers(0, Xi.size, 2)] = np.uint32(0x7FC01234)
        Xi.reshape(-1).view(np.uint32)[rng.integers(0, Xi.size, 1)] = np.uint32(0xFFA00077)     # signalling
        c.X[:, :n_in] = Xi
        if dtype == "f32":
            c.wt.reshape(-1).view(np.uint32)[rng.integers(0, c.wt.size, 4)] = np.uint32(0x7FC0ABCD)
        else:
            c.wt.reshape(-1).view(np.uint16)[rng.integers(0, c.wt.size, 4)] = np.uint16(0x7E55)
        if c.b is not None:
            c.b.view(np.uint32)[rng.integers(0, c.b.size, 3)] = np.uint32(0xFFC00123)
        Y = run(c, tb, te, seed=k)
        lo, hi = TILE * tb, TILE * te
        pb = None if c.b is None else c.b.ctypes.data
        for t in range(T):
            x = np.ascontiguousarray(c.X[t, :n_in])
            y = np.full(nt * TILE, mv.Y_FILL, np.uint32).view(F32)
            mvfn(c.wt.ctypes.data, x.ctypes.data, pb, y.ctypes.data, n_in, tb, te)
            diff = np.flatnonzero(Y[t, lo:hi].view(np.uint32) != y[lo:hi].view(np.uint32))
            assert diff.size == 0, (f"{run.name} (n_in {n_in}, T {T}) token {t} differs from "
                                    f"gpt2asm_matvec_{dtype}_neon at outputs {diff[:8] + lo}")


# (n_in, n_tiles, T, tile_begin, tile_end, ldx padding) of the page-guard cases
MM_GUARD_SHAPES = ((1, 3, 1, 1, 3, 0), (7, 4, 7, 2, 3, 3), (65, 2, 13, 0, 2, 0), (130, 3, 6, 1, 2, 5),
                   (3, 1, 5, 0, 1, 0), (6, 2, 12, 0, 2, 1))


def matmul_page_guards(lib, isa: str, dtypes, shapes=MM_GUARD_SHAPES, seed: int = 61) -> None:
    """In a forked child, gpt2asm_matmul_<dtype>_<isa> with w (only the range's tiles), b, X (its
    last row's n_in-th input the last byte before a PROT_NONE page, or its first byte the first after
    one) and Y (rows of exactly the range: ldy = its outputs) likewise.  Any over-read or over-write
    faults; the results must be the contract's."""
    bind_matmul(lib)
    rng = np.random.default_rng(seed)
    jobs = []
    for dtype in dtypes:
        for n_in, nt, T, tb, te, pad in shapes:
            c = mm.Case(rng, dtype, n_in, nt, T, ldx_pad=pad)
            jobs.append((dtype, c, tb, te, mm.contract_ref(c, tb, te)))

    def child() -> bool:
        ok = True
        for dtype, c, tb, te, exp in jobs:
            fn = getattr(lib, f"gpt2asm_matmul_{dtype}_{isa}")
            tile_bytes = c.wt[0].nbytes
            nout = TILE * (te - tb)
            for at_end in (True, False):
                sub = np.ascontiguousarray(c.wt[tb:te])
                wg = mv.PageFenced(sub.nbytes, at_end).put(sub)
                xs = c.X.reshape(-1)[:(c.T - 1) * c.ldx + c.n_in]
                xg = mv.PageFenced(xs.nbytes, at_end).put(xs)
                bs = c.b[TILE * tb:TILE * te]
                bg = mv.PageFenced(bs.nbytes, at_end).put(bs)
                yg = mv.PageFenced(4 * c.T * nout, at_end)
                off = 4 * TILE * tb
                fn(wg.addr - tb * tile_bytes, xg.addr, c.ldx, bg.addr - off, yg.addr - off, nout, c.T, c.n_in,
                   tb, te)
                ok &= bool(mv.same_bits(yg.get(np.float32).reshape(c.T, nout), exp).all())
        return ok
    run_forked(child)


@arm_test
def test_matmul_page_guards(lib):
    """matmul_page_guards for the two NEON kernels."""
    matmul_page_guards(lib, "neon", MM_DTYPES)


def test_matmul_symbols_of_each_arm_family():
    """Each Arm family has its own matmul kernels (sme2: matmul_sme2.S, tested in test_kernels_sme2.py),
    in build.py's lists (exported and checked as EXTRA_OPS) and in gpt2asm.kernels; every Arm family has
    the batched kernels (has_matmul)."""
    sys.path.insert(0, str(ROOT))
    import build
    for d in MM_DTYPES:
        for fam in ("neon", "sme2"):
            assert build.kernel_symbol(f"matmul_{d}", fam) == f"gpt2asm_matmul_{d}_{fam}"
            assert f"matmul_{d}" in build.EXTRA_OPS["aarch64"][fam]
    if not IS_ARM:
        return
    from gpt2asm.cpu import available_families
    from gpt2asm.kernels import Kernels
    for fam in available_families():
        k = Kernels(fam)
        try:
            assert k.has_matmul and k.has_plan          # plan_aarch64.S
            assert k._symbol("matmul_f32") == f"gpt2asm_matmul_f32_{fam}"
            assert k._symbol("matmul_f16") == f"gpt2asm_matmul_f16_{fam}"
        finally:
            k.close()


# --------------------------------------------------------------------------------------------------
# expf, GELU

LENGTHS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1023)


@arm_test
@pytest.mark.parametrize("n", LENGTHS)
def test_expf_model(variant, n):
    ops.test_expf_model(variant, n)


@arm_test
def test_expf_inplace_and_nan_payloads(variant):
    """In place, and a NaN comes out as the same NaN quieted (docs/kernels.md: fmax/fmin return it and
    every later AArch64 operation propagates it: the only NaN operand of each)."""
    ops.test_expf_inplace_and_nan_payloads(variant)


@arm_test
def test_expf_special_values(variant):
    ops.test_expf_special_values(variant)


@arm_test
def test_expf_accuracy(variant):
    """<= 2 ulp vs float64 exp (subnormal results within 2^-148) on a dense sweep of [-104, 89] and every
    binary32 of slices at the overflow end, the underflow end and near 0.5; bit-exact vs the model on a
    subset (a smaller version of test_kernels_ops.test_expf_accuracy: numpy is emulated too)."""
    sweeps = {"dense": np.linspace(-104, 89, 300_001).astype(F32),
              "top": ops.float_range(88.5, 89.0), "bottom": ops.float_range(-104.0, -103.0),
              "mid": ops.float_range(0.5, 0.5078125), "neg": ops.float_range(-0.25, -0.24609375)}
    worst = 0.0
    for where, x in sweeps.items():
        y = np.empty_like(x)
        variant("expf", x, y, x.size)
        worst = max(worst, ops.check_expf_accuracy(x, y, f"expf {where}"))
        ops.assert_model(y[::7], ops.expf_c(x[::7]), f"expf {where}")
    assert worst <= 2.0


@arm_test
@pytest.mark.parametrize("n", LENGTHS)
def test_gelu_model(variant, n):
    ops.test_gelu_model(variant, n)


@arm_test
def test_gelu_accuracy(variant):
    ops.test_gelu_accuracy(variant, True)                    # emulated=True: the smaller sweep


@arm_test
def test_gelu_special_values(variant):
    ops.test_gelu_special_values(variant)


@arm_test
def test_gelu_inplace(variant):
    rng = np.random.default_rng(8)
    x = ops.mixed(rng, 333)
    exp = ops.gelu_c(x)
    variant("gelu", x, x, x.size)
    ops.assert_model(x, exp, "gelu in place")


# --------------------------------------------------------------------------------------------------
# softmax

@arm_test
@pytest.mark.parametrize("n", (1, 2, 3, 7, 15, 16, 17, 33, 100, 1023))
def test_softmax_model(variant, n):
    ops.test_softmax_model(variant, n)


@arm_test
def test_softmax_inplace(variant):
    ops.test_softmax_inplace(variant)


@arm_test
@pytest.mark.parametrize("n", (1, 2, 17, 100, 1024, 50257))
def test_softmax_special_values(variant, n):
    ops.test_softmax_special_values(variant, n)


@arm_test
def test_softmax_max_semantics(variant):
    """hmax16's (x > m) ? x : m on AArch64 (fcmgt + bit, not fmax): NaN skipped by the max, then NaN - m
    poisons every output; +0/-0 ties and -inf lanes; a max that sits in each of the 16 lanes and in the
    tail."""
    for n in (5, 16, 21, 47):
        for k in range(n):
            x = np.linspace(-3, 2, n).astype(F32)[::-1].copy()
            x[0], x[k] = x[k], F32(7.5)
            y = np.empty(n, F32)
            variant("softmax", x, y, n)
            ops.assert_model(y, ops.softmax_c(x), f"max at {k} of {n}")
    x = np.array([-0.0, 0.0, -0.0, -np.inf, 0.0] * 4 + [-0.0], F32)
    y = np.empty_like(x)
    variant("softmax", x, y, x.size)
    ops.assert_model(y, ops.softmax_c(x), "signed zeros")
    z = x == 0                                              # 17 zeros, 4 -inf: exactly 1/17 and +0.0
    assert ops.same_bits(y[z], np.full(z.sum(), F32(1) / F32(z.sum()), F32))
    assert ops.same_bits(y[~z], np.zeros((~z).sum(), F32))


# --------------------------------------------------------------------------------------------------
# layernorm

@arm_test
@pytest.mark.parametrize("n", (1, 2, 7, 15, 16, 17, 33, 100, 768, 1600))
def test_layernorm_model(variant, n):
    ops.test_layernorm_model(variant, n)


@arm_test
def test_layernorm_inplace(variant):
    ops.test_layernorm_inplace(variant)


@arm_test
@pytest.mark.parametrize("n", (1, 2, 17, 768, 1600))
def test_layernorm_special_values(variant, n):
    ops.test_layernorm_special_values(variant, n)


@arm_test
def test_layernorm_order_witness(variant):
    ops.test_layernorm_order_witness(variant)


# --------------------------------------------------------------------------------------------------
# attention

ATTN_CASES = [(n_pos, hr) for n_pos in (1, 2, 3, 4, 5, 15, 16, 17, 100)
              for hr in ((0, 12), (3, 7), (11, 12), (5, 5))] + [(1024, (11, 12))]


@arm_test
@pytest.mark.parametrize("n_pos,heads", ATTN_CASES)
def test_attention_model(variant, n_pos, heads):
    ops.test_attention_model(variant, n_pos, heads)


@arm_test
def test_attention_sharp_and_flat(variant):
    ops.test_attention_sharp_and_flat(variant)


@arm_test
def test_attention_order_witness(variant):
    ops.test_attention_order_witness(variant)


@arm_test
def test_attention_scratch_is_exactly_roundup16_per_head(variant):
    ops.test_attention_scratch_is_exactly_roundup16_per_head(variant)


@arm_test
@pytest.mark.parametrize("n_pos,heads", [c for c in ATTN_CASES if c[1] != (11, 12)])
def test_attention_f16_is_f32_on_widened_rows(variant, n_pos, heads):
    """gpt2asm_attention_f16_neon (the binary16 cache; sme2 uses it too): the f32 kernel's bits on the
    widened rows, the contract model, the float64 bound."""
    ops.check_attention_f16_widened(variant, n_pos, heads)


@arm_test
def test_attention_f16_extreme_halves(variant):
    ops.check_attention_f16_extremes(variant)


@arm_test
def test_ops_page_guards(lib):
    """Every elementwise / attention kernel with every buffer butting against a PROT_NONE page on one
    side, then the other (test_kernels_ops.fence_jobs: n = 1..100, n_pos = 1..31, n_ctx = n_pos)."""
    jobs = ops.fence_jobs(np.random.default_rng(9))

    def child() -> bool:
        ok = True
        for op, args, out_i, exp in jobs:
            for at_end in (True, False):
                fenced = [a if isinstance(a, int) else ops.PageFenced(a, at_end) for a in args]
                getattr(lib, f"gpt2asm_{op}_f32_neon")(*[f if isinstance(f, int) else f.addr for f in fenced])
                ok &= bool(ops.model_equal(fenced[out_i].get(), exp).all())
        return ok
    run_forked(child)


# --------------------------------------------------------------------------------------------------
# argmax (greedy sampling): test_kernels_ops' argmax tests on gpt2asm_argmax_f32_neon

@pytest.fixture
def amax(lib):
    """x -> gpt2asm_argmax_f32_neon(x, n) in test_kernels_ops' canary-guarded, misaligned harness."""
    return ops.ArgmaxNative("neon", lib)


@arm_test
def test_argmax_random(amax):
    ops.test_argmax_random(amax)


@arm_test
def test_argmax_ties_every_position(amax):
    ops.test_argmax_ties_every_position(amax)


@arm_test
def test_argmax_ties_large(amax):
    ops.test_argmax_ties_large(amax)


@arm_test
def test_argmax_all_equal(amax):
    ops.test_argmax_all_equal(amax)


@arm_test
def test_argmax_signed_zeros(amax):
    ops.test_argmax_signed_zeros(amax)


@arm_test
def test_argmax_extremes(amax):
    ops.test_argmax_extremes(amax)


@arm_test
def test_argmax_nonfinite(amax):
    ops.test_argmax_nonfinite(amax)


@arm_test
def test_argmax_zero_length(lib):
    assert ops.argmax_fn(lib, "neon")(None, 0) == ops.SIZE_MAX


@arm_test
def test_argmax_page_guards(lib):
    """x butting against a PROT_NONE page at its end, then at its start (lengths 1..70 and more)."""
    jobs = ops.argmax_fence_jobs(np.random.default_rng(107))
    fn = ops.argmax_fn(lib, "neon")

    def child() -> bool:
        ok = True
        for x, exp in jobs:
            for at_end in (True, False):
                f = ops.PageFenced(x, at_end)
                ok &= fn(f.addr, x.size) == exp
        return ok
    run_forked(child)


def test_argmax_sme2_falls_back_to_neon():
    """sme2 has no argmax: build.py and gpt2asm.kernels resolve it to NEON's; Kernels.argmax works."""
    sys.path.insert(0, str(ROOT))
    import build
    assert build.kernel_symbol("argmax_f32", "sme2") == "gpt2asm_argmax_f32_neon"
    assert "gpt2asm_argmax_f32_neon" in build.bound_symbols("aarch64", "neon")
    if not IS_ARM:
        return
    from gpt2asm.cpu import available_families
    from gpt2asm.kernels import Kernels
    for fam in available_families():
        k = Kernels(fam)
        try:
            assert k._symbol("argmax_f32") == "gpt2asm_argmax_f32_neon"
            x = np.arange(37, dtype=F32) % 5
            assert k.argmax(x) == 4
            x[36] = np.nan
            assert k.argmax(x) is None
        finally:
            k.close()


# --------------------------------------------------------------------------------------------------
# cross-ISA fingerprints: NEON == AVX2 == AVX-512, bit for bit (NaN payloads canonicalised)

def u32_stream(seed: int, n: int) -> np.ndarray:
    """n pseudo-random uint32 (splitmix64 of seed, seed+1, ...): integer arithmetic only, so identical on
    every platform and numpy version."""
    with np.errstate(over="ignore"):
        z = (np.arange(n, dtype=np.uint64) + np.uint64(seed + 1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(32)).astype(np.uint32)


def rbits(seed: int, n: int, e_lo: int, e_hi: int) -> np.ndarray:
    """n binary32 with random sign and mantissa and a biased exponent in [e_lo, e_hi]."""
    u = u32_stream(seed, 2 * n)
    e = (np.uint32(e_lo) + u[n:] % np.uint32(e_hi - e_lo + 1)) << np.uint32(23)
    return ((u[:n] & np.uint32(0x807FFFFF)) | e).view(F32)


def rhalves(seed: int, n: int, e_lo: int, e_hi: int) -> np.ndarray:
    """n binary16 with random sign and mantissa and a biased exponent in [e_lo, e_hi]."""
    u = u32_stream(seed, 2 * n)
    e = (np.uint32(e_lo) + u[n:] % np.uint32(e_hi - e_lo + 1)) << np.uint32(10)
    return ((u[:n] & np.uint32(0x83FF)) | e).astype(np.uint16).view(np.float16)


SPECIAL_BITS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
                0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x42B20000,
                0xC2D00000, 0x42B17218, 0x42B17217, 0xC2CFF5C3, 0x3F800000, 0xBF800000, 0x3F000000,
                0xC1210000, 0xC120F9DB, 0x41200000, 0x33800000, 0xB3800000]


def specials_at(x: np.ndarray, seed: int, count: int) -> np.ndarray:
    """x with `count` of SPECIAL_BITS placed at pseudo-random indices."""
    x = x.copy()
    u = u32_stream(seed, 2 * count)
    idx = u[:count] % np.uint32(x.size)
    x.view(np.uint32)[idx] = np.array(SPECIAL_BITS, np.uint32)[u[count:] % np.uint32(len(SPECIAL_BITS))]
    return x


def fingerprint_cases():
    """(group, op, args, index of the output) for every kernel: inputs from integer bits only."""
    # expf, GELU: |x| in [2^-27, 256) (both ends of expf's clamp, GELU's flush to -0.0), and specials
    x = specials_at(rbits(1, 3001, 100, 134), 2, 300)
    yield "expf", "expf", (x, np.zeros_like(x), x.size), 1
    yield "gelu", "gelu", (x, np.zeros_like(x), x.size), 1
    xg = rbits(3, 2000, 110, 130)                           # |x| < 16: GELU's working range
    yield "gelu", "gelu", (xg, np.zeros_like(xg), xg.size), 1
    # softmax: many lengths; wide and narrow ranges; -inf entries; a NaN; all equal
    for i, n in enumerate((1, 3, 16, 17, 250, 1001)):
        for e_hi in (129, 134):
            x = rbits(10 + 2 * i + e_hi, n, 100, e_hi)
            yield "softmax", "softmax", (x, np.zeros_like(x), n), 1
    x = rbits(40, 77, 110, 131)
    x[::5] = -np.inf
    yield "softmax", "softmax", (x, np.zeros_like(x), x.size), 1
    x[30] = np.nan
    yield "softmax", "softmax", (x, np.zeros_like(x), x.size), 1
    x = np.full(35, F32(-1e30))
    yield "softmax", "softmax", (x, np.zeros_like(x), x.size), 1
    # layernorm: lengths incl. GPT-2's 768; an offset mean; specials
    for i, n in enumerate((1, 5, 16, 47, 768)):
        x = rbits(50 + i, n, 115, 130) + F32(3.0)
        g = rbits(60 + i, n, 120, 127)
        b = rbits(70 + i, n, 110, 125)
        yield "layernorm", "layernorm", (x, g, b, np.zeros_like(x), n), 3
    x = rbits(80, 40, 90, 160)                              # magnitudes 2^-37 .. 2^33
    yield "layernorm", "layernorm", (x, rbits(81, 40, 120, 127), rbits(82, 40, 110, 125), np.zeros_like(x),
                                     40), 3
    # attention: n_pos mod 4 = 0..3 (the repeated-row group), head ranges
    for i, n_pos in enumerate((1, 3, 4, 6, 17, 40)):
        n_head, n_ctx = 3, n_pos + 3
        q = rbits(90 + i, n_head * HEAD, 118, 128)
        k = rbits(100 + i, n_head * n_ctx * HEAD, 118, 127).reshape(n_head, n_ctx, HEAD)
        v = rbits(110 + i, n_head * n_ctx * HEAD, 110, 127).reshape(n_head, n_ctx, HEAD)
        for hb, he in ((0, 3), (1, 2)):
            yield "attention", "attention", (q, k, v, np.zeros(n_head * HEAD, F32),
                                             np.zeros(ops.attn_scratch(n_pos, hb, he), F32), n_pos, n_ctx * HEAD,
                                             hb, he), 3
    # matvec: n_in mod 4 = 0..3, tile ranges, bias or NULL, a few NaN / inf weights and inputs
    for i, n_in in enumerate((1, 3, 4, 7, 64, 133)):
        nt = 3
        wt = rbits(120 + i, nt * n_in * TILE, 115, 128).reshape(nt, n_in, TILE)
        x = rbits(130 + i, n_in, 115, 128)
        b = rbits(140 + i, nt * TILE, 110, 128)
        if n_in >= 7:
            wt.reshape(-1)[[5, 300, 301]] = [np.nan, np.inf, -np.inf]
            x[n_in // 2] = np.inf if n_in == 64 else x[n_in // 2]
        wh = rhalves(150 + i, nt * n_in * TILE, 1, 30).reshape(nt, n_in, TILE)
        wh.reshape(-1)[[0, 7]] = [np.float16(np.inf), np.float16(6e-8)]
        for tb, te in ((0, 3), (1, 2)):
            for bias in (b, None):
                yield "matvec_f32", "matvec_f32", (wt, x, bias, np.zeros(nt * TILE, F32), n_in, tb, te), 3
                yield "matvec_f16", "matvec_f16", (wh, x, bias, np.zeros(nt * TILE, F32), n_in, tb, te), 3


def fingerprints(lib: ctypes.CDLL, family: str) -> dict[str, str]:
    """SHA-256 per group of the canonicalised outputs of `family`'s kernels on fingerprint_cases()."""
    digests: dict[str, hashlib._Hash] = {}
    for group, op, args, out_i in fingerprint_cases():
        args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        cargs = [None if a is None else (a.ctypes.data if isinstance(a, np.ndarray) else a) for a in args]
        name = f"gpt2asm_{op}_{family}" if op.startswith("matvec") else f"gpt2asm_{op}_f32_{family}"
        getattr(lib, name)(*cargs)
        out = args[out_i].reshape(-1).view(np.uint32).copy()
        out[np.isnan(args[out_i].reshape(-1))] = 0x7FC00000           # NaN payloads: not in the contract
        digests.setdefault(group, hashlib.sha256()).update(out.tobytes())
    return {g: h.hexdigest() for g, h in digests.items()}


# recorded natively on x86-64 with gpt2asm_*_avx2 (python tests/test_kernels_neon.py --fingerprints);
# AVX-512 gives the same (test_fingerprints_x86)
FINGERPRINTS = {
    "expf": "843e2492d660418a04b6592eecf3ccf36e162cf798f66d19e2d7acea9dc5d548",
    "gelu": "2ea5c7002853312f1941f28df8b060cc22840f9fe99c9d7da9b73b94b8d8fdc5",
    "softmax": "2822d2fa522f673af832da5e9e957e03ea1e99975847b3a0070186cc8985a515",
    "layernorm": "08c5ff49f1aef1c633c2f4f51d7214adf9d21bc9c29eb02655133305d3787434",
    "attention": "bf7b0d4a091332b95db055b6fcc153f9ab22ba0a6e188209d87f55d7a879f789",
    "matvec_f32": "8a36ca4043ec29bc02b3bbe82824df869dc93389377820e9e65a9d3e85d49adc",
    "matvec_f16": "aeeffa5b46e2cb38ae7be21e76ae0ae8ce20edccc040d4be536f359365a2ef37",
}


@arm_test
def test_fingerprints_match_x86(lib):
    """NEON reproduces the x86 kernels' outputs bit for bit on the same inputs."""
    got = fingerprints(lib, "neon")
    assert set(got) == set(FINGERPRINTS)
    bad = [g for g in got if got[g] != FINGERPRINTS[g]]
    assert not bad, f"NEON differs from x86 (AVX2) in {bad}"


@pytest.mark.skipif(not IS_X86, reason="x86-64 only: checks the recorded digests against AVX2 / AVX-512")
def test_fingerprints_x86():
    """The recorded FINGERPRINTS are what the x86 kernels compute (natively: AVX2, and AVX-512 if the CPU
    has it), so the Arm comparison is against the current x86 kernels."""
    lib = ops.load_lib()
    have = ops.native_isas()
    if not have:
        pytest.skip("this CPU runs no x86 kernel family")
    for isa in sorted(have):
        assert fingerprints(bind(lib, isa), isa) == FINGERPRINTS, isa


if __name__ == "__main__":
    if "--fingerprints" in sys.argv[1:]:
        fp = fingerprints(bind(ops.load_lib(), "avx2"), "avx2")
        print("FINGERPRINTS = {")
        for g, h in fp.items():
            print(f'    "{g}": "{h}",')
        print("}")
    else:
        sys.exit(pytest.main([__file__, "-q"] + sys.argv[1:]))
