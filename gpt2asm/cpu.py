"""CPU probing: which of gpt2asm's kernel families (-s) this machine can run, on x86-64 and AArch64.

    available_families() -> list   the usable families of this machine, best last
    choose_family(-s or None) -> str   -s / $GPT2ASM_ISA resolved; an unavailable choice is an error
    cpu_features() -> dict         what the CPU/OS offers, as far as the families care

x86-64: CPUID and XGETBV through the library's gpt2asm_cpuid / gpt2asm_xgetbv (avx2: AVX2, FMA, F16C and
the OS saving YMM; avx512: AVX-512F and the OS saving ZMM).

AArch64: Linux reads the ELF auxiliary vector (getauxval(AT_HWCAP) and getauxval(AT_HWCAP2) from libc,
through ctypes); macOS reads sysctlbyname("hw.optional.arm.FEAT_SME2") and friends.  The streaming vector
length (SVL) comes from the assembly function gpt2asm_rdsvl (RDSVL), which is called only when the OS
reports SME: on a CPU without it RDSVL is an illegal instruction.

    arm_features() -> dict     what the CPU/OS offers (booleans) plus "svl_bytes" (0 without SME)
    arm_families() -> list     the usable families, best last: [], ["neon"] or ["neon", "sme2"]
    arm_notes()    -> list     why a family the CPU nearly supports is not used (e.g. an SVL above 512)
    q0_isa(op)     -> str      the variant of the q8_0 / q4_0 integer kernels to use inside the neon family:
                               "neon" (base ARMv8.0), "dotprod" (FEAT_DotProd sdot) or "i8mm" (FEAT_I8MM
                               smmla, prefill only); $GPT2ASM_ARM_Q0 caps it (tests force "neon")

The Arm decoding functions are pure (tested everywhere; the probes under qemu-aarch64, see
tools/arm64/).  `python -m gpt2asm.cpu` prints what was found.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from ctypes import c_uint32, c_uint64

from .errors import InvalidArgumentError, KernelUnavailableError, shown
from .lib import ARCH, bind, load_library

# -s values per architecture: index and name, best last.
FAMILIES = {"x86_64": ["avx2", "avx512"], "aarch64": ["neon", "sme2"]}


# --------------------------------------------------------------------------------------------------
# the families of this machine

def available_families() -> list[str]:
    """Kernel families this machine can run, best last."""
    if ARCH == "aarch64":
        return arm_families()       # neon, plus sme2 when SME2 with SVL 128..512 bits
    if ARCH != "x86_64":
        return []
    f = cpu_features()
    out = []
    if f["avx"] and f["avx2"] and f["fma"] and f["f16c"] and f["os_ymm"]:
        out.append("avx2")
        if f["avx512f"] and f["os_zmm"]:
            out.append("avx512")
    return out


def choose_family(requested: str | int | None = None) -> str:
    """Resolve -s / $GPT2ASM_ISA to a family name; an unavailable choice is an error, not a fallback."""
    names = FAMILIES.get(ARCH, [])
    have = available_families()
    if requested is None:
        requested = os.environ.get("GPT2ASM_ISA") or None
    if requested is None:
        if not have:
            raise KernelUnavailableError(
                f"this CPU has none of gpt2asm's kernel families ({', '.join(names) or 'none for ' + ARCH}); "
                "on x86-64 AVX2 with FMA and F16C is the minimum, on AArch64 Advanced SIMD")
        return have[-1]
    req = str(requested).strip().lower()
    if req.isdigit():
        if int(req) >= len(names):
            raise InvalidArgumentError(f"-s {req}: choose 0..{len(names) - 1} ({', '.join(names)})")
        req = names[int(req)]
    if req not in names:
        raise InvalidArgumentError(f"unknown kernel family {shown(requested)}: choose one of {', '.join(names)}")
    if req not in have:
        raise KernelUnavailableError(f"kernel family {shown(req)} is not supported by this CPU/OS "
                                     f"(available: {', '.join(have) or 'none'})")
    return req


def cpu_features() -> dict[str, bool]:
    """What the CPU and OS support, as far as gpt2asm's kernel families care."""
    if ARCH == "aarch64":
        return arm_features()
    if ARCH != "x86_64":
        return {}
    return x86_features()


# --------------------------------------------------------------------------------------------------
# x86-64

def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
    # void gpt2asm_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t regs[4]);
    fn = bind(load_library(), "gpt2asm_cpuid", [c_uint32, c_uint32, ctypes.POINTER(c_uint32)])
    regs = (c_uint32 * 4)()
    fn(leaf, subleaf, regs)
    return tuple(regs)


def xgetbv(xcr: int) -> int:
    # uint64_t gpt2asm_xgetbv(uint32_t xcr);
    return int(bind(load_library(), "gpt2asm_xgetbv", [c_uint32], c_uint64)(xcr))


def x86_features() -> dict[str, bool]:
    """CPUID leaves 1 and 7 and XCR0: the instruction sets and the register state the OS saves."""
    max_leaf = cpuid(0)[0]
    _, _, ecx1, _ = cpuid(1)
    ebx7 = cpuid(7, 0)[1] if max_leaf >= 7 else 0
    osxsave = bool(ecx1 >> 27 & 1)
    xcr0 = xgetbv(0) if osxsave else 0
    return {
        "fma": bool(ecx1 >> 12 & 1), "osxsave": osxsave, "avx": bool(ecx1 >> 28 & 1),
        "f16c": bool(ecx1 >> 29 & 1), "avx2": bool(ebx7 >> 5 & 1), "avx512f": bool(ebx7 >> 16 & 1),
        "os_ymm": xcr0 & 0b110 == 0b110, "os_zmm": xcr0 & 0b11100110 == 0b11100110,
    }


# --------------------------------------------------------------------------------------------------
# AArch64
AT_HWCAP = 16
AT_HWCAP2 = 26

# Linux arch/arm64/include/uapi/asm/hwcap.h: feature name -> bit, in AT_HWCAP ...
HWCAP_BITS = {
    "fp": 0, "asimd": 1, "aes": 3, "pmull": 4, "sha1": 5, "sha2": 6, "crc32": 7, "atomics": 8,
    "fphp": 9, "asimdhp": 10, "cpuid": 11, "asimdrdm": 12, "jscvt": 13, "fcma": 14, "lrcpc": 15,
    "dcpop": 16, "sha3": 17, "sm3": 18, "sm4": 19, "asimddp": 20, "sha512": 21, "sve": 22,
    "asimdfhm": 23, "dit": 24, "uscat": 25, "ilrcpc": 26, "flagm": 27, "ssbs": 28, "sb": 29,
    "paca": 30, "pacg": 31,
}
# ... and in AT_HWCAP2
HWCAP2_BITS = {
    "sve2": 1, "i8mm": 13, "bf16": 14, "bti": 17,
    "sme": 23, "sme_i16i64": 24, "sme_f64f64": 25, "sme_i8i32": 26, "sme_f16f32": 27,
    "sme_b16f32": 28, "sme_f32f32": 29, "sme_fa64": 30, "sve2p1": 36, "sme2": 37, "sme2p1": 38,
    "sme_i16i32": 39, "sme_bi32i32": 40, "sme_b16b16": 41, "sme_f16f16": 42,
}
# macOS: feature name -> sysctl names (the first that exists wins; a missing name means "no")
SYSCTL_NAMES = {
    "fp": ["hw.optional.floatingpoint"],
    "asimd": ["hw.optional.arm.AdvSIMD", "hw.optional.neon"],
    "fphp": ["hw.optional.arm.FEAT_FP16", "hw.optional.neon_fp16"],
    "asimdhp": ["hw.optional.arm.FEAT_FP16", "hw.optional.neon_fp16"],
    "asimddp": ["hw.optional.arm.FEAT_DotProd"],
    "asimdfhm": ["hw.optional.arm.FEAT_FHM"],
    "i8mm": ["hw.optional.arm.FEAT_I8MM"],
    "bf16": ["hw.optional.arm.FEAT_BF16"],
    "sve": ["hw.optional.arm.FEAT_SVE"],
    "sve2": ["hw.optional.arm.FEAT_SVE2"],
    "sme": ["hw.optional.arm.FEAT_SME"],
    "sme2": ["hw.optional.arm.FEAT_SME2"],
    "sme2p1": ["hw.optional.arm.FEAT_SME2p1"],
    "sme_fa64": ["hw.optional.arm.FEAT_SME_FA64"],
    "sme_i16i64": ["hw.optional.arm.FEAT_SME_I16I64"],
    "sme_f64f64": ["hw.optional.arm.FEAT_SME_F64F64"],
    "sme_i8i32": ["hw.optional.arm.SME_I8I32"],
    "sme_f16f32": ["hw.optional.arm.SME_F16F32"],
    "sme_b16f32": ["hw.optional.arm.SME_B16F32"],
    "sme_f32f32": ["hw.optional.arm.SME_F32F32"],
    "sme_i16i32": ["hw.optional.arm.SME_I16I32"],
    "sme_bi32i32": ["hw.optional.arm.SME_BI32I32"],
    "sme_b16b16": ["hw.optional.arm.FEAT_SME_B16B16", "hw.optional.arm.SME_B16B16"],
    "sme_f16f16": ["hw.optional.arm.FEAT_SME_F16F16", "hw.optional.arm.SME_F16F16"],
}
FEATURES = sorted(set(HWCAP_BITS) | set(HWCAP2_BITS) | set(SYSCTL_NAMES))

ARM_FAMILIES = FAMILIES["aarch64"]         # the -s order on Arm: 0 = neon, 1 = sme2
SME2_SVL_BYTES = (16, 32, 64)              # SVL 128, 256, 512 bits: what the sme2 kernels handle


# --------------------------------------------------------------------------------------------------
# decoding (pure; testable anywhere)

def decode_hwcaps(hwcap: int, hwcap2: int) -> dict[str, bool]:
    """Feature booleans from Linux's AT_HWCAP / AT_HWCAP2 words."""
    f = {name: False for name in FEATURES}
    f.update({name: bool(hwcap >> bit & 1) for name, bit in HWCAP_BITS.items()})
    f.update({name: bool(hwcap2 >> bit & 1) for name, bit in HWCAP2_BITS.items()})
    return f


def families_from(features: dict) -> list[str]:
    """The usable families for a feature dict, best last."""
    out = []
    if features.get("asimd") and features.get("fp", True):
        out.append("neon")
        if features.get("sme2") and features.get("svl_bytes", 0) in SME2_SVL_BYTES:
            out.append("sme2")
    return out


def notes_from(features: dict) -> list[str]:
    """Human-readable reasons why sme2 is not used although the CPU has SME2."""
    notes = []
    svl = features.get("svl_bytes", 0)
    if features.get("sme2") and svl not in SME2_SVL_BYTES:
        notes.append(f"SME2 present but its streaming vector length is {svl * 8} bits; the sme2 kernels "
                     f"handle 128, 256 and 512, so NEON is used")
    return notes


# the q8_0 / q4_0 integer kernels' variants inside the neon family (docs/kernels.md "q8_0 / q4_0"), worst first, and the
# feature each needs; matvec has no i8mm variant (smmla needs two tokens)
Q0_ISAS = ("neon", "dotprod", "i8mm")
Q0_NEEDS = {"neon": "asimd", "dotprod": "asimddp", "i8mm": "i8mm"}
Q0_OPS = {"quantize": ("neon",), "matvec": ("neon", "dotprod"), "matmul": ("neon", "dotprod", "i8mm")}


def q0_isa_from(op: str, features: dict, cap: str | None = None) -> str:
    """The best variant of op ("quantize", "matvec", "matmul") the features allow, at most cap."""
    if cap is not None and cap not in Q0_ISAS:
        raise ValueError(f"unknown q8_0/q4_0 kernel variant {cap!r}: choose one of {', '.join(Q0_ISAS)}")
    limit = Q0_ISAS.index(cap) if cap else len(Q0_ISAS) - 1
    best = "neon"
    for isa in Q0_OPS[op]:
        if Q0_ISAS.index(isa) <= limit and features.get(Q0_NEEDS[isa]):
            best = isa
    return best


def q0_isa(op: str, lib=None, cap: str | None = None) -> str:
    """The variant of op this machine runs: q0_isa_from(op, arm_features(lib), cap or $GPT2ASM_ARM_Q0)."""
    return q0_isa_from(op, arm_features(lib), cap or os.environ.get("GPT2ASM_ARM_Q0") or None)


# --------------------------------------------------------------------------------------------------
# probing the running machine

def _linux_hwcaps() -> tuple[int, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    getauxval = libc.getauxval
    getauxval.argtypes = [ctypes.c_ulong]
    getauxval.restype = ctypes.c_ulong
    return int(getauxval(AT_HWCAP)), int(getauxval(AT_HWCAP2))


def _sysctl_int(libc, name: str) -> int | None:
    """An integer sysctl by name, or None if it does not exist."""
    value = ctypes.c_uint64(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if libc.sysctlbyname(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    return value.value & ((1 << (8 * size.value)) - 1) if size.value < 8 else value.value


def _darwin_features() -> dict[str, bool]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "/usr/lib/libSystem.B.dylib")
    libc.sysctlbyname.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                  ctypes.c_void_p, ctypes.c_size_t]
    libc.sysctlbyname.restype = ctypes.c_int
    f = {name: False for name in FEATURES}
    for feature, names in SYSCTL_NAMES.items():
        for name in names:
            v = _sysctl_int(libc, name)
            if v is not None:
                f[feature] = bool(v)
                break
    f["fp"] = f["fp"] or f["asimd"]             # every Apple arm64 CPU
    svl = _sysctl_int(libc, "hw.optional.arm.sme_max_svl_b")
    f["_sysctl_max_svl_bytes"] = svl or 0
    return f


def read_svl(lib=None) -> int:
    """Streaming vector length in bytes, from gpt2asm_rdsvl.  Only call it on a CPU with SME."""
    if lib is None:
        lib = load_library()
    fn = lib.gpt2asm_rdsvl
    fn.argtypes = []
    fn.restype = ctypes.c_uint64
    return int(fn())


_cache: dict | None = None


def arm_features(lib=None, refresh: bool = False) -> dict:
    """What this AArch64 machine offers: {feature: bool} (names as in HWCAP_BITS / HWCAP2_BITS, e.g.
    "asimd", "fphp", "asimdhp", "sme", "sme2", "sme_f16f16", "sme_fa64"), plus
    "os" ("linux" or "darwin"), "hwcap" and "hwcap2" (Linux; 0 on macOS) and "svl_bytes" (the streaming
    vector length in bytes from RDSVL; 0 without SME).  lib: a loaded libgpt2asm (default: the package's).
    Cached after the first call (refresh=True probes again)."""
    global _cache
    if _cache is not None and not refresh and lib is None:
        return dict(_cache)
    if sys.platform == "darwin":
        f = _darwin_features()
        f.update(os="darwin", hwcap=0, hwcap2=0)
    elif sys.platform.startswith("linux"):
        hwcap, hwcap2 = _linux_hwcaps()
        f = decode_hwcaps(hwcap, hwcap2)
        f.update(os="linux", hwcap=hwcap, hwcap2=hwcap2)
    else:
        f = {name: False for name in FEATURES}
        f.update(os=sys.platform, hwcap=0, hwcap2=0)
    f["svl_bytes"] = 0
    if f["sme"]:
        try:
            f["svl_bytes"] = read_svl(lib)
        except (AttributeError, OSError):         # an old library without gpt2asm_rdsvl
            f["svl_bytes"] = 0
    f.pop("_sysctl_max_svl_bytes", None)
    if lib is None:
        _cache = dict(f)
    return f


def arm_families(lib=None) -> list[str]:
    """Kernel families this AArch64 machine can run, best last, among ARM_FAMILIES: "neon" with Advanced
    SIMD; "sme2" too with SME2 and an SVL of 128, 256 or 512 bits."""
    return families_from(arm_features(lib))


def arm_notes(lib=None) -> list[str]:
    return notes_from(arm_features(lib))


if __name__ == "__main__":                      # python -m gpt2asm.cpu: print what was found
    if ARCH == "aarch64":
        feats = arm_features()
        print(" ".join(k for k in FEATURES if feats.get(k)))
        print(f"svl_bytes={feats['svl_bytes']} hwcap={feats['hwcap']:#x} hwcap2={feats['hwcap2']:#x}")
        print("q8_0/q4_0:", " ".join(f"{op}={q0_isa(op)}" for op in Q0_OPS))
        for note in arm_notes():
            print("note:", note)
    else:
        print(" ".join(k for k, v in cpu_features().items() if v))
    print("families:", " ".join(available_families()) or "none")
