#!/usr/bin/env python3
"""Run pytest files on the AArch64 library under qemu-user, on x86-64 Linux (make test-arm64).

    python tools/arm64/run_tests.py [--cpus "sme512 sme256 sme128 nosme"] [-j 2] [--once FILES]
                                    FILE... [-- PYTEST-ARGS]

1. cross-builds the library: build.py --target aarch64-linux-gnu -> build/aarch64-linux-gnu/ (with the
   export check);
2. stages a copy of the checkout in build/arm64-tree/ (build.py, asm/, gpt2asm/*.py, tests/, tools/;
   models/ and .cache/test-models/ link to the checkout's) with the aarch64 libgpt2asm.so beside the
   package's Python files, so kernels.load_library() loads it and the x86 library in gpt2asm/ stays;
   files are copied only when changed, so the emulated Python's .pyc files stay valid;
3. runs `tools/arm64/python -m pytest -q FILE...` in the staged tree once per CPU configuration, --jobs at
   a time, each with GPT2ASM_QEMU (the name), GPT2ASM_QEMU_CPU (the -cpu value), GPT2ASM_QEMU_SVL (bits,
   0 = no SME) and GPT2ASM_QEMU_FIRST (the first configuration's name) set; the --once files run only
   under the first configuration.  Logs: build/arm64-logs/NAME.log.

A configuration is a name from CPUS below or NAME:QEMU-CPU (e.g. "a72:cortex-a72").  The last line is the
total: "arm64: N passed, N failed, N skipped".  Needs tools/arm64/setup.sh first.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
STAGE = ROOT / "build" / "arm64-tree"
LOGS = ROOT / "build" / "arm64-logs"
TARGET = "aarch64-linux-gnu"
WRAPPER = HERE / "python"

# name -> (qemu -cpu, SVL in bits); FA64 off everywhere, as on Apple's M4
CPUS = {
    "sme512": ("max,sme512=on,sme_fa64=off", 512),
    "sme256": ("max,sme256=on,sme_fa64=off", 256),
    "sme128": ("max,sme128=on,sme_fa64=off", 128),
    "nosme": ("max,sme=off", 0),
}
COPY_FILES = ["build.py", "pyproject.toml"]
COPY_DIRS = ["asm", "gpt2asm", "tests", "tools"]
LINKS = ["models", ".cache/test-models"]          # shared with the checkout (created there if missing)
SKIP = re.compile(r"(__pycache__|\.pyc$|\.so$|\.dylib$|\.o$|^\.pytest_cache$)")


def cpu_config(spec: str) -> tuple[str, str, int]:
    if spec in CPUS:
        return (spec, *CPUS[spec])
    if ":" in spec:
        name, cpu = spec.split(":", 1)
        m = re.findall(r"(?:^|,)sme(\d+)=on", cpu)
        return name, cpu, (0 if "sme=off" in cpu or not m else max(map(int, m)))
    raise SystemExit(f"run_tests.py: unknown CPU configuration {spec!r} (have {', '.join(CPUS)}, or NAME:CPU)")


# --------------------------------------------------------------------------------------------------
# build and stage

def build_library() -> Path:
    r = subprocess.run([sys.executable, str(ROOT / "build.py"), "--target", TARGET, "-q"],
                       capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode:
        raise SystemExit("run_tests.py: the aarch64 build failed (see above)")
    return ROOT / "build" / TARGET / "libgpt2asm.so"


def sync_file(src: Path, dst: Path) -> bool:
    """Copy src to dst (keeping its mtime) unless dst already has the same size, mtime and bytes."""
    if dst.is_file() and not dst.is_symlink():
        s, d = src.stat(), dst.stat()
        if s.st_size == d.st_size and int(s.st_mtime) == int(d.st_mtime) and src.read_bytes() == dst.read_bytes():
            return False
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    return True


def sync_dir(src: Path, dst: Path) -> int:
    """Mirror src into dst (skipping caches and built libraries); remove what src no longer has."""
    changed = 0
    want = set()
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if any(SKIP.search(part) for part in rel.parts) or not p.is_file():
            continue
        want.add(rel)
        changed += sync_file(p, dst / rel)
    if dst.exists():
        for p in sorted(dst.rglob("*"), reverse=True):
            rel = p.relative_to(dst)
            if any(SKIP.search(part) for part in rel.parts):
                continue
            if p.is_file() and rel not in want:
                p.unlink()
                changed += 1
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    return changed


def stage(lib: Path) -> int:
    STAGE.mkdir(parents=True, exist_ok=True)
    changed = sum(sync_file(ROOT / f, STAGE / f) for f in COPY_FILES if (ROOT / f).exists())
    changed += sum(sync_dir(ROOT / d, STAGE / d) for d in COPY_DIRS)
    for link in LINKS:
        target, at = ROOT / link, STAGE / link
        target.mkdir(parents=True, exist_ok=True)
        if not (at.is_symlink() and at.resolve() == target.resolve()):
            at.parent.mkdir(parents=True, exist_ok=True)
            if at.is_symlink() or at.is_file():
                at.unlink()
            elif at.is_dir():
                shutil.rmtree(at)
            at.symlink_to(target)
    changed += sync_file(lib, STAGE / "gpt2asm" / lib.name)
    return changed


# --------------------------------------------------------------------------------------------------
# run

SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")


def run_config(name: str, cpu: str, svl: int, first: str, files: list[str], extra: list[str],
               timeout: float) -> dict:
    env = dict(os.environ, GPT2ASM_QEMU=name, GPT2ASM_QEMU_CPU=cpu, GPT2ASM_QEMU_SVL=str(svl),
               GPT2ASM_QEMU_FIRST=first)
    cmd = [str(WRAPPER), "-m", "pytest", "-q", "-p", "no:cacheprovider", *files, *extra]
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}.log"
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=STAGE, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        out, rc = r.stdout, r.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += f"\nTIMEOUT after {timeout:.0f} s\n"
        rc = 124
    log.write_text(f"$ GPT2ASM_QEMU_CPU={cpu} {' '.join(cmd)}\n{out}")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    tail = [line for line in out.splitlines() if line.strip()][-1:] or [""]
    for n, kind in SUMMARY.findall(tail[0]):
        if kind in counts:
            counts[kind] += int(n)
        elif kind.startswith("error"):
            counts["failed"] += int(n)
    if rc not in (0, 5) and counts["failed"] == 0:     # crashed, timed out, or usage error
        counts["failed"] = 1
    if rc == 5:                                          # no tests collected: nothing ran
        counts["failed"] += 1
        out += "\n(no tests collected)\n"
    return dict(name=name, cpu=cpu, rc=rc, out=out, secs=time.monotonic() - t0, **counts)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="test files, relative to the checkout (default: "
                    "tests/test_arm_smoke.py)")
    ap.add_argument("--cpus", default="sme512 sme256 sme128 nosme",
                    help="CPU configurations, space-separated; the first also runs the --once files")
    ap.add_argument("--once", nargs="*", default=[], help="test files run only under the first configuration")
    ap.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per configuration (default 1800)")
    ap.add_argument("--no-build", action="store_true", help="use the library already in build/" + TARGET)
    a = ap.parse_args(argv)
    files = a.files or ([] if a.once else ["tests/test_arm_smoke.py"])
    once = [f for f in a.once if f]
    for f in files + once:
        if not (ROOT / f.split("::")[0]).exists():
            raise SystemExit(f"run_tests.py: no such test file {f}")
    if WRAPPER.exists() and not os.access(WRAPPER, os.X_OK):     # sys.executable of the guest: must run
        WRAPPER.chmod(0o755)
    if not WRAPPER.exists() or subprocess.run([str(WRAPPER), "-c", "pass"], capture_output=True).returncode:
        raise SystemExit("run_tests.py: the emulated Python is not set up: run tools/arm64/setup.sh")

    t0 = time.monotonic()
    lib = ROOT / "build" / TARGET / "libgpt2asm.so" if a.no_build else build_library()
    n = stage(lib)
    print(f"[arm64] staged {STAGE.relative_to(ROOT)} ({n} files updated); library {lib.relative_to(ROOT)}",
          flush=True)
    configs = [cpu_config(s) for s in a.cpus.split()]
    if not configs:
        raise SystemExit("run_tests.py: no CPU configuration")
    first = configs[0][0]
    jobs = [(name, cpu, svl, first, files + (once if name == first else []), extra, a.timeout)
            for name, cpu, svl in configs]
    jobs = [j for j in jobs if j[4]]
    results = []
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = [pool.submit(run_config, *j) for j in jobs]
        for fut in futures:                             # report in configuration order
            r = fut.result()
            results.append(r)
            status = "ok" if r["rc"] == 0 else f"FAILED (exit {r['rc']})"
            print(f"[arm64] {r['name']} (-cpu {r['cpu']}): {status} in {r['secs']:.0f} s", flush=True)
            body = r["out"].rstrip()
            if r["rc"] != 0:
                lines = body.splitlines()
                if len(lines) > 400:
                    print(f"    ... {len(lines) - 400} lines before these in {LOGS.relative_to(ROOT)}/{r['name']}.log")
                print("\n".join(lines[-400:]))
            else:
                print("\n".join("    " + line for line in body.splitlines()[-1:]))
    total = {k: sum(r[k] for r in results) for k in ("passed", "failed", "skipped")}
    print(f"[arm64] {len(results)} configurations in {time.monotonic() - t0:.0f} s; logs in "
          f"{LOGS.relative_to(ROOT)}/")
    print(f"arm64: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
