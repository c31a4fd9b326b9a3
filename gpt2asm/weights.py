"""Load a GPT-2 model.safetensors and lay its weights out for the assembly kernels.

The file is memory-mapped and its header parsed here (no safetensors/torch dependency), with every
structural problem reported as a CheckpointError:

    [8 bytes: header length N, little-endian u64][N bytes: JSON header][data buffer]
    header = {"__metadata__": {...}?, name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...}
    (offsets are relative to the start of the data buffer)

Both naming forms are accepted: 'transformer.h.0.attn.c_attn.weight' (save_pretrained) and
'h.0.attn.c_attn.weight' (the hub's gpt2 file). The causal-mask buffers h.N.attn.bias / h.N.attn.masked_bias
are ignored. lm_head.weight is optional: when present it is the output head (as in transformers, whatever
tie_word_embeddings says), otherwise the head is tied to wte -- unless config.json says
tie_word_embeddings=false, which without an lm_head.weight is refused (transformers would draw a random head).

Engine layout (see tile_matrix): every matrix multiply  y[out] = x[in] @ W[in][out] + b  uses W tiled as
    Wt[ceil(out/64)][in][64],  Wt[t][i][j] = W[i][64t + j]   (zero for 64t + j >= out)
so a kernel streams one contiguous [in][64] panel per 64 outputs. Matrices are float32 or float16
(dtype='f16'), vectors always float32; every array the engine gets is C-contiguous and 64-byte aligned.
dtypes 'q8_0' / 'q4_0' (gpt2asm.quant0, docs/kernels.md "q8_0 / q4_0") hold llama.cpp's blocks of 32 inputs instead:
each matrix is uint8 [ceil(out/64)][in/32][RECORD] records of 64 outputs x 32 inputs with their fp16
scales; the head (and the embedding) is q8_0 for both, and wte is the dequantized q8_0 embedding.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .args import not_retired
from .config import GPT2Config, infer_config
from .errors import CheckpointError, InvalidArgumentError, ModelNotFoundError, shown

ALIGN = 64                       # bytes; every array handed to the engine starts on a 64-byte boundary
TILE = 64                        # outputs per tile of a tiled matrix
MAX_HEADER = 100_000_000         # same limit as the safetensors library
F16_MAX = 65504.0
F16_OVERFLOW = 65520.0            # float32 values >= this round to inf in float16
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

# safetensors dtype -> item size in bytes (all the dtypes of the format, so any file's sizes can be checked)
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
             "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4,
             "U64": 8, "I64": 8, "F64": 8, "C64": 8}
# the dtypes whose weights we can use -> how they are viewed in numpy (BF16 as raw bits)
_NUMPY_DTYPE = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
MATRIX_DTYPES = {"f32": np.float32, "f16": np.float16,                  # engine dtype -> tiled matrix dtype
                 "q8_0": np.uint8, "q4_0": np.uint8}                      # ggml blocks as records (quant0)
Q0_DTYPES = ("q8_0", "q4_0")
_FLOAT_TILES = (np.dtype(np.float32), np.dtype(np.float16))             # what tile_matrix / tile_head write

_IGNORED_RE = re.compile(r"^h\.\d{1,9}\.attn\.(bias|masked_bias)$")   # causal-mask buffers, not weights
_BLOCK_RE = re.compile(r"^h\.(\d{1,9})\.")                              # (longer numbers: not a block)


# ----------------------------------------------------------------------------------------------------
# aligned arrays and the tiled layout
# ----------------------------------------------------------------------------------------------------

def _aligned(shape, dtype, align: int, alloc) -> np.ndarray:
    """A C-contiguous array of shape and dtype starting on an `align`-byte boundary, cut from a byte buffer
    that alloc (np.empty or np.zeros) makes."""
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buf = alloc(nbytes + align, dtype=np.uint8)
    start = (-buf.ctypes.data) % align
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def aligned_empty(shape, dtype, align: int = ALIGN) -> np.ndarray:
    """Uninitialised C-contiguous array whose data starts on an `align`-byte boundary."""
    return _aligned(shape, dtype, align, np.empty)


def aligned_zeros(shape, dtype, align: int = ALIGN) -> np.ndarray:
    """Zeroed aligned_empty: calloc'd, so a large array is the system's zero pages, each faulted in when
    first touched (a KV cache of which a short text uses a few pages costs no pass over the whole)."""
    return _aligned(shape, dtype, align, np.zeros)


def _engine_dtype(dtype) -> np.dtype:
    """float32 / float16 for tile_matrix and tile_head (q8_0 / q4_0 records come from gpt2asm.quant0)."""
    if isinstance(dtype, str) and dtype in MATRIX_DTYPES:
        dt = np.dtype(MATRIX_DTYPES[dtype])
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
    if dt not in _FLOAT_TILES:
        raise InvalidArgumentError(f"matrix dtype must be float32/'f32' or float16/'f16', got {shown(dtype)}")
    return dt


def tile_matrix(w_in_out: np.ndarray, dtype=np.float32) -> np.ndarray:
    """HF Conv1D weight W[in][out] -> Wt[ceil(out/64)][in][64] with Wt[t][i][j] = W[i][64t+j], zero-padded.

    Conversion to float16 rounds to nearest even. The result is C-contiguous and 64-byte aligned.
    """
    w = _matrix(w_in_out, "tile_matrix", "[in][out]")
    n_in, n_out = w.shape
    return _tiles(n_in, n_out, _engine_dtype(dtype),
                  lambda full: w[:, :full * TILE].reshape(n_in, full, TILE).transpose(1, 0, 2),  # [full][in][64]
                  lambda o: w[:, o:])                                                              # [in][rest]


def _matrix(a, what: str, layout: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 2:
        raise InvalidArgumentError(f"{what} expects a 2-D {layout} matrix, got shape {a.shape}")
    return a


def _tiles(n_in: int, n_out: int, dtype, full_tiles, last_tile) -> np.ndarray:
    """out [ceil(n_out/64)][n_in][64] (C-contiguous, 64-byte aligned): the n_out // 64 whole tiles from
    full_tiles(n) (a [n][n_in][64] view), the last, partial one from last_tile(64 n) ([n_in][rest]),
    zero-padded; conversion to float16 rounds to nearest even."""
    n_tiles, full = -(-n_out // TILE), n_out // TILE
    out = aligned_empty((n_tiles, n_in, TILE), dtype)
    if full:
        np.copyto(out[:full], full_tiles(full), casting="same_kind")
    if full < n_tiles:
        rest = n_out - full * TILE
        np.copyto(out[full, :, :rest], last_tile(full * TILE), casting="same_kind")
        out[full, :, rest:] = 0
    return out


def tile_head(w_out_in: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Output head from wte / lm_head.weight E[V][C] (logits = x @ E.T, i.e. in=C, out=V).

    Returns Et[ceil(V/64)][C][64] with Et[t][i][j] = E[64t+j][i] (zero for 64t+j >= V) -- exactly
    tile_matrix(E.T) -- built tile by tile from a (T, 64, C) -> (T, C, 64) transposed view of E, without
    materialising E.T.
    """
    e = _matrix(w_out_in, "tile_head", "[V][C]")
    n_out, n_in = e.shape
    return _tiles(n_in, n_out, _engine_dtype(dtype),
                  lambda full: e[:full * TILE].reshape(full, TILE, n_in).transpose(0, 2, 1),  # [full][C][64]
                  lambda o: e[o:].T)                                                            # [C][rest]


def pad_vector(b: np.ndarray, n: int | None = None) -> np.ndarray:
    """float32 copy of the 1-D vector b, zero-padded to length n (default: len(b) rounded up to 64),
    64-byte aligned."""
    b = np.asarray(b)
    if b.ndim != 1:
        raise InvalidArgumentError(f"pad_vector expects a 1-D vector, got shape {b.shape}")
    if n is None:
        n = -(-b.shape[0] // TILE) * TILE
    if n < b.shape[0]:
        raise InvalidArgumentError(f"pad_vector: n={n} is shorter than the vector ({b.shape[0]})")
    out = aligned_empty((n,), np.float32)
    np.copyto(out[:b.shape[0]], b, casting="same_kind")
    out[b.shape[0]:] = 0
    return out


# ----------------------------------------------------------------------------------------------------
# safetensors parsing
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorEntry:
    name: str            # name as stored in the file
    dtype: str           # safetensors dtype, e.g. 'F32'
    shape: tuple         # dimensions
    begin: int           # byte offsets into the data buffer
    end: int


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _DuplicateKey(k)
        seen[k] = v
    return seen


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def stat_regular_file(p: Path) -> os.stat_result:
    """p's stat, or ModelNotFoundError (missing) / CheckpointError (unreadable, or a directory, FIFO or device:
    never open one, a FIFO blocks)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelNotFoundError(f"{p}: file not found") from None
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read the file: {e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{p}: not a regular file")
    return st


class SafetensorsFile:
    """A memory-mapped, validated safetensors file. `entries` maps stored names to TensorEntry."""

    def __init__(self, path):
        self.path = Path(path)
        p = self.path
        size = stat_regular_file(p).st_size
        if size == 0:
            raise CheckpointError(f"{p}: file is empty")
        if size < 8:
            raise CheckpointError(f"{p}: file is {size} bytes, too short for a safetensors header (truncated?)")
        try:
            with open(p, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{p}: cannot map the file: {e}") from None
        n = int.from_bytes(self._mm[:8], "little")
        if n > MAX_HEADER:
            raise CheckpointError(f"{p}: header length {n} is absurd (limit {MAX_HEADER}); not a safetensors file?")
        if 8 + n > size:
            raise CheckpointError(f"{p}: header length {n} goes beyond the end of the file ({size} bytes; "
                                  f"truncated or not a safetensors file?)")
        self.data_start = 8 + n
        self.data_len = size - self.data_start
        header = self._parse_header(bytes(self._mm[8:8 + n]))
        meta = header.pop("__metadata__", None)
        if meta is not None and not isinstance(meta, dict):
            raise CheckpointError(f"{p}: __metadata__ must be a JSON object, got {type(meta).__name__}")
        self.metadata = meta or {}
        self.entries = {name: self._parse_entry(name, info) for name, info in header.items()}
        self._check_overlaps()

    def _parse_header(self, raw: bytes) -> dict:
        p = self.path
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{p}: header is not valid UTF-8 ({e}); not a safetensors file?") from None
        try:
            header = json.loads(text, object_pairs_hook=_no_duplicates)
        except _DuplicateKey as e:
            raise CheckpointError(f"{p}: duplicate tensor name {shown(e.args[0])} in the header") from None
        except (ValueError, RecursionError) as e:   # JSONDecodeError, integers too long, nesting too deep
            raise CheckpointError(f"{p}: header is not valid JSON ({type(e).__name__}: {shown(str(e), 200)}); "
                                  f"not a safetensors file?") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{p}: header must be a JSON object, got {type(header).__name__}")
        return header

    def _parse_entry(self, name: str, info) -> TensorEntry:
        where = f"{self.path}: tensor {shown(name)}"
        if not isinstance(info, dict):
            raise CheckpointError(f"{where}: header entry must be an object, got {type(info).__name__}")
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
        if missing:
            raise CheckpointError(f"{where}: header entry lacks {', '.join(missing)}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
            raise CheckpointError(f"{where}: unknown dtype {shown(dtype)}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise CheckpointError(f"{where}: shape must be a list of non-negative integers, got {shown(shape)}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) and o >= 0 for o in offsets)):
            raise CheckpointError(f"{where}: data_offsets must be two non-negative integers, got {shown(offsets)}")
        begin, end = offsets
        if end < begin:
            raise CheckpointError(f"{where}: data_offsets end {end} < begin {begin}")
        if end > self.data_len:
            raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] go beyond the data "
                                  f"({self.data_len} bytes; file truncated?)")
        expected = math.prod(shape) * _ITEMSIZE[dtype]
        if end - begin != expected:
            raise CheckpointError(f"{where}: {end - begin} bytes of data, but shape {shape} of {dtype} "
                                  f"needs {expected}")
        return TensorEntry(name, dtype, tuple(shape), begin, end)

    def _check_overlaps(self) -> None:
        spans = sorted((e.begin, e.end, e.name) for e in self.entries.values() if e.end > e.begin)
        for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise CheckpointError(f"{self.path}: tensors {shown(n0)} [{b0}, {e0}] and {shown(n1)} [{b1}, {e1}] overlap")

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy read-only view of a F32/F16/BF16 tensor (BF16 as uint16 bits) in its stored shape."""
        e = self.entries[name]
        if e.dtype not in _NUMPY_DTYPE:
            raise CheckpointError(f"{self.path}: tensor {shown(name)} has dtype {e.dtype}; only F32, F16 and BF16 "
                                  f"are supported")
        dt = np.dtype(_NUMPY_DTYPE[e.dtype])
        a = np.frombuffer(self._mm, dtype=dt, count=(e.end - e.begin) // dt.itemsize,
                          offset=self.data_start + e.begin)
        return a.reshape(e.shape)


# ----------------------------------------------------------------------------------------------------
# checkpoint -> engine arrays
# ----------------------------------------------------------------------------------------------------

@dataclass
class Layer:
    """One transformer block; matrices tiled [out/64][in][64], vectors float32 (C = n_embd)."""
    ln1_g: np.ndarray        # [C]
    ln1_b: np.ndarray        # [C]
    attn_w: np.ndarray       # [3C/64][C][64]   c_attn (q | k | v)
    attn_b: np.ndarray       # [3C] (padded to a multiple of 64)
    attn_proj_w: np.ndarray  # [C/64][C][64]
    attn_proj_b: np.ndarray  # [C]
    ln2_g: np.ndarray        # [C]
    ln2_b: np.ndarray        # [C]
    fc_w: np.ndarray         # [4C/64][C][64]
    fc_b: np.ndarray         # [4C]
    proj_w: np.ndarray       # [C/64][4C][64]
    proj_b: np.ndarray       # [C]


@dataclass
class Weights:
    config: GPT2Config
    dtype: str                      # 'f32', 'f16', 'q8_0' or 'q4_0' (block records)
    wte: np.ndarray                 # [V][C] float32, private memory (never a view of a file: see private_copy)
    wpe: np.ndarray                 # [n_ctx][C] float32
    ln_f_g: np.ndarray              # [C]
    ln_f_b: np.ndarray              # [C]
    head_w: np.ndarray              # [V_pad/64][C][64]: logits = x @ wte.T (or lm_head.weight.T)
    head_b: np.ndarray | None       # always None: GPT-2 has no output bias
    n_vocab_padded: int             # V rounded up to a multiple of 64
    layers: list = field(default_factory=list)   # n_layer Layer objects
    tied_head: bool = True          # head_w came from wte (no lm_head.weight in the file)
    wte_is_mapped: bool = False     # wte is the checkpoint's own F32 data as stored (the tile cache need not
                                    # hold it); a read-only private copy since the file can change under us
    path: Path | None = None        # the model.safetensors that was loaded
    source_dtype: str = "F32"       # stored dtype(s) of the weights, e.g. 'F32' or 'F16' or 'F16+F32'

    @property
    def nbytes(self) -> int:
        """Bytes of the engine arrays, wte included."""
        arrays = [self.wte, self.wpe, self.ln_f_g, self.ln_f_b, self.head_w, self.head_b]
        arrays += [a for layer in self.layers for a in vars(layer).values()]
        return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


def _expected_shapes(cfg: GPT2Config) -> dict:
    """Bare tensor name -> shape for every tensor the engine needs (lm_head.weight is optional)."""
    C, V = cfg.n_embd, cfg.vocab_size
    shapes = {"wte.weight": (V, C), "wpe.weight": (cfg.n_ctx, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,),
        })
    return shapes


def _listing(names, limit: int = 5) -> str:
    names = list(names)
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(n if len(n) <= 80 else n[:80] + "..." for n in names[:limit]) + more


def _resolve(path) -> tuple[Path, Path | None]:
    """-> (model.safetensors path, config.json path or None)."""
    p = Path(path)
    if p.is_dir():
        f = p / MODEL_FILE
        if not f.is_file():
            others = [n for n in ("pytorch_model.bin", "model.ckpt.index", "tf_model.h5") if (p / n).exists()]
            hint = f" (found {', '.join(others)}; only safetensors is supported)" if others else ""
            raise ModelNotFoundError(f"{p}: no {MODEL_FILE} in this directory{hint}")
    elif p.is_file():
        f = p
    else:
        raise ModelNotFoundError(f"{p}: no such model directory or file")
    cfg = f.parent / CONFIG_FILE
    return f, (cfg if cfg.exists() else None)      # a FIFO or device here is refused when read, not ignored


class _Loader:
    """Validates a SafetensorsFile against a config and converts its tensors."""

    def __init__(self, st: SafetensorsFile, config_path: Path | None):
        self.st = st
        self.where = str(st.path)
        self.names = self._normalise_names()          # bare name -> stored name
        self.config = self._config(config_path)
        self._check_tensor_set()

    def _normalise_names(self) -> dict:
        names = {}
        for stored in self.st.entries:
            bare = stored[len("transformer."):] if stored.startswith("transformer.") else stored
            if bare in names:
                raise CheckpointError(f"{self.where}: tensor {shown(bare)} is stored twice "
                                      f"(as {shown(names[bare])} and {shown(stored)})")
            names[bare] = stored
        return names

    def _config(self, config_path: Path | None) -> GPT2Config:
        if config_path is not None:
            return GPT2Config.from_json(config_path)
        try:
            shapes = {bare: self.st.entries[stored].shape for bare, stored in self.names.items()
                      if not _IGNORED_RE.match(bare)}
            return infer_config(shapes)
        except CheckpointError as e:
            raise CheckpointError(f"{self.where} (no config.json beside it): {e}") from None

    def _check_tensor_set(self) -> None:
        cfg, where = self.config, self.where
        expected = _expected_shapes(cfg)
        present = {b for b in self.names if not _IGNORED_RE.match(b)}
        blocks = {int(m.group(1)) for b in present if (m := _BLOCK_RE.match(b))}
        if blocks and max(blocks) >= cfg.n_layer:
            raise CheckpointError(f"{where}: the config says n_layer={cfg.n_layer} but the file has blocks up "
                                  f"to h.{max(blocks)}")
        missing = [n for n in expected if n not in present]
        if missing:
            raise CheckpointError(f"{where}: missing tensor(s): {_listing(missing)}")
        unknown = sorted(present - expected.keys() - {"lm_head.weight"})
        if unknown:
            raise CheckpointError(f"{where}: unexpected tensor(s), not part of GPT-2: {_listing(unknown)}")
        if "lm_head.weight" in present:
            expected["lm_head.weight"] = expected["wte.weight"]
        elif not cfg.tie_word_embeddings:                # transformers would start that head from random numbers
            raise CheckpointError(f"{where}: the config says tie_word_embeddings=false, but the file has no "
                                  f"lm_head.weight (the output head is missing)")
        bad = [f"{self.names[n]} ({self.st.entries[self.names[n]].dtype})" for n in expected
               if self.st.entries[self.names[n]].dtype not in _NUMPY_DTYPE]
        if bad:
            raise CheckpointError(f"{where}: unsupported dtype(s) (only F32, F16, BF16): {_listing(bad)}")
        wrong = [f"{self.names[n]} is {list(self.st.entries[self.names[n]].shape)}, expected {list(s)}"
                 for n, s in expected.items() if self.st.entries[self.names[n]].shape != s]
        if wrong:
            raise CheckpointError(f"{where}: wrong shape(s) for n_layer={cfg.n_layer} n_embd={cfg.n_embd} "
                                  f"n_ctx={cfg.n_ctx} vocab={cfg.vocab_size}: {_listing(wrong, 3)}")
        self.used = list(expected)

    # -- tensor access ----------------------------------------------------------------------------

    def raw(self, bare: str) -> np.ndarray:
        return self.st.raw(self.names[bare])

    def tensor(self, bare: str, f16_target: bool = False) -> np.ndarray:
        """The tensor as float32 or float16 values (a zero-copy view of the file for F32 and F16; BF16 is
        widened to float32), checked finite -- and, with f16_target, checked to fit float16."""
        name, dtype = self.names[bare], self.st.entries[self.names[bare]].dtype
        raw = self.st.raw(name)
        if dtype == "BF16":                              # bf16 is the high half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        if raw.size == 0:
            return raw
        if dtype == "F16":
            # exponent bits all ones <=> inf/NaN; integer max is much faster than numpy's float16 max
            if int((raw.view(np.uint16) & 0x7FFF).max()) >= 0x7C00:
                self._non_finite(name, raw)
            return raw
        lo, hi = float(raw.min()), float(raw.max())      # NaN propagates through min/max
        if not (math.isfinite(lo) and math.isfinite(hi)):
            self._non_finite(name, raw)
        if f16_target and max(-lo, hi) >= F16_OVERFLOW:
            raise CheckpointError(f"{self.where}: tensor {shown(name)} has values up to {max(-lo, hi):.6g}, beyond "
                                  f"float16's range (max {F16_MAX:g}); load it with dtype='f32'")
        return raw

    def _non_finite(self, name: str, a: np.ndarray):
        bad = ~np.isfinite(a)
        first = [int(i) for i in np.argwhere(bad)[0]]
        raise CheckpointError(f"{self.where}: tensor {shown(name)} has {int(bad.sum())} non-finite value(s) "
                              f"(NaN/inf), e.g. at index {first}")

    def vector(self, bare: str) -> np.ndarray:
        return pad_vector(self.tensor(bare))

    def matrix(self, bare: str, dt) -> np.ndarray:
        return tile_matrix(self.tensor(bare, f16_target=dt == np.float16), dt)

    def matrix_q0(self, bare: str, kind: str) -> np.ndarray:
        """A Conv1D weight W[in][out] as ggml blocks of `kind` in the kernels' records (gpt2asm.quant0)."""
        from . import quant0
        return self._q0(quant0.quantize_tiled, self.tensor(bare).T, kind, bare)

    def head_q0(self, bare: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """wte / lm_head.weight E[V][C] in quant0.head_kind(dtype, C) (q8_0; q6_k for q4_0): (its records,
        the dequantized rows float32 [V][C] -- what the lookup uses)."""
        from . import quant0
        E = self.tensor(bare)
        kind = quant0.head_kind(dtype, E.shape[1])
        blocks = self._q0(quant0.quantize, E, kind, bare)
        return quant0.tile_blocks(blocks, kind), quant0.dequantize_blocks(blocks, kind)

    def _q0(self, fn, w, kind: str, bare: str):
        try:
            return fn(w, kind, what=f"tensor {shown(self.names[bare])}")
        except InvalidArgumentError as e:               # weights beyond the block scale's float16 range
            raise CheckpointError(f"{self.where}: {e}") from None


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    out = aligned_empty(a.shape, np.float32)
    np.copyto(out, a, casting="same_kind")
    return out


def private_copy(a: np.ndarray) -> np.ndarray:
    """A read-only float32 copy of a (e.g. wte) in anonymous memory, 64-byte aligned.  What a running
    model keeps must not be a view of a file mapping: a file truncated or rewritten in place (a plain
    `cp new.safetensors model.safetensors`) would turn the next read of a lost page into SIGBUS."""
    out = _aligned_copy(a)
    out.flags.writeable = False
    return out


def load_weights(path, dtype: str = "f32") -> Weights:
    """Load model.safetensors (a model directory or the file itself; config.json beside it is used when
    present, otherwise the config is inferred from the shapes) and build the engine's arrays.

    dtype 'f16' stores the tiled matrices (blocks and output head) as float16; 'q8_0' / 'q4_0' as ggml's blocks in the
    integer kernels' records (gpt2asm.quant0: the block matrices in that kind, the head -- and the
    embedding, dequantized into wte -- in q8_0); everything else is float32.
    """
    not_retired(dtype)
    if not isinstance(dtype, str) or dtype not in MATRIX_DTYPES:
        raise InvalidArgumentError(f"dtype must be 'f32', 'f16', 'q8_0' or 'q4_0', got {shown(dtype)}")
    dt = np.dtype(MATRIX_DTYPES[dtype])
    half = dt == np.float16
    file, config_path = _resolve(path)
    ld = _Loader(SafetensorsFile(file), config_path)
    cfg = ld.config
    if dtype in Q0_DTYPES:
        matrix = lambda bare: ld.matrix_q0(bare, dtype)                # noqa: E731
    else:
        matrix = lambda bare: ld.matrix(bare, dt)                      # noqa: E731

    layers = []
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        attn_w = matrix(p + "attn.c_attn.weight")
        attn_proj_w = matrix(p + "attn.c_proj.weight")
        fc_w = matrix(p + "mlp.c_fc.weight")
        proj_w = matrix(p + "mlp.c_proj.weight")
        layers.append(Layer(
            ln1_g=ld.vector(p + "ln_1.weight"),
            ln1_b=ld.vector(p + "ln_1.bias"),
            attn_w=attn_w,                                  # [3C/64][C][64]
            attn_b=ld.vector(p + "attn.c_attn.bias"),
            attn_proj_w=attn_proj_w,                        # [C/64][C][64]
            attn_proj_b=ld.vector(p + "attn.c_proj.bias"),
            ln2_g=ld.vector(p + "ln_2.weight"),
            ln2_b=ld.vector(p + "ln_2.bias"),
            fc_w=fc_w,                                      # [4C/64][C][64]
            fc_b=ld.vector(p + "mlp.c_fc.bias"),
            proj_w=proj_w,                                  # [C/64][4C][64]
            proj_b=ld.vector(p + "mlp.c_proj.bias"),
        ))

    tied = "lm_head.weight" not in ld.names
    if dtype in Q0_DTYPES:                  # the embedding and head in blocks (q8_0; q6_k for q4_0), as llama.cpp
        head_w, wte = ld.head_q0("wte.weight", dtype)
        if not tied:
            head_w = ld.head_q0("lm_head.weight", dtype)[0]
        wte_is_mapped = False
    else:
        wte = ld.tensor("wte.weight", f16_target=tied and half)
        wte_is_mapped = ld.st.entries[ld.names["wte.weight"]].dtype == "F32" and wte.ctypes.data % ALIGN == 0
        wte = private_copy(wte)                             # nothing of the mapped file stays in use
        head_w = tile_head(wte if tied else ld.tensor("lm_head.weight", f16_target=half), dt)

    stored = sorted({ld.st.entries[ld.names[n]].dtype for n in ld.used})
    return Weights(
        config=cfg,
        dtype=dtype,
        wte=wte,                                            # [V][C] float32
        wpe=_aligned_copy(ld.tensor("wpe.weight")),         # [n_ctx][C]
        ln_f_g=ld.vector("ln_f.weight"),                    # [C]
        ln_f_b=ld.vector("ln_f.bias"),                      # [C]
        head_w=head_w,                                      # [V_pad/64][C][64]
        head_b=None,
        n_vocab_padded=-(-cfg.vocab_size // TILE) * TILE,
        layers=layers,
        tied_head=tied,
        wte_is_mapped=wte_is_mapped,
        path=file,
        source_dtype="+".join(stored),
    )