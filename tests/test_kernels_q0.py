"""checkasm-style tests (and a benchmark) for the q8_0 / q4_0 integer kernels (docs/kernels-q0.md).

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
EMU_ISAS = ("avx512", "avx512vnni")              # what tests/avx512emu.py's CPU runs
Y_FILL = np.uint32(0x7FC0DEAD)
P, S = ctypes.c_void_p, ctypes.c_size_t


def quant_symbol(isa: str) -> str:
    return f"gpt2asm_quantize_q8_0_{isa}"


def mv_symbol(kind: str, isa: str) -> str:
    return f"gpt2asm_matvec_{kind}_{isa}"


def load_lib() -> ctypes.CDLL:
    lib = mv.load_lib()                  # builds the library once per session, binds cpuid & co.
    for isa in QUANT_ISAS:
        fn = getattr(lib, quant_symbol(isa))
        fn.argtypes = [P, P, P, S]
        fn.restype = None
    for kind in KINDS:
        for isa in MV_ISAS:
            fn = getattr(lib, mv_symbol(kind, isa), None)
            if fn is None:
                continue
            fn.argtypes = [P, P, P, P, P, S, S, S]
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
    """'native' and/or 'emu' for this variant here, or pytest.skip."""
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
