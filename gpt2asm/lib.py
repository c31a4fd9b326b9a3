"""Loading libgpt2asm: where it is, which architecture, and whether it was built from these sources.

    load_library() -> ctypes.CDLL     the package's library, loaded once; LibraryError if missing or stale
    bind(lib, name, argtypes, restype)  one exported symbol with its prototype set (LibraryError if absent)

A checkout (build.py and asm/<arch>/ beside the package) is checked for staleness: the library's
gpt2asm_build_id must be build.py's hash of the assembly sources ($GPT2ASM_ALLOW_STALE=1 skips it).
The kernel bindings are in kernels.py, the CPU probes in cpu.py.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import sys
from ctypes import c_char_p
from pathlib import Path

from .checkasm import open_library
from .errors import LibraryError

PKG_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PKG_DIR.parent                       # the checkout, when running from one
LIB_NAME = "libgpt2asm.dylib" if sys.platform == "darwin" else "libgpt2asm.so"
ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
    platform.machine().lower(), platform.machine())

_lib: ctypes.CDLL | None = None


def _source_hash() -> str | None:
    """Hash of the assembly sources beside the package (a checkout), or None for an installed wheel."""
    build_py = SOURCE_ROOT / "build.py"
    if not (build_py.exists() and (SOURCE_ROOT / "asm" / ARCH).is_dir()):
        return None
    spec = importlib.util.spec_from_file_location("_gpt2asm_build", build_py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.source_hash(ARCH)


def bind(lib: ctypes.CDLL, name: str, argtypes: list, restype=None):
    """The exported symbol `name` of lib with its argument and return types set."""
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise LibraryError(f"{name} is missing from the library: rebuild with `make build`") from None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


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
    build_id = bind(lib, "gpt2asm_build_id", [], c_char_p)
    want = _source_hash()
    if want is not None and build_id().decode() != want and not os.environ.get("GPT2ASM_ALLOW_STALE"):
        raise LibraryError(f"the assembly library {path} is stale (built from other sources than "
                           f"asm/{ARCH}/): {how}")
    _lib = lib
    return lib
