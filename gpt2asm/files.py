"""Where the model files are: --model, $GPT2ASM_MODEL, the current directory."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import ModelNotFoundError

NEEDED = ("model.safetensors", "vocab.json", "merges.txt")
HOW_TO_GET = (
    "GPT-2's files are model.safetensors, vocab.json, merges.txt and config.json from the Hugging Face "
    "repository openai-community/gpt2; put them in one directory and pass --model DIR (or set "
    "GPT2ASM_MODEL). Without them, `python tools/make_checkpoint.py --out models/random-124M` writes a "
    "randomly initialised GPT-2 124M with the real tokenizer (its text is gibberish).")


def missing(d: Path) -> list[str]:
    return [f for f in NEEDED if not (d / f).is_file()]


def find_model_dir(model: str | os.PathLike | None = None) -> Path:
    """The directory holding the model files, or ModelNotFoundError saying where we looked."""
    if model is not None:
        places = [Path(model)]
    elif os.environ.get("GPT2ASM_MODEL"):
        places = [Path(os.environ["GPT2ASM_MODEL"])]
    else:
        places = [Path.cwd()]
    for d in places:
        if d.is_file() and d.suffix == ".safetensors":
            d = d.parent
        if d.is_dir() and not missing(d):
            return d
    lines = [f"  {d}: missing {', '.join(missing(d)) if d.is_dir() else 'the directory itself'}"
             for d in places]
    src = ("--model" if model is not None else
           "$GPT2ASM_MODEL" if os.environ.get("GPT2ASM_MODEL") else "the current directory (no --model, no $GPT2ASM_MODEL)")
    raise ModelNotFoundError(f"no GPT-2 model found in {src}; looked for {', '.join(NEEDED)}:\n"
                             + "\n".join(lines) + "\n" + HOW_TO_GET)


def is_random_init(d: Path) -> bool:
    """True for checkpoints written by tools/make_checkpoint.py (marked in config.json)."""
    try:
        return bool(json.loads((d / "config.json").read_text()).get("gpt2asm_random_init"))
    except (OSError, ValueError, AttributeError):
        return False
