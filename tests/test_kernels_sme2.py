"""checkasm-style tests of the SME2 kernels (asm/aarch64/matvec_sme2.S, matmul_sme2.S):

    gpt2asm_matvec_f32_sme2, gpt2asm_matvec_f16_sme2                     (docs/kernels.md)
    gpt2asm_matmul_{f32,f16}_sme2                                        (batched prefill; at the end)

They run on AArch64 only: real hardware with SME2, or x86-64 through `make test-arm64`, which runs this
file under qemu-aarch64 once per streaming vector length (tools/arm64/run_tests.py: -cpu
max,sme512=on,sme_fa64=off, then sme256 and sme128; in its `nosme` configuration everything skips).
FA64 is off as on Apple's M4, so an instruction that is illegal in streaming mode traps (SIGILL);
every kernel is first run in a forked child so that such a trap, or a fault, is reported as a test
failure with the signal's name instead of killing the test process.

Each call is checked exactly as the x86 kernels are (tests/test_kernels_matvec.py, whose helpers this
file reuses):
  * bit for bit against `contract_ref`, the documented per-output sequence acc = +0.0;
    acc = fma(w, x[i], acc) ...; y = acc + b in an exact binary32 FMA model (NaN-ness compared, NaN
    payloads not), so SME2 gives the same bits as AVX2/AVX-512 and NEON;
  * against float64 (`W @ x + b`) within the documented bound;
  * its memory contract: buffers inside 4 KiB canaries, x, b, y misaligned by 4 bytes, outputs outside
    the tile range untouched, inputs unchanged; and, in a forked child, every buffer butting against
    PROT_NONE pages (w holding only the tiles of the range), so one byte of over-read faults.
Tile counts and ranges cover every pass shape of every SVL (512: 4, 2 and 1 tiles a pass; 256: 2, 1;
128: 1) and row counts every tail (n_in % 4).

Run:  tools/arm64/run_tests.py --cpus "sme512 sme256 sme128" tests/test_kernels_sme2.py   (on x86-64)
      pytest tests/test_kernels_sme2.py                                                 (on Arm)
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from arm64_qemu import IS_ARM, qemu_config, qemu_cpu, qemu_svl_bits  # noqa: E402
from gpt2asm.checkasm import open_library  # noqa: E402
import forked  # noqa: E402
from forked import WHY, fork_status, run_forked  # noqa: E402
# the x86 matvec tests' helpers: the exact fma model, references, guarded buffers, the checker
from test_kernels_matvec import (DTYPES, TILE, Y_FILL, NativeRunner, PageFenced,  # noqa: E402
                                 contract_ref, random_case, run_and_check, same_bits)
import test_kernels_matvec as mv  # noqa: E402   (its test functions, called with this file's runners)

pytestmark = pytest.mark.skipif(not IS_ARM, reason="AArch64 only (make test-arm64 runs it under qemu)")

P, S = ctypes.c_void_p, ctypes.c_size_t
ISA = "sme2"
SVL_BYTES_OK = (16, 32, 64)          # SVL 128, 256, 512 bits: what the kernels handle


def symbol(dtype: str, isa: str = ISA) -> str:
    return f"gpt2asm_matvec_{dtype}_{isa}"


# --------------------------------------------------------------------------------------------------
# the library and the CPU

_STATE: dict = {}


def _load() -> ctypes.CDLL:
    """The aarch64 library: $GPT2ASM_TEST_LIB, or the package's (gpt2asm.kernels.load_library)."""
    if "lib" not in _STATE:
        if os.environ.get("GPT2ASM_TEST_LIB"):
            lib = open_library(os.environ["GPT2ASM_TEST_LIB"])     # checked when $GPT2ASM_CHECKASM
        else:
            from gpt2asm.lib import load_library
            lib = load_library()
        for dtype in DTYPES:
            for isa in (ISA, "neon"):
                fn = getattr(lib, symbol(dtype, isa), None)
                if fn is not None:
                    fn.argtypes = [P, P, P, P, S, S, S]
                    fn.restype = None
        _STATE["lib"] = lib
    return _STATE["lib"]


def _features(lib) -> dict:
    from gpt2asm import cpu
    return cpu.arm_features(lib)


def _child_calls(lib, jobs) -> tuple[bool, str]:
    """Run (dtype, wt, x, b, tb, te) calls in a forked child: (True, "") if all ran and matched the
    contract, else (False, why): a signal's name, "wrong result" or "Python exception in the child"."""
    def check():
        ok = True
        for dtype, wt, x, b, tb, te in jobs:
            y = np.full(wt.shape[0] * TILE, Y_FILL, np.uint32).view(np.float32)
            getattr(lib, symbol(dtype))(wt.ctypes.data, x.ctypes.data, None if b is None else b.ctypes.data,
                                        y.ctypes.data, wt.shape[1], tb, te)
            ok &= bool(same_bits(y[TILE * tb:TILE * te], contract_ref(wt, x, b, tb, te)).all())
        return ok
    sig, code = fork_status(check)
    if sig:
        hint = {"SIGILL": " (an instruction illegal here: in streaming mode without FA64?)",
                "SIGSEGV": " (read or wrote outside its buffers)", "SIGBUS": " (misaligned access?)",
                "SIGTRAP": " (brk: unsupported streaming vector length?)"}.get(sig, "")
        return False, f"killed by {sig}{hint}"
    return code == 0, WHY.get(code, f"exit {code}") + (f": {forked.last_error}" if forked.last_error else "")


@pytest.fixture(scope="module")
def lib():
    """The library, once it is known that this CPU runs the SME2 kernels and that they do not trap."""
    if not IS_ARM:
        pytest.skip("AArch64 only")
    lib = _load()
    missing = [symbol(d) for d in DTYPES if not hasattr(lib, symbol(d))]
    if missing:
        pytest.fail(f"the library lacks {missing}")
    f = _features(lib)
    if not f.get("sme2"):
        pytest.skip(f"no SME2 on this CPU ({qemu_cpu() or 'real hardware'})")
    if f["svl_bytes"] not in SVL_BYTES_OK:
        pytest.skip(f"SVL {f['svl_bytes'] * 8} bits: the sme2 kernels need 128, 256 or 512 (NEON is used)")
    if "probe" not in _STATE:
        rng = np.random.default_rng(99)
        jobs = []
        for dtype in DTYPES:                      # every pass shape and every tail, once
            for n_in, nt, tb, te in ((5, 7, 0, 7), (6, 3, 1, 3), (4, 1, 0, 1), (7, 2, 0, 2)):
                wt, x, b = random_case(rng, dtype, n_in, nt, bias=n_in % 2 == 1)
                jobs.append((dtype, wt, x, b, tb, te))
        _STATE["probe"] = _child_calls(lib, jobs)
    ok, why = _STATE["probe"]
    if not ok and why != "wrong result":            # wrong results: the tests below say where
        pytest.fail(f"first calls of the SME2 kernels (in a child process): {why}")
    return lib


@pytest.fixture(scope="module", params=list(DTYPES))
def runners(request, lib):
    dtype = request.param
    return dtype, [NativeRunner(lib, dtype, ISA)]


# --------------------------------------------------------------------------------------------------
# the environment: the configuration under test is what it claims (so FA64-illegal code would trap)

def test_cpu_configuration(lib):
    f = _features(lib)
    svl = qemu_svl_bits()
    if svl is not None:                                      # under qemu: the -cpu option's SVL
        assert f["svl_bytes"] * 8 == svl, (qemu_cpu(), f["svl_bytes"])
    if "sme_fa64=off" in (qemu_cpu() or ""):
        assert not f["sme_fa64"], "FA64 reported although the emulated CPU has it off"
    from gpt2asm import cpu
    assert "sme2" in cpu.families_from(f)


# --------------------------------------------------------------------------------------------------
# results: bit-exact against the contract, within the float64 bound, memory contract

# (n_tiles, tile_begin, tile_end): at SVL 512 ranges of 1..9 tiles exercise passes of 4, 2 and 1 tiles
# in every combination; ranges that start and end inside the matrix
RANGES = [(1, 0, 1), (2, 0, 2), (3, 0, 3), (4, 0, 4), (5, 0, 5), (6, 0, 6), (7, 0, 7), (9, 0, 9),
          (8, 1, 8), (11, 2, 10), (6, 5, 6), (5, 1, 4)]


@pytest.mark.parametrize("n_in", [1, 2, 3, 4, 5, 7, 8, 17, 63, 65])
def test_sizes(runners, n_in):
    """Every row tail (n_in % 4), 1..11 tiles, ranges that do not start at 0, with and without bias."""
    dtype, rs = runners
    rng = np.random.default_rng(2000 + n_in)
    for k, (nt, tb, te) in enumerate(RANGES):
        wt, x, b = random_case(rng, dtype, n_in, nt, bias=k % 2 == 0)
        run_and_check(rs, wt, x, b, tb, te, seed=k)


@pytest.mark.parametrize("n_in, nt, tb, te", [(768, 7, 0, 7), (3071, 3, 1, 2)])
def test_long_rows(runners, n_in, nt, tb, te):
    """GPT-2 sized inputs (many row blocks): rounding accumulates exactly as the contract says."""
    dtype, rs = runners
    rng = np.random.default_rng(n_in + nt)
    wt, x, b = random_case(rng, dtype, n_in, nt, bias=True)
    run_and_check(rs, wt, x, b, tb, te)


def test_split_ranges(runners):
    """Tiles split between callers (as threads do) give the same bits as one call over all of them."""
    dtype, rs = runners
    rng = np.random.default_rng(21)
    nt, n_in = 13, 96
    wt, x, b = random_case(rng, dtype, n_in, nt)
    whole = run_and_check(rs, wt, x, b, 0, nt, f64=False)[0]
    for cuts in ((0, 5, 13), (0, 1, 2, 3, 7, 13), (0, 6, 6, 11, 13)):
        for lo, hi in zip(cuts, cuts[1:]):
            part = run_and_check(rs, wt, x, b, lo, hi, f64=False)[0]
            assert np.array_equal(part[TILE * lo:TILE * hi].view(np.uint32),
                                  whole[TILE * lo:TILE * hi].view(np.uint32))


# The value cases of the x86 suite, with its tile counts (3-5: passes of several tiles at every SVL):
# exact integers, signed zeros (ZA is zeroed), NaN / inf reaching exactly their outputs (whichever ZA
# vector and lane, fp16 de-interleaved), overflow, no flush to zero in ZA / the widening / the bias add.

def test_empty_range(runners):
    mv.test_empty_range(runners)


def test_exact_integers(runners):
    mv.test_exact_integers(runners)


def test_signed_zeros(runners):
    mv.test_signed_zeros(runners)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")   # the model widening NaN halves
def test_nan_inf_propagation(runners):
    mv.test_nan_inf_propagation(runners)


def test_large_magnitudes(runners):
    mv.test_large_magnitudes(runners)


def test_denormals(runners):
    mv.test_denormals(runners)


def test_every_lane_maps_to_its_output(runners):
    """One-hot weights: output j of tile t gets exactly w = (t*64 + j + 1) (x = 1 at one row), for each
    row of a 4-row block and the tail, so a permuted lane (ZA slot, fp16 even/odd split) cannot hide."""
    dtype, rs = runners
    nt = 7
    for n_in in (4, 7):
        for i in range(n_in):
            wt = np.zeros((nt, n_in, TILE), DTYPES[dtype])
            wt[:, i, :] = (np.arange(nt * TILE).reshape(nt, TILE) % 1024 + 1)
            x = np.zeros(n_in, np.float32)
            x[i] = 1.0
            y = run_and_check(rs, wt, x, None, 0, nt, f64=False)[0]
            assert np.array_equal(y, (np.arange(nt * TILE) % 1024 + 1).astype(np.float32))


def test_same_bits_as_neon(lib):
    """The NEON kernels of the same library give the same bits (NaN-ness too): the cross-ISA promise."""
    if not all(hasattr(lib, symbol(d, "neon")) for d in DTYPES):
        pytest.skip("the library has no NEON matvec")
    rng = np.random.default_rng(8)
    for dtype in DTYPES:
        runs = [NativeRunner(lib, dtype, "neon"), NativeRunner(lib, dtype, ISA)]
        for n_in, nt, tb, te in ((768, 5, 0, 5), (65, 7, 1, 7), (3, 4, 0, 3)):
            wt, x, b = random_case(rng, dtype, n_in, nt)
            wt.reshape(-1)[rng.integers(0, wt.size, 5)] = np.nan
            x[rng.integers(0, n_in)] = -np.inf if n_in > 3 else x[0]
            y0 = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
            ys = [r(wt, x, b, y0, tb, te) for r in runs]
            ok = same_bits(ys[0], ys[1])
            assert ok.all(), f"{dtype}: NEON and SME2 differ at {np.flatnonzero(~ok)[:8]}"


# --------------------------------------------------------------------------------------------------
# no access outside the documented ranges: PROT_NONE pages around every buffer (forked child)

def test_page_guards_overread(lib):
    rng = np.random.default_rng(9)
    jobs = []
    for dtype in DTYPES:
        for n_in, nt, tb, te in ((1, 3, 1, 3), (7, 9, 2, 9), (65, 2, 0, 2), (6, 8, 1, 8), (770, 3, 1, 2)):
            wt, x, b = random_case(rng, dtype, n_in, nt)
            jobs.append((dtype, wt, x, b, tb, te, contract_ref(wt, x, b, tb, te)))

    def child() -> bool:
        ok = True
        for dtype, wt, x, b, tb, te, exp in jobs:
            fn = getattr(lib, symbol(dtype))
            tile_bytes = wt[0].nbytes
            for at_end in (True, False):
                for bias in (True, False):
                    sub = np.ascontiguousarray(wt[tb:te])
                    wg = PageFenced(max(sub.nbytes, 64), at_end).put(sub)          # tiles tb..te-1 only
                    xg = PageFenced(x.nbytes, at_end).put(x)
                    bs = b[TILE * tb:TILE * te]
                    bg = PageFenced(bs.nbytes, at_end).put(bs)
                    yg = PageFenced(bs.nbytes, at_end)
                    fn(wg.addr - tb * tile_bytes, xg.addr, (bg.addr - 4 * TILE * tb) if bias else None,
                       yg.addr - 4 * TILE * tb, wt.shape[1], tb, te)
                    want = exp if bias else contract_ref(wt, x, None, tb, te)
                    ok &= bool(same_bits(yg.get(np.float32), want).all())
        return ok
    run_forked(child)


# --------------------------------------------------------------------------------------------------
# an SVL the kernels do not handle: they stop (brk) instead of computing something wrong

_BIG_SVL_CHILD = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.gpt2asm_rdsvl.restype = ctypes.c_uint64
print("svl_bytes", lib.gpt2asm_rdsvl(), flush=True)
w = (ctypes.c_float * 64)()
x = (ctypes.c_float * 1)(1.0)
y = (ctypes.c_float * 64)()
f = lib.gpt2asm_matvec_f32_sme2
f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t] * 3
f(w, x, None, y, 1, 0, 1)
print("returned", flush=True)
"""


def test_svl_1024_refused(lib):
    """Under qemu only (the CPU model is chosen per process): at SVL 1024 the kernel traps (SIGTRAP)."""
    if qemu_cpu() is None or qemu_config() != os.environ.get("GPT2ASM_QEMU_FIRST", qemu_config()):
        pytest.skip("emulation only, first configuration only")
    path = getattr(lib, "_name", None)
    env = dict(os.environ, GPT2ASM_QEMU_CPU="max,sme1024=on,sme_fa64=off")
    r = subprocess.run([sys.executable, "-c", _BIG_SVL_CHILD, path], env=env, capture_output=True,
                       text=True, timeout=300)
    assert "svl_bytes 128" in r.stdout, (r.stdout, r.stderr)
    assert "returned" not in r.stdout and r.returncode == -signal.SIGTRAP, (r.returncode, r.stdout, r.stderr)


# --------------------------------------------------------------------------------------------------
# the prefill matmul (matmul_sme2.S): test_kernels_matmul's contract model, cases and test functions,
# with test_kernels_neon's runner (w 64-byte aligned; X, b, Y, at rotating misalignments inside 4 KiB
# canaries; inputs unchanged).  A pass is V tokens x 2V outputs (V = SVL / 32: 16, 8, 4), the inputs go
# through ZA2 in blocks of V: token counts and n_in below cover full and partial blocks of both at every
# SVL, and 64 / 2V passes a tile.

import test_kernels_matmul as mm  # noqa: E402
import test_kernels_neon as nk  # noqa: E402

MM_DTYPES = ("f32", "f16")


@pytest.fixture(params=MM_DTYPES)
def mmvariant(request, lib):
    return request.param, [nk.MatmulRunner(lib, request.param, ISA)]


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33])
def test_matmul_token_counts(mmvariant, T):
    """Token blocks of V with every tail, n_in with every input-block tail (1 .. 65), tile ranges not
    starting at 0, row gaps in X (NaN: read, they would show) and Y (must stay untouched), bias or NULL:
    bit-exact against the contract model, within the float64 bound."""
    nk.matmul_token_counts(mmvariant, T, ((1, 1, 0, 1), (3, 2, 0, 2), (6, 3, 1, 3), (17, 3, 1, 3),
                                          (16, 2, 1, 2), (65, 4, 1, 3)), seed=900)


@pytest.mark.parametrize("n_in", [2, 7, 129, 768])
def test_matmul_sizes(mmvariant, n_in):
    """Larger n_in with T = 29 and T = 8."""
    mm.test_sizes(mmvariant, n_in)


def test_matmul_empty(mmvariant):
    """n_tokens = 0 or an empty tile range: nothing is written."""
    mm.test_empty(mmvariant)


def test_matmul_special_values(mmvariant):
    """NaN / inf in one token's X reach only that token's outputs, NaN / inf weights only their output in
    every token; overflowing partial sums in the contract's order."""
    mm.test_special_values(mmvariant)


def test_matmul_denormals_and_zeros(mmvariant):
    mm.test_denormals_and_zeros(mmvariant)


@pytest.mark.parametrize("dtype", MM_DTYPES)
def test_matmul_same_bits_as_neon(lib, dtype):
    """The NEON matmul of the same library gives the same bits (NaN-ness too, payloads aside) on cases
    with NaN and infinite inputs and weights, and every row has the bits of the family's matvec on it."""
    sme, neon = nk.MatmulRunner(lib, dtype, ISA), nk.MatmulRunner(lib, dtype, "neon")
    mvfn = getattr(lib, symbol(dtype, ISA))
    rng = np.random.default_rng(910 + MM_DTYPES.index(dtype))
    for k, (n_in, nt, T, tb, te) in enumerate(((33, 4, 9, 1, 4), (1, 2, 5, 0, 2), (130, 2, 19, 0, 2),
                                               (7, 3, 20, 2, 3), (64, 1, 16, 0, 1))):
        c = mm.Case(rng, dtype, n_in, nt, T, ldx_pad=3, ldy_pad=5, bias=k % 3 != 2)
        Xi = c.X[:, :n_in]
        Xi[rng.integers(0, T), rng.integers(0, n_in)] = -np.inf
        Xi.reshape(-1)[rng.integers(0, Xi.size, 2)] = np.nan
        c.X[:, :n_in] = Xi
        c.wt.reshape(-1)[rng.integers(0, c.wt.size, 4)] = np.nan
        Ys, Yn = sme(c, tb, te, seed=k), neon(c, tb, te, seed=k)
        ok = same_bits(Ys, Yn)
        assert ok.all(), f"{dtype}: SME2 and NEON matmul differ at {np.argwhere(~ok)[:6]}"
        lo, hi = TILE * tb, TILE * te
        pb = None if c.b is None else c.b.ctypes.data
        for t in range(T):
            x = np.ascontiguousarray(c.X[t, :n_in])
            y = np.full(nt * TILE, Y_FILL, np.uint32).view(np.float32)
            mvfn(c.wt.ctypes.data, x.ctypes.data, pb, y.ctypes.data, n_in, tb, te)
            assert same_bits(Ys[t, lo:hi], y[lo:hi]).all(), f"{dtype}: token {t} differs from the matvec"


def test_matmul_page_guards(lib):
    """test_kernels_neon.matmul_page_guards for the SME2 kernels (token and input blocks of V = 16 with
    tails among the shapes)."""
    nk.matmul_page_guards(lib, ISA, MM_DTYPES, nk.MM_GUARD_SHAPES + ((65, 2, 17, 0, 2, 0), (16, 2, 16, 0, 2, 1)),
                          seed=920)
