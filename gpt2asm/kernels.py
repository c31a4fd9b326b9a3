"""ctypes bindings to libgpt2asm, kernel-family choice by CPU probing, the -j pool and plans.

The assembly trusts its arguments, so everything that reaches it passes through here first: the public
`Kernels` methods check dtype, size, contiguity and alignment of every array and raise
InvalidArgumentError; a `Plan` (the job records of gpt2asm_plan_run_<family>) validates every array a job
points at when the job is added, keeps it alive, and checks the per-step token and position.  With -j N
the library's own worker threads (gpt2asm_worker_<family>) are started once by `Kernels` and stay inside
the library, parked between plans, until close().  docs/kernels.md documents each symbol and record.
"""
from __future__ import annotations

import atexit
import ctypes
import importlib.util
import os
import platform
import queue
import sys
import threading
import weakref
from ctypes import c_size_t, c_uint32, c_uint64, c_void_p, c_char_p
from pathlib import Path

import numpy as np

from .checkasm import open_library
from .errors import InvalidArgumentError, KernelUnavailableError, LibraryError

PKG_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PKG_DIR.parent                       # the checkout, when running from one
LIB_NAME = "libgpt2asm.dylib" if sys.platform == "darwin" else "libgpt2asm.so"
ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
    platform.machine().lower(), platform.machine())

# -s values per architecture: index and name, best last.
FAMILIES = {"x86_64": ["avx2", "avx512"], "aarch64": ["neon", "sme2"]}
# a family that lacks an op takes it from this one (sme2 has only the f32 / f16 matrix-vector and the matmul kernels)
FAMILY_FALLBACK = {"sme2": "neon"}
# single ops one family takes from another (the binary16-cache attention of avx2 serves avx512 too)
SHARED_OPS = {("avx512", "attention_f16"): "avx2"}
# the dtypes a KV cache may have, by name: float32, or binary16 (State, Transformer(kv=...))
KV_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}
ALIGN = 64
TILE = 64
SIZE_MAX = (1 << 64) - 1          # what a size_t kernel returns for "none" (gpt2asm_argmax_f32)
HEAD_DIM = 64

_lib: ctypes.CDLL | None = None


# --------------------------------------------------------------------------------------------------
# loading

def _source_hash() -> str | None:
    """Hash of the assembly sources beside the package (a checkout), or None for an installed wheel."""
    build_py = SOURCE_ROOT / "build.py"
    if not (build_py.exists() and (SOURCE_ROOT / "asm" / ARCH).is_dir()):
        return None
    spec = importlib.util.spec_from_file_location("_gpt2asm_build", build_py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.source_hash(ARCH)


def load_library() -> ctypes.CDLL:
    """Load libgpt2asm once; a missing or stale library is a LibraryError saying how to build it."""
    global _lib
    if _lib is not None:
        return _lib
    path = PKG_DIR / LIB_NAME
    how = "run `make build` (or `python build.py`) in the source tree, or reinstall with `pip install .`"
    if not path.exists():
        raise LibraryError(f"the assembly library {path} is missing: {how}")
    try:
        lib = open_library(path)          # ctypes.CDLL, or checked by the test harness ($GPT2ASM_CHECKASM)
    except OSError as e:
        raise LibraryError(f"cannot load {path}: {e}; {how}") from None
    # const char *gpt2asm_build_id(void);
    lib.gpt2asm_build_id.restype = c_char_p
    lib.gpt2asm_build_id.argtypes = []
    want = _source_hash()
    if want is not None and lib.gpt2asm_build_id().decode() != want and not os.environ.get(
            "GPT2ASM_ALLOW_STALE"):
        raise LibraryError(f"the assembly library {path} is stale (built from other sources than "
                           f"asm/{ARCH}/): {how}")
    _bind_common(lib)
    _lib = lib
    return lib


def _bind_common(lib: ctypes.CDLL) -> None:
    if ARCH == "x86_64":
        # void gpt2asm_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t regs[4]);
        lib.gpt2asm_cpuid.argtypes = [c_uint32, c_uint32, ctypes.POINTER(c_uint32)]
        lib.gpt2asm_cpuid.restype = None
        # uint64_t gpt2asm_xgetbv(uint32_t xcr);
        lib.gpt2asm_xgetbv.argtypes = [c_uint32]
        lib.gpt2asm_xgetbv.restype = c_uint64


# --------------------------------------------------------------------------------------------------
# probing

def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
    regs = (c_uint32 * 4)()
    load_library().gpt2asm_cpuid(leaf, subleaf, regs)
    return tuple(regs)


def cpu_features() -> dict[str, bool]:
    """What the CPU and OS support, as far as gpt2asm's kernel families care."""
    if ARCH == "aarch64":
        from .cpu_arm import arm_features       # HWCAP/HWCAP2 (Linux), sysctl (macOS), rdsvl
        return arm_features()
    if ARCH != "x86_64":
        return {}
    lib = load_library()
    max_leaf = cpuid(0)[0]
    _, _, ecx1, _ = cpuid(1)
    ebx7 = cpuid(7, 0)[1] if max_leaf >= 7 else 0
    osxsave = bool(ecx1 >> 27 & 1)
    xcr0 = lib.gpt2asm_xgetbv(0) if osxsave else 0
    f = {
        "fma": bool(ecx1 >> 12 & 1), "osxsave": osxsave, "avx": bool(ecx1 >> 28 & 1),
        "f16c": bool(ecx1 >> 29 & 1), "avx2": bool(ebx7 >> 5 & 1), "avx512f": bool(ebx7 >> 16 & 1),
        "os_ymm": xcr0 & 0b110 == 0b110, "os_zmm": xcr0 & 0b11100110 == 0b11100110,
    }
    return f


def available_families() -> list[str]:
    """Kernel families this machine can run, best last."""
    if ARCH == "aarch64":
        from .cpu_arm import arm_families       # neon, plus sme2 when SME2 with SVL 128..512 bits
        return arm_families()
    f = cpu_features()
    if ARCH != "x86_64":
        return []
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
        raise InvalidArgumentError(f"unknown kernel family {requested!r}: choose one of {', '.join(names)}")
    if req not in have:
        raise KernelUnavailableError(f"kernel family {req!r} is not supported by this CPU/OS "
                                     f"(available: {', '.join(have) or 'none'})")
    return req


# --------------------------------------------------------------------------------------------------
# the Python pool: only for a kernel family without the library's plan executor (see Kernels.has_plan)

class Pool:
    """n-1 worker threads plus the caller.  run(fn, args) calls fn(*args[i]) on thread i and waits.

    ctypes drops the GIL for the length of each foreign call, so the kernels of one job run in parallel.
    Every output is computed whole by one thread, so results do not depend on n.  (The families with a
    plan executor use the library's own pool instead: gpt2asm_worker_<family>, docs/kernels.md.)
    """

    def __init__(self, n: int):
        self.n = n
        self._todo = [queue.SimpleQueue() for _ in range(n - 1)]
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, args=(q,), daemon=True, name=f"gpt2asm-{i + 1}")
                         for i, q in enumerate(self._todo)]
        for t in self._threads:
            t.start()

    def _work(self, q: queue.SimpleQueue) -> None:
        while (job := q.get()) is not None:
            fn, args = job
            try:
                fn(*args)
            finally:
                self._done.put(None)

    def run(self, fn, args: list[tuple]) -> None:
        """Returns (or raises) only once every worker finished its part: an exception or Ctrl-C on the
        calling thread still waits for the kernels running on the others (they write the job's outputs),
        so no completion of this job can be taken for one of the next."""
        sent = 0
        try:
            for q, a in zip(self._todo, args[1:]):
                q.put((fn, a))
                sent += 1
            fn(*args[0])
        finally:
            interrupted = None
            while sent:
                try:
                    self._done.get()
                    sent -= 1
                except KeyboardInterrupt as e:     # a kernel call is short: keep waiting, then re-raise
                    interrupted = e
            if interrupted is not None:
                raise interrupted

    def close(self) -> None:
        for q in self._todo:
            q.put(None)
        for t in self._threads:
            t.join()
        self._todo = []

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous near-equal ranges covering 0..n (empty ranges dropped)."""
    parts = max(1, min(parts, n))
    return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]


# --------------------------------------------------------------------------------------------------
# checked numpy-level wrappers

def addr(a: np.ndarray) -> int:
    return a.ctypes.data


def check(a, name: str, dtype, size: int | None = None, aligned: bool = False, writable: bool = False):
    """Validate one array argument before its address reaches assembly."""
    if not isinstance(a, np.ndarray):
        raise InvalidArgumentError(f"{name}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise InvalidArgumentError(f"{name}: dtype {a.dtype}, expected {np.dtype(dtype)}")
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(f"{name}: array must be C-contiguous")
    if size is not None and a.size != size:
        raise InvalidArgumentError(f"{name}: {a.size} elements, expected {size}")
    if aligned and addr(a) % ALIGN:
        raise InvalidArgumentError(f"{name}: address must be {ALIGN}-byte aligned")
    if writable and not a.flags.writeable:
        raise InvalidArgumentError(f"{name}: array is read-only")
    return addr(a)

def check_cache(k, v, writable: bool = False) -> tuple[int, int]:
    """Validate one layer's key and value caches k, v [H][n_ctx][64] (both float32, or both float16):
    (H, n_ctx)."""
    if not (isinstance(k, np.ndarray) and k.ndim == 3 and k.shape[2] == HEAD_DIM):
        raise InvalidArgumentError("k: expected a cache [n_head][n_ctx][64]")
    if k.dtype not in KV_DTYPES.values():
        raise InvalidArgumentError(f"k: dtype {k.dtype}, expected float32 or float16")
    H, n_ctx, _ = k.shape
    check(k, "k", k.dtype, writable=writable)
    check(v, "v", k.dtype, k.size, writable=writable)
    if v.shape != k.shape:
        raise InvalidArgumentError(f"v: shape {v.shape}, expected {k.shape}")
    return H, n_ctx


def check_attention(q, k, v, n_pos) -> tuple[int, int]:
    """Validate attention arguments (q [H*64], k, v [H][n_ctx][64], 1 <= n_pos <= n_ctx): (H, n_ctx)."""
    H, n_ctx = check_cache(k, v)
    check(q, "q", np.float32, H * HEAD_DIM)
    if isinstance(n_pos, bool) or not isinstance(n_pos, (int, np.integer)) or not 1 <= n_pos <= n_ctx:
        raise InvalidArgumentError(f"n_pos must be in 1..{n_ctx}, got {n_pos!r}")
    return H, n_ctx



def _aligned_zeros(nbytes: int) -> np.ndarray:
    """Zeroed, 64-byte aligned uint8 buffer (its base array keeps the memory alive)."""
    buf = np.zeros(nbytes + ALIGN, np.uint8)
    start = (-buf.ctypes.data) % ALIGN
    return buf[start:start + nbytes]


# --------------------------------------------------------------------------------------------------
# plans: the job records of gpt2asm_plan_run_<family> (docs/kernels.md, "Thread pool and plans")

POOL_BYTES = 256
CTX_SEQ, CTX_SEQ_SLEEPERS, CTX_SHUTDOWN, CTX_NTHREADS = 0, 4, 8, 12      # u32 fields
CTX_SPIN, CTX_YIELD, CTX_PARKS = 40, 48, 128                             # u64 fields
SPIN_TICKS = 1_000_000        # TSC ticks a waiting thread spins before it parks (~0.4 ms: longer than the
                              # Python gap between two decode steps, so workers stay awake while decoding)
SPIN_TICKS_OVERSUBSCRIBED = 200_000   # ... with more threads than CPUs (~0.1 ms)
# AArch64 (plan_aarch64.S): the same waits in nanoseconds (converted with CNTFRQ_EL0, whose rate varies
# from 24 MHz to 1 GHz between implementations)
SPIN_NS, SPIN_NS_OVERSUBSCRIBED = 400_000, 100_000


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _spin_ticks(threads: int) -> tuple[int, int]:
    """(spin, yield) TSC ticks (AArch64: nanoseconds) of a waiting thread: spin with pause, from `yield`
    on calling sched_yield between rounds, then park.  Yielding from the start costs nothing on an idle
    machine (measured: the same 0.2 us per job barrier at -j 2) and is what keeps -j 2 near -j 1 speed
    when another process competes for the cores (measured with one busy process on 2 cores: 11.8
    ms/token fp16 against 18.2 without yielding, -j 1 10.2); with more threads than CPUs the thread
    waited for may need this very CPU, so the waiter parks sooner."""
    spin, oversubscribed = ((SPIN_NS, SPIN_NS_OVERSUBSCRIBED) if ARCH == "aarch64"
                            else (SPIN_TICKS, SPIN_TICKS_OVERSUBSCRIBED))
    return (spin if threads <= _cpus() else oversubscribed), 0


PLAN_HEADER = 128
JOB_BYTES = 256
KIND_MATVEC, KIND_QKV, KIND_ATTN, KIND_MATMUL, KIND_ROWLN, KIND_ROWATTN = 0, 1, 2, 3, 4, 5
PRO_LN, PRO_EMBED, FL_F16, FL_Q8, EPI_GELU, EPI_RESID, FL_ROWS, FL_KV = 1, 2, 4, 8, 0x10, 0x20, 0x40, 0x80
FL_KV16 = 0x4000              # binary16 caches (bits 8-13 hold the claim shift)
EPI_ARGMAX = 0x30             # MATVEC: the first maximum of the outputs into per-thread slots
ARGMAX_CHUNK = 16             # tiles per claim of an ARGMAX job: its outputs are scanned while in cache
ROWATTN_ROWS = 4              # query rows of one head per attention call of a ROWATTN job (x86), at most
# u64 slots of a job record (byte offset / 8)
_J = dict(n=1, chunk=2, w=3, b=4, y=5, n_in=6, x=7, g=8, beta=9, a0=10, a1=11, a2=12, a3=13, a4=14,
          tile_bytes=15, scale=16, ldx=17, ldy=18, ldr=19)
# u64 slots of the plan header
_H = dict(token=0, pos=1, n_jobs=2, priv=3, priv_stride=4, C=5, wte=6, wpe=7, x=8, h_off=9, e_off=10,
          s_off=11, n_tok=12, kv_off=13, argmax=14)
# weight dtypes of the tiled matrices -> the job's dtype flag
_WDTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): FL_F16, np.dtype(np.int8): FL_Q8}


def check_matrix(w, name: str = "w", scale=None, n_tiles: int | None = None) -> tuple[int, int, int]:
    """Validate a tiled weight matrix [n_tiles][n_in][64] (float32, float16, or int8 with its scales
    float32 [64*n_tiles]): (n_tiles, n_in, dtype flag).  A scale is required for int8 and refused otherwise."""
    if not (isinstance(w, np.ndarray) and w.ndim == 3 and w.shape[2] == TILE and w.shape[0] >= 1
            and w.shape[1] >= 1 and w.dtype in _WDTYPES):
        raise InvalidArgumentError(f"{name}: expected a tiled float32/float16/int8 matrix [n_tiles][n_in][64]")
    nt, n_in, _ = w.shape
    if n_tiles is not None and nt != n_tiles:
        raise InvalidArgumentError(f"{name}: {nt} tiles, expected {n_tiles}")
    check(w, name, w.dtype, aligned=True)
    flag = _WDTYPES[w.dtype]
    if flag == FL_Q8:
        if scale is None:
            raise InvalidArgumentError(f"{name}: int8 weights need their scales (float32 [{nt * TILE}])")
        check(scale, f"{name} scale", np.float32, nt * TILE)
    elif scale is not None:
        raise InvalidArgumentError(f"{name}: a scale goes only with int8 weights, not {w.dtype}")
    return nt, n_in, flag


def check_rows(a, name: str, width: int, writable: bool = False) -> tuple[int, int]:
    """Validate a row buffer [rows][>= width] of float32, its elements contiguous within a row and rows
    ld floats apart (a C-contiguous array, or a column slice of one): (rows, ld)."""
    if not (isinstance(a, np.ndarray) and a.ndim == 2 and a.shape[0] >= 1):
        raise InvalidArgumentError(f"{name}: expected rows [n][{width}+]")
    if a.dtype != np.float32:
        raise InvalidArgumentError(f"{name}: dtype {a.dtype}, expected float32")
    if a.shape[1] < width:
        raise InvalidArgumentError(f"{name}: rows of {a.shape[1]} floats, need {width}")
    rs, cs = a.strides
    if not (cs == 4 and rs >= 4 * a.shape[1] and rs % 4 == 0):
        raise InvalidArgumentError(f"{name}: rows must be contiguous and in increasing address order")
    if writable and not a.flags.writeable:
        raise InvalidArgumentError(f"{name}: array is read-only")
    return a.shape[0], rs // 4


def _claims(n_items: int, threads: int, family: str) -> tuple[int, int]:
    """(chunk, guided shift) of a job: one claim of everything for one thread; otherwise guided claims of
    max(chunk, remaining >> shift) items -- large contiguous claims first, single items (pairs of tiles
    for AVX-512, whose matvec takes them two at a time) at the end, so that the threads finish a job
    together.  (Measured on the 2-core CI machine: within noise of fixed claims of 1 or 2 items.)"""
    if threads == 1:
        return n_items, 0
    small = 2 if family == "avx512" and n_items >= 8 * threads else 1
    return small, (2 * threads - 1).bit_length()


def _row_claims(threads: int) -> tuple[int, int]:
    """(chunk, guided shift) of a row job, whose item count is known only per run: one claim of
    everything for one thread, otherwise guided claims down to single items."""
    return (1 << 32, 0) if threads == 1 else (1, (2 * threads - 1).bit_length())


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


class Plan:
    """A list of jobs for one Kernels object, run by Kernels.run_plan in one call into the library.

    Every array a job points at is validated here (dtype, contiguity, size, alignment where required)
    and kept alive by the plan; the per-step parameters (token, position) are checked by set_step.
    Build: add jobs (matvec, qkv_attention, attention), then build(); a built plan is immutable apart
    from set_step.
    """

    def __init__(self, kernels: "Kernels"):
        self.k = kernels
        self.jobs: list[tuple[int, int, dict]] = []
        self.keep: list[np.ndarray] = []
        self.priv_h = self.priv_e = self.priv_s = self.priv_kv = 0    # floats per thread
        self.embed: tuple | None = None                      # (wte, wpe, x)
        self.max_pos: int | None = None                      # positions < max_pos are valid
        self.max_token: int | None = None
        self.max_rows: int | None = None                     # row jobs: rows per run (set_rows)
        self.buf: np.ndarray | None = None
        self.addr = self.n_jobs = 0
        self.argmax_job: int | None = None
        self._slots: np.ndarray | None = None                # ARGMAX: per thread {u64 index, f32, u32 bad}
        self._slot_views: list[tuple] = []                   # ... and ctypes views of them
        self._max: int | None = None                         # gpt2asm_plan_step's reduction of the slots

    # -- building -----------------------------------------------------------------------------------

    def _limit_pos(self, n: int) -> None:
        self.max_pos = n if self.max_pos is None else min(self.max_pos, n)

    def _limit_rows(self, n: int) -> None:
        self.max_rows = n if self.max_rows is None else min(self.max_rows, n)

    def _ptr(self, a: np.ndarray) -> int:
        self.keep.append(a)
        return addr(a)

    def _prologue(self, ln, embed: bool, n_in: int, x) -> tuple[int, dict]:
        """Flags and fields of an optional LayerNorm (+ embedding) prologue feeding n_in inputs."""
        if ln is None:
            if embed:
                raise InvalidArgumentError("the embedding prologue needs a LayerNorm")
            check(x, "x", np.float32, n_in)
            return 0, dict(x=self._ptr(x))
        src, g, beta = ln
        check(src, "ln source", np.float32, n_in, writable=embed)
        check(g, "ln gain", np.float32, n_in)
        check(beta, "ln bias", np.float32, n_in)
        self.priv_h = max(self.priv_h, n_in)
        flags = PRO_LN
        if embed:
            if self.embed is None:
                raise InvalidArgumentError("set_embedding() first")
            if src is not self.embed[2]:
                raise InvalidArgumentError("the embedding prologue normalises the residual stream it fills")
            flags |= PRO_EMBED
            self.priv_e = max(self.priv_e, n_in)
        return flags, dict(x=self._ptr(src), g=self._ptr(g), beta=self._ptr(beta))

    def set_embedding(self, wte: np.ndarray, wpe: np.ndarray, x: np.ndarray) -> None:
        """The embedding add x = wte[token] + wpe[pos] of the EMBED prologue (wte [V][C], wpe [n_ctx][C])."""
        if not (isinstance(wte, np.ndarray) and wte.ndim == 2 and isinstance(wpe, np.ndarray) and wpe.ndim == 2
                and wte.shape[1] == wpe.shape[1]):
            raise InvalidArgumentError("wte, wpe: expected [V][C] and [n_ctx][C]")
        C = wte.shape[1]
        if C < 16 or C % 16:
            raise InvalidArgumentError(f"embedding width {C} must be a positive multiple of 16")
        check(wte, "wte", np.float32)
        check(wpe, "wpe", np.float32)
        check(x, "x", np.float32, C, writable=True)
        self.embed = (wte, wpe, x)
        self.max_token = wte.shape[0]
        self._limit_pos(wpe.shape[0])
        self.keep += [wte, wpe, x]

    def _weights(self, w, scale, n_tiles: int | None = None) -> tuple[int, int, int, dict]:
        """A job's tiled weights (and int8 scales): (n_tiles, n_in, dtype flag, record fields)."""
        n_tiles, n_in, flag = check_matrix(w, "w", scale, n_tiles)
        if flag == FL_Q8 and not self.k.has_q8:
            raise KernelUnavailableError(f"the {self.k.family} family has no int8 kernels in this library")
        return n_tiles, n_in, flag, dict(w=self._ptr(w), scale=0 if scale is None else self._ptr(scale),
                                         n_in=n_in, tile_bytes=n_in * TILE * w.itemsize)

    def matvec(self, w: np.ndarray, x: np.ndarray | None, b: np.ndarray | None, y: np.ndarray, *,
               scale: np.ndarray | None = None, ln=None, embed: bool = False, gelu: bool = False,
               resid: np.ndarray | None = None, argmax: int | None = None, chunk: int | None = None) -> int:
        """y = W in + b over the tiles of w (float32, float16, or int8 with its scales: required iff int8),
        in = x or LayerNorm(ln = (source, gain, bias)) (after the embedding add if embed); then y = gelu(y),
        or resid += y (the residual add), or (argmax = n, one job per plan) the first maximum of y[0..n)
        for first_max() (claims of ARGMAX_CHUNK tiles, scanned while in cache).  Returns the job index."""
        n_tiles, n_in, wflag, wf = self._weights(w, scale)
        flags, f = self._prologue(ln, embed, n_in, x)
        check(y, "y", np.float32, n_tiles * TILE, writable=True)
        if b is not None:
            check(b, "b", np.float32, n_tiles * TILE)
        if (gelu, resid is not None, argmax is not None).count(True) > 1:
            raise InvalidArgumentError("one epilogue per job")
        if gelu:
            flags |= EPI_GELU
        if resid is not None:
            check(resid, "resid", np.float32, n_tiles * TILE, writable=True)
            flags |= EPI_RESID
            f["a0"] = self._ptr(resid)
        if argmax is not None:
            if not (_is_int(argmax) and TILE * (n_tiles - 1) < argmax <= TILE * n_tiles < 1 << 31):
                raise InvalidArgumentError(f"argmax: the outputs scanned must be in ({TILE * (n_tiles - 1)}, "
                                           f"{TILE * n_tiles}], below 2^31; got {argmax!r}")
            if self.argmax_job is not None:
                raise InvalidArgumentError("one argmax job per plan")
            flags |= EPI_ARGMAX
            slots = self._slots = _aligned_zeros(16 * self.k.threads)
            self._slot_views = [(ctypes.c_uint64.from_buffer(slots, 16 * t),
                                 ctypes.c_float.from_buffer(slots, 16 * t + 8),
                                 ctypes.c_uint32.from_buffer(slots, 16 * t + 12)) for t in range(self.k.threads)]
            f.update(a0=self._ptr(slots), a1=int(argmax))
            chunk = ARGMAX_CHUNK if chunk is None else chunk
        f.update(wf, b=0 if b is None else self._ptr(b), y=self._ptr(y))
        job = self._add(KIND_MATVEC, flags | wflag, n_tiles, chunk, f)
        if argmax is not None:
            self.argmax_job = job
        return job

    def qkv_attention(self, w: np.ndarray, b: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      out: np.ndarray, *, ln, embed: bool = False, scale: np.ndarray | None = None) -> int:
        """One transformer block's attention half for the token at the header's position pos: per head h
        (the work items), tiles h, H+h, 2H+h of the c_attn matvec (scale: its int8 scales) on
        LayerNorm(ln) give q_h (into q), k_h and v_h (straight into the caches k, v [H][n_ctx][64] at
        pos); then the attention of head h over positions 0..pos into out."""
        H, n_ctx = check_cache(k, v, writable=True)
        kvflag = self._kv16(k, 1)
        _, n_in, wflag, wf = self._weights(w, scale, 3 * H)
        check(b, "b", np.float32, 3 * H * TILE)
        check(q, "q", np.float32, 3 * H * TILE, writable=True)
        check(out, "out", np.float32, H * HEAD_DIM, writable=True)
        flags, f = self._prologue(ln, embed, n_in, None)
        self._limit_pos(n_ctx)
        self.priv_s = max(self.priv_s, H * (-(-n_ctx // 16) * 16))        # a score row per head
        f.update(wf, b=self._ptr(b), y=self._ptr(q), a0=self._ptr(k), a1=self._ptr(v), a2=self._ptr(out),
                 a3=n_ctx * HEAD_DIM)
        return self._add(KIND_QKV, flags | wflag | kvflag, H, None, f)

    # -- prefill: row jobs over the n_tok rows of a run (set_rows) -----------------------------------

    def _rows(self, a, name: str, width: int, writable: bool = False) -> int:
        """A row buffer [R][ld >= width]: limits the rows per run to R; returns ld (floats)."""
        R, ld = check_rows(a, name, width, writable)
        self._limit_rows(R)
        self.keep.append(a)
        return ld

    def matmul(self, w: np.ndarray, x: np.ndarray, b: np.ndarray | None, y: np.ndarray, *,
               scale: np.ndarray | None = None, gelu: bool = False, resid: np.ndarray | None = None,
               kv: tuple | None = None, chunk: int | None = None) -> int:
        """Y[t] = W X[t] + b for the rows t < n_tok of a run (tiles are the items), x [R][>= n_in],
        y [R][>= 64 n_tiles]; then Y[t] = gelu(Y[t]), or resid[t] += Y[t] (resid [R][>= 64 n_tiles]).
        kv = (k, v), the caches [H][n_ctx][64]: w is c_attn (3H tiles); its q tiles go to y
        ([R][>= 64 H]), its k and v tiles straight into the caches at rows pos .. pos + n_tok - 1."""
        if not self.k.has_matmul:
            raise KernelUnavailableError(f"the {self.k.family} family has no matmul kernels in this library")
        n_tiles, n_in, wflag, f = self._weights(w, scale)
        if b is not None:
            check(b, "b", np.float32, n_tiles * TILE)
        flags, width = wflag, n_tiles * TILE
        if kv is not None:
            if not (isinstance(kv, tuple) and len(kv) == 2):
                raise InvalidArgumentError("kv: expected the caches (k, v)")
            if gelu or resid is not None:
                raise InvalidArgumentError("no epilogue with kv")
            H, n_ctx = check_cache(*kv, writable=True)
            if n_tiles != 3 * H:
                raise InvalidArgumentError(f"w: {n_tiles} tiles, expected {3 * H} (c_attn of {H} heads)")
            self._limit_pos(n_ctx)
            flags, width = flags | FL_KV | self._kv16(kv[0], check_rows(x, "x", n_in)[0]), H * TILE
            f.update(a0=self._ptr(kv[0]), a1=self._ptr(kv[1]), a3=n_ctx * HEAD_DIM, a4=H)
        f.update(ldx=self._rows(x, "x", n_in), ldy=self._rows(y, "y", width, writable=True), x=addr(x),
                 y=addr(y), b=0 if b is None else self._ptr(b))
        if np.may_share_memory(x, y):
            raise InvalidArgumentError("y must not overlap x")
        if gelu and resid is not None:
            raise InvalidArgumentError("one epilogue per job")
        if gelu:
            flags |= EPI_GELU
        if resid is not None:
            if np.may_share_memory(resid, y) or np.may_share_memory(resid, x):
                raise InvalidArgumentError("resid must not overlap x or y")
            f.update(ldr=self._rows(resid, "resid", n_tiles * TILE, writable=True), a0=addr(resid))
            flags |= EPI_RESID
        return self._add(KIND_MATMUL, flags, n_tiles, chunk, f)

    def rows_layernorm(self, x: np.ndarray, g: np.ndarray, beta: np.ndarray, y: np.ndarray, *,
                       chunk: int | None = None) -> int:
        """Y[t] = layernorm(X[t]) (gain g, bias beta [n]) for the rows t < n_tok of a run (rows are the
        items); x, y [R][>= n]."""
        if not (isinstance(g, np.ndarray) and g.size >= 1):
            raise InvalidArgumentError("ln gain: expected a float32 vector")
        n = g.size
        check(g, "ln gain", np.float32, n)
        check(beta, "ln bias", np.float32, n)
        f = dict(ldx=self._rows(x, "x", n), ldy=self._rows(y, "y", n, writable=True), x=addr(x), y=addr(y),
                 g=self._ptr(g), beta=self._ptr(beta), n_in=n)
        return self._add(KIND_ROWLN, FL_ROWS, 1, chunk, f)

    def rows_attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, *,
                       chunk: int | None = None) -> int:
        """For the rows t < n_tok of a run at positions pos + t: out[t] = attention of the query row
        q[t] over cache positions 0 .. pos + t (items: head x row pairs); q, out [R][>= 64 H]."""
        H, n_ctx = check_cache(k, v)
        kvflag = self._kv16(k, 0)
        f = dict(ldx=self._rows(q, "q", H * HEAD_DIM), ldy=self._rows(out, "out", H * HEAD_DIM, writable=True),
                 y=addr(q), a0=self._ptr(k), a1=self._ptr(v), a2=addr(out), a3=n_ctx * HEAD_DIM)
        if np.may_share_memory(q, out):
            raise InvalidArgumentError("out must not overlap q")
        self._limit_pos(n_ctx)
        self.priv_s = max(self.priv_s, ROWATTN_ROWS * (-(-n_ctx // 16) * 16))     # a score row per query row
        return self._add(KIND_ROWATTN, FL_ROWS | kvflag, H, chunk, f)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, n_pos: int) -> int:
        """Attention of q [H*64] over positions 0..n_pos-1 of k, v [H][n_ctx][64] into out; heads are the items."""
        H, n_ctx = check_attention(q, k, v, n_pos)
        kvflag = self._kv16(k, 0)
        check(out, "out", np.float32, H * HEAD_DIM, writable=True)
        self.priv_s = max(self.priv_s, H * (-(-int(n_pos) // 16) * 16))   # a score row per head
        f = dict(y=self._ptr(q), a0=self._ptr(k), a1=self._ptr(v), a2=self._ptr(out), a3=n_ctx * HEAD_DIM,
                 a4=int(n_pos))
        return self._add(KIND_ATTN, kvflag, H, None, f)

    def _kv16(self, k: np.ndarray, rows: int) -> int:
        """The cache flag of a job over cache k: FL_KV16 for a binary16 cache, whose k / v rows the job
        first writes to `rows` float32 staging rows of 64 (a private area's) -- else 0."""
        if k.dtype != np.float16:
            return 0
        self.priv_kv = max(self.priv_kv, rows * HEAD_DIM)
        return FL_KV16

    def _add(self, kind: int, flags: int, n_items: int, chunk: int | None, fields: dict) -> int:
        if self.buf is not None:
            raise InvalidArgumentError("the plan is built already")
        shift = 0
        if chunk is None:
            chunk, shift = (_row_claims(self.k.threads) if flags & FL_ROWS or kind == KIND_MATMUL else
                            _claims(n_items, self.k.threads, self.k.family))
        if not _is_int(chunk) or not 1 <= chunk:
            raise InvalidArgumentError(f"chunk must be ≥ 1, got {chunk}")
        flags |= shift << 8
        self.jobs.append((kind, flags, dict(fields, n=n_items, chunk=chunk)))
        return len(self.jobs) - 1

    def build(self) -> "Plan":
        """Lay the records out (header, private areas per thread, jobs); returns self."""
        if self.buf is not None:
            return self
        if not self.jobs:
            raise InvalidArgumentError("a plan needs at least one job")
        n = len(self.jobs)
        buf = _aligned_zeros(PLAN_HEADER + JOB_BYTES * n)
        u64 = buf.view(np.uint64)
        u32 = buf.view(np.uint32)
        r16 = lambda f: -(-f // 16) * 16                         # noqa: E731  floats -> 64-byte multiple
        h_off, e_off = 0, 4 * r16(self.priv_h)
        s_off = e_off + 4 * r16(self.priv_e)
        kv_off = s_off + 4 * r16(self.priv_s)
        stride = max(64, kv_off + 4 * r16(self.priv_kv))
        self.priv = _aligned_zeros(stride * self.k.threads)
        hdr = dict(n_jobs=n, priv=addr(self.priv), priv_stride=stride, h_off=h_off, e_off=e_off, s_off=s_off,
                   kv_off=kv_off, argmax=0 if self._slots is None else addr(self._slots))
        if self.embed is not None:
            wte, wpe, x = self.embed
            hdr.update(C=wte.shape[1], wte=addr(wte), wpe=addr(wpe), x=addr(x))
        for key, val in hdr.items():
            u64[_H[key]] = val
        for j, (kind, flags, fields) in enumerate(self.jobs):
            base = (PLAN_HEADER + JOB_BYTES * j) // 8
            u32[2 * base], u32[2 * base + 1] = kind, flags
            for key, val in fields.items():
                u64[base + _J[key]] = val
        self.buf, self.addr, self.n_jobs = buf, addr(buf), n
        self._step = u64[:PLAN_HEADER // 8]
        return self

    def __len__(self) -> int:
        return len(self.jobs)

    def first_max(self) -> int | None:
        """After a run that included the argmax job: the index of the first maximum of its outputs
        (numpy.argmax), or None if any of them is NaN or ±inf -- what Kernels.argmax gives on them.
        (Read through ctypes views of the slots, made with the plan: this runs after every step, on
        caches the weights have flushed, where each numpy call costs microseconds.)"""
        if self.argmax_job is None:
            raise InvalidArgumentError("the plan has no argmax job")
        m = self._max
        if m is not None:                              # reduced by gpt2asm_plan_step (Plan.step)
            if m == SIZE_MAX:
                raise LibraryError("the argmax job left no result")
            return None if m == SIZE_MAX - 1 else m
        best = bv = None
        for i, v, bad in self._slot_views:
            if bad.value:
                return None
            i = i.value
            if i != SIZE_MAX and (best is None or v.value > bv or (v.value == bv and i < best)):
                best, bv = i, v.value
        if best is None:
            raise LibraryError("the argmax job left no result (was it run?)")
        return best

    def _check_step(self, token: int, pos: int) -> None:
        if not (_is_int(token) and _is_int(pos)):
            raise InvalidArgumentError(f"token id and position must be integers, got {token!r}, {pos!r}")
        if not 0 <= token < (self.max_token if self.max_token is not None else 1 << 62):
            raise InvalidArgumentError(f"token id {token} out of range 0..{(self.max_token or 1 << 62) - 1}")
        if not 0 <= pos < (self.max_pos if self.max_pos is not None else 1 << 62):
            raise InvalidArgumentError(f"position {pos} out of range 0..{(self.max_pos or 1 << 62) - 1}")

    def set_step(self, token: int, pos: int) -> None:
        """The per-step parameters read by the EMBED prologue (token, pos) and the QKV jobs (pos)."""
        self._check_step(token, pos)
        self._step[0] = token
        self._step[1] = pos

    def step(self, token: int, pos: int) -> None:
        """set_step(token, pos) and a run of every job, in one call into the library
        (gpt2asm_plan_step_<isa>), which also reduces the argmax job's per-thread slots for first_max().
        A decode step's Python is mostly cache misses (the weights have just streamed through every
        cache): each numpy or ctypes operation saved here saves microseconds per token."""
        self.k.run_step(self, token, pos)

    def set_rows(self, n_tok: int, pos: int) -> None:
        """The per-run parameters of the row jobs: n_tok rows, the tokens at positions pos .. pos+n_tok-1
        (1 <= n_tok <= the rows of every row buffer; pos + n_tok <= n_ctx of every cache)."""
        if self.buf is None or self.max_rows is None:
            raise InvalidArgumentError("set_rows: a built plan with row jobs is needed")
        if not (_is_int(n_tok) and 1 <= n_tok <= self.max_rows):
            raise InvalidArgumentError(f"rows per run must be in 1..{self.max_rows}, got {n_tok!r}")
        limit = self.max_pos if self.max_pos is not None else 1 << 62
        if not (_is_int(pos) and 0 <= pos and pos + n_tok <= limit):
            raise InvalidArgumentError(f"positions {pos!r} .. +{n_tok} outside 0..{limit - 1}")
        self._step[_H["pos"]] = pos
        self._step[_H["n_tok"]] = n_tok


class Kernels:
    """One kernel family bound, plus the -j pool.  Methods take numpy arrays and validate them.

    With threads > 1 the library's worker threads (gpt2asm_worker_<family>) are started here and stay
    inside the library, parked between plans, until close()."""

    def __init__(self, family: str | int | None = None, threads: int = 1):
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 256:
            raise InvalidArgumentError(f"threads must be an integer in 1..256, got {threads!r}")
        self.lib = load_library()
        self.family = self._choose(family)
        self.threads = threads
        self.pool = None                  # the Python pool (families without a plan executor)
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()     # one plan at a time per pool
        s = self.family
        P, N = c_void_p, c_size_t
        # void gpt2asm_matvec_f32_<isa>(const float *w, const float *x, const float *b, float *y,
        #                               size_t n_in, size_t tile_begin, size_t tile_end);
        self.matvec_f32 = self._bind(self._symbol("matvec_f32"), [P, P, P, P, N, N, N])
        # void gpt2asm_matvec_f16_<isa>(const uint16_t *w, const float *x, const float *b, float *y,
        #                               size_t n_in, size_t tile_begin, size_t tile_end);
        self.matvec_f16 = self._bind(self._symbol("matvec_f16"), [P, P, P, P, N, N, N])
        # void gpt2asm_matvec_q8_<isa>(const int8_t *w, const float *scale, const float *x, const float *b,
        #                              float *y, size_t n_in, size_t tile_begin, size_t tile_end);
        # (optional: a family without it has has_q8 False and refuses int8 weights)
        self.has_q8 = hasattr(self.lib, self._symbol("matvec_q8"))
        self.matvec_q8 = self._bind(self._symbol("matvec_q8"), [P, P, P, P, P, N, N, N]) if self.has_q8 else None
        # void gpt2asm_matmul_{f32,f16}_<isa>(const float *w, const float *x, size_t ldx, const float *b,
        #                     float *y, size_t ldy, size_t n_tokens, size_t n_in, size_t tile_begin, size_t tile_end);
        # void gpt2asm_matmul_q8_<isa>(const int8_t *w, const float *scale, <the same>);   (batched prefill)
        self.has_matmul = all(hasattr(self.lib, self._symbol(f"matmul_{d}")) for d in ("f32", "f16", "q8"))
        self.matmul_f32 = self.matmul_f16 = self.matmul_q8 = None
        if self.has_matmul:
            self.matmul_f32 = self._bind(self._symbol("matmul_f32"), [P, P, N, P, P, N, N, N, N, N])
            self.matmul_f16 = self._bind(self._symbol("matmul_f16"), [P, P, N, P, P, N, N, N, N, N])
            self.matmul_q8 = self._bind(self._symbol("matmul_q8"), [P, P, P, N, P, P, N, N, N, N, N])
        # void gpt2asm_layernorm_f32_<isa>(const float *x, const float *g, const float *b, float *y, size_t n);
        self.layernorm_f32 = self._bind(self._symbol("layernorm_f32"), [P, P, P, P, N])
        # void gpt2asm_gelu_f32_<isa>(const float *x, float *y, size_t n);
        self.gelu_f32 = self._bind(self._symbol("gelu_f32"), [P, P, N])
        # void gpt2asm_expf_f32_<isa>(const float *x, float *y, size_t n);
        self.expf_f32 = self._bind(self._symbol("expf_f32"), [P, P, N])
        # void gpt2asm_softmax_f32_<isa>(const float *x, float *y, size_t n);
        self.softmax_f32 = self._bind(self._symbol("softmax_f32"), [P, P, N])
        # void gpt2asm_attention_f32_<isa>(const float *q, const float *k, const float *v, float *out,
        #                                  float *scratch, size_t n_pos, size_t head_stride,
        #                                  size_t head_begin, size_t head_end);
        self.attention_f32 = self._bind(self._symbol("attention_f32"), [P, P, P, P, P, N, N, N, N])
        # void gpt2asm_attention_f16_<isa>(const float *q, const uint16_t *k, const uint16_t *v, float *out,
        #                                  float *scratch, size_t n_pos, size_t head_stride,
        #                                  size_t head_begin, size_t head_end);   (a binary16 cache; avx512
        #                                  uses avx2's, sme2 neon's)
        self.attention_f16 = self._bind(self._symbol("attention_f16"), [P, P, P, P, P, N, N, N, N])
        # size_t gpt2asm_argmax_f32_<isa>(const float *x, size_t n);   (SIZE_MAX: a NaN or +-inf in x)
        self.argmax_f32 = self._bind(self._symbol("argmax_f32"), [P, N])
        self.argmax_f32.restype = c_size_t
        # void gpt2asm_plan_run_<isa>(pool_t *ctx, plan_t *plan, size_t job_begin, size_t job_end);
        self.has_plan = hasattr(self.lib, f"gpt2asm_plan_run_{s}")
        self.plan_run = self._bind(f"gpt2asm_plan_run_{s}", [P, P, N, N]) if self.has_plan else None
        # size_t gpt2asm_plan_step_<isa>(pool_t *ctx, plan_t *plan, size_t token, size_t pos);
        self.plan_step = self._bind(f"gpt2asm_plan_step_{s}", [P, P, N, N]) if self.has_plan else None
        if self.plan_step is not None:
            self.plan_step.restype = c_size_t
        self.ctx = _aligned_zeros(POOL_BYTES)                  # pool_t
        ctx32, ctx64 = self.ctx.view(np.uint32), self.ctx.view(np.uint64)
        ctx32[CTX_NTHREADS // 4] = threads if self.has_plan else 1
        ctx64[CTX_SPIN // 8], ctx64[CTX_YIELD // 8] = _spin_ticks(threads)
        self._ctx32, self._ctx64 = ctx32, ctx64
        self._ctx_addr = addr(self.ctx)
        if threads > 1:
            if self.has_plan:
                self._start_workers()
            else:
                self.pool = Pool(threads)
        _LIVE.add(self)

    def _symbol(self, op: str) -> str:
        """gpt2asm_<op>_<family>, or the fallback family's symbol when the family lacks the op."""
        fam = SHARED_OPS.get((self.family, op), self.family)
        while not hasattr(self.lib, f"gpt2asm_{op}_{fam}") and fam in FAMILY_FALLBACK:
            fam = FAMILY_FALLBACK[fam]
        return f"gpt2asm_{op}_{fam}"

    def _choose(self, family):
        """The family to bind (a test harness may override this and _bind, e.g. to emulate)."""
        return choose_family(family)

    def _bind(self, name: str, argtypes):
        """A callable for one exported symbol taking integer addresses and sizes."""
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            raise LibraryError(f"{name} is missing from the library: rebuild with `make build`") from None
        fn.argtypes = argtypes
        fn.restype = None
        return fn

    # -- the library's pool ---------------------------------------------------------------------------

    def _start_workers(self) -> None:
        # void gpt2asm_worker_<isa>(pool_t *ctx, size_t tid);   returns at gpt2asm_pool_shutdown
        worker = getattr(self.lib, f"gpt2asm_worker_{self.family}")
        worker.argtypes, worker.restype = [c_void_p, c_size_t], None
        # void gpt2asm_pool_shutdown(pool_t *ctx);
        self._shutdown = self.lib.gpt2asm_pool_shutdown
        self._shutdown.argtypes, self._shutdown.restype = [c_void_p], None
        ctx = addr(self.ctx)
        for tid in range(1, self.threads):
            t = threading.Thread(target=worker, args=(ctx, tid), daemon=True, name=f"gpt2asm-worker-{tid}")
            t.start()
            self._workers.append(t)

    def pool_stats(self) -> dict:
        """Workers alive, parked right now, and futex waits so far (for tests and benchmarks)."""
        return {"workers": sum(t.is_alive() for t in self._workers),
                "parked": int(self._ctx32[CTX_SEQ_SLEEPERS // 4]),
                "parks": int(self._ctx64[CTX_PARKS // 8]),
                "plans": int(self._ctx32[CTX_SEQ // 4])}

    def close(self) -> None:
        """Stop and join the worker threads (idempotent; the object stays usable single-threaded)."""
        with self._lock:
            if self._workers:
                self._shutdown(addr(self.ctx))
                for t in self._workers:
                    t.join()
                self._workers = []
                self._ctx32[CTX_NTHREADS // 4] = 1
            if self.pool:
                self.pool.close()
                self.pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def new_plan(self) -> Plan:
        if not self.has_plan:
            raise LibraryError(f"the {self.family} family has no plan executor in this library")
        return Plan(self)

    def run_plan(self, plan: Plan, job_begin: int = 0, job_end: int | None = None) -> None:
        """Run jobs [job_begin, job_end) of a built plan with every thread of the pool (one at a time)."""
        self._check_own(plan, "run_plan")
        n = plan.n_jobs
        if job_end is None:
            job_end = n
        if not 0 <= job_begin <= job_end <= n:
            raise InvalidArgumentError(f"run_plan: jobs [{job_begin}, {job_end}) outside 0..{n}")
        plan._max = None                                # first_max() reads the slots
        with self._lock:
            self.plan_run(self._ctx_addr, plan.addr, job_begin, job_end)

    def run_step(self, plan: Plan, token: int, pos: int) -> None:
        """Plan.step: token and pos (checked against the plan's limits), every job, and the argmax slots
        reduced, in one call (gpt2asm_plan_step_<isa>)."""
        self._check_own(plan, "run_step")
        plan._check_step(token, pos)
        plan._max = None
        with self._lock:
            plan._max = self.plan_step(self._ctx_addr, plan.addr, token, pos)

    def _check_own(self, plan: Plan, who: str) -> None:
        if plan.k is not self or plan.buf is None:
            raise InvalidArgumentError(f"{who}: a built plan of this Kernels object is needed")

    # -- parallel dispatch over prevalidated addresses (per-call path) --------------------------------

    def run(self, fn, args: list[tuple]) -> None:
        """Run one job: args[i] for thread i (len(args) ≤ threads); serially without a Python pool."""
        if len(args) == 1 or self.pool is None:
            for a in args:
                fn(*a)
        else:
            self.pool.run(fn, args)

    def _kernel(self, op: str, w: np.ndarray, scale: int | None):
        """gpt2asm_<op>_<dtype> for w's dtype (op 'matvec' or 'matmul'): int8 weights need their scales
        (an address: the per-call paths pass prevalidated arrays), other weights take none."""
        if w.dtype == np.int8:
            if not self.has_q8:
                raise KernelUnavailableError(f"the {self.family} family has no int8 kernels in this library")
            if scale is None:
                raise InvalidArgumentError("int8 weights need their scales")
            return getattr(self, op + "_q8")
        if scale is not None:
            raise InvalidArgumentError(f"a scale goes only with int8 weights, not {w.dtype}")
        return getattr(self, op + ("_f16" if w.dtype == np.float16 else "_f32"))

    def matvec_job(self, w: np.ndarray, x: int, b: int | None, y: int, n_in: int, n_tiles: int,
                   scale: int | None = None):
        """(fn, per-thread args) for y = W x + b (int8 w: y = (Q x) * scale + b), tiles split across the
        threads.  Addresses are prevalidated; scale is required iff w is int8."""
        fn = self._kernel("matvec", w, scale)
        ranges = split(n_tiles, self.threads if self.pool else 1)
        if scale is not None:
            return fn, [(addr(w), scale, x, b, y, n_in, t0, t1) for t0, t1 in ranges]
        return fn, [(addr(w), x, b, y, n_in, t0, t1) for t0, t1 in ranges]

    def matmul_job(self, w: np.ndarray, x: int, ldx: int, b: int | None, y: int, ldy: int, n_tok: int,
                   n_in: int, n_tiles: int, scale: int | None = None):
        """(fn, per-thread args) for Y[t] = W X[t] + b, t < n_tok (rows ldx / ldy floats apart; int8 w:
        with its scales), the tiles split across the threads.  Addresses are prevalidated."""
        if not self.has_matmul:
            raise KernelUnavailableError(f"the {self.family} family has no batched (matmul) kernels")
        fn = self._kernel("matmul", w, scale)
        ranges = split(n_tiles, self.threads if self.pool else 1)
        if scale is not None:
            return fn, [(addr(w), scale, x, ldx, b, y, ldy, n_tok, n_in, t0, t1) for t0, t1 in ranges]
        return fn, [(addr(w), x, ldx, b, y, ldy, n_tok, n_in, t0, t1) for t0, t1 in ranges]

    def attention_job(self, q: int, k: int, v: int, out: int, scratch: list[int], n_pos: int,
                      head_stride: int, n_head: int, f16: bool = False):
        """(kernel, per-thread args) of attention over a float32 cache, or a binary16 one (f16); each
        scratch holds a row of roundup16(n_pos) floats for every head of its thread's share."""
        parts = self.threads if self.pool else 1
        return self.attention_f16 if f16 else self.attention_f32, [(q, k, v, out, s, n_pos, head_stride, h0, h1)
                                    for (h0, h1), s in zip(split(n_head, parts), scratch)]

    # -- checked numpy API (tests, tools) --------------------------------------------------------------

    def matvec(self, w: np.ndarray, x: np.ndarray, b: np.ndarray | None = None,
               scale: np.ndarray | None = None) -> np.ndarray:
        """y[64*n_tiles] = W x + b for a tiled w [n_tiles][n_in][64] (float32 or float16), or
        y = (Q x) * scale + b for int8 w with its scales (float32 [64*n_tiles], required iff int8)."""
        n_tiles, n_in, _ = check_matrix(w, "w", scale)
        px = check(x, "x", np.float32, n_in)
        pb = None if b is None else check(b, "b", np.float32, n_tiles * TILE)
        y = np.empty(n_tiles * TILE, np.float32)
        if self.has_plan:
            p = Plan(self)
            p.matvec(w, x, b, y, scale=scale)
            self.run_plan(p.build())
        else:
            self.run(*self.matvec_job(w, px, pb, addr(y), n_in, n_tiles, None if scale is None else addr(scale)))
        return y

    def matmul(self, w: np.ndarray, x: np.ndarray, b: np.ndarray | None = None,
               scale: np.ndarray | None = None) -> np.ndarray:
        """Y[t] = W X[t] + b for every row of x [T][n_in] (int8 w: with its scales): Y [T][64*n_tiles],
        each row the bits of matvec(w, x[t], b, scale) (the batched-prefill kernels)."""
        n_tiles, n_in, _ = check_matrix(w, "w", scale)
        if not (isinstance(x, np.ndarray) and x.ndim == 2 and x.shape[0] >= 1 and x.shape[1] == n_in):
            raise InvalidArgumentError(f"x: expected rows [T][{n_in}]")
        if b is not None:
            check(b, "b", np.float32, n_tiles * TILE)
        y = np.empty((x.shape[0], n_tiles * TILE), np.float32)
        if not self.has_matmul:
            raise KernelUnavailableError(f"the {self.family} family has no batched (matmul) kernels")
        if not self.has_plan:                   # per-call path (Arm): the tile ranges split over run()
            px = check(x, "x", np.float32)
            self.run(*self.matmul_job(w, px, n_in, None if b is None else addr(b), addr(y), n_tiles * TILE,
                                      x.shape[0], n_in, n_tiles, None if scale is None else addr(scale)))
            return y
        p = Plan(self)
        p.matmul(w, x, b, y, scale=scale)
        p.build().set_rows(x.shape[0], 0)
        self.run_plan(p)
        return y

    def _unary(self, fn, x: np.ndarray, name: str) -> np.ndarray:
        px = check(x, name, np.float32)
        if x.size < 1:
            raise InvalidArgumentError(f"{name}: needs at least one element")
        y = np.empty_like(x)
        fn(px, addr(y), x.size)
        return y

    def gelu(self, x: np.ndarray) -> np.ndarray:
        return self._unary(self.gelu_f32, x, "x")

    def expf(self, x: np.ndarray) -> np.ndarray:
        return self._unary(self.expf_f32, x, "x")

    def softmax(self, x: np.ndarray) -> np.ndarray:
        return self._unary(self.softmax_f32, x, "x")

    def argmax(self, x: np.ndarray) -> int | None:
        """The index of the first maximum of x (numpy.argmax; -0.0 == +0.0), or None if x holds a NaN
        or an infinity (greedy sampling: gpt2asm_argmax_f32, comparisons only, the same on every ISA)."""
        px = check(x, "x", np.float32)
        if x.ndim != 1 or x.size < 1:
            raise InvalidArgumentError(f"x: expected a 1-D array of at least one element, got shape {x.shape}")
        if x.size >= 1 << 31:
            raise InvalidArgumentError(f"x: {x.size} elements, at most {(1 << 31) - 1}")
        i = self.argmax_f32(px, x.size)
        if i == SIZE_MAX:
            return None
        if not (isinstance(i, int) and 0 <= i < x.size):      # e.g. a binding without a return value
            raise LibraryError(f"{self._symbol('argmax_f32')} returned {i!r} for n = {x.size}")
        return i

    def layernorm(self, x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        px = check(x, "x", np.float32)
        if x.size < 1:
            raise InvalidArgumentError("x: needs at least one element")
        pg, pb = check(g, "g", np.float32, x.size), check(b, "b", np.float32, x.size)
        y = np.empty_like(x)
        self.layernorm_f32(px, pg, pb, addr(y), x.size)
        return y

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, n_pos: int) -> np.ndarray:
        """Attention of one query q [n_head*64] over cache k, v [n_head][n_ctx][64] (float32 or float16),
        positions < n_pos."""
        n_head, n_ctx = check_attention(q, k, v, n_pos)
        out = np.empty(n_head * HEAD_DIM, np.float32)
        if self.has_plan:
            p = Plan(self)
            p.attention(q, k, v, out, int(n_pos))
            self.run_plan(p.build())
            return out
        scratch = [np.empty(n_head * (-(-n_pos // 16) * 16), np.float32) for _ in range(self.threads)]
        self.run(*self.attention_job(addr(q), addr(k), addr(v), addr(out), [addr(s) for s in scratch],
                                     int(n_pos), n_ctx * HEAD_DIM, n_head, k.dtype == np.float16))
        return out


_LIVE: "weakref.WeakSet[Kernels]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Join the library's worker threads before the interpreter frees what they point at."""
    for k in list(_LIVE):
        try:
            k.close()
        except Exception:
            pass
