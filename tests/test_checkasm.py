"""The clobber check itself (gpt2asm/checkasm.py, gpt2asm_checked_call in asm/*/checkasm_*.S, docs/kernels.md):
arguments and results pass through untouched, and functions that break the calling convention on purpose
(gpt2asm_checkasm_clobber_*: a callee-saved GPR, a d8-d15 register, the stack pointer, the FP control
register, the direction flag, the AVX upper state, streaming mode) fail with a ClobberError that names the
function and the register.  The kernel tests run every kernel call through the same trampoline
(tests/conftest.py sets GPT2ASM_CHECKASM=1).  x86-64 natively; AArch64 under qemu (tools/arm64/run_tests.py).
"""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from gpt2asm import checkasm
from gpt2asm.checkasm import ARCH, CheckedFunction, CheckedLibrary, ClobberError
from gpt2asm.cpu import available_families
from gpt2asm.kernels import Kernels
from gpt2asm.lib import LIB_NAME, PKG_DIR
from gpt2asm.weights import aligned_zeros

if ARCH not in ("x86_64", "aarch64"):
    pytest.skip(f"no assembly for {ARCH}", allow_module_level=True)

U64, F64 = ctypes.c_uint64, ctypes.c_double


@pytest.fixture(scope="module")
def lib() -> CheckedLibrary:
    """The library, checked whatever $GPT2ASM_CHECKASM says (a second handle of the same .so)."""
    return CheckedLibrary(os.environ.get("GPT2ASM_TEST_LIB") or str(PKG_DIR / LIB_NAME))


def bound(lib, name: str, argtypes=(), restype=None):
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn


def test_the_switch_routes_the_harness_through_the_trampoline():
    """conftest.py turns the check on: the package's library and the kernel tests' loaders are checked,
    and so is every function Kernels binds (the plan executor's entries too), but not the worker entry."""
    if not checkasm.enabled():
        pytest.skip("GPT2ASM_CHECKASM=0")
    from gpt2asm.lib import load_library
    lib = load_library()
    assert isinstance(lib, CheckedLibrary)
    k = Kernels()
    assert isinstance(k.gelu_f32, CheckedFunction) and isinstance(k.argmax_f32, CheckedFunction)
    if k.has_plan:
        assert isinstance(k.plan_run, CheckedFunction) and isinstance(k.plan_step, CheckedFunction)
    assert not isinstance(getattr(lib, f"gpt2asm_worker_{k.family}"), CheckedFunction)
    if ARCH == "x86_64":
        import test_kernels_matvec as mv
        import test_kernels_ops as ops
        assert isinstance(mv.load_lib(), CheckedLibrary) and isinstance(ops.load_lib(), CheckedLibrary)


def test_arguments_and_result_pass_through(lib):
    """Ten integer arguments (x86-64: four of them on the stack; AArch64: two) and two doubles in, a
    double out: the trampoline keeps every argument register and the stack arguments' offsets."""
    fn = bound(lib, "gpt2asm_checkasm_args", [U64] * 10 + [F64, F64], F64)
    a = [3, 1 << 40, 7, 11, 13, 17, 19, 23, 29, 31]
    assert fn(*a, 2.5, 0.25) == 2.25 + sum((i + 1) * v for i, v in enumerate(a))
    a = list(range(100, 110))
    assert fn(*a, -1.0, 1.0) == -2.0 + sum((i + 1) * v for i, v in enumerate(a))


def test_a_size_t_result_passes_through(lib):
    """An integer result in rax / x0 (gpt2asm_argmax_f32: the index, or SIZE_MAX)."""
    k = Kernels()
    fn = bound(lib, f"gpt2asm_argmax_f32_{k.family if k.family != 'sme2' else 'neon'}",
               [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_size_t)
    x = np.zeros(1000, np.float32)
    x[777] = 5
    assert fn(x.ctypes.data, x.size) == 777
    x[3] = np.nan
    assert fn(x.ctypes.data, x.size) == (1 << 64) - 1


def expect_clobber(lib, name: str, *what: str, args=(), argtypes=()) -> str:
    """Calling name(*args) raises ClobberError naming the function and exactly `what`."""
    fn = bound(lib, name, argtypes)
    with pytest.raises(ClobberError) as e:
        fn(*args)
    msg = str(e.value)
    assert msg.startswith(f"{name} broke the calling convention: {', '.join(what)} (caught"), msg
    return msg


CALLEE_SAVED = {b: n for b, n in checkasm.BITS[ARCH].items() if b < 24}     # bit -> register


@pytest.mark.parametrize("bit", sorted(CALLEE_SAVED), ids=lambda b: CALLEE_SAVED[b])
def test_each_callee_saved_register(lib, bit):
    """gpt2asm_checkasm_clobber(mask) zeroes the registers of mask: each one is caught, and named."""
    expect_clobber(lib, "gpt2asm_checkasm_clobber", CALLEE_SAVED[bit], args=(1 << bit,), argtypes=[U64])


def test_several_at_once_and_none(lib):
    bits = sorted(CALLEE_SAVED)[1::2]
    expect_clobber(lib, "gpt2asm_checkasm_clobber", *(CALLEE_SAVED[b] for b in bits),
                   args=(sum(1 << b for b in bits),), argtypes=[U64])
    bound(lib, "gpt2asm_checkasm_clobber", [U64])(0)                # clobbers nothing: no error


def test_the_stack_pointer(lib):
    expect_clobber(lib, {"x86_64": "gpt2asm_checkasm_clobber_rsp", "aarch64": "gpt2asm_checkasm_clobber_sp"}[ARCH],
                   checkasm.BITS[ARCH][24])


def test_the_fp_control_register(lib):
    if ARCH == "x86_64":
        expect_clobber(lib, "gpt2asm_checkasm_clobber_mxcsr", "the MXCSR control bits")
    else:
        expect_clobber(lib, "gpt2asm_checkasm_clobber_fpcr", "FPCR")
    tiny = np.float32(1e-40)                                 # the trampoline undid flush-to-zero
    assert np.array_equal(Kernels().layernorm(np.array([tiny, 0], np.float32), np.ones(2, np.float32),
                                              np.zeros(2, np.float32)) != 0, [True, True])


@pytest.mark.skipif(ARCH != "x86_64", reason="x86-64: DF, vzeroupper")
def test_the_direction_flag(lib):
    expect_clobber(lib, "gpt2asm_checkasm_clobber_df", "the direction flag (DF left set)")


@pytest.mark.skipif(ARCH != "x86_64", reason="x86-64: DF, vzeroupper")
def test_a_missing_vzeroupper(lib):
    if not lib.flags():
        pytest.skip("no XGETBV(1) (XINUSE) on this CPU")
    expect_clobber(lib, "gpt2asm_checkasm_clobber_vzeroupper", "the AVX upper state (no vzeroupper)")


@pytest.mark.skipif(ARCH != "aarch64", reason="AArch64 SME")
def test_streaming_mode_left_on(lib):
    if not lib.flags():
        pytest.skip("no SME on this CPU")
    # smstart zeroes v0-v31, so d8-d15 are reported too (an SME2 kernel must save them around smstart/smstop)
    expect_clobber(lib, "gpt2asm_checkasm_clobber_sm", *(f"d{i}" for i in range(8, 16)),
                   "SVCR (streaming mode or ZA left on)")


def test_the_caller_survives_and_the_next_call_is_clean(lib):
    """After a caught clobber the trampoline has restored the caller's registers, sp and FP control:
    kernels run on, and a good call reports nothing."""
    for _ in range(3):
        with pytest.raises(ClobberError):
            bound(lib, "gpt2asm_checkasm_clobber", [U64])(-1 & 0xFFFFFFFF)
    x = np.linspace(-3, 3, 37, dtype=np.float32)
    k = Kernels()
    want = k.gelu(x)
    assert np.array_equal(k.gelu(x), want)
    assert bound(lib, "gpt2asm_checkasm_args", [U64] * 10 + [F64, F64], F64)(*range(10), 1.0, 1.0) == \
        sum((i + 1) * i for i in range(10))


def test_no_target_is_reported(lib):
    """Called directly, without a target, the trampoline calls nothing and says so."""
    tramp = lib.raw("gpt2asm_checked_call")
    tramp.argtypes, tramp.restype = [], ctypes.c_uint64
    st = lib._state
    with checkasm._LOCK:
        st[checkasm.ST_TARGET] = 0
        assert tramp() == 0
        status, st[checkasm.ST_STATUS] = st[checkasm.ST_STATUS], 0
    assert status == checkasm.NO_TARGET
    assert checkasm.describe(status) == ["nothing (no target was set)"]


def test_every_family_is_clean_on_a_plan():
    """One plan step of each family this machine has, through the trampoline (the kernel tests run every
    kernel; this is the cheap smoke test of the executors' own prologues and epilogues)."""
    rng = np.random.default_rng(0)
    for fam in available_families():
        for threads in (1, 2):
            k = Kernels(fam, threads)
            w = aligned_zeros((3, 70, 64), np.float32)
            w[:] = rng.standard_normal(w.shape).astype(np.float32)
            x = rng.standard_normal(70).astype(np.float32)
            assert np.array_equal(k.matvec(w, x), Kernels(fam).matvec(w, x))
            k.close()
