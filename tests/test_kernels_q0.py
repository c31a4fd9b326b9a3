"""checkasm-style tests (and a benchmark) for the q8_0 / q4_0 integer kernels (docs/kernels.md "q8_0 / q4_0").

    gpt2asm_quantize_q8_0_{avx2,avx512}
    gpt2asm_matvec_q8_0_{avx2,avxvnni,avx512,avx512vnni}, gpt2asm_matvec_q4_0_{...}

Every variant the CPU has runs natively; the AVX-512 ones (with and without VNNI) also run under
tests/avx512emu.py (an emulated Ice-Lake-like CPU: AVX-512 F/BW/VL/VNNI, no AVX-VNNI), so that an
AVX2-only CI machine still tests them.  Each call is checked bit for bit against the numpy contract
model tests/q0ref.py (NaN payloads aside), and for its memory contract: natively, every buffer sits
between canary bytes, xq / xd / b / y misaligned, outputs outside the tile range untouched, inputs
unchanged, and a forked child runs every variant with every buffer butting against PROT_NONE pages;
under the emulator every array ends at an unmapped page.

Run:  pytest tests/test_kernels_q0.py
      python tests/test_kernels_q0.py --bench [--rounds N] [--wall]   (GB/s of the decode kernels)
"""
from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import q0ref                                                         # noqa: E402
import test_kernels_matvec as mv                                     # noqa: E402
from test_kernels_matvec import Guarded, PageFenced, cpu_isas, same_bits  # noqa: E402
from forked import run_forked                                        # noqa: E402

QK, TILE, RECORD = q0ref.QK, q0ref.TILE, q0ref.RECORD
KINDS = ("q8_0", "q4_0")
QUANT_ISAS = ("avx2", "avx512")
MV_ISAS = ("avx2", "avxvnni", "avx512", "avx512vnni")
MV_TUNED = ("avx512vnni_zen4",)                   # decode-only tunings of a variant (the same code + nops)
EMU_ISAS = ("avx512", "avx512vnni")              # what tests/avx512emu.py's CPU runs
Y_FILL = np.uint32(0x7FC0DEAD)
P, S = ctypes.c_void_p, ctypes.c_size_t


def quant_symbol(isa: str) -> str:
    return f"gpt2asm_quantize_q8_0_{isa}"


def mv_symbol(kind: str, isa: str) -> str:
    return f"gpt2asm_matvec_{kind}_{isa}"


def mm_symbol(kind: str, isa: str) -> str:
    return f"gpt2asm_matmul_{kind}_{isa}"


def load_lib() -> ctypes.CDLL:
    lib = mv.load_lib()                  # builds the library once per session, binds cpuid & co.
    for isa in QUANT_ISAS:
        fn = getattr(lib, quant_symbol(isa))
        fn.argtypes = [P, P, P, S]
        fn.restype = None
    for kind in KINDS:
        for isa in MV_ISAS + MV_TUNED:
            fn = getattr(lib, mv_symbol(kind, isa), None)
            if fn is None:
                continue
            fn.argtypes = [P, P, P, P, P, S, S, S]
            fn.restype = None
    for kind in KINDS:
        for isa in MV_ISAS:
            fn = getattr(lib, mm_symbol(kind, isa), None)
            if fn is None:
                continue
            fn.argtypes = [P, P, S, P, S, P, P, S, S, S, S, S]
            fn.restype = None
    return lib


def native_isas(lib) -> set[str]:
    """The q0 variants this CPU runs: avx2, avxvnni (CPUID.(7,1):EAX[4]), avx512 (F + BW),
    avx512vnni (+ CPUID.(7,0):ECX[11])."""
    fams = cpu_isas(lib)
    regs = (ctypes.c_uint32 * 4)()

    def cpuid(leaf, sub=0):
        lib.gpt2asm_cpuid(leaf, sub, regs)
        return tuple(regs)
    have = set()
    if "avx2" not in fams:
        return have
    have.add("avx2")
    if cpuid(0)[0] < 7:
        return have
    _, ebx7, ecx7, _ = cpuid(7, 0)
    if cpuid(7, 0)[0] >= 1 and cpuid(7, 1)[0] >> 4 & 1:
        have.add("avxvnni")
    if "avx512" in fams and ebx7 >> 30 & 1:
        have.add("avx512")
        if ecx7 >> 11 & 1:
            have.add("avx512vnni")
    return have


def runner_modes(isa: str) -> list[str]:
    """'native' and/or 'emu' for this variant (or tuning of one) here, or pytest.skip."""
    isa = isa.removesuffix("_zen4")
    lib = load_lib()
    out = []
    if isa in native_isas(lib):
        out.append("native")
    if isa in EMU_ISAS or isa == "avx512":
        emu, why = mv.emulator()
        if emu is not None:
            out.append("emu")
        elif not out:
            pytest.skip(f"no {isa} on this CPU and no emulator: {why}")
    if not out:
        pytest.skip(f"CPU lacks {isa}")
    return out


# --------------------------------------------------------------------------------------------------
# the activation quantizer

def run_quant(mode: str, isa: str, x: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n_in = x.size
    nb = n_in // QK
    if mode == "emu":
        emu, _ = mv.emulator()
        xr = np.array(x)
        xr.flags.writeable = False
        xq = np.full(n_in, 0x5A, np.int8)
        xd = np.full(nb, Y_FILL, np.uint32).view(np.float32)
        emu.call(quant_symbol(isa), xr, xq, xd, n_in, ret=None)
        return xq, xd
    lib = load_lib()
    xg = Guarded(x.nbytes, 4 * (1 + seed % 15), seed).put(x)
    qg = Guarded(n_in, (seed * 7 + 1) % 64, seed + 1).put(np.full(n_in, 0x5A, np.int8))
    dg = Guarded(4 * nb, (seed * 12 + 4) % 64, seed + 2).put(np.full(nb, Y_FILL, np.uint32))
    getattr(lib, quant_symbol(isa))(xg.addr, qg.addr, dg.addr, n_in)
    mv.check_guarded(quant_symbol(isa), ((xg, x, "x"), (qg, None, "xq"), (dg, None, "xd")))
    return qg.get(np.int8), dg.get(np.float32)


def check_quant(isa: str, modes, x: np.ndarray, seed: int = 0):
    eq, ed = q0ref.quantize_act(x)
    for mode in modes:
        q, d = run_quant(mode, isa, x, seed)
        name = f"{quant_symbol(isa)} ({mode})"
        bad = np.flatnonzero(q != eq)
        assert bad.size == 0, f"{name}: xq differs at {bad[:8]}: got {q[bad[:4]]} expected {eq[bad[:4]]}"
        ok = same_bits(d, ed)
        assert ok.all(), f"{name}: xd differs at {np.flatnonzero(~ok)[:8]}: got {d[~ok][:4]} expected {ed[~ok][:4]}"
        assert q.min(initial=0) >= -127
    return eq, ed


def special_row(rng, n_in: int) -> np.ndarray:
    """A row whose blocks cycle through the extremes of the rule."""
    x = (rng.standard_normal(n_in) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
    blocks = x.reshape(-1, QK)
    f32 = np.float32
    for b in range(blocks.shape[0]):
        k = b % 12
        blk = blocks[b]
        if k == 1:
            blk[:] = 0.0
            blk[::3] = -0.0
        elif k == 2:                                    # amax = 127: d = 1, id = 1, exact ties to even
            blk[:] = np.array([127, -127, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 1.5, 126.5, -126.5, 0.49999997]
                              + [4.5] * 20, f32)
        elif k == 3:
            blk[rng.integers(QK)] = np.nan
        elif k == 4:
            blk[rng.integers(QK)] = np.inf if b % 2 else -np.inf
        elif k == 5:                                    # subnormal block: d subnormal -> q = 0
            blk[:] = (rng.standard_normal(QK) * 1e-39).astype(f32)
        elif k == 6:                                    # d just at / below FLT_MIN
            blk[:] = (rng.uniform(-1, 1, QK) * 127 * np.finfo(f32).tiny).astype(f32)
            blk[0] = f32(127) * np.finfo(f32).tiny
            if b % 2:
                blk[0] = np.nextafter(blk[0], f32(0))
        elif k == 7:                                    # huge: amax near FLT_MAX
            blk[:] = (rng.uniform(-1, 1, QK) * 3e38).astype(f32)
            blk[5] = -np.finfo(f32).max
        elif k == 8:                                    # +-amax repeated, one sign only
            blk[:] = f32(-0.75)
            blk[::2] = f32(0.75)
        elif k == 9:                                    # NaN with a payload and the sign bit
            blk.view(np.uint32)[3] = 0xFFC00123
        elif k == 10:                                   # one nonzero subnormal among zeros
            blk[:] = 0.0
            blk[7] = f32(1.4e-45)
    return x


@pytest.mark.parametrize("isa", QUANT_ISAS)
def test_quantize(isa):
    modes = runner_modes(isa)
    rng = np.random.default_rng(100)
    for k, n_in in enumerate((32, 64, 96, 800, 3072)):
        for rep in range(2):
            x = special_row(rng, n_in) if rep else (rng.standard_normal(n_in) * 3).astype(np.float32)
            m = modes if n_in <= 800 else [m for m in modes if m == "native"] or modes
            xq, xd = check_quant(isa, m, x, seed=k * 2 + rep)
    # the special row really hit every case
    x = special_row(np.random.default_rng(1), 12 * QK)
    xq, xd = q0ref.quantize_act(x)
    assert np.isnan(xd[3]) and np.isinf(xd[4]) and xd[5] < np.finfo(np.float32).tiny and xd[2] == 1
    assert list(xq[64:76]) == [127, -127, 2, -2, 4, -4, 0, 0, 2, 126, -126, 0]
    check_quant(isa, modes, x)


def test_quantize_page_guards():
    """Natively, in a child: x, xq, xd butting against PROT_NONE pages on either side."""
    lib = load_lib()
    todo = [i for i in QUANT_ISAS if i in native_isas(lib)]
    if not todo:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(7)
    rows = [special_row(rng, n) for n in (32, 96, 800)]
    exps = [q0ref.quantize_act(x) for x in rows]

    def child() -> bool:
        ok = True
        for isa in todo:
            for x, (eq, ed) in zip(rows, exps):
                for at_end in (True, False):
                    xg = PageFenced(x.nbytes, at_end).put(x)
                    qg = PageFenced(x.size, at_end)
                    dg = PageFenced(4 * ed.size, at_end)
                    getattr(lib, quant_symbol(isa))(xg.addr, qg.addr, dg.addr, x.size)
                    ok &= bool((qg.get(np.int8) == eq).all() and same_bits(dg.get(np.float32), ed).all())
        return ok
    run_forked(child)


# --------------------------------------------------------------------------------------------------
# the decode kernels (matvec)

def make_weights(rng, kind: str, n_out: int, n_in: int, *, every_value: bool = False):
    """Random weight ints over the whole range (-128..127 / -8..7) and fp16 scales of both signs, some
    blocks all zero: (q int8 [n_out][n_in], dw float16 [n_out][nb])."""
    nb = n_in // QK
    lo, hi = (-128, 128) if kind == "q8_0" else (-8, 8)
    q = rng.integers(lo, hi, (n_out, n_in)).astype(np.int8)
    if every_value:                                  # every int8 (nibble) value in every block position
        q[:] = ((np.arange(n_out)[:, None] * 7 + np.arange(n_in)[None, :]) % (hi - lo) + lo).astype(np.int8)
    dw = (rng.standard_normal((n_out, nb)) * 0.02).astype(np.float16)
    zero = rng.random((n_out, nb)) < 0.05
    q.reshape(n_out, nb, QK)[zero] = 0
    dw[rng.random((n_out, nb)) < 0.03] = 0
    return q, dw


def mv_ref(kind, w, n_in, nt, xq, xd, b) -> np.ndarray:
    q, dw = q0ref.untile(w, kind, nt * TILE, n_in)
    return q0ref.matvec(q, dw, xq, xd, b)


def run_mv(mode, kind, isa, w, xq, xd, b, nt, tb, te, seed=0) -> np.ndarray:
    return call_mv(mode, mv_symbol(kind, isa), te * (xq.size // QK) * RECORD[kind], w, xq, xd, b, nt, tb, te, seed)


def call_mv(mode, sym, nbytes, w, xq, xd, b, nt, tb, te, seed=0, timeout=600, lib=None) -> np.ndarray:
    """One matvec call of any q0-style kernel `sym` (q8_0 / q4_0 / q6_k: nbytes = the bytes of tiles
    0 .. te-1), natively with every buffer guarded or on the emulator: y float32 [64 nt].  lib: the
    library with sym's argtypes bound (default: this file's load_lib)."""
    n_in = xq.size
    y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
    if mode == "emu":
        emu, _ = mv.emulator()
        ws = np.array(w[:max(nbytes, 64)])                     # reading past tile te-1 faults
        args = [np.array(a) if a is not None else None for a in (xq, xd, b)]
        for a in [ws] + args:
            if a is not None:
                a.flags.writeable = False
        y = y0.copy()
        emu.call(sym, ws, *args, y, n_in, tb, te, ret=None, timeout=timeout)
        return y
    lib = lib or load_lib()
    mis = seed % 61
    wg = Guarded(w.nbytes, 0, seed).put(w)
    qg = Guarded(xq.nbytes, (mis + 1) % 64, seed + 1).put(xq)
    dg = Guarded(xd.nbytes, (mis * 4 + 4) % 64, seed + 2).put(xd)
    bg = Guarded(b.nbytes, (mis * 4 + 8) % 64, seed + 3).put(b) if b is not None else None
    yg = Guarded(y0.nbytes, (mis * 4 + 12) % 64, seed + 4).put(y0)
    getattr(lib, sym)(wg.addr, qg.addr, dg.addr, bg.addr if bg else None, yg.addr, n_in, tb, te)
    mv.check_guarded(f"{sym} (native)", ((wg, w, "w"), (qg, xq, "xq"), (dg, xd, "xd"), (bg, b, "b"),
                                         (yg, None, "y")))
    return yg.get(np.float32)


def check_mv(modes, kind, isa, w, xq, xd, b, nt, tb, te, seed=0, exp=None) -> np.ndarray:
    n_in = xq.size
    if exp is None:
        exp = mv_ref(kind, w, n_in, nt, xq, xd, b)
    lo, hi = TILE * tb, TILE * te
    for mode in modes:
        name = f"{mv_symbol(kind, isa)} ({mode})"
        y = run_mv(mode, kind, isa, w, xq, xd, b, nt, tb, te, seed)
        outside = np.r_[0:lo, hi:nt * TILE]
        assert np.all(y.view(np.uint32)[outside] == Y_FILL), f"{name}: wrote outputs outside tiles [{tb}, {te})"
        ok = same_bits(y[lo:hi], exp[lo:hi])
        assert ok.all(), (f"{name} n_in={n_in} tiles [{tb},{te}): differs from tests/q0ref.py at outputs "
                          f"{np.flatnonzero(~ok)[:8] + lo}: got {y[lo:hi][~ok][:4]} expected {exp[lo:hi][~ok][:4]}")
    return exp


def act(rng, n_in: int, special: bool = False):
    x = special_row(rng, n_in) if special else (rng.standard_normal(n_in) * 2).astype(np.float32)
    return q0ref.quantize_act(x)


MV_CASES = [(kind, isa) for kind in KINDS for isa in MV_ISAS + MV_TUNED]


@pytest.fixture(scope="module", params=MV_CASES, ids=[f"{k}_{i}" for k, i in MV_CASES])
def mvvar(request):
    kind, isa = request.param
    return kind, isa, runner_modes(isa)


MM_CASES = [(kind, isa) for kind in KINDS for isa in MV_ISAS]      # no decode-only tunings


@pytest.fixture(scope="module", params=MM_CASES, ids=[f"{k}_{i}" for k, i in MM_CASES])
def mmvar(request):
    kind, isa = request.param
    return kind, isa, runner_modes(isa)


@pytest.mark.parametrize("n_in", [32, 64, 96, 800, 3072])
def test_matvec_sizes(mvvar, n_in):
    """Odd block counts, tile ranges that do not start at 0, padded tails, with and without bias."""
    kind, isa, modes = mvvar
    rng = np.random.default_rng(n_in)
    cases = [(1, 0, 1, 64), (3, 0, 3, 150), (4, 1, 3, 256), (5, 2, 5, 300)] if n_in <= 96 else \
        [(3, 0, 3, 170), (4, 1, 3, 256)]
    for k, (nt, tb, te, n_out) in enumerate(cases):
        q, dw = make_weights(rng, kind, n_out, n_in, every_value=k == 1)
        w = q0ref.tile(q, dw, kind)
        xq, xd = act(rng, n_in, special=k % 2 == 1)
        b = (rng.standard_normal(nt * TILE)).astype(np.float32) if k % 2 == 0 else None
        m = modes if n_in <= 800 or k == 0 else [x for x in modes if x == "native"] or modes
        check_mv(m, kind, isa, w, xq, xd, b, nt, tb, te, seed=k + n_in)


def test_matvec_empty_range(mvvar):
    kind, isa, modes = mvvar
    rng = np.random.default_rng(5)
    q, dw = make_weights(rng, kind, 192, 64)
    w = q0ref.tile(q, dw, kind)
    xq, xd = act(rng, 64)
    for tb in (0, 2, 3):
        check_mv(modes, kind, isa, w, xq, xd, None, 3, tb, tb)


def test_matvec_extremes(mvvar):
    """The largest block sums (|s| up to 32*128*127), every weight value, xq = +-127, NaN / inf / huge /
    subnormal / zero activation blocks and scales, signed zeros."""
    kind, isa, modes = mvvar
    rng = np.random.default_rng(17)
    n_in, nt = 160, 2
    nb = n_in // QK
    wmin = -128 if kind == "q8_0" else -8
    q, dw = make_weights(rng, kind, nt * TILE, n_in)
    q[:32] = wmin                                                 # the most negative weight everywhere
    q[32:40] = 127 if kind == "q8_0" else 7
    q[40:64] = np.arange(n_in)[None, :] % (256 if kind == "q8_0" else 16) + wmin
    dw[5, :] = np.float16(6e-8)                                   # fp16 subnormal scales
    dw[6, :] = np.float16(-0.0)
    dw[7, 1] = np.float16(np.inf)
    dw[8, 2] = np.float16(np.nan)
    dw[9, :] = np.float16(65504)
    w = q0ref.tile(q, dw, kind)
    b = rng.standard_normal(nt * TILE).astype(np.float32)
    b[3] = -0.0
    xs = []
    xq = np.where(np.arange(n_in) % 3 == 0, -127, 127).astype(np.int8)      # +-amax everywhere
    xs.append((xq, np.full(nb, 1.5, np.float32)))
    xs.append((np.full(n_in, 127, np.int8), np.full(nb, 3e38, np.float32)))       # overflow to inf
    xs.append((np.full(n_in, -127, np.int8), np.array([1e-40, 0, 1e-45, 2.0 ** -126, 1.0], np.float32)))
    xs.append(act(rng, n_in, special=True))                       # NaN, inf, subnormal, zero blocks
    xq = rng.integers(-127, 128, n_in).astype(np.int8)
    xd = np.array([np.nan, -np.inf, 0.0, -0.0, 7.0], np.float32)
    xs.append((xq, xd))
    for k, (xq, xd) in enumerate(xs):
        for bias in (b, None):
            check_mv(modes, kind, isa, w, xq, xd, bias, nt, 0, nt, seed=k)
    # all-zero products: y = +0 + b (or +0)
    z = q0ref.tile(np.zeros((64, 64), np.int8), np.zeros((64, 2), np.float16), kind)
    y = check_mv(modes, kind, isa, z, np.zeros(64, np.int8), np.zeros(2, np.float32), None, 1, 0, 1)
    assert (y.view(np.uint32) == 0).all()


def test_matvec_head_like(mvvar):
    """A head-like shape: many tiles, the last one padded (n_out = 64 * 40 + 17), small n_in."""
    kind, isa, modes = mvvar
    rng = np.random.default_rng(31)
    n_in, n_out = 64, 64 * 40 + 17
    q, dw = make_weights(rng, kind, n_out, n_in)
    w = q0ref.tile(q, dw, kind)
    nt = -(-n_out // TILE)
    xq, xd = act(rng, n_in)
    exp = check_mv(modes, kind, isa, w, xq, xd, None, nt, 0, nt)
    assert (exp[n_out:] == 0).all()
    check_mv(modes, kind, isa, w, xq, xd, None, nt, 37, nt, exp=exp)


def test_matvec_page_guards():
    """Natively, in a child: w (only the tiles of the range), xq, xd, b, y butting against PROT_NONE pages
    on either side, every variant the CPU has.  Any over-read or over-write faults."""
    lib = load_lib()
    have = native_isas(lib)
    todo = [(k, i) for k, i in MV_CASES if i in have]
    if not todo:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(9)
    jobs = []
    for kind in KINDS:
        for n_in, nt, tb, te in ((32, 3, 1, 3), (96, 4, 2, 3), (800, 2, 0, 2)):
            q, dw = make_weights(rng, kind, nt * TILE, n_in)
            w = q0ref.tile(q, dw, kind)
            xq, xd = act(rng, n_in)
            b = rng.standard_normal(nt * TILE).astype(np.float32)
            jobs.append((kind, w, xq, xd, b, nt, tb, te, mv_ref(kind, w, n_in, nt, xq, xd, b)))

    def child() -> bool:
        ok = True
        for kind, isa in todo:
            fn = getattr(lib, mv_symbol(kind, isa))
            for _, w, xq, xd, b, nt, tb, te, exp in (j for j in jobs if j[0] == kind):
                ok &= fenced_mv(fn, w, (xq.size // QK) * RECORD[kind], xq, xd, b, tb, te, exp)
        return ok
    run_forked(child)


def fenced_mv(fn, w, tile_bytes, xq, xd, b, tb, te, exp, exp_nobias=None) -> bool:
    """A q0-style matvec kernel fn on tiles [tb, te) with every buffer butting against a PROT_NONE page on
    either side: its outputs equal exp's bits (with exp_nobias given, also called with a NULL bias).  For a
    forked child (run_forked)."""
    ok, n_in = True, xq.size
    for at_end in (True, False):
        for bias in (True, False) if exp_nobias is not None else (True,):
            wg = PageFenced((te - tb) * tile_bytes, at_end).put(w[tb * tile_bytes:te * tile_bytes])
            qg = PageFenced(xq.nbytes, at_end).put(xq)
            dg = PageFenced(xd.nbytes, at_end).put(xd)
            bs = b[TILE * tb:TILE * te]
            bg = PageFenced(bs.nbytes, at_end).put(bs)
            yg = PageFenced(bs.nbytes, at_end)
            if wg.addr % 64:
                return False                                     # (records must be aligned)
            fn(wg.addr - tb * tile_bytes, qg.addr, dg.addr, bg.addr - 4 * TILE * tb if bias else None,
               yg.addr - 4 * TILE * tb, n_in, tb, te)
            e = exp if bias else exp_nobias
            ok &= bool(same_bits(yg.get(np.float32), e[TILE * tb:TILE * te]).all())
    return ok


# --------------------------------------------------------------------------------------------------
# the prefill kernels (matmul): every (token, output) the matvec's bits

def strided(rows: np.ndarray, ld: int) -> np.ndarray:
    """rows [n][w] -> a flat array holding row t at t*ld, exactly (n-1)*ld + w elements (the gaps: junk)."""
    n, w = rows.shape
    out = np.empty((n - 1) * ld + w, rows.dtype)
    out.view(np.uint8)[:] = 0xA5
    for t in range(n):
        out[t * ld:t * ld + w] = rows[t]
    return out


def run_mm(mode, kind, isa, w, XQ, XD, b, nt, tb, te, pads=(0, 0, 0), seed=0) -> np.ndarray:
    """Returns y as [n_tok][64*nt] (the ldy padding dropped)."""
    nbytes = te * (XQ.shape[1] // QK) * RECORD[kind]
    return call_mm(mode, mm_symbol(kind, isa), nbytes, w, XQ, XD, b, nt, tb, te, pads, seed)


def call_mm(mode, sym, nbytes, w, XQ, XD, b, nt, tb, te, pads=(0, 0, 0), seed=0, timeout=600,
            lib=None) -> np.ndarray:
    """One matmul call of any q0-style kernel `sym` (nbytes: the bytes of tiles 0 .. te-1) on strided rows
    (pads: extra ldq / ldd / ldy), natively guarded or on the emulator: y as [n_tok][64*nt]."""
    n_tok, n_in = XQ.shape
    nb = n_in // QK
    ldq, ldd, ldy = n_in + pads[0], nb + pads[1], nt * TILE + pads[2]
    xq, xd = strided(XQ, ldq), strided(XD, ldd)
    y0 = np.full((n_tok - 1) * ldy + nt * TILE, Y_FILL, np.uint32).view(np.float32)
    if mode == "emu":
        emu, _ = mv.emulator()
        ws = np.array(w[:max(nbytes, 64)])
        args = [np.array(a) if a is not None else None for a in (xq, xd, b)]
        for a in [ws] + args:
            if a is not None:
                a.flags.writeable = False
        y = y0.copy()
        emu.call(sym, ws, args[0], ldq, args[1], ldd, args[2], y, ldy, n_tok, n_in, tb, te, ret=None, timeout=timeout)
    else:
        lib = lib or load_lib()
        mis = seed % 61
        wg = Guarded(w.nbytes, 0, seed).put(w)
        qg = Guarded(xq.nbytes, (mis + 3) % 64, seed + 1).put(xq)
        dg = Guarded(xd.nbytes, (mis * 4 + 8) % 64, seed + 2).put(xd)
        bg = Guarded(b.nbytes, (mis * 4 + 4) % 64, seed + 3).put(b) if b is not None else None
        yg = Guarded(y0.nbytes, (mis * 4 + 12) % 64, seed + 4).put(y0)
        getattr(lib, sym)(wg.addr, qg.addr, ldq, dg.addr, ldd, bg.addr if bg else None, yg.addr, ldy,
                          n_tok, n_in, tb, te)
        mv.check_guarded(f"{sym} (native)", ((wg, w, "w"), (qg, xq, "xq"), (dg, xd, "xd"), (bg, b, "b"),
                                             (yg, None, "y")))
        y = yg.get(np.float32)
    full = np.full((n_tok, ldy), Y_FILL, np.uint32).view(np.float32)
    full.reshape(-1)[:y.size] = y
    assert (full[:, nt * TILE:].view(np.uint32) == Y_FILL).all(), f"{sym} ({mode}): wrote into the ldy gap"
    return full[:, :nt * TILE]


def check_mm(modes, kind, isa, w, XQ, XD, b, nt, tb, te, pads=(0, 0, 0), seed=0):
    n_tok, n_in = XQ.shape
    q, dw = q0ref.untile(w, kind, nt * TILE, n_in)
    exp = np.stack([q0ref.matvec(q, dw, XQ[t], XD[t], b) for t in range(n_tok)])
    lo, hi = TILE * tb, TILE * te
    for mode in modes:
        name = f"{mm_symbol(kind, isa)} ({mode}) n_tok={n_tok} n_in={n_in} tiles [{tb},{te})"
        y = run_mm(mode, kind, isa, w, XQ, XD, b, nt, tb, te, pads, seed)
        outside = np.r_[0:lo, hi:nt * TILE]
        assert (y[:, outside].view(np.uint32) == Y_FILL).all(), f"{name}: wrote outputs outside the tile range"
        ok = same_bits(y[:, lo:hi], exp[:, lo:hi])
        assert ok.all(), (f"{name}: differs from the matvec model at (token, output) "
                          f"{[(int(a), int(c) + lo) for a, c in zip(*np.nonzero(~ok))][:6]}")


def acts(rng, n_tok: int, n_in: int):
    rows = [act(rng, n_in, special=t % 4 == 3) for t in range(n_tok)]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


@pytest.mark.parametrize("n_tok", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 16, 17, 18])
def test_matmul_tokens(mmvar, n_tok):
    """Every token count around the register blocks (6 for ymm, 8 for zmm), strided rows, tile ranges."""
    kind, isa, modes = mmvar
    rng = np.random.default_rng(40 + n_tok)
    for k, (n_in, nt, tb, te, n_out) in enumerate(((64, 3, 0, 3, 150), (96, 4, 1, 3, 256), (32, 2, 1, 2, 128))):
        q, dw = make_weights(rng, kind, n_out, n_in, every_value=k == 1)
        w = q0ref.tile(q, dw, kind)
        XQ, XD = acts(rng, n_tok, n_in)
        b = rng.standard_normal(nt * TILE).astype(np.float32) if k != 1 else None
        check_mm(modes, kind, isa, w, XQ, XD, b, nt, tb, te, pads=(k * 5, k * 3, k * 7), seed=k + n_tok)


@pytest.mark.parametrize("n_tok", [1, 2, 3, 4, 5, 6, 7, 8, 10, 14, 16, 17, 32, 33])
def test_matmul_small_batches(mmvar, n_tok):
    """Batched decode's sizes: the wide passes (zmm: the whole record for 1-2 tokens, two sub-tiles for 3-4;
    ymm: two sub-tiles for 1-3; also as the last block of 8 + 2, 8 + 8 + 1, 6 + 2, 6 + 6 + 2 ... tokens) and
    the next-tile prefetch of super-chunks of <= 32 tokens (33: none), over several tiles (the prefetch
    runs past the range's last tile), odd block counts and a padded last tile; the emulator takes the
    smaller cases."""
    kind, isa, modes = mmvar
    rng = np.random.default_rng(500 + n_tok)
    for k, (n_in, nt, tb, te, n_out) in enumerate(((800, 5, 1, 5, 300), (96, 3, 0, 3, 192), (3072, 2, 1, 2, 128))):
        use = modes if (n_in == 96 or n_tok <= 2 and n_in == 800) else [m for m in modes if m == "native"]
        if not use:
            continue
        q, dw = make_weights(rng, kind, n_out, n_in, every_value=k == 1)
        w = q0ref.tile(q, dw, kind)
        XQ, XD = acts(rng, n_tok, n_in)
        b = rng.standard_normal(nt * TILE).astype(np.float32) if k != 2 else None
        check_mm(use, kind, isa, w, XQ, XD, b, nt, tb, te, pads=(k * 3, k, k * 5 + 1), seed=k + 3 * n_tok)


@pytest.mark.parametrize("n_in", [800, 3072])
def test_matmul_large(mmvar, n_in):
    """Odd block counts and, at 3072 inputs with 50 tokens, several super-chunks of the activation panel."""
    kind, isa, modes = mmvar
    rng = np.random.default_rng(n_in + 1)
    n_tok = 50 if n_in == 3072 else 11
    q, dw = make_weights(rng, kind, 128, n_in)
    w = q0ref.tile(q, dw, kind)
    XQ, XD = acts(rng, n_tok, n_in)
    b = rng.standard_normal(128).astype(np.float32)
    native = [m for m in modes if m == "native"]
    check_mm(native or modes, kind, isa, w, XQ, XD, b, 2, 0, 2, pads=(32, 1, 64))
    if native and "emu" in modes and n_in == 800:
        check_mm(["emu"], kind, isa, w, XQ[:9], XD[:9], b, 2, 1, 2)


def test_matmul_wide_rows(mmvar):
    """n_in = 16384: one token block's panel (512 blocks x 40 x TB bytes) exceeds the 128 KiB budget, so
    every super-chunk is a single token block (natively only: a long emulation)."""
    kind, isa, modes = mmvar
    if "native" not in modes:
        pytest.skip("native only")
    rng = np.random.default_rng(77)
    n_in, n_tok = 16384, 10
    q, dw = make_weights(rng, kind, 64, n_in)
    w = q0ref.tile(q, dw, kind)
    XQ, XD = acts(rng, n_tok, n_in)
    check_mm(["native"], kind, isa, w, XQ, XD, None, 1, 0, 1)
    check_mv(["native"], kind, isa, w, XQ[3], XD[3], None, 1, 0, 1)


def test_matmul_empty(mmvar):
    kind, isa, modes = mmvar
    rng = np.random.default_rng(2)
    q, dw = make_weights(rng, kind, 128, 64)
    w = q0ref.tile(q, dw, kind)
    XQ, XD = acts(rng, 3, 64)
    for tb in (0, 1, 2):
        check_mm(modes, kind, isa, w, XQ, XD, None, 2, tb, tb)
    sym = mm_symbol(kind, isa)
    if "native" in modes:                                 # n_tokens = 0: nothing is touched (NULL pointers)
        getattr(load_lib(), sym)(None, None, 64, None, 2, None, None, 128, 0, 64, 0, 2)


def test_matmul_page_guards():
    """Natively, in a child: w (only the range's tiles), xq, xd, b, y (exactly (n-1)*ld + width elements)
    butting against PROT_NONE pages on either side, every variant the CPU has."""
    lib = load_lib()
    have = native_isas(lib)
    todo = [(k, i) for k, i in MV_CASES if i in have]
    if not todo:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(19)
    jobs = []
    for kind in KINDS:
        for n_in, nt, tb, te, n_tok in ((32, 3, 1, 3, 7), (96, 2, 0, 2, 9), (800, 2, 1, 2, 3)):
            q, dw = make_weights(rng, kind, nt * TILE, n_in)
            w = q0ref.tile(q, dw, kind)
            XQ, XD = acts(rng, n_tok, n_in)
            b = rng.standard_normal(nt * TILE).astype(np.float32)
            qq, dd = q0ref.untile(w, kind, nt * TILE, n_in)
            exp = np.stack([q0ref.matvec(qq, dd, XQ[t], XD[t], b) for t in range(n_tok)])
            jobs.append((kind, w, XQ, XD, b, nt, tb, te, exp))

    def child() -> bool:
        ok = True
        for kind, isa in todo:
            fn = getattr(lib, mm_symbol(kind, isa))
            for _, w, XQ, XD, b, nt, tb, te, exp in (j for j in jobs if j[0] == kind):
                ok &= fenced_mm(fn, w, XQ.shape[1] // QK * RECORD[kind], XQ, XD, b, tb, te, exp)
        return ok
    run_forked(child)


def fenced_mm(fn, w, tile_bytes, XQ, XD, b, tb, te, exp) -> bool:
    """A q0-style matmul kernel fn on tiles [tb, te) with every buffer butting against a PROT_NONE page on
    either side (strided rows): its rows equal exp's bits.  For a forked child (run_forked)."""
    ok = True
    n_tok, n_in = XQ.shape
    nb = n_in // QK
    ldq, ldd, ldy = n_in + 1, nb + 2, (te - tb) * TILE + 3
    for at_end in (True, False):
        wg = PageFenced((te - tb) * tile_bytes, at_end).put(w[tb * tile_bytes:te * tile_bytes])
        qg = PageFenced((n_tok - 1) * ldq + n_in, at_end).put(strided(XQ, ldq))
        dg = PageFenced(4 * ((n_tok - 1) * ldd + nb), at_end).put(strided(XD, ldd))
        bs = b[TILE * tb:TILE * te]
        bg = PageFenced(bs.nbytes, at_end).put(bs)
        yg = PageFenced(4 * ((n_tok - 1) * ldy + bs.size), at_end)
        if wg.addr % 64:
            return False
        fn(wg.addr - tb * tile_bytes, qg.addr, ldq, dg.addr, ldd, bg.addr - 4 * TILE * tb,
           yg.addr - 4 * TILE * tb, ldy, n_tok, n_in, tb, te)
        y = yg.get(np.float32)
        for t in range(n_tok):
            ok &= bool(same_bits(y[t * ldy:t * ldy + bs.size], exp[t, TILE * tb:TILE * te]).all())
    return ok


# --------------------------------------------------------------------------------------------------
# instruction sets: each variant uses only what its CPUID check promises (objdump)

def disassembly() -> dict[str, list[str]]:
    import shutil
    import subprocess
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump")
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(mv.LIB_PATH)], capture_output=True,
                          text=True, check=True).stdout
    out, cur = {}, None
    for line in text.splitlines():
        if line.endswith(">:"):
            cur = line.split("<")[1][:-2]
            out[cur] = []
        elif cur and "\t" in line:
            out[cur].append(line.split("\t")[-1].strip())
    return out


def test_instruction_sets():
    """avx2 / avxvnni kernels: no EVEX (no zmm, no mask or xmm16+ registers), avxvnni's vpdpbusd VEX-encoded
    (an EVEX ymm vpdpbusd needs AVX512VL + VNNI and faults on an AVX-VNNI-only CPU); the plain avx2 / avx512
    kernels: no vpdpbusd; the avx512 ones: no AVX-VNNI (VEX) encoding."""
    import re
    dis = disassembly()
    evex = re.compile(r"%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{1to")
    for kind in KINDS:
        for isa in MV_ISAS:
            for sym in (mv_symbol(kind, isa), mm_symbol(kind, isa)):
                ins = dis[sym]
                dots = [i for i in ins if "vpdpbusd" in i]
                if isa in ("avx2", "avxvnni"):
                    bad = [i for i in ins if evex.search(i)]
                    assert not bad, f"{sym}: EVEX-only instructions {bad[:3]}"
                if isa in ("avx2", "avx512"):
                    assert not dots, f"{sym}: VNNI instructions {dots[:3]}"
                elif isa == "avxvnni":
                    assert dots and all(i.startswith("{vex}") for i in dots), f"{sym}: {dots[:3]}"
                else:
                    assert dots and not any(i.startswith("{vex}") for i in dots), f"{sym}: {dots[:3]}"
    for kind in KINDS:
        for tuned in MV_TUNED:              # the same instructions as the variant, plus nops
            strip = lambda ins: [i for i in ins if i.split()[0] != "nop"]
            base = strip(dis[mv_symbol(kind, tuned.removesuffix("_zen4"))])
            got = strip(dis[mv_symbol(kind, tuned)])
            assert [i.split()[0] for i in got] == [i.split()[0] for i in base], mv_symbol(kind, tuned)
    bad = [i for i in dis[quant_symbol("avx2")] if evex.search(i)]
    assert not bad, f"{quant_symbol('avx2')}: {bad[:3]}"


# --------------------------------------------------------------------------------------------------
# the Python bindings (gpt2asm.q0kernels.Q0Kernels): variant choice and argument checks

def test_bindings_variants_and_checks(monkeypatch):
    from gpt2asm import q0kernels as K
    from gpt2asm.validate import aligned_bytes
    from gpt2asm.errors import InvalidArgumentError
    lib = load_lib()
    have = native_isas(lib)
    rng = np.random.default_rng(3)
    n_in, n_out = 96, 100
    x = (rng.standard_normal(n_in) * 2).astype(np.float32)
    eq, ed = q0ref.quantize_act(x)
    for fam in [f for f in ("avx2", "avx512") if f in cpu_isas(lib)]:
        for plain in (False, True):
            k = K.Q0Kernels(fam, plain=plain)
            base, vnni, _ = K.Q0_VARIANTS[fam if fam != "avx512" or "avx512" in have else "avx2"]
            assert k.variant == (vnni if vnni in have and not plain else base)
            xq, xd = k.quantize(x)
            assert np.array_equal(xq, eq) and same_bits(xd, ed).all()
            for kind in KINDS:
                q, dw = make_weights(rng, kind, n_out, n_in)
                w = aligned_bytes(q0ref.tile(q, dw, kind).size)
                w[:] = q0ref.tile(q, dw, kind)
                b = rng.standard_normal(128).astype(np.float32)
                y = k.matvec(kind, w, xq, xd, b)
                assert same_bits(y, mv_ref(kind, w, n_in, 2, xq, xd, b)).all()
                XQ, XD = acts(rng, 7, n_in)
                Y = k.matmul(kind, w, XQ, XD, b)
                for t in range(7):
                    assert same_bits(Y[t], mv_ref(kind, w, n_in, 2, XQ[t], XD[t], b)).all()
                with pytest.raises(InvalidArgumentError):
                    k.matmul(kind, w, XQ, XD[:6], b)
                with pytest.raises(InvalidArgumentError):
                    k.matmul(kind, w, XQ[:, :64], XD, b)
                bad_q = xq.copy()
                bad_q[5] = -128
                with pytest.raises(InvalidArgumentError):
                    k.matvec(kind, w, bad_q, xd, b)
                with pytest.raises(InvalidArgumentError):
                    k.matmul(kind, w, np.stack([xq, bad_q]), np.stack([xd, xd]), b)
                for bad in (dict(kind="q5_0"), dict(w=w[1:]), dict(w=w.view(np.int8)), dict(xq=xq[:64]),
                            dict(xd=xd[:2]), dict(b=b[:64]), dict(tile_end=3), dict(tile_begin=2, tile_end=1),
                            dict(y=np.empty(128, np.float64))):
                    args = dict(kind=kind, w=w, xq=xq, xd=xd, b=b) | bad
                    with pytest.raises(InvalidArgumentError):
                        k.matvec(**args)
            for bad in (x[:40], x.astype(np.float64), np.zeros(0, np.float32)):
                with pytest.raises(InvalidArgumentError):
                    k.quantize(bad)
    monkeypatch.setenv("GPT2ASM_Q0_PLAIN", "1")
    assert K.q0_variant("avx2") == "avx2"
    for force, want in (("1", "avx512vnni_zen4"), ("0", "avx512vnni")):
        monkeypatch.setenv("GPT2ASM_Q0_ZEN4", force)
        assert K.mv_variant("avx512vnni") == want and K.mv_variant("avx512") == "avx512"


# --------------------------------------------------------------------------------------------------
# benchmark: python tests/test_kernels_q0.py --bench  (not run by pytest)

def bench(rounds: int = 21, chunk_mb: int = 160, wall: bool = False) -> None:
    """GB/s of q8_0 / q4_0 record streaming per GPT-2 124M shape and variant, against a plain streaming
    read of the same bytes in calls of the same size (gpt2asm_readbw_f32_avx2), interleaved so the noise
    of a shared machine hits both alike; every call reads weights that are in no cache (rotation over
    4 x chunk_mb MB).  The decode target: ratio >= 0.90 at one thread.  Then the same in L2 (one matrix,
    repeated): the kernel's own ceiling.  Times are the calling thread's CPU time (time.thread_time), or
    wall time with --wall."""
    clock = time.perf_counter if wall else time.thread_time
    lib = load_lib()
    have = native_isas(lib)
    readbw = mv.readbw_baseline(lib, have)
    if readbw is None:
        return
    chunk = chunk_mb << 20
    buf, next_chunk = mv.stream_buffers(chunk_mb, np.uint8(0x11))   # scales fp16 0x1111 (normal), q8_0
    #                                                       ints 17, q4_0 nibbles 1: no subnormals
    base = buf.ctypes.data
    xq = np.full(3072, 5, np.int8)
    xd = np.full(96, 0.01, np.float32)
    y = np.empty(50304, np.float32)
    qp, dp, yp = xq.ctypes.data, xd.ctypes.data, y.ctypes.data

    print(f"CPU q0 variants: {', '.join(sorted(have))}")
    print(f"{'variant':30s} {'shape':22s} {'us/call':>9s} {'GB/s':>7s} {'read GB/s':>10s} {'ratio':>6s}"
          f"  (medians of {rounds} interleaved rounds; weights not in cache; "
          f"{'wall' if wall else 'thread CPU'} time)")
    for kind in KINDS:
        for isa in MV_ISAS + MV_TUNED:
            if isa.removesuffix("_zen4") not in have:
                print(f"{mv_symbol(kind, isa)}: not on this CPU, skipped")
                continue
            fn = getattr(lib, mv_symbol(kind, isa))
            tot_k, tot_r = mv.bench_shapes(
                mv_symbol(kind, isa), 30, rounds, clock, chunk, lambda i, o: o // TILE * (i // QK) * RECORD[kind],
                lambda p, n_in, nt: fn(p, qp, dp, None, yp, n_in, 0, nt), readbw, next_chunk)
            print(f"  124M per token (12 layers + head): matvecs {tot_k * 1e3:.2f} ms, plain read {tot_r * 1e3:.2f} ms, "
                  f"ratio {tot_r / tot_k:.3f}")
    # in L2: the kernels' own ceiling (one matrix of ~200-400 KiB, repeated)
    n_in, nt, reps = 768, 12, 200
    for kind in KINDS:
        per = nt * (n_in // QK) * RECORD[kind]
        calls = [(mv_symbol(kind, i), (lambda f=getattr(lib, mv_symbol(kind, i)): f(base, qp, dp, None, yp, n_in, 0, nt)))
                 for i in MV_ISAS if i in have]
        calls.append(("read", lambda: readbw(base, per // 4)))
        best = mv.best_of(calls, reps, clock)
        print(f"in L2 ({kind}, {per >> 10} KiB, best of 7 x {reps} calls, ~1-4 us of ctypes per call): " +
              ", ".join(f"{n} {per / t / 1e9:.1f} GB/s" for n, t in best.items()))
    # prefill: one 768 x 3072 matrix (mlp.c_fc) for 128 tokens, in cache, against the fp32 matmul
    n_in, n_out, n_tok = 768, 3072, 128
    nt = n_out // TILE
    XQ = np.full((n_tok, n_in), 5, np.int8)
    XD = np.full((n_tok, n_in // QK), 0.01, np.float32)
    Y = np.empty((n_tok, n_out), np.float32)
    macs = n_in * n_out * n_tok
    rows = []
    for fam in ("avx2", "avx512"):
        f32 = getattr(lib, f"gpt2asm_matmul_f32_{fam}", None)
        if f32 is not None and fam in cpu_isas(lib):
            f32.argtypes = [P, P, S, P, P, S, S, S, S, S]
            f32.restype = None
            W = np.full(nt * n_in * TILE + 16, 0.001, np.float32)
            W = W[(-W.ctypes.data // 4) % 16:][:nt * n_in * TILE]
            X = np.ones((n_tok, n_in), np.float32)
            rows.append((f"gpt2asm_matmul_f32_{fam}", lambda f=f32, W=W, X=X: f(
                W.ctypes.data, X.ctypes.data, n_in, None, Y.ctypes.data, n_out, n_tok, n_in, 0, nt)))
    for kind in KINDS:
        for isa in MV_ISAS:
            if isa in have:
                fn = getattr(lib, mm_symbol(kind, isa))
                rows.append((mm_symbol(kind, isa), lambda f=fn: f(
                    base, XQ.ctypes.data, n_in, XD.ctypes.data, n_in // QK, None, Y.ctypes.data, n_out, n_tok,
                    n_in, 0, nt)))
    for name, call in rows:
        best = min((lambda t0: (call(), clock() - t0)[1])(clock()) for _ in range(7))
        print(f"prefill {name:32s} {n_in}x{n_out}, {n_tok} tokens: {best * 1e3:8.2f} ms  {macs / best / 1e9:7.1f} GMAC/s")
    # the activation quantizer, per row of 768 / 3072
    for isa in QUANT_ISAS:
        if isa in have:
            fn = getattr(lib, quant_symbol(isa))
            x = np.ones(3072, np.float32)
            q, d = np.empty(3072, np.int8), np.empty(96, np.float32)
            for n in (768, 3072):
                t0 = clock()
                for _ in range(2000):
                    fn(x.ctypes.data, q.ctypes.data, d.ctypes.data, n)
                print(f"{quant_symbol(isa)} n_in {n}: {(clock() - t0) / 2000 * 1e6:.2f} us/call (with ctypes)")


if __name__ == "__main__":
    if "--bench" in sys.argv[1:]:
        args = sys.argv[1:]
        bench(int(args[args.index("--rounds") + 1]) if "--rounds" in args else 21, wall="--wall" in args)
    else:
        sys.exit(pytest.main([__file__, *sys.argv[1:]]))
