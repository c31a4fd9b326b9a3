"""ctypes bindings to libgpt2asm, kernel-family choice by CPU probing, and the -j worker pool.

The assembly trusts its arguments, so everything that reaches it passes through here first: the public
`Kernels` methods check dtype, size, contiguity and alignment of every array and raise
InvalidArgumentError; the model builds its calls once (`Kernels.call_*` with raw addresses) from arrays
it has validated at start-up.  docs/kernels.md documents each symbol.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import queue
import sys
import threading
from ctypes import c_size_t, c_uint32, c_uint64, c_void_p, c_char_p
from pathlib import Path

import numpy as np

from .errors import InvalidArgumentError, KernelUnavailableError, LibraryError

PKG_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PKG_DIR.parent                       # the checkout, when running from one
LIB_NAME = "libgpt2asm.dylib" if sys.platform == "darwin" else "libgpt2asm.so"
ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
    platform.machine().lower(), platform.machine())

# -s values per architecture: index and name, best last.
FAMILIES = {"x86_64": ["avx2", "avx512"], "aarch64": ["neon", "sme2"]}
ALIGN = 64
TILE = 64
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
        lib = ctypes.CDLL(str(path))
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
                "on x86-64 AVX2 with FMA and F16C is the minimum")
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
# the -j pool

class Pool:
    """n-1 worker threads plus the caller.  run(fn, args) calls fn(*args[i]) on thread i and waits.

    ctypes drops the GIL for the length of each foreign call, so the kernels of one job run in parallel.
    Every output is computed whole by one thread, so results do not depend on n.
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
        for q, a in zip(self._todo, args[1:]):
            q.put((fn, a))
        fn(*args[0])
        for _ in args[1:]:
            self._done.get()

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


class Kernels:
    """One kernel family bound, plus the -j pool.  Methods take numpy arrays and validate them."""

    def __init__(self, family: str | int | None = None, threads: int = 1):
        if not isinstance(threads, int) or not 1 <= threads <= 256:
            raise InvalidArgumentError(f"threads must be an integer in 1..256, got {threads!r}")
        self.lib = load_library()
        self.family = self._choose(family)
        self.threads = threads
        self.pool = Pool(threads) if threads > 1 else None
        s = self.family
        P, N = c_void_p, c_size_t
        # void gpt2asm_matvec_f32_<isa>(const float *w, const float *x, const float *b, float *y,
        #                               size_t n_in, size_t tile_begin, size_t tile_end);
        self.matvec_f32 = self._bind(f"gpt2asm_matvec_f32_{s}", [P, P, P, P, N, N, N])
        # void gpt2asm_matvec_f16_<isa>(const uint16_t *w, const float *x, const float *b, float *y,
        #                               size_t n_in, size_t tile_begin, size_t tile_end);
        self.matvec_f16 = self._bind(f"gpt2asm_matvec_f16_{s}", [P, P, P, P, N, N, N])
        # void gpt2asm_layernorm_f32_<isa>(const float *x, const float *g, const float *b, float *y, size_t n);
        self.layernorm_f32 = self._bind(f"gpt2asm_layernorm_f32_{s}", [P, P, P, P, N])
        # void gpt2asm_gelu_f32_<isa>(const float *x, float *y, size_t n);
        self.gelu_f32 = self._bind(f"gpt2asm_gelu_f32_{s}", [P, P, N])
        # void gpt2asm_expf_f32_<isa>(const float *x, float *y, size_t n);
        self.expf_f32 = self._bind(f"gpt2asm_expf_f32_{s}", [P, P, N])
        # void gpt2asm_softmax_f32_<isa>(const float *x, float *y, size_t n);
        self.softmax_f32 = self._bind(f"gpt2asm_softmax_f32_{s}", [P, P, N])
        # void gpt2asm_attention_f32_<isa>(const float *q, const float *k, const float *v, float *out,
        #                                  float *scratch, size_t n_pos, size_t head_stride,
        #                                  size_t head_begin, size_t head_end);
        self.attention_f32 = self._bind(f"gpt2asm_attention_f32_{s}", [P, P, P, P, P, N, N, N, N])

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

    def close(self) -> None:
        if self.pool:
            self.pool.close()
            self.pool = None

    # -- parallel dispatch over prevalidated addresses ------------------------------------------------

    def run(self, fn, args: list[tuple]) -> None:
        """Run one job: args[i] for thread i (len(args) ≤ threads)."""
        if len(args) == 1 or self.pool is None:
            for a in args:
                fn(*a)
        else:
            self.pool.run(fn, args)

    def matvec_job(self, w: np.ndarray, x: int, b: int | None, y: int, n_in: int, n_tiles: int):
        """(fn, per-thread args) for y = W x + b, tiles split across the threads."""
        fn = self.matvec_f16 if w.dtype == np.float16 else self.matvec_f32
        return fn, [(addr(w), x, b, y, n_in, t0, t1) for t0, t1 in split(n_tiles, self.threads)]

    def attention_job(self, q: int, k: int, v: int, out: int, scratch: list[int], n_pos: int,
                      head_stride: int, n_head: int):
        return self.attention_f32, [(q, k, v, out, s, n_pos, head_stride, h0, h1)
                                    for (h0, h1), s in zip(split(n_head, self.threads), scratch)]

    # -- checked numpy API (tests, tools) --------------------------------------------------------------

    def matvec(self, w: np.ndarray, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """y[64*n_tiles] = W x + b for a tiled w [n_tiles][n_in][64] (float32 or float16)."""
        if not isinstance(w, np.ndarray) or w.ndim != 3 or w.shape[2] != TILE or w.shape[0] < 1 or w.shape[1] < 1:
            raise InvalidArgumentError("w: expected a tiled matrix [n_tiles][n_in][64]")
        if w.dtype not in (np.float32, np.float16):
            raise InvalidArgumentError(f"w: dtype {w.dtype}, expected float32 or float16")
        n_tiles, n_in, _ = w.shape
        check(w, "w", w.dtype, aligned=True)
        px = check(x, "x", np.float32, n_in)
        pb = None if b is None else check(b, "b", np.float32, n_tiles * TILE)
        y = np.empty(n_tiles * TILE, np.float32)
        self.run(*self.matvec_job(w, px, pb, addr(y), n_in, n_tiles))
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

    def layernorm(self, x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        px = check(x, "x", np.float32)
        if x.size < 1:
            raise InvalidArgumentError("x: needs at least one element")
        pg, pb = check(g, "g", np.float32, x.size), check(b, "b", np.float32, x.size)
        y = np.empty_like(x)
        self.layernorm_f32(px, pg, pb, addr(y), x.size)
        return y

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, n_pos: int) -> np.ndarray:
        """Attention of one query q [n_head*64] over cache k, v [n_head][n_ctx][64], positions < n_pos."""
        if not (isinstance(k, np.ndarray) and k.ndim == 3 and k.shape[2] == HEAD_DIM):
            raise InvalidArgumentError("k: expected [n_head][n_ctx][64]")
        n_head, n_ctx, _ = k.shape
        check(k, "k", np.float32)
        check(v, "v", np.float32, k.size)
        if v.shape != k.shape:
            raise InvalidArgumentError(f"v: shape {v.shape}, expected {k.shape}")
        check(q, "q", np.float32, n_head * HEAD_DIM)
        if not isinstance(n_pos, (int, np.integer)) or not 1 <= n_pos <= n_ctx:
            raise InvalidArgumentError(f"n_pos must be in 1..{n_ctx}, got {n_pos!r}")
        out = np.empty(n_head * HEAD_DIM, np.float32)
        scratch = [np.empty(-(-n_pos // 16) * 16, np.float32) for _ in range(self.threads)]
        self.run(*self.attention_job(addr(q), addr(k), addr(v), addr(out), [addr(s) for s in scratch],
                                     int(n_pos), n_ctx * HEAD_DIM, n_head))
        return out

