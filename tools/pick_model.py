#!/usr/bin/env python3
"""The model `make run` uses: GPT-2 124M from the caches or the hub when it can be had, otherwise a
randomly initialised checkpoint (written once), with a note saying so.  Prints the directory on stdout;
everything else goes to stderr.

    python tools/pick_model.py auto                  # gpt2 (cached or downloaded), else models/random-124M
    python tools/pick_model.py DIR|NAME              # an explicit choice: printed as it is
    python tools/pick_model.py auto --fallback DIR --size tiny     # (tests)

Offline it is quick: the caches are looked at, then one attempt at the hub (huggingface_hub's own
endpoint, or $HF_ENDPOINT) with short timeouts ($HF_HUB_ETAG_TIMEOUT 5 s unless set), skipped altogether
with HF_HUB_OFFLINE=1.  A download that arrives damaged is an error, not a fallback.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TOOLS_DIR.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(TOOLS_DIR))

FALLBACK = REPO_ROOT / "models" / "random-124M"
TOKENIZER = REPO_ROOT / "models" / "tokenizer"


def pick(spec: str, fallback: Path = FALLBACK, size: str = "124M") -> Path | str:
    if spec != "auto":
        return spec
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "5")       # read when huggingface_hub is imported
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    from gpt2asm.errors import DownloadError, ModelNotFoundError
    from gpt2asm.files import DEFAULT_NAME, find_model_dir
    try:
        return find_model_dir(DEFAULT_NAME)
    except DownloadError:
        raise                                               # it arrived broken: say so, do not hide it
    except ModelNotFoundError as e:
        why = next((ln[4:].rstrip(".") for ln in str(e).splitlines() if ln.startswith("and ")), str(e))
        print(f"[gpt2asm] note: GPT-2's weights are not in the caches and cannot be downloaded ({why}); "
              f"using the randomly initialised checkpoint {fallback}", file=sys.stderr)
    if not (fallback / "model.safetensors").is_file():
        from fetch_tokenizer import ensure_tokenizer
        from make_checkpoint import make_checkpoint
        with contextlib.redirect_stdout(sys.stderr):
            tok = ensure_tokenizer(TOKENIZER)
            make_checkpoint(fallback, size=size, seed=0, tokenizer_dir=tok)
    return fallback


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="'auto', or a directory / hub name to use as it is")
    ap.add_argument("--fallback", type=Path, default=FALLBACK, help=f"the random checkpoint (default {FALLBACK})")
    ap.add_argument("--size", default="124M", help="its size when it must be written (default 124M)")
    args = ap.parse_args(argv)
    from gpt2asm.errors import GPT2AsmError
    try:
        print(pick(args.model, args.fallback, args.size))
    except GPT2AsmError as e:
        print(f"gpt2asm: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:                                  # fetching the tokenizer for the fallback failed
        print(f"gpt2asm: error: cannot write the fallback checkpoint: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
