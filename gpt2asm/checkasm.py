"""The test harness's clobber check (checkasm-style): every call into libgpt2asm through the library's
trampoline gpt2asm_checked_call (asm/*/checkasm_*.S, docs/kernels.md), which loads canaries into the
callee-saved registers, calls the function with the caller's arguments untouched, and reports what it
broke -- a callee-saved register (x86-64: rbx, rbp, r12-r15; AArch64: x19-x29, d8-d15), the stack
pointer, the FP control register (MXCSR / FPCR), the direction flag or the AVX upper state (x86), or
streaming mode / ZA left on (SME).  A broken call raises ClobberError naming the function and what.

    open_library(path) -> ctypes.CDLL   the one switch: a CheckedLibrary when $GPT2ASM_CHECKASM is set
                                        (and not "0"), else a plain ctypes.CDLL.  tests/conftest.py sets
                                        it for the test session; gpt2asm.kernels.load_library and the
                                        kernel tests' own loaders open the library through here.

A CheckedLibrary hands out a CheckedFunction for every gpt2asm_* symbol except the library's worker
entries (gpt2asm_worker_*: they return only at shutdown) and the trampoline's own: it takes argtypes /
restype like a ctypes function and sets them on the function and on its own prototype of the
trampoline, so the trampoline sees exactly the function's argument registers and stack.  The
trampoline's state is static, so the calls are serialised by one process-wide lock (not a speed path:
benchmarks and the package run without $GPT2ASM_CHECKASM).
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading

ENV = "GPT2ASM_CHECKASM"
ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
    platform.machine().lower(), platform.machine())

# gpt2asm_checked_state: u64 slots (asm/*/checkasm_*.S)
ST_TARGET, ST_FLAGS, ST_STATUS = 0, 1, 2
FLAG_EXTRA = 1                 # x86: check the AVX upper state (XGETBV 1); AArch64: check SVCR (SME)
# the bits of STATUS
BITS = {
    "x86_64": {0: "rbx", 1: "rbp", 2: "r12", 3: "r13", 4: "r14", 5: "r15", 24: "the stack pointer (rsp)",
               25: "the MXCSR control bits", 26: "the direction flag (DF left set)",
               27: "the AVX upper state (no vzeroupper)"},
    "aarch64": {**{i: f"x{19 + i}" for i in range(11)}, **{16 + i: f"d{8 + i}" for i in range(8)},
                24: "the stack pointer (sp)", 25: "FPCR", 26: "SVCR (streaming mode or ZA left on)"},
}
NO_TARGET = 1 << 31
# symbols not routed through the trampoline
UNCHECKED = ("gpt2asm_worker_", "gpt2asm_checked_")

_LOCK = threading.RLock()     # the trampoline's state is static: one call at a time


class ClobberError(AssertionError):
    """A function broke the calling convention (found by gpt2asm_checked_call)."""


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def open_library(path) -> ctypes.CDLL:
    """libgpt2asm at path: checked (CheckedLibrary) if $GPT2ASM_CHECKASM is set, else a plain CDLL."""
    return CheckedLibrary(str(path)) if enabled() else ctypes.CDLL(str(path))


def describe(status: int, arch: str = ARCH) -> list[str]:
    """The names of what the bits of a STATUS word say was broken."""
    names = BITS.get(arch, {})
    out = [names.get(b, f"bit {b}") for b in range(32) if status >> b & 1 and b != 31]
    if status & NO_TARGET:
        out.append("nothing (no target was set)")
    return out


class CheckedLibrary(ctypes.CDLL):
    """A ctypes.CDLL whose gpt2asm_* functions (CheckedFunction) run through gpt2asm_checked_call."""

    def __init__(self, name, *args, **kw):
        super().__init__(name, *args, **kw)
        try:
            # extern uint64_t gpt2asm_checked_state[];   [0] target, [1] flags, [2] status (then private)
            self._state = (ctypes.c_uint64 * 3).in_dll(self, "gpt2asm_checked_state")
        except ValueError:
            raise OSError(f"{name} has no gpt2asm_checked_state: rebuild it (make build), or unset {ENV}") from None
        self._flags: int | None = None

    def __getitem__(self, name):
        fn = super().__getitem__(name)
        if isinstance(name, str) and name.startswith("gpt2asm_") and not name.startswith(UNCHECKED):
            return CheckedFunction(self, name, fn)
        return fn

    def raw(self, name: str):
        """The function without the check (a fresh ctypes object)."""
        return super().__getitem__(name)

    def flags(self) -> int:
        """FLAGS for the trampoline: the extra check when the CPU has what it needs (probed once)."""
        if self._flags is None:
            self._flags = 0                      # (calls made while probing run without the extra check)
            self._flags = FLAG_EXTRA if _extra_check(self) else 0
        return self._flags


def _extra_check(lib: CheckedLibrary) -> bool:
    if ARCH == "x86_64":                         # XINUSE needs XGETBV with ECX = 1, and AVX state enabled
        cpuid = lib.raw("gpt2asm_cpuid")
        cpuid.argtypes, cpuid.restype = [ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)], None
        r = (ctypes.c_uint32 * 4)()
        cpuid(0, 0, r)
        if r[0] < 13:
            return False
        cpuid(1, 0, r)
        if not (r[2] >> 27 & 1 and r[2] >> 28 & 1):          # OSXSAVE, AVX
            return False
        xgetbv = lib.raw("gpt2asm_xgetbv")
        xgetbv.argtypes, xgetbv.restype = [ctypes.c_uint32], ctypes.c_uint64
        if xgetbv(0) & 6 != 6:
            return False
        cpuid(13, 1, r)
        return bool(r[0] >> 2 & 1)
    if ARCH == "aarch64":                        # reading SVCR needs SME
        from .cpu import arm_features         # (cpu_arm.py went into cpu.py)
        return bool(arm_features(lib=lib).get("sme"))
    return False


class CheckedFunction:
    """One library function called through gpt2asm_checked_call; raises ClobberError if it broke the ABI."""

    _FORWARD = ("argtypes", "restype", "errcheck")

    def __init__(self, lib: CheckedLibrary, name: str, fn):
        object.__setattr__(self, "_lib", lib)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_addr", ctypes.cast(fn, ctypes.c_void_p).value)
        # <fn's prototype> gpt2asm_checked_call(<fn's arguments>);   calls state[0] (this function's own
        # ctypes object: argtypes and restype are fn's)
        tramp = lib.raw("gpt2asm_checked_call")
        tramp.restype = fn.restype
        object.__setattr__(self, "_tramp", tramp)

    def __setattr__(self, key, value):
        if key in self._FORWARD:
            setattr(self._fn, key, value)
            setattr(self._tramp, key, value)
        else:
            object.__setattr__(self, key, value)

    def __getattr__(self, key):
        return getattr(self._fn, key)

    def __repr__(self) -> str:
        return f"<checked {self._name}>"

    def __call__(self, *args):
        lib, st = self._lib, self._lib._state
        flags = lib.flags()
        with _LOCK:
            prev = st[ST_TARGET]                 # a call made from a finaliser in between keeps ours
            st[ST_FLAGS] = flags
            st[ST_TARGET] = self._addr
            try:
                result = self._tramp(*args)
            finally:
                status = st[ST_STATUS]
                st[ST_STATUS] = 0
                st[ST_TARGET] = prev
        if status:
            raise ClobberError(f"{self._name} broke the calling convention: {', '.join(describe(status))} "
                               f"(caught by gpt2asm_checked_call, {ENV}=1)")
        return result

