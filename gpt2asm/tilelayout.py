"""The tile cache's layouts (gpt2asm.tilecache): for each engine dtype, what a cache file stores, what a
valid one must hold, and how a warm start assembles the Weights from it and the checkpoint.

'f32', 'f16', 'q8_0' and 'q4_0' are built in ('q8_0' / 'q4_0': q0_expected, uint8 block records
of gpt2asm.quant0 and wte, the dequantized q8_0 embedding, always stored). Another weight format registers a
Layout (register_layout): its cold loader, the arrays it stores, the arrays a valid cache must hold, how to assemble a Weights. The
generic pieces: tiled_stored stores every array field of Layer / Weights that is not read from the
checkpoint (so extra fields a format adds are carried), tiled_expected(ld, dtype, mat_dtype) gives the
tiled shapes, and tiled_assemble(..., weights_cls=, layer_cls=) rebuilds the dataclasses; the modules
named in a Layout are part of its cache key (a change to the quantiser re-quantises). A dtype without a
layout is loaded by the cold loader (a retired one: its error).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import weights as W


@dataclass(frozen=True)
class Layout:
    """How one engine dtype is cached.

    load(path, dtype) -> Weights              the cold loader (validates everything)
    stored(w) -> {name: array}                the arrays to write to the cache
    expected(ld, dtype) -> {name: (np.dtype, shape)}   arrays a valid cache must hold, exactly
    assemble(ld, dtype, arrays) -> Weights    warm: the small tensors from ld (validated), the rest mapped
    modules                                   modules whose source is part of the key
    extra_dtypes                              dtypes allowed for stored arrays beyond `expected` (arrays
                                              a newer Weights carries; still bounds-checked); () = none
    """
    dtype: str
    version: int
    load: Callable
    stored: Callable
    expected: Callable
    assemble: Callable
    modules: tuple = field(default=())
    extra_dtypes: tuple = field(default=())


LAYOUTS: dict[str, Layout] = {}


def register_layout(layout: Layout) -> None:
    LAYOUTS[layout.dtype] = layout


# Read from the checkpoint (and validated) on every start: the per-layer vectors and these top-level ones.
_VECS = {"ln1_g": "ln_1.weight", "ln1_b": "ln_1.bias", "attn_b": "attn.c_attn.bias",
         "attn_proj_b": "attn.c_proj.bias", "ln2_g": "ln_2.weight", "ln2_b": "ln_2.bias",
         "fc_b": "mlp.c_fc.bias", "proj_b": "mlp.c_proj.bias"}
_TOP_FROM_SOURCE = {"wpe", "ln_f_g", "ln_f_b", "layers"}
_NUMERIC = ("<f4", "<f2", "|i1", "|u1", "<i4")


def _wte_mappable(ld) -> bool:
    """True when load_weights uses a zero-copy view of the checkpoint's wte (F32, 64-byte aligned)."""
    name = ld.names["wte.weight"]
    return ld.st.entries[name].dtype == "F32" and ld.st.raw(name).ctypes.data % W.ALIGN == 0


def tiled_stored(w) -> dict:
    """Every array of a Weights that is not read from the checkpoint on a warm start: the tiled matrices
    (and whatever else a layout adds to Layer / Weights, e.g. per-output scales), named 'h.I.FIELD' or
    'FIELD'; wte when it is not a view of the checkpoint."""
    out = {}
    for i, L in enumerate(w.layers):
        for f in dataclasses.fields(L):
            v = getattr(L, f.name)
            if f.name not in _VECS and isinstance(v, np.ndarray):
                out[f"h.{i}.{f.name}"] = v
    for f in dataclasses.fields(w):
        v = getattr(w, f.name)
        if f.name in _TOP_FROM_SOURCE or (f.name == "wte" and w.wte_is_mapped):
            continue
        if isinstance(v, np.ndarray):
            out[f.name] = v
    return out


def _block_matrices(cfg, shape) -> dict:
    """{'h.I.attn_w' ...: shape(n_in, n_out)} for the four matrices of every block."""
    C, out = cfg.n_embd, {}
    for i in range(cfg.n_layer):
        out.update({f"h.{i}.attn_w": shape(C, 3 * C), f"h.{i}.attn_proj_w": shape(C, C),
                    f"h.{i}.fc_w": shape(C, 4 * C), f"h.{i}.proj_w": shape(4 * C, C)})
    return out


def tiled_expected(ld, dtype: str, mat_dtype=None) -> dict:
    """The matrices every tiled layout holds: [ceil(out/64)][in][64] of mat_dtype (default: the engine
    dtype's), the head, and wte (float32) when it cannot be mapped from the checkpoint."""
    cfg = ld.config
    dt = np.dtype(mat_dtype if mat_dtype is not None else W.MATRIX_DTYPES[dtype])
    C, V = cfg.n_embd, cfg.vocab_size
    out = _block_matrices(cfg, lambda n_in, n_out: (dt, (-(-n_out // W.TILE), n_in, W.TILE)))
    out["head_w"] = (dt, (-(-V // W.TILE), C, W.TILE))
    if not _wte_mappable(ld):
        out["wte"] = (np.dtype(np.float32), (V, C))
    return out


def tiled_assemble(ld, dtype: str, arrays: dict, weights_cls=None, layer_cls=None, cached_wte: bool = False):
    """What the cold loader returns, with the stored arrays mapped and every other tensor read and
    validated from the checkpoint as weights.load_weights does (vectors padded, wpe copied, a mappable
    wte viewed and checked; with cached_wte, wte is the stored one). Fields of Layer / Weights that are
    neither are left to their defaults."""
    weights_cls, layer_cls = weights_cls or W.Weights, layer_cls or W.Layer
    cfg = ld.config
    layers = []
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        kw = {f: ld.vector(p + t) for f, t in _VECS.items()}
        kw.update({k[len(p):]: v for k, v in arrays.items() if k.startswith(p)})
        layers.append(layer_cls(**kw))
    tied = "lm_head.weight" not in ld.names
    mapped = not cached_wte and _wte_mappable(ld)
    wte = W.private_copy(ld.tensor("wte.weight", f16_target=tied and dtype == "f16") if mapped else arrays["wte"])
    stored = sorted({ld.st.entries[ld.names[n]].dtype for n in ld.used})
    top = {k: v for k, v in arrays.items() if not k.startswith("h.") and k != "wte"}
    return weights_cls(
        config=cfg, dtype=dtype, wte=wte,
        wpe=W._aligned_copy(ld.tensor("wpe.weight")),
        ln_f_g=ld.vector("ln_f.weight"), ln_f_b=ld.vector("ln_f.bias"),
        head_b=None, n_vocab_padded=-(-cfg.vocab_size // W.TILE) * W.TILE,
        layers=layers, tied_head=tied, wte_is_mapped=mapped, path=ld.st.path,
        source_dtype="+".join(stored), **top)


for _dt in ("f32", "f16"):
    register_layout(Layout(_dt, 1, W.load_weights, tiled_stored, tiled_expected, tiled_assemble,
                           ("gpt2asm.tilelayout", "gpt2asm.weights"), _NUMERIC))


def q0_expected(ld, dtype: str) -> dict:
    """The q8_0 / q4_0 layouts (gpt2asm.quant0): every block matrix as uint8 records [ceil(out/64)][in/32]
    [RECORD[dtype]], the head as records of quant0.head_kind (q8_0; q6_k for q4_0), and wte: the dequantized
    head blocks, float32 [V][C]."""
    from . import quant0
    cfg = ld.config
    C, V, u8 = cfg.n_embd, cfg.vocab_size, np.dtype(np.uint8)
    out = _block_matrices(cfg, lambda n_in, n_out: (u8, quant0.tiled_shape(n_out, n_in, dtype)))
    out["head_w"] = (u8, quant0.tiled_shape(V, C, quant0.head_kind(dtype, C)))
    out["wte"] = (np.dtype(np.float32), (V, C))
    return out


def q0_assemble(ld, dtype: str, arrays: dict):
    return tiled_assemble(ld, dtype, arrays, cached_wte=True)


# ggml's blocks in the integer kernels' records; the quantizer's source is part of the key
for _dt in ("q8_0", "q4_0"):
    register_layout(Layout(_dt, 1, W.load_weights, tiled_stored, q0_expected, q0_assemble,
                           ("gpt2asm.tilelayout", "gpt2asm.weights", "gpt2asm.quant0"), _NUMERIC))
