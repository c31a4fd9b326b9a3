#!/usr/bin/env python3
"""make llamacpp: build llama.cpp's llama-bench, llama-quantize and llama-batched-bench from the PyPI
llama-cpp-python sdist, convert a checkpoint to GGUF F32/F16/Q8_0 and quantize it to Q4_0, and run
llama-bench / llama-batched-bench for tools/bench.py.

Nothing of llama.cpp is committed: everything lives under .cache/llamacpp/ (gitignored):

    .cache/llamacpp/sdist/llama_cpp_python-VER.tar.gz     pip download --no-deps --no-binary :all:
    .cache/llamacpp/src-VER/                              its vendor/llama.cpp, extracted
    .cache/llamacpp/build-VER/bin/llama-bench             cmake Release, CPU only, -DGGML_NATIVE=ON
    .cache/llamacpp/build-VER/bin/llama-quantize          Q4_0 (and Q8_0 when the converter cannot write it)
    .cache/llamacpp/build-VER/bin/llama-batched-bench     B concurrent sequences (optional: skipped if absent)
    .cache/llamacpp/gguf/NAME-HASH/model-{F32,F16,Q8_0}.gguf   convert_hf_to_gguf.py of one checkpoint
    .cache/llamacpp/gguf/NAME-HASH/model-Q4_0.gguf        llama-quantize of the F32 file (its default
                                                          choices of what stays at higher precision)

Usage:
    python tools/llamacpp.py [all]  --model DIR   build (nice -n 10, -j 2; it takes a while) and convert
    python tools/llamacpp.py build                build only
    python tools/llamacpp.py convert --model DIR  convert only (needs the `gguf` package: pip installed)
    python tools/llamacpp.py bench --model DIR [-t 1,2] [-n 128] [-p 512] [-r 3]   print llama-bench's figures
    python tools/llamacpp.py batched --model DIR [-t 1,2] [--npl 1,2,4,8,16,32]  llama-batched-bench's figures
    python tools/llamacpp.py status [--model DIR] what is built and converted

Environment: LLAMACPP_PY_VERSION (default below) picks the llama-cpp-python sdist; LLAMACPP_DIR the cache.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LLAMACPP_DIR") or ROOT / ".cache" / "llamacpp")
VERSION = os.environ.get("LLAMACPP_PY_VERSION", "0.3.36")     # the sdist this script was tried with
TYPES = ("F32", "F16", "Q8_0", "Q4_0")
QUANTIZED = ("Q4_0",)                        # made by llama-quantize from the F32 file (the converter cannot)
TARGETS = ("llama-bench", "llama-quantize")
OPTIONAL_TARGETS = ("llama-batched-bench",)  # built when this llama.cpp has it


def log(msg: str) -> None:
    print(f"[llamacpp] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw) -> None:
    log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kw)


# ------------------------------------------------------------------------------------------------
# build

def sdist_path() -> Path:
    d = CACHE / "sdist"
    have = sorted(d.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if have:
        return have[0]
    d.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"llama-cpp-python=={VERSION}", "-d", d])
    have = sorted(d.glob("llama_cpp_python-*.tar.gz"))
    if not have:
        raise SystemExit(f"pip download left no llama_cpp_python sdist in {d}")
    return have[-1]


def source_dir() -> Path:
    """vendor/llama.cpp of the sdist, extracted once (atomically: temp dir + rename)."""
    src = CACHE / f"src-{VERSION}"
    if (src / "CMakeLists.txt").is_file():
        return src
    tgz = sdist_path()
    tmp = Path(tempfile.mkdtemp(prefix=".src-", dir=CACHE))
    prefix = f"{tgz.name[:-len('.tar.gz')]}/vendor/llama.cpp/"
    log(f"extracting {prefix} from {tgz.name}")
    with tarfile.open(tgz) as tf:
        members = []
        for m in tf.getmembers():
            if m.name.startswith(prefix) and len(m.name) > len(prefix):
                m.name = m.name[len(prefix):]
                members.append(m)
        tf.extractall(tmp, members=members, filter="data")
    if not (tmp / "CMakeLists.txt").is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"{tgz}: no vendor/llama.cpp/CMakeLists.txt inside")
    shutil.rmtree(src, ignore_errors=True)
    tmp.rename(src)
    return src


def build_dir() -> Path:
    return CACHE / f"build-{VERSION}"


def binary(name: str) -> Path | None:
    p = build_dir() / "bin" / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


def build(jobs: int = 2) -> Path:
    src, bld = source_dir(), build_dir()
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    if not (bld / "CMakeCache.txt").is_file():
        run(["cmake", "-S", src, "-B", bld, *gen,
             "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
             "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF", "-DGGML_OPENCL=OFF", "-DGGML_SYCL=OFF",
             "-DGGML_HIP=OFF", "-DGGML_CCACHE=OFF", "-DGGML_BLAS=OFF",
             "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON"])
    t0 = time.time()
    run(["nice", "-n", "10", "cmake", "--build", bld, "--config", "Release", "-j", str(jobs),
         "--target", *TARGETS])
    for t in OPTIONAL_TARGETS:
        r = subprocess.run(["nice", "-n", "10", "cmake", "--build", str(bld), "--config", "Release", "-j", str(jobs),
                            "--target", t])
        if r.returncode != 0:
            log(f"{t}: not built (this llama.cpp may not have the target); tools/bench.py skips it")
    log(f"built {', '.join(TARGETS + OPTIONAL_TARGETS)} in {time.time() - t0:.0f} s")
    b = binary("llama-bench")
    if b is None:
        raise SystemExit(f"the build left no {bld}/bin/llama-bench")
    return b


# ------------------------------------------------------------------------------------------------
# conversion

def _file_id(p: Path) -> str:
    st = p.stat()
    h = hashlib.sha256(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode())
    with open(p, "rb") as f:
        h.update(f.read(1 << 20))                          # header and first tensors
    return h.hexdigest()


def gguf_dir(model: Path) -> Path:
    model = Path(model).resolve()
    tag = hashlib.sha256(str(model).encode()).hexdigest()[:10]
    return CACHE / "gguf" / f"{model.name}-{tag}"


def gguf_path(model: Path, typ: str) -> Path:
    return gguf_dir(model) / f"model-{typ}.gguf"


def _stamp(model: Path, typ: str) -> str:
    model = Path(model)
    cfg = model / "config.json"
    return json.dumps({"model": _file_id(model / "model.safetensors"),
                       "config": hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg.is_file() else None,
                       "type": typ, "llama.cpp": VERSION})


def converted(model: Path, typ: str) -> Path | None:
    """The GGUF of this checkpoint and type, if it exists and was made from the checkpoint as it is now."""
    g = gguf_path(model, typ)
    stamp = g.with_suffix(".stamp")
    try:
        if g.is_file() and stamp.read_text() == _stamp(model, typ):
            return g
    except OSError:
        pass
    return None


def _ensure_gguf_package(src: Path) -> dict:
    """The converter needs the `gguf` package: pip install the version vendored beside the converter.
    Returns extra environment for the converter (PYTHONPATH to the vendored gguf-py if pip fails)."""
    m = re.search(r'^version\s*=\s*"([^"]+)"', (src / "gguf-py" / "pyproject.toml").read_text(), re.M)
    want = m.group(1) if m else None
    probe = subprocess.run([sys.executable, "-c", "import gguf, importlib.metadata as m; print(m.version('gguf'))"],
                           capture_output=True, text=True)
    if probe.returncode == 0 and (want is None or probe.stdout.strip() == want):
        return {}
    spec = f"gguf=={want}" if want else "gguf"
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec]).returncode == 0:
        return {}
    log(f"pip install {spec} failed; using the sdist's gguf-py")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(src / "gguf-py"), os.environ.get("PYTHONPATH")]))}


_MASKS = re.compile(r"(^|\.)h\.\d+\.attn\.(bias|masked_bias)$")


def _staged(model: Path, where: Path) -> Path:
    """The checkpoint as the converter can read it. The hub's GPT-2 file carries the causal-mask buffers
    h.N.attn.bias, which this converter fails to map: write a copy without them (the other files linked)."""
    import struct
    with open(model / "model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        names = json.loads(f.read(n))
    if not any(_MASKS.search(k) for k in names):
        return model
    from safetensors.numpy import load_file, save_file
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    t = {k: v for k, v in load_file(model / "model.safetensors").items() if not _MASKS.search(k)}
    save_file(t, where / "model.safetensors", metadata={"format": "pt"})
    del t
    for p in model.iterdir():
        if p.name != "model.safetensors" and p.is_file():
            (where / p.name).symlink_to(p.resolve())
    log(f"staged {model} without its {sum(bool(_MASKS.search(k)) for k in names)} mask buffers in {where}")
    return where


def _quantize(model: Path, typ: str, out: Path) -> None:
    """llama-quantize of the checkpoint's F32 GGUF (converted first if needed) to typ, into out."""
    q = binary("llama-quantize")
    if q is None:
        raise SystemExit(f"{typ} needs llama-quantize, which is not built: run `make llamacpp`")
    f32 = converted(model, "F32") or convert(model, ("F32",))["F32"]
    run([q, f32, out, typ])


def convert(model: Path, types=TYPES) -> dict:
    """GGUF files of the checkpoint in `model` (a directory with model.safetensors, config.json and the
    tokenizer files) for each type; made only when missing or stale."""
    model = Path(model).resolve()
    if not (model / "model.safetensors").is_file() or not (model / "config.json").is_file():
        raise SystemExit(f"{model}: needs model.safetensors and config.json to convert")
    src = source_dir()
    out = {}
    env = None
    stage = gguf_dir(model) / "staged"
    staged = None
    for typ in types:
        g = converted(model, typ)
        if g is None:
            if env is None:
                env = {**os.environ, "TQDM_DISABLE": "1", **_ensure_gguf_package(src)}
                staged = _staged(model, stage)
            g = gguf_path(model, typ)
            g.parent.mkdir(parents=True, exist_ok=True)
            tmp = g.with_name(f".{g.name}.{os.getpid()}.tmp")
            stamp = _stamp(model, typ)                      # the checkpoint as the conversion starts
            t0 = time.time()
            try:
                if typ in QUANTIZED:
                    _quantize(model, typ, tmp)
                else:
                    try:
                        run([sys.executable, src / "convert_hf_to_gguf.py", staged, "--outtype", typ.lower(),
                             "--outfile", tmp], env=env, cwd=src)
                    except subprocess.CalledProcessError:
                        if typ != "Q8_0":
                            raise
                        _quantize(model, typ, tmp)             # older converters cannot write Q8_0
                os.replace(tmp, g)
            finally:
                tmp.unlink(missing_ok=True)
            g.with_suffix(".stamp").write_text(stamp)
            log(f"{g} ({g.stat().st_size / 1e6:.0f} MB) in {time.time() - t0:.0f} s")
        out[typ] = g
    shutil.rmtree(stage, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------------------
# llama-bench

def bench(model: Path, threads=(1, 2), n_gen: int = 128, n_prompt: int = 512, reps: int = 3,
          types=TYPES, timeout: float = 1800) -> list[dict] | None:
    """Run llama-bench on the converted GGUFs; None when llama-bench or the GGUFs are missing.

    Returns rows {type, threads, test: 'tg128'|'pp512', n_prompt, n_gen, tok_s, tok_s_sd, ...} for
    `-n n_gen -p 0` (decode) and, when n_prompt > 0, `-n 0 -p n_prompt` (prefill), each at every thread
    count, parsed from `-o json`."""
    b = binary("llama-bench")
    ggufs = {t: converted(model, t) for t in types}
    ggufs = {t: g for t, g in ggufs.items() if g is not None}
    if b is None or not ggufs:
        return None
    rows = []
    tests = [("-n", n_gen, "-p", 0)] + ([("-n", 0, "-p", n_prompt)] if n_prompt > 0 else [])
    for typ, g in ggufs.items():
        for test in tests:
            cmd = [str(b), "-m", str(g), *map(str, test), "-t", ",".join(map(str, threads)), "-r", str(reps),
                   "-o", "json"]
            log("$ " + " ".join(cmd))
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if p.returncode != 0:
                log(f"llama-bench failed ({p.returncode}): {p.stderr.strip()[-500:]}")
                continue
            for r in parse_json(p.stdout):
                n_p, n_g = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0))
                rows.append({"type": typ, "threads": int(r["n_threads"]),
                             "test": f"tg{n_g}" if n_g else f"pp{n_p}", "n_prompt": n_p, "n_gen": n_g,
                             "tok_s": float(r["avg_ts"]), "tok_s_sd": float(r.get("stddev_ts", 0.0)),
                             "model_size": int(r.get("model_size", 0)), "build": r.get("build_commit"),
                             "cpu": r.get("cpu_info"), "file": str(g)})
    return rows


def batched_bench(model: Path, threads=(1, 2), batches=(1, 2, 4, 8, 16, 32), n_prompt: int = 200,
                  n_gen: int = 32, types=TYPES, timeout: float = 1800) -> list[dict] | None:
    """Run llama-batched-bench on the converted GGUFs (prompts not shared: each of the B sequences its own
    n_prompt tokens, then n_gen decode steps of all B at once); None when it or the GGUFs are missing.

    Returns rows {type, threads, pl (= B), pp, tg, speed_tg (aggregate decode tok/s), speed_pp, ...} parsed
    from `--output-format jsonl`, one per B at every thread count."""
    b = binary("llama-batched-bench")
    ggufs = {t: g for t in types if (g := converted(model, t)) is not None}
    if b is None or not ggufs:
        return None
    ctx = max(batches) * (n_prompt + n_gen) + 16
    rows = []
    for typ, g in ggufs.items():
        for t in threads:
            cmd = [str(b), "-m", str(g), "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(n_prompt),
                   "-ntg", str(n_gen), "-npl", ",".join(map(str, batches)), "-t", str(t), "-tb", str(t),
                   "--output-format", "jsonl"]
            log("$ " + " ".join(cmd))
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if p.returncode != 0:
                log(f"llama-batched-bench failed ({p.returncode}): {p.stderr.strip()[-500:]}")
                continue
            for r in parse_jsonl(p.stdout):
                if "pl" in r and "speed_tg" in r:
                    rows.append({"type": typ, "threads": t, "pl": int(r["pl"]), "pp": int(r.get("pp", n_prompt)),
                                 "tg": int(r.get("tg", n_gen)), "speed_tg": float(r["speed_tg"]),
                                 "speed_pp": float(r.get("speed_pp", 0.0)), "file": str(g)})
    return rows


def parse_jsonl(text: str) -> list[dict]:
    """llama-batched-bench --output-format jsonl prints one JSON object a line (among log lines)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def parse_json(text: str) -> list[dict]:
    """llama-bench -o json prints one JSON array (possibly after log lines)."""
    i = text.find("[")
    if i < 0:
        return []
    return json.loads(text[i:])


# ------------------------------------------------------------------------------------------------

def status(model: Path | None) -> dict:
    st = {"version": VERSION, "cache": str(CACHE),
          "llama-bench": str(binary("llama-bench") or ""), "llama-quantize": str(binary("llama-quantize") or ""),
          "llama-batched-bench": str(binary("llama-batched-bench") or "")}
    if model is not None:
        st["gguf"] = {t: str(converted(model, t) or "") for t in TYPES}
    return st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", nargs="?", default="all", choices=["all", "build", "convert", "bench", "batched", "status"])
    ap.add_argument("--model", help="checkpoint directory (model.safetensors, config.json, vocab/merges)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="build jobs (default 2)")
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--npl", default="1,2,4,8,16,32", help="batched: concurrent sequences")
    a = ap.parse_args(argv)
    model = Path(a.model) if a.model else None
    if a.cmd in ("convert", "bench", "batched") and model is None:
        ap.error(f"{a.cmd} needs --model DIR")
    if a.cmd in ("all", "build"):
        print(build(a.jobs))
    if a.cmd in ("all", "convert") and model is not None:
        for t, g in convert(model).items():
            print(f"{t}: {g}")
    if a.cmd == "bench":
        rows = bench(model, [int(t) for t in a.threads.split(",")], a.n_gen, a.n_prompt, a.reps)
        if rows is None:
            print("llama-bench or the GGUF files are missing: run `make llamacpp`", file=sys.stderr)
            return 1
        print(json.dumps(rows, indent=1))
    if a.cmd == "batched":
        rows = batched_bench(model, [int(t) for t in a.threads.split(",")], [int(b) for b in a.npl.split(",")],
                             n_prompt=200, n_gen=32)
        if rows is None:
            print("llama-batched-bench or the GGUF files are missing: run `make llamacpp`", file=sys.stderr)
            return 1
        print(json.dumps(rows, indent=1))
    if a.cmd == "status":
        print(json.dumps(status(model), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
