"""Self-test of tests/avx512emu.py, the AVX-512 emulator harness.

Assembles tests/emu_selftest.S into a throw-away shared object, runs its AVX-512 functions under the
emulator and checks them against numpy, and checks that AVX-512 under emulation, AVX2 under emulation
and AVX2 natively (ctypes) give identical bits.  Also checks that faults, ABI breaches, out-of-bounds
writes and endless loops are reported, and measures the emulation speed.

Skipped when bochscpu-python is not installed (pip install -r tests/requirements-emu.txt) or there is
no C compiler.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import avx512emu  # noqa: E402
from avx512emu import (AbiViolation, Avx512Emulator, CpuFault, ElfError, EmulationTimeout,  # noqa: E402
                       GuardViolation)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")

if not avx512emu.available():
    pytest.skip(avx512emu.why_unavailable(), allow_module_level=True)
if CC is None:
    pytest.skip("no C compiler to assemble tests/emu_selftest.S", allow_module_level=True)


def assemble(src: Path, out: Path) -> Path:
    subprocess.run([CC, "-shared", "-nostdlib", "-o", str(out), str(src)], check=True)
    return out


@pytest.fixture(scope="module")
def selftest_so(tmp_path_factory) -> Path:
    return assemble(HERE / "emu_selftest.S", tmp_path_factory.mktemp("emu") / "emu_selftest.so")


@pytest.fixture(scope="module")
def emu(selftest_so) -> Avx512Emulator:
    e = Avx512Emulator(selftest_so, arena_size=64 << 20, timeout=60.0)
    yield e
    e.close()


def host_has(feature: str) -> bool:
    try:
        return feature in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


HOST_AVX2 = host_has("avx2") and host_has("fma") and host_has("f16c")


@pytest.fixture(scope="module")
def native(selftest_so):
    """The AVX2 twins, run on the real CPU."""
    if not HOST_AVX2:
        pytest.skip("host CPU lacks AVX2/FMA/F16C")
    lib = ctypes.CDLL(str(selftest_so))
    p, n = ctypes.c_void_p, ctypes.c_size_t
    lib.st_fma_f32_avx2.argtypes = [p, p, p, n]
    lib.st_sum_f32_avx2.argtypes = [p, n]
    lib.st_sum_f32_avx2.restype = ctypes.c_float
    lib.st_f16_misc_avx2.argtypes = [p, p, p, p, n]
    lib.st_fma_loop_avx2.argtypes = [ctypes.c_uint64]
    lib.st_sum_args.argtypes = [ctypes.c_int64] * 8 + [ctypes.c_double, ctypes.c_float]
    lib.st_sum_args.restype = ctypes.c_double
    lib.st_matvec64_avx2.argtypes = [p, p, p, n]
    return lib


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint64)


def random_f32(rng, n: int) -> np.ndarray:
    """Normal numbers of mixed magnitude plus some denormals, zeros of both signs and infinities."""
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    k = max(n // 8, 1)
    if n >= 8:
        x[rng.integers(0, n, k)] = (rng.standard_normal(k) * 1e-40).astype(np.float32)   # denormals
        x[rng.integers(0, n, 2)] = [0.0, -0.0]
    return x


SIZES = [0, 1, 7, 8, 15, 16, 17, 31, 100, 1000, 4099]


# --------------------------------------------------------------------------------------------------
# the emulated CPU

def test_cpu_reports_avx512_and_os_support(emu):
    out = np.zeros(8, np.uint32)
    emu.call("st_cpuinfo", out)
    c1_ecx, c7_ebx, c7_ecx, c7_edx, xcr0_lo, xcr0_hi, mxcsr, c1_edx = (int(v) for v in out)
    assert c7_ebx >> 16 & 1, "AVX512F"
    assert c7_ebx >> 17 & 1 and c7_ebx >> 30 & 1 and c7_ebx >> 31 & 1, "AVX512DQ/BW/VL"
    assert c7_ebx >> 5 & 1, "AVX2"
    assert c1_ecx >> 12 & 1 and c1_ecx >> 29 & 1 and c1_ecx >> 28 & 1, "FMA, F16C, AVX"
    assert c1_ecx >> 27 & 1, "OSXSAVE"
    assert xcr0_lo & 0xE7 == 0xE7 and xcr0_hi == 0, "XCR0 = x87|SSE|AVX|opmask|ZMM_Hi256|Hi16_ZMM"
    assert mxcsr == 0x1F80
    assert emu.cpuid(7, 0)[1] == c7_ebx and emu.xgetbv(0) == 0xE7


# --------------------------------------------------------------------------------------------------
# results: numpy, AVX-512 emulated, AVX2 emulated, AVX2 native

@pytest.mark.parametrize("n", SIZES)
def test_fma_bit_exact(emu, native, n):
    rng = np.random.default_rng(n)
    a, b, c = random_f32(rng, n), random_f32(rng, n), random_f32(rng, n)
    c512, c2e, c2n = c.copy(), c.copy(), c.copy()
    emu.call("st_fma_f32_avx512", a, b, c512, n)
    emu.call("st_fma_f32_avx2", a, b, c2e, n)
    native.st_fma_f32_avx2(ptr(a), ptr(b), ptr(c2n), n)
    assert np.array_equal(bits(c512), bits(c2n)), "AVX-512 (emulated) != AVX2 (native)"
    assert np.array_equal(bits(c2e), bits(c2n)), "AVX2 (emulated) != AVX2 (native)"
    # numpy has no float32 fma: a*b is exact in float64, so the float64 sum rounds at most once more
    ref = (a.astype(np.float64) * b + c).astype(np.float32)
    finite = np.isfinite(ref)
    ulps = np.abs(bits(ref[finite]).astype(np.int64) - bits(c512[finite]).astype(np.int64))
    assert ulps.size == 0 or ulps.max() <= 1
    assert np.array_equal(np.isinf(c512), np.isinf(ref))


@pytest.mark.parametrize("n", SIZES)
def test_sum_bit_exact(emu, native, n):
    rng = np.random.default_rng(100 + n)
    x = rng.standard_normal(n).astype(np.float32)
    s512 = emu.call("st_sum_f32_avx512", x, n, ret="float")
    s2e = emu.call("st_sum_f32_avx2", x, n, ret="float")
    s2n = np.float32(native.st_sum_f32_avx2(ptr(x), n))
    # numpy model of the same order: 16 lane sums, then the reduction tree
    lanes = np.zeros(16, np.float32)
    padded = np.zeros(-(-n // 16) * 16, np.float32)
    padded[:n] = x
    for row in padded.reshape(-1, 16):
        lanes = lanes + row
    for half in (8, 4, 2, 1):
        lanes = lanes[:half] + lanes[half:2 * half]
    assert bits(s512) == bits(s2n) == bits(s2e) == bits(lanes[0])


@pytest.mark.parametrize("n", [0, 16, 64, 1024])
def test_f16_permute_round_shift_bit_exact(emu, native, n):
    rng = np.random.default_rng(200 + n)
    x16 = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(np.float16)
    h = x16.view(np.uint16)
    outs = {}
    for name in ("emu512", "emu2", "native2"):
        rev, flo, shr = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.int32)
        if name == "emu512":
            emu.call("st_f16_misc_avx512", h, rev, flo, shr, n)
        elif name == "emu2":
            emu.call("st_f16_misc_avx2", h, rev, flo, shr, n)
        else:
            native.st_f16_misc_avx2(ptr(h), ptr(rev), ptr(flo), ptr(shr), n)
        outs[name] = (rev, flo, shr)
    x = x16.astype(np.float32)
    expect = (x.reshape(-1, 16)[:, ::-1].reshape(-1), np.floor(x), np.trunc(x).astype(np.int32) >> 1)
    for name, got in outs.items():
        for g, e in zip(got, expect):
            assert np.array_equal(g.view(np.uint32), e.view(np.uint32)), name


@pytest.mark.parametrize("n_in", [0, 1, 3, 768])
def test_matvec_tile_bit_exact(emu, native, n_in):
    rng = np.random.default_rng(300 + n_in)
    w = rng.standard_normal((n_in, 64)).astype(np.float32)
    x = rng.standard_normal(n_in).astype(np.float32)
    y512, y2e, y2n = (np.full(64, np.nan, np.float32) for _ in range(3))
    emu.call("st_matvec64_avx512", w, x, y512, n_in)
    emu.call("st_matvec64_avx2", w, x, y2e, n_in)
    native.st_matvec64_avx2(ptr(w), ptr(x), ptr(y2n), n_in)
    assert np.array_equal(bits(y512), bits(y2n)) and np.array_equal(bits(y2e), bits(y2n))
    ref = x.astype(np.float64) @ w.astype(np.float64)
    assert np.allclose(y512, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.sqrt(n_in)))


def test_opmask_registers_start_poisoned(emu):
    assert emu.call("st_read_k1") == 0x5555_5555_5555_5555


def test_stack_and_vector_arguments(emu, native):
    args = (1, -2, 3, 1 << 40, 5, -(1 << 33), 7, 123456789)
    want = sum((k + 1) * a for k, a in enumerate(args)) + 0.5 + 0.25
    got = emu.call("st_sum_args", *args, 0.5, np.float32(0.25), ret="double")
    assert got == want == native.st_sum_args(*args, 0.5, 0.25)


def test_relative_relocation_and_rip_relative_rodata(emu):
    assert emu.call("st_load_const", ret="u32") == 0x600DCAFE


def test_masked_lanes_do_not_fault(emu):
    base = np.arange(64, dtype=np.float32)      # 256 bytes: ends exactly at a page end, then a guard page
    out = np.full(16, -1.0, np.float32)
    emu.call("st_masked_load_avx512", base, 60, 4, out)
    assert np.array_equal(out, np.r_[base[60:], np.zeros(12, np.float32)])
    with pytest.raises(CpuFault) as e:          # the same load unmasked runs into the guard page
        emu.call("st_masked_load_avx512", base, 60, 16, out)
    assert e.value.vector == 14 and "past the end of argument 0" in str(e.value)


def test_in_place_call_shares_one_buffer(emu):
    rng = np.random.default_rng(7)
    a, b = random_f32(rng, 40), random_f32(rng, 40)
    c = a.copy()
    emu.call("st_fma_f32_avx512", a, b, c, 40)
    emu.call("st_fma_f32_avx512", a, b, a, 40)  # c aliases a: a = fma(a, b, a)
    assert np.array_equal(bits(a), bits(c))
    with pytest.raises(ValueError, match="overlaps"):
        emu.call("st_fma_f32_avx512", a[:20], b, a[10:30], 10)


# --------------------------------------------------------------------------------------------------
# misbehaviour is reported, and the emulator stays usable

def test_invalid_opcode_is_reported_with_rip_and_bytes(emu):
    with pytest.raises(CpuFault) as e:
        emu.call("st_ud")
    f = e.value
    assert f.vector == 6
    assert f.rip == emu.address_of("st_ud") + 1          # after the nop
    assert f.insn_bytes[:2] == b"\x0f\x0b"
    assert "st_ud+0x1" in str(f) and "0f 0b" in str(f)


def test_abi_violation(emu):
    with pytest.raises(AbiViolation, match="rbx not preserved"):
        emu.call("st_clobber_rbx")
    emu.call("st_clobber_rbx", check_abi=False)


def test_out_of_bounds_writes(emu):
    p = np.zeros(10, np.float32)                 # 40 bytes, padded to 64: bytes 40..63 are canaries
    with pytest.raises(GuardViolation, match="past its end"):
        emu.call("st_write_at", p, 10)
    with pytest.raises(GuardViolation, match="before its start"):
        emu.call("st_write_at", p, -1)
    with pytest.raises(CpuFault, match="write at .* past the end of argument 0"):
        emu.call("st_write_at", p, 16)          # first byte of the guard page
    emu.call("st_write_at", p, 9)
    assert p[9] == 1.0 and not p[:9].any()


def test_out_of_bounds_read_and_read_only_array(emu):
    p = np.arange(10, dtype=np.float32)
    assert emu.call("st_read_at", p, 3, ret="float") == 3.0
    with pytest.raises(CpuFault, match="read at .*not mapped"):
        emu.call("st_read_at", p, 1000)
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises(CpuFault, match="write at .*protection violation"):
        emu.call("st_write_at", ro, 0)


def test_write_to_code_faults(emu):
    with pytest.raises(CpuFault) as e:
        emu.call("st_store_to_code")
    assert e.value.vector == 14 and e.value.cr2 == emu.address_of("st_store_to_code")


def test_endless_loop_times_out(emu):
    t0 = time.monotonic()
    with pytest.raises(EmulationTimeout, match="st_spin"):
        emu.call("st_spin", timeout=0.5)
    assert time.monotonic() - t0 < 10
    # and the emulator still works afterwards
    assert emu.call("st_load_const", ret="u32") == 0x600DCAFE


def test_unknown_symbol(emu):
    with pytest.raises(KeyError, match="st_sum_f32_avx512"):
        emu.call("st_sum_f32_avx51")


def test_library_with_symbol_relocations_is_rejected(tmp_path):
    src = tmp_path / "ext.S"
    src.write_text(".text\n.globl f\n.type f,@function\nf:\n call external_function@PLT\n ret\n"
                   '.section .note.GNU-stack,"",@progbits\n')
    so = assemble(src, tmp_path / "ext.so")
    with pytest.raises(ElfError, match="symbol relocations"):
        Avx512Emulator(so)


# --------------------------------------------------------------------------------------------------
# the project's own library, when it can be built

def test_gpt2asm_library_under_emulation(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "build.py"), "--out", str(tmp_path), "-q"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"gpt2asm library does not build here: {r.stderr.strip()[-300:]}")
    lib = tmp_path / "libgpt2asm.so"
    with Avx512Emulator(lib) as e:
        regs = np.zeros(4, np.uint32)
        e.call("gpt2asm_cpuid", 7, 0, regs)
        assert regs[1] >> 16 & 1                  # the library sees AVX-512F
        assert e.call("gpt2asm_xgetbv", 0) & 0xE7 == 0xE7
        build_id = e.read_cstring(e.call("gpt2asm_build_id"))
        so = ctypes.CDLL(str(lib))
        so.gpt2asm_build_id.restype = ctypes.c_char_p
        assert build_id == so.gpt2asm_build_id()


# --------------------------------------------------------------------------------------------------
# speed

def test_emulation_speed(emu, record_property, capsys):
    """Emulated instructions per second, to judge what can run in CI (reported, loosely asserted)."""
    emu.call("st_fma_loop_avx512", 1000, count=True)
    short = emu.last.icount
    emu.call("st_fma_loop_avx512", 3000, count=True)
    assert emu.last.icount - short == 10 * 2000      # 10 instructions per iteration, all counted

    iters = 200_000                                  # register-only FMAs
    emu.call("st_fma_loop_avx512", iters)
    rate_reg = 10 * iters / emu.last.seconds
    # a GPT-2-like matvec tile: broadcast + 4 zmm FMAs from memory per input; 4 MiB of weights
    n_in = 16384
    w = np.ones((n_in, 64), np.float32)
    x = np.ones(n_in, np.float32)
    y = np.zeros(64, np.float32)
    emu.call("st_matvec64_avx512", w, x, y, n_in)
    t_call = emu.last.seconds
    rate_mv = 8 * n_in / t_call                      # instructions per second
    fma_rate = 4 * n_in / t_call                     # zmm FMAs (16 MACs each) per second
    token = 124e6 / 16 / fma_rate                    # GPT-2 124M: ~124M MACs per token
    line = (f"avx512emu: {rate_reg / 1e6:.1f} M instructions/s (register zmm FMAs), "
            f"{rate_mv / 1e6:.1f} M instructions/s = {fma_rate / 1e6:.2f} M zmm FMA/s (matvec tile "
            f"from memory) -> GPT-2 124M matvecs ~ {token:.1f} s per token under emulation")
    if HOST_AVX2:
        lib = ctypes.CDLL(str(emu.path))
        lib.st_fma_loop_avx2.argtypes = [ctypes.c_uint64]
        t0 = time.perf_counter()
        lib.st_fma_loop_avx2(iters * 10)
        native = 10 * iters * 10 / (time.perf_counter() - t0)
        line += f"; native AVX2 {native / 1e9:.1f} G instructions/s"
    record_property("emulated_instructions_per_second", rate_reg)
    record_property("emulated_seconds_per_gpt2_token_estimate", token)
    with capsys.disabled():
        print("\n" + line)
    assert rate_reg > 1e5 and rate_mv > 1e5
