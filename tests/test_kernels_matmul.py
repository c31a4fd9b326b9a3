"""checkasm-style tests (and a benchmark) for the batched prefill matrix-matrix kernels.

    gpt2asm_matmul_{f32,f16}_{avx2,avx512}                   (docs/kernels.md, gpt2asm_matmul)

Y[t] = X[t] . W^T + b for T tokens at once, on the tiled weights of the matvec kernels, with EACH
(token, output) computed by exactly the operation sequence of the corresponding matvec kernel.  Every
variant the CPU has runs natively; the AVX-512 ones also run under tests/avx512emu.py (small shapes).
Each call is checked against

  * the contract, bit for bit: the per-output sequence of the matvec contract (acc = +0.0; fma in input
    order; + b) replayed for every token with the exact binary32 FMA model
    of tests/test_kernels_matvec.py, NaN-ness included;
  * the matvec kernels themselves: every row of Y must have the bits (NaN payloads included) of the
    matvec kernel run on that row of X -- the property that makes a prefill's logits identical to T
    cached steps;
  * a float64 reference within the fp32 chain's error bound;
  * the memory contract: canaries around every buffer, X / b / y misaligned, row strides
    ldx > n_in and ldy > the outputs with the gaps never written, outputs outside the tile range
    untouched, inputs unchanged; natively a forked child runs with X, Y, w, b butting against
    PROT_NONE pages (X's last row ending exactly at the page), under the emulator every array ends at an
    unmapped page.

Run:  pytest tests/test_kernels_matmul.py
      python tests/test_kernels_matmul.py --bench [--tokens T] [--rounds N] [--wall]
          (GFLOP/s at T = 512 on the GPT-2 124M shapes, speed-up over T matvec calls)
      python tests/test_kernels_matmul.py --bench --cold T [--rounds N]
          (a batched decode's T tokens, weights from DRAM: read / kernel per shape and for a step)
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import test_kernels_matvec as mv                                     # noqa: E402
from test_kernels_matvec import TILE, Y_FILL, Guarded, PageFenced, cpu_isas, fma32, same_bits  # noqa: E402
from forked import run_forked                                        # noqa: E402

ISAS = ("avx2", "avx512")
DTYPES = {"f32": np.float32, "f16": np.float16}
# + the Zen 4 variants (binary16 without blocks of 8 tokens, fp32 without the small calls' prefetch hints;
# gpt2asm.kernels.matmul_variant): an ISA name with a suffix, run where its base ISA runs (natively or emulated)
VARIANTS = [(d, i) for i in ISAS for d in DTYPES] + [("f32", "avx512_zen4"), ("f16", "avx512_zen4")]
P, S = ctypes.c_void_p, ctypes.c_size_t


def symbol(dtype: str, isa: str) -> str:
    return f"gpt2asm_matmul_{dtype}_{isa}"


def mv_symbol(dtype: str, isa: str) -> str:
    return f"gpt2asm_matvec_{dtype}_{isa}"


def load_lib() -> ctypes.CDLL:
    lib = mv.load_lib()                  # builds once; binds the matvec kernels
    for d, i in VARIANTS:
        fn = getattr(lib, symbol(d, i))
        fn.argtypes = [P, P, S, P, P, S, S, S, S, S]
        fn.restype = None
    return lib


# --------------------------------------------------------------------------------------------------
# a case: weights, X [T][ldx] (only [:, :n_in] is input), b; Y is [T][ldy]

class Case:
    def __init__(self, rng, dtype, n_in, nt, T, *, ldx_pad=0, ldy_pad=0, bias=True):
        self.dtype, self.n_in, self.nt, self.T = dtype, n_in, nt, T
        self.ldx, self.ldy = n_in + ldx_pad, nt * TILE + ldy_pad
        self.wt = mv.tile_weights(rng.standard_normal((nt * TILE, n_in)).astype(DTYPES[dtype]))
        self.X = rng.standard_normal((T, self.ldx)).astype(np.float32)
        self.X[:, n_in:] = np.nan                        # the gaps between rows are never inputs
        self.b = rng.standard_normal(nt * TILE).astype(np.float32) if bias else None

    def Y0(self):
        return np.full((self.T, self.ldy), Y_FILL, np.uint32).view(np.float32)


def contract_ref(c: Case, tb, te) -> np.ndarray:
    """[T][64*(te-tb)]: the documented sequence for every token, exactly (binary32)."""
    w = np.asarray(c.wt[tb:te], np.float32)              # f16 widens exactly
    Xi = c.X[:, :c.n_in]
    acc = np.zeros((c.T, (te - tb) * TILE), np.float32)
    for i in range(c.n_in):
        acc = fma32(w[:, i, :].reshape(1, -1), Xi[:, i:i + 1], acc)
    with np.errstate(all="ignore"):
        if c.b is not None:
            acc = acc + c.b[TILE * tb:TILE * te]
    return acc


def f64_check(c: Case, tb, te, got, name, factor=2.0):
    with np.errstate(all="ignore"):
        W = mv.untile(np.asarray(c.wt[tb:te], np.float64))
        X = c.X[:, :c.n_in].astype(np.float64)
        ref = X @ W.T
        mag0 = np.abs(X) @ np.abs(W.T)
        mag = mag0
        if c.b is not None:
            ref = ref + c.b[TILE * tb:TILE * te]
            mag = mag + np.abs(c.b[TILE * tb:TILE * te])
        n = c.n_in + 2
        tol = factor * (n * 2.0 ** -24 * mag + n * 2.0 ** -149)
        fin = np.isfinite(ref) & (mag < 3e38) & (mag0 < 3e38)
        bad = fin & ~(np.abs(got.astype(np.float64) - ref) <= tol)
    assert not bad.any(), f"{name}: float64 bound exceeded at (token, output) {np.argwhere(bad)[:4]}"


# --------------------------------------------------------------------------------------------------
# runners

class NativeRunner:
    def __init__(self, lib, dtype, isa):
        self.fn = getattr(lib, symbol(dtype, isa))
        self.dtype = dtype
        self.name = f"{symbol(dtype, isa)} (native)"

    def __call__(self, c: Case, tb, te, *, seed=0, T=None):
        T = c.T if T is None else T
        mis = 4 * (1 + seed % 15)
        wg = Guarded(c.wt.nbytes, 0, seed).put(c.wt)
        xg = Guarded(c.X.nbytes, (mis + 8) % 64, seed + 2).put(c.X)
        bg = Guarded(c.b.nbytes, (mis + 20) % 64, seed + 3).put(c.b) if c.b is not None else None
        Y0 = c.Y0()
        yg = Guarded(Y0.nbytes, (mis + 36) % 64, seed + 4).put(Y0)
        self.fn(wg.addr, xg.addr, c.ldx, bg.addr if bg else None, yg.addr, c.ldy, T, c.n_in, tb, te)
        mv.check_guarded(self.name, ((wg, c.wt, "w"), (xg, c.X, "x"), (bg, c.b, "b"),
                                     (yg, None, "y")))
        return yg.get(np.float32).reshape(c.T, c.ldy)


class EmuRunner:
    """Emulated AVX-512 (copy mode): w holds only tiles 0 .. te-1, X ends right after row T-1's n_in
    inputs and Y right after row T-1's last output of the range, each at an unmapped page (64-byte
    granularity), inputs read-only."""

    def __init__(self, emu, dtype, isa):
        self.emu, self.sym, self.dtype = emu, symbol(dtype, isa), dtype
        self.name = f"{self.sym} (emulated)"

    def __call__(self, c: Case, tb, te, *, seed=0, T=None):
        T = c.T if T is None else T
        w = np.array(c.wt[:max(te, 1)])
        x = np.array(c.X.reshape(-1)[:max(0, T - 1) * c.ldx + c.n_in])
        b = np.array(c.b) if c.b is not None else None
        for a in (w, x, b):
            if a is not None:
                a.flags.writeable = False
        Y = c.Y0().reshape(-1)
        yl = max(0, T - 1) * c.ldy + TILE * max(te, 1)
        y = Y[:yl].copy()
        self.emu.call(self.sym, w, x, c.ldx, b, y, c.ldy, T, c.n_in, tb, te, ret=None)
        Y[:yl] = y
        return Y.reshape(c.T, c.ldy)


def base_isa(isa: str) -> str:
    return isa.removesuffix("_zen4")


def runners_for(dtype, isa):
    return mv.runners_for(dtype, base_isa(isa), lambda lib, d, _: NativeRunner(lib, d, isa),
                          lambda emu, d, _: EmuRunner(emu, d, isa), load_lib)


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{d}_{i}" for d, i in VARIANTS])
def variant(request):
    dtype, isa = request.param
    return dtype, runners_for(dtype, isa)


def emulated(run) -> bool:
    return isinstance(run, EmuRunner)


def run_and_check(runners, c: Case, tb, te, *, f64=True, seed=0, emu_ok=True):
    """Run every runner; check the range bit-exactly against the contract, everything else of Y (other
    tiles, row gaps) untouched, and (optionally) the float64 bound.  Returns each runner's Y."""
    exp = contract_ref(c, tb, te)
    lo, hi = TILE * tb, TILE * te
    outs = []
    for run in runners:
        if emulated(run) and not emu_ok:
            continue
        Y = run(c, tb, te, seed=seed)
        mask = np.ones(Y.shape, bool)
        mask[:, lo:hi] = False
        assert np.all(Y.view(np.uint32)[mask] == Y_FILL), \
            f"{run.name}: wrote outside tiles [{tb}, {te}) or into the row gaps"
        got = Y[:, lo:hi]
        ok = same_bits(got, exp)
        assert ok.all(), (f"{run.name}: differs from the contract's operation order at (token, output) "
                          f"{np.argwhere(~ok)[:6]}: got {got[~ok][:4]} expected {exp[~ok][:4]}")
        if f64:
            f64_check(c, tb, te, got, run.name)
        outs.append(Y)
    return outs


# --------------------------------------------------------------------------------------------------
# tests

@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 32, 33])
def test_token_counts(variant, T):
    """Every token-block tail (T mod 6), AVX-512 binary16's blocks of 8 (8, 9, 16: then 6 and the tails;
    a call of 8-32 tokens in 64-row chunks), odd n_in, row strides with gaps, tile ranges; the small
    calls' prefetching blocks (T <= 32: a chunk's first block and its later ones, AVX-512 f32 from 4
    tokens) and the first call without them (33)."""
    dtype, runners = variant
    rng = np.random.default_rng(100 + T)
    for k, (n_in, nt, tb, te) in enumerate(((1, 1, 0, 1), (3, 2, 0, 2), (17, 3, 1, 3), (64, 2, 1, 2),
                                           (65, 4, 1, 3))):
        c = Case(rng, dtype, n_in, nt, T, ldx_pad=(0, 1, 5, 16)[k % 4], ldy_pad=(3, 0, 64, 1)[k % 4],
                 bias=k % 2 == 0)
        run_and_check(runners, c, tb, te, seed=k + T)


@pytest.mark.parametrize("n_in", [2, 7, 129, 768, 3071])
def test_sizes(variant, n_in):
    """Larger n_in and T (natively; the emulator runs the small ones)."""
    dtype, runners = variant
    rng = np.random.default_rng(200 + n_in)
    small = n_in <= 129
    if not small and all(emulated(r) for r in runners):
        pytest.skip("large shapes run natively only (the emulator is slow)")
    for k, (nt, T, tb, te) in enumerate(((3, 29, 0, 3), (5, 8, 2, 5))):
        c = Case(rng, dtype, n_in, nt, T, ldx_pad=k * 7, ldy_pad=k * 9 + 1, bias=k == 0)
        run_and_check(runners, c, tb, te, seed=k, emu_ok=small)


def test_row_chunks(variant):
    """n_in larger than one K-chunk (256 KiB of a tile's weights: 1024 fp32 / 2048 fp16
    rows): the sums are parked in y between chunks and continued, bit-exactly (emulated too)."""
    dtype, runners = variant
    rng = np.random.default_rng(300)
    n_in = {"f32": 2100, "f16": 2100}[dtype]
    c = Case(rng, dtype, n_in, 2, 7, ldx_pad=3, ldy_pad=5)
    run_and_check(runners, c, 1, 2, seed=3)


def test_empty(variant):
    """n_tokens = 0 or an empty tile range: nothing is read or written."""
    dtype, runners = variant
    rng = np.random.default_rng(5)
    c = Case(rng, dtype, 9, 3, 4, ldy_pad=2)
    for tb in (0, 2, 3):
        run_and_check(runners, c, tb, tb)
    for run in runners:
        Y = run(c, 0, 3, T=0)
        assert np.all(Y.view(np.uint32) == Y_FILL), f"{run.name}: wrote with n_tokens = 0"


def test_matches_matvec():
    """Each row of Y has exactly the bits (NaN payloads included) of the matvec kernel of the same
    dtype and ISA run on that row of X: the prefill gives the logits of T cached steps.  Without native
    AVX-512, the emulated AVX-512 matmul is compared with the native AVX2 matvec."""
    lib = load_lib()
    have = cpu_isas(lib)
    if not have:
        pytest.skip("no native ISA")
    rng = np.random.default_rng(31)
    plan = [(isa, base_isa(isa), False) for isa in dict.fromkeys(i for _, i in VARIANTS) if base_isa(isa) in have]
    if "avx512" not in have and "avx2" in have and mv.emulator()[0] is not None:
        plan.append(("avx512", "avx2", True))      # emulated AVX-512 matmul vs native AVX2 matvec
    for isa, mv_isa, emu in plan:
        for dtype in DTYPES:
            if (dtype, isa) not in VARIANTS:
                continue
            for n_in, nt, T, tb, te in ((768, 3, 14, 0, 3), (33, 4, 9, 1, 4), (1, 2, 5, 0, 2)):
                if emu and n_in > 100:
                    continue
                c = Case(rng, dtype, n_in, nt, T, ldx_pad=3, ldy_pad=5)
                Xi = c.X[:, :n_in]
                Xi[rng.integers(0, T), rng.integers(0, n_in)] = -np.inf
                Xi.reshape(-1)[rng.integers(0, Xi.size, 2)] = np.nan
                c.X[:, :n_in] = Xi
                c.wt.reshape(-1)[rng.integers(0, c.wt.size, 4)] = np.nan
                c.b.view(np.uint32)[rng.integers(0, c.b.size, 2)] = np.uint32(0xFFC00123)
                run = EmuRunner(mv.emulator()[0], dtype, isa) if emu else NativeRunner(lib, dtype, isa)
                Y = run(c, tb, te)
                fn = getattr(lib, mv_symbol(dtype, mv_isa))
                for t in range(T):
                    x = np.ascontiguousarray(Xi[t])
                    y = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
                    fn(c.wt.ctypes.data, x.ctypes.data, c.b.ctypes.data, y.ctypes.data, n_in, tb, te)
                    lo, hi = TILE * tb, TILE * te
                    diff = np.flatnonzero(Y[t, lo:hi].view(np.uint32) != y[lo:hi].view(np.uint32))
                    assert diff.size == 0, (f"{run.name} token {t} differs from "
                                            f"{mv_symbol(dtype, mv_isa)} at outputs {diff[:8] + lo}")


def test_special_values(variant):
    """NaN / inf in one token's X reach only that token's outputs; NaN / inf weights (f32, f16) only
    their output, in every token; overflowing partial sums."""
    dtype, runners = variant
    rng = np.random.default_rng(41)
    nt, n_in, T = 2, 19, 8
    c = Case(rng, dtype, n_in, nt, T, ldx_pad=2, ldy_pad=3)
    c.X[2, 5] = np.nan
    c.X[6, 11] = np.inf
    c.wt[0, 4, 9] = np.nan
    c.wt[1, 0, 63] = np.inf
    w11 = np.asarray(c.wt[:, 11, :], np.float32).reshape(-1)
    Y = run_and_check(runners, c, 0, nt)[0][:, :nt * TILE]
    col = [9, 127]
    plain = np.ones(nt * TILE, bool)
    plain[col] = False
    assert np.isnan(Y[2]).all()
    assert np.isnan(Y[6][(w11 == 0) & plain]).all() and np.isinf(Y[6][(w11 != 0) & plain]).all()
    other = np.delete(np.arange(T), [2, 6])
    assert np.isnan(Y[other][:, col[0]]).all() and np.isinf(Y[other][:, col[1]]).all()
    assert np.isfinite(np.delete(Y[other], col, axis=1)).all()
    # huge magnitudes: partial sums overflow (inf, and inf - inf = NaN), in the contract's order
    c = Case(rng, dtype, 40, 2, 7, ldy_pad=1)
    c.X[:, :40] *= np.float32(3e36 if dtype != "f32" else 1e37)
    if dtype == "f32":
        c.wt *= np.float32(30)
    elif dtype == "f16":
        c.wt *= np.float16(1000)
    Y = run_and_check(runners, c, 0, 2, f64=False)[0]
    assert not np.isfinite(Y[:, :128]).all()


def test_denormals_and_zeros(variant):
    """No FTZ/DAZ (subnormal X, sums, bias) and acc = +0.0 (all-zero products give +0.0 with b = -0)."""
    dtype, runners = variant
    rng = np.random.default_rng(42)
    c = Case(rng, dtype, 33, 2, 7, ldx_pad=1)
    c.X[:, :33] = (rng.standard_normal((7, 33)) * 1e-41).astype(np.float32)
    c.X[3, 4] = np.float32(1.4e-45)
    c.b = (rng.standard_normal(2 * TILE) * 1e-39).astype(np.float32)
    Y = run_and_check(runners, c, 0, 2)[0][:, :128]
    assert np.any((Y != 0) & (np.abs(Y) < np.finfo(np.float32).tiny)), "expected subnormal outputs"
    c = Case(rng, dtype, 5, 2, 7)
    c.wt[:] = 0
    c.X[:, :5] = -1.0
    c.b = np.full(2 * TILE, -0.0, np.float32)
    for Y in run_and_check(runners, c, 0, 2):
        assert np.all(Y[:, :128].view(np.uint32) == 0), "expected +0.0"


def test_cross_variant_bits():
    """AVX2 and AVX-512 (native or emulated) give bit-identical Y, NaN payloads included."""
    lib = load_lib()
    have = cpu_isas(lib)
    rng = np.random.default_rng(51)
    for dtype in DTYPES:
        runs = []
        for d, isa in VARIANTS:
            if d != dtype:
                continue
            if base_isa(isa) in have:
                runs.append(NativeRunner(lib, dtype, isa))
            elif base_isa(isa) == "avx512" and mv.emulator()[0] is not None:
                runs.append(EmuRunner(mv.emulator()[0], dtype, isa))
        if len({r.name.split(" ")[0] for r in runs}) < 2:
            pytest.skip(f"need both an AVX2 and an AVX-512 runner (have {[r.name for r in runs]})")
        for n_in, nt, T, tb, te in ((97, 3, 13, 0, 3), (8, 2, 6, 1, 2), (3, 1, 1, 0, 1)):
            c = Case(rng, dtype, n_in, nt, T, ldx_pad=1, ldy_pad=2)
            c.X.reshape(-1)[rng.integers(0, c.X.size, 3)] = np.nan
            c.wt.reshape(-1)[rng.integers(0, c.wt.size, 3)] = -np.nan
            c.b.view(np.uint32)[::5] = np.uint32(0xFFC00123)        # NaN bias meets NaN sums: payload order
            Ys = [r(c, tb, te) for r in runs]
            for r, Y in zip(runs[1:], Ys[1:]):
                diff = np.argwhere(Ys[0].view(np.uint32) != Y.view(np.uint32))
                assert diff.size == 0, f"{runs[0].name} and {r.name} differ at {diff[:6]}"


def test_page_guards_overread():
    """Natively, in a child process: w (only the range's tiles), b, X (its last row's n_in-th
    input the last byte before a PROT_NONE page, or its first byte the first after one) and Y likewise.
    Any over-read or over-write faults."""
    lib = load_lib()
    have = cpu_isas(lib)
    todo = [(d, i) for d, i in VARIANTS if base_isa(i) in have]
    if not todo:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(61)
    jobs = []
    for dtype, isa in todo:
        for n_in, nt, T, tb, te, pad in ((1, 3, 1, 1, 3, 0), (7, 4, 7, 2, 3, 3), (65, 2, 13, 0, 2, 0),
                                         (130, 3, 6, 1, 2, 5), (3, 1, 5, 0, 1, 0)):
            c = Case(rng, dtype, n_in, nt, T, ldx_pad=pad)
            jobs.append((dtype, isa, c, tb, te, contract_ref(c, tb, te)))

    def child() -> bool:
        ok = True
        for dtype, isa, c, tb, te, exp in jobs:
            fn = getattr(lib, symbol(dtype, isa))
            tile_bytes = c.wt[0].nbytes
            nout = TILE * (te - tb)
            for at_end in (True, False):
                sub = np.ascontiguousarray(c.wt[tb:te])
                wg = PageFenced(max(sub.nbytes, 64), at_end).put(sub)
                xs = c.X.reshape(-1)[:(c.T - 1) * c.ldx + c.n_in]
                xg = PageFenced(xs.nbytes, at_end).put(xs)
                bs = c.b[TILE * tb:TILE * te]
                bg = PageFenced(bs.nbytes, at_end).put(bs)
                yg = PageFenced(4 * c.T * nout, at_end)          # Y rows of exactly the range: ldy = nout
                off = 4 * TILE * tb
                fn(wg.addr - tb * tile_bytes, xg.addr, c.ldx, bg.addr - off, yg.addr - off, nout, c.T, c.n_in,
                   tb, te)
                ok &= bool(same_bits(yg.get(np.float32).reshape(c.T, nout), exp).all())
        return ok
    run_forked(child)


AVX512F_OK = {  # every mnemonic the AVX-512 matmul kernels may use: AVX-512F (zmm only) and plain x86-64
    "vcvtph2ps", "vfmadd231ps", "vbroadcastss", "vaddps", "vmovups", "vpxord", "vzeroupper"}


def avx512f_only(lib_path, symbols) -> list[str]:
    """Vector instructions of `symbols` that are not AVX-512F zmm instructions (objdump)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump")
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(lib_path)], capture_output=True,
                          text=True, check=True).stdout
    bad, cur = [], None
    for line in text.splitlines():
        if line.endswith(">:"):
            cur = line.split("<")[1][:-2]
            continue
        if cur not in symbols or "\t" not in line:
            continue
        ins = line.split("\t")[-1].strip()
        mn = ins.split()[0] if ins else ""
        vector = mn.startswith(("v", "k")) or "mm" in ins or "%k" in ins
        if vector and (mn not in AVX512F_OK or "%xmm" in ins or "%ymm" in ins):
            bad.append(f"{cur}: {ins}")
    return bad


def test_avx512_uses_only_avx512f():
    """The emulator's CPU has AVX-512 BW/DQ/VL too, so check the instructions themselves."""
    bad = avx512f_only(mv.LIB_PATH, {symbol(d, i) for d, i in VARIANTS if base_isa(i) == "avx512"})
    assert not bad, "non-AVX-512F instructions: " + "; ".join(bad[:5])


# --------------------------------------------------------------------------------------------------
# benchmark: python tests/test_kernels_matmul.py --bench

SHAPES_124M = mv.SHAPES_124M
ESIZE = {"f32": 4, "f16": 2}


def bench(T: int = 512, rounds: int = 5, chunk_mb: int = 160, wall: bool = False) -> None:
    """Per dtype and shape: the matmul of T tokens (GFLOP/s, median of `rounds`), against T matvec calls
    as a decode does them -- every call streaming weights that are in no cache (median over rounds of
    a rotation through 4 x chunk_mb MB, times T) -- and against T matvec calls on one matrix (warm:
    the small matrices then come from L2/L3).  Interleaved, so a shared machine's noise hits all alike.
    Then the whole 124M prefill (12 layers x 4 products + the head) vs T cached steps, and the same with
    two threads splitting the tiles.  Single-thread times are the thread's CPU time (time.thread_time:
    robust to time-slicing on a shared machine), or wall time with --wall; the 2-thread figure is always
    wall time."""
    clock = time.perf_counter if wall else time.thread_time
    lib = load_lib()
    have = cpu_isas(lib)
    rng = np.random.default_rng(0)
    nchunk, chunk = 4, chunk_mb << 20
    raw = np.empty(nchunk * chunk + 4096, np.uint8)
    buf = raw[(-raw.ctypes.data) % 4096:][:nchunk * chunk]
    buf[:] = 0x11                                             # finite as f32/f16
    base = buf.ctypes.data
    X = (rng.standard_normal((T, 3072)) * 0.1).astype(np.float32)
    Y = np.empty((T, 50304), np.float32)
    y1 = np.empty(50304, np.float32)
    bias = np.zeros(50304, np.float32)
    k = [0]

    def next_chunk():
        k[0] += 1
        return base + (k[0] % nchunk) * chunk

    print(f"T = {T} tokens; medians of {rounds} interleaved rounds; 'cold' = weights from DRAM like a decode; "
          f"{'wall' if wall else 'thread CPU'} time")
    print(f"{'kernel':24s} {'shape':17s} {'matmul ms':>9s} {'GFLOP/s':>8s} {'T matvec cold ms':>16s} "
          f"{'speed-up':>8s} {'T matvec warm ms':>16s} {'speed-up':>8s}")
    for isa in ISAS:
        if isa not in have:
            print(f"{isa}: not on this CPU, skipped (correctness runs under the emulator in the tests)")
            continue
        for dtype in DTYPES:
            mm = getattr(lib, symbol(dtype, isa))
            mvf = getattr(lib, mv_symbol(dtype, isa))
            tot = {"mm": 0.0, "cold": 0.0, "mm_nohead": 0.0, "cold_nohead": 0.0, "mm2": 0.0}
            for n_in, n_out, what in SHAPES_124M:
                nt = n_out // TILE
                per = n_in * n_out * ESIZE[dtype]
                w = next_chunk()                                  # the matmul's weights: one fixed copy

                def run_mm(tb=0, te=nt):
                    mm(w, X.ctypes.data, 3072, bias.ctypes.data, Y.ctypes.data, 50304, T, n_in, tb, te)

                def mv_call(p, x):
                    mvf(p, x, bias.ctypes.data, y1.ctypes.data, n_in, 0, nt)

                ncold = max(1, min(64, chunk // per))              # copies inside one chunk
                t_mm, t_cold, t_warm, t_mm2 = [], [], [], []
                for r in range(rounds):
                    t0 = clock()
                    run_mm()
                    t_mm.append(clock() - t0)
                    p = next_chunk()
                    t0 = clock()
                    for cidx in range(ncold):                       # distinct copies: no cache reuse
                        mv_call(p + cidx * per, X.ctypes.data + 4 * 3072 * (cidx % T))
                    t_cold.append((clock() - t0) / ncold * T)
                    nwarm = min(T, 64)
                    t0 = clock()
                    for t in range(nwarm):
                        mv_call(w, X.ctypes.data + 4 * 3072 * t)
                    t_warm.append((clock() - t0) / nwarm * T)
                    half = nt // 2                                   # two threads split the tiles
                    th = threading.Thread(target=run_mm, args=(half, nt))
                    t0 = time.perf_counter()
                    th.start()
                    run_mm(0, half)
                    th.join()
                    t_mm2.append(time.perf_counter() - t0)
                a, bcold, cw, a2 = (float(np.median(v)) for v in (t_mm, t_cold, t_warm, t_mm2))
                mult = 1 if what == "lm_head" else 12
                tot["mm"] += mult * a
                tot["cold"] += mult * bcold
                tot["mm2"] += mult * a2
                if what != "lm_head":
                    tot["mm_nohead"] += mult * a
                    tot["cold_nohead"] += mult * bcold
                print(f"{symbol(dtype, isa):24s} {n_in:4d}x{n_out:<5d} {what:11s}"
                      f"{a * 1e3:9.2f} {2 * T * n_in * n_out / a / 1e9:8.1f} {bcold * 1e3:16.2f} {bcold / a:8.2f} "
                      f"{cw * 1e3:16.2f} {cw / a:8.2f}   (2 threads: {2 * T * n_in * n_out / a2 / 1e9:.1f} GFLOP/s)",
                      flush=True)
            print(f"  124M {dtype} {isa}: prefill matmuls of {T} tokens {tot['mm'] * 1e3:.0f} ms vs {T} cached "
                  f"steps' matvecs {tot['cold'] * 1e3:.0f} ms: {tot['cold'] / tot['mm']:.2f}x "
                  f"(without the head, which a prefill needs for the last token only: "
                  f"{tot['mm_nohead'] * 1e3:.0f} ms, {tot['cold'] / tot['mm_nohead']:.2f}x); "
                  f"matmuls on 2 threads {tot['mm2'] * 1e3:.0f} ms", flush=True)


def bench_cold(T: int, rounds: int = 11, chunk_mb: int = 320) -> None:
    """The matmuls at a batched decode's few tokens, where the weights come from DRAM: per ISA, dtype and 124M
    shape, T tokens' matmul over weights in no cache against a plain read of the same bytes (the matvec
    bench's harness: mv.bench_shapes, interleaved rounds), then the step's totals (12 x each layer matrix +
    the head).  For an A/B of builds with other -D knobs, run it again with GPT2ASM_TEST_LIB=that library
    (GPT2ASM_ASFLAGS='-DMM_PF_DIST=4096' python build.py --out DIR)."""
    lib = load_lib()
    have = cpu_isas(lib)
    readbw = mv.readbw_baseline(lib, have)
    if readbw is None:
        return
    chunk = chunk_mb << 20
    buf, next_chunk = mv.stream_buffers(chunk_mb, np.uint8(0x11))         # finite as f32 / f16
    X = (np.random.default_rng(0).standard_normal((T, 3072)) * 0.1).astype(np.float32)
    Y = np.empty((T, 50304), np.float32)
    bias = np.zeros(50304, np.float32)
    print(f"T = {T} tokens, weights from DRAM; medians of {rounds} interleaved rounds (thread CPU time)")
    print(f"{'kernel':26s} {'shape':22s} {'us/call':>9s} {'GB/s':>7s} {'read GB/s':>10s} {'ratio':>6s}")
    for isa in ISAS:
        if isa not in have:
            print(f"{isa}: not on this CPU, skipped")
            continue
        for dtype in DTYPES:
            es = ESIZE[dtype]
            mm = getattr(lib, symbol(dtype, isa))
            tk, tr = mv.bench_shapes(
                symbol(dtype, isa), 26, rounds, time.thread_time, chunk, lambda i, o, es=es: i * o * es,
                lambda p, n_in, nt, mm=mm: mm(p, X.ctypes.data, 3072, bias.ctypes.data, Y.ctypes.data, 50304,
                                              T, n_in, 0, nt), readbw, next_chunk)
            print(f"  124M {dtype} {isa}, T = {T}: matmuls {tk * 1e3:.2f} ms a step, read/kernel {tr / tk:.3f}")


if __name__ == "__main__":
    if "--bench" in sys.argv[1:]:
        args = sys.argv[1:]
        opt = lambda name, d: int(args[args.index(name) + 1]) if name in args else d
        if "--cold" in args:
            bench_cold(opt("--cold", 8), opt("--rounds", 11))
        else:
            bench(opt("--tokens", 512), opt("--rounds", 5), wall="--wall" in args)
    else:
        sys.exit(pytest.main([__file__, *sys.argv[1:]]))
