#!/usr/bin/env python3
"""Build the gpt2asm assembly library, and be the package's PEP 517 build backend.

As a script:    python build.py [--cc CC] [--target TRIPLE] [--out DIR] [--check | --check-exports [--strict]]
    assembles asm/<arch>/*_*.S with the system C compiler (gcc or clang; GNU as syntax through the C
    preprocessor) and links them into gpt2asm/libgpt2asm.so (.dylib for macOS targets).  The library's
    build id is the SHA-256 of the sources, so the package can tell a stale library from a fresh one.
    --check only says whether the library is up to date (exit 1 if not).
    $GPT2ASM_ASFLAGS: extra assembler flags for experiments, e.g. GPT2ASM_ASFLAGS='-DATT_PF=0' (kernel
    knobs; the build id stays the sources' hash, so such a library is not told apart from a plain one).
    Cross builds (from x86-64 Linux, with clang and lld; Debian: apt-get install clang-19 lld-19 llvm-19):
        --target aarch64-linux-gnu       -> build/aarch64-linux-gnu/libgpt2asm.so
        --target arm64-apple-macos14     -> build/arm64-apple-macos14/libgpt2asm.dylib (ld64.lld, no SDK)
    A cross build never writes into gpt2asm/ unless --out says so.  On AArch64 (native or cross) the
    compiler defaults to the first of clang-19, clang-20, clang, cc found (SME2 needs clang >= 17).
    After a build, and with --check-exports alone, every symbol the Python side binds (bound_symbols())
    is checked to be exported (llvm-nm/nm): a kernel family the library has must be complete; --strict
    requires every family of the architecture.

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


def is_cross(target: str | None) -> bool:
    """True if target names another architecture or OS than this machine's."""
    if not target:
        return False
    host_arch = ARCHES.get(platform.machine().lower(), platform.machine())
    return target_arch(target) != host_arch or is_macos(target) != (sys.platform == "darwin")


def default_out(target: str | None) -> Path:
    """gpt2asm/ for a native build; build/<target>/ for a cross build (never the package's library)."""
    return ROOT / "build" / target if is_cross(target) else PKG


def default_cc(target: str | None) -> str:
    """$CC, else: AArch64 -> the first clang that can assemble SME2 (clang-19 ...), x86-64 -> cc/clang."""
    if os.environ.get("CC"):
        return os.environ["CC"]
    if target_arch(target) == "aarch64":
        names = ["clang-19", "clang-20", "clang-21", "clang-22", "clang-18", "clang-17", "clang"]
        if not is_cross(target):
            names.append("cc")
        for name in names:
            if shutil.which(name):
                return name
        return names[0]
    return "clang" if target else "cc"


# --------------------------------------------------------------------------------------------------
# the exported symbols the Python side binds (one list for build.py, the tests and gpt2asm/kernels.py)

KERNEL_OPS = ("matvec_f32", "matvec_f16", "layernorm_f32", "gelu_f32", "expf_f32", "softmax_f32",
              "attention_f32", "argmax_f32")
# family -> the ops it implements, per architecture, best family last (the -s order).  sme2 has only the
# f32 / f16 matrix-vector products (and the matmul kernels, EXTRA_OPS); a kernel set using sme2 takes every
# other op from neon (FAMILY_FALLBACK).
FAMILY_OPS = {
    "x86_64": {"avx2": KERNEL_OPS, "avx512": KERNEL_OPS},
    "aarch64": {"neon": KERNEL_OPS, "sme2": ("matvec_f32", "matvec_f16")},
}
FAMILY_FALLBACK = {"sme2": "neon"}
# single ops one family takes from another (gpt2asm.kernels.SHARED_OPS): avx2's binary16-cache attention
SHARED_OPS = {("avx512", "attention_f16"): "avx2"}
# exported kernels not bound by name through bound_symbols() (the plan executor and the tests call them):
# check_exports requires them of a family like its FAMILY_OPS.  sme2 has its own matmul_* and falls back
# to neon's attention_f16 (kernel_symbol, FAMILY_FALLBACK): neon's entry makes the export check cover it; avx512 takes attention_f16 from avx2 (SHARED_OPS), whose entry covers it; each x86 plan
# executor calls its own family's attention_rows_* (ROWATTN).
# Every family has its plan executor, decode-step and worker entries (plan_x86.S, plan_aarch64.S: "plan_run",
# "plan_step", "worker").
EXTRA_OPS = {
    "x86_64": {"avx2": ("matmul_f32", "matmul_f16", "attention_f16", "attention_rows_f32", "attention_rows_f16",
                        "plan_run", "plan_step", "worker"),
               "avx512": ("matmul_f32", "matmul_f16", "attention_rows_f32", "attention_rows_f16",
                          "plan_run", "plan_step", "worker")},
    "aarch64": {"neon": ("matmul_f32", "matmul_f16", "attention_f16", "plan_run", "plan_step", "worker"),
                "sme2": ("matmul_f32", "matmul_f16", "plan_run", "plan_step", "worker")},
}
# the q8_0 / q4_0 / q6_k integer kernels (docs/kernels.md "q8_0 / q4_0", "q6_k"): per family, op -> its ISA variants, each exported as
# gpt2asm_<op>_<variant> (Python picks the best variant the CPU has: gpt2asm.kernels.q0_variant on x86, gpt2asm.cpu.q0_isa on Arm).
# check_exports requires every variant of a family like its FAMILY_OPS.
VARIANT_OPS = {
    "x86_64": {"avx2": {"quantize_q8_0": ("avx2",),
                        **{f"{op}_{k}": ("avx2", "avxvnni") for op in ("matvec", "matmul") for k in ("q8_0", "q4_0")},
                        "matvec_q6_k": ("avx2",), "matmul_q6_k": ("avx2",)},
               "avx512": {"quantize_q8_0": ("avx512",),
                          **{f"matvec_{k}": ("avx512", "avx512vnni", "avx512vnni_zen4") for k in ("q8_0", "q4_0")},
                          **{f"matmul_{k}": ("avx512", "avx512vnni") for k in ("q8_0", "q4_0")},
                          "matvec_q6_k": ("avx512vnni", "avx512vnni_zen4"), "matmul_q6_k": ("avx512vnni",),
                          # not q0: the float matmuls' Zen 4 variants (gpt2asm.kernels.matmul_variant)
                          "matmul_f32": ("avx512_zen4",), "matmul_f16": ("avx512_zen4",)}},
    "aarch64": {"neon": {"quantize_q8_0": ("neon",), "matvec_q8_0": ("neon", "dotprod"),
                         "matvec_q4_0": ("neon", "dotprod"), "matmul_q8_0": ("neon", "dotprod", "i8mm"),
                         "matmul_q4_0": ("neon", "dotprod", "i8mm"),
                         "matvec_q6_k": ("neon",), "matmul_q6_k": ("neon",)},
                # the q6_k head: the sme2 family calls neon's kernels (outside streaming mode)
                "sme2": {**{op: ("sme2",) for op in ("matvec_q8_0", "matvec_q4_0", "matmul_q8_0", "matmul_q4_0")},
                         "matvec_q6_k": ("neon",), "matmul_q6_k": ("neon",)}},
}


def variant_symbols(arch: str, family: str) -> list[str]:
    """The exported q8_0 / q4_0 kernel variants of a family (VARIANT_OPS)."""
    return [f"gpt2asm_{op}_{v}" for op, vs in VARIANT_OPS[arch].get(family, {}).items() for v in vs]


# bound by gpt2asm/lib.py and gpt2asm/cpu.py whatever the family (gpt2asm_plan_abi, the table of
# asm/plan_abi.h: by tests/test_plan_abi.py)
COMMON_SYMBOLS = {
    "x86_64": ("gpt2asm_build_id", "gpt2asm_cpuid", "gpt2asm_xgetbv", "gpt2asm_plan_abi"),
    "aarch64": ("gpt2asm_build_id", "gpt2asm_rdsvl", "gpt2asm_plan_abi"),
}
# bound by tools/ (bench)
TOOL_SYMBOLS = {"x86_64": ("gpt2asm_readbw_f32_avx2", "gpt2asm_fmapeak_f32_avx2", "gpt2asm_fmapeak_f32_avx512"),
                "aarch64": ("gpt2asm_readbw_f32_neon", "gpt2asm_fmapeak_f32_neon")}
# test symbols: the clobber check's trampoline and state (gpt2asm/checkasm.py) and its self-tests
# (tests/test_checkasm.py); asm/<arch>/checkasm_*.S.  Required by the export check, not in bound_symbols().
TEST_SYMBOLS = {
    "x86_64": ("gpt2asm_checked_call", "gpt2asm_checked_state", "gpt2asm_checkasm_args", "gpt2asm_checkasm_clobber",
               "gpt2asm_checkasm_clobber_rsp", "gpt2asm_checkasm_clobber_df", "gpt2asm_checkasm_clobber_mxcsr",
               "gpt2asm_checkasm_clobber_vzeroupper"),
    "aarch64": ("gpt2asm_checked_call", "gpt2asm_checked_state", "gpt2asm_checkasm_args", "gpt2asm_checkasm_clobber",
                "gpt2asm_checkasm_clobber_sp", "gpt2asm_checkasm_clobber_fpcr", "gpt2asm_checkasm_clobber_sm"),
}


def kernel_symbol(op: str, family: str) -> str:
    """The symbol that implements op for family: gpt2asm_<op>_<family>, or the fallback family's."""
    if (family, op) in SHARED_OPS:
        return kernel_symbol(op, SHARED_OPS[family, op])
    for arch, arch_families in FAMILY_OPS.items():
        if family in arch_families:
            if op in arch_families[family] or op in EXTRA_OPS[arch].get(family, ()):
                return f"gpt2asm_{op}_{family}"
            if family in FAMILY_FALLBACK:
                return kernel_symbol(op, FAMILY_FALLBACK[family])
    raise KeyError(f"no kernel {op!r} for family {family!r}")


def bound_symbols(arch: str, family: str | None = None) -> list[str]:
    """Symbols the Python side binds on arch: the common ones plus one family's (or every family's)."""
    fams = FAMILY_OPS[arch] if family is None else {family: FAMILY_OPS[arch][family]}
    out = list(COMMON_SYMBOLS[arch]) + list(TOOL_SYMBOLS[arch])
    for fam, ops in fams.items():
        out += [f"gpt2asm_{op}_{fam}" for op in ops]
    return out


def nm_tool(macho: bool) -> str | None:
    names = ["llvm-nm-19", "llvm-nm-20", "llvm-nm-21", "llvm-nm-18", "llvm-nm"]
    if not macho or sys.platform == "darwin":          # GNU nm reads ELF; Apple's nm is llvm-nm
        names.append("nm")
    return next((n for n in names if shutil.which(n)), None)


def exported_symbols(lib: Path) -> set[str]:
    """Defined, external (dynamic) symbols of a .so or .dylib, without Mach-O's leading underscore."""
    macho = lib.suffix == ".dylib"
    tool = nm_tool(macho)
    if tool is None:
        raise FileNotFoundError("no llvm-nm or nm found (Debian: apt-get install llvm-19)")
    cmd = [tool, "--extern-only", "--defined-only"] + ([] if macho else ["--dynamic"]) + [str(lib)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    names = set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-2] not in ("U", "w", "v"):
            name = parts[-1]
            names.add(name[1:] if macho and name.startswith("_") else name)
    return names


def check_exports(lib: Path, arch: str, strict: bool = False) -> list[str]:
    """Problems with lib's exports ([] if none): a missing common symbol, an incomplete family (every
    family with strict=True, else only those the library has at least one symbol of)."""
    have = exported_symbols(lib)
    problems = [f"{s} is not exported" for s in COMMON_SYMBOLS[arch] + TOOL_SYMBOLS[arch] + TEST_SYMBOLS[arch]
                if s not in have]
    for fam in FAMILY_OPS[arch]:
        want = bound_symbols(arch, fam)[len(COMMON_SYMBOLS[arch]) + len(TOOL_SYMBOLS[arch]):]
        want += [f"gpt2asm_{op}_{fam}" for op in EXTRA_OPS[arch].get(fam, ())]
        want += variant_symbols(arch, fam)
        missing = [s for s in want if s not in have]
        if missing and (strict or len(missing) < len(want)):
            problems.append(f"family {fam}: {len(missing)} of {len(want)} symbols missing: {', '.join(missing)}")
    return problems


def report_exports(lib: Path, arch: str, strict: bool = False) -> bool:
    """Print a one-line summary (and the problems) to stderr; True if all is well."""
    try:
        problems = check_exports(lib, arch, strict)
    except FileNotFoundError as e:
        print(f"build.py: export check skipped: {e}", file=sys.stderr)
        return not strict
    have = exported_symbols(lib)
    fams = [f"{fam} {sum(s in have for s in syms)}/{len(syms)}"
            for fam, syms in ((f, [f"gpt2asm_{op}_{f}" for op in o + EXTRA_OPS[arch].get(f, ())]
                               + variant_symbols(arch, f)) for f, o in FAMILY_OPS[arch].items())]
    print(f"exports of {lib.name} ({arch}): common {len(COMMON_SYMBOLS[arch])}, test {len(TEST_SYMBOLS[arch])} ok"
          if not problems else f"exports of {lib.name} ({arch}): PROBLEMS", end="", file=sys.stderr)
    print(f"; families: {', '.join(fams)}", file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    return not problems


def lib_name(target: str | None = None) -> str:
    return "libgpt2asm.dylib" if is_macos(target) else "libgpt2asm.so"


def sources(arch: str) -> list[Path]:
    """Every file of asm/<arch>/ (kernels and headers), then the shared headers of asm/ (plan_abi.h), in
    a fixed order."""
    d = ROOT / "asm" / arch
    return (sorted(p for p in d.iterdir() if p.is_file() and p.suffix in (".S", ".h", ".inc"))
            + sorted(p for p in (ROOT / "asm").iterdir() if p.is_file() and p.suffix == ".h"))


def source_hash(arch: str) -> str:
    h = hashlib.sha256()
    for p in sources(arch):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def compile_library(out_dir: Path, cc: str | None = None, target: str | None = None,
                    verbose: bool = True) -> Path:
    """Assemble and link the library into out_dir; return its path."""
    arch = target_arch(target)
    cc = cc or default_cc(target)
    units = [p for p in sources(arch) if p.suffix == ".S" and "_" in p.stem]
    flags = ["-x", "assembler-with-cpp", f"-I{ROOT / 'asm' / arch}", f"-I{ROOT / 'asm'}",
             f'-DGPT2ASM_BUILD_ID="{source_hash(arch)}"', *os.environ.get("GPT2ASM_ASFLAGS", "").split()]
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
            if is_cross(target):                    # the host's GNU ld links no foreign ELF
                link += ["-fuse-ld=lld"]
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
    ap.add_argument("--out", type=Path, help="output directory (default: gpt2asm/; build/TARGET/ for a "
                    "cross target)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the library is missing or stale")
    ap.add_argument("--check-exports", action="store_true", help="only check that the library in the "
                    "output directory exports every symbol the Python side binds (exit 1 if not)")
    ap.add_argument("--strict", action="store_true", help="with the export check: require every kernel "
                    "family of the architecture, not only those the library has")
    ap.add_argument("--list-symbols", action="store_true", help="print the symbols the Python side binds "
                    "for the target's architecture, one a line")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    out_dir = a.out if a.out is not None else default_out(a.target)
    arch = target_arch(a.target)
    if a.list_symbols:
        print("\n".join(bound_symbols(arch) + list(TEST_SYMBOLS[arch])))
        return 0
    if a.check:
        ok = up_to_date(out_dir)
        print("library up to date" if ok else "library missing or stale: run `make build`")
        return 0 if ok else 1
    if a.check_exports:
        lib = out_dir / lib_name(a.target)
        if not lib.exists():
            print(f"build.py: {lib} does not exist", file=sys.stderr)
            return 1
        return 0 if report_exports(lib, arch, a.strict) else 1
    out = compile_library(out_dir, a.cc, a.target, verbose=not a.quiet)
    print(f"built {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}", file=sys.stderr)
    return 0 if report_exports(out, arch, a.strict) else 1


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
    # the plan ABI the library was built with, for gpt2asm/plan_abi.py (a checkout reads asm/plan_abi.h)
    w.add("gpt2asm/plan_abi.h", (ROOT / "asm" / "plan_abi.h").read_bytes())
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
