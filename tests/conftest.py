"""Shared fixtures: a fresh library, the real tokenizer files, random-init checkpoints (cached)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "test-models"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The clobber check (gpt2asm/checkasm.py, docs/kernels.md gpt2asm_checked_call): every call into the library
# that a test makes -- the kernel tests' own bindings and gpt2asm.kernels' -- goes through the checkasm
# trampoline and fails with ClobberError if it broke a callee-saved register, the stack pointer or the FP
# control state.  On for the whole session (before any test module loads the library); GPT2ASM_CHECKASM=0
# turns it off.
os.environ.setdefault("GPT2ASM_CHECKASM", "1")


def pytest_sessionstart(session):
    """Build the library once if it is missing or stale, before any test imports it.  Tile caches of the
    test checkpoints go to a per-run folder, not the user's ~/.cache."""
    if "GPT2ASM_CACHE" not in os.environ:
        os.environ["GPT2ASM_CACHE"] = tempfile.mkdtemp(prefix="gpt2asm-test-cache-")
        session.config._gpt2asm_cache = os.environ["GPT2ASM_CACHE"]
    if subprocess.run([sys.executable, str(ROOT / "build.py"), "--check"], capture_output=True).returncode:
        subprocess.run([sys.executable, str(ROOT / "build.py"), "-q"], check=True)


def pytest_sessionfinish(session, exitstatus):
    """Remove the per-run tile cache (several GB: every test checkpoint x dtype)."""
    d = getattr(session.config, "_gpt2asm_cache", None)
    if d:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    from fetch_tokenizer import ensure_tokenizer
    return Path(ensure_tokenizer(ROOT / "models" / "tokenizer"))


def checkpoint(name: str, tokenizer_dir: Path, **kw) -> Path:
    """A random-init checkpoint under .cache/test-models/NAME, rewritten only when its recipe changes."""
    from make_checkpoint import make_checkpoint
    d = CACHE / name
    recipe = json.dumps(kw, sort_keys=True)
    stamp = d / "recipe.json"
    if not (stamp.exists() and stamp.read_text() == recipe and (d / "model.safetensors").exists()):
        make_checkpoint(d, tokenizer_dir=tokenizer_dir, **kw)
        stamp.write_text(recipe)
    return d


@pytest.fixture(scope="session")
def ckpt_tiny(tokenizer_dir) -> Path:
    """2 layers, 128 wide, 2 heads, real vocabulary; save_pretrained layout."""
    return checkpoint("tiny-hf", tokenizer_dir, size="tiny", seed=1, layout="hf")


@pytest.fixture(scope="session")
def ckpt_w256(tokenizer_dir) -> Path:
    """2 layers, 256 wide (a multiple of Q6_K's 256: q4_0 models get the q6_k head), 4 heads, real
    vocabulary; save_pretrained layout."""
    return checkpoint("w256-hf", tokenizer_dir, size="tiny", n_embd=256, n_head=4, seed=4, layout="hf")


@pytest.fixture(scope="session")
def ckpt_124m(tokenizer_dir) -> Path:
    """The full GPT-2 124M shape, random weights; the hub's bare-name layout with mask buffers."""
    return checkpoint("124M-hub", tokenizer_dir, size="124M", seed=2, layout="hub")


@pytest.fixture(scope="session")
def families() -> list[str]:
    from gpt2asm.cpu import available_families
    return available_families()
