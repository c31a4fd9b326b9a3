"""checkasm-style tests (and a benchmark) for the q6_k kernels (docs/kernels.md "gpt2asm_{matvec,matmul}_q6_k_<isa>").

    gpt2asm_matvec_q6_k_{avx2,avx512vnni,avx512vnni_zen4}, gpt2asm_matmul_q6_k_{avx2,avx512vnni}

The helpers are tests/test_kernels_q0.py's (library loading with the checkasm clobber check, the variant
modes: native where the CPU has it, the AVX-512 one also under tests/avx512emu.py) and
tests/test_kernels_matvec.py's (Guarded canary buffers, PageFenced guard pages, the bandwidth bench).
Every call is checked bit for bit against tests/q0ref.py's matvec_q6k (NaN-ness only where NaN).

Run:  pytest tests/test_kernels_q6k.py
      python tests/test_kernels_q6k.py --bench [--rounds N] [--wall]
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
import test_kernels_q0 as q0                                         # noqa: E402
from test_kernels_matvec import same_bits                            # noqa: E402
from test_kernels_q0 import Y_FILL, act, acts, native_isas, runner_modes  # noqa: E402
from forked import run_forked                                        # noqa: E402

QK, QK_K, TILE = q0ref.QK, q0ref.QK_K, q0ref.TILE
SUPER6 = q0ref.SUPER6
ISAS = ("avx2", "avx512vnni")
MV_TUNED = ("avx512vnni_zen4",)          # the matvec's CPU tunings (the same code, no prefetch hints)
P, S = ctypes.c_void_p, ctypes.c_size_t


def mv_symbol(isa: str) -> str:
    return f"gpt2asm_matvec_q6_k_{isa}"


def mm_symbol(isa: str) -> str:
    return f"gpt2asm_matmul_q6_k_{isa}"


def load_lib() -> ctypes.CDLL:
    lib = q0.load_lib()
    for isa in ISAS + MV_TUNED:
        for sym, args in ((mv_symbol(isa), [P, P, P, P, P, S, S, S]),
                          (mm_symbol(isa), [P, P, S, P, S, P, P, S, S, S, S, S])):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.argtypes = args
                fn.restype = None
    return lib


def tile_bytes(n_in: int) -> int:
    return q0ref.tile_bytes_q6k(n_in)


def make_weights(rng, n_out: int, n_in: int):
    """Random q in -32..31, sc in -128..127, d fp16 of both signs (some zero), some all-zero blocks."""
    nb = n_in // QK
    q = rng.integers(-32, 32, (n_out, n_in)).astype(np.int8)
    sc = rng.integers(-128, 128, (n_out, 2 * nb)).astype(np.int8)
    d = (rng.standard_normal((n_out, n_in // QK_K)) * 0.002).astype(np.float16)
    q.reshape(n_out, nb, QK)[rng.random((n_out, nb)) < 0.05] = 0
    d[rng.random(d.shape) < 0.03] = 0
    return q, sc, d


def ref(w, n_in, nt, xq, xd, b) -> np.ndarray:
    q, sc, d = q0ref.untile_q6k(w, nt * TILE, n_in)
    return q0ref.matvec_q6k(q, sc, d, xq, xd, b)


# --------------------------------------------------------------------------------------------------
# matvec

def run_mv(mode, isa, w, xq, xd, b, nt, tb, te, seed=0) -> np.ndarray:
    return q0.call_mv(mode, mv_symbol(isa), te * tile_bytes(xq.size), w, xq, xd, b, nt, tb, te, seed,
                      lib=None if mode == "emu" else load_lib())


def check_mv(modes, isa, w, xq, xd, b, nt, tb, te, seed=0, exp=None) -> np.ndarray:
    n_in = xq.size
    if exp is None:
        exp = ref(w, n_in, nt, xq, xd, b)
    lo, hi = TILE * tb, TILE * te
    for mode in modes:
        name = f"{mv_symbol(isa)} ({mode})"
        y = run_mv(mode, isa, w, xq, xd, b, nt, tb, te, seed)
        outside = np.r_[0:lo, hi:nt * TILE]
        assert np.all(y.view(np.uint32)[outside] == Y_FILL), f"{name}: wrote outputs outside tiles [{tb}, {te})"
        ok = same_bits(y[lo:hi], exp[lo:hi])
        assert ok.all(), (f"{name} n_in={n_in} tiles [{tb},{te}): differs from q0ref.matvec_q6k at outputs "
                          f"{np.flatnonzero(~ok)[:8] + lo}: got {y[lo:hi][~ok][:4]} expected {exp[lo:hi][~ok][:4]}")
    return exp


@pytest.fixture(scope="module", params=ISAS)
def var(request):
    return request.param, runner_modes(request.param)


@pytest.fixture(scope="module", params=ISAS + MV_TUNED)
def mvar(request):
    """The matvec's variants and their CPU tunings."""
    return request.param, runner_modes(request.param)


def emu_small(modes, small: bool):
    """The emulator only on small cases (it is ~1000x slower)."""
    return modes if small else [m for m in modes if m == "native"]


@pytest.mark.parametrize("n_in", [256, 512, 768, 3072])
def test_matvec_sizes(mvar, n_in):
    """Tile ranges not starting at 0, n_out not a multiple of 64 (padding), bias and NULL bias."""
    isa, modes = mvar
    rng = np.random.default_rng(n_in)
    for k, (nt, tb, te, n_out) in enumerate(((3, 0, 3, 170), (4, 1, 3, 256), (2, 1, 2, 100))):
        q, sc, d = make_weights(rng, n_out, n_in)
        w = q0ref.tile_q6k(q, sc, d)
        xq, xd = act(rng, n_in, special=k == 1)
        b = rng.standard_normal(nt * TILE).astype(np.float32) if k != 1 else None
        m = emu_small(modes, n_in <= 512 and k != 1)
        if m:
            check_mv(m, isa, w, xq, xd, b, nt, tb, te, seed=k + n_in)


def test_matvec_empty_range(mvar):
    isa, modes = mvar
    rng = np.random.default_rng(5)
    q, sc, d = make_weights(rng, 192, 256)
    w = q0ref.tile_q6k(q, sc, d)
    xq, xd = act(rng, 256)
    for tb in (0, 2, 3):
        check_mv(modes, isa, w, xq, xd, None, 3, tb, tb)


def extreme_cases(rng, n_in: int, nt: int):
    """Weights and activations at the contract's edges: q = -32 everywhere with xq = +-127 and sc = -128
    / 127 (|s| up to 2 * 128 * 16 * 32 * 127 < 2^24), all-zero blocks, d = 0 / subnormal / large / inf /
    NaN, and non-finite xd."""
    nb = n_in // QK
    q, sc, d = make_weights(rng, nt * TILE, n_in)
    q[:16] = -32
    sc[:8] = -128
    sc[8:16] = 127
    q[16:24] = 31
    sc[16:24] = rng.choice(np.array([-128, 127], np.int8), (8, 2 * nb))
    q[24:32] = (np.arange(n_in)[None, :] % 64 - 32).astype(np.int8)   # every value
    q[32:36] = 0                                                       # all-zero blocks
    sc[36:40] = 0
    d[40, :] = np.float16(6e-8)                                        # fp16 subnormal
    d[41, :] = np.float16(-0.0)
    d[42, :] = np.float16(65504)
    d[43, 0] = np.float16(np.inf)
    d[44, 0] = np.float16(np.nan)
    d[45, :] = np.float16(0)
    w = q0ref.tile_q6k(q, sc, d)
    xs = []
    xs.append((np.where(np.arange(n_in) % 2 == 0, 127, -127).astype(np.int8), np.full(nb, 1.5, np.float32)))
    xs.append((np.full(n_in, -127, np.int8), np.full(nb, 0.75, np.float32)))
    xs.append((np.full(n_in, 127, np.int8), np.full(nb, 3e38, np.float32)))          # overflow to inf
    small = np.array([1e-40, 0, 1e-45, 2.0 ** -126, 1.0, -0.0, 1e-30, 2.0], np.float32)
    xs.append((np.full(n_in, -127, np.int8), np.resize(small, nb)))
    xs.append(act(rng, n_in, special=True))                           # NaN, inf, subnormal, zero blocks
    xd = np.resize(np.array([np.nan, -np.inf, 0.0, -0.0, 7.0, np.inf, 1.0, 2.0], np.float32), nb)
    xs.append((rng.integers(-127, 128, n_in).astype(np.int8), xd))
    return w, xs


def test_matvec_extremes(mvar):
    isa, modes = mvar
    rng = np.random.default_rng(17)
    n_in, nt = 512, 1
    w, xs = extreme_cases(rng, n_in, nt)
    b = rng.standard_normal(nt * TILE).astype(np.float32)
    b[3] = -0.0
    for k, (xq, xd) in enumerate(xs):
        for bias in (b, None):
            check_mv(modes, isa, w, xq, xd, bias, nt, 0, nt, seed=k)
    # all-zero products: y = +0
    z = q0ref.tile_q6k(np.zeros((64, 256), np.int8), np.zeros((64, 16), np.int8), np.zeros((64, 1), np.float16))
    y = check_mv(modes, isa, z, np.zeros(256, np.int8), np.zeros(8, np.float32), None, 1, 0, 1)
    assert (y.view(np.uint32) == 0).all()


def test_matvec_head_like(mvar):
    """Many tiles, the last one padded (n_out = 64 * 40 + 17), natively; the emulator a few of them."""
    isa, modes = mvar
    rng = np.random.default_rng(31)
    n_in, n_out = 256, 64 * 40 + 17
    q, sc, d = make_weights(rng, n_out, n_in)
    w = q0ref.tile_q6k(q, sc, d)
    nt = -(-n_out // TILE)
    xq, xd = act(rng, n_in)
    exp = ref(w, n_in, nt, xq, xd, None)
    assert (exp[n_out:] == 0).all()
    check_mv(emu_small(modes, False), isa, w, xq, xd, None, nt, 0, nt, exp=exp)
    check_mv(modes, isa, w, xq, xd, None, nt, 38, nt, exp=exp)


def test_matvec_page_guards():
    """Natively, in a child: w (only the range's tiles), xq, xd, b, y butting against PROT_NONE pages."""
    lib = load_lib()
    todo = [i for i in ISAS + MV_TUNED if i.removesuffix("_zen4") in native_isas(lib)]
    if not todo:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(9)
    jobs = []
    for n_in, nt, tb, te in ((256, 3, 1, 3), (768, 4, 2, 3), (3072, 2, 0, 2)):
        q, sc, d = make_weights(rng, nt * TILE, n_in)
        w = q0ref.tile_q6k(q, sc, d)
        xq, xd = act(rng, n_in)
        b = rng.standard_normal(nt * TILE).astype(np.float32)
        jobs.append((w, xq, xd, b, nt, tb, te, ref(w, n_in, nt, xq, xd, b)))

    def child() -> bool:
        ok = True
        for isa in todo:
            fn = getattr(lib, mv_symbol(isa))
            for w, xq, xd, b, nt, tb, te, exp in jobs:
                ok &= q0.fenced_mv(fn, w, tile_bytes(xq.size), xq, xd, b, tb, te, exp,
                                   exp_nobias=ref(w, xq.size, nt, xq, xd, None))
        return ok
    run_forked(child)


# --------------------------------------------------------------------------------------------------
# matmul: every (token, output) the matvec's bits

def run_mm(mode, isa, w, XQ, XD, b, nt, tb, te, pads=(0, 0, 0), seed=0) -> np.ndarray:
    """y as [n_tok][64*nt] (the ldy padding dropped)."""
    return q0.call_mm(mode, mm_symbol(isa), te * tile_bytes(XQ.shape[1]), w, XQ, XD, b, nt, tb, te, pads, seed,
                      timeout=900, lib=None if mode == "emu" else load_lib())


def check_mm(modes, isa, w, XQ, XD, b, nt, tb, te, pads=(0, 0, 0), seed=0):
    n_tok, n_in = XQ.shape
    q, sc, d = q0ref.untile_q6k(w, nt * TILE, n_in)
    exp = np.stack([q0ref.matvec_q6k(q, sc, d, XQ[t], XD[t], b) for t in range(n_tok)])
    lo, hi = TILE * tb, TILE * te
    for mode in modes:
        name = f"{mm_symbol(isa)} ({mode}) n_tok={n_tok} n_in={n_in} tiles [{tb},{te})"
        y = run_mm(mode, isa, w, XQ, XD, b, nt, tb, te, pads, seed)
        outside = np.r_[0:lo, hi:nt * TILE]
        assert (y[:, outside].view(np.uint32) == Y_FILL).all(), f"{name}: wrote outputs outside the tile range"
        ok = same_bits(y[:, lo:hi], exp[:, lo:hi])
        assert ok.all(), (f"{name}: differs from the matvec model at (token, output) "
                          f"{[(int(a), int(c) + lo) for a, c in zip(*np.nonzero(~ok))][:6]}")


@pytest.mark.parametrize("n_tok", list(range(1, 18)) + [128])
def test_matmul_tokens(var, n_tok):
    """Every token count around the register blocks and wide passes, strided rows (ldq / ldd / ldy larger
    than needed), tile ranges, padding; the emulator takes the small cases."""
    isa, modes = var
    rng = np.random.default_rng(40 + n_tok)
    for k, (n_in, nt, tb, te, n_out) in enumerate(((256, 3, 0, 3, 150), (768, 3, 1, 3, 192), (3072, 2, 1, 2, 128))):
        use = emu_small(modes, k == 0 and n_tok <= 9)
        if not use or (n_tok == 128 and k == 2):
            continue
        q, sc, d = make_weights(rng, n_out, n_in)
        w = q0ref.tile_q6k(q, sc, d)
        XQ, XD = acts(rng, n_tok, n_in)
        b = rng.standard_normal(nt * TILE).astype(np.float32) if k != 1 else None
        check_mm(use, isa, w, XQ, XD, b, nt, tb, te, pads=(k * 5 + 1, k * 3 + 1, k * 7 + 1), seed=k + n_tok)


def test_matmul_extremes(var):
    isa, modes = var
    rng = np.random.default_rng(23)
    n_in, nt = 512, 1
    w, xs = extreme_cases(rng, n_in, nt)
    XQ = np.stack([x for x, _ in xs])
    XD = np.stack([x for _, x in xs])
    b = rng.standard_normal(nt * TILE).astype(np.float32)
    for n in (1, 2, 3, 4, len(xs)):
        check_mm(emu_small(modes, n <= 2), isa, w, XQ[:n], XD[:n], b, nt, 0, nt)
    check_mm([m for m in modes if m == "native"], isa, w, np.tile(XQ, (3, 1)), np.tile(XD, (3, 1)), None, nt, 0, nt)


def test_matmul_large():
    """n_in = 3072 with 50 tokens (several super-chunks of the activation panel), natively."""
    lib = load_lib()
    rng = np.random.default_rng(3073)
    for isa in [i for i in ISAS if i in native_isas(lib)]:
        n_in, n_tok = 3072, 50
        q, sc, d = make_weights(rng, 128, n_in)
        w = q0ref.tile_q6k(q, sc, d)
        XQ, XD = acts(rng, n_tok, n_in)
        b = rng.standard_normal(128).astype(np.float32)
        check_mm(["native"], isa, w, XQ, XD, b, 2, 0, 2, pads=(32, 1, 64))
        n_in = 16384                           # one token block's panel exceeds the budget
        q, sc, d = make_weights(rng, 64, n_in)
        w = q0ref.tile_q6k(q, sc, d)
        XQ, XD = acts(rng, 10, n_in)
        check_mm(["native"], isa, w, XQ, XD, None, 1, 0, 1)


def test_matmul_empty(var):
    isa, modes = var
    rng = np.random.default_rng(2)
    q, sc, d = make_weights(rng, 128, 256)
    w = q0ref.tile_q6k(q, sc, d)
    XQ, XD = acts(rng, 3, 256)
    for tb in (0, 1, 2):
        check_mm(modes, isa, w, XQ, XD, None, 2, tb, tb)
    if "native" in modes:                                 # n_tokens = 0: nothing is touched (NULL pointers)
        getattr(load_lib(), mm_symbol(isa))(None, None, 256, None, 8, None, None, 128, 0, 256, 0, 2)
    if "emu" in modes:
        emu, _ = mv.emulator()
        emu.call(mm_symbol(isa), None, None, 256, None, 8, None, None, 128, 0, 256, 0, 2, ret=None)


def test_matmul_page_guards():
    """Natively, in a child: w (only the range's tiles), xq, xd, b, y (exactly (n-1)*ld + width elements)
    butting against PROT_NONE pages on either side."""
    lib = load_lib()
    todo = [i for i in ISAS if i in native_isas(lib)]
    if not todo:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(19)
    jobs = []
    for n_in, nt, tb, te, n_tok in ((256, 3, 1, 3, 7), (768, 2, 0, 2, 9), (512, 2, 1, 2, 3), (256, 2, 0, 1, 1),
                                    (256, 1, 0, 1, 2), (256, 1, 0, 1, 4), (256, 2, 1, 2, 17)):
        q, sc, d = make_weights(rng, nt * TILE, n_in)
        w = q0ref.tile_q6k(q, sc, d)
        XQ, XD = acts(rng, n_tok, n_in)
        b = rng.standard_normal(nt * TILE).astype(np.float32)
        qq, ss, dd = q0ref.untile_q6k(w, nt * TILE, n_in)
        exp = np.stack([q0ref.matvec_q6k(qq, ss, dd, XQ[t], XD[t], b) for t in range(n_tok)])
        jobs.append((w, XQ, XD, b, nt, tb, te, exp))

    def child() -> bool:
        ok = True
        for isa in todo:
            fn = getattr(lib, mm_symbol(isa))
            for w, XQ, XD, b, nt, tb, te, exp in jobs:
                ok &= q0.fenced_mm(fn, w, tile_bytes(XQ.shape[1]), XQ, XD, b, tb, te, exp)
        return ok
    run_forked(child)


def test_checked_calls():
    """Under the test session's $GPT2ASM_CHECKASM every call above ran through gpt2asm_checked_call (callee-saved
    registers, rsp, MXCSR, DF and the AVX upper state checked after it); make sure the binding really is checked,
    and run each kernel once more through it with an odd token count and a NULL bias."""
    from gpt2asm import checkasm
    if not checkasm.enabled():
        pytest.skip("GPT2ASM_CHECKASM is off")
    lib = load_lib()
    have = native_isas(lib)
    rng = np.random.default_rng(8)
    q, sc, d = make_weights(rng, 100, 512)
    w = q0ref.tile_q6k(q, sc, d)
    XQ, XD = acts(rng, 3, 512)
    for isa in ISAS:
        for sym in (mv_symbol(isa), mm_symbol(isa)):
            assert isinstance(getattr(lib, sym), checkasm.CheckedFunction), sym
        if isa in have:
            check_mv(["native"], isa, w, XQ[0], XD[0], None, 2, 0, 2)
            check_mm(["native"], isa, w, XQ, XD, None, 2, 1, 2)
    for isa in MV_TUNED:
        assert isinstance(getattr(lib, mv_symbol(isa)), checkasm.CheckedFunction), mv_symbol(isa)
        if isa.removesuffix("_zen4") in have:
            check_mv(["native"], isa, w, XQ[1], XD[1], None, 2, 0, 2)


def test_instruction_sets():
    """avx2: no EVEX (zmm, masks, xmm16+, embedded broadcasts), no VNNI; avx512vnni: EVEX vpdpbusd."""
    import re
    dis = q0.disassembly()
    evex = re.compile(r"%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{1to")
    for isa in ISAS:
        for sym in (mv_symbol(isa), mm_symbol(isa)):
            ins = dis[sym]
            dots = [i for i in ins if "vpdpbusd" in i]
            if isa == "avx2":
                bad = [i for i in ins if evex.search(i)]
                assert not bad, f"{sym}: EVEX-only instructions {bad[:3]}"
                assert not dots, f"{sym}: VNNI instructions {dots[:3]}"
            else:
                assert dots and not any(i.startswith("{vex}") for i in dots), f"{sym}: {dots[:3]}"
    for tuned in MV_TUNED:                  # the variant's instructions without its prefetch hints
        strip = lambda ins: [i.split()[0] for i in ins if not i.startswith(("prefetch", "nop", "data16", "cs nop"))]
        assert strip(dis[mv_symbol(tuned)]) == strip(dis[mv_symbol(tuned.removesuffix("_zen4"))]), tuned
        assert not any(i.startswith("prefetch") for i in dis[mv_symbol(tuned)]), tuned


# --------------------------------------------------------------------------------------------------
# benchmark: python tests/test_kernels_q6k.py --bench  (not run by pytest)

def bench(rounds: int = 21, chunk_mb: int = 160, wall: bool = False, reps: int = 3) -> None:
    """GB/s of the q6_k matvecs on the head shape 768 x 50304 with the weights in no cache (rotation over
    4 x chunk_mb MB) against a plain read of the same bytes (gpt2asm_readbw_f32_avx2), interleaved; the
    medians of `rounds`, `reps` times.  Then the matmuls' GMAC/s at 8, 16 and 128 tokens (one 768 x 3072
    q6_k matrix, in cache)."""
    clock = time.perf_counter if wall else time.thread_time
    lib = load_lib()
    have = native_isas(lib)
    readbw = mv.readbw_baseline(lib, have)
    if readbw is None:
        return
    chunk = chunk_mb << 20
    buf, next_chunk = mv.stream_buffers(chunk_mb, np.uint8(0x11))   # d = fp16 0x1111 (normal)
    xq = np.full(3072, 5, np.int8)
    xd = np.full(96, 0.01, np.float32)
    y = np.empty(50304, np.float32)
    qp, dp, yp = xq.ctypes.data, xd.ctypes.data, y.ctypes.data
    n_in, n_out = 768, 50304
    nt = n_out // TILE
    per = nt * tile_bytes(n_in)
    ncopy = max(1, (chunk // 2) // per)
    print(f"CPU q0 variants: {', '.join(sorted(have))}; head {n_in}x{n_out} q6_k = {per / 1e6:.1f} MB, "
          f"{'wall' if wall else 'thread CPU'} time, medians of {rounds} interleaved rounds")
    print(f"{'kernel':34s} {'us/call':>9s} {'GB/s':>7s} {'read GB/s':>10s} {'ratio':>6s}")
    for rep in range(reps):
        for isa in ISAS + MV_TUNED:
            if isa.removesuffix("_zen4") not in have:
                continue
            fn = getattr(lib, mv_symbol(isa))
            tk, tr, ratio = mv.interleaved(rounds, clock, ncopy, per,
                                           lambda p: fn(p, qp, dp, None, yp, n_in, 0, nt), readbw, next_chunk)
            print(f"{mv_symbol(isa):34s} {tk * 1e6:9.1f} {per / tk / 1e9:7.2f} {per / tr / 1e9:10.2f} {ratio:6.3f}",
                  flush=True)
    # matmul GMAC/s (one 768 x 3072 matrix, ~6.6 MB: from L3 / DRAM per token block pass)
    n_in, n_out = 768, 3072
    nt = n_out // TILE
    base = buf.ctypes.data
    for n_tok in (8, 16, 128):
        XQ = np.full((n_tok, n_in), 5, np.int8)
        XD = np.full((n_tok, n_in // QK), 0.01, np.float32)
        Y = np.empty((n_tok, n_out), np.float32)
        macs = n_in * n_out * n_tok
        for isa in ISAS:
            if isa not in have:
                continue
            fn = getattr(lib, mm_symbol(isa))

            def call(fn=fn):
                fn(base, XQ.ctypes.data, n_in, XD.ctypes.data, n_in // QK, None, Y.ctypes.data, n_out, n_tok,
                   n_in, 0, nt)
            call()
            best = min((lambda t0: (call(), clock() - t0)[1])(clock()) for _ in range(9))
            print(f"{mm_symbol(isa):34s} {n_in}x{n_out}, {n_tok:3d} tokens: {best * 1e3:8.3f} ms "
                  f"{macs / best / 1e9:7.1f} GMAC/s", flush=True)


if __name__ == "__main__":
    if "--bench" in sys.argv[1:]:
        args = sys.argv[1:]
        bench(int(args[args.index("--rounds") + 1]) if "--rounds" in args else 21, wall="--wall" in args)
    else:
        sys.exit(pytest.main([__file__, *sys.argv[1:]]))
