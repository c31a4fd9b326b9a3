"""GGUF in: a GPT-2 GGUF written by llama.cpp's converter (convert_hf_to_gguf.py) or quantizer (llama-quantize),
read with the `gguf` package's GGUFReader (llama.cpp's own reader), laid out as weights.load_weights does.

    from gpt2asm.ggufload import GGUFModel, load_gguf_weights
    w = load_gguf_weights("gpt2-Q8_0.gguf")            # dtype None: the file's own (here q8_0)
    tok = GGUFModel("gpt2-Q8_0.gguf").tokenizer()       # from tokenizer.ggml.tokens / merges

The file (names as llama.cpp's MODEL_TENSORS[GPT2]; shapes in numpy order, i.e. ggml's ne reversed):

    token_embd.weight [V][C]     position_embd.weight [n_ctx][C]     output.weight [V][C] (optional)
    blk.N.attn_norm.{weight,bias} [C]        blk.N.attn_qkv.weight [3C][C]   .bias [3C]
    blk.N.attn_output.weight [C][C]  .bias [C]      blk.N.ffn_norm.{weight,bias} [C]
    blk.N.ffn_up.weight [4C][C]  .bias [4C]        blk.N.ffn_down.weight [C][4C]  .bias [C]
    output_norm.{weight,bias} [C]

(the converter transposes HF's Conv1D weights, so every matrix is [out][in]); metadata general.architecture
= "gpt2", gpt2.block_count / context_length / embedding_length / attention.head_count (and, when present,
feed_forward_length = 4C, attention.layer_norm_epsilon = 1e-5).  A file without output.weight (what the
converter of llama.cpp 0.3.36 writes) has the head tied to token_embd; older converters wrote a copy of
token_embd.weight as output.weight (then tied_head is True too); a different output.weight is the head.

Tensor types: F32, F16, BF16, Q8_0 and Q4_0 anywhere; Q6_K (what llama-quantize gives GPT-2's output /
tied embedding in a Q4_0 model) for token_embd / output only.  Anything else is a CheckpointError.

The run dtype (None = the file's: the type of its block matrices, F32 -> f32, F16 -> f16, Q8_0 -> q8_0,
Q4_0 -> q4_0) decides the engine's arrays, and each tensor is used as follows:
  - a tensor stored in the run dtype's own form is used as stored: F16 matrices for f16 as they are, and
    Q8_0 / Q4_0 blocks for q8_0 / q4_0 repacked losslessly into quant0's records (no requantization), so a
    GGUF Q8_0 of a checkpoint gives exactly the ints and scales --dtype q8_0 of that checkpoint gives;
  - any other tensor is first dequantized to float32 as ggml does (F16 / BF16 widened exactly; Q8_0 / Q4_0
    e = float32(q) * float32(d); Q6_K by gguf.quants) and then converted like a checkpoint's float32 tensor
    (f16: rounded to nearest even, beyond float16's range an error; q8 / q8_0 / q4_0: quantized).
  - q8_0 / q4_0 runs: the head is q8_0 (quant0.HEAD_KIND): output.weight's (else token_embd's) Q8_0 blocks
    as stored, anything else quantized to q8_0; the lookup rows (wte) are token_embd dequantized when it is
    Q8_0 / Q4_0, else token_embd quantized to q8_0 and dequantized (as from a checkpoint).
Vectors (norms, biases) and the position embedding are dequantized to float32.

A GGUF is never tile-cached (every load repacks it; see README).  Every problem -- not a GGUF, another
architecture, truncated or damaged, missing or unexpected tensors, wrong shapes, unsupported types,
non-finite values -- is a CheckpointError (TokenizerError for the tokenizer's metadata).
"""
from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path

import numpy as np

from . import quant0
from .config import GPT2Config
from .errors import CheckpointError, GPT2AsmError, InvalidArgumentError, ModelNotFoundError, TokenizerError
from .weights import (F16_OVERFLOW, MATRIX_DTYPES, Q0_DTYPES, TILE, Layer, Weights, _aligned_copy, pad_vector,
                      tile_head, tile_matrix)

MAGIC = b"GGUF"
ARCH = "gpt2"
_BLOCK_RE = re.compile(r"^blk\.(\d{1,9})\.")
# GGUF type name -> the run dtype whose form it is
_NATIVE = {"F32": "f32", "F16": "f16", "Q8_0": "q8_0", "Q4_0": "q4_0"}
_FLOAT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0")
_EMBD_ONLY_TYPES = ("Q6_K",)
_LN_EPS = 1e-5


def is_gguf(path) -> bool:
    """True for a path named *.gguf or a regular file that starts with the GGUF magic."""
    try:
        p = Path(path).expanduser()
    except TypeError:
        return False
    if p.suffix.lower() == ".gguf":
        return True
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size < 4:
            return False
        with open(p, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def _matrix_names(i: int) -> dict:
    """Layer field -> (GGUF name, (out, in) as multiples of C)."""
    p = f"blk.{i}."
    return {"attn_w": (p + "attn_qkv.weight", (3, 1)), "attn_proj_w": (p + "attn_output.weight", (1, 1)),
            "fc_w": (p + "ffn_up.weight", (4, 1)), "proj_w": (p + "ffn_down.weight", (1, 4))}


def _vector_names(i: int) -> dict:
    """Layer field -> (GGUF name, length as a multiple of C)."""
    p = f"blk.{i}."
    return {"ln1_g": (p + "attn_norm.weight", 1), "ln1_b": (p + "attn_norm.bias", 1),
            "attn_b": (p + "attn_qkv.bias", 3), "attn_proj_b": (p + "attn_output.bias", 1),
            "ln2_g": (p + "ffn_norm.weight", 1), "ln2_b": (p + "ffn_norm.bias", 1),
            "fc_b": (p + "ffn_up.bias", 4), "proj_b": (p + "ffn_down.bias", 1)}


def _short(v, limit: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


class GGUFModel:
    """A validated GPT-2 GGUF: .config (GPT2Config), .types {name: GGUF type name}, tensor access."""

    def __init__(self, path):
        self.path = p = Path(path).expanduser()
        try:
            st = p.stat()
        except FileNotFoundError:
            raise ModelNotFoundError(f"{p}: file not found") from None
        except OSError as e:
            raise CheckpointError(f"{p}: cannot read the file: {e}") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{p}: not a regular file")
        if st.st_size < 24:
            raise CheckpointError(f"{p}: file is {st.st_size} bytes, too short for a GGUF header (truncated?)")
        with open(p, "rb") as f:
            if f.read(4) != MAGIC:
                raise CheckpointError(f"{p}: not a GGUF file (no GGUF magic)")
        try:
            from gguf import GGUFReader
        except ImportError as e:                           # a dependency: pip install gguf
            raise CheckpointError(f"{p}: reading GGUF needs the `gguf` package (pip install gguf): {e}") from None
        try:
            with np.errstate(all="ignore"):
                self.reader = GGUFReader(p, "r")
        except GPT2AsmError:
            raise
        except Exception as e:                             # any damage: ValueError, KeyError, IndexError...
            raise CheckpointError(f"{p}: damaged or truncated GGUF ({type(e).__name__}: "
                                  f"{_short(str(e), 200)})") from None
        if getattr(self.reader, "byte_order", "I") != "I":
            raise CheckpointError(f"{p}: a big-endian GGUF; only little-endian files are supported")
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.types = {n: t.tensor_type.name for n, t in self.tensors.items()}
        self.config = self._config()
        self._check_tensors()

    # -- metadata ----------------------------------------------------------------------------------

    def field(self, key: str, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            return default
        try:
            return f.contents()
        except Exception as e:                             # e.g. a string that is not UTF-8
            raise CheckpointError(f"{self.path}: metadata {key!r} is damaged ({type(e).__name__})") from None

    def _int(self, key: str) -> int:
        v = self.field(key)
        if v is None:
            raise CheckpointError(f"{self.path}: metadata {key!r} is missing")
        if isinstance(v, bool) or not isinstance(v, int):
            raise CheckpointError(f"{self.path}: metadata {key!r} must be an integer, got {_short(v)}")
        return v

    def _config(self) -> GPT2Config:
        arch = self.field("general.architecture")
        if arch != ARCH:
            raise CheckpointError(f"{self.path}: general.architecture is {_short(arch)}, not {ARCH!r}: "
                                  f"only GPT-2 GGUFs can be run")
        n_layer, n_ctx = self._int("gpt2.block_count"), self._int("gpt2.context_length")
        n_embd, n_head = self._int("gpt2.embedding_length"), self._int("gpt2.attention.head_count")
        ff = self.field("gpt2.feed_forward_length")
        if ff is not None and ff != 4 * n_embd:
            raise CheckpointError(f"{self.path}: gpt2.feed_forward_length is {_short(ff)}, GPT-2's is "
                                  f"4 * {n_embd}")
        eps = self.field("gpt2.attention.layer_norm_epsilon")
        if eps is not None and (not isinstance(eps, float) or not math.isclose(eps, _LN_EPS, rel_tol=1e-6)):
            raise CheckpointError(f"{self.path}: gpt2.attention.layer_norm_epsilon is {_short(eps)}; the "
                                  f"LayerNorm kernel uses GPT-2's {_LN_EPS}")
        te = self.tensors.get("token_embd.weight")
        if te is None:
            raise CheckpointError(f"{self.path}: missing tensor token_embd.weight")
        if len(te.shape) != 2:
            raise CheckpointError(f"{self.path}: token_embd.weight has {len(te.shape)} dimensions, expected 2")
        try:
            return GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_ctx=n_ctx,
                              vocab_size=int(te.shape[1]))
        except CheckpointError as e:
            raise CheckpointError(f"{self.path}: {e}") from None

    # -- tensors -----------------------------------------------------------------------------------

    def _expected(self) -> dict:
        """GGUF name -> numpy shape of every tensor (output.weight optional)."""
        c = self.config
        C, V = c.n_embd, c.vocab_size
        out = {"token_embd.weight": (V, C), "position_embd.weight": (c.n_ctx, C),
               "output_norm.weight": (C,), "output_norm.bias": (C,)}
        for i in range(c.n_layer):
            out.update({n: (o * C, k * C) for n, (o, k) in _matrix_names(i).values()})
            out.update({n: (k * C,) for n, k in _vector_names(i).values()})
        return out

    def _check_tensors(self) -> None:
        c, where = self.config, self.path
        want = self._expected()
        blocks = {int(m.group(1)) for n in self.tensors if (m := _BLOCK_RE.match(n))}
        if blocks and max(blocks) >= c.n_layer:
            raise CheckpointError(f"{where}: gpt2.block_count is {c.n_layer} but the file has blocks up to "
                                  f"blk.{max(blocks)}")
        missing = [n for n in want if n not in self.tensors]
        if missing:
            raise CheckpointError(f"{where}: missing tensor(s): {', '.join(missing[:5])}")
        if "output.weight" in self.tensors:
            want["output.weight"] = want["token_embd.weight"]
        unknown = sorted(set(self.tensors) - set(want))
        if unknown:
            raise CheckpointError(f"{where}: unexpected tensor(s), not part of GPT-2: "
                                  f"{', '.join(_short(n, 60) for n in unknown[:5])}")
        for n, shape in want.items():
            t = self.tensors[n]
            got = tuple(int(x) for x in reversed(t.shape.tolist()))
            if got != shape:
                raise CheckpointError(f"{where}: tensor {n} is {list(got)}, expected {list(shape)} for "
                                      f"n_layer={c.n_layer} n_embd={c.n_embd} n_ctx={c.n_ctx} vocab={c.vocab_size}")
            ok = _FLOAT_TYPES + (_EMBD_ONLY_TYPES if n in ("token_embd.weight", "output.weight") else ())
            if self.types[n] not in ok:
                raise CheckpointError(f"{where}: tensor {n} has type {self.types[n]}; supported: "
                                      f"{', '.join(_FLOAT_TYPES)} (and Q6_K for token_embd / output)")
            if t.data.nbytes != t.n_bytes:
                raise CheckpointError(f"{where}: tensor {n}: {t.data.nbytes} of {t.n_bytes} bytes (truncated?)")
        self.used = list(want)

    def file_dtype(self) -> str:
        """The run dtype the file is made for: the type of its block matrices (the most common one)."""
        kinds = [self.types[n] for i in range(self.config.n_layer) for n, _ in _matrix_names(i).values()]
        top = max(set(kinds), key=kinds.count)
        return {"BF16": "f32"}.get(top, _NATIVE.get(top, "f32"))

    def float32(self, name: str) -> np.ndarray:
        """The tensor's values as float32 in numpy order (dequantized as ggml does), checked finite."""
        t, typ = self.tensors[name], self.types[name]
        a = t.data
        if typ == "F32":
            out = np.asarray(a, np.float32)
        elif typ == "F16":
            out = np.asarray(a).astype(np.float32)
        elif typ == "BF16":
            out = (np.asarray(a).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif typ in ("Q8_0", "Q4_0"):
            out = quant0.dequantize(*self.blocks(name))
        else:                                              # Q6_K (token_embd / output only)
            from gguf import quants
            with np.errstate(all="ignore"):
                out = np.asarray(quants.dequantize(np.asarray(a), t.tensor_type), np.float32)
        out = out.reshape(tuple(reversed(t.shape.tolist())))
        if out.size and not np.isfinite(out).all():
            bad = np.argwhere(~np.isfinite(out))[0].tolist()
            raise CheckpointError(f"{self.path}: tensor {name} has non-finite value(s) (NaN/inf), e.g. at {bad}")
        return out

    def blocks(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A Q8_0 / Q4_0 matrix's (q int8 [n_out][n_in], d float16 [n_out][n_in/32]), bit for bit."""
        t, typ = self.tensors[name], self.types[name]
        n_in = int(t.shape[0])
        q, d = quant0.from_ggml(np.asarray(t.data).reshape(-1, n_in // quant0.QK * quant0.BLOCK_BYTES[typ.lower()]),
                                typ.lower(), n_in)
        if not np.isfinite(d).all():
            o = int(np.argwhere(~np.isfinite(d))[0][0])
            raise CheckpointError(f"{self.path}: tensor {name}: a block scale of row {o} is not finite")
        return q, d

    # -- the engine's arrays -----------------------------------------------------------------------

    def _f16(self, name: str) -> np.ndarray:
        """float16 values of a tensor for dtype f16 (as stored when F16, else rounded; range-checked)."""
        if self.types[name] == "F16":
            a = np.asarray(self.tensors[name].data).reshape(tuple(reversed(self.tensors[name].shape.tolist())))
            if a.size and not np.isfinite(a).all():
                raise CheckpointError(f"{self.path}: tensor {name} has non-finite value(s) (NaN/inf)")
            return a
        a = self.float32(name)
        if a.size and float(np.abs(a).max()) >= F16_OVERFLOW:
            raise CheckpointError(f"{self.path}: tensor {name} has values beyond float16's range; "
                                  f"load it with dtype='f32'")
        return a.astype(np.float16)

    def _q0(self, name: str, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(q, d) of `kind`: the stored blocks when the tensor is of that type, else quantized from float32."""
        if self.types[name] == kind.upper():
            return self.blocks(name)
        try:
            return quant0.quantize(self.float32(name), kind, what=f"tensor {name}")
        except InvalidArgumentError as e:
            raise CheckpointError(f"{self.path}: {e}") from None

    def matrix(self, name: str, dtype: str):
        """-> (tiled matrix, q8 scales or None) for a [out][in] tensor."""
        if dtype in Q0_DTYPES:
            return quant0.tile(*self._q0(name, dtype), dtype), None
        if dtype == "q8":
            from .quant import quantize_q8
            return quantize_q8(self.float32(name).T)
        if dtype == "f16":
            return tile_matrix(self._f16(name).T, np.float16), None
        return tile_matrix(self.float32(name).T, np.float32), None

    def head(self, name: str, dtype: str):
        """-> (tiled head, q8 scales or None) from token_embd / output [V][C]."""
        if dtype in Q0_DTYPES:
            return quant0.tile(*self._q0(name, quant0.HEAD_KIND), quant0.HEAD_KIND), None
        if dtype == "q8":
            from .quant import quantize_q8_head
            return quantize_q8_head(self.float32(name))
        if dtype == "f16":
            return tile_head(self._f16(name), np.float16), None
        return tile_head(self.float32(name), np.float32), None

    def lookup(self, dtype: str) -> np.ndarray:
        """wte: float32 [V][C], 64-byte aligned."""
        name = "token_embd.weight"
        if dtype in Q0_DTYPES:
            if self.types[name] in ("Q8_0", "Q4_0"):
                return quant0.dequantize(*self.blocks(name))
            return quant0.dequantize(*self._q0(name, quant0.HEAD_KIND))
        return _aligned_copy(self.float32(name))

    def vector(self, name: str) -> np.ndarray:
        return pad_vector(self.float32(name))

    def tied(self) -> bool:
        """No output.weight, or one that is token_embd's bytes (the converter writes such a copy)."""
        out = self.tensors.get("output.weight")
        if out is None:
            return True
        emb = self.tensors["token_embd.weight"]
        return out.tensor_type == emb.tensor_type and np.array_equal(np.asarray(out.data).view(np.uint8),
                                                                      np.asarray(emb.data).view(np.uint8))

    def weights(self, dtype: str | None = None) -> Weights:
        if dtype is None:
            dtype = self.file_dtype()
        if not isinstance(dtype, str) or dtype not in MATRIX_DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {', '.join(MATRIX_DTYPES)}, got {dtype!r}")
        cfg = self.config
        layers = []
        for i in range(cfg.n_layer):
            kw = {f: self.vector(n) for f, (n, _) in _vector_names(i).items()}
            for f, (n, _) in _matrix_names(i).items():
                kw[f], s = self.matrix(n, dtype)
                if s is not None:
                    kw[f[:-2] + "_s"] = s
            layers.append(Layer(**kw))
        tied = self.tied()
        head_w, head_s = self.head("token_embd.weight" if tied else "output.weight", dtype)
        return Weights(
            config=cfg, dtype=dtype, wte=self.lookup(dtype),
            wpe=_aligned_copy(self.float32("position_embd.weight")),
            ln_f_g=self.vector("output_norm.weight"), ln_f_b=self.vector("output_norm.bias"),
            head_w=head_w, head_b=None, n_vocab_padded=-(-cfg.vocab_size // TILE) * TILE,
            layers=layers, tied_head=tied, wte_is_mapped=False, path=self.path,
            source_dtype="+".join(sorted({self.types[n] for n in self.used})), head_s=head_s)

    # -- the tokenizer -----------------------------------------------------------------------------

    def tokenizer(self):
        """The byte-level BPE tokenizer of tokenizer.ggml.tokens / merges (model 'gpt2'), checked as
        vocab.json / merges.txt are; its <|endoftext|> must be eos_token_id when that is given."""
        from . import tokenizer as T
        where = f"{self.path} (tokenizer.ggml.*)"
        model = self.field("tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError(f"{where}: tokenizer.ggml.model is {_short(model)}; only GPT-2's byte-level "
                                 f"BPE ('gpt2') is supported")
        try:
            tokens, merges = self.field("tokenizer.ggml.tokens"), self.field("tokenizer.ggml.merges")
        except CheckpointError as e:
            raise TokenizerError(str(e)) from None
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError(f"{where}: tokenizer.ggml.tokens must be a non-empty list of strings")
        if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
            raise TokenizerError(f"{where}: tokenizer.ggml.merges must be a list of strings")
        vocab = dict(zip(tokens, range(len(tokens))))
        if len(vocab) != len(tokens) or not T._vocab_ok(vocab):
            import json
            T._check_vocab(json.dumps(dict(zip(tokens, range(len(tokens))))), Path(where))   # names the problem
            seen = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise TokenizerError(f"{where}: token {_short(t)} appears twice (ids {seen[t]} and {i})")
                seen[t] = i
        lines = T._merge_lines("\n".join(merges) + ("\n" if merges else ""), Path(where), vocab)
        types = self.field("tokenizer.ggml.token_type")
        if types is not None and (not isinstance(types, list) or len(types) != len(tokens)):
            raise TokenizerError(f"{where}: tokenizer.ggml.token_type has "
                                 f"{len(types) if isinstance(types, list) else _short(types)} entries for "
                                 f"{len(tokens)} tokens")
        bos = self.field("tokenizer.ggml.bos_token_id")
        if bos is not None and (not isinstance(bos, int) or not 0 <= bos < len(tokens)):
            raise TokenizerError(f"{where}: bos_token_id {_short(bos)} is not a token id")
        eos = self.field("tokenizer.ggml.eos_token_id")
        if eos is not None and eos != vocab[T.EOT]:
            raise TokenizerError(f"{where}: eos_token_id is {_short(eos)}, but {T.EOT} has id {vocab[T.EOT]}")
        return T.Tokenizer._from_parsed(vocab, lines, tokens)


def load_gguf_weights(path, dtype: str | None = None) -> Weights:
    """weights.load_weights for a GGUF file (dtype None: the file's own; see the module docstring)."""
    return GGUFModel(path).weights(dtype)


def resolve(spec) -> Path | None:
    """The GGUF file a --model / GPT2.load argument (or $GPT2ASM_MODEL when it is None) names, else None."""
    if spec is None:
        spec = os.environ.get("GPT2ASM_MODEL", "").strip() or None
    if spec is None or not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():
        return None
    return Path(spec).expanduser() if is_gguf(spec) else None
