"""checkasm-style tests of the SME2 q8_0 / q4_0 kernels (asm/aarch64/matvec_q0_sme2.S, matmul_q0_sme2.S):

    gpt2asm_matvec_{q8_0,q4_0}_sme2      (docs/kernels.md "q8_0 / q4_0", "AArch64")
    gpt2asm_matmul_{q8_0,q4_0}_sme2      (asm/aarch64/matmul_q0_sme2.S)

Bit for bit against tests/q0ref.py (and so against the NEON variants), with the harness of
tests/test_kernels_q0_arm.py: odd block counts, tile ranges, NULL bias, extremes, misaligned guarded
buffers, PROT_NONE page guards.  The kernels depend on the streaming vector length, so under make test-arm64
this file runs in every CPU configuration (ARM64_TESTS: SVL 512, 256, 128 without FA64; everything skips
without SME2).  The first calls run in a forked child, so an instruction illegal in streaming mode (SIGILL)
or a fault is a test failure with the signal's name.

Run:  python3 tools/arm64/run_tests.py --cpus "sme512 sme256 sme128 nosme" -j 1 tests/test_kernels_q0_sme2.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import q0ref  # noqa: E402
from arm64_qemu import IS_ARM, qemu_cpu, qemu_svl_bits  # noqa: E402
from forked import fork_status, run_forked  # noqa: E402
import test_kernels_q0_arm as h  # noqa: E402    (the harness: runners, references, random cases)
from test_kernels_matvec import PageFenced  # noqa: E402

pytestmark = pytest.mark.skipif(not IS_ARM, reason="AArch64 only (make test-arm64 runs it under qemu)")

F32, TILE, QK = np.float32, 64, 32
KINDS = ("q8_0", "q4_0")
ISA = "sme2"


def _case(rng, kind, n_out, n_in, bias=True):
    q, d = h.random_weights(rng, kind, n_out, n_in)
    xq, xd = q0ref.quantize_act(h.random_x(rng, n_in))
    b = h.random_x(rng, -(-n_out // TILE) * TILE) if bias else None
    return q, d, xq, xd, b


@pytest.fixture(scope="module")
def lib():
    if not IS_ARM:
        pytest.skip("AArch64 only")
    lib = h._load()
    for kind in KINDS:
        fn = getattr(lib, f"gpt2asm_matvec_{kind}_{ISA}")
        fn.argtypes, fn.restype = [h.P, h.P, h.P, h.P, h.P, h.S, h.S, h.S], None
        fn = getattr(lib, f"gpt2asm_matmul_{kind}_{ISA}")
        fn.argtypes, fn.restype = [h.P, h.P, h.S, h.P, h.S, h.P, h.P, h.S, h.S, h.S, h.S, h.S], None
    from gpt2asm import cpu as cpu_arm
    f = cpu_arm.arm_features(lib)
    if not f.get("sme2"):
        pytest.skip(f"no SME2 on this CPU ({qemu_cpu() or 'real hardware'})")
    if f["svl_bytes"] not in cpu_arm.SME2_SVL_BYTES:
        pytest.skip(f"SVL {f['svl_bytes'] * 8} bits: the sme2 kernels need 128, 256 or 512")
    svl = qemu_svl_bits()
    assert svl is None or f["svl_bytes"] * 8 == svl
    rng = np.random.default_rng(1)
    jobs = [(kind, *_case(rng, kind, 130, 96)) for kind in KINDS]

    def first_calls() -> bool:                    # in a child: a trap fails the test, not the run
        ok = True
        for kind, q, d, xq, xd, b in jobs:
            qp, dp, nt = h.pad(q, d)
            y = h.matvec(lib, kind, ISA, q0ref.tile(q, d, kind), xq, xd, b, 96, nt, 0, nt)
            ok &= bool(h.same_bits(y, h.ref_matvec(qp, dp, xq, xd, b, 0, nt)).all())
            X = np.random.default_rng(2).standard_normal((3, 96)).astype(F32)
            h.check_matmul(lib, kind, ISA, q, d, X, b, 0, nt)
        return ok
    sig, code = fork_status(first_calls)
    if sig:
        pytest.fail(f"first calls of the SME2 q0 kernels killed by {sig} (SIGILL: an instruction illegal in "
                    f"streaming mode without FA64?)")
    return lib


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_in", [32, 64, 96, 800])
def test_sizes(lib, kind, n_in):
    """Odd block counts, 1..5 tiles, partial last tiles, ranges not at 0, with and without bias."""
    rng = np.random.default_rng(n_in + len(kind))
    for k, (n_out, tb, te) in enumerate(((64, 0, 1), (100, 0, 2), (200, 1, 4), (320, 0, 5), (130, 2, 3))):
        if n_in == 800 and k > 2:
            break
        q, d, xq, xd, b = _case(rng, kind, n_out, n_in, bias=k % 2 == 0)
        h.check_matvec(lib, kind, ISA, q, d, xq, xd, b, tb, te, seed=k)


@pytest.mark.parametrize("kind", KINDS)
def test_extremes(lib, kind):
    """Every weight int against xq = +-127, all-zero / +-amax / subnormal / non-finite blocks, special
    binary16 scales (the extremes test of the NEON file, on the sme2 kernel)."""
    h.test_matvec_extremes(lib, kind, ISA)


@pytest.mark.parametrize("kind", KINDS)
def test_empty_and_split(lib, kind):
    rng = np.random.default_rng(7)
    q, d, xq, xd, b = _case(rng, kind, 7 * TILE, 64)
    w = q0ref.tile(q, d, kind)
    for tb, te in ((0, 0), (3, 3), (4, 2)):
        h.matvec(lib, kind, ISA, w, xq, xd, None, 64, 7, tb, te)
    whole = h.matvec(lib, kind, ISA, w, xq, xd, b, 64, 7, 0, 7)
    for lo, hi in ((0, 3), (3, 4), (4, 7)):
        part = h.matvec(lib, kind, ISA, w, xq, xd, b, 64, 7, lo, hi)
        assert np.array_equal(part[TILE * lo:TILE * hi].view(np.uint32), whole[TILE * lo:TILE * hi].view(np.uint32))
    neon = h.matvec(lib, kind, "neon", w, xq, xd, b, 64, 7, 0, 7)
    assert np.array_equal(neon.view(np.uint32), whole.view(np.uint32))


def test_page_guards(lib):
    """In a child: w (the range's tiles only), xq, xd, b, y butting against PROT_NONE pages."""
    rng = np.random.default_rng(9)
    jobs = []
    for kind in KINDS:
        for n_in, n_out, tb, te in ((32, 64, 0, 1), (96, 200, 1, 4), (64, 320, 2, 5)):
            q, d, xq, xd, b = _case(rng, kind, n_out, n_in)
            qp, dp, nt = h.pad(q, d)
            jobs.append((kind, q0ref.tile(q, d, kind), xq, xd, b, n_in, tb, te,
                         h.ref_matvec(qp, dp, xq, xd, b, tb, te)))

    def child() -> bool:
        ok = True
        for kind, w, xq, xd, b, n_in, tb, te, exp in jobs:
            rec, nb = q0ref.RECORD[kind], n_in // QK
            for at_end in (True, False):
                sub = w[tb * nb * rec:te * nb * rec]
                wg = PageFenced(sub.nbytes, at_end).put(sub)
                qg = PageFenced(xq.nbytes, at_end).put(xq)
                dg = PageFenced(xd.nbytes, at_end).put(xd)
                bs = b[TILE * tb:TILE * te]
                bg = PageFenced(bs.nbytes, at_end).put(bs)
                yg = PageFenced(bs.nbytes, at_end)
                getattr(lib, f"gpt2asm_matvec_{kind}_{ISA}")(
                    wg.addr - tb * nb * rec, qg.addr, dg.addr, bg.addr - 4 * TILE * tb,
                    yg.addr - 4 * TILE * tb, n_in, tb, te)
                ok &= bool(h.same_bits(yg.get(F32), exp).all())
        return ok
    run_forked(child)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T", [1, 3, 5, 17])
def test_matmul(lib, kind, T):
    """Token counts below, at and above the V tokens of a pass (4, 8, 16), padded strides, ranges not at 0,
    NULL bias: every row the matvec's bits."""
    rng = np.random.default_rng(300 + T)
    for k, (n_in, n_out, tb, te) in enumerate(((32, 64, 0, 1), (96, 200, 1, 4), (64, 130, 0, 3))):
        q, d = h.random_weights(rng, kind, n_out, n_in)
        X = rng.standard_normal((T, n_in)).astype(F32)
        b = h.random_x(rng, -(-n_out // TILE) * TILE) if k % 2 == 0 else None
        h.check_matmul(lib, kind, ISA, q, d, X, b, tb, te, pad_q=(0, 5, 32)[k], pad_d=(0, 1, 3)[k],
                       pad_y=(0, 3, 64)[k], seed=k)


@pytest.mark.parametrize("kind", KINDS)
def test_matmul_extremes(lib, kind):
    h.test_matmul_extremes(lib, kind, ISA)


@pytest.mark.parametrize("kind", KINDS)
def test_matmul_empty(lib, kind):
    rng = np.random.default_rng(61)
    q, d = h.random_weights(rng, kind, 128, 64)
    w = q0ref.tile(q, d, kind)
    xq, xd = np.zeros((2, 64), np.int8), np.zeros((2, 2), F32)
    for T, tb, te in ((0, 0, 2), (2, 1, 1), (2, 2, 1)):
        h.matmul(lib, kind, ISA, w, xq, 64, xd, 2, None, 128, T, 64, 2, tb, te)


def test_matmul_page_guards(lib):
    """In a child: every buffer of a 5-token matmul butting against PROT_NONE pages."""
    rng = np.random.default_rng(19)
    jobs = []
    for kind in KINDS:
        for n_in, n_out, tb, te in ((32, 64, 0, 1), (96, 200, 1, 4)):
            q, d, xq, xd, b = _case(rng, kind, n_out, n_in)
            qp, dp, nt = h.pad(q, d)
            jobs.append((kind, q0ref.tile(q, d, kind), xq, xd, b, n_in, tb, te,
                         h.ref_matvec(qp, dp, xq, xd, b, tb, te)))

    def child() -> bool:
        ok = True
        for kind, w, xq, xd, b, n_in, tb, te, exp in jobs:
            rec, nb, T = q0ref.RECORD[kind], n_in // QK, 5
            for at_end in (True, False):
                sub = w[tb * nb * rec:te * nb * rec]
                wg = PageFenced(sub.nbytes, at_end).put(sub)
                qg = PageFenced(T * xq.nbytes, at_end).put(np.tile(xq, T))
                dg = PageFenced(T * xd.nbytes, at_end).put(np.tile(xd, T))
                bs = b[TILE * tb:TILE * te]
                bg = PageFenced(bs.nbytes, at_end).put(bs)
                yg = PageFenced(T * bs.nbytes, at_end)
                nto = TILE * (te - tb)
                getattr(lib, f"gpt2asm_matmul_{kind}_{ISA}")(
                    wg.addr - tb * nb * rec, qg.addr, n_in, dg.addr, nb, bg.addr - 4 * TILE * tb,
                    yg.addr - 4 * TILE * tb, nto, T, n_in, tb, te)
                ok &= bool(h.same_bits(yg.get(F32), np.tile(exp, T)).all())
        return ok
    run_forked(child)


def test_wrappers(lib):
    """gpt2asm.kernels.ArmQ0(family="sme2") binds the sme2 kernels: the bits of the neon ones."""
    from gpt2asm.q0kernels import ArmQ0
    from gpt2asm.validate import aligned_bytes as _aligned_zeros
    k, n = ArmQ0(family="sme2"), ArmQ0(cap="neon")
    assert k.isa["matvec"] == k.isa["matmul"] == "sme2"
    rng = np.random.default_rng(5)
    for kind in KINDS:
        q, d, xq, xd, b = _case(rng, kind, 130, 64)
        flat = q0ref.tile(q, d, kind)
        w = _aligned_zeros(flat.size)
        w[:] = flat
        assert np.array_equal(k.matvec(kind, w, 64, xq, xd, b).view(np.uint32),
                              n.matvec(kind, w, 64, xq, xd, b).view(np.uint32))
        X, D = np.stack([xq] * 5), np.stack([xd] * 5)
        assert np.array_equal(k.matmul(kind, w, 64, X, D, b).view(np.uint32),
                              n.matmul(kind, w, 64, X, D, b).view(np.uint32))
