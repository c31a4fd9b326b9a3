"""Where the model files are: --model (a directory, a .safetensors file or a hub name), $GPT2ASM_MODEL,
the current directory, then GPT-2 124M from the Hugging Face cache, gpt2asm's cache or the hub (hub.py)."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from . import hub
from .errors import CheckpointError, GPT2AsmError, InvalidArgumentError, ModelNotFoundError, shown
from .safefs import MAX_JSON, expand_user, os_error_text, read_text

NEEDED = hub.NEEDED
DEFAULT_NAME = "gpt2"
HOW_TO_GET = (
    "GPT-2's files are model.safetensors, vocab.json, merges.txt and config.json from the Hugging Face "
    "repository openai-community/gpt2; put them in one directory and pass --model DIR (or set "
    "GPT2ASM_MODEL), or pass a hub name (--model gpt2, distilgpt2, gpt2-medium, gpt2-large, gpt2-xl) to "
    "download them. Without them, `python tools/make_checkpoint.py --out models/random-124M` writes a "
    "randomly initialised GPT-2 124M with the real tokenizer (its text is gibberish).")


def missing(d: Path) -> list[str]:
    return [f for f in NEEDED if not (d / f).is_file()]


def _local(spec: str, src: str) -> Path:
    d = expand_user(spec, src)
    if d.is_file() and d.suffix == ".safetensors":
        d = d.parent
    if d.is_dir() and not missing(d):
        return d
    if d.is_dir():
        what = f"missing {', '.join(missing(d))}"
    elif d.exists():                                      # /dev/null, config.json: there, but not a directory
        what = "not a directory (pass the directory that holds the model's files)"
    else:
        what = "no such directory"
    raise ModelNotFoundError(f"no GPT-2 model in {src} {d}: {what} (looked for {', '.join(NEEDED)}).\n"
                             + HOW_TO_GET)


def find_model_dir(model: str | os.PathLike | None = None, *, download: bool = True,
                   progress: bool = True) -> Path:
    """The directory holding the model files, or ModelNotFoundError saying where we looked and what to do.

    model: a directory, a .safetensors file (its directory), or a hub name; None = $GPT2ASM_MODEL (same
    forms), else the current directory if it holds a model, else the hub model 'gpt2' (cached or
    downloaded unless download=False or offline).  A path the system refuses (too long, not permitted,
    a loop of links) is a ModelNotFoundError too, never an OSError."""
    try:
        return _find_model_dir(model, download, progress)
    except OSError as e:
        what = shown(os.fspath(model), 200) if isinstance(model, (str, os.PathLike)) else "the model"
        raise ModelNotFoundError(f"cannot use {what}: {os_error_text(e)}"
                                 + (f" ({e.filename!s:.200})" if e.filename else "")) from None


def named_spec(model) -> tuple[str, str] | None:
    """(spec, where it came from) of the model a --model / GPT2.load argument names, or $GPT2ASM_MODEL's
    when it is None; None when neither names one (the current directory, then 'gpt2', come next).  A model
    argument that is not a non-blank path or name is an InvalidArgumentError."""
    if model is not None:
        if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
            raise InvalidArgumentError(f"model must be a directory, a file or a hub name, got {shown(model)}")
        return os.fspath(model), "--model"
    env = os.environ.get("GPT2ASM_MODEL", "").strip()
    return (env, "$GPT2ASM_MODEL") if env else None


def model_label(model: str | os.PathLike | None = None) -> str:
    """A short name for the model find_model_dir(model) / GPT2.load(model) takes, without loading it: the
    last part of what named_spec names (a directory, a .safetensors or .gguf file, a hub name), else the
    current directory's name when it holds a model, else 'gpt2'."""
    try:
        named = named_spec(model)
    except InvalidArgumentError:                          # the load will say so
        return DEFAULT_NAME
    if named is None:
        try:
            cwd = Path.cwd()
            return cwd.name if cwd.name and not missing(cwd) else DEFAULT_NAME
        except OSError:
            return DEFAULT_NAME
    return os.path.basename(os.path.normpath(named[0].strip())) or DEFAULT_NAME


def _find_model_dir(model, download: bool, progress: bool) -> Path:
    named = named_spec(model)
    if named is None:
        try:
            cwd = Path.cwd()
        except OSError as e:                              # deleted under us (ENOENT), or not readable
            looked = [f"  the current directory (no --model, no $GPT2ASM_MODEL): {os_error_text(e)}"
                      + (" (it was deleted)" if e.errno == errno.ENOENT else "")]
            return hub.resolve(DEFAULT_NAME, download_ok=download, progress=progress, searched=looked)
        if not missing(cwd):
            return cwd
        looked = [f"  the current directory {cwd} (no --model, no $GPT2ASM_MODEL): "
                  f"missing {', '.join(missing(cwd))}"]
        return hub.resolve(DEFAULT_NAME, download_ok=download, progress=progress, searched=looked)
    spec, src = named
    if hub.is_hub_name(spec) and not expand_user(spec, src).exists():
        return hub.resolve(spec, download_ok=download, progress=progress)
    return _local(spec, src)


def is_random_init(d: Path) -> bool:
    """True for checkpoints written by tools/make_checkpoint.py (marked in config.json)."""
    try:                        # a regular file of bounded size only: a FIFO or /dev/zero is no marker
        return bool(json.loads(read_text(d / "config.json", MAX_JSON, CheckpointError, "config file"))
                    .get("gpt2asm_random_init"))
    except (GPT2AsmError, ValueError, AttributeError, RecursionError):
        return False
