"""GPT-2 hyper-parameters: read from config.json or inferred from tensor shapes, and validated.

Only the five numbers the engine needs are kept. Everything GPT-2 fixes (MLP width 4*n_embd, GELU with
the tanh approximation, LayerNorm epsilon 1e-5, attention scaled by 1/sqrt(head_dim)) is checked when a
config.json states it, so a checkpoint of a different architecture is refused instead of computed wrongly.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError, shown
from .safefs import MAX_JSON, read_text

HEAD_DIM = 64            # the attention kernel is written for head_dim == 64 (true of every GPT-2 size)
MAX_VOCAB = 1 << 20
MAX_CTX = 1 << 16
MAX_LAYER = 1 << 12      # far above GPT-2 xl's 48: bounds the work done before the shapes are checked
MAX_EMBD = 1 << 16

# config.json key -> our field; the first key present wins (n_positions is the wpe size; n_ctx is its
# legacy twin in old GPT-2 configs).
_KEYS = {
    "n_layer": ("n_layer", "num_hidden_layers"),
    "n_embd": ("n_embd", "hidden_size"),
    "n_head": ("n_head", "num_attention_heads"),
    "n_ctx": ("n_positions", "max_position_embeddings", "n_ctx"),
    "vocab_size": ("vocab_size",),
}

_GELU_TANH = {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"}  # all the tanh approximation GPT-2 uses
_BLOCK_RE = re.compile(r"^(?:transformer\.)?h\.(\d{1,9})\.")   # longer numbers are no block of ours


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int      # number of transformer blocks
    n_embd: int       # model width C
    n_head: int       # attention heads; head_dim = n_embd // n_head must be 64
    n_ctx: int        # positions (rows of wpe)
    vocab_size: int   # V (rows of wte)
    tie_word_embeddings: bool = True   # config.json's: false = the file must hold its own lm_head.weight

    def __post_init__(self):
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        """Raise CheckpointError unless the engine can run this configuration."""
        for name in ("n_layer", "n_embd", "n_head", "n_ctx", "vocab_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise CheckpointError(f"config: {name} must be an integer, got {shown(v)}")
            if v <= 0:
                raise CheckpointError(f"config: {name} must be positive, got {v}")
        if self.n_embd % self.n_head:
            raise CheckpointError(
                f"config: n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.head_dim != HEAD_DIM:
            raise CheckpointError(
                f"config: head_dim = n_embd/n_head = {self.n_embd}/{self.n_head} = {self.head_dim}, but the "
                f"attention kernel is written for head_dim {HEAD_DIM} (as in every GPT-2 size)")
        if self.n_embd % 16:
            raise CheckpointError(f"config: n_embd={self.n_embd} must be a multiple of 16")
        if self.n_layer > MAX_LAYER:
            raise CheckpointError(f"config: n_layer={self.n_layer} exceeds the limit {MAX_LAYER}")
        if self.n_embd > MAX_EMBD:
            raise CheckpointError(f"config: n_embd={self.n_embd} exceeds the limit {MAX_EMBD}")
        if self.vocab_size > MAX_VOCAB:
            raise CheckpointError(f"config: vocab_size={self.vocab_size} exceeds the limit {MAX_VOCAB}")
        if self.n_ctx > MAX_CTX:
            raise CheckpointError(f"config: n_ctx={self.n_ctx} exceeds the limit {MAX_CTX}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise CheckpointError(f"config: tie_word_embeddings must be true or false, got "
                                  f"{shown(self.tie_word_embeddings)}")

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> "GPT2Config":
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(d).__name__}")
        _check_architecture(d, source)
        values, missing = {}, []
        for field, keys in _KEYS.items():
            key = next((k for k in keys if d.get(k) is not None), None)
            if key is None:
                missing.append("/".join(keys))
            else:
                values[field] = d[key]
        if missing:
            raise CheckpointError(f"{source}: missing field(s): {', '.join(missing)}")
        if d.get("tie_word_embeddings") is not None:
            values["tie_word_embeddings"] = d["tie_word_embeddings"]
        try:
            return cls(**values)
        except CheckpointError as e:
            raise CheckpointError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path) -> "GPT2Config":
        path = Path(path)
        text = read_text(path, MAX_JSON, CheckpointError, "config file")   # regular file, size cap
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as e:        # JSONDecodeError, huge integers, deep nesting
            raise CheckpointError(f"{path}: not valid JSON: {type(e).__name__}: {e}") from None
        return cls.from_dict(d, source=str(path))


def _check_architecture(d: dict, source: str) -> None:
    """Refuse configs that describe something other than plain GPT-2 maths."""
    problems = []
    mt = d.get("model_type")
    if mt is not None and mt != "gpt2":
        problems.append(f"model_type is {shown(mt)}, not 'gpt2'")
    act = d.get("activation_function")
    if act is not None and not (isinstance(act, str) and act in _GELU_TANH):
        problems.append(f"activation_function {shown(act)} is not supported (GPT-2 uses 'gelu_new')")
    eps = d.get("layer_norm_epsilon")
    if eps is not None and not _is_eps(eps):
        problems.append(f"layer_norm_epsilon {shown(eps)} is not supported (the engine uses 1e-5)")
    n_inner, n_embd = d.get("n_inner"), d.get("n_embd", d.get("hidden_size"))
    if n_inner is not None and n_inner != (4 * n_embd if isinstance(n_embd, int) else None):
        problems.append(f"n_inner {shown(n_inner)} is not supported (the MLP must be 4*n_embd wide)")
    if d.get("scale_attn_by_inverse_layer_idx"):
        problems.append("scale_attn_by_inverse_layer_idx=true is not supported")
    saw = d.get("scale_attn_weights", True)
    if saw is not True:                 # false, 0, null: unscaled attention (older transformers took any falsy value)
        problems.append(f"scale_attn_weights {shown(saw)} is not supported (attention is scaled by 1/sqrt(64))")
    if d.get("add_cross_attention"):
        problems.append("add_cross_attention=true is not supported")
    arch = d.get("architectures")
    if arch is not None and not (isinstance(arch, list) and arch
                                 and all(isinstance(a, str) and a.startswith("GPT2") for a in arch)):
        problems.append(f"architectures {shown(arch)} is not GPT-2's (GPT2LMHeadModel)")
    for keys in _KEYS.values():                           # two names of one size that disagree (transformers'
        given = {k: d[k] for k in keys if k != "n_ctx" and d.get(k) is not None}   # aliases; it ignores n_ctx)
        if len({repr(v) for v in given.values()}) > 1:
            problems.append(" and ".join(f"{k}={shown(v)}" for k, v in given.items()) + " disagree")
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))


def _is_eps(v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isclose(float(v), 1e-5, rel_tol=1e-6)
    except OverflowError:                                   # an integer too large for a float
        return False


def infer_config(shapes: dict) -> GPT2Config:
    """Infer the configuration from {tensor name: shape}; names may carry the 'transformer.' prefix.

    n_layer = number of h.N blocks (must be 0..n-1), vocab_size and n_embd from wte, n_ctx from wpe.
    n_head is not visible in any shape: it is taken as n_embd // 64 (head_dim 64 holds for all GPT-2s).
    """
    def get(name):
        for key in (name, "transformer." + name):
            if key in shapes:
                return tuple(int(s) for s in shapes[key])
        raise CheckpointError(f"cannot infer the config: tensor {name!r} is missing")

    wte, wpe = get("wte.weight"), get("wpe.weight")
    if len(wte) != 2 or len(wpe) != 2:
        raise CheckpointError(f"cannot infer the config: wte.weight {wte} and wpe.weight {wpe} must be 2-D")
    if wte[1] != wpe[1]:
        raise CheckpointError(f"cannot infer the config: wte.weight {wte} and wpe.weight {wpe} disagree on width")
    blocks = set()
    for name in shapes:
        m = _BLOCK_RE.match(name)
        if m:
            blocks.add(int(m.group(1)))
    if not blocks:
        raise CheckpointError("cannot infer the config: no transformer blocks (h.N.*) in the checkpoint")
    n_layer = max(blocks) + 1
    if len(blocks) != n_layer:
        gaps = sorted(set(range(n_layer)) - blocks)[:5]
        raise CheckpointError(f"cannot infer the config: blocks are not numbered 0..{n_layer - 1} "
                              f"(missing e.g. h.{gaps[0]})")
    vocab_size, n_embd = wte
    if n_embd % HEAD_DIM:
        raise CheckpointError(
            f"cannot infer n_head for n_embd={n_embd} (not a multiple of {HEAD_DIM}); a config.json is needed")
    return GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_embd // HEAD_DIM,
                      n_ctx=wpe[0], vocab_size=vocab_size)
