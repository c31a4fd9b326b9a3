"""The Arm library and CPU probing: the pure parts everywhere, the rest on AArch64 (real or qemu-user).

On x86-64 `make test` runs the decoding and symbol-list tests; `make test-arm64` runs the whole file under
qemu-aarch64 for each of SVL 512, 256, 128 and a CPU without SME (tools/arm64/run_tests.py).
"""
from __future__ import annotations

import ctypes
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from arm64_qemu import IS_ARM, qemu_cpu, qemu_svl_bits

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import build  # noqa: E402  (build.py: the symbol lists and the source hash)
from gpt2asm import cpu  # noqa: E402

arm_only = pytest.mark.skipif(not IS_ARM, reason="AArch64 only (make test-arm64 runs it under qemu)")


# --------------------------------------------------------------------------------------------------
# everywhere: decoding and the symbol lists

def test_decode_hwcaps():
    f = cpu.decode_hwcaps(1 << 0 | 1 << 1 | 1 << 9 | 1 << 10, 1 << 23 | 1 << 37 | 1 << 42)
    assert f["fp"] and f["asimd"] and f["fphp"] and f["asimdhp"]
    assert f["sme"] and f["sme2"] and f["sme_f16f16"]
    assert not f["sve"] and not f["sme_fa64"] and not f["sme2p1"]
    assert set(cpu.FEATURES) <= set(f)


@pytest.mark.parametrize("feats, want", [
    ({}, []),
    ({"asimd": True}, ["neon"]),
    ({"asimd": True, "sme": True, "svl_bytes": 64}, ["neon"]),                 # SME without SME2
    ({"asimd": True, "sme": True, "sme2": True, "svl_bytes": 16}, ["neon", "sme2"]),
    ({"asimd": True, "sme": True, "sme2": True, "svl_bytes": 32}, ["neon", "sme2"]),
    ({"asimd": True, "sme": True, "sme2": True, "svl_bytes": 64}, ["neon", "sme2"]),
    ({"asimd": True, "sme": True, "sme2": True, "svl_bytes": 128}, ["neon"]),  # SVL 1024: NEON + note
    ({"asimd": True, "sme": True, "sme2": True, "svl_bytes": 0}, ["neon"]),
])
def test_families_from(feats, want):
    assert cpu.families_from(feats) == want
    assert [f for f in want if f not in cpu.ARM_FAMILIES] == []


def test_notes_for_large_svl():
    notes = cpu.notes_from({"asimd": True, "sme2": True, "svl_bytes": 128})
    assert len(notes) == 1 and "1024 bits" in notes[0] and "NEON" in notes[0]
    assert cpu.notes_from({"asimd": True, "sme2": True, "svl_bytes": 64}) == []


def test_symbol_lists():
    syms = build.bound_symbols("aarch64")
    assert syms[:4] == ["gpt2asm_build_id", "gpt2asm_rdsvl", "gpt2asm_plan_abi", "gpt2asm_readbw_f32_neon"]
    assert syms[4] == "gpt2asm_fmapeak_f32_neon"
    assert len(syms) == len(set(syms)) == 5 + len(build.KERNEL_OPS) + 2
    assert build.bound_symbols("aarch64", "sme2")[5:] == ["gpt2asm_matvec_f32_sme2", "gpt2asm_matvec_f16_sme2"]
    assert build.kernel_symbol("matvec_f16", "sme2") == "gpt2asm_matvec_f16_sme2"
    assert build.kernel_symbol("gelu_f32", "sme2") == "gpt2asm_gelu_f32_neon"
    assert build.kernel_symbol("attention_f32", "avx512") == "gpt2asm_attention_f32_avx512"
    # the binary16-cache attention: avx512 calls avx2's (SHARED_OPS, only that op), sme2 neon's
    assert build.kernel_symbol("attention_f16", "avx512") == "gpt2asm_attention_f16_avx2"
    assert build.kernel_symbol("attention_f16", "sme2") == "gpt2asm_attention_f16_neon"
    from gpt2asm.kernels import SHARED_OPS
    assert SHARED_OPS == build.SHARED_OPS
    # the -s order is the same in build.py, gpt2asm/kernels.py and gpt2asm/cpu.py
    from gpt2asm.cpu import FAMILIES
    for arch, fams in build.FAMILY_OPS.items():
        assert list(fams) == FAMILIES[arch]
    assert cpu.ARM_FAMILIES == FAMILIES["aarch64"]


# --------------------------------------------------------------------------------------------------
# AArch64: the library, probing, RDSVL

@arm_only
def test_library_loads_and_is_aarch64():
    from gpt2asm.lib import LIB_NAME, PKG_DIR, load_library
    lib = load_library()                       # raises LibraryError if missing or stale
    path = PKG_DIR / LIB_NAME
    head = path.read_bytes()[:64]
    if head[:4] == b"\x7fELF":
        assert int.from_bytes(head[18:20], "little") == 183          # EM_AARCH64
    else:
        assert int.from_bytes(head[4:8], "little") == 0x0100000C     # CPU_TYPE_ARM64
    for name in build.COMMON_SYMBOLS["aarch64"]:
        assert hasattr(lib, name), name


@arm_only
def test_readbw_probe():
    """gpt2asm_readbw_f32_neon (make bench's bandwidth baseline): reads exactly n floats, sums them."""
    import numpy as np
    from gpt2asm.lib import load_library
    from gpt2asm.weights import aligned_empty
    fn = load_library().gpt2asm_readbw_f32_neon
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_float
    for n in (0, 64, 128, 64 * 37):
        buf = aligned_empty(n + 64, np.float32)
        buf[:n] = np.arange(n) % 8
        buf[n:] = np.nan                                     # past the end: must not be read
        assert fn(buf.ctypes.data, n) == float((np.arange(n) % 8).sum())


@arm_only
def test_fmapeak_probe():
    """gpt2asm_fmapeak_f32_neon (make bench's FMA-peak baseline): n rounds of fma(1, 1, acc) from +0."""
    from gpt2asm.lib import load_library
    fn = load_library().gpt2asm_fmapeak_f32_neon
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_float
    for n in (0, 1, 7, 1000, 1 << 24):
        assert fn(n) == float(n)


@arm_only
def test_build_id_matches_sources():
    from gpt2asm.lib import load_library
    lib = load_library()
    lib.gpt2asm_build_id.restype = ctypes.c_char_p
    got = lib.gpt2asm_build_id().decode()
    assert got == build.source_hash("aarch64")
    h = hashlib.sha256()
    for p in build.sources("aarch64"):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    assert got == h.hexdigest()


@arm_only
def test_probing():
    f = cpu.arm_features(refresh=True)
    assert f["asimd"] and f["fp"]
    assert f["os"] in ("linux", "darwin")
    if f["os"] == "linux":
        libc = ctypes.CDLL(None)
        libc.getauxval.restype = ctypes.c_ulong
        libc.getauxval.argtypes = [ctypes.c_ulong]
        assert f["hwcap"] == libc.getauxval(16) and f["hwcap2"] == libc.getauxval(26)
        assert f["sme2"] == bool(f["hwcap2"] >> 37 & 1)
    svl = qemu_svl_bits()
    if svl is not None:                        # under qemu: exactly what the -cpu option says
        assert f["sme"] == f["sme2"] == (svl > 0), (qemu_cpu(), f)
        assert f["svl_bytes"] == svl // 8
        if "sme_fa64=off" in (qemu_cpu() or ""):
            assert not f["sme_fa64"]
    if not f["sme"]:
        assert f["svl_bytes"] == 0             # and RDSVL was not executed (it would be SIGILL)


@arm_only
def test_families():
    f = cpu.arm_features()
    fams = cpu.arm_families()
    assert fams[0] == "neon"
    assert ("sme2" in fams) == (f["sme2"] and f["svl_bytes"] in (16, 32, 64))
    svl = qemu_svl_bits()
    if svl is not None:
        assert fams == (["neon", "sme2"] if svl in (128, 256, 512) else ["neon"])


@arm_only
def test_rdsvl():
    f = cpu.arm_features()
    if not f["sme"]:
        pytest.skip("no SME: gpt2asm_rdsvl would be an illegal instruction")
    svl = cpu.read_svl()
    assert svl in (16, 32, 64, 128, 256) and svl == f["svl_bytes"]
    want = qemu_svl_bits()
    if want is not None:
        assert svl * 8 == want
    if f["os"] == "linux":                     # the kernel's view: prctl(PR_SME_GET_VL) & PR_SME_VL_LEN_MASK
        libc = ctypes.CDLL(None)
        assert libc.prctl(64, 0, 0, 0, 0) & 0xFFFF == svl


@arm_only
def test_subprocess_same_cpu():
    """sys.executable starts the same (emulated) CPU: what CLI tests rely on."""
    code = "from gpt2asm import cpu; f = cpu.arm_features(); print(f['hwcap2'], f['svl_bytes'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    f = cpu.arm_features()
    assert out.stdout.split() == [str(f["hwcap2"]), str(f["svl_bytes"])]
