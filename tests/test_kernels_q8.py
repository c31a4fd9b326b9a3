"""checkasm-style tests (and a benchmark) for the int8 weight-only matvec kernels and the quantiser.

    gpt2asm_matvec_q8_{avx2,avx512}                         (docs/kernels.md, gpt2asm_matvec_q8)
    gpt2asm.quant: quantize_q8, quantize_q8_head, dequantize_q8

Every variant the CPU has runs natively; the AVX-512 one also runs under tests/avx512emu.py (an emulated
AVX-512 CPU) when that is available.  Each call is checked against

  * the contract itself, bit for bit: `contract_ref` replays the documented per-output sequence
    acc = +0.0; acc = fma((float)q, x[i], acc) ...; p = acc * scale; y = p + b with the exact binary32
    FMA model of tests/test_kernels_matvec.py, so every ISA must reproduce it exactly, NaN-ness included;
  * a float64 reference ((Q @ x) * scale + b) within the error bound of the fp32 chain;
  * its memory contract: every buffer sits between 4 KiB of canary bytes, scale, x, b and y misaligned,
    outputs outside the tile range untouched, inputs unchanged; natively, a forked child also runs the
    kernels with every buffer butting against PROT_NONE pages (any over-read faults); under the
    emulator the weights hold only tiles 0 .. tile_end-1 and every array ends at an unmapped page.

The quantiser is checked against an independent float64 formulation of the same float32 arithmetic,
for determinism, layout, padding and special columns, and end to end (quantise, run the kernel,
compare with float64 W @ x).

Run:  pytest tests/test_kernels_q8.py
      python tests/test_kernels_q8.py --bench [--rounds N] [--wall]   (GB/s on the GPT-2 124M shapes)
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import test_kernels_matvec as mv                                     # noqa: E402
from test_kernels_matvec import (TILE, Y_FILL, Guarded, PageFenced, cpu_isas, fma32,  # noqa: E402
                                 same_bits)
from forked import run_forked                                        # noqa: E402

ISAS = ("avx2", "avx512")
P, S = ctypes.c_void_p, ctypes.c_size_t


def symbol(isa: str) -> str:
    return f"gpt2asm_matvec_q8_{isa}"


def load_lib() -> ctypes.CDLL:
    lib = mv.load_lib()                  # builds the library once per session, binds cpuid & co.
    for isa in ISAS:
        fn = getattr(lib, symbol(isa))
        fn.argtypes = [P, P, P, P, P, S, S, S]
        fn.restype = None
    return lib


# --------------------------------------------------------------------------------------------------
# runners: call one variant on (wt, scale, x, b, y0) and return the new y, checking the memory contract

class NativeRunner:
    def __init__(self, lib, isa: str):
        self.fn = getattr(lib, symbol(isa))
        self.name = f"{symbol(isa)} (native)"

    def __call__(self, wt, scale, x, b, y0, tb, te, *, seed=0):
        n_in = wt.shape[1]
        mis = 4 * (1 + seed % 15)                                     # 4 .. 60 bytes past a line
        w = Guarded(wt.nbytes, 0, seed).put(wt)                       # w must be aligned
        sg = Guarded(scale.nbytes, mis, seed + 1).put(scale)
        xg = Guarded(x.nbytes, (mis + 8) % 64, seed + 2).put(x)
        bg = Guarded(b.nbytes, (mis + 20) % 64, seed + 3).put(b) if b is not None else None
        yg = Guarded(y0.nbytes, (mis + 36) % 64, seed + 4).put(y0)
        self.fn(w.addr, sg.addr, xg.addr, bg.addr if bg else None, yg.addr, n_in, tb, te)
        mv.check_guarded(self.name, ((w, wt, "w"), (sg, scale, "scale"), (xg, x, "x"), (bg, b, "b"),
                                     (yg, None, "y")))
        return yg.get(np.float32)


class EmuRunner:
    """The AVX-512 variant on the emulated CPU (copy mode): inputs read-only, every array 64-byte aligned
    and ending at an unmapped page; w holds only tiles 0 .. te-1, so reading past tile te-1 faults."""

    def __init__(self, emu, isa: str):
        self.emu, self.sym = emu, symbol(isa)
        self.name = f"{self.sym} (emulated)"

    def __call__(self, wt, scale, x, b, y0, tb, te, *, seed=0):
        n_in = wt.shape[1]
        w = np.array(wt[:max(te, 1)])
        scale, x = np.array(scale), np.array(x)
        b = np.array(b) if b is not None else None
        for a in (w, scale, x, b):
            if a is not None:
                a.flags.writeable = False
        y = y0.copy()
        self.emu.call(self.sym, w, scale, x, b, y, n_in, tb, te, ret=None)
        return y


def runners_for(isa: str):
    lib = load_lib()
    out = []
    if isa in cpu_isas(lib):
        out.append(NativeRunner(lib, isa))
    if isa == "avx512":
        emu, why = mv.emulator()
        if emu is not None:
            out.append(EmuRunner(emu, isa))
        elif not out:
            pytest.skip(f"no AVX-512 on this CPU and no emulator: {why}")
    elif not out:
        pytest.skip(f"CPU lacks {isa}")
    return out


@pytest.fixture(scope="module", params=ISAS)
def runners(request):
    return runners_for(request.param)


# --------------------------------------------------------------------------------------------------
# references

def contract_ref(wt, scale, x, b, tb, te) -> np.ndarray:
    """The documented operation sequence for outputs 64*tb .. 64*te-1, exactly (binary32)."""
    w = np.asarray(wt[tb:te], np.float32)                   # int8 -> float32 is exact
    acc = np.zeros((te - tb) * TILE, np.float32)             # +0.0
    for i in range(w.shape[1]):
        acc = fma32(w[:, i, :].reshape(-1), x[i], acc)
    with np.errstate(all="ignore"):
        p = acc * scale[TILE * tb:TILE * te]                 # one binary32 multiply
        if b is not None:
            p = p + b[TILE * tb:TILE * te]                   # one binary32 add
    return p


def f64_check(wt, scale, x, b, tb, te, got, name, factor=2.0):
    """float64 (Q @ x) * scale + b within the error bound of the fp32 FMA chain and the 2 roundings."""
    with np.errstate(all="ignore"):
        Q = mv.untile(np.asarray(wt[tb:te], np.float64))
        x64 = x.astype(np.float64)
        s = scale[TILE * tb:TILE * te].astype(np.float64)
        ref = (Q @ x64) * s
        mag = (np.abs(Q) @ np.abs(x64)) * np.abs(s)
        if b is not None:
            ref = ref + b[TILE * tb:TILE * te]
            mag = mag + np.abs(b[TILE * tb:TILE * te])
        n = Q.shape[1] + 2
        tol = factor * (n * 2.0 ** -24 * mag + n * 2.0 ** -149 * np.maximum(1.0, np.abs(s)))
        fin = np.isfinite(ref) & (mag < 3e38) & ((np.abs(Q) @ np.abs(x64)) < 3e38)
        bad = fin & ~(np.abs(got.astype(np.float64) - ref) <= tol)
    assert not bad.any(), (f"{name}: |y - (Q@x)*s - b| > bound at outputs {np.flatnonzero(bad)[:8] + TILE * tb}: "
                           f"got {got[bad][:4]}, ref {ref[bad][:4]}, tol {tol[bad][:4]}")


def run_and_check(runners, wt, scale, x, b, tb, te, *, f64=True, seed=0) -> list[np.ndarray]:
    nt = wt.shape[0]
    y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
    exp = contract_ref(wt, scale, x, b, tb, te)
    outs = []
    for run in runners:
        y = run(wt, scale, x, b, y0, tb, te, seed=seed)
        lo, hi = TILE * tb, TILE * te
        outside = np.r_[0:lo, hi:nt * TILE]
        assert np.all(y.view(np.uint32)[outside] == Y_FILL), f"{run.name}: wrote outputs outside tiles [{tb}, {te})"
        got = y[lo:hi]
        ok = same_bits(got, exp)
        assert ok.all(), (f"{run.name}: differs from the contract's operation order at outputs "
                          f"{np.flatnonzero(~ok)[:8] + lo}: got {got[~ok][:4]} expected {exp[~ok][:4]}")
        if f64:
            f64_check(wt, scale, x, b, tb, te, got, run.name)
        outs.append(y)
    return outs


def random_case(rng, n_in, nt, bias=True, full_range=True):
    """Random int8 tiles (the full range -128..127, which the kernel accepts, when full_range), a
    GPT-2-like scale per output, x and b."""
    lo = -128 if full_range else -127
    wt = rng.integers(lo, 128, (nt, n_in, TILE)).astype(np.int8)
    scale = (rng.random(nt * TILE) * 2e-3 + 1e-4).astype(np.float32)
    x = rng.standard_normal(n_in).astype(np.float32)
    b = rng.standard_normal(nt * TILE).astype(np.float32) if bias else None
    return wt, scale, x, b


# --------------------------------------------------------------------------------------------------
# kernel tests

@pytest.mark.parametrize("n_in", [1, 2, 3, 4, 5, 7, 17, 63, 65, 768, 3071])
def test_sizes(runners, n_in):
    """Odd sizes, 1..5 tiles, ranges that do not start at 0, with and without bias."""
    rng = np.random.default_rng(2000 + n_in)
    if n_in <= 65:
        cases = [(nt, tb, te) for nt in (1, 2, 3, 4, 5) for tb, te in ((0, nt), (nt // 2, nt), (1, nt - 1))
                 if tb < te]
    else:
        cases = [(5, 0, 5), (5, 1, 4), (3, 2, 3), (4, 1, 3)]
    for k, (nt, tb, te) in enumerate(cases):
        wt, scale, x, b = random_case(rng, n_in, nt, bias=k % 2 == 0, full_range=k % 3 != 0)
        run_and_check(runners, wt, scale, x, b, tb, te, seed=k)


def test_empty_range(runners):
    rng = np.random.default_rng(5)
    wt, scale, x, b = random_case(rng, 9, 3)
    for tb in (0, 2, 3):
        run_and_check(runners, wt, scale, x, b, tb, tb)


def test_exact_integers(runners):
    """Small integer products with power-of-two x and scale: every partial sum, the product with the
    scale and the bias add are exact, so y is the exact value whatever the order."""
    rng = np.random.default_rng(11)
    for n_in, nt, sx, ss in ((768, 3, 2.0 ** -60, 2.0 ** -10), (333, 2, 2.0 ** 40, 2.0 ** 3), (64, 1, 1.0, 1.0)):
        Q = rng.integers(-128, 128, (nt * TILE, n_in))
        xi = rng.integers(-15, 16, n_in)
        Q[:, ::7] = 0
        exact = (Q @ xi).astype(np.float64)                   # |.| < 768*128*15 < 2^24: exact in fp32
        s = np.float64(ss) * 2.0 ** rng.integers(-3, 4, nt * TILE)
        b = (rng.integers(-1000, 1001, nt * TILE) * sx * ss).astype(np.float32)
        wt = mv.tile_weights(Q.astype(np.int8))
        x = (xi * sx).astype(np.float32)
        scale = s.astype(np.float32)
        for bias in (b, None):
            ref = exact * sx * s + (bias.astype(np.float64) if bias is not None else 0.0)
            exp = (ref + 0.0).astype(np.float32)               # -0 -> +0 like the kernel (acc = +0)
            assert np.array_equal(exp.astype(np.float64), ref)
            for run in runners:
                y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
                y = run(wt, scale, x, bias, y0, 0, nt)
                ok = same_bits(y, exp)
                assert ok.all(), f"{run.name}: not the exact value ({np.flatnonzero(~ok)[:8]})"


def test_signed_zeros(runners):
    """acc starts at +0.0; p = acc * scale takes the sign of the scale; y = p + b (IEEE signed zeros)."""
    nt, n_in = 2, 5
    for q, x in ((np.zeros((nt, n_in, TILE), np.int8), -np.ones(n_in, np.float32)),
                 (np.ones((nt, n_in, TILE), np.int8), np.full(n_in, -0.0, np.float32)),
                 (-np.ones((nt, n_in, TILE), np.int8), np.zeros(n_in, np.float32))):
        for scale in (np.ones(nt * TILE, np.float32), -np.ones(nt * TILE, np.float32),
                      np.zeros(nt * TILE, np.float32), np.full(nt * TILE, -0.0, np.float32)):
            for b in (None, np.full(nt * TILE, -0.0, np.float32), np.zeros(nt * TILE, np.float32)):
                ys = run_and_check(runners, q, scale, x, b, 0, nt)
                neg = np.signbit(scale[0]) and (b is None or np.signbit(b[0]))
                for y in ys:
                    assert np.all(y == 0) and np.all(np.signbit(y) == neg), (scale[0], None if b is None else b[0], y[:2])


def test_nan_inf_propagation(runners):
    """A NaN/inf x reaches every output (NaN where q = 0 times inf); a NaN/inf scale or bias only its own
    output; inf * 0 in the epilogue gives NaN."""
    rng = np.random.default_rng(3)
    nt, n_in = 3, 19
    wt, scale, x, b = random_case(rng, n_in, nt)
    x[5] = np.nan
    y = run_and_check(runners, wt, scale, x, b, 1, 3)[0]
    assert np.isnan(y[64:192]).all()
    wt, scale, x, b = random_case(rng, n_in, nt)
    x[11] = np.inf
    wt[:, 11, :8] = 0
    y = run_and_check(runners, wt, scale, x, b, 0, nt)[0]
    q11 = wt[:, 11, :].reshape(-1)
    assert np.isnan(y[q11 == 0]).all()
    assert (y[q11 > 0] == np.inf).all() and (y[q11 < 0] == -np.inf).all()
    # special scales / biases: only their own output
    wt, scale, x, b = random_case(rng, n_in, nt)
    scale.view(np.uint32)[3] = 0x7FC00001                       # quiet NaN
    scale.view(np.uint32)[4] = 0x7F800001                       # signalling NaN
    scale[70] = np.inf
    scale[71] = -np.inf
    b[130] = np.nan
    b[131] = -np.inf
    wt[1, :, 72 - 64] = 0                                       # acc = 0 ...
    scale[72] = np.inf                                          # ... * inf = NaN
    y = run_and_check(runners, wt, scale, x, b, 0, nt)[0]
    special = [3, 4, 70, 71, 72, 130, 131]
    assert np.isnan(y[[3, 4, 72, 130]]).all() and y[131] == -np.inf and np.isinf(y[70]) and np.isinf(y[71])
    assert np.isfinite(np.delete(y, special)).all(), "a special scale/bias leaked into other outputs"
    y = run_and_check(runners, wt, scale, x, None, 0, nt)[0]
    assert np.isfinite(np.delete(y, [3, 4, 70, 71, 72])).all()


def test_large_magnitudes(runners):
    """Partial sums that overflow to inf (and inf - inf = NaN) and products acc * scale that overflow
    follow the contract's order exactly."""
    rng = np.random.default_rng(4)
    nt, n_in = 2, 40
    wt, scale, x, b = random_case(rng, n_in, nt)
    x = (rng.standard_normal(n_in) * 2e36).astype(np.float32)
    scale = rng.uniform(-4, 4, nt * TILE).astype(np.float32)
    b = rng.uniform(-3e38, 3e38, nt * TILE).astype(np.float32)
    for bias in (b, None):
        y = run_and_check(runners, wt, scale, x, bias, 0, nt, f64=False)[0]
    assert np.isinf(y).any() or np.isnan(y).any(), "test meant to overflow some outputs"
    # finite sums, products acc * scale that overflow
    wt, scale, x, b = random_case(rng, n_in, nt)
    scale = (rng.random(nt * TILE) * 3e37).astype(np.float32)
    y = run_and_check(runners, wt, scale, x, None, 0, nt, f64=False)[0]
    assert np.isinf(y).any()
    # huge values that cancel exactly in exact arithmetic but overflow in the chain
    wt = np.zeros((1, 4, TILE), np.int8)
    wt[0] = np.array([127, 127, -127, -127], np.int8)[:, None]
    x = np.full(4, 3e38, np.float32)
    run_and_check(runners, wt, np.ones(TILE, np.float32), x, None, 0, 1, f64=False)


def test_denormals(runners):
    """No FTZ/DAZ: subnormal inputs, partial sums, scales and products give exactly the IEEE result."""
    rng = np.random.default_rng(6)
    nt, n_in = 2, 33
    wt, scale, x, b = random_case(rng, n_in, nt)
    x = (rng.standard_normal(n_in) * 1e-41).astype(np.float32)      # subnormal x, subnormal sums
    x[3] = np.float32(1.4e-45)
    b = (rng.standard_normal(nt * TILE) * 1e-39).astype(np.float32)
    for bias in (b, None):
        y = run_and_check(runners, wt, np.ones(nt * TILE, np.float32), x, bias, 0, nt)[0]
    assert np.any((y != 0) & (np.abs(y) < np.finfo(np.float32).tiny)), "expected subnormal outputs"
    # normal sums times subnormal scales (the product rounds in the subnormal range)
    wt, scale, x, b = random_case(rng, n_in, nt)
    scale = (rng.random(nt * TILE) * 1e-39).astype(np.float32)
    y = run_and_check(runners, wt, scale, x, None, 0, nt)[0]
    assert np.any((y != 0) & (np.abs(y) < np.finfo(np.float32).tiny))
    # a lone q = 1 times a subnormal x, scale 1: the subnormal comes through (DAZ would zero it)
    wt = np.ones((1, 1, TILE), np.int8)
    y = run_and_check(runners, wt, np.ones(TILE, np.float32), np.full(1, 1e-40, np.float32), None, 0, 1)[0]
    assert (y == np.float32(1e-40)).all()


def test_cross_variant_bits():
    """AVX2 and AVX-512 (native or emulated) give bit-identical outputs, NaN payloads included."""
    lib = load_lib()
    have = cpu_isas(lib)
    runs = []
    for isa in ISAS:
        if isa in have:
            runs.append(NativeRunner(lib, isa))
        elif isa == "avx512" and mv.emulator()[0] is not None:
            runs.append(EmuRunner(mv.emulator()[0], isa))
    if len({r.name.split(" ")[0] for r in runs}) < 2:
        pytest.skip(f"need both an AVX2 and an AVX-512 runner (have {[r.name for r in runs]})")
    rng = np.random.default_rng(8)
    for n_in, nt, tb, te in ((768, 5, 0, 5), (65, 3, 1, 3), (3, 4, 0, 3), (130, 1, 0, 1)):
        wt, scale, x, b = random_case(rng, n_in, nt)
        scale.view(np.uint32)[rng.integers(0, scale.size, 3)] = rng.integers(0x7F800001, 0x7FFFFFFF, 3)
        b.view(np.uint32)[rng.integers(0, b.size, 3)] = rng.integers(0xFF800001, 0xFFFFFFFF, 3).astype(np.uint32)
        if n_in > 3:
            x[rng.integers(0, n_in)] = -np.inf
        y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
        ys = [r(wt, scale, x, b, y0, tb, te) for r in runs]
        for r, y in zip(runs[1:], ys[1:]):
            diff = np.flatnonzero(ys[0].view(np.uint32) != y.view(np.uint32))
            assert diff.size == 0, f"{runs[0].name} and {r.name} differ at {diff[:8]}"


def test_page_guards_overread():
    """Natively, in a child process: w (only the tiles of the range), scale, x, b and y butting against
    PROT_NONE pages on either side.  Any over-read or over-write faults."""
    lib = load_lib()
    todo = [isa for isa in ISAS if isa in cpu_isas(lib)]
    if not todo:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(9)
    jobs = []
    for isa in todo:
        for n_in, nt, tb, te in ((1, 3, 1, 3), (7, 4, 2, 3), (65, 2, 0, 2), (770, 3, 1, 2), (5, 5, 0, 5)):
            wt, scale, x, b = random_case(rng, n_in, nt)
            jobs.append((isa, wt, scale, x, b, tb, te, contract_ref(wt, scale, x, b, tb, te)))

    def child() -> bool:
        ok = True
        for isa, wt, scale, x, b, tb, te, exp in jobs:
            fn = getattr(lib, symbol(isa))
            tile_bytes = wt[0].nbytes
            for at_end in (True, False):
                sub = np.ascontiguousarray(wt[tb:te])
                wg = PageFenced(max(sub.nbytes, 64), at_end).put(sub)
                xg = PageFenced(x.nbytes, at_end).put(x)
                ss = scale[TILE * tb:TILE * te]
                sg = PageFenced(ss.nbytes, at_end).put(ss)
                bs = b[TILE * tb:TILE * te]
                bg = PageFenced(bs.nbytes, at_end).put(bs)
                yg = PageFenced(bs.nbytes, at_end)
                fn(wg.addr - tb * tile_bytes, sg.addr - 4 * TILE * tb, xg.addr, bg.addr - 4 * TILE * tb,
                   yg.addr - 4 * TILE * tb, wt.shape[1], tb, te)
                ok &= bool(same_bits(yg.get(np.float32), exp).all())
        return ok
    run_forked(child)


AVX512F_OK = {  # every mnemonic the AVX-512 kernels may use: AVX-512F (zmm only) and plain x86-64
    "vpmovsxbd", "vcvtdq2ps", "vcvtph2ps", "vfmadd231ps", "vbroadcastss", "vmulps", "vaddps", "vmovups",
    "vpxord", "vzeroupper"}


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
    bad = avx512f_only(mv.LIB_PATH, {symbol("avx512")})
    assert not bad, "non-AVX-512F instructions: " + "; ".join(bad[:5])


# --------------------------------------------------------------------------------------------------
# the quantiser

def quant():
    from gpt2asm import quant as q
    return q


def ref_quantize(W):
    """Independent formulation: float64 arithmetic, rounded to float32 where the contract rounds (a
    float64 quotient rounded to float32 is the correctly rounded float32 quotient)."""
    W32 = np.asarray(W, np.float32)
    W64 = W32.astype(np.float64)
    amax = np.abs(W64).max(axis=0)
    scale = (amax / 127.0).astype(np.float32)
    with np.errstate(all="ignore"):
        ratio = (W64 / scale.astype(np.float64)[None, :]).astype(np.float32)
    q = np.clip(np.rint(ratio.astype(np.float64)), -127, 127)
    q[:, scale == 0] = 0
    return q.astype(np.int8), scale


def test_quantize_matches_reference():
    q = quant()
    rng = np.random.default_rng(21)
    for n_in, n_out, dt in ((768, 2304, np.float32), (65, 100, np.float16), (3, 1, np.float64),
                            (300, 64 * 17 + 5, np.float32)):
        W = (rng.standard_normal((n_in, n_out)) * rng.uniform(1e-3, 10, n_out)).astype(dt)
        W[:, ::11] *= 1e-30                                     # float16: all-zero columns
        if n_in > 3:                                            # exact ties W/scale = k + 1/2: to even
            W[:, 1::5] = rng.uniform(-0.3, 0.3, (n_in, W[:, 1::5].shape[1])) * 2.0 ** -7
            W[0, 1::5] = 127 * 2.0 ** -7                        # the max: scale = 2^-7 exactly
            W[1, 1::5] = 63.5 * 2.0 ** -7                       # -> 64
            W[2, 1::5] = -62.5 * 2.0 ** -7                      # -> -62
            W[3, 1::5] = -0.5 * 2.0 ** -7                       # -> 0
        qt, st = q.quantize_q8(W)
        nt = -(-n_out // TILE)
        assert qt.shape == (nt, n_in, TILE) and qt.dtype == np.int8 and st.shape == (nt * TILE,)
        assert st.dtype == np.float32 and qt.ctypes.data % 64 == 0 and st.ctypes.data % 64 == 0
        assert qt.flags.c_contiguous and st.flags.c_contiguous
        qr, sr = ref_quantize(W)
        Q = mv.untile(qt)
        assert np.array_equal(Q[:n_out].T, qr), "q differs from the reference"
        assert np.array_equal(st[:n_out].view(np.uint32), sr.view(np.uint32)), "scale differs"
        assert not Q[n_out:].any() and not st[n_out:].any(), "padding must be q = 0, scale = 0"
        amax_q = np.abs(Q[:n_out].astype(np.int16)).max(axis=1)
        assert (amax_q[st[:n_out] != 0] == 127).all() and (amax_q[st[:n_out] == 0] == 0).all()
        assert Q.min() >= -127
        if n_in > 3:
            assert (st[1:n_out:5] == 2.0 ** -7).all()
            assert (Q[1:n_out:5, 1] == 64).all() and (Q[1:n_out:5, 2] == -62).all() and (Q[1:n_out:5, 3] == 0).all()
        # the effective weights are within scale/2 (and a float32 rounding) of W
        D = q.dequantize_q8(qt, st)[:n_out].astype(np.float64)
        err = np.abs(D - np.asarray(W, np.float32).T.astype(np.float64))
        assert (err <= st[:n_out, None] * (0.5 + 2.0 ** -16)).all()
        # deterministic
        qt2, st2 = q.quantize_q8(W.copy())
        assert np.array_equal(qt, qt2) and np.array_equal(st.view(np.uint32), st2.view(np.uint32))


def test_quantize_head_is_transpose():
    q = quant()
    rng = np.random.default_rng(22)
    E = (rng.standard_normal((64 * 40 + 17, 96)) * 0.02).astype(np.float32)
    E[5] = 0
    qh, sh = q.quantize_q8_head(E)
    qt, st = q.quantize_q8(np.ascontiguousarray(E.T))
    assert qh.shape == qt.shape and np.array_equal(qh, qt)
    assert np.array_equal(sh.view(np.uint32), st.view(np.uint32))
    assert qh.ctypes.data % 64 == 0 and sh.ctypes.data % 64 == 0
    assert sh[5] == 0 and not qh[0, :, 5].any()


def test_quantize_special_columns():
    q = quant()
    W = np.zeros((10, 70), np.float32)
    W[:, 1] = np.float32(1e-44)                 # scale underflows to 0: q = 0, scale 0
    W[:, 2] = np.float32(1e-39)                 # subnormal weights, subnormal scale
    W[3, 3] = -2.0                              # one weight: q = -127 exactly
    W[:, 4] = np.linspace(-1, 1, 10)
    W[0, 5] = np.float32(3e38)                  # huge
    qt, st = q.quantize_q8(W)
    Q = mv.untile(qt)
    assert st[0] == 0 and not Q[0].any()
    assert st[1] == 0 and not Q[1].any()
    assert st[2] > 0 and np.abs(Q[2]).max() == 127
    assert Q[3, 3] == -127 and st[3] == np.float32(2.0) / np.float32(127)
    assert Q[4, 0] == -127 and Q[4, 9] == 127
    assert Q[5, 0] == 127 and np.isfinite(st[5])
    assert not Q[70:].any() and not st[70:].any()
    qr, sr = ref_quantize(W)
    assert np.array_equal(Q[:70].T, qr) and np.array_equal(st[:70], sr)


def test_quantize_rejects_bad_input():
    q = quant()
    from gpt2asm.errors import InvalidArgumentError
    for bad in (np.array([[1.0, np.nan]], np.float32), np.array([[np.inf]], np.float32),
                np.zeros(5, np.float32), np.zeros((3, 4), np.int32), np.zeros((0, 4), np.float32),
                np.zeros((4, 0), np.float32)):
        with pytest.raises(InvalidArgumentError):
            q.quantize_q8(bad)
        if bad.ndim == 2:
            with pytest.raises(InvalidArgumentError):
                q.quantize_q8_head(bad)


def test_quantized_end_to_end(runners):
    """quantize_q8 -> kernel vs float64 W @ x: within the quantisation error sum_i |x_i| * scale/2
    (plus fp32 rounding), and bit-exact to the contract."""
    q = quant()
    rng = np.random.default_rng(23)
    n_in, n_out = 200, 64 * 3 - 7
    W = (rng.standard_normal((n_in, n_out)) * 0.02).astype(np.float32)
    bias = (rng.standard_normal(n_out) * 0.1).astype(np.float32)
    qt, st = q.quantize_q8(W)
    nt = qt.shape[0]
    b = np.zeros(nt * TILE, np.float32)
    b[:n_out] = bias
    x = rng.standard_normal(n_in).astype(np.float32)
    y = run_and_check(runners, qt, st, x, b, 0, nt)[0]
    ref = x.astype(np.float64) @ W.astype(np.float64) + bias
    bound = np.abs(x).astype(np.float64).sum() * st[:n_out] * (0.5 + 1e-4) + 1e-5 * (np.abs(ref) + 1)
    err = np.abs(y[:n_out] - ref)
    assert (err <= bound).all()
    assert (y[n_out:] == 0).all()                # padded outputs: scale 0, bias 0


# --------------------------------------------------------------------------------------------------
# benchmark: python tests/test_kernels_q8.py --bench

SHAPES_124M = mv.SHAPES_124M


def bench(rounds: int = 21, chunk_mb: int = 160, wall: bool = False) -> None:
    """GB/s of int8 weight streaming per shape, against a plain streaming read of the same bytes in
    calls of the same size (gpt2asm_readbw_f32_avx2), interleaved so the noise of a shared machine hits
    both alike; every call reads weights that are in no cache (rotation over 4 x chunk_mb MB).  Then the
    same in-cache (one matrix, repeated), which shows the kernel's own ceiling.  Times are the calling
    thread's CPU time (time.thread_time: time-slicing by other processes on a shared machine is not
    counted; their memory traffic still is), or wall time with --wall."""
    clock = time.perf_counter if wall else time.thread_time
    lib = load_lib()
    have = cpu_isas(lib)
    readbw = mv.readbw_baseline(lib, have)
    if readbw is None:
        return
    chunk = chunk_mb << 20
    buf, next_chunk = mv.stream_buffers(chunk_mb, np.uint8(3))   # int8 weights 3; as floats: tiny, finite
    base = buf.ctypes.data
    x = np.full(3072, 0.5, np.float32)
    y = np.empty(50304, np.float32)
    sc = np.full(50304, 0.01, np.float32)
    xp, yp, sp = x.ctypes.data, y.ctypes.data, sc.ctypes.data

    print(f"{'variant':26s} {'shape':22s} {'us/call':>9s} {'GB/s':>7s} {'read GB/s':>10s} {'ratio':>6s}"
          f"  (medians of {rounds} interleaved rounds; weights not in cache; "
          f"{'wall' if wall else 'thread CPU'} time)")
    per_token = {}
    for isa in ISAS:
        if isa not in have:
            print(f"{isa}: not on this CPU, skipped")
            continue
        fn = getattr(lib, symbol(isa))
        tot_k, tot_r = mv.bench_shapes(symbol(isa), 26, rounds, clock, chunk, lambda i, o: i * o,
                                       lambda p, n_in, nt: fn(p, sp, xp, None, yp, n_in, 0, nt), readbw, next_chunk)
        per_token[isa] = (tot_k, tot_r)
        print(f"  124M, 12 layers + head, int8 weights per token {sum((1 if w == 'lm_head' else 12) * a * b_ for a, b_, w in SHAPES_124M) / 1e6:.1f} MB: "
              f"matvecs {tot_k * 1e3:.2f} ms/token ({1 / tot_k:.0f} tok/s ceiling), plain read {tot_r * 1e3:.2f} ms "
              f"({1 / tot_r:.0f} tok/s), ratio {tot_r / tot_k:.3f}")
    # in cache: the kernel's own ceiling (one L2-sized matrix, repeated)
    if "avx2" in have:
        n_in, nt = 768, 12
        per = n_in * nt * TILE
        reps = 200
        best = mv.best_of((("q8", lambda: lib.gpt2asm_matvec_q8_avx2(base, sp, xp, None, yp, n_in, 0, nt)),
                           ("read", lambda: readbw(base, per // 4))), reps, clock)
        print(f"in L2 ({per >> 10} KiB, best of 7 x {reps} calls, includes ~1-4 us of ctypes per call): "
              f"gpt2asm_matvec_q8_avx2 {per / best['q8'] / 1e9:.2f} GB/s, read {per / best['read'] / 1e9:.2f} GB/s")


if __name__ == "__main__":
    if "--bench" in sys.argv[1:]:
        args = sys.argv[1:]
        bench(int(args[args.index("--rounds") + 1]) if "--rounds" in args else 21, wall="--wall" in args)
    else:
        sys.exit(pytest.main([__file__, *sys.argv[1:]]))
