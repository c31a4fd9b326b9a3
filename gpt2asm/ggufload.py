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
    e = float32(q) * float32(d); Q6_K (float32(d) * float32(sc)) * float32(q)) and then converted like a
    checkpoint's float32 tensor
    (f16: rounded to nearest even, beyond float16's range an error; q8_0 / q4_0: quantized).
  - q8_0 / q4_0 runs: the head is in quant0.head_kind(dtype, C) -- q8_0 for q8_0, q6_k (llama.cpp's Q6_K, as
    llama-quantize keeps it) for q4_0: output.weight's (else token_embd's) blocks as stored when they are of
    that kind (so a llama.cpp Q4_0 GGUF's Q6_K head loads losslessly), anything else quantized to it; the lookup
    rows (wte) are token_embd dequantized when it is Q8_0 / Q4_0 / Q6_K, else token_embd quantized to the head
    kind and dequantized (as from a checkpoint).
Vectors (norms, biases) and the position embedding are dequantized to float32.

load_gguf (what GPT2.load uses) caches a validated cold load whole in the tile cache, so a warm start reads
only the cache (see "warm start" below); GGUFModel / load_gguf_weights always parse and repack.  Every problem -- not a GGUF, another
architecture, truncated or damaged, missing or unexpected tensors, wrong shapes, unsupported types,
non-finite values -- is a CheckpointError (TokenizerError for the tokenizer's metadata).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import stat
from pathlib import Path

import numpy as np

from . import quant0
from .args import not_retired
from .config import GPT2Config
from .errors import CheckpointError, GPT2AsmError, InvalidArgumentError, TokenizerError, shown
from .safefs import expand_user, os_error_text
from .weights import (F16_OVERFLOW, MATRIX_DTYPES, Q0_DTYPES, TILE, Layer, Weights, _aligned_copy, pad_vector,
                      stat_regular_file, tile_head, tile_matrix)

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
        p = expand_user(path, "model")
    except (TypeError, InvalidArgumentError):       # not a path, or ~nouser: not a GGUF (the caller reports it)
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


MAX_ARRAY = 1 << 20          # elements of one metadata array (GPT-2's vocabulary: 50257 tokens, 50000 merges)


@functools.cache
def _reader_class():
    """gguf.GGUFReader that reads nothing past the end of the file: its _get returns a short slice there, so
    an array whose count is damaged (up to 2^64 - 1) would loop on empty elements until memory ran out.
    Every read is bounds-checked, and an array longer than MAX_ARRAY or than the bytes left is refused
    before its elements are read (ValueError: the caller's damaged-GGUF error)."""
    from gguf import GGUFReader, GGUFValueType
    if not all(callable(getattr(GGUFReader, m, None)) for m in ("_get", "_get_field_parts")):
        raise ImportError("this gguf package's GGUFReader has no _get / _get_field_parts to bound-check "
                          "(gguf 0.16-0.19 have them)")         # never an unchecked reader

    get, parts, ARRAY = GGUFReader._get, GGUFReader._get_field_parts, int(GGUFValueType.ARRAY)

    class CheckedReader(GGUFReader):                # called per element of every array: kept lean
        def _get(self, offset, dtype, count=1, override_order=None):
            arr = get(self, offset, dtype, count, override_order)     # past the end: fewer items
            if offset < 0 or len(arr) != count:
                raise ValueError(f"a read of {int(count)} x {np.dtype(dtype).name} at byte {int(offset)} "
                                 f"runs past the end of the file ({len(self.data)} bytes)")
            return arr

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type == ARRAY:
                itype = int(self._get(orig_offs, np.uint32)[0])
                n = int(self._get(orig_offs + 4, np.uint64)[0])
                scalar = self.gguf_scalar_to_np.get(GGUFValueType(itype)) if itype in set(GGUFValueType) else None
                least = np.dtype(scalar).itemsize if scalar is not None else 12 if itype == ARRAY else 8
                if n > MAX_ARRAY or n * least > len(self.data) - orig_offs - 12:
                    raise ValueError(f"a metadata array of {n} elements (at most {MAX_ARRAY}, and no more "
                                     f"than the file holds)")
            return parts(self, orig_offs, raw_type)
    return CheckedReader


class GGUFModel:
    """A validated GPT-2 GGUF: .config (GPT2Config), .types {name: GGUF type name}, tensor access."""

    def __init__(self, path):
        self.path = p = expand_user(path, "GGUF file")
        st = stat_regular_file(p)
        if st.st_size < 24:
            raise CheckpointError(f"{p}: file is {st.st_size} bytes, too short for a GGUF header (truncated?)")
        with open(p, "rb") as f:
            if f.read(4) != MAGIC:
                raise CheckpointError(f"{p}: not a GGUF file (no GGUF magic)")
        try:
            reader = _reader_class()
        except ImportError as e:                           # a dependency: pip install gguf
            raise CheckpointError(f"{p}: reading GGUF needs the `gguf` package (pip install gguf): {e}") from None
        try:
            with np.errstate(all="ignore"):
                self.reader = reader(p, "r")
        except (GPT2AsmError, MemoryError):                # out of memory is not the file's damage
            raise
        except OSError as e:                               # the mapping refused: ENOMEM (RLIMIT_AS), ENFILE...
            raise CheckpointError(f"{p}: cannot map the file: {os_error_text(e)}") from None
        except Exception as e:                             # any damage: ValueError, KeyError, IndexError...
            raise CheckpointError(f"{p}: damaged or truncated GGUF ({type(e).__name__}: "
                                  f"{shown(str(e), 200)})") from None
        if getattr(self.reader, "byte_order", "I") != "I":
            raise CheckpointError(f"{p}: a big-endian GGUF; only little-endian files are supported")
        self._check_offsets()
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.types = {n: t.tensor_type.name for n, t in self.tensors.items()}
        self.config = self._config()
        self._check_tensors()

    def _check_offsets(self) -> None:
        """ggml's rule for the data section: in the order of the tensor infos, each tensor starts where the
        previous one ends, rounded up to general.alignment (from the first byte of the data section), and
        ends within the file.  So no tensor overlaps another or reads the header, and every one is aligned."""
        r, at = self.reader, 0
        align, start, size = int(r.alignment), int(r.data_offset), len(r.data)
        for t in r.tensors:
            off = int(t.data_offset) - start
            if off != at:
                raise CheckpointError(f"{self.path}: tensor {shown(t.name, 60)} starts at byte {off} of the data "
                                      f"section, expected {at} (damaged: overlapping, unaligned or out of order)")
            if start + off + int(t.n_bytes) > size:
                raise CheckpointError(f"{self.path}: tensor {shown(t.name, 60)} ends past the end of the file "
                                      f"(truncated?)")
            at = off + -(-int(t.n_bytes) // align) * align

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
            raise CheckpointError(f"{self.path}: metadata {key!r} must be an integer, got {shown(v)}")
        return v

    def _config(self) -> GPT2Config:
        arch = self.field("general.architecture")
        if arch != ARCH:
            raise CheckpointError(f"{self.path}: general.architecture is {shown(arch)}, not {ARCH!r}: "
                                  f"only GPT-2 GGUFs can be run")
        n_layer, n_ctx = self._int("gpt2.block_count"), self._int("gpt2.context_length")
        n_embd, n_head = self._int("gpt2.embedding_length"), self._int("gpt2.attention.head_count")
        ff = self.field("gpt2.feed_forward_length")
        if ff is not None and ff != 4 * n_embd:
            raise CheckpointError(f"{self.path}: gpt2.feed_forward_length is {shown(ff)}, GPT-2's is "
                                  f"4 * {n_embd}")
        eps = self.field("gpt2.attention.layer_norm_epsilon")
        if eps is not None and (not isinstance(eps, float) or not math.isclose(eps, _LN_EPS, rel_tol=1e-6)):
            raise CheckpointError(f"{self.path}: gpt2.attention.layer_norm_epsilon is {shown(eps)}; the "
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
                                  f"{', '.join(shown(n, 60) for n in unknown[:5])}")
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
        else:                                              # Q8_0 / Q4_0, Q6_K (token_embd / output only)
            out = quant0.dequantize_blocks(self.blocks(name), typ.lower())
        out = out.reshape(tuple(reversed(t.shape.tolist())))
        if out.size and not np.isfinite(out).all():
            bad = np.argwhere(~np.isfinite(out))[0].tolist()
            raise CheckpointError(f"{self.path}: tensor {name} has non-finite value(s) (NaN/inf), e.g. at {bad}")
        return out

    def blocks(self, name: str) -> tuple[np.ndarray, ...]:
        """A Q8_0 / Q4_0 / Q6_K matrix's blocks (quant0.from_ggml: (q, d), or (q, sc, d) for Q6_K), bit for
        bit; the last array is the fp16 scales d [n_out][n_in/unit]."""
        t, kind = self.tensors[name], self.types[name].lower()
        n_in = int(t.shape[0])
        blocks = quant0.from_ggml(np.asarray(t.data).reshape(-1, quant0.row_bytes(n_in, kind)), kind, n_in)
        d = blocks[-1]
        if not np.isfinite(d).all():
            o = int(np.argwhere(~np.isfinite(d))[0][0])
            raise CheckpointError(f"{self.path}: tensor {name}: a block scale of row {o} is not finite")
        return blocks

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

    def _q0(self, name: str, kind: str) -> tuple[np.ndarray, ...]:
        """(q, d) of `kind`: the stored blocks when the tensor is of that type, else quantized from float32."""
        if self.types[name] == kind.upper():
            return self.blocks(name)
        try:
            return quant0.quantize(self.float32(name), kind, what=f"tensor {name}")
        except InvalidArgumentError as e:
            raise CheckpointError(f"{self.path}: {e}") from None

    def matrix(self, name: str, dtype: str):
        """-> the tiled matrix of a [out][in] tensor."""
        if dtype in Q0_DTYPES:
            return quant0.tile_blocks(self._q0(name, dtype), dtype)
        if dtype == "f16":
            return tile_matrix(self._f16(name).T, np.float16)
        return tile_matrix(self.float32(name).T, np.float32)

    def head(self, name: str, dtype: str):
        """-> the tiled head from token_embd / output [V][C]."""
        if dtype in Q0_DTYPES:
            kind = quant0.head_kind(dtype, self.config.n_embd)
            return quant0.tile_blocks(self._q0(name, kind), kind)
        if dtype == "f16":
            return tile_head(self._f16(name), np.float16)
        return tile_head(self.float32(name), np.float32)

    def lookup(self, dtype: str) -> np.ndarray:
        """wte: float32 [V][C], 64-byte aligned."""
        name = "token_embd.weight"
        if dtype in Q0_DTYPES:
            if self.types[name] in ("Q8_0", "Q4_0", "Q6_K"):
                return quant0.dequantize_blocks(self.blocks(name), self.types[name].lower())
            kind = quant0.head_kind(dtype, self.config.n_embd)
            return quant0.dequantize_blocks(self._q0(name, kind), kind)
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
        not_retired(dtype)
        if not isinstance(dtype, str) or dtype not in MATRIX_DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {', '.join(MATRIX_DTYPES)}, got {shown(dtype)}")
        cfg = self.config
        layers = []
        for i in range(cfg.n_layer):
            kw = {f: self.vector(n) for f, (n, _) in _vector_names(i).items()}
            for f, (n, _) in _matrix_names(i).items():
                kw[f] = self.matrix(n, dtype)
            layers.append(Layer(**kw))
        tied = self.tied()
        head_w = self.head("token_embd.weight" if tied else "output.weight", dtype)
        return Weights(
            config=cfg, dtype=dtype, wte=self.lookup(dtype),
            wpe=_aligned_copy(self.float32("position_embd.weight")),
            ln_f_g=self.vector("output_norm.weight"), ln_f_b=self.vector("output_norm.bias"),
            head_w=head_w, head_b=None, n_vocab_padded=-(-cfg.vocab_size // TILE) * TILE,
            layers=layers, tied_head=tied, wte_is_mapped=False, path=self.path,
            source_dtype="+".join(sorted({self.types[n] for n in self.used})))

    # -- the tokenizer -----------------------------------------------------------------------------

    def tokenizer(self):
        """The byte-level BPE tokenizer of tokenizer.ggml.tokens / merges (model 'gpt2'), checked as
        vocab.json / merges.txt are; its <|endoftext|> must be eos_token_id when that is given."""
        from . import tokenizer as T
        where = f"{self.path} (tokenizer.ggml.*)"
        model = self.field("tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError(f"{where}: tokenizer.ggml.model is {shown(model)}; only GPT-2's byte-level "
                                 f"BPE ('gpt2') is supported")
        try:
            tokens, merges = self.field("tokenizer.ggml.tokens"), self.field("tokenizer.ggml.merges")
        except CheckpointError as e:
            raise TokenizerError(str(e)) from None
        for name, v in (("tokens", tokens), ("merges", merges)):
            if v is None:                             # (gguf's writer drops an empty array: merges may be gone)
                raise TokenizerError(f"{where}: tokenizer.ggml.{name} is missing")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError(f"{where}: tokenizer.ggml.tokens must be a non-empty list of strings")
        if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
            raise TokenizerError(f"{where}: tokenizer.ggml.merges must be a list of strings")
        bad = next((i for i, m in enumerate(merges) if "\n" in m or "\r" in m), None)
        if bad is not None:                                # merges.txt has one merge a line: never two
            raise TokenizerError(f"{where}: merge {bad} {shown(merges[bad], 60)} holds a line break")
        vocab = dict(zip(tokens, range(len(tokens))))
        if len(vocab) != len(tokens) or not T._vocab_ok(vocab):
            import json
            T._check_vocab(json.dumps(dict(zip(tokens, range(len(tokens))))), Path(where))   # names the problem
            seen = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise TokenizerError(f"{where}: token {shown(t)} appears twice (ids {seen[t]} and {i})")
                seen[t] = i
        lines = T._merge_lines("\n".join(merges) + ("\n" if merges else ""), Path(where), vocab)
        types = self.field("tokenizer.ggml.token_type")
        if types is not None and (not isinstance(types, list) or len(types) != len(tokens)):
            raise TokenizerError(f"{where}: tokenizer.ggml.token_type has "
                                 f"{len(types) if isinstance(types, list) else shown(types)} entries for "
                                 f"{len(tokens)} tokens")
        bos = self.field("tokenizer.ggml.bos_token_id")
        if bos is not None and (isinstance(bos, bool) or not isinstance(bos, int) or not 0 <= bos < len(tokens)):
            raise TokenizerError(f"{where}: bos_token_id {shown(bos)} is not a token id")
        eos = self.field("tokenizer.ggml.eos_token_id")
        if eos is not None and (isinstance(eos, bool) or eos != vocab[T.EOT]):
            raise TokenizerError(f"{where}: eos_token_id is {shown(eos)}, but {T.EOT} has id {vocab[T.EOT]}")
        return T.Tokenizer._from_parsed(vocab, lines, tokens)


def load_gguf_weights(path, dtype: str | None = None) -> Weights:
    """weights.load_weights for a GGUF file (dtype None: the file's own; see the module docstring)."""
    return GGUFModel(path).weights(dtype)


def resolve(spec) -> Path | None:
    """The GGUF file a --model / GPT2.load argument (or $GPT2ASM_MODEL when it is None) names, else None
    (files.named_spec's rule; a spec it refuses is find_model_dir's error to give)."""
    from .files import named_spec
    try:
        named = named_spec(spec)
    except InvalidArgumentError:
        return None
    if named is None or not is_gguf(named[0]):
        return None
    return expand_user(named[0], named[1])


# ----------------------------------------------------------------------------------------------------
# warm start: the tile cache holds everything a GGUF load produces
#
# GGUFReader parses every metadata field in Python (GPT-2's 50k tokens and 50k merges: seconds), and the
# blocks are repacked at every cold load. A validated cold load is therefore cached whole, in the tile cache
# (gpt2asm.tilecache's file format, directory, eviction and atomic writes), one file per (GGUF, run dtype),
# layout 'gguf-<dtype>': every array of the Weights (matrices, head, wte, vectors, wpe), the configuration,
# the tied flag, and the tokenizer's tokens and merge lines (UTF-8, newline-separated: byte-level tokens hold
# no newline). Its key is tilecache.source_key of the GGUF (path, device, inode, size, mtime, ctime, 64 samples
# of 4 KiB, the code of this module and of the ones laying the arrays out): a changed file is a new key and
# is loaded cold. A warm load reads nothing of the GGUF but the key's samples; the arrays are checked against
# the shapes the cached configuration implies, and any mismatch or damage means a cold load.

_CACHE_EXTRA = ("<f4", "<f2", "|i1", "|u1", "<i4", "<i8")
_VEC_FIELDS = ("ln1_g", "ln1_b", "attn_b", "attn_proj_b", "ln2_g", "ln2_b", "fc_b", "proj_b")


def _cache_layout(dtype: str):
    from . import tilecache as tc
    name = f"gguf-{dtype}"
    if name not in tc.LAYOUTS:
        def refuse(*a, **k):
            raise InvalidArgumentError(f"{name} is the GGUF cache's layout, not a dtype")
        tc.register_layout(tc.Layout(name, 1, refuse, _stored, refuse, refuse,
                                     ("gpt2asm.weights", "gpt2asm.quant0", "gpt2asm.ggufload"),
                                     _CACHE_EXTRA))
    return tc.LAYOUTS[name]


class _Bundle:
    """What _write_cache stores: the Weights and the tokenizer's text."""

    def __init__(self, w: Weights, tok, file_dtype: str):
        self.w, self.tok, self.file_dtype = w, tok, file_dtype


def _text(lines: list[str]) -> np.ndarray:
    raw = "\n".join(lines).encode("utf-8")
    a = np.frombuffer(raw, np.uint8) if raw else np.zeros(0, np.uint8)
    return np.ascontiguousarray(a)


def _stored(b: _Bundle) -> dict:
    w, out = b.w, {}
    c = w.config
    out["gguf.config"] = np.array([c.n_layer, c.n_embd, c.n_head, c.n_ctx, c.vocab_size, int(w.tied_head)],
                                  np.int64)
    for i, L in enumerate(w.layers):
        for f in dataclasses.fields(L):
            v = getattr(L, f.name)
            if isinstance(v, np.ndarray):
                out[f"h.{i}.{f.name}"] = v
    for f in ("wte", "wpe", "ln_f_g", "ln_f_b", "head_w"):
        v = getattr(w, f)
        if isinstance(v, np.ndarray):
            out[f] = v
    tokens = list(b.tok.encoder)                     # in id order (built from the token list)
    out["tok.tokens"] = _text(tokens)
    out["tok.merges"] = _text(list(b.tok.ranks))
    out["tok.ranks"] = np.fromiter(b.tok.ranks.values(), np.int64, len(b.tok.ranks))
    out["gguf.source_dtype"] = _text([w.source_dtype])
    out["gguf.file_dtype"] = _text([b.file_dtype])
    return out


def _expected_arrays(cfg: GPT2Config, dtype: str) -> dict:
    """name -> (np.dtype, shape) of every array the cold load of this configuration and dtype gives."""
    C, V = cfg.n_embd, cfg.vocab_size
    f32 = np.dtype(np.float32)
    pad = lambda n: (f32, (-(-n // TILE) * TILE,))          # noqa: E731
    out = {}

    def mat(name, n_out, n_in, kind):
        if kind in Q0_DTYPES or kind == "q6_k":
            out[name] = (np.dtype(np.uint8), quant0.tiled_shape(n_out, n_in, kind))
        else:
            out[name] = (np.dtype(MATRIX_DTYPES[kind]), (-(-n_out // TILE), n_in, TILE))
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        for f, (_, (o, k)) in _matrix_names(i).items():
            mat(p + f, o * C, k * C, dtype)
        for f, (_, k) in _vector_names(i).items():
            out[p + f] = pad(k * C)
    mat("head_w", V, C, quant0.head_kind(dtype, C) if dtype in Q0_DTYPES else dtype)
    out.update({"wte": (f32, (V, C)), "wpe": (f32, (cfg.n_ctx, C)), "ln_f_g": pad(C), "ln_f_b": pad(C)})
    return out


def _assemble(arrays: dict, path: Path, dtype: str):
    """(Weights, Tokenizer) from a cache's arrays; CacheMiss when they do not fit together."""
    from . import tilecache as tc
    from . import tokenizer as T
    c = arrays.get("gguf.config")
    if c is None or c.shape != (6,) or c.dtype != np.int64:
        raise tc.CacheMiss("no configuration")
    try:
        cfg = GPT2Config(*(int(x) for x in c[:5]))
    except CheckpointError as e:
        raise tc.CacheMiss(f"bad configuration: {e}") from None
    want = _expected_arrays(cfg, dtype)
    for name, (dt, shape) in want.items():
        a = arrays.get(name)
        if a is None or a.dtype != dt or a.shape != shape:
            raise tc.CacheMiss(f"{name}: not the array the configuration implies")
    known = set(want) | {"gguf.config", "tok.tokens", "tok.merges", "tok.ranks", "gguf.source_dtype",
                         "gguf.file_dtype"}
    if set(arrays) - known:
        raise tc.CacheMiss(f"unexpected arrays: {', '.join(sorted(set(arrays) - known)[:3])}")
    try:
        tokens = bytes(arrays["tok.tokens"]).decode("utf-8").split("\n")
        merges = bytes(arrays["tok.merges"]).decode("utf-8")
        source = bytes(arrays["gguf.source_dtype"]).decode("utf-8")
        own = bytes(arrays["gguf.file_dtype"]).decode("utf-8")
        ranks = arrays["tok.ranks"]
    except (KeyError, UnicodeDecodeError):
        raise tc.CacheMiss("bad tokenizer text") from None
    vocab = dict(zip(tokens, range(len(tokens))))
    if len(vocab) != len(tokens) or not T._vocab_ok(vocab) or len(tokens) > cfg.vocab_size:
        raise tc.CacheMiss("bad tokenizer")
    lines = merges.split("\n") if merges else []
    if ranks.dtype != np.int64 or ranks.shape != (len(lines),):
        raise tc.CacheMiss("bad merge ranks")
    tok = T.Tokenizer._from_parsed(vocab, lines, tokens)
    tok.ranks = dict(zip(lines, ranks.tolist()))
    layers = []
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        layers.append(Layer(**{k[len(p):]: v for k, v in arrays.items() if k.startswith(p)}))
    w = Weights(config=cfg, dtype=dtype, wte=arrays["wte"], wpe=arrays["wpe"], ln_f_g=arrays["ln_f_g"],
                ln_f_b=arrays["ln_f_b"], head_w=arrays["head_w"], head_b=None,
                n_vocab_padded=-(-cfg.vocab_size // TILE) * TILE, layers=layers, tied_head=bool(c[5]),
                wte_is_mapped=False, path=path, source_dtype=source)
    return w, tok, own


def _cached_dtypes(root: Path, p: Path) -> list[str]:
    from . import tilecache as tc
    pat = tc.cache_file(root, p, _cache_layout("f32").dtype).name.replace(".gguf-f32.", ".gguf-*.")
    try:
        names = [h.name for h in root.glob(pat)]
    except OSError:
        return []
    return sorted({d for d in (n.split(".gguf-")[-1].split(".")[0] for n in names) if d in MATRIX_DTYPES})


def _warm(root: Path, p: Path, run: str, own_only: bool):
    """-> ((Weights, Tokenizer, cache path), None) or (None, (reason, key or None, key time, cache path))."""
    import time
    from . import tilecache as tc
    layout = _cache_layout(run)
    cpath = tc.cache_file(root, p, layout.dtype)
    t_key = time.time()
    try:
        key = tc.source_key(p, None, layout.dtype)
    except OSError as e:
        return None, (f"cannot read the file for its key: {e}", None, t_key, cpath)
    try:
        arrays = tc._open_cache(cpath, key, {}, layout.extra_dtypes, tc.verify_requested())
        w, tok, own = _assemble(arrays, p, run)
        if own_only and own != run:
            raise tc.CacheMiss(f"cached as dtype {run}, the file's own is {own}")
        tc._touch(cpath)
        return (w, tok, cpath), None
    except tc.CacheMiss as e:
        return None, (str(e), key, t_key, cpath)
    except Exception as e:                                # the cold path is always right
        return None, (f"warm path failed: {type(e).__name__}: {e}", key, t_key, cpath)


def load_gguf(path, dtype: str | None = None, cache_dir=None):
    """(Weights, Tokenizer, tilecache.CacheInfo) of a GGUF: from the tile cache when it holds this file as it
    is now, else a cold load (GGUFModel) that is then cached. dtype None: the file's own (recorded in the
    cache file, so a warm start need not parse the GGUF to know it)."""
    import time
    from . import tilecache as tc
    t0 = time.perf_counter()
    p = expand_user(path, "GGUF file")
    not_retired(dtype)
    if dtype is not None and (not isinstance(dtype, str) or dtype not in MATRIX_DTYPES):
        raise InvalidArgumentError(f"dtype must be one of {', '.join(MATRIX_DTYPES)}, got {shown(dtype)}")
    root = tc.cache_root(cache_dir)
    if root is None or not p.is_file():
        g = GGUFModel(p)                                  # (a missing file: the loader's error)
        return g.weights(dtype), g.tokenizer(), tc.CacheInfo("cold", "cache disabled ($GPT2ASM_CACHE=off)",
                                                             None, time.perf_counter() - t0)
    g = None
    if dtype is None:
        for cand in _cached_dtypes(root, p):
            hit, _ = _warm(root, p, cand, own_only=True)
            if hit:
                return hit[0], hit[1], tc.CacheInfo("warm", "", hit[2], time.perf_counter() - t0)
        g = GGUFModel(p)
        dtype = g.file_dtype()
    hit, miss = _warm(root, p, dtype, own_only=False)
    if hit:
        return hit[0], hit[1], tc.CacheInfo("warm", "", hit[2], time.perf_counter() - t0)
    reason, key, t_key, cpath = miss
    g = g or GGUFModel(p)
    w, tok = g.weights(dtype), g.tokenizer()
    done = lambda status, why: (w, tok, tc.CacheInfo(status, why, cpath, time.perf_counter() - t0))  # noqa: E731
    if key is None:
        return done("cold", reason)
    try:
        st = os.stat(p)
        if {k: key[k] for k in tc._stat_key(st)} != tc._stat_key(st):
            return done("cold", f"{reason}; not written: the file changed while loading")
        if t_key - key["ctime_ns"] / 1e9 < tc.RACY_SECONDS:
            return done("cold", f"{reason}; not written: the file changed just now")
        with tc._lock:
            os.makedirs(root, exist_ok=True)
            tc._write_cache(cpath, key, _cache_layout(dtype), _Bundle(w, tok, g.file_dtype()))
            tc._remove_other_versions(cpath)
            tc._evict(root, cpath)
    except (OSError, ValueError) as e:
        return done("cold", f"{reason}; not written: {e}")
    return done("built", reason)
