#!/usr/bin/env python3
"""Build the gpt2asm assembly library, and be the package's PEP 517 build backend.

As a script:    python build.py [--cc CC] [--target TRIPLE] [--out DIR] [--check]
    assembles asm/<arch>/*_*.S with the system C compiler (gcc or clang; GNU as syntax through the C
    preprocessor) and links them into gpt2asm/libgpt2asm.so (.dylib for macOS targets).  The library's
    build id is the SHA-256 of the sources, so the package can tell a stale library from a fresh one.
    --check only says whether the library is up to date (exit 1 if not).

As a backend (pyproject.toml: build-backend = "build", backend-path = ["."]):
    `pip install .` builds a wheel holding the Python package and the freshly built library;
    `pip install -e .` builds the library in place and installs a .pth file pointing at this tree.
No third-party build dependency: the wheel is written with zipfile.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PKG = ROOT / "gpt2asm"
ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


# --------------------------------------------------------------------------------------------------
# the library

def target_arch(target: str | None) -> str:
    machine = target.split("-")[0] if target else platform.machine()
    arch = ARCHES.get(machine.lower())
    if arch is None:
        raise SystemExit(f"build.py: no assembly for architecture {machine!r} (have x86_64, aarch64)")
    return arch


def is_macos(target: str | None) -> bool:
    return ("apple" in target or "darwin" in target) if target else sys.platform == "darwin"


def lib_name(target: str | None = None) -> str:
    return "libgpt2asm.dylib" if is_macos(target) else "libgpt2asm.so"


def sources(arch: str) -> list[Path]:
    """Every file of asm/<arch>/ (kernels and headers), in a fixed order."""
    d = ROOT / "asm" / arch
    return sorted(p for p in d.iterdir() if p.is_file() and p.suffix in (".S", ".h", ".inc"))


def source_hash(arch: str) -> str:
    h = hashlib.sha256()
    for p in sources(arch):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def compile_library(out_dir: Path, cc: str | None = None, target: str | None = None,
                    verbose: bool = True) -> Path:
    """Assemble and link the library into out_dir; return its path."""
    arch = target_arch(target)
    cc = cc or os.environ.get("CC") or ("clang" if target else "cc")
    units = [p for p in sources(arch) if p.suffix == ".S" and "_" in p.stem]
    flags = ["-x", "assembler-with-cpp", f"-I{ROOT / 'asm' / arch}",
             f'-DGPT2ASM_BUILD_ID="{source_hash(arch)}"']
    if target:
        flags.append(f"--target={target}")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / lib_name(target)
    with tempfile.TemporaryDirectory() as tmp:
        objs = []
        for src in units:
            obj = Path(tmp) / (src.stem + ".o")
            run([cc, *flags, "-c", str(src), "-o", str(obj)], verbose)
            objs.append(str(obj))
        link = [cc, "-shared", "-nostdlib", "-o", str(Path(tmp) / out.name), *objs]
        if target:
            link.insert(1, f"--target={target}")
        if is_macos(target):
            link += ["-Wl,-install_name,@rpath/" + out.name]
            if sys.platform != "darwin":           # cross-link on Linux: lld's Mach-O port, no SDK
                link += ["-fuse-ld=lld", "-Wl,-undefined,error", "-Wl,-platform_version,macos,14.0,14.0"]
        else:
            link += ["-Wl,-z,noexecstack", "-Wl,--no-undefined", "-Wl,-z,relro"]
        run(link, verbose)
        os.replace(Path(tmp) / out.name, out) if same_fs(tmp, out_dir) else shutil.move(
            str(Path(tmp) / out.name), str(out))
    return out


def same_fs(a, b) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def run(cmd: list[str], verbose: bool) -> None:
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    try:
        subprocess.run(cmd, check=True)
    except FileNotFoundError:
        raise SystemExit(f"build.py: compiler {cmd[0]!r} not found (set CC or install gcc/clang)")
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"build.py: command failed with status {e.returncode}: {' '.join(cmd)}")


def up_to_date(out_dir: Path = PKG) -> bool:
    """True if the library in out_dir was built from the current sources (reads its build id)."""
    import ctypes
    lib = out_dir / lib_name()
    if not lib.exists():
        return False
    try:
        so = ctypes.CDLL(str(lib))
        so.gpt2asm_build_id.restype = ctypes.c_char_p
        return so.gpt2asm_build_id().decode() == source_hash(target_arch(None))
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", help="C compiler driver used to assemble and link (default: $CC or cc)")
    ap.add_argument("--target", help="cross target triple, e.g. aarch64-linux-gnu, arm64-apple-macos14")
    ap.add_argument("--out", type=Path, default=PKG, help="output directory (default: gpt2asm/)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the library is missing or stale")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.check:
        ok = up_to_date(a.out)
        print("library up to date" if ok else "library missing or stale: run `make build`")
        return 0 if ok else 1
    out = compile_library(a.out, a.cc, a.target, verbose=not a.quiet)
    print(f"built {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------------------------------
# PEP 517 backend

def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _dist_name() -> str:
    return _project()["name"].replace("-", "_")


def _metadata() -> str:
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}", f"Requires-Python: {p.get('requires-python', '>=3.11')}"]
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {d}; extra == \"{extra}\"" for d in deps]
    readme = ROOT / "README.md"
    if readme.exists():
        lines += ["Description-Content-Type: text/markdown", "", readme.read_text()]
    return "\n".join(lines) + "\n"


def _entry_points() -> str:
    scripts = _project().get("scripts", {})
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items()) if scripts else ""


def _platform_tag() -> str:
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


class _Wheel:
    """A wheel being written: files plus the RECORD with their hashes."""

    def __init__(self, directory: str):
        p = _project()
        self.tag = f"py3-none-{_platform_tag()}"
        self.distinfo = f"{_dist_name()}-{p['version']}.dist-info"
        self.name = f"{_dist_name()}-{p['version']}-{self.tag}.whl"
        self.path = Path(directory) / self.name
        self.zf = zipfile.ZipFile(self.path, "w", zipfile.ZIP_DEFLATED)
        self.records: list[str] = []

    def add(self, arcname: str, data: bytes) -> None:
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self) -> str:
        d = self.distinfo
        self.add(f"{d}/METADATA", _metadata().encode())
        self.add(f"{d}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: gpt2asm build.py\n"
                                f"Root-Is-Purelib: false\nTag: {self.tag}\n").encode())
        ep = _entry_points()
        if ep:
            self.add(f"{d}/entry_points.txt", ep.encode())
        self.records.append(f"{d}/RECORD,,")
        self.zf.writestr(f"{d}/RECORD", "\n".join(self.records) + "\n")
        self.zf.close()
        return self.name


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_editable = get_requires_for_build_sdist = get_requires_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    w = _Wheel(wheel_directory)
    for f in sorted(PKG.glob("*.py")):
        w.add(f"gpt2asm/{f.name}", f.read_bytes())
    with tempfile.TemporaryDirectory() as tmp:
        lib = compile_library(Path(tmp))
        w.add(f"gpt2asm/{lib.name}", lib.read_bytes())
    return w.close()


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    compile_library(PKG)
    w = _Wheel(wheel_directory)
    w.add("gpt2asm_editable.pth", (str(ROOT) + "\n").encode())
    return w.close()


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    p = _project()
    base = f"{_dist_name()}-{p['version']}"
    out = Path(sdist_directory) / f"{base}.tar.gz"
    files = ["pyproject.toml", "build.py", "README.md", "Makefile"]
    with tarfile.open(out, "w:gz") as tf:
        for name in files:
            if (ROOT / name).exists():
                tf.add(ROOT / name, f"{base}/{name}")
        for d in ("asm", "gpt2asm", "docs"):
            for f in sorted((ROOT / d).rglob("*")):
                if f.is_file() and f.suffix not in (".so", ".dylib", ".pyc"):
                    tf.add(f, f"{base}/{f.relative_to(ROOT)}")
        pkg_info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        pkg_info.size = len(data)
        tf.addfile(pkg_info, io.BytesIO(data))
    return out.name


if __name__ == "__main__":
    sys.exit(main())
