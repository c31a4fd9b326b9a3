"""checkasm-style tests (and a benchmark) for the tiled matrix-vector kernels.

    gpt2asm_matvec_f32_{avx2,avx512}, gpt2asm_matvec_f16_{avx2,avx512}   (docs/kernels.md)

Every variant the CPU has runs natively; the AVX-512 ones also run under tests/avx512emu.py (an
emulated AVX-512 CPU) when that is available.  Each call is checked against

  * the contract itself, bit for bit: `contract_ref` replays the documented per-output sequence
    acc = +0.0; acc = fma(w, x[i], acc) ...; y = acc + b with an exact binary32 FMA model (float64
    product, error-free sum, correctly rounded to binary32, ties broken by the exact residual), so
    every ISA must reproduce it exactly, NaN-ness included;
  * a float64 reference (`W @ x + b`, picoGPT style) within the documented error bound
    n_in * 2^-24 * sum|w*x| (times a small factor);
  * its memory contract: inputs and outputs sit in buffers with 4 KiB of canary bytes on each side,
    x, b and y misaligned by 4 bytes, outputs outside the tile range must be untouched; natively,
    a forked child also runs the kernels with every buffer ending (or starting) at a PROT_NONE page,
    so a single byte of over-read faults.

Run:  pytest tests/test_kernels_matvec.py
      python tests/test_kernels_matvec.py --bench [--rounds N]    (GB/s on the GPT-2 124M shapes)
"""
from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
# GPT2ASM_TEST_LIB=path tests a library built elsewhere (nothing is built then)
LIB_PATH = Path(os.environ.get("GPT2ASM_TEST_LIB") or ROOT / "gpt2asm" / "libgpt2asm.so")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(ROOT))                                       # gpt2asm (run as a script)

from gpt2asm.checkasm import open_library  # noqa: E402
from forked import run_forked  # noqa: E402

GUARD = 4096                         # canary bytes before and after every buffer
TILE = 64                            # outputs per tile
DTYPES = {"f32": np.float32, "f16": np.float16}
ISAS = ("avx2", "avx512")
VARIANTS = [(d, i) for i in ISAS for d in DTYPES]
Y_FILL = np.uint32(0x7FC0DEAD)       # a NaN pattern pre-filled into y: must survive outside the range

P, S = ctypes.c_void_p, ctypes.c_size_t


def symbol(dtype: str, isa: str) -> str:
    return f"gpt2asm_matvec_{dtype}_{isa}"


# --------------------------------------------------------------------------------------------------
# library, CPU features, emulator

_LIB = None


def open_built(build: bool = True) -> ctypes.CDLL:
    """The library, built first (python build.py -q; not with build=False or $GPT2ASM_TEST_LIB), opened
    (checked when $GPT2ASM_CHECKASM, conftest.py), with gpt2asm_cpuid / gpt2asm_xgetbv bound."""
    if build and not os.environ.get("GPT2ASM_TEST_LIB"):
        subprocess.run([sys.executable, "build.py", "-q"], cwd=ROOT, check=True)
    lib = open_library(LIB_PATH)
    lib.gpt2asm_cpuid.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    lib.gpt2asm_cpuid.restype = None
    lib.gpt2asm_xgetbv.argtypes = [ctypes.c_uint32]
    lib.gpt2asm_xgetbv.restype = ctypes.c_uint64
    return lib


def load_lib(build: bool = True) -> ctypes.CDLL:
    """Build the library once per session and bind the matvec symbols."""
    global _LIB
    if _LIB is None:
        lib = open_built(build)
        for d, i in VARIANTS:
            fn = getattr(lib, symbol(d, i))
            fn.argtypes = [P, P, P, P, S, S, S]
            fn.restype = None
        if hasattr(lib, "gpt2asm_readbw_f32_avx2"):
            lib.gpt2asm_readbw_f32_avx2.argtypes = [P, S]
            lib.gpt2asm_readbw_f32_avx2.restype = ctypes.c_float
        for name in ("gpt2asm_fmapeak_f32_avx2", "gpt2asm_fmapeak_f32_avx512"):
            if hasattr(lib, name):                  # float gpt2asm_fmapeak_f32_<isa>(size_t n);
                getattr(lib, name).argtypes = [S]
                getattr(lib, name).restype = ctypes.c_float
        _LIB = lib
    return _LIB


def isas_from_cpuid(cpuid, xgetbv) -> set[str]:
    """The ISA families a CPU (and OS) can run, from CPUID and XCR0 (docs/kernels.md)."""
    bit = lambda v, *bs: all(v >> b & 1 for b in bs)       # noqa: E731
    max_leaf = cpuid(0, 0)[0]
    ecx1 = cpuid(1, 0)[2]
    ebx7 = cpuid(7, 0)[1] if max_leaf >= 7 else 0
    if not bit(ecx1, 27):                                  # OSXSAVE: xgetbv is usable
        return set()
    xcr0 = xgetbv(0)
    have = set()
    if bit(ecx1, 12, 27, 28, 29) and bit(ebx7, 5) and bit(xcr0, 1, 2):
        have.add("avx2")
        if bit(ebx7, 16) and bit(xcr0, 5, 6, 7):
            have.add("avx512")
    return have


def cpu_isas(lib) -> set[str]:
    """The ISA families this CPU (and OS) can run, probed with the library's gpt2asm_cpuid / xgetbv."""
    regs = (ctypes.c_uint32 * 4)()

    def cpuid(leaf, sub):
        lib.gpt2asm_cpuid(leaf, sub, regs)
        return tuple(regs)
    return isas_from_cpuid(cpuid, lib.gpt2asm_xgetbv)


_EMU: list = []                      # [emulator] or [None, reason]


def emulator():
    """(Avx512Emulator, None) or (None, why not)."""
    if not _EMU:
        try:
            import avx512emu
            if not avx512emu.available():
                _EMU[:] = [None, avx512emu.why_unavailable()]
            else:
                _EMU[:] = [avx512emu.Avx512Emulator(str(LIB_PATH)), None]
        except Exception as e:                              # missing file, or an emulator bug
            _EMU[:] = [None, f"tests/avx512emu.py not usable: {type(e).__name__}: {e}"]
    return _EMU[0], _EMU[1]


# --------------------------------------------------------------------------------------------------
# buffers

class Guarded:
    """`nbytes` of payload inside GUARD canary bytes on each side; the payload starts `misalign`
    bytes after a 64-byte boundary."""

    def __init__(self, nbytes: int, misalign: int, seed: int):
        self.raw = np.empty(2 * GUARD + 64 + nbytes + 64, np.uint8)
        self.start = (-self.raw.ctypes.data) % 64 + GUARD + misalign
        self.end = self.start + nbytes
        self.canary = np.random.default_rng(seed).integers(0, 256, self.raw.size, dtype=np.uint8)
        self.raw[:] = self.canary
        self.addr = self.raw.ctypes.data + self.start

    def put(self, a: np.ndarray) -> "Guarded":
        self.raw[self.start:self.end] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        return self

    def get(self, dtype) -> np.ndarray:
        return self.raw[self.start:self.end].copy().view(dtype)

    def check(self, what: str) -> None:
        for lo, hi, where in ((0, self.start, "before"), (self.end, self.raw.size, "after")):
            bad = np.flatnonzero(self.raw[lo:hi] != self.canary[lo:hi])
            assert bad.size == 0, f"{what}: canary bytes {where} the buffer changed at {bad[:8] + lo - self.start}"


def check_guarded(name: str, bufs) -> None:
    """After a kernel call: every Guarded buffer's canaries intact, and every input unchanged.  bufs:
    (Guarded or None, the input it was filled with or None for an output, label)."""
    for g, a, label in bufs:
        if g is None:
            continue
        g.check(f"{name}: {label}")
        if a is not None:
            assert np.array_equal(g.get(np.uint8), np.ascontiguousarray(a).reshape(-1).view(np.uint8)), \
                f"{name} wrote to its input {label}"


def tile_weights(W: np.ndarray) -> np.ndarray:
    """[n_tiles*64][n_in] (row o = output o) -> the kernel layout [n_tiles][n_in][64]."""
    n_out, n_in = W.shape
    return np.ascontiguousarray(W.reshape(n_out // TILE, TILE, n_in).transpose(0, 2, 1))


def untile(wt: np.ndarray) -> np.ndarray:
    nt, n_in, _ = wt.shape
    return wt.transpose(0, 2, 1).reshape(nt * TILE, n_in)


# --------------------------------------------------------------------------------------------------
# runners: call one variant on (wt, x, b, y0) and return the new y, checking the memory contract

class NativeRunner:
    def __init__(self, lib, dtype: str, isa: str):
        self.fn = getattr(lib, symbol(dtype, isa))
        self.name = f"{symbol(dtype, isa)} (native)"

    def __call__(self, wt, x, b, y0, tb, te, *, seed=0):
        nt, n_in, _ = wt.shape
        w = Guarded(wt.nbytes, 0, seed).put(wt)                       # w must be aligned
        xg = Guarded(x.nbytes, 4, seed + 1).put(x)
        bg = Guarded(b.nbytes, 4, seed + 2).put(b) if b is not None else None
        yg = Guarded(y0.nbytes, 4, seed + 3).put(y0)
        self.fn(w.addr, xg.addr, bg.addr if bg else None, yg.addr, n_in, tb, te)
        check_guarded(self.name, ((w, wt, "w"), (xg, x, "x"), (bg, b, "b"), (yg, None, "y")))
        return yg.get(np.float32)


class EmuRunner:
    """The AVX-512 variants on the emulated CPU: arrays are copied into page-guarded, 64-byte aligned
    emulated buffers (inputs mapped read-only, canaries checked by the emulator); w holds only tiles
    0 .. te-1, so reading past tile te-1 faults.  The emulator places every array on a 64-byte
    boundary, so the misaligned x, b, y cases only run natively."""

    def __init__(self, emu, dtype: str, isa: str):
        self.emu, self.sym = emu, symbol(dtype, isa)
        self.name = f"{self.sym} (emulated)"

    def __call__(self, wt, x, b, y0, tb, te, *, seed=0):
        nt, n_in, _ = wt.shape
        w = np.array(wt[:max(te, 1)])                         # private, C-contiguous copies
        x, b = np.array(x), (np.array(b) if b is not None else None)
        for a in (w, x, b):
            if a is not None:
                a.flags.writeable = False
        y = y0.copy()
        self.emu.call(self.sym, w, x, b, y, n_in, tb, te, ret=None)
        return y


def runners_for(dtype: str, isa: str, native=None, emulated=None, load=None):
    """All the ways to run this variant here: [(runner)], or pytest.skip with the reason.  native /
    emulated / load: the runner classes and the library loader (default this file's; test_kernels_matmul
    passes its own)."""
    native, emulated = native or NativeRunner, emulated or EmuRunner
    lib = (load or load_lib)()
    out = []
    if isa in cpu_isas(lib):
        out.append(native(lib, dtype, isa))
    if isa == "avx512":
        emu, why = emulator()
        if emu is not None:
            out.append(emulated(emu, dtype, isa))
        elif not out:
            pytest.skip(f"no AVX-512 on this CPU and no emulator: {why}")
    elif not out:
        pytest.skip(f"CPU lacks {isa}")
    return out


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"{d}_{i}" for d, i in VARIANTS])
def variant(request):
    dtype, isa = request.param
    return dtype, runners_for(dtype, isa)


# --------------------------------------------------------------------------------------------------
# references

def fma32(a, b, c) -> np.ndarray:
    """Correctly rounded binary32 fma(a, b, c), elementwise (numpy broadcasting).

    a*b is exact in float64; s = fl64(p + c) with its exact residual e (TwoSum).  Rounding s to
    binary32 is the correct rounding of p + c = s + e unless s is exactly halfway between two
    binary32 numbers (a midpoint is a float64, so the nearest float64 cannot jump over it) and e != 0:
    then the residual decides.  Infinities and NaN come out of the float64 arithmetic as IEEE says."""
    with np.errstate(all="ignore"):
        a64 = np.asarray(a, np.float32).astype(np.float64)
        b64 = np.asarray(b, np.float32).astype(np.float64)
        c64 = np.asarray(c, np.float32).astype(np.float64)
        p = a64 * b64
        s = p + c64
        r = np.asarray(s.astype(np.float32))
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)
        fix = np.isfinite(s) & np.isfinite(r) & (e != 0) & (s != r)
        if fix.any():
            s_, r_, e_ = np.broadcast_to(s, r.shape)[fix], r[fix], np.broadcast_to(e, r.shape)[fix]
            other = np.where(s_ > r_, np.nextafter(r_, np.float32(np.inf)), np.nextafter(r_, np.float32(-np.inf)))
            r64, o64 = r_.astype(np.float64), other.astype(np.float64)
            tie = (s_ - r64) == (o64 - s_)
            toward_other = (e_ > 0) == (o64 > s_)
            r[fix] = np.where(tie & toward_other, other, r_)
    return r


def contract_ref(wt, x, b, tb, te) -> np.ndarray:
    """The documented operation sequence for outputs 64*tb .. 64*te-1, exactly (binary32)."""
    with np.errstate(invalid="ignore"):                     # (aarch64 numpy flags a NaN half's widening)
        w = np.asarray(wt[tb:te], np.float32)               # f16 widens exactly
    acc = np.zeros((te - tb) * TILE, np.float32)             # +0.0
    for i in range(w.shape[1]):
        acc = fma32(w[:, i, :].reshape(-1), x[i], acc)
    if b is not None:
        with np.errstate(all="ignore"):
            acc = acc + b[TILE * tb:TILE * te]               # one binary32 add, round to nearest
    return acc


def f64_check(wt, x, b, tb, te, got, name, factor=2.0):
    """picoGPT-style float64 reference W @ x + b within the error bound of an fp32 FMA chain."""
    with np.errstate(all="ignore"):
        W = untile(np.asarray(wt[tb:te], np.float64))
        x64 = x.astype(np.float64)
        ref = W @ x64
        mag = np.abs(W) @ np.abs(x64)
        if b is not None:
            ref = ref + b[TILE * tb:TILE * te]
            mag = mag + np.abs(b[TILE * tb:TILE * te])
        n = W.shape[1] + 1
        tol = factor * (n * 2.0 ** -24 * mag + n * 2.0 ** -149)
        fin = np.isfinite(ref) & (mag < 3e38)                # no overflow of any fp32 partial sum
        bad = fin & ~(np.abs(got.astype(np.float64) - ref) <= tol)
    assert not bad.any(), (f"{name}: |y - W@x-b| > bound at outputs {np.flatnonzero(bad)[:8] + TILE * tb}: "
                           f"got {got[bad][:4]}, ref {ref[bad][:4]}, tol {tol[bad][:4]}")


def same_bits(got, exp) -> np.ndarray:
    """Elementwise: identical binary32 bits, or both NaN (the model does not track NaN payloads)."""
    return (got.view(np.uint32) == exp.view(np.uint32)) | (np.isnan(got) & np.isnan(exp))


def run_and_check(runners, wt, x, b, tb, te, *, f64=True, seed=0) -> list[np.ndarray]:
    """Run every runner; check the range bit-exactly against the contract, the rest untouched, and
    (optionally) the float64 bound.  Returns each runner's y."""
    nt = wt.shape[0]
    y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
    exp = contract_ref(wt, x, b, tb, te)
    outs = []
    for run in runners:
        y = run(wt, x, b, y0, tb, te, seed=seed)
        lo, hi = TILE * tb, TILE * te
        outside = np.r_[0:lo, hi:nt * TILE]
        assert np.all(y.view(np.uint32)[outside] == Y_FILL), \
            f"{run.name}: wrote outputs outside tiles [{tb}, {te})"
        got = y[lo:hi]
        ok = same_bits(got, exp)
        assert ok.all(), (f"{run.name}: differs from the contract's operation order at outputs "
                          f"{np.flatnonzero(~ok)[:8] + lo}: got {got[~ok][:4]} expected {exp[~ok][:4]}")
        if f64:
            f64_check(wt, x, b, tb, te, got, run.name)
        outs.append(y)
    return outs


def random_case(rng, dtype, n_in, nt, scale=1.0, bias=True):
    W = (rng.standard_normal((nt * TILE, n_in)) * scale).astype(DTYPES[dtype])
    x = rng.standard_normal(n_in).astype(np.float32)
    b = rng.standard_normal(nt * TILE).astype(np.float32) if bias else None
    return tile_weights(W), x, b


# --------------------------------------------------------------------------------------------------
# tests

def test_fma_model():
    """The reference's binary32 FMA agrees with libm's fmaf, ties and subnormals included."""
    try:
        fmaf = ctypes.CDLL(None).fmaf
    except (OSError, AttributeError):
        try:
            fmaf = ctypes.CDLL("libm.so.6").fmaf
        except (OSError, AttributeError):
            pytest.skip("no libm fmaf to compare with")
    fmaf.argtypes = [ctypes.c_float] * 3
    fmaf.restype = ctypes.c_float
    rng = np.random.default_rng(7)
    n = 6000

    def few_bits(k, e_lo, e_hi):                 # short mantissas: many exact ties
        m = rng.integers(1, 1 << k, n).astype(np.float64) * rng.choice([-1.0, 1.0], n)
        return (m * 2.0 ** rng.integers(e_lo, e_hi, n)).astype(np.float32)

    a = np.concatenate([few_bits(12, -12, 12), rng.standard_normal(n).astype(np.float32),
                        few_bits(8, -80, -60)])
    b_ = np.concatenate([few_bits(12, -12, 12), rng.standard_normal(n).astype(np.float32),
                         few_bits(8, -80, -60)])
    c = np.concatenate([few_bits(24, -10, 10), rng.standard_normal(n).astype(np.float32),
                        few_bits(20, -150, -130)])
    got = fma32(a, b_, c)
    exp = np.array([fmaf(float(p), float(q), float(r)) for p, q, r in zip(a, b_, c)], np.float32)
    ok = same_bits(got, exp)
    assert ok.all(), f"fma model wrong for {np.flatnonzero(~ok)[:5]}"


@pytest.mark.parametrize("n_in", [1, 3, 7, 17, 63, 65, 768, 3071])
def test_sizes(variant, n_in):
    """Odd sizes, 1..5 tiles, ranges that do not start at 0, with and without bias."""
    dtype, runners = variant
    rng = np.random.default_rng(1000 + n_in)
    if n_in <= 65:
        cases = [(nt, tb, te) for nt in (1, 2, 3, 4, 5) for tb, te in ((0, nt), (nt // 2, nt), (1, nt - 1))
                 if tb < te]
    else:
        cases = [(5, 0, 5), (5, 1, 4), (3, 2, 3)]
    for k, (nt, tb, te) in enumerate(cases):
        wt, x, b = random_case(rng, dtype, n_in, nt, bias=k % 2 == 0)
        run_and_check(runners, wt, x, b, tb, te, seed=k)


def test_empty_range(variant):
    dtype, runners = variant
    rng = np.random.default_rng(5)
    wt, x, b = random_case(rng, dtype, 9, 3)
    for tb in (0, 2, 3):
        run_and_check(runners, wt, x, b, tb, tb)


def test_exact_integers(variant):
    """Small integers times powers of two: every product and partial sum is exact, so the result is
    the exact dot product whatever the order: this checks the arithmetic independently of the
    operation-order model."""
    dtype, runners = variant
    rng = np.random.default_rng(11)
    for n_in, nt, scale in ((768, 3, 2.0 ** -100), (333, 2, 2.0 ** 60), (64, 1, 1.0), (64, 5, 1.0)):
        # |w| <= 7 * 2^2, |x| <= 7 * 2^2 * scale, all multiples of 2^-4 * scale: |partial sums| stay
        # below 2^24 units of the grid for n_in <= 768 (768 * 49 * 16 * 16 < 2^24)
        W = (rng.integers(-7, 8, (nt * TILE, n_in)) * 2.0 ** rng.integers(-2, 3, (nt * TILE, n_in)))
        xi = rng.integers(-7, 8, n_in) * 2.0 ** rng.integers(-2, 3, n_in)
        W[:, ::5] = 0                                          # zero products mixed in
        b = (rng.integers(-100, 101, nt * TILE) * scale).astype(np.float32)
        exact = (W @ xi) * scale                               # exact in float64, and in fp32
        wt = tile_weights(W.astype(DTYPES[dtype]))
        x = (xi * scale).astype(np.float32)
        for bias in (b, None):
            exp = (exact + (bias if bias is not None else 0.0)) + 0.0     # -0 -> +0 like the kernel
            exp = exp.astype(np.float32)
            assert np.array_equal(exp.astype(np.float64), (exact + (bias if bias is not None else 0.0)))
            for run in runners:
                y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
                y = run(wt, x, bias, y0, 0, nt)
                assert np.array_equal(y.view(np.uint32), exp.view(np.uint32)), \
                    f"{run.name}: not the exact dot product ({np.flatnonzero(y != exp)[:8]})"


def test_signed_zeros(variant):
    """acc starts at +0.0 (SME2: ZA is zeroed): all-zero products (of either sign) give +0.0, also with
    b = -0.0."""
    dtype, runners = variant
    nt, n_in = 3, 5
    f = DTYPES[dtype]
    cases = [
        (np.zeros((nt, n_in, TILE), f), -np.ones(n_in, np.float32)),            # +0 * -1 = -0
        (np.full((nt, n_in, TILE), -0.0, f), np.ones(n_in, np.float32)),        # -0 * +1 = -0
        (np.full((nt, n_in, TILE), -0.0, f), np.full(n_in, -0.0, np.float32)),  # -0 * -0 = +0
        (np.ones((nt, n_in, TILE), f), np.full(n_in, -0.0, np.float32)),
    ]
    for wt, x in cases:
        for b in (None, np.full(nt * TILE, -0.0, np.float32), np.zeros(nt * TILE, np.float32)):
            for run in runners:
                y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
                y = run(wt, x, b, y0, 0, nt)
                assert np.all(y.view(np.uint32) == 0), f"{run.name}: expected +0.0, got {y[:4]}"
    # a sum that cancels exactly is +0.0 as well (round to nearest), even ending in -0 products
    wt = np.zeros((1, 3, TILE), f)
    wt[0, 0], wt[0, 1], wt[0, 2] = 1, -1, -0.0
    x = np.array([3, 3, 5], np.float32)
    run_and_check(runners, wt, x, None, 0, 1)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")   # the model widening NaN halves
def test_nan_inf_propagation(variant):
    """A NaN / inf weight reaches exactly its own output (SME2: whichever ZA vector and lane holds it,
    de-interleaved for fp16); a NaN / inf input reaches every output; a NaN bias its own output."""
    dtype, runners = variant
    rng = np.random.default_rng(3)
    nt, n_in = 5, 19
    wt, x, b = random_case(rng, dtype, n_in, nt)
    special = {}
    for t, i, j, v in ((0, 4, 7, np.nan), (1, 0, 63, np.inf), (1, 18, 0, -np.inf), (2, 3, 1, np.nan),
                       (3, 17, 33, np.inf), (4, 8, 62, -np.inf), (4, 2, 17, np.nan)):
        wt[t, i, j] = v
        special[TILE * t + j] = "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    wt[2, 9, 31] = np.inf                       # inf * 0 = NaN in this output only
    x[9] = 0.0
    special[TILE * 2 + 31] = "nan"
    wt[3, 10, 30], wt[3, 11, 30] = np.inf, -np.inf       # inf - inf = NaN
    special[TILE * 3 + 30] = "nan"
    x[0], x[18], x[17], x[8], x[10], x[11] = 1.5, 2.0, 0.5, 3.0, 1.0, 1.0
    for bias in (b, None):
        y = run_and_check(runners, wt, x, bias, 0, nt)[0]
        for o, kind in special.items():
            assert (np.isnan(y[o]) if kind == "nan" else y[o] == float(kind)), f"output {o}: {y[o]}, {kind}"
        rest = np.setdiff1d(np.arange(nt * TILE), list(special))
        assert np.isfinite(y[rest]).all(), "a special weight leaked into other outputs"

    # a NaN input: every output of the range is NaN; +inf: the sign of w, NaN where w == 0 (row 11, and
    # row 18 in the row tail: 19 = 4*4 + 3)
    wt, x, b = random_case(rng, dtype, n_in, nt)
    x[5] = np.nan
    y = run_and_check(runners, wt, x, b, 1, 4)[0]
    assert np.isnan(y[TILE:4 * TILE]).all()
    for row in (11, 18):
        wt, x, b = random_case(rng, dtype, n_in, nt)
        x[row] = np.inf
        wt[:, row, :8] = 0
        y = run_and_check(runners, wt, x, b, 0, nt)[0]
        w = wt[:, row, :].reshape(-1).astype(np.float32)
        assert np.isnan(y[w == 0]).all()
        assert (y[w > 0] == np.inf).all() and (y[w < 0] == -np.inf).all()
    # NaN weights in fp16 (payload bits) and quiet/signalling NaN inputs, a NaN bias
    wt, x, b = random_case(rng, dtype, n_in, nt)
    if dtype == "f16":
        wt.view(np.uint16)[0, 3, 5] = 0x7C01          # signalling NaN half
        wt.view(np.uint16)[0, 3, 6] = 0xFE00          # negative quiet NaN half
    else:
        wt.view(np.uint32)[0, 3, 5] = 0x7F800001
        wt.view(np.uint32)[0, 3, 6] = 0xFFC00000
    b[70] = np.nan
    y = run_and_check(runners, wt, x, b, 0, nt)[0]
    assert np.isnan(y[[5, 6, 70]]).all() and np.isfinite(np.delete(y, [5, 6, 70])).all()


def test_large_magnitudes(variant):
    """Partial sums that overflow to inf (and inf - inf = NaN) follow the contract's order exactly."""
    dtype, runners = variant
    rng = np.random.default_rng(4)
    nt, n_in = 3, 40
    if dtype == "f32":
        W = rng.standard_normal((nt * TILE, n_in)).astype(np.float32) * np.float32(3e37)
        x = rng.standard_normal(n_in).astype(np.float32) * np.float32(4)
    else:
        W = rng.uniform(-65504, 65504, (nt * TILE, n_in)).astype(np.float16)     # up to fp16 max
        x = rng.standard_normal(n_in).astype(np.float32) * np.float32(3e33)
    b = rng.uniform(-3e38, 3e38, nt * TILE).astype(np.float32)
    wt = tile_weights(W)
    for bias in (b, None):
        y = run_and_check(runners, wt, x, bias, 0, nt, f64=False)[0]
    assert np.isinf(y).any() or np.isnan(y).any(), "test meant to overflow some outputs"
    # exactly representable huge values that cancel: the fp32 chain overflows and must stay inf/NaN
    wt = np.zeros((1, 4, TILE), DTYPES[dtype])
    big = 60000.0 if dtype == "f16" else 3e38
    wt[0, :, :] = np.array([big, big, -big, -big])[:, None]
    x = np.full(4, 3e38 if dtype == "f16" else 1.0, np.float32) * np.float32(1.0 if dtype == "f32" else 1e-4)
    run_and_check(runners, wt, x, None, 0, 1, f64=False)


def test_denormals(variant):
    """No FTZ/DAZ (SME2: no flush to zero in ZA, in the fp16 widening or in the bias add): subnormal
    products, weights and inputs give exactly the IEEE result."""
    dtype, runners = variant
    rng = np.random.default_rng(6)
    nt, n_in = 3, 33
    if dtype == "f32":
        W = (rng.standard_normal((nt * TILE, n_in)) * 1e-20).astype(np.float32)
        W[:, 3] = (rng.standard_normal(nt * TILE) * 1e-40).astype(np.float32)     # subnormal weights
        x = (rng.standard_normal(n_in) * 1e-20).astype(np.float32)
        x[3] = 1.0
        x[4] = np.float32(2e-45)                                                # subnormal input
    else:
        W = (rng.standard_normal((nt * TILE, n_in)) * 1e-6).astype(np.float16)   # fp16 subnormals
        W[:, 3] = np.float16(2.0 ** -24)
        x = (rng.standard_normal(n_in) * 1e-33).astype(np.float32)
        x[4] = np.float32(2e-45)
    wt = tile_weights(W)
    b = (rng.standard_normal(nt * TILE) * 1e-39).astype(np.float32)
    for bias in (b, None):
        y = run_and_check(runners, wt, x, bias, 0, nt)[0]
    assert np.any((y != 0) & (np.abs(y) < np.finfo(np.float32).tiny)), "expected subnormal outputs"
    # a lone subnormal weight times 1.0 must come through unchanged (DAZ would zero it)
    wt = np.zeros((1, 1, TILE), DTYPES[dtype])
    wt[0, 0, :] = np.float32(1e-40) if dtype == "f32" else np.float16(2.0 ** -24)
    y = run_and_check(runners, wt, np.ones(1, np.float32), None, 0, 1)[0]
    assert (y == np.asarray(wt[0, 0], np.float32)).all() and (y != 0).all()


def test_cross_variant_bits():
    """AVX2 and AVX-512 (native or emulated) give bit-identical outputs, NaN payloads included."""
    lib = load_lib()
    have = cpu_isas(lib)
    for dtype in DTYPES:
        runs = []
        for isa in ISAS:
            if isa in have:
                runs.append(NativeRunner(lib, dtype, isa))
            elif isa == "avx512" and emulator()[0] is not None:
                runs.append(EmuRunner(emulator()[0], dtype, isa))
        if len({r.name.split(" ")[0] for r in runs}) < 2:
            pytest.skip(f"need both an AVX2 and an AVX-512 runner (have {[r.name for r in runs]})")
        rng = np.random.default_rng(8)
        for n_in, nt, tb, te in ((768, 5, 0, 5), (65, 3, 1, 3), (3, 4, 0, 3)):
            wt, x, b = random_case(rng, dtype, n_in, nt)
            wt.reshape(-1)[rng.integers(0, wt.size, 5)] = np.nan
            x[rng.integers(0, n_in)] = -np.inf if n_in > 3 else x[0]
            y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
            ys = [r(wt, x, b, y0, tb, te) for r in runs]
            for r, y in zip(runs[1:], ys[1:]):
                assert np.array_equal(ys[0].view(np.uint32), y.view(np.uint32)), \
                    f"{runs[0].name} and {r.name} differ at {np.flatnonzero(ys[0].view(np.uint32) != y.view(np.uint32))[:8]}"


def test_readbw_probe():
    """The benchmark's read-bandwidth probe returns the sum (all its loads happened)."""
    lib = load_lib()
    if "avx2" not in cpu_isas(lib) or not hasattr(lib, "gpt2asm_readbw_f32_avx2"):
        pytest.skip("no AVX2 or no gpt2asm_readbw_f32_avx2")
    for n in (0, 64, 64 * 37):
        g = Guarded(4 * n, 0, n).put(np.arange(n, dtype=np.float32) % 8)
        assert lib.gpt2asm_readbw_f32_avx2(g.addr, n) == float((np.arange(n) % 8).sum())
        g.check("gpt2asm_readbw_f32_avx2")


def test_fmapeak_probe():
    """The benchmark's FMA-peak probe: n rounds of fma(1, 1, acc) from +0 leave n in every chain."""
    lib = load_lib()
    if "avx2" not in cpu_isas(lib):
        pytest.skip("no AVX2")
    for n in (0, 1, 7, 1000, 1 << 24):
        assert lib.gpt2asm_fmapeak_f32_avx2(n) == float(n)


def test_fmapeak_probe_avx512():
    """The AVX-512 family's own FMA-peak probe (make bench's avx512 rows): the same n in every chain,
    natively where the CPU has AVX-512, else on the emulated CPU (tests/avx512emu.py)."""
    lib = load_lib()
    if "avx512" in cpu_isas(lib):
        for n in (0, 1, 7, 1000, 1 << 24):
            assert lib.gpt2asm_fmapeak_f32_avx512(n) == float(n)
        return
    emu, why = emulator()
    if emu is None:
        pytest.skip(f"no AVX-512 on this CPU and no emulator: {why}")
    for n in (0, 1, 7, 100):
        assert emu.call("gpt2asm_fmapeak_f32_avx512", n, ret="float") == float(n)


# ---- over-read checks with PROT_NONE guard pages, in a forked child (a fault must not kill pytest)

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [P, S, ctypes.c_int]


class PageFenced:
    """An anonymous mapping with PROT_NONE pages around a payload that ends exactly at (or starts
    exactly at) a page boundary."""

    def __init__(self, nbytes: int, at_end: bool):
        npages = -(-(nbytes + 64) // _PAGE) + 2
        self.map = mmap.mmap(-1, npages * _PAGE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        if at_end:
            self.off = (npages - 1) * _PAGE - nbytes
        else:
            self.off = _PAGE
        assert _libc.mprotect(self.base, _PAGE, 0) == 0
        assert _libc.mprotect(self.base + (npages - 1) * _PAGE, _PAGE, 0) == 0
        self.addr = self.base + self.off
        self.nbytes = nbytes

    def put(self, a):
        self.map[self.off:self.off + self.nbytes] = np.ascontiguousarray(a).tobytes()
        return self

    def get(self, dtype):
        return np.frombuffer(self.map[self.off:self.off + self.nbytes], dtype).copy()


def test_page_guards_overread():
    """Natively, in a child process: every variant with w (only the tiles of the range), x, b and y
    butting against PROT_NONE pages on either side.  Any over-read or over-write faults."""
    lib = load_lib()
    have = cpu_isas(lib)
    todo = [(d, i) for d, i in VARIANTS if i in have]
    if not todo:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(9)
    jobs = []
    for dtype, isa in todo:
        for n_in, nt, tb, te in ((1, 3, 1, 3), (7, 4, 2, 3), (65, 2, 0, 2), (770, 3, 1, 2)):
            wt, x, b = random_case(rng, dtype, n_in, nt)
            jobs.append((dtype, isa, wt, x, b, tb, te, contract_ref(wt, x, b, tb, te)))

    def child() -> bool:
        ok = True
        for dtype, isa, wt, x, b, tb, te, exp in jobs:
            fn = getattr(lib, symbol(dtype, isa))
            tile_bytes = wt[0].nbytes
            for at_end in (True, False):
                sub = np.ascontiguousarray(wt[tb:te])
                wg = PageFenced(max(sub.nbytes, 64), at_end).put(sub)  # tb..te-1 only
                xg = PageFenced(x.nbytes, at_end).put(x)
                bs = b[TILE * tb:TILE * te]
                bg = PageFenced(bs.nbytes, at_end).put(bs)
                yg = PageFenced(bs.nbytes, at_end)
                # pass pointers biased back to tile 0 / output 0: only [tb, te) may be touched
                fn(wg.addr - tb * tile_bytes, xg.addr, bg.addr - 4 * TILE * tb,
                   yg.addr - 4 * TILE * tb, wt.shape[1], tb, te)
                got = yg.get(np.float32)
                ok &= bool(same_bits(got, exp).all())
        return ok
    run_forked(child)


# --------------------------------------------------------------------------------------------------
# benchmark: python tests/test_kernels_matvec.py --bench

SHAPES_124M = [(768, 2304, "attn.c_attn"), (768, 768, "attn.c_proj"), (768, 3072, "mlp.c_fc"),
               (3072, 768, "mlp.c_proj"), (768, 50304, "lm_head")]


def readbw_baseline(lib, have):
    """gpt2asm_readbw_f32_avx2 (the plain streaming read every bandwidth benchmark is measured against), or
    None (said) when this CPU or library cannot run it."""
    readbw = getattr(lib, "gpt2asm_readbw_f32_avx2", None)
    if "avx2" not in have or readbw is None:
        print("need AVX2 and gpt2asm_readbw_f32_avx2 for the baseline")
        return None
    return readbw


def stream_buffers(chunk_mb: int, fill, nchunk: int = 4):
    """A page-aligned buffer of nchunk chunks of chunk_mb MB, every element of fill's dtype = fill (which
    faults the pages in), and next_chunk(): the address of the next chunk in rotation, so that no call
    finds its weights in a cache."""
    chunk = chunk_mb << 20
    raw = np.empty(nchunk * chunk + 4096, np.uint8)
    buf = raw[(-raw.ctypes.data) % 4096:][:nchunk * chunk]
    buf.view(np.asarray(fill).dtype)[:] = fill
    k = [0]

    def next_chunk():
        k[0] += 1
        return buf.ctypes.data + (k[0] % nchunk) * chunk
    return buf, next_chunk


def best_of(calls, reps: int, clock, rounds: int = 7) -> dict:
    """{name: the best over `rounds` of the mean seconds of `reps` calls of call()} for (name, call) in calls,
    the calls interleaved round by round."""
    best = {}
    for _ in range(rounds):
        for name, call in calls:
            t0 = clock()
            for _ in range(reps):
                call()
            best[name] = min(best.get(name, 1e9), (clock() - t0) / reps)
    return best


def interleaved(rounds: int, clock, ncopy: int, per: int, kernel, readbw, next_chunk):
    """Medians over `rounds` of (kernel seconds, plain-read seconds, read / kernel) per copy: each round
    runs kernel(p) and readbw(p, per // 4) on ncopy consecutive copies of `per` bytes of a fresh chunk,
    in alternating order, so that the noise of a shared machine hits both alike."""
    kern, read, ratio = [], [], []
    for r in range(rounds):
        def run_kernel():
            p = next_chunk()
            t0 = clock()
            for c in range(ncopy):
                kernel(p + c * per)
            return clock() - t0

        def run_read():
            p = next_chunk()
            t0 = clock()
            for c in range(ncopy):
                readbw(p + c * per, per // 4)
            return clock() - t0
        if r % 2:
            tk, tr = run_kernel(), run_read()
        else:
            tr, tk = run_read(), run_kernel()
        kern.append(tk / ncopy)
        read.append(tr / ncopy)
        ratio.append(tr / tk)
    return float(np.median(kern)), float(np.median(read)), float(np.median(ratio))


def bench_shapes(name: str, width: int, rounds: int, clock, chunk: int, nbytes, kernel, readbw, next_chunk):
    """Per GPT-2 124M shape (SHAPES_124M): kernel(p, n_in, n_tiles) streaming nbytes(n_in, n_out) bytes of
    weights at p, against readbw on the same bytes (interleaved), one printed row each.  Returns the
    per-token totals (12 x each layer matrix + the head) of kernel and read seconds."""
    tot_k = tot_r = 0.0
    for n_in, n_out, what in SHAPES_124M:
        nt = n_out // TILE
        per = nbytes(n_in, n_out)
        ncopy = max(1, (chunk // 2) // per)
        tk, tr, ratio = interleaved(rounds, clock, ncopy, per, lambda p: kernel(p, n_in, nt), readbw, next_chunk)
        mult = 1 if what == "lm_head" else 12
        tot_k += mult * tk
        tot_r += mult * tr
        print(f"{name:{width}s} {n_in:4d}x{n_out:<5d} {what:11s} {tk * 1e6:9.1f} "
              f"{per / tk / 1e9:7.2f} {per / tr / 1e9:10.2f} {ratio:6.3f}", flush=True)
    return tot_k, tot_r


def bench(rounds: int = 41, chunk_mb: int = 160) -> None:
    """GB/s of weight streaming per shape and variant, against a plain streaming read of the same
    bytes in calls of the same size (gpt2asm_readbw_f32_avx2), measured interleaved so that the
    noise of a shared machine hits both alike.  Each call reads weights that are not in any cache
    (a rotation over several buffers much larger than the L3)."""
    lib = load_lib()
    have = cpu_isas(lib)
    readbw = readbw_baseline(lib, have)
    if readbw is None:
        return
    chunk = chunk_mb << 20
    buf, next_chunk = stream_buffers(chunk_mb, np.float32(0.001))     # finite weights
    base = buf.ctypes.data
    x = np.full(3072, 0.5, np.float32)
    y = np.empty(50304, np.float32)
    xp, yp = x.ctypes.data, y.ctypes.data

    # numpy baseline (for reference only: it also pays numpy's summation arithmetic)
    t = []
    for _ in range(5):
        a = buf.view(np.float32)[:(chunk // 4) * 3]
        t0 = time.perf_counter()
        np.add.reduce(a)
        t.append(time.perf_counter() - t0)
    np_bw = a.nbytes / min(t) / 1e9
    t = []
    for _ in range(5):
        t0 = time.perf_counter()
        readbw(base, (chunk // 4) * 3)
        t.append(time.perf_counter() - t0)
    print(f"plain read, one {3 * chunk_mb} MB call:  gpt2asm_readbw_f32_avx2 {a.nbytes / min(t) / 1e9:6.2f} GB/s"
          f"   numpy add.reduce {np_bw:6.2f} GB/s   (best of 5)")
    print(f"{'variant':26s} {'shape':22s} {'us/call':>9s} {'GB/s':>7s} {'read GB/s':>10s} {'ratio':>6s}"
          f"  (medians of {rounds} interleaved rounds)")
    for isa in ISAS:
        if isa not in have:
            print(f"{isa}: not on this CPU, skipped")
            continue
        for dtype, es in (("f32", 4), ("f16", 2)):
            fn = getattr(lib, symbol(dtype, isa))
            bench_shapes(symbol(dtype, isa), 26, rounds, time.perf_counter, chunk, lambda i, o, es=es: i * o * es,
                         lambda p, n_in, nt, fn=fn: fn(p, xp, None, yp, n_in, 0, nt), readbw, next_chunk)


if __name__ == "__main__":
    if "--bench" in sys.argv[1:]:
        args = sys.argv[1:]
        bench(int(args[args.index("--rounds") + 1]) if "--rounds" in args else 41)
    else:
        sys.exit(pytest.main([__file__, *sys.argv[1:]]))
