"""Run exported functions of an x86-64 ELF shared library under an emulated AVX-512 CPU.

The CI machines have AVX2 but not AVX-512, so the AVX-512 kernels of libgpt2asm.so cannot run natively.
This helper runs them on BochsCPU (the CPU core of the Bochs emulator, PyPI package `bochscpu-python`,
pinned in tests/requirements-emu.txt).  Its CPU model ("GenuineIntel", Ice Lake-like) has AVX-512
F/CD/BW/DQ/VL/IFMA/VBMI/VBMI2/VNNI/BITALG/VPOPCNTDQ, AVX2, FMA, F16C and BMI1/2, and computes with
softfloat: IEEE-exact operations (add, mul, fma, div, sqrt, conversions, rounding, min/max, NaN
propagation) give the same bits as the hardware.  The approximations VRCPPS/VRSQRTPS (and the
AVX-512 VRCP14/VRSQRT14) are implementation-specific: on an AMD Zen 4 half of VRCPPS/VRSQRTPS results
differ from Bochs', so compare kernels that use them with a tolerance, or avoid them.

    from avx512emu import Avx512Emulator, available, why_unavailable
    if not available():
        pytest.skip(why_unavailable())
    emu = Avx512Emulator("gpt2asm/libgpt2asm.so")        # parse + map the library once
    y = np.empty_like(x)
    emu.call("gpt2asm_expf_f32_avx512", x, y, x.size)     # arrays are copied in and back out
    s = emu.call("some_sum_f32_avx512", x, x.size, ret="float")
    expf = emu.bind("gpt2asm_expf_f32_avx512")            # raw mode: host addresses, nothing copied
    expf(x.ctypes.data, y.ctypes.data, x.size)

What a call does (System V AMD64 ABI):
  * integer/pointer arguments (python int, numpy integer, bool, None = NULL, numpy array = pointer to an
    emulated copy) go to rdi, rsi, rdx, rcx, r8, r9 and then the stack; np.float32 scalars go to the
    next xmm register as a float, python float / np.float64 as a double (xmm0-xmm7, then the stack);
  * every array is copied into a data arena, its start 64-byte aligned and its 64-byte-rounded end at
    the end of a page, and the page after it is unmapped: any access past the 64-byte-rounded end
    faults at once.  The rest of its pages (the bytes before its start, and the padding up to 64 bytes
    after its end) hold a canary that is checked after the call, so any out-of-bounds write is
    reported (reads of the padding or just before the start are not);
  * read-only numpy arrays (arr.flags.writeable False) are mapped read-only: a write to them faults;
    the same array object passed twice (an in-place kernel) maps to one emulated buffer;
  * the function runs in 64-bit long mode (ring 0, 4-level paging, NX enforced, the library's segments
    mapped with their ELF permissions), MXCSR = 0x1F80, x87 CW = 0x37F, CR4.OSXSAVE set,
    XCR0 = x87|SSE|AVX|opmask|ZMM_Hi256|Hi16_ZMM; all other GPRs, all 32 zmm registers (signalling
    NaNs) and k0-k7 start with poison values, so a kernel that reads an uninitialised register shows it;
  * it returns to a sentinel address holding `hlt`; a CPU exception (#UD for an unknown instruction,
    #PF, #GP, ...) is delivered through an IDT whose handlers also `hlt`, and is raised as CpuFault with
    the faulting RIP (and symbol+offset), the instruction bytes, the error code and CR2;
  * afterwards it checks the ABI (rbx, rbp, r12-r15, rsp, DF, MXCSR control bits and the x87 control
    word preserved) and the canaries, copies writable arrays back into the caller's arrays and returns
    rax (or xmm0 with ret="float"/"double").
  * a wall-clock watchdog (timeout= seconds, a POSIX timer thread that sets the emulator's stop flag,
    so it costs nothing per instruction) turns an endless loop into EmulationTimeout.

Raw-pointer mode (`emu.call_raw(symbol, *args)`, `emu.bind(symbol) -> fn(*args)`): pointer arguments are
raw host addresses (ints; numpy arrays pass their data address), so a caller that works with addresses,
like gpt2asm's engine through `Kernels._bind`, runs unchanged on the emulated CPU:
  * the guest's virtual address space IS the host's: each emulator's own block of pages (page tables,
    system pages, stacks, library image, arena) is mapped at the guest address equal to its host mmap
    address, and any other host address is mapped on demand;
  * on demand = in the exception hook, which Bochs calls when the #PF is raised and before the CPU reads
    the IDT: the faulting address is looked up in /proc/self/maps (a snapshot per call); if the host has
    it mapped readable (and writable, for a write), the aligned `raw_window` around it (2 MiB by default,
    clipped to that host mapping and never overlapping the emulator's block) gets page-table entries
    (NX; writable only if the host mapping is), the hook points the #PF gate at an `add $8,%rsp; iretq`
    stub, and the faulting instruction runs again.  Anything else keeps the gate on its hlt stub and is
    raised as CpuFault as usual, with the reason (e.g. "not mapped in the host process", "write to a
    read-only host mapping");
  * host VAs have 47 bits and the emulated CPU's physical addresses 40, so guest-physical frames are a
    translation: each host 2 MiB window touched gets a 2 MiB guest-physical range (from slots of the same
    allocator as the emulators'), page i backed by the host page itself through bochscpu's
    memory.page_insert(gpa, host pointer).  The frames are cached for the life of the process (a host page
    reused by a later allocation is still the same page); the page-table entries are dropped after each
    call, so a host page that is unmapped later can never be touched by a later call;
  * no data is copied in or out: reads see the host arrays and writes land in them.  The price: there are
    no guard pages or canaries around the data, so an out-of-bounds access that stays inside a mapped host
    region is not detected (use call() with arrays for that).  Calls are serialised by a lock (one CPU).

Quirks of bochscpu-python that this module works around (see tests/requirements-emu.txt):
  * 0.4.0's wheel is tagged manylinux_2_28 but needs glibc 2.38 (__isoc23_strtoull): it does not import
    on Debian 12 (glibc 2.36).  0.3.1 (manylinux_2_35) works and is the pinned version.
  * only ONE bochscpu.Session may exist per process (a second one corrupts the missing-page handler and
    crashes with "free(): invalid pointer"), so all emulators share a module-level session, each with its
    own page tables (CR3) and its own range of guest-physical addresses.
  * Session.run() holds the GIL, so a Python thread cannot stop it; the watchdog calls the exported C
    function cpu_set_killbit() from a POSIX timer thread instead.
  * the exception hook reports RIP *after* the faulting instruction; the precise RIP comes from the
    interrupt frame that the CPU pushes onto the IST stack when it delivers the exception.
  * python objects of the binding that are still alive at interpreter exit make nanobind print leak
    warnings and can segfault, so an atexit hook closes every emulator and drops the session.
  * State.mxcsr_mask defaults to 0, which makes STMXCSR store 0 and LDMXCSR of any bit #GP: set 0xFFFF.
  * opmask registers k0-k7 cannot be read or set through the binding: each call enters through a
    trampoline that sets them to 0x5555555555555555 (and their final values cannot be read).
  * Memory.phy_write takes a list of ints in 0.3.1 but bytes in 0.4.0: this module never uses it (it
    backs guest memory with its own mmap and writes it through numpy).
"""
from __future__ import annotations

import atexit
import bisect
import ctypes
import difflib
import mmap
import struct
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

try:                                        # the emulator is optional: tests skip without it
    import bochscpu
    import bochscpu.cpu
    import bochscpu.memory as _bmem
    from bochscpu import _bochscpu
    _IMPORT_ERROR: str | None = None
except Exception as _e:                     # ImportError, or OSError/ImportError from a glibc mismatch
    bochscpu = None
    _IMPORT_ERROR = f"bochscpu-python is not usable: {type(_e).__name__}: {_e}"

__all__ = ["Avx512Emulator", "available", "why_unavailable", "EmulationError", "CpuFault",
           "EmulationTimeout", "GuardViolation", "AbiViolation", "ElfError"]


def available() -> bool:
    """True if the emulator package (bochscpu-python) imports."""
    return why_unavailable() is None


def why_unavailable() -> str | None:
    """None if available(), else a one-line reason (for pytest.skip)."""
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR + " (pip install -r tests/requirements-emu.txt)"
    return None


# --------------------------------------------------------------------------------------------------
# errors

class EmulationError(RuntimeError):
    """Anything that went wrong while running a function under emulation."""


class CpuFault(EmulationError):
    """The emulated CPU raised an exception (#UD, #PF, #GP, ...)."""

    def __init__(self, msg: str, *, vector: int, rip: int | None, error_code: int | None,
                 cr2: int | None, insn_bytes: bytes, where: str):
        super().__init__(msg)
        self.vector, self.rip, self.error_code = vector, rip, error_code
        self.cr2, self.insn_bytes, self.where = cr2, insn_bytes, where


class EmulationTimeout(EmulationError):
    """The function did not return within the timeout (endless loop?)."""


class GuardViolation(EmulationError):
    """The function wrote outside an array (canary bytes around it changed)."""


class AbiViolation(EmulationError):
    """The function broke the System V calling convention (callee-saved state not preserved)."""


class ElfError(ValueError):
    """The shared library cannot be loaded by this helper."""


_EXC_NAMES = {0: "#DE divide error", 1: "#DB debug", 2: "NMI", 3: "#BP breakpoint", 4: "#OF overflow",
              5: "#BR bound range", 6: "#UD invalid/unsupported opcode", 7: "#NM device not available",
              8: "#DF double fault", 10: "#TS invalid TSS", 11: "#NP segment not present",
              12: "#SS stack fault", 13: "#GP general protection", 14: "#PF page fault",
              16: "#MF x87 FP error", 17: "#AC alignment check", 18: "#MC machine check",
              19: "#XM SIMD FP exception", 20: "#VE virtualization", 21: "#CP control protection"}
_EXC_WITH_ERROR_CODE = {8, 10, 11, 12, 13, 14, 17, 21, 29, 30}


# --------------------------------------------------------------------------------------------------
# ELF parsing (stdlib only)

PAGE = 4096
_PT_LOAD, _PT_DYNAMIC, _PT_TLS, _PT_GNU_RELRO = 1, 2, 7, 0x6474E552
_PF_X, _PF_W = 1, 2
_SHT_DYNSYM = 11
_DT = dict(NEEDED=1, PLTRELSZ=2, RELA=7, RELASZ=8, RELAENT=9, INIT=12, FINI=13, REL=17, RELSZ=18,
           JMPREL=23, INIT_ARRAYSZ=27, RELRSZ=35, RELR=36, PREINIT_ARRAYSZ=33, TEXTREL=22)
_R_X86_64_NONE, _R_X86_64_RELATIVE = 0, 8
_STT_FUNC, _STT_GNU_IFUNC = 2, 10


@dataclass
class _Segment:
    vaddr: int
    memsz: int
    offset: int          # file offset of data
    data: bytes          # file contents (filesz bytes); the rest up to memsz is zero (.bss)
    flags: int


@dataclass
class _Symbol:
    value: int           # offset from the load base
    size: int
    type: int


@dataclass
class _Elf:
    segments: list[_Segment]
    relro: list[tuple[int, int]]          # (vaddr, memsz) of PT_GNU_RELRO
    symbols: dict[str, _Symbol]
    relative_relocs: list[tuple[int, int]]  # (offset, addend): *(base+offset) = base+addend
    max_align: int


def _parse_elf(data: bytes, path: str) -> _Elf:
    """Parse what the loader needs; raise ElfError for anything this helper cannot handle."""
    def fail(why: str) -> ElfError:
        return ElfError(f"{path}: {why}")

    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise fail("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise fail("not a 64-bit little-endian ELF")
    (e_type, e_machine, _, _, e_phoff, e_shoff, _, _, e_phentsize, e_phnum, e_shentsize, e_shnum,
     _) = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
    if e_machine != 62:
        raise fail(f"e_machine {e_machine} is not x86-64")
    if e_type != 3:
        raise fail("not a shared object (ET_DYN); only position-independent libraries can be mapped")

    segments, relro, dynamic = [], [], None
    max_align = PAGE
    for i in range(e_phnum):
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz, p_align = struct.unpack_from(
            "<IIQQQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == _PT_LOAD:
            segments.append(_Segment(p_vaddr, p_memsz, p_offset, data[p_offset:p_offset + p_filesz],
                                     p_flags))
            max_align = max(max_align, p_align)
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
        elif p_type == _PT_TLS and p_memsz:
            raise fail("has thread-local storage (PT_TLS), which needs a real dynamic loader")
        elif p_type == _PT_GNU_RELRO:
            relro.append((p_vaddr, p_memsz))
    if not segments:
        raise fail("no PT_LOAD segment")

    def file_offset(vaddr: int) -> int:       # dynamic-table entries hold virtual addresses
        for seg in segments:
            if seg.vaddr <= vaddr < seg.vaddr + len(seg.data):
                return seg.offset + vaddr - seg.vaddr
        raise fail(f"dynamic table address {vaddr:#x} is outside the file-backed segments")

    # ---- dynamic section: dependencies, initialisers and relocations
    dyn: dict[int, list[int]] = {}
    if dynamic is not None:
        off, size = dynamic
        for j in range(size // 16):
            tag, val = struct.unpack_from("<qQ", data, off + 16 * j)
            if tag == 0:
                break
            dyn.setdefault(tag, []).append(val)

    def one(tag: str) -> int:
        return dyn.get(_DT[tag], [0])[0]

    if _DT["NEEDED"] in dyn:
        raise fail("depends on other shared libraries (DT_NEEDED); link with -nostdlib")
    if one("INIT") or one("INIT_ARRAYSZ") or one("PREINIT_ARRAYSZ"):
        raise fail("has initialisers (DT_INIT/DT_INIT_ARRAY) that this loader would not run")
    if one("RELSZ"):
        raise fail("has REL relocations (not used on x86-64)")

    relative: list[tuple[int, int]] = []
    bad: dict[int, int] = {}
    for table, size_tag in (("RELA", "RELASZ"), ("JMPREL", "PLTRELSZ")):
        addr, size = one(table), one(size_tag)
        if not size:
            continue
        base = file_offset(addr)
        for k in range(size // 24):
            r_offset, r_info, r_addend = struct.unpack_from("<QQq", data, base + 24 * k)
            rtype = r_info & 0xFFFFFFFF
            if rtype == _R_X86_64_RELATIVE:
                relative.append((r_offset, r_addend))
            elif rtype != _R_X86_64_NONE:
                bad[rtype] = bad.get(rtype, 0) + 1
    if one("RELRSZ"):                       # packed relative relocations (ld -z pack-relative-relocs)
        base, size, where = file_offset(one("RELR")), one("RELRSZ"), 0
        for k in range(size // 8):
            (entry,) = struct.unpack_from("<Q", data, base + 8 * k)
            if entry & 1 == 0:
                where = entry
                relative.append((where, None))
                where += 8
            else:
                for bit in range(63):
                    if entry >> (bit + 1) & 1:
                        relative.append((where + 8 * bit, None))
                where += 8 * 63
    if bad:
        kinds = ", ".join(f"type {t} x{n}" for t, n in sorted(bad.items()))
        raise fail(f"needs symbol relocations ({kinds}): only RIP-relative code and R_X86_64_RELATIVE "
                   "are supported (no GOT/PLT, no external symbols)")

    # ---- exported symbols from .dynsym/.dynstr (via the section headers)
    if not e_shoff or not e_shnum:
        raise fail("no section headers, so no .dynsym to read symbols from")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    symbols: dict[str, _Symbol] = {}
    for sh_name, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in sections:
        if sh_type != _SHT_DYNSYM:
            continue
        str_off, str_size = sections[sh_link][4], sections[sh_link][5]
        strtab = data[str_off:str_off + str_size]
        for k in range(1, sh_size // (sh_entsize or 24)):
            st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", data, sh_offset + k * (sh_entsize or 24))
            if st_shndx == 0 or (st_info >> 4) not in (1, 2, 10) or (st_other & 3) not in (0, 3):
                continue                       # undefined, local, or hidden/internal
            name = strtab[st_name:strtab.index(b"\0", st_name)].decode()
            symbols[name] = _Symbol(st_value, st_size, st_info & 0xF)
    # RELR entries carry no addend: the addend is the value already stored at the place
    relative = [(o, a) if a is not None else (o, _read_u64_at(segments, o)) for o, a in relative]
    return _Elf(segments, relro, symbols, relative, max_align)


def _read_u64_at(segments: list[_Segment], vaddr: int) -> int:
    for s in segments:
        if s.vaddr <= vaddr and vaddr + 8 <= s.vaddr + len(s.data):
            return struct.unpack_from("<Q", s.data, vaddr - s.vaddr)[0]
    return 0


# --------------------------------------------------------------------------------------------------
# the shared emulated CPU (one bochscpu.Session per process)

# guest virtual addresses are host virtual addresses: an emulator's block of pages (tables, system pages,
# stacks, library image, arena) sits in the guest at the address where its mmap lies in this process, so
# that raw host pointers (call_raw/bind) can share the same guest address space without colliding with
# it.  Host mmaps are high canonical addresses, so a kernel that truncates a pointer to 32 bits faults.
_GPA_SLOT = 1 << 30                        # each emulator owns a 1 GiB-aligned guest-physical range
_GPA_LIMIT = 1 << 40                       # the emulated CPU has 40 physical address bits
_PTE_P, _PTE_W, _PTE_A, _PTE_D, _PTE_NX = 1, 2, 1 << 5, 1 << 6, 1 << 63
_CANARY = 0xA5
_POISON_GPR = 0xDEAD_BEEF_0000_0000
_POISON_XMM = 0x7FBA_DBAD_7FBA_DBAD        # two signalling NaNs (float32)
_MXCSR_DEFAULT, _FPCW_DEFAULT = 0x1F80, 0x037F
_XCR0 = 0xE7                               # x87|SSE|AVX|opmask|ZMM_Hi256|Hi16_ZMM
_SEL_CODE, _SEL_DATA, _SEL_TSS = 0x08, 0x10, 0x18
_N_VECTORS = 32


# offsets inside the system code page
_SYS_RET = 0x000        # hlt: the return address of every call
_SYS_STUBS = 0x040      # 32 one-byte `hlt` exception handlers, one per vector
_SYS_CPUID = 0x080      # cpuid; hlt
_SYS_XGETBV = 0x090     # xgetbv; hlt
_SYS_PF_RESUME = 0x0A0  # add $8, %rsp; iretq: a page fault that call_raw resolved re-runs its instruction
_SYS_ENTER = 0x100      # poison k0-k7 and rax, then jmp *entry: every call starts here
# offsets inside the system data page
_SYS_GDT, _SYS_TSS, _SYS_IDT, _SYS_ENTRY = 0x000, 0x100, 0x200, 0x800
_POISON_K = 0x5555_5555_5555_5555           # opmask registers at entry
_VEC_PF = 14
_TWO_MIB = 512 * PAGE
_HOST_VA_LIMIT = 1 << 47                    # user-space host addresses (4-level paging)
_HOST_SPECIAL = ("[vvar]", "[vvar_vclock]", "[vsyscall]")   # never handed to the emulator
_RAW_POOL_PAGES = 64                        # page-table pages per pool chunk of call_raw


class _Machine:
    """The process-wide emulated CPU (one bochscpu.Session) and the hooks that end a run."""

    _instance: _Machine | None = None

    @classmethod
    def get(cls) -> _Machine:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self):
        self.session = bochscpu.Session()
        self.session.missing_page_handler = self._missing_page
        self.hook = _bochscpu.Hook()
        self.hook.hlt = self._on_hlt
        self.hook.exception = self._on_exception
        self.counting_hook = None
        self.next_gpa = 1 << 32            # guest-physical slots are never reused (no stale icache)
        self.emulators: weakref.WeakSet = weakref.WeakSet()
        self.scratch_pages: list[mmap.mmap] = []
        self.watchdog = _Watchdog(self.session.cpu.id)
        self.lock = threading.RLock()      # one emulated CPU: one call at a time
        self.raw_handler: Avx512Emulator | None = None    # the emulator of a running call_raw
        self.raw_windows: dict[int, tuple[int, np.ndarray]] = {}   # host 2 MiB window -> (gpa, inserted)
        self.raw_gpa_next = self.raw_gpa_end = 0
        self._reset_run()

    def _reset_run(self):
        self.halted = False
        self.exceptions: list[tuple[int, int, int]] = []     # (vector, error code, rip after insn)
        self.missing: list[int] = []
        self.icount = 0
        self.raw_faults = 0
        self.hook_error: BaseException | None = None

    # the hooks must never raise: the exception would have to cross Rust/C++ frames
    def _on_hlt(self, sess, cpu_id):
        self.halted = True
        sess.stop()

    def _on_exception(self, sess, cpu_id, vector, error_code):
        emu = self.raw_handler
        if vector == _VEC_PF and emu is not None:
            # call_raw: a page fault on a host address the guest may use is resolved here, before the
            # CPU reads the IDT: map it, point the #PF gate at the iretq stub, and the faulting
            # instruction runs again.  Otherwise the gate leads to the usual hlt stub.
            try:
                handled = emu._raw_fault(sess.cpu.cr2, error_code)
            except BaseException as e:       # noqa: BLE001 - must not cross the C++ frames
                self.hook_error, handled = e, False
            emu._set_pf_gate(handled)
            if handled:
                self.raw_faults += 1
                return
        if len(self.exceptions) < 8:
            self.exceptions.append((vector, error_code, sess.cpu.rip))

    def _missing_page(self, gpa):
        # a guest-physical page nobody backs: only possible if our page tables are wrong.  Back it with
        # a scratch page so that Bochs can go on, remember it, and stop.
        self.missing.append(gpa)
        page = mmap.mmap(-1, PAGE)
        self.scratch_pages.append(page)
        _bmem.page_insert(gpa & ~(PAGE - 1), ctypes.addressof(ctypes.c_char.from_buffer(page)))
        self.session.stop()

    def _count(self, sess, cpu_id, insn):
        self.icount += 1

    def raw_frames(self, window: int, lo: int, hi: int) -> int:
        """Guest-physical home of host 2 MiB window `window` (host address >> 21): page i of the window
        is frame gpa + i*4K, backed by the host page itself (bochscpu page_insert of the host pointer).
        Pages lo..hi-1 are inserted now if they were not yet; a window keeps its frames for the life of
        the process (host pages can be reused by later allocations: the identity stays right)."""
        w = self.raw_windows.get(window)
        if w is None:
            if self.raw_gpa_next >= self.raw_gpa_end:
                self.raw_gpa_next = self.alloc_gpa(_GPA_SLOT)
                self.raw_gpa_end = self.raw_gpa_next + _GPA_SLOT
            w = self.raw_windows[window] = (self.raw_gpa_next, np.zeros(512, dtype=bool))
            self.raw_gpa_next += _TWO_MIB
        gpa, inserted = w
        host = window * _TWO_MIB
        for i in np.flatnonzero(~inserted[lo:hi]) + lo:
            _bmem.page_insert(gpa + int(i) * PAGE, host + int(i) * PAGE)
        inserted[lo:hi] = True
        return gpa

    def alloc_gpa(self, size: int) -> int:
        gpa = self.next_gpa
        self.next_gpa += -(-size // _GPA_SLOT) * _GPA_SLOT
        if self.next_gpa > _GPA_LIMIT:
            raise EmulationError("out of guest-physical address space: reuse emulators instead of "
                                 "creating a new one per test")
        return gpa

    def run(self, state, timeout: float | None, count: bool) -> bool:
        """Load state and run until hlt or a stop; return False if the watchdog ended the run."""
        self._reset_run()
        self.session.cpu.state = state      # also flushes the TLB and re-evaluates the CPU modes
        hooks = [self.hook]
        if count:
            if self.counting_hook is None:
                self.counting_hook = _bochscpu.Hook()
                self.counting_hook.after_execution = self._count
            hooks.append(self.counting_hook)
        t0 = time.monotonic()
        for _attempt in range(3):
            self.watchdog.arm(None if timeout is None else timeout - (time.monotonic() - t0))
            try:
                self.session.run(hooks)     # holds the GIL until hlt, a stop or the watchdog
            finally:
                fired = self.watchdog.disarm()
            if self.halted or self.missing or self.exceptions:
                return True
            if fired:
                return False
            # a stop nobody asked for: the timer thread of an earlier run can be late to set the stop
            # flag.  Session.run() resumes where the CPU stopped.
        return True                         # _run reports "stopped unexpectedly"

    def shutdown(self):
        for emu in list(self.emulators):
            emu.close()
        self.watchdog.close()
        self.hook = self.counting_hook = None
        self.session = None
        _Machine._instance = None


class _Watchdog:
    """A POSIX timer whose SIGEV_THREAD notification calls Bochs' exported cpu_set_killbit(cpu_id).

    Session.run() holds the GIL for the whole run, so no Python thread could stop a runaway kernel.
    A timer thread started by glibc that calls straight into the C function needs no GIL, and costs
    nothing while the kernel runs (unlike a Python hook on every branch)."""

    class _SigEvent(ctypes.Structure):          # struct sigevent, x86-64 glibc layout (64 bytes)
        _fields_ = [("value", ctypes.c_uint64), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                    ("function", ctypes.c_void_p), ("attribute", ctypes.c_void_p),
                    ("_pad", ctypes.c_byte * 32)]

    class _ITimerSpec(ctypes.Structure):
        _fields_ = [("interval_s", ctypes.c_long), ("interval_ns", ctypes.c_long),
                    ("value_s", ctypes.c_long), ("value_ns", ctypes.c_long)]

    _SIGEV_THREAD, _CLOCK_MONOTONIC = 2, 1

    def __init__(self, cpu_id: int):
        self.timer = None
        self.armed = False
        try:
            core = ctypes.CDLL(_bochscpu.__file__)          # the already loaded extension module
            self.libc = ctypes.CDLL(None, use_errno=True)
            event = self._SigEvent(value=cpu_id, notify=self._SIGEV_THREAD)
            event.function = ctypes.cast(core.cpu_set_killbit, ctypes.c_void_p).value
            timer = ctypes.c_void_p()
            if self.libc.timer_create(self._CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) == 0:
                self.timer = timer
        except (OSError, AttributeError):
            self.timer = None                               # no watchdog: runs are unbounded

    def arm(self, seconds: float | None):
        self.armed = self.timer is not None and seconds is not None
        if self.armed:
            seconds = max(seconds, 1e-3)
            whole = int(seconds)
            spec = self._ITimerSpec(0, 0, whole, int((seconds - whole) * 1e9))
            self.libc.timer_settime(self.timer, 0, ctypes.byref(spec), None)

    def disarm(self) -> bool:
        """Stop the timer; True if it expired during the run."""
        if not self.armed:
            return False
        self.armed = False
        old = self._ITimerSpec()
        self.libc.timer_settime(self.timer, 0, ctypes.byref(self._ITimerSpec()), ctypes.byref(old))
        return old.value_s == 0 and old.value_ns == 0

    def close(self):
        if self.timer is not None:
            self.libc.timer_delete(self.timer)
            self.timer = None


@atexit.register
def _shutdown_at_exit():
    # drop every binding object while the interpreter is intact (avoids nanobind leak reports/crashes)
    if _Machine._instance is not None:
        _Machine._instance.shutdown()
    import gc
    gc.collect()


# --------------------------------------------------------------------------------------------------
# the host's own memory map (for call_raw)

class _HostMaps:
    """A snapshot of /proc/self/maps: which host addresses are mapped, and with which permissions."""

    def __init__(self):
        self.starts, self.vmas = [], []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                self.starts.append(lo)
                self.vmas.append((lo, hi, parts[1], parts[5].strip() if len(parts) > 5 else ""))

    def find(self, addr: int) -> tuple[int, int, str, str] | None:
        """(start, end, perms, path) of the mapping holding addr, or None."""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.vmas[i][1]:
            return self.vmas[i]
        return None


def _describe_vma(vma) -> str:
    lo, hi, perms, path = vma
    return f"host mapping {lo:#x}-{hi:#x} {perms}" + (f" {path}" if path else " (anonymous)")


# --------------------------------------------------------------------------------------------------
# the emulator

@dataclass
class _Placed:
    """One array copied into the arena for the current call."""
    array: np.ndarray
    offset: int          # byte offset of its data in the block
    nbytes: int
    first_page: int      # block page index of its first data page
    npages: int
    arg_index: int


@dataclass
class CallResult:
    """Details of the last call: Avx512Emulator.last."""
    symbol: str = ""
    regs: dict = field(default_factory=dict)        # final general-purpose registers, rip, rflags
    zmm: np.ndarray | None = None                   # (32, 8) uint64: final zmm0-zmm31
    mxcsr: int = 0                                  # final MXCSR (its flag bits show FP exceptions)
    icount: int | None = None                       # emulated instructions (only with count=True)
    seconds: float = 0.0                            # wall time of the emulation itself
    raw_faults: int = 0                             # call_raw: page faults resolved by mapping host pages


class Avx512Emulator:
    """An x86-64 ELF shared library mapped into an emulated AVX-512 machine; see the module docstring.

    lib_path:   the .so (no DT_NEEDED, no symbol relocations, no TLS: a -nostdlib assembly library).
    arena_size: bytes for the array arguments of one call (each array also costs one guard page).
    stack_size: bytes of stack.
    timeout:    default watchdog of each call, in seconds (None: unbounded).
    raw_window: call_raw maps host memory on demand in aligned windows of this many bytes (a power of
                two from 4 KiB to 2 MiB), each clipped to the host mapping that holds the faulting address.
    """

    def __init__(self, lib_path, *, arena_size: int = 256 << 20, stack_size: int = 1 << 20,
                 timeout: float | None = 120.0, raw_window: int = _TWO_MIB):
        if not available():
            raise EmulationError(why_unavailable())
        if raw_window & (raw_window - 1) or not PAGE <= raw_window <= _TWO_MIB:
            raise ValueError(f"raw_window={raw_window}: a power of two from {PAGE} to {_TWO_MIB}")
        self.raw_window = raw_window
        self.raw_stats = {"calls": 0, "faults": 0, "seconds": 0.0}   # cumulative over call_raw
        self._raw_active = False
        self._raw_pool: list[mmap.mmap] = []          # page-table pages for host addresses
        self._raw_pool_free: list[tuple[np.ndarray, int]] = []
        self._raw_pool_gpa = 0
        self._raw_mapped: list[tuple[np.ndarray, int, int]] = []   # PTE ranges set in this call
        self._raw_refusal = ""
        self._host_maps: _HostMaps | None = None
        self.path = str(lib_path)
        with open(self.path, "rb") as f:
            elf = _parse_elf(f.read(), self.path)
        self.timeout = timeout
        self.last = CallResult()
        self._closed = True
        self._placed: list[_Placed] = []

        # ---- block layout, in pages:
        #   [page tables] g [sys code][sys data] g [IST stack] g [stack] g [library image] g [arena]
        # (g = a guard page, never mapped).  The VA, guest-physical and host address of a page are all
        # linear in its index.
        span = max(s.vaddr + s.memsz for s in elf.segments)
        image_pages = -(-span // PAGE)
        stack_pages = -(-stack_size // PAGE)
        arena_pages = -(-arena_size // PAGE)
        align_pages = max(1, elf.max_align // PAGE)
        rest = 8 + stack_pages + align_pages + image_pages + arena_pages
        self._n_tables = 8 + rest // 512 + rest // (512 * 512)     # PML4, PDPTs, PDs, PTs (ample)
        p = self._n_tables
        self._p_syscode = p + 1
        self._p_sysdata = p + 2
        self._p_ist = p + 4
        self._p_stack = p + 6
        self._p_stack_end = self._p_stack + stack_pages          # exclusive; a guard page follows
        self._p_image = -(-(self._p_stack_end + 1) // align_pages) * align_pages   # honours p_align
        self._p_arena = self._p_image + image_pages + 1
        self._arena_pages = arena_pages
        self._arena_end = self._p_arena      # arena pages [p_arena, arena_end) may be mapped
        self._npages = self._p_arena + arena_pages

        # ---- host memory (committed lazily by the OS) and its guest-physical home
        self._machine = _Machine.get()
        size = self._npages * PAGE
        align = max(PAGE, elf.max_align)                 # the image's p_align holds in the guest too
        self._mem = mmap.mmap(-1, size + align - PAGE)
        self._mem_anchor = ctypes.c_char.from_buffer(self._mem)
        shift = -ctypes.addressof(self._mem_anchor) % align
        self._hva = ctypes.addressof(self._mem_anchor) + shift
        self._va_base = self._hva                        # guest VA == host VA (see call_raw)
        self._buf = memoryview(self._mem)[shift:shift + size]
        self._u8 = np.frombuffer(self._buf, dtype=np.uint8)
        self._u64 = self._u8.view(np.uint64)
        self._gpa = self._machine.alloc_gpa(size)
        for i in range(self._npages):
            _bmem.page_insert(self._gpa + i * PAGE, self._hva + i * PAGE)
        self._closed = False
        self._machine.emulators.add(self)

        self._build_page_tables()
        self._write_system_pages()
        self._load_image(elf)

        # ---- the emulated CPU must be what the AVX-512 kernels expect
        cpuid1, cpuid7 = self.cpuid(1), self.cpuid(7, 0)
        lacking = [name for name, ok in (("AVX-512F", cpuid7[1] >> 16 & 1), ("AVX2", cpuid7[1] >> 5 & 1),
                                         ("FMA", cpuid1[2] >> 12 & 1), ("F16C", cpuid1[2] >> 29 & 1),
                                         ("OSXSAVE", cpuid1[2] >> 27 & 1)) if not ok]
        if self.xgetbv(0) & _XCR0 != _XCR0:
            lacking.append(f"XCR0={_XCR0:#x}")
        if lacking:
            raise EmulationError(f"the emulated CPU lacks {', '.join(lacking)}")

    # ---- guest addresses and symbols
    def _va(self, page: int, off: int = 0) -> int:
        return self._va_base + page * PAGE + off

    def address_of(self, symbol: str) -> int:
        """Guest virtual address of an exported symbol (function or data)."""
        try:
            return self._image_va + self._symbols[symbol].value
        except KeyError:
            close = difflib.get_close_matches(symbol, self._symbols, n=3)
            raise KeyError(f"{symbol!r} is not exported by {self.path}"
                           + (f" (did you mean {', '.join(close)}?)" if close else "")) from None

    @property
    def symbols(self) -> list[str]:
        """Names of all exported symbols."""
        return sorted(self._symbols)

    # ---- setup
    def _build_page_tables(self):
        """4-level tables for a linear mapping: block page i <-> VA base + i*4K <-> GPA + i*4K
        (base = the block's host address).

        Every leaf entry starts out not present; _map() fills in the ones in use.  The tables live in
        the first pages of the block, which are not mapped into the guest's virtual space.  Tables for
        raw host pages (call_raw) are added later by _page_table(), from a separate pool."""
        # key ("pml4",) / ("pdpt", i4) / ("pd", i4, i3) / ("pt", i4, i3, i2) -> (512 entries, gpa, block page)
        self._tables: dict[tuple, tuple[np.ndarray, int, int]] = {}
        n_block_tables = 0

        def block_table() -> tuple[np.ndarray, int, int]:
            nonlocal n_block_tables
            if n_block_tables >= self._n_tables:
                raise AssertionError("page-table area too small")
            i = n_block_tables
            n_block_tables += 1
            return self._u64[i * 512:(i + 1) * 512], self._gpa + i * PAGE, i

        self._tables[("pml4",)] = block_table()
        self._cr3 = self._tables[("pml4",)][1]
        self._pte_index = np.zeros(self._npages, dtype=np.int64)   # u64 index of each page's PTE
        lo_va, hi_va = self._va(self._n_tables), self._va(self._npages)
        two_mib = 512 * PAGE
        for chunk in range(lo_va & ~(two_mib - 1), hi_va, two_mib):   # one page table per 2 MiB
            pt = self._page_table(chunk, block_table)[2]
            first, last = max(lo_va, chunk), min(hi_va, chunk + two_mib)
            pages = np.arange((first - self._va_base) // PAGE, (last - self._va_base) // PAGE)
            self._pte_index[pages] = pt * 512 + (pages - (chunk - self._va_base) // PAGE)
        self._map(self._p_syscode, 1, write=False, execute=True)
        self._map(self._p_sysdata, 1, write=True, execute=False)
        self._map(self._p_ist, 1, write=True, execute=False)
        self._map(self._p_stack, self._p_stack_end - self._p_stack, write=True, execute=False)

    def _page_table(self, va: int, new_table) -> tuple[np.ndarray, int, int]:
        """The page table (last level) covering va, creating it and its parents with new_table()."""
        i4, i3, i2 = va >> 39 & 511, va >> 30 & 511, va >> 21 & 511
        parent, index = self._tables[("pml4",)][0], i4
        for key, next_index in ((("pdpt", i4), i3), (("pd", i4, i3), i2), (("pt", i4, i3, i2), None)):
            t = self._tables.get(key)
            if t is None:
                t = self._tables[key] = new_table()
                parent[index] = t[1] | (_PTE_P | _PTE_W | _PTE_A)
            parent, index = t[0], next_index
        return t

    def _map(self, first: int, count: int, *, write: bool, execute: bool):
        flags = _PTE_P | _PTE_A | _PTE_D | (_PTE_W if write else 0) | (0 if execute else _PTE_NX)
        pages = np.arange(first, first + count, dtype=np.uint64)
        self._u64[self._pte_index[first:first + count]] = (
            np.uint64(self._gpa) + pages * np.uint64(PAGE)) | np.uint64(flags)

    def _unmap(self, first: int, count: int):
        self._u64[self._pte_index[first:first + count]] = 0

    def _write_system_pages(self):
        """The return sentinel, the exception handlers, the CPU probes, and GDT/TSS/IDT."""
        code = bytearray(b"\xcc" * PAGE)                             # int3 filler
        code[_SYS_RET] = 0xF4                                        # hlt
        code[_SYS_STUBS:_SYS_STUBS + _N_VECTORS] = b"\xf4" * _N_VECTORS
        code[_SYS_CPUID:_SYS_CPUID + 3] = b"\x0f\xa2\xf4"            # cpuid; hlt
        code[_SYS_XGETBV:_SYS_XGETBV + 4] = b"\x0f\x01\xd0\xf4"      # xgetbv; hlt
        code[_SYS_PF_RESUME:_SYS_PF_RESUME + 6] = b"\x48\x83\xc4\x08\x48\xcf"   # add $8,%rsp; iretq
        # the binding cannot set the opmask registers, so each call enters through this trampoline:
        #   movabs $_POISON_K, %rax; kmovq %rax, %k0 ... %k7; movabs $poison, %rax; jmp *entry(%rip)
        enter = b"\x48\xb8" + struct.pack("<Q", _POISON_K)
        enter += b"".join(b"\xc4\xe1\xfb\x92" + bytes([0xC0 + 8 * k]) for k in range(8))
        enter += b"\x48\xb8" + struct.pack("<Q", _POISON_GPR | 0xC000)
        jmp_end = self._va(self._p_syscode, _SYS_ENTER + len(enter) + 6)
        enter += b"\xff\x25" + struct.pack("<i", self._va(self._p_sysdata, _SYS_ENTRY) - jmp_end)
        code[_SYS_ENTER:_SYS_ENTER + len(enter)] = enter
        o = self._p_syscode * PAGE
        self._u8[o:o + PAGE] = np.frombuffer(bytes(code), np.uint8)

        tss_va = self._va(self._p_sysdata, _SYS_TSS)
        gdt = struct.pack("<QQQ", 0, 0x00AF9B000000FFFF, 0x00CF93000000FFFF)   # null, code64, data
        gdt += struct.pack("<HHBBBBII", 0x67, tss_va & 0xFFFF, tss_va >> 16 & 0xFF, 0x8B, 0,
                           tss_va >> 24 & 0xFF, tss_va >> 32, 0)                # busy 64-bit TSS
        tss = bytearray(0x68)
        struct.pack_into("<Q", tss, 0x24, self._va(self._p_ist + 1))           # IST1: own stack
        struct.pack_into("<H", tss, 0x66, 0x68)                                # no I/O bitmap
        idt = b"".join(self._gate(self._va(self._p_syscode, _SYS_STUBS + v)) for v in range(_N_VECTORS))
        sysdata = bytearray(PAGE)
        sysdata[_SYS_GDT:_SYS_GDT + len(gdt)] = gdt
        sysdata[_SYS_TSS:_SYS_TSS + len(tss)] = tss
        sysdata[_SYS_IDT:_SYS_IDT + len(idt)] = idt
        self._sysdata = np.frombuffer(sysdata, np.uint8).copy()      # template, rewritten every run
        self._pf_gates = {flag: np.frombuffer(self._gate(self._va(self._p_syscode, stub)), np.uint8)
                          for flag, stub in ((False, _SYS_STUBS + _VEC_PF), (True, _SYS_PF_RESUME))}
        self._gdt_limit = len(gdt) - 1

    @staticmethod
    def _gate(handler: int) -> bytes:
        """A 64-bit interrupt gate: present, DPL 0, IST 1 (so even a stack fault can be delivered)."""
        return struct.pack("<HHBBHII", handler & 0xFFFF, _SEL_CODE, 1, 0x8E, handler >> 16 & 0xFFFF,
                           handler >> 32, 0)

    def _load_image(self, elf: _Elf):
        base_off = self._p_image * PAGE
        self._image_va = self._va(self._p_image)
        perms: dict[int, tuple[bool, bool]] = {}           # image page -> (write, execute)
        for s in elf.segments:
            o = base_off + s.vaddr
            self._u8[o:o + len(s.data)] = np.frombuffer(s.data, np.uint8)   # .bss stays zero
            for pg in range(s.vaddr // PAGE, -(-(s.vaddr + s.memsz) // PAGE)):
                w, x = perms.get(pg, (False, False))
                perms[pg] = (w or bool(s.flags & _PF_W), x or bool(s.flags & _PF_X))
        for off, addend in elf.relative_relocs:           # R_X86_64_RELATIVE: *place = base + addend
            struct.pack_into("<Q", self._buf, base_off + off, (self._image_va + addend) & (2**64 - 1))
        for vaddr, memsz in elf.relro:                     # read-only after relocation, as with ld.so
            for pg in range(vaddr // PAGE, (vaddr + memsz) // PAGE):
                if pg in perms:
                    perms[pg] = (False, perms[pg][1])
        for pg, (w, x) in perms.items():
            self._map(self._p_image + pg, 1, write=w, execute=x)
        self._symbols = elf.symbols
        self._by_address = sorted((s.value, name) for name, s in elf.symbols.items())

    # ---- running
    def _base_state(self, rip: int, rsp: int):
        """64-bit long mode, ring 0, paging with our CR3, AVX-512 state enabled, MXCSR default."""
        st = bochscpu.State()
        bochscpu.cpu.set_long_mode(st)       # CR0.PG|PE|WP|NE|ET|AM, CR4.PAE, EFER.LME|LMA|NXE|SCE
        cr4 = bochscpu.cpu.ControlRegister(st.cr4)
        cr4.OSFXSR = cr4.OSXMMEXCPT = cr4.OSXSAVE = True
        st.cr4 = int(cr4)
        st.cr3 = self._cr3
        st.xcr0 = _XCR0
        st.mxcsr = _MXCSR_DEFAULT
        st.mxcsr_mask = 0xFFFF               # else STMXCSR stores 0 and LDMXCSR of any bit faults
        st.fpcw = _FPCW_DEFAULT
        st.fptw = 0xFFFF                     # x87 register stack empty (full tag word)
        st.rflags = 0x2                      # IF=0: no interrupts; DF=0
        st.rip, st.rsp = rip, rsp

        def seg(selector, attr, limit=0xFFFFFFFF, base=0):
            s = _bochscpu.Segment()
            s.present, s.selector, s.base, s.limit, s.attr = True, selector, base, limit, attr
            return s
        st.cs = seg(_SEL_CODE, 0xA09B)       # 64-bit code (L=1), ring 0
        st.ss = st.ds = st.es = st.fs = st.gs = seg(_SEL_DATA, 0xC093)
        st.tr = seg(_SEL_TSS, 0x008B, limit=0x67, base=self._va(self._p_sysdata, _SYS_TSS))
        gdtr, idtr = _bochscpu.GlobalSegment(), _bochscpu.GlobalSegment()
        gdtr.base, gdtr.limit = self._va(self._p_sysdata, _SYS_GDT), self._gdt_limit
        idtr.base, idtr.limit = self._va(self._p_sysdata, _SYS_IDT), _N_VECTORS * 16 - 1
        st.gdtr, st.idtr = gdtr, idtr
        return st

    def _run(self, st, timeout, count: bool, stop_rip: int, what: str):
        """Run to the hlt at stop_rip - 1; raise for a fault or timeout; return the final State."""
        o = self._p_sysdata * PAGE
        self._u8[o:o + PAGE] = self._sysdata                  # fresh GDT/TSS/IDT for every run
        t0 = time.perf_counter()
        with self._machine.lock:
            finished = self._machine.run(st, timeout, count)
        self.last.seconds = time.perf_counter() - t0
        m = self._machine
        self.last.icount = m.icount if count else None
        self.last.raw_faults = m.raw_faults
        final = m.session.cpu.state
        rip = final.rip
        if m.missing:
            raise EmulationError(f"{what}: touched guest-physical page(s) nobody backs "
                                 f"{[hex(g) for g in m.missing]} (a bug of this helper)")
        stubs = self._va(self._p_syscode, _SYS_STUBS)
        if m.halted and rip == stop_rip:
            return final
        if m.halted and stubs < rip <= stubs + _N_VECTORS:
            raise self._fault(rip - stubs - 1, final, what)
        if m.exceptions:                     # an exception whose delivery failed too (triple fault)
            v, e, after = m.exceptions[0]
            raise CpuFault(f"{what}: {_EXC_NAMES.get(v, f'exception vector {v}')} (error code {e:#x}) "
                           f"just before rip={after:#x} {self.describe(after)}, and delivering it "
                           f"failed (exceptions {[x[0] for x in m.exceptions]})",
                           vector=v, rip=None, error_code=e, cr2=final.cr2, insn_bytes=b"",
                           where=self.describe(after))
        if not finished:
            raise EmulationTimeout(f"{what}: no return after {timeout} s (endless loop?); "
                                   f"rip={rip:#x} {self.describe(rip)}")
        if m.halted:
            raise CpuFault(f"{what}: executed hlt at rip={rip - 1:#x} {self.describe(rip - 1)}",
                           vector=-1, rip=rip - 1, error_code=None, cr2=None,
                           insn_bytes=self.read_memory(rip - 1, 1, True), where=self.describe(rip - 1))
        raise EmulationError(f"{what}: emulation stopped unexpectedly at rip={rip:#x}")

    def _fault(self, vector: int, final, what: str) -> CpuFault:
        """Decode the interrupt frame the CPU pushed on the IST stack: [error code], rip, cs, ..."""
        frame = self.read_memory(final.rsp, 16, allow_unmapped=True).ljust(16, b"\0")
        if vector in _EXC_WITH_ERROR_CODE:
            err, rip = struct.unpack("<QQ", frame)
        else:
            err, rip = None, struct.unpack_from("<Q", frame)[0]
        insn = self.read_memory(rip, 15, allow_unmapped=True)
        where = self.describe(rip)
        msg = (f"{what}: {_EXC_NAMES.get(vector, f'exception vector {vector}')} at rip={rip:#x} {where}; "
               f"instruction bytes {insn.hex(' ')}")
        if err is not None:
            msg += f"; error code {err:#x}"
        cr2 = final.cr2 if vector == 14 else None
        if cr2 is not None:
            kind = "instruction fetch" if err & 16 else "write" if err & 2 else "read"
            cause = "protection violation" if err & 1 else "not mapped"
            msg += f"; {kind} at {cr2:#x} ({cause}: {self.describe_data(cr2)})"
        if vector == _VEC_PF and self._raw_active and self._raw_refusal and self._raw_refusal not in msg:
            msg += f" [call_raw: {self._raw_refusal}]"
        if self._machine.hook_error is not None:
            msg += f" [the call_raw page-fault handler failed: {self._machine.hook_error!r}]"
        if vector == 6:
            msg += " (an instruction the emulated CPU does not implement, or an invalid encoding)"
        if vector == 19:
            msg += f" (unmasked SIMD floating-point exception, MXCSR={final.mxcsr:#x})"
        return CpuFault(msg, vector=vector, rip=rip, error_code=err, cr2=cr2, insn_bytes=insn, where=where)

    # ---- diagnostics
    def describe(self, va: int) -> str:
        """'(symbol+0x12, library offset 0x1012)' for a library address, else the region's name."""
        off = va - self._image_va
        if 0 <= off < (self._p_arena - 1 - self._p_image) * PAGE:
            below = [(v, n) for v, n in self._by_address if v <= off]
            if below:
                v, name = below[-1]
                return f"({name}+{off - v:#x}, library offset {off:#x})"
            return f"(library offset {off:#x})"
        return f"({self._region(va)})"

    def describe_data(self, va: int) -> str:
        """Where a data address lies relative to the arrays of the current call."""
        for pl in self._placed:
            start = self._va_base + pl.offset
            end = start + pl.nbytes
            if self._va(pl.first_page - 1) <= va < self._va(pl.first_page + pl.npages + 1):
                if va < start:
                    return f"{start - va} bytes before argument {pl.arg_index} ({pl.nbytes} bytes)"
                if va < end:
                    return f"byte {va - start} of argument {pl.arg_index} ({pl.nbytes} bytes)"
                return f"{va - end} bytes past the end of argument {pl.arg_index} ({pl.nbytes} bytes)"
        return self._region(va)

    def _region(self, va: int) -> str:
        p = (va - self._va_base) // PAGE
        if va < self._va_base or p >= self._npages:
            if self._raw_active:
                vma = _HostMaps().find(va) if 0 <= va < _HOST_VA_LIMIT else None
                return _describe_vma(vma) if vma else "not mapped in the host process"
            return "outside the emulated address space"
        if p < self._n_tables:
            return "page tables (not mapped)"
        if p in (self._p_syscode, self._p_sysdata):
            return "emulator system page"
        if p == self._p_ist:
            return "exception stack"
        if self._p_stack <= p < self._p_stack_end:
            return "stack"
        if self._p_image <= p < self._p_arena - 1:
            return "library image"
        if p >= self._p_arena:
            return "data arena, not mapped in this call"
        return "guard page"

    def read_memory(self, va: int, size: int, allow_unmapped: bool = False) -> bytes:
        """Bytes of the emulated address space, e.g. a string a function returned a pointer to."""
        off = va - self._va_base
        if off < 0 or off + size > self._npages * PAGE:
            if allow_unmapped:
                return b""
            raise ValueError(f"{va:#x}+{size} is outside the emulated address space")
        return bytes(self._buf[off:off + size])

    def read_cstring(self, va: int, limit: int = 4096) -> bytes:
        """The NUL-terminated string at va (e.g. returned by gpt2asm_build_id)."""
        return self.read_memory(va, limit, allow_unmapped=True).split(b"\0", 1)[0]

    # ---- CPU probes
    def cpuid(self, leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
        """(eax, ebx, ecx, edx) of CPUID as the emulated CPU reports it."""
        st = self._base_state(self._va(self._p_syscode, _SYS_CPUID), self._va(self._p_stack_end) - 8)
        st.rax, st.rcx = leaf, subleaf
        f = self._run(st, 10.0, False, self._va(self._p_syscode, _SYS_CPUID + 3), "cpuid")
        return f.rax & 0xFFFFFFFF, f.rbx & 0xFFFFFFFF, f.rcx & 0xFFFFFFFF, f.rdx & 0xFFFFFFFF

    def xgetbv(self, xcr: int = 0) -> int:
        """XCR[xcr] of the emulated CPU."""
        st = self._base_state(self._va(self._p_syscode, _SYS_XGETBV), self._va(self._p_stack_end) - 8)
        st.rcx = xcr
        f = self._run(st, 10.0, False, self._va(self._p_syscode, _SYS_XGETBV + 4), "xgetbv")
        return (f.rdx & 0xFFFFFFFF) << 32 | (f.rax & 0xFFFFFFFF)

    # ---- calls
    def call(self, symbol: str, *args, ret: str | None = "int", timeout: float | None = ...,
             count: bool = False, check_abi: bool = True):
        """Run the exported function `symbol` with `args`; see the module docstring.

        ret: "int" (rax as unsigned 64-bit; the default), "i64", "i32", "u32", "float" (xmm0[31:0] as
             np.float32), "double" (xmm0[63:0] as np.float64) or None.
        timeout: seconds before EmulationTimeout (default: the constructor's).
        count: count the emulated instructions into self.last.icount (a Python call per instruction:
             about 20x slower).
        check_abi: raise AbiViolation if callee-saved state was not preserved.
        """
        return self._invoke(symbol, args, False, ret, timeout, count, check_abi)

    def call_raw(self, symbol: str, *args, ret: str | None = "int", timeout: float | None = ...,
                 count: bool = False, check_abi: bool = True):
        """Run `symbol` on the host's own memory: pointer arguments are raw host addresses (ints).

        The guest's virtual address space is the host's: guest VA == host VA.  A guest access to a
        host page raises a page fault, which the exception hook resolves before the fault is delivered:
        it looks the address up in /proc/self/maps, gives the surrounding aligned raw_window (clipped to
        that host mapping) guest-physical frames backed by the host pages themselves (bochscpu
        page_insert of the host pointers, cached for the process), writes the page-table entries (NX;
        writable only if the host mapping is) and lets the CPU re-run the instruction through an iretq
        stub.  No data is copied: reads see the host arrays and writes land in them directly.
        Addresses that are not mapped readable in the host, writes to read-only host mappings,
        instruction fetches from host memory and any access to the emulator's own guard pages still
        fault (CpuFault).  The mappings are dropped after each call.  Unlike call(), out-of-bounds
        accesses inside a host mapping are not detected (no guard pages or canaries around the data).

        Arguments: int, numpy integer, bool, None (NULL), a ctypes pointer or c_void_p (its address), a
        numpy array (its data address, no copy), np.float32 / float as for call().
        """
        return self._invoke(symbol, args, True, ret, timeout, count, check_abi)

    def bind(self, symbol: str, *, ret: str | None = None, timeout: float | None = ...,
             check_abi: bool = True):
        """A callable fn(*args) = call_raw(symbol, *args): a drop-in for a ctypes function whose
        pointer arguments are host addresses (e.g. gpt2asm.kernels.Kernels._bind)."""
        self.address_of(symbol)              # unknown symbol: KeyError now

        def fn(*args):
            return self.call_raw(symbol, *args, ret=ret, timeout=timeout, check_abi=check_abi)
        fn.__name__ = fn.__qualname__ = symbol
        fn.emulator = self
        return fn

    def _invoke(self, symbol, args, raw, ret, timeout, count, check_abi):
        if self._closed:
            raise EmulationError("emulator is closed")
        entry = self.address_of(symbol)
        if self._symbols[symbol].type == _STT_GNU_IFUNC:
            raise ElfError(f"{symbol} is an IFUNC (needs a resolver): not supported")
        if ret not in ("int", "i64", "i32", "u32", "float", "double", None):
            raise ValueError(f"ret={ret!r}: use 'int', 'i64', 'i32', 'u32', 'float', 'double' or None")
        timeout = self.timeout if timeout is ... else timeout
        with self._machine.lock:
            self.last = CallResult(symbol=symbol)
            try:
                ints, sses, stack = self._marshal(args, raw)
                if raw:
                    self._raw_active, self._host_maps = True, None
                    self._machine.raw_handler = self
                return self._call(symbol, entry, ints, sses, stack, ret, timeout, count, check_abi)
            finally:                         # the next call starts with an empty arena
                if raw:
                    self._raw_end()
                self._unmap(self._p_arena, self._arena_end - self._p_arena)
                self._arena_end = self._p_arena

    def _marshal(self, args, raw: bool = False):
        """Classify the arguments and copy arrays into the arena: (int regs, sse regs, stack words).
        raw: arrays and ctypes pointers pass their host address (nothing is copied)."""
        ints, sses, stack = [], [], []
        self._placed = []
        by_object: dict[int, _Placed] = {}
        cursor = self._p_arena
        for i, a in enumerate(args):
            if raw and isinstance(a, np.ndarray):
                a = a.__array_interface__["data"][0]
            elif raw and isinstance(a, (ctypes.c_void_p, ctypes._Pointer)):
                a = ctypes.cast(a, ctypes.c_void_p).value or 0
            if isinstance(a, (bytes, bytearray, memoryview)):
                a = np.frombuffer(a, dtype=np.uint8)        # read-only for bytes
            if isinstance(a, np.ndarray):
                pl = by_object.get(id(a))
                if pl is None:
                    for other in self._placed:
                        if np.shares_memory(a, other.array):
                            raise ValueError(f"argument {i} overlaps argument {other.arg_index} without "
                                             "being the same array object (for in-place calls pass the "
                                             "same object twice)")
                    pl, cursor = self._place(a, i, cursor)
                    by_object[id(a)] = pl
                    self._placed.append(pl)
                value, sse = self._va_base + pl.offset, False
            elif isinstance(a, np.float32):
                value, sse = int(np.float32(a).view(np.uint32)), True
            elif isinstance(a, (float, np.float64)):
                value, sse = int(np.float64(a).view(np.uint64)), True
            elif a is None:
                value, sse = 0, False
            elif isinstance(a, (bool, int, np.integer)):
                v = int(a)
                if not -(1 << 63) <= v < (1 << 64):
                    raise OverflowError(f"argument {i} = {v} does not fit in 64 bits")
                value, sse = v & (2**64 - 1), False
            else:
                raise TypeError(f"argument {i}: cannot pass {type(a).__name__} (use int, float, "
                                "np.float32, a numpy array, bytes or None)")
            regs, limit = (sses, 8) if sse else (ints, 6)
            (regs if len(regs) < limit else stack).append(value)
        return ints, sses, stack

    def _place(self, a: np.ndarray, index: int, cursor: int) -> tuple[_Placed, int]:
        """Copy one array in after the guard page at `cursor`; return it and the next guard page."""
        if not a.flags.c_contiguous:
            raise ValueError(f"argument {index}: the array is not C-contiguous, so results could not be "
                             "copied back into it; pass y = np.ascontiguousarray(x) and read y")
        nbytes = a.nbytes
        padded = -(-nbytes // 64) * 64
        npages = -(-padded // PAGE)
        first = cursor + 1
        end_page = first + npages                           # the guard page after it
        if end_page >= self._p_arena + self._arena_pages:
            raise EmulationError("the arena is too small for the arrays of this call: pass a larger "
                                 "arena_size to Avx512Emulator()")
        offset = end_page * PAGE - padded                   # end-aligned; the start is 64-byte aligned
        if npages:
            self._u8[first * PAGE:end_page * PAGE] = _CANARY
            self._u8[offset:offset + nbytes] = a.reshape(-1).view(np.uint8)
            self._map(first, npages, write=bool(a.flags.writeable), execute=False)
            self._arena_end = max(self._arena_end, end_page)
        return _Placed(a, offset, nbytes, first, npages, index), end_page

    def _call(self, symbol, entry, ints, sses, stack, ret, timeout, count, check_abi):
        # the stack: [rsp] = return address (the hlt sentinel), [rsp+8...] = stack arguments,
        # with rsp+8 16-byte aligned as at any call site
        ret_va = self._va(self._p_syscode, _SYS_RET)
        args_va = (self._va(self._p_stack_end) - 256 - 8 * len(stack)) & ~0xF
        rsp = args_va - 8
        words = [ret_va] + stack
        struct.pack_into(f"<{len(words)}Q", self._buf, rsp - self._va_base, *words)

        self._sysdata[_SYS_ENTRY:_SYS_ENTRY + 8] = np.frombuffer(struct.pack("<Q", entry), np.uint8)
        st = self._base_state(self._va(self._p_syscode, _SYS_ENTER), rsp)
        preserved = {r: _POISON_GPR | 0x5A00 | k
                     for k, r in enumerate(("rbx", "rbp", "r12", "r13", "r14", "r15"))}
        for r, v in preserved.items():
            setattr(st, r, v)
        for k, r in enumerate(("rax", "r10", "r11")):
            setattr(st, r, _POISON_GPR | 0xC000 | k)
        for k, r in enumerate(("rdi", "rsi", "rdx", "rcx", "r8", "r9")):
            setattr(st, r, ints[k] if k < len(ints) else _POISON_GPR | 0xA000 | k)
        zmms = []
        for k in range(32):
            z = _bochscpu.Zmm()
            z.q = [sses[k], 0, 0, 0, 0, 0, 0, 0] if k < len(sses) else [_POISON_XMM] * 8
            zmms.append(z)
        st.zmm = zmms

        final = self._run(st, timeout, count, ret_va + 1, symbol)
        names = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
                 "r12", "r13", "r14", "r15", "rip", "rflags")
        regs = self.last.regs = {n: getattr(final, n) for n in names}
        self.last.zmm = np.array([z.q for z in final.zmm], dtype=np.uint64)
        self.last.mxcsr = final.mxcsr
        fpcw = final.fpcw
        del final

        if check_abi:
            problems = [f"{r} not preserved ({v:#x} -> {regs[r]:#x})"
                        for r, v in preserved.items() if regs[r] != v]
            if regs["rsp"] != rsp + 8:
                problems.append(f"rsp is off by {regs['rsp'] - (rsp + 8):+d} after the return")
            if regs["rflags"] & 0x400:
                problems.append("direction flag left set")
            if (self.last.mxcsr ^ _MXCSR_DEFAULT) & 0xFFC0:
                problems.append(f"MXCSR control bits changed (0x1f80 -> {self.last.mxcsr:#x})")
            if fpcw != _FPCW_DEFAULT:
                problems.append(f"x87 control word changed (0x37f -> {fpcw:#x})")
            if problems:
                raise AbiViolation(f"{symbol}: " + "; ".join(problems))

        for pl in self._placed:              # out-of-bounds writes: canaries around each array
            if not pl.npages:
                continue
            before = self._u8[pl.first_page * PAGE:pl.offset]
            after = self._u8[pl.offset + pl.nbytes:(pl.first_page + pl.npages) * PAGE]
            bad_before, bad_after = np.flatnonzero(before != _CANARY), np.flatnonzero(after != _CANARY)
            if bad_before.size or bad_after.size:
                parts = ([f"{before.size - bad_before[0]} bytes before its start"] if bad_before.size
                         else []) + ([f"{bad_after[-1] + 1} bytes past its end"] if bad_after.size else [])
                raise GuardViolation(f"{symbol}: wrote outside argument {pl.arg_index} ({pl.nbytes} "
                                     f"bytes): up to {' and '.join(parts)}")
        for pl in self._placed:              # results back into the caller's arrays
            if pl.nbytes and pl.array.flags.writeable:
                pl.array.reshape(-1).view(np.uint8)[:] = self._u8[pl.offset:pl.offset + pl.nbytes]

        rax, xmm0 = regs["rax"], int(self.last.zmm[0, 0])
        if ret == "int":
            return rax
        if ret == "i64":
            return rax - (1 << 64) if rax >> 63 else rax
        if ret == "u32":
            return rax & 0xFFFFFFFF
        if ret == "i32":
            return (rax & 0xFFFFFFFF) - (1 << 32) if rax & 0x80000000 else rax & 0xFFFFFFFF
        if ret == "float":
            return np.uint32(xmm0 & 0xFFFFFFFF).view(np.float32)
        if ret == "double":
            return np.uint64(xmm0).view(np.float64)
        return None

    # ---- call_raw: host pages mapped on demand
    def _set_pf_gate(self, resume: bool):
        """Point IDT vector 14 at the iretq stub (a resolved fault) or at its hlt stub (a real one)."""
        o = self._p_sysdata * PAGE + _SYS_IDT + _VEC_PF * 16
        self._u8[o:o + 16] = self._pf_gates[resume]

    def _raw_fault(self, addr: int, err: int) -> bool:
        """Called by the exception hook for a #PF during call_raw: map the host page(s) around addr and
        return True, or return False (a real fault; self._raw_refusal says why)."""
        self._raw_refusal = ""
        if err & 0x19:                       # present (protection), reserved bit, or instruction fetch
            if err & 0x10:
                self._raw_refusal = "instruction fetch from a data address"
            return False
        if self._va_base <= addr < self._va(self._npages):
            return False                     # the emulator's own pages: guard pages stay guards
        if not 0 < addr < _HOST_VA_LIMIT:
            self._raw_refusal = "not a user-space host address"
            return False
        vma = None if self._host_maps is None else self._host_maps.find(addr)
        if vma is None:                      # a snapshot per call, re-read when it does not know addr
            self._host_maps = _HostMaps()
            vma = self._host_maps.find(addr)
        if vma is None:
            self._raw_refusal = "not mapped in the host process"
            return False
        lo, hi, perms, path = vma
        if perms[0] != "r" or path in _HOST_SPECIAL:
            self._raw_refusal = f"not readable: {_describe_vma(vma)}"
            return False
        writable = perms[1] == "w"
        if err & 2 and not writable:
            self._raw_refusal = f"write to a read-only {_describe_vma(vma)}"
            return False
        w0 = addr & ~(self.raw_window - 1)
        wlo, whi = max(lo, w0), min(hi, w0 + self.raw_window)
        blo, bhi = self._va_base, self._va(self._npages)
        if wlo < bhi and blo < whi:          # never map over the emulator's own block
            wlo, whi = (wlo, blo) if addr < blo else (bhi, whi)
        pt = self._page_table(wlo, self._raw_table)[0]
        i_lo = wlo >> 12 & 511
        i_hi = i_lo + (whi - wlo) // PAGE
        if pt[addr >> 12 & 511] & _PTE_P:
            return False                     # already mapped: re-running would fault again
        gpa = self._machine.raw_frames(wlo >> 21, i_lo, i_hi)
        flags = _PTE_P | _PTE_A | _PTE_D | _PTE_NX | (_PTE_W if writable else 0)
        pt[i_lo:i_hi] = (np.uint64(gpa) + np.arange(i_lo, i_hi, dtype=np.uint64) * np.uint64(PAGE)
                         ) | np.uint64(flags)
        self._raw_mapped.append((pt, i_lo, i_hi))
        return True

    def _raw_table(self) -> tuple[np.ndarray, int, int]:
        """A zeroed page-table page (not in the block) for host addresses."""
        if not self._raw_pool_free:
            if not self._raw_pool_gpa:
                self._raw_pool_gpa = self._machine.alloc_gpa(_GPA_SLOT)
            gpa = self._raw_pool_gpa + len(self._raw_pool) * _RAW_POOL_PAGES * PAGE
            if gpa + _RAW_POOL_PAGES * PAGE > self._raw_pool_gpa + _GPA_SLOT:
                raise EmulationError("call_raw: out of page-table pages")
            chunk = mmap.mmap(-1, _RAW_POOL_PAGES * PAGE)
            u64 = np.frombuffer(chunk, dtype=np.uint64)
            hva = u64.ctypes.data
            self._raw_pool.append(chunk)
            for i in range(_RAW_POOL_PAGES):
                _bmem.page_insert(gpa + i * PAGE, hva + i * PAGE)
                self._raw_pool_free.append((u64[i * 512:(i + 1) * 512], gpa + i * PAGE))
        view, gpa = self._raw_pool_free.pop()
        return view, gpa, -1

    def _raw_end(self):
        """After a call_raw: unmap every host page it mapped, forget the host memory map."""
        for pt, lo, hi in self._raw_mapped:
            pt[lo:hi] = 0
        self._raw_mapped = []
        self._raw_active, self._host_maps = False, None
        self.raw_stats["calls"] += 1
        self.raw_stats["faults"] += self.last.raw_faults
        self.raw_stats["seconds"] += self.last.seconds
        if self._machine.raw_handler is self:
            self._machine.raw_handler = None

    # ---- lifetime
    def close(self):
        """Take the library out of the emulated machine (done for all emulators at interpreter exit)."""
        if self._closed:
            return
        self._closed = True
        for i in range(self._npages):
            _bmem.page_remove(self._gpa + i * PAGE)
        for i in range(len(self._raw_pool) * _RAW_POOL_PAGES):
            _bmem.page_remove(self._raw_pool_gpa + i * PAGE)
        self._machine.emulators.discard(self)
        self._u8 = self._u64 = None
        self._tables, self._raw_pool_free, self._raw_mapped, self._pf_gates = {}, [], [], {}
        self._placed = []
        for chunk in self._raw_pool:
            try:
                chunk.close()
            except BufferError:
                pass
        self._raw_pool = []
        try:
            self._buf.release()
        except BufferError:
            pass
        del self._mem_anchor
        try:
            self._mem.close()
        except BufferError:                  # a view is still alive somewhere: the GC will free it
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Avx512Emulator({self.path!r}, {len(self._symbols)} exported symbols)"
