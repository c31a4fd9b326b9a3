#!/usr/bin/env python3
"""Check a cross-linked macOS arm64 libgpt2asm.dylib without a Mac: arm64 Mach-O dylib, its install name
@rpath/libgpt2asm.dylib, LC_BUILD_VERSION macOS >= 14.0, an (ad-hoc) code signature (arm64 macOS loads
no unsigned code), and every symbol the Python side binds exported (build.py's export check).

    python tools/arm64/check_macho.py build/arm64-apple-macos14/libgpt2asm.dylib [--strict]
"""
from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
import build  # noqa: E402

MH_MAGIC_64, CPU_TYPE_ARM64, MH_DYLIB = 0xFEEDFACF, 0x0100000C, 6
LC_ID_DYLIB, LC_CODE_SIGNATURE, LC_BUILD_VERSION, PLATFORM_MACOS = 0xD, 0x1D, 0x32, 1


def load_commands(data: bytes):
    magic, cputype, _, filetype, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
    cmds, off = [], 32
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, off)
        cmds.append((cmd, data[off:off + size]))
        off += size
    return magic, cputype, filetype, cmds


def check(path: Path, strict: bool = False) -> list[str]:
    data = path.read_bytes()
    magic, cputype, filetype, cmds = load_commands(data)
    problems = []
    if (magic, cputype, filetype) != (MH_MAGIC_64, CPU_TYPE_ARM64, MH_DYLIB):
        return [f"not an arm64 Mach-O dylib (magic {magic:#x}, cputype {cputype:#x}, filetype {filetype})"]
    kinds = {c for c, _ in cmds}
    ids = [body for c, body in cmds if c == LC_ID_DYLIB]
    if not ids:
        problems.append("no LC_ID_DYLIB")
    else:
        name_off = struct.unpack_from("<I", ids[0], 8)[0]
        name = ids[0][name_off:].split(b"\0", 1)[0].decode()
        if name != "@rpath/libgpt2asm.dylib":
            problems.append(f"install name {name!r}, expected '@rpath/libgpt2asm.dylib'")
    bv = [body for c, body in cmds if c == LC_BUILD_VERSION]
    if not bv:
        problems.append("no LC_BUILD_VERSION")
    else:
        platform, minos = struct.unpack_from("<II", bv[0], 8)
        if platform != PLATFORM_MACOS or minos < 14 << 16:
            problems.append(f"LC_BUILD_VERSION platform {platform}, minos {minos >> 16}.{minos >> 8 & 255}")
    if LC_CODE_SIGNATURE not in kinds:
        problems.append("no LC_CODE_SIGNATURE: arm64 macOS refuses unsigned code")
    # dyld's view of the exports: the export trie, when llvm-objdump is there
    tool = next((t for t in ("llvm-objdump-19", "llvm-objdump") if shutil.which(t)), None)
    if tool:
        out = subprocess.run([tool, "--macho", "--exports-trie", str(path)], capture_output=True, text=True)
        trie = {line.split()[-1].lstrip("_") for line in out.stdout.splitlines() if line.startswith("0x")}
        missing = [s for s in build.COMMON_SYMBOLS["aarch64"] if s not in trie]
        if missing:
            problems.append(f"not in the export trie: {', '.join(missing)}")
    problems += build.check_exports(path, "aarch64", strict)
    return problems


def main(argv: list[str]) -> int:
    strict = "--strict" in argv
    paths = [Path(a) for a in argv if a != "--strict"] or [ROOT / "build" / "arm64-apple-macos14" /
                                                             "libgpt2asm.dylib"]
    bad = 0
    for p in paths:
        problems = check(p, strict)
        for msg in problems:
            print(f"{p}: {msg}", file=sys.stderr)
        if not problems:
            print(f"{p.name}: arm64 Mach-O dylib, @rpath install name, macOS 14.0, signed, exports ok")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
