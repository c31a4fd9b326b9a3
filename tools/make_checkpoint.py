#!/usr/bin/env python3
"""Write a randomly initialised GPT-2 checkpoint (numpy + safetensors, no torch).

Real weights cannot be downloaded here, so this produces a checkpoint in the real Hugging Face layout
that the engine (and transformers' GPT2LMHeadModel.from_pretrained) can load:

    OUT/model.safetensors   the tensors (written atomically: temp file + rename)
    OUT/config.json         as GPT2Config.save_pretrained writes it
    OUT/generation_config.json
    OUT/vocab.json, OUT/merges.txt   copied from the tokenizer directory when available

Layouts:
    hf   what save_pretrained writes: 'transformer.h.0.attn.c_attn.weight', 'transformer.wte.weight', ...;
         no 'lm_head.weight' (tied to wte).
    hub  the hub's gpt2 file: bare names 'h.0.attn.c_attn.weight', 'wte.weight', ..., plus the
         'h.N.attn.bias' causal-mask buffers ([1,1,n_ctx,n_ctx] float32, lower-triangular ones) that
         loaders must ignore.

Initialisation as GPT-2 (weights normal(0, 0.02); attn/mlp c_proj weights normal(0, 0.02/sqrt(2*n_layer)))
except that biases are normal(0, 0.02), LayerNorm weights 1+normal(0, 0.1) and LayerNorm biases
normal(0, 0.05), so that an engine ignoring a bias or a scale gives visibly wrong results.
Deterministic for a given seed, and the same values for both layouts and both stored dtypes.

Usage: python tools/make_checkpoint.py --out DIR [--size 124M|distil|medium|large|xl|tiny]
           [--n-layer N] [--n-embd N] [--n-head N] [--n-ctx N] [--vocab N] [--seed N]
           [--layout hf|hub] [--dtype f32|f16] [--tokenizer DIR | --no-tokenizer]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np

TOOLS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TOOLS_DIR.parent
DEFAULT_TOKENIZER_DIR = REPO_ROOT / "models" / "tokenizer"
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from gpt2asm.errors import GPT2AsmError, InvalidArgumentError  # noqa: E402

# name -> (n_layer, n_embd, n_head)
SIZES = {
    "124M": (12, 768, 12),
    "distil": (6, 768, 12),
    "medium": (24, 1024, 16),
    "large": (36, 1280, 20),
    "xl": (48, 1600, 25),
    "tiny": (2, 128, 2),
}
DEFAULT_N_CTX = 1024
DEFAULT_VOCAB = 50257
EOT = 50256
_OVERRIDE_KEYS = {"n_layer", "n_embd", "n_head", "n_ctx", "vocab", "vocab_size"}
_DTYPES = {"f32": np.float32, "f16": np.float16}
_TORCH_DTYPE = {"f32": "float32", "f16": "float16"}


def _dims(size: str, overrides: dict) -> dict:
    if size not in SIZES:
        raise InvalidArgumentError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    unknown = set(overrides) - _OVERRIDE_KEYS
    if unknown:
        raise InvalidArgumentError(f"unknown override(s): {', '.join(sorted(unknown))}")
    n_layer, n_embd, n_head = SIZES[size]
    d = {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_ctx": DEFAULT_N_CTX,
         "vocab": DEFAULT_VOCAB}
    for k, v in overrides.items():
        if v is not None:
            d["vocab" if k == "vocab_size" else k] = v
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise InvalidArgumentError(f"{k} must be a positive integer, got {v!r}")
        d[k] = int(v)
    if d["n_embd"] % d["n_head"]:
        raise InvalidArgumentError(f"n_embd={d['n_embd']} is not divisible by n_head={d['n_head']}")
    return d


def random_tensors(n_layer: int, n_embd: int, n_ctx: int, vocab: int, seed: int = 0) -> dict:
    """Bare-named float32 tensors in HF Conv1D layout ([in][out]), generated in a fixed order."""
    rng = np.random.default_rng(seed)
    C = n_embd

    def normal(shape, std, mean=0.0):
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= np.float32(std)
        if mean:
            a += np.float32(mean)
        return a

    proj_std = 0.02 / math.sqrt(2 * n_layer)
    t = {
        "wte.weight": normal((vocab, C), 0.02),          # [V][C]
        "wpe.weight": normal((n_ctx, C), 0.02),          # [n_ctx][C]
    }
    for i in range(n_layer):
        p = f"h.{i}."
        t[p + "ln_1.weight"] = normal((C,), 0.1, 1.0)            # [C]
        t[p + "ln_1.bias"] = normal((C,), 0.05)                  # [C]
        t[p + "attn.c_attn.weight"] = normal((C, 3 * C), 0.02)   # [C][3C]
        t[p + "attn.c_attn.bias"] = normal((3 * C,), 0.02)       # [3C]
        t[p + "attn.c_proj.weight"] = normal((C, C), proj_std)   # [C][C]
        t[p + "attn.c_proj.bias"] = normal((C,), 0.02)           # [C]
        t[p + "ln_2.weight"] = normal((C,), 0.1, 1.0)            # [C]
        t[p + "ln_2.bias"] = normal((C,), 0.05)                  # [C]
        t[p + "mlp.c_fc.weight"] = normal((C, 4 * C), 0.02)      # [C][4C]
        t[p + "mlp.c_fc.bias"] = normal((4 * C,), 0.02)          # [4C]
        t[p + "mlp.c_proj.weight"] = normal((4 * C, C), proj_std)  # [4C][C]
        t[p + "mlp.c_proj.bias"] = normal((C,), 0.02)            # [C]
    t["ln_f.weight"] = normal((C,), 0.1, 1.0)                    # [C]
    t["ln_f.bias"] = normal((C,), 0.05)                          # [C]
    return t


def config_dict(n_layer: int, n_embd: int, n_head: int, n_ctx: int, vocab: int, dtype: str = "f32") -> dict:
    """config.json as transformers' GPT2Config.save_pretrained writes it (keys sorted), plus the
    'gpt2asm_random_init' marker (transformers keeps unknown keys as plain attributes)."""
    return {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": EOT,
        "embd_pdrop": 0.1,
        "eos_token_id": EOT,
        "gpt2asm_random_init": True,    # marks random weights (gpt2asm.files.is_random_init)
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_ctx": n_ctx,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_inner": None,
        "n_layer": n_layer,
        "n_positions": n_ctx,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.1,
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
        "summary_activation": None,
        "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True,
        "summary_type": "cls_index",
        "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "tie_word_embeddings": True,
        "torch_dtype": _TORCH_DTYPE[dtype],
        "use_cache": True,
        "vocab_size": vocab,
    }


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # the usual permissions, whatever the writer created
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def _write_json(path: Path, obj: dict) -> None:
    _write_atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n",
                                               encoding="utf-8"))


def _tokenizer_source(tokenizer_dir) -> Path | None:
    """The directory whose vocab.json + merges.txt the checkpoint gets, or None for no tokenizer.

    tokenizer_dir None: the default models/tokenizer (fetched with tools/fetch_tokenizer.py's
    ensure_tokenizer() if missing; skipped with a warning if that fails). False or '': skip.
    An explicit directory must hold both files.
    """
    names = ("vocab.json", "merges.txt")
    if tokenizer_dir is False or tokenizer_dir == "":
        return None
    if tokenizer_dir is None:
        src = DEFAULT_TOKENIZER_DIR
        if not all((src / n).is_file() for n in names):
            fetch = TOOLS_DIR / "fetch_tokenizer.py"
            try:
                if not fetch.is_file():
                    raise FileNotFoundError(f"{fetch} not found")
                spec = importlib.util.spec_from_file_location("fetch_tokenizer", fetch)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                mod.ensure_tokenizer(src)
            except Exception as e:  # best effort: the checkpoint is useful without a tokenizer too
                print(f"warning: no tokenizer copied ({type(e).__name__}: {e})", file=sys.stderr)
                return None
        return src
    src = Path(tokenizer_dir)
    missing = [n for n in names if not (src / n).is_file()]
    if missing:
        raise InvalidArgumentError(f"tokenizer directory {src} lacks {', '.join(missing)}")
    return src


def _copy_tokenizer(out: Path, src: Path | None) -> bool:
    """Copy vocab.json + merges.txt from src into out. Returns True if copied (src None: nothing)."""
    if src is None:
        return False
    if src.resolve() == out.resolve():
        return True
    for n in ("vocab.json", "merges.txt"):
        _write_atomic(out / n, lambda p, n=n: shutil.copyfile(src / n, p))
    return True


def _check_loadable(d: dict, tok_src: Path | None) -> None:
    """Refuse (InvalidArgumentError) what gpt2asm would refuse to load, before anything is written: the
    loader's own rules -- GPT2Config.validate (head_dim = n_embd / n_head must be 64, n_embd a multiple of
    16, the size limits) always, and GPT2's tokenizer checks (no more tokens than vocab, <|endoftext|>'s id
    below it) when the checkpoint carries a tokenizer.  Without one (--no-tokenizer) any vocab is
    fine: the weights load alone (gpt2asm.weights.load_weights), e.g. small-vocabulary test checkpoints."""
    from gpt2asm.config import GPT2Config
    from gpt2asm.errors import CheckpointError, TokenizerError
    from gpt2asm.tokenizer import check_fits
    try:
        GPT2Config(d["n_layer"], d["n_embd"], d["n_head"], d["n_ctx"], d["vocab"])
    except CheckpointError as e:
        raise InvalidArgumentError(f"gpt2asm could not load this checkpoint: {e}") from None
    if tok_src is None:
        return
    try:
        vocab = json.loads((tok_src / "vocab.json").read_bytes())
    except (OSError, ValueError):
        return                                # not readable as JSON: the loader names that problem itself
    if not isinstance(vocab, dict):
        return
    eot = vocab.get("<|endoftext|>")
    if not isinstance(eot, int) or isinstance(eot, bool):
        eot = -1                              # none: the loader names that problem itself
    try:
        check_fits(len(vocab), eot, d["vocab"])
    except TokenizerError as e:
        raise InvalidArgumentError(f"vocab={d['vocab']} with the tokenizer in {tok_src}: {e}, which gpt2asm "
                                   f"refuses to load: give a vocab of at least {max(len(vocab), eot + 1)}, or no "
                                   f"tokenizer (--no-tokenizer)") from None


def make_checkpoint(out_dir, size: str = "124M", seed: int = 0, layout: str = "hf", dtype: str = "f32",
                    tokenizer_dir=None, **overrides) -> Path:
    """Write a random GPT-2 checkpoint into out_dir and return its path.

    overrides: n_layer, n_embd, n_head, n_ctx, vocab (or vocab_size).
    tokenizer_dir: directory with vocab.json + merges.txt; None = models/tokenizer (fetched if needed,
    skipped with a warning if impossible); False or '' = no tokenizer.
    """
    from safetensors.numpy import save_file

    if layout not in ("hf", "hub"):
        raise InvalidArgumentError(f"layout must be 'hf' or 'hub', got {layout!r}")
    if dtype not in _DTYPES:
        raise InvalidArgumentError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidArgumentError(f"seed must be a non-negative integer, got {seed!r}")
    d = _dims(size, overrides)
    tok_src = _tokenizer_source(tokenizer_dir)
    _check_loadable(d, tok_src)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tensors = random_tensors(d["n_layer"], d["n_embd"], d["n_ctx"], d["vocab"], seed=int(seed))
    if dtype != "f32":
        tensors = {k: v.astype(_DTYPES[dtype]) for k, v in tensors.items()}
    if layout == "hf":
        tensors = {"transformer." + k: v for k, v in tensors.items()}
    else:
        n = d["n_ctx"]
        mask = np.tril(np.ones((n, n), dtype=np.float32)).reshape(1, 1, n, n)   # [1][1][n_ctx][n_ctx]
        for i in range(d["n_layer"]):
            tensors[f"h.{i}.attn.bias"] = mask   # the same buffer each time: safetensors copies on write

    _write_atomic(out / "model.safetensors", lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    _write_json(out / "config.json",
                config_dict(d["n_layer"], d["n_embd"], d["n_head"], d["n_ctx"], d["vocab"], dtype))
    _write_json(out / "generation_config.json", {"bos_token_id": EOT, "eos_token_id": EOT})
    has_tok = _copy_tokenizer(out, tok_src)

    n_params = sum(v.size for k, v in tensors.items() if not k.endswith("attn.bias"))
    print(f"wrote RANDOM (untrained) GPT-2 weights to {out}: {size} n_layer={d['n_layer']} "
          f"n_embd={d['n_embd']} n_head={d['n_head']} n_ctx={d['n_ctx']} vocab={d['vocab']}, "
          f"{n_params / 1e6:.1f}M parameters, layout {layout}, {dtype}, seed {seed}"
          f"{'' if has_tok else ', no tokenizer'} -- the weights are random, output will be gibberish")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write a randomly initialised GPT-2 checkpoint (HF layout).")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--size", default="124M", choices=list(SIZES))
    ap.add_argument("--n-layer", type=int)
    ap.add_argument("--n-embd", type=int)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--n-ctx", type=int, help=f"positions (default {DEFAULT_N_CTX})")
    ap.add_argument("--vocab", type=int, help=f"vocabulary size (default {DEFAULT_VOCAB})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layout", choices=("hf", "hub"), default="hf")
    ap.add_argument("--dtype", choices=tuple(_DTYPES), default="f32", help="stored dtype")
    tok = ap.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", metavar="DIR",
                     help=f"copy vocab.json and merges.txt from DIR (default: {DEFAULT_TOKENIZER_DIR})")
    tok.add_argument("--no-tokenizer", action="store_true", help="do not copy a tokenizer")
    a = ap.parse_args(argv)
    try:
        make_checkpoint(a.out, size=a.size, seed=a.seed, layout=a.layout, dtype=a.dtype,
                        tokenizer_dir=False if a.no_tokenizer else a.tokenizer,
                        n_layer=a.n_layer, n_embd=a.n_embd, n_head=a.n_head, n_ctx=a.n_ctx, vocab=a.vocab)
    except (GPT2AsmError, OSError) as e:                 # a bad argument or file: one line, status 2
        print(f"make_checkpoint.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
