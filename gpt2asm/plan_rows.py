"""The row jobs of a Plan (gpt2asm/plan.py): prefill's row jobs over the n_tok rows of a run (set_rows)
and batched decode's over the rows of a row table (set_batch) -- a mixin of Plan, whose core (records,
build, run / step, spans, checks) they use through self.
"""
from __future__ import annotations

import numpy as np

from . import plan_abi as _abi
from .args import integer, token_id
from .errors import InvalidArgumentError, KernelUnavailableError, LibraryError, shown
from .plan_abi import (EPI_GELU, EPI_RESID, FL_KV, FL_KV16, FL_Q0, FL_ROWS, KIND_BATTN, KIND_MATMUL,
                       KIND_ROWARGMAX, KIND_ROWATTN, KIND_ROWLN, KIND_ROWQUANT, PRO_EMBED, PRO_LN,
                       ROWATTN_ROWS, RT_SIZE)
from .validate import (HEAD_DIM, Q0_QK, SIZE_MAX, TILE, addr, aligned_bytes, check, check_cache, check_rows,
                       is_int)

_H = _abi.HEADER_U64          # u64 slots of the plan header
_RT = {k: f.offset // 8 for k, f in _abi.ROW_FIELDS.items()}   # u64 slots of a row table entry


class RowJobs:
    """Plan's row jobs (prefill and batched decode); see Plan."""

    # -- prefill: row jobs over the n_tok rows of a run (set_rows) -----------------------------------

    def _rows(self, a, name: str, width: int, writable: bool = False, dtype=np.float32) -> int:
        """A row buffer [R][ld >= width]: limits the rows per run to R; returns ld (elements: floats, or
        bytes of the int8 xq rows)."""
        R, ld = check_rows(a, name, width, writable, dtype)
        self._limit_rows(R)
        self.keep.append(a)
        return ld

    def matmul(self, w: np.ndarray, x: np.ndarray, b: np.ndarray | None, y: np.ndarray, *,
               gelu: bool = False, resid: np.ndarray | None = None,
               kv: tuple | None = None, chunk: int | None = None, xd: np.ndarray | None = None) -> int:
        """Y[t] = W X[t] + b for the rows t < n_tok of a run (tiles are the items), x [R][>= n_in],
        y [R][>= 64 n_tiles]; then Y[t] = gelu(Y[t]), or resid[t] += Y[t] (resid [R][>= 64 n_tiles]).
        kv = (k, v), the caches [H][n_ctx][64]: w is c_attn (3H tiles); its q tiles go to y
        ([R][>= 64 H]), its k and v tiles straight into the caches at rows pos .. pos + n_tok - 1.
        q8_0 / q4_0 records w: x is the quantized rows xq int8 [R][>= n_in] and xd their scales float32
        [R][>= n_in/32] (written by rows_quantize; required with such w, refused otherwise)."""
        if not self.k.has_matmul:
            raise KernelUnavailableError(f"the {self.k.family} family has no matmul kernels in this library")
        n_tiles, n_in, wflag, f = self._weights(w, op="matmul")
        q0 = wflag == FL_Q0
        if q0 != (xd is not None):
            raise InvalidArgumentError("xd: the scales of the quantized rows go with (only) q8_0 / q4_0 weights")
        if b is not None:
            check(b, "b", np.float32, n_tiles * TILE)
        flags, width = wflag, n_tiles * TILE
        if kv is not None:
            if not (isinstance(kv, tuple) and len(kv) == 2):
                raise InvalidArgumentError("kv: expected the caches (k, v)")
            if gelu or resid is not None:
                raise InvalidArgumentError("no epilogue with kv")
            H, n_ctx = check_cache(*kv, writable=True)
            if n_tiles != 3 * H:
                raise InvalidArgumentError(f"w: {n_tiles} tiles, expected {3 * H} (c_attn of {H} heads)")
            self._limit_pos(n_ctx)
            xdt = np.int8 if q0 else np.float32
            flags, width = flags | FL_KV | self._kv16(kv[0], check_rows(x, "x", n_in, dtype=xdt)[0]), H * TILE
            f.update(a0=self._ptr(kv[0]), a1=self._ptr(kv[1]), a3=n_ctx * HEAD_DIM, a4=H)
        if q0:
            f.update(ldx=self._rows(x, "xq", n_in, dtype=np.int8), xd=addr(xd),
                     ldd=self._rows(xd, "xd", n_in // Q0_QK))
            if np.may_share_memory(xd, y) or np.may_share_memory(xd, x):
                raise InvalidArgumentError("xd must not overlap xq or y")
        else:
            f.update(ldx=self._rows(x, "x", n_in))
        f.update(ldy=self._rows(y, "y", width, writable=True), x=addr(x), y=addr(y),
                 b=0 if b is None else self._ptr(b))
        if np.may_share_memory(x, y):
            raise InvalidArgumentError("y must not overlap x")
        if gelu and resid is not None:
            raise InvalidArgumentError("one epilogue per job")
        if gelu:
            flags |= EPI_GELU
        if resid is not None:
            if np.may_share_memory(resid, y) or np.may_share_memory(resid, x) or (
                    q0 and np.may_share_memory(resid, xd)):
                raise InvalidArgumentError("resid must not overlap x, xd or y")
            f.update(ldr=self._rows(resid, "resid", n_tiles * TILE, writable=True), a0=addr(resid))
            flags |= EPI_RESID
        return self._add(KIND_MATMUL, flags, n_tiles, chunk, f)

    def rows_layernorm(self, x: np.ndarray, g: np.ndarray, beta: np.ndarray, y: np.ndarray, *,
                       embed: bool = False, chunk: int | None = None) -> int:
        """Y[t] = layernorm(X[t]) (gain g, bias beta [n]) for the rows t < n_tok of a run (rows are the
        items); x, y [R][>= n].  embed (batched decode: set_embedding and row_table first): X[t] =
        wte[token_t] + wpe[pos_t] of row t's row table entry first."""
        if not (isinstance(g, np.ndarray) and g.size >= 1):
            raise InvalidArgumentError("ln gain: expected a float32 vector")
        n = g.size
        check(g, "ln gain", np.float32, n)
        check(beta, "ln bias", np.float32, n)
        flags = FL_ROWS
        if embed:
            if self.embed is None or self.rtab is None:
                raise InvalidArgumentError("rows_layernorm(embed=True): set_embedding() and row_table() first")
            if n != self.embed[0].shape[1]:
                raise InvalidArgumentError(f"rows_layernorm(embed=True): {n} inputs, the embedding has "
                                           f"{self.embed[0].shape[1]}")
            flags |= PRO_EMBED
        f = dict(ldx=self._rows(x, "x", n, writable=embed), ldy=self._rows(y, "y", n, writable=True), x=addr(x),
                 y=addr(y), g=self._ptr(g), beta=self._ptr(beta), n_in=n)
        if embed and np.may_share_memory(x, y):
            raise InvalidArgumentError("y must not overlap x (its embedding rows)")
        return self._add(KIND_ROWLN, flags, 1, chunk, f)

    def rows_quantize(self, x: np.ndarray, xq: np.ndarray, xd: np.ndarray, *, ln=None,
                      chunk: int | None = None) -> int:
        """The q8_0 activation quantizer over the rows t < n_tok of a run (rows are the items): xq[t], xd[t]
        = quantize(X[t]) -- or of layernorm(X[t]) with ln = (gain, bias) [n] (into the thread's private
        h first) -- for the q0 matmul that reads them; x float32 [R][>= n], xq int8 [R][>= n], xd float32
        [R][>= n/32].  n = the gain's length with ln, else x's row length (a multiple of 32)."""
        fns = getattr(self.k, "q0_fns", None)
        if not fns:
            raise KernelUnavailableError(f"the {self.k.family} family runs no q8_0 / q4_0 plan jobs in this library")
        flags, f = FL_ROWS, {}
        if ln is not None:
            if not (isinstance(ln, tuple) and len(ln) == 2 and isinstance(ln[0], np.ndarray) and ln[0].size >= 1):
                raise InvalidArgumentError("ln: expected (gain, bias) float32 vectors")
            n = ln[0].size
            check(ln[0], "ln gain", np.float32, n)
            check(ln[1], "ln bias", np.float32, n)
            self.priv_h = max(self.priv_h, n)
            flags |= PRO_LN
            f.update(g=self._ptr(ln[0]), beta=self._ptr(ln[1]))
        else:
            if not (isinstance(x, np.ndarray) and x.ndim == 2):
                raise InvalidArgumentError("x: expected float32 rows [R][n]")
            n = x.shape[1]
        if not (is_int(n) and 0 < n <= 1 << 15 and n % Q0_QK == 0):
            raise InvalidArgumentError(f"rows_quantize: the row length must be a multiple of {Q0_QK} up to "
                                       f"{1 << 15}, got {n}")
        f.update(ldx=self._rows(x, "x", n), ldy=self._rows(xq, "xq", n, writable=True, dtype=np.int8),
                 ldd=self._rows(xd, "xd", n // Q0_QK, writable=True), x=addr(x), y=addr(xq), xd=addr(xd),
                 n_in=n, qfn=fns["quantize"])
        if np.may_share_memory(x, xq) or np.may_share_memory(x, xd) or np.may_share_memory(xq, xd):
            raise InvalidArgumentError("x, xq and xd must not overlap")
        return self._add(KIND_ROWQUANT, flags, 1, chunk, f)

    def rows_attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, *,
                       chunk: int | None = None) -> int:
        """For the rows t < n_tok of a run at positions pos + t: out[t] = attention of the query row
        q[t] over cache positions 0 .. pos + t (items: head x row pairs); q, out [R][>= 64 H]."""
        H, n_ctx = check_cache(k, v)
        kvflag = self._kv16(k, 0)
        f = dict(ldx=self._rows(q, "q", H * HEAD_DIM), ldy=self._rows(out, "out", H * HEAD_DIM, writable=True),
                 y=addr(q), a0=self._ptr(k), a1=self._ptr(v), a2=addr(out), a3=n_ctx * HEAD_DIM)
        if np.may_share_memory(q, out):
            raise InvalidArgumentError("out must not overlap q")
        self._limit_pos(n_ctx)
        self.priv_s = max(self.priv_s, ROWATTN_ROWS * (-(-n_ctx // 16) * 16))     # a score row per query row
        return self._add(KIND_ROWATTN, FL_ROWS | kvflag, H, chunk, f)

    # -- batched decode: row jobs over the rows of a row table (set_batch) ----------------------------

    def row_table(self, rows: int, caches: tuple, dtype) -> None:
        """A row table of `rows` entries (the most rows of a run): row t of a run is one sequence's next
        token, at its own position, with its own caches k, v [n_layer][H][n_ctx][64] of dtype (float32 or
        float16); caches = (n_layer, H, n_ctx).  set_batch fills it before each run."""
        if self.rtab is not None:
            raise InvalidArgumentError("one row table per plan")
        if not (is_int(rows) and 1 <= rows <= 1 << 20):
            raise InvalidArgumentError(f"rows must be in 1..{1 << 20}, got {shown(rows)}")
        if not (isinstance(caches, tuple) and len(caches) == 3 and all(is_int(c) and c >= 1 for c in caches)):
            raise InvalidArgumentError(f"caches: expected (n_layer, H, n_ctx), got {shown(caches)}")
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise InvalidArgumentError(f"cache dtype {dtype}: expected float32 or float16")
        self.rtab = aligned_bytes(RT_SIZE * rows)
        self._rt = self.rtab.view(np.uint64).reshape(rows, RT_SIZE // 8)
        self.cache_shape, self.cache_dtype = tuple(int(c) for c in caches) + (HEAD_DIM,), dtype
        self._limit_rows(rows)
        self._limit_pos(int(caches[2]))

    def batch_attention(self, qkv: np.ndarray, out: np.ndarray, layer: int, *, chunk: int | None = None) -> int:
        """Per row t of a run and head h (the items, row-major): row t's new key and value (qkv[t], the
        c_attn outputs q | k | v [>= 3 * 64 H]) into its caches' layer `layer` at pos_t (binary16 caches:
        rounded to nearest even), then out[t]_h = the attention of q[t]_h over its positions 0 .. pos_t."""
        if self.rtab is None:
            raise InvalidArgumentError("batch_attention: row_table() first")
        L, H, n_ctx, _ = self.cache_shape
        if not (is_int(layer) and 0 <= layer < L):
            raise InvalidArgumentError(f"layer must be in 0..{L - 1}, got {shown(layer)}")
        f = dict(ldx=self._rows(qkv, "qkv", 3 * H * HEAD_DIM), ldy=self._rows(out, "out", H * HEAD_DIM, writable=True),
                 x=addr(qkv), y=addr(out), a3=n_ctx * HEAD_DIM)
        if np.may_share_memory(qkv, out):
            raise InvalidArgumentError("out must not overlap qkv")
        f["a0"] = f["a1"] = layer * H * n_ctx * HEAD_DIM * self.cache_dtype.itemsize    # the layer, in bytes
        self.priv_s = max(self.priv_s, H * (-(-n_ctx // 16) * 16))                       # a score row per head
        return self._add(KIND_BATTN, FL_ROWS | (FL_KV16 if self.cache_dtype == np.float16 else 0), H, chunk, f)

    def rows_argmax(self, x: np.ndarray, n: int, *, chunk: int | None = None) -> int:
        """Per row t of a run (the items): the first maximum of x[t][0 .. n) into the row table, for
        batch_argmax() (None where one of them is NaN or infinite)."""
        if self.rtab is None:
            raise InvalidArgumentError("rows_argmax: row_table() first")
        if not (is_int(n) and 1 <= n < 1 << 31):
            raise InvalidArgumentError(f"rows_argmax: n must be in 1..2^31-1, got {shown(n)}")
        f = dict(ldx=self._rows(x, "x", int(n)), x=addr(x), n_in=int(n))
        return self._add(KIND_ROWARGMAX, FL_ROWS, 1, chunk, f)

    def set_batch(self, tokens, positions, ks, vs) -> None:
        """The rows of the next run: row t = tokens[t] at positions[t] with caches ks[t], vs[t] (the
        shape and dtype of row_table's, every cache distinct from the others; 1 <= rows <= the plan's).
        Everything is checked before the table is written."""
        if self.buf is None or self.rtab is None:
            raise InvalidArgumentError("set_batch: a built plan with a row table is needed")
        B = len(tokens)
        if not (1 <= B <= min(self.max_rows, len(self._rt))):
            raise InvalidArgumentError(f"rows per run must be in 1..{min(self.max_rows, len(self._rt))}, got {B}")
        if not len(positions) == len(ks) == len(vs) == B:
            raise InvalidArgumentError("set_batch: one position and one k / v cache per token")
        toks = [token_id(t, self.max_token if self.max_token is not None else 1 << 62) for t in tokens]
        pos = [integer("position", p, 0, self.max_pos - 1) for p in positions]
        shape, dt, nbytes = self.cache_shape, self.cache_dtype, int(np.prod(self.cache_shape)) * self.cache_dtype.itemsize
        ka, va = [], []
        for t, (k, v) in enumerate(zip(ks, vs)):
            for name, a, out in (("k", k, ka), ("v", v, va)):
                if not (type(a) is np.ndarray and a.dtype == dt and a.shape == shape and a.flags.c_contiguous
                        and a.flags.writeable):
                    check(a, f"row {t}: {name}", dt, writable=True)           # the precise error, if any
                    raise InvalidArgumentError(f"row {t}: {name} cache of shape {getattr(a, 'shape', None)}, "
                                               f"expected {shape}")
                out.append(a.__array_interface__["data"][0])
        spans = sorted(ka + va)
        if any(b - a < nbytes for a, b in zip(spans, spans[1:])):
            raise InvalidArgumentError("set_batch: two rows share a cache (every row needs its own State)")
        rt = self._rt
        rt[:B, _RT["token"]] = toks
        rt[:B, _RT["pos"]] = pos
        rt[:B, _RT["k"]] = ka
        rt[:B, _RT["v"]] = va
        rt[:B, _RT["argmax"]] = SIZE_MAX                    # until ROWARGMAX writes it
        self._batch_keep = (list(ks), list(vs))
        self.n_batch = B
        self._step[_H["n_tok"]] = B

    def batch_argmax(self) -> list[int | None]:
        """After a run of set_batch's rows that included the rows_argmax job: per row the index of the
        first maximum (None if one of its outputs is NaN or ±inf) -- what Plan.step's first_max() gives
        for that row's step alone."""
        if self._rt is None or not self.n_batch:
            raise InvalidArgumentError("batch_argmax: set_batch() and a run first")
        out = []
        for m in self._rt[:self.n_batch, _RT["argmax"]].tolist():
            if m == SIZE_MAX:
                raise LibraryError("the rows_argmax job left no result (was it run?)")
            out.append(None if m == SIZE_MAX - 1 else m)
        return out
