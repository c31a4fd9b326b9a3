"""The plan encoder: the job records of gpt2asm_plan_run_<family> (docs/kernels.md, "Thread pool and plans").

A Plan is a list of jobs for one Kernels object, laid out by build() as the records the library's
executor runs in one call.  Every array a job points at is validated when the job is added and kept
alive by the plan; the per-step token and position (set_step, step) and the per-run rows (set_rows) are
checked against the limits the jobs imply.

Job ranges are named, never counted: `with plan.span("layer"): ...` records the range of the jobs added
inside it under that name (plan.spans["layer"][i] is a `range` of job indices), and callers run such
ranges (plan.run(range)) -- so adding a job to a layer changes no index arithmetic anywhere.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from .args import integer, token_id
from .errors import InvalidArgumentError, KernelUnavailableError, LibraryError, shown
from .plan_rows import RowJobs
from .validate import (HEAD_DIM, Q0_QK, Q0_RECORD, Q0_UNIT, SIZE_MAX, TILE, addr, aligned_bytes, check, check_attention,
                       check_cache, check_matrix, check_q0_matrix, is_int)

if TYPE_CHECKING:
    from .kernels import Kernels

# --------------------------------------------------------------------------------------------------
# the record layout shared with asm/x86_64/plan_x86.S and asm/aarch64/plan_aarch64.S

# every offset, size, kind and flag comes from asm/plan_abi.h, through its Python mirror
from . import plan_abi as _abi                                                      # noqa: E402
# (the flags and kinds of the row jobs too: the encoder's names, as tests/test_plan_abi.py reads them)
from .plan_abi import (CTX_NTHREADS, CTX_PARKS, CTX_SEQ, CTX_SEQ_SLEEPERS, CTX_SPIN, CTX_YIELD,  # noqa: E402,F401
                       EPI_ARGMAX, EPI_GELU, EPI_RESID, FL_F16, FL_KV, FL_KV16, FL_Q0, FL_ROWS, KIND_ATTN,
                       KIND_BATTN, KIND_MATMUL, KIND_MATVEC, KIND_QKV, KIND_ROWARGMAX, KIND_ROWATTN, KIND_ROWLN,
                       KIND_ROWQUANT, PRO_EMBED, PRO_LN, ROWATTN_ROWS)
POOL_BYTES = _abi.POOL_SIZE
PLAN_HEADER = _abi.PL_HEADER
JOB_BYTES = _abi.J_SIZE
ARGMAX_CHUNK = 16             # tiles per claim of an ARGMAX job: its outputs are scanned while in cache
_J = _abi.JOB_U64             # u64 slots of a job record (byte offset / 8), by field
_H = _abi.HEADER_U64          # u64 slots of the plan header
# weight dtypes of the tiled matrices -> the job's dtype flag
_WDTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): FL_F16}


def _claims(n_items: int, threads: int, family: str) -> tuple[int, int]:
    """(chunk, guided shift) of a job: one claim of everything for one thread; otherwise guided claims of
    max(chunk, remaining >> shift) items -- large contiguous claims first, single items (pairs of tiles
    for AVX-512, whose matvec takes them two at a time) at the end, so that the threads finish a job
    together.  (Measured on the 2-core CI machine: within noise of fixed claims of 1 or 2 items.)"""
    if threads == 1:
        return n_items, 0
    small = 2 if family == "avx512" and n_items >= 8 * threads else 1
    return small, (2 * threads - 1).bit_length()


def _row_claims(threads: int) -> tuple[int, int]:
    """(chunk, guided shift) of a row job, whose item count is known only per run: one claim of
    everything for one thread, otherwise guided claims down to single items."""
    return (1 << 32, 0) if threads == 1 else (1, (2 * threads - 1).bit_length())


class Plan(RowJobs):
    """A list of jobs for one Kernels object, run by Plan.run / Plan.step in one call into the library.

    Every array a job points at is validated here (dtype, contiguity, size, alignment where required)
    and kept alive by the plan; the per-step parameters (token, position) are checked by set_step.
    Build: add jobs (matvec, qkv_attention, attention, the row jobs; q8_0 / q4_0 records run the q0 jobs,
    their prefill rows quantized by rows_quantize), grouped into named spans, then
    build(); a built plan is immutable apart from set_step / set_rows.
    """

    def __init__(self, kernels: "Kernels"):
        self.k = kernels
        self.jobs: list[tuple[int, int, dict]] = []
        self.keep: list[np.ndarray] = []
        self.priv_h = self.priv_e = self.priv_s = self.priv_kv = 0    # floats per thread
        self.priv_q = 0                                      # bytes per thread: Q0 MATVEC / QKV's xq + xd
        self.embed: tuple | None = None                      # (wte, wpe, x)
        self.max_pos: int | None = None                      # positions < max_pos are valid
        self.max_token: int | None = None
        self.max_rows: int | None = None                     # row jobs: rows per run (set_rows)
        self.buf: np.ndarray | None = None
        self.addr = self.n_jobs = 0
        self.argmax_job: int | None = None
        self._slots: np.ndarray | None = None                # ARGMAX: per thread {u64 index, f32, u32 bad}
        self._slot_views: list[tuple] = []                   # ... and ctypes views of them
        self._max: int | None = None                         # gpt2asm_plan_step's reduction of the slots
        self.spans: dict[str, list[range]] = {}              # name -> the job ranges of span(name)
        self.rtab: np.ndarray | None = None                  # batched decode: the row table (row_table)
        self._rt: np.ndarray | None = None                   # ... as uint64 [rows][RT_SIZE / 8]
        self.cache_shape: tuple | None = None                # ... the caches its rows point at
        self.cache_dtype = None
        self.n_batch = 0                                     # rows of the last set_batch
        self._batch_keep: tuple = ()                         # ... and their caches, alive during the run

    # -- building -----------------------------------------------------------------------------------

    @contextmanager
    def span(self, name: str):
        """Name the jobs added inside the with-block: appends their range to self.spans[name]."""
        start = len(self.jobs)
        yield
        self.spans.setdefault(name, []).append(range(start, len(self.jobs)))

    def _limit_pos(self, n: int) -> None:
        self.max_pos = n if self.max_pos is None else min(self.max_pos, n)

    def _limit_rows(self, n: int) -> None:
        self.max_rows = n if self.max_rows is None else min(self.max_rows, n)

    def _ptr(self, a: np.ndarray) -> int:
        self.keep.append(a)
        return addr(a)

    def _prologue(self, ln, embed: bool, n_in: int, x) -> tuple[int, dict]:
        """Flags and fields of an optional LayerNorm (+ embedding) prologue feeding n_in inputs."""
        if ln is None:
            if embed:
                raise InvalidArgumentError("the embedding prologue needs a LayerNorm")
            check(x, "x", np.float32, n_in)
            return 0, dict(x=self._ptr(x))
        src, g, beta = ln
        check(src, "ln source", np.float32, n_in, writable=embed)
        check(g, "ln gain", np.float32, n_in)
        check(beta, "ln bias", np.float32, n_in)
        self.priv_h = max(self.priv_h, n_in)
        flags = PRO_LN
        if embed:
            if self.embed is None:
                raise InvalidArgumentError("set_embedding() first")
            if self.embed[2] is None or src is not self.embed[2]:
                raise InvalidArgumentError("the embedding prologue normalises the residual stream it fills")
            flags |= PRO_EMBED
            self.priv_e = max(self.priv_e, n_in)
        return flags, dict(x=self._ptr(src), g=self._ptr(g), beta=self._ptr(beta))

    def set_embedding(self, wte: np.ndarray, wpe: np.ndarray, x: np.ndarray | None) -> None:
        """The embedding add x = wte[token] + wpe[pos] of the EMBED prologue (wte [V][C], wpe [n_ctx][C]);
        x None: no step residual stream (a batched decode plan, whose rows embed with rows_layernorm)."""
        if not (isinstance(wte, np.ndarray) and wte.ndim == 2 and isinstance(wpe, np.ndarray) and wpe.ndim == 2
                and wte.shape[1] == wpe.shape[1]):
            raise InvalidArgumentError("wte, wpe: expected [V][C] and [n_ctx][C]")
        C = wte.shape[1]
        if C < 16 or C % 16:
            raise InvalidArgumentError(f"embedding width {C} must be a positive multiple of 16")
        check(wte, "wte", np.float32)
        check(wpe, "wpe", np.float32)
        if x is not None:
            check(x, "x", np.float32, C, writable=True)
            self.keep.append(x)
        self.embed = (wte, wpe, x)
        self.max_token = wte.shape[0]
        self._limit_pos(wpe.shape[0])
        self.keep += [wte, wpe]

    def _weights(self, w, n_tiles: int | None = None, op: str = "matvec") -> tuple[int, int, int, dict]:
        """A job's tiled weights: (n_tiles, n_in, dtype flag, record fields).  q8_0 /
        q4_0 / q6_k records (uint8 [n_tiles][n_in/UNIT][RECORD]): FL_Q0, and the addresses of the quantizer and of
        the variant's `op` kernel ("matvec" or "matmul") for them, from Kernels.q0_fns -- never the caller's."""
        if isinstance(w, np.ndarray) and w.dtype == np.uint8:
            n_tiles, n_in, kind = check_q0_matrix(w, "w", n_tiles)
            fns = getattr(self.k, "q0_fns", None)
            if not fns:
                raise KernelUnavailableError(f"the {self.k.family} family runs no q8_0 / q4_0 plan jobs in "
                                             f"this library")
            return n_tiles, n_in, FL_Q0, dict(w=self._ptr(w), n_in=n_in, qfn=fns["quantize"],
                                              fn=fns[f"{op}_{kind}"],
                                              tile_bytes=n_in // Q0_UNIT[kind] * Q0_RECORD[kind])
        n_tiles, n_in, dtype = check_matrix(w, "w", n_tiles)
        f = dict(w=self._ptr(w), n_in=n_in, tile_bytes=n_in * TILE * w.itemsize)
        if op == "matmul":                                 # the family's float matmul variant for this CPU
            fn = getattr(self.k, "matmul_fn", {}).get("f16" if w.dtype == np.float16 else "f32", 0)
            if fn:
                f["fn"] = fn
        return n_tiles, n_in, _WDTYPES[dtype], f

    def matvec(self, w: np.ndarray, x: np.ndarray | None, b: np.ndarray | None, y: np.ndarray, *,
               ln=None, embed: bool = False, gelu: bool = False,
               resid: np.ndarray | None = None, argmax: int | None = None, chunk: int | None = None) -> int:
        """y = W in + b over the tiles of w (float32, float16, or q8_0 / q4_0 records),
        in = x or LayerNorm(ln = (source, gain, bias)) (after the embedding add if embed); then y = gelu(y),
        or resid += y (the residual add), or (argmax = n, one job per plan) the first maximum of y[0..n)
        for first_max() (claims of ARGMAX_CHUNK tiles, scanned while in cache).  Returns the job index."""
        n_tiles, n_in, wflag, wf = self._weights(w)
        flags, f = self._prologue(ln, embed, n_in, x)
        check(y, "y", np.float32, n_tiles * TILE, writable=True)
        if b is not None:
            check(b, "b", np.float32, n_tiles * TILE)
        if (gelu, resid is not None, argmax is not None).count(True) > 1:
            raise InvalidArgumentError("one epilogue per job")
        if gelu:
            flags |= EPI_GELU
        if resid is not None:
            check(resid, "resid", np.float32, n_tiles * TILE, writable=True)
            flags |= EPI_RESID
            f["a0"] = self._ptr(resid)
        if argmax is not None:
            if not (is_int(argmax) and TILE * (n_tiles - 1) < argmax <= TILE * n_tiles < 1 << 31):
                raise InvalidArgumentError(f"argmax: the outputs scanned must be in ({TILE * (n_tiles - 1)}, "
                                           f"{TILE * n_tiles}], below 2^31; got {shown(argmax)}")
            if self.argmax_job is not None:
                raise InvalidArgumentError("one argmax job per plan")
            flags |= EPI_ARGMAX
            sz, sf = _abi.ARGMAX_SLOT, _abi.ARGMAX_SLOT_FIELDS
            slots = self._slots = aligned_bytes(sz * self.k.threads)
            self._slot_views = [(ctypes.c_uint64.from_buffer(slots, sz * t + sf["index"].offset),
                                 ctypes.c_float.from_buffer(slots, sz * t + sf["value"].offset),
                                 ctypes.c_uint32.from_buffer(slots, sz * t + sf["bad"].offset))
                                for t in range(self.k.threads)]
            f.update(a0=self._ptr(slots), a1=int(argmax))
            chunk = ARGMAX_CHUNK if chunk is None else chunk
        f.update(wf, b=0 if b is None else self._ptr(b), y=self._ptr(y))
        self._q0_input(wflag, n_in)
        job = self._add(KIND_MATVEC, flags | wflag, n_tiles, chunk, f)
        if argmax is not None:
            self.argmax_job = job
        return job

    def qkv_attention(self, w: np.ndarray, b: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                      out: np.ndarray, *, ln, embed: bool = False) -> int:
        """One transformer block's attention half for the token at the header's position pos: per head h
        (the work items), tiles h, H+h, 2H+h of the c_attn matvec on
        LayerNorm(ln) give q_h (into q), k_h and v_h (straight into the caches k, v [H][n_ctx][64] at
        pos); then the attention of head h over positions 0..pos into out."""
        H, n_ctx = check_cache(k, v, writable=True)
        kvflag = self._kv16(k, 1)
        _, n_in, wflag, wf = self._weights(w, 3 * H)
        check(b, "b", np.float32, 3 * H * TILE)
        check(q, "q", np.float32, 3 * H * TILE, writable=True)
        check(out, "out", np.float32, H * HEAD_DIM, writable=True)
        flags, f = self._prologue(ln, embed, n_in, None)
        self._limit_pos(n_ctx)
        self.priv_s = max(self.priv_s, H * (-(-n_ctx // 16) * 16))        # a score row per head
        f.update(wf, b=self._ptr(b), y=self._ptr(q), a0=self._ptr(k), a1=self._ptr(v), a2=self._ptr(out),
                 a3=n_ctx * HEAD_DIM)
        self._q0_input(wflag, n_in)
        return self._add(KIND_QKV, flags | wflag | kvflag, H, None, f)

    def _q0_input(self, wflag: int, n_in: int) -> None:
        """A Q0 MATVEC / QKV quantizes its input into each thread's private area: xq [n_in] int8, then xd
        [n_in/32] float32 (the job's `xd`: the area's offset, set by build())."""
        if wflag == FL_Q0:
            self.priv_q = max(self.priv_q, n_in + 4 * (n_in // Q0_QK))

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, n_pos: int) -> int:
        """Attention of q [H*64] over positions 0..n_pos-1 of k, v [H][n_ctx][64] into out; heads are the items."""
        H, n_ctx = check_attention(q, k, v, n_pos)
        kvflag = self._kv16(k, 0)
        check(out, "out", np.float32, H * HEAD_DIM, writable=True)
        self.priv_s = max(self.priv_s, H * (-(-int(n_pos) // 16) * 16))   # a score row per head
        f = dict(y=self._ptr(q), a0=self._ptr(k), a1=self._ptr(v), a2=self._ptr(out), a3=n_ctx * HEAD_DIM,
                 a4=int(n_pos))
        return self._add(KIND_ATTN, kvflag, H, None, f)

    def _kv16(self, k: np.ndarray, rows: int) -> int:
        """The cache flag of a job over cache k: FL_KV16 for a binary16 cache, whose k / v rows the job
        first writes to `rows` float32 staging rows of 64 (a private area's) -- else 0."""
        if k.dtype != np.float16:
            return 0
        self.priv_kv = max(self.priv_kv, rows * HEAD_DIM)
        return FL_KV16

    def _add(self, kind: int, flags: int, n_items: int, chunk: int | None, fields: dict) -> int:
        if self.buf is not None:
            raise InvalidArgumentError("the plan is built already")
        shift = 0
        if chunk is None:
            chunk, shift = (_row_claims(self.k.threads) if flags & FL_ROWS or kind == KIND_MATMUL else
                            _claims(n_items, self.k.threads, self.k.family))
        if not is_int(chunk) or not 1 <= chunk:
            raise InvalidArgumentError(f"chunk must be ≥ 1, got {chunk}")
        flags |= shift << _abi.B_CLAIM_SHIFT
        self.jobs.append((kind, flags, dict(fields, n=n_items, chunk=chunk)))
        return len(self.jobs) - 1

    def build(self) -> "Plan":
        """Lay the records out (header, private areas per thread, jobs); returns self."""
        if self.buf is not None:
            return self
        if not self.jobs:
            raise InvalidArgumentError("a plan needs at least one job")
        n = len(self.jobs)
        buf = aligned_bytes(PLAN_HEADER + JOB_BYTES * n)
        u64 = buf.view(np.uint64)
        u32 = buf.view(np.uint32)
        r16 = lambda f: -(-f // 16) * 16                         # noqa: E731  floats -> 64-byte multiple
        h_off, e_off = 0, 4 * r16(self.priv_h)
        s_off = e_off + 4 * r16(self.priv_e)
        kv_off = s_off + 4 * r16(self.priv_s)
        q_off = kv_off + 4 * r16(self.priv_kv)                   # Q0 MATVEC / QKV: xq, then xd (bytes)
        stride = max(64, q_off + -(-self.priv_q // 64) * 64)
        self.priv = aligned_bytes(stride * self.k.threads)
        hdr = dict(n_jobs=n, priv=addr(self.priv), priv_stride=stride, h_off=h_off, e_off=e_off, s_off=s_off,
                   kv_off=kv_off, argmax=0 if self._slots is None else addr(self._slots),
                   rtab=0 if self.rtab is None else addr(self.rtab))
        if self.embed is not None:
            wte, wpe, x = self.embed
            hdr.update(C=wte.shape[1], wte=addr(wte), wpe=addr(wpe), x=0 if x is None else addr(x))
        for key, val in hdr.items():
            u64[_H[key]] = val
        for j, (kind, flags, fields) in enumerate(self.jobs):
            base = (PLAN_HEADER + JOB_BYTES * j) // 8
            u32[2 * base + _abi.J_KIND // 4], u32[2 * base + _abi.J_FLAGS // 4] = kind, flags
            for key, val in fields.items():
                u64[base + _J[key]] = val
            if flags & FL_Q0 and kind in (KIND_MATVEC, KIND_QKV):
                u64[base + _J["xd"]] = q_off                     # the private quantized input
        self.buf, self.addr, self.n_jobs = buf, addr(buf), n
        self._step = u64[:PLAN_HEADER // 8]
        return self

    def __len__(self) -> int:
        return len(self.jobs)

    def first_max(self) -> int | None:
        """After a run that included the argmax job: the index of the first maximum of its outputs
        (numpy.argmax), or None if any of them is NaN or ±inf -- what Kernels.argmax gives on them.
        (Read through ctypes views of the slots, made with the plan: this runs after every step, on
        caches the weights have flushed, where each numpy call costs microseconds.)"""
        if self.argmax_job is None:
            raise InvalidArgumentError("the plan has no argmax job")
        m = self._max
        if m is not None:                              # reduced by gpt2asm_plan_step (Plan.step)
            if m == SIZE_MAX:
                raise LibraryError("the argmax job left no result")
            return None if m == SIZE_MAX - 1 else m
        best = bv = None
        for i, v, bad in self._slot_views:
            if bad.value:
                return None
            i = i.value
            if i != SIZE_MAX and (best is None or v.value > bv or (v.value == bv and i < best)):
                best, bv = i, v.value
        if best is None:
            raise LibraryError("the argmax job left no result (was it run?)")
        return best

    def check_step(self, token: int, pos: int) -> None:
        """InvalidArgumentError unless token and pos are integers within the plan's limits (args.py)."""
        token_id(token, self.max_token if self.max_token is not None else 1 << 62)
        integer("position", pos, 0, (self.max_pos if self.max_pos is not None else 1 << 62) - 1)

    def set_step(self, token: int, pos: int) -> None:
        """The per-step parameters read by the EMBED prologue (token, pos) and the QKV jobs (pos)."""
        self.check_step(token, pos)
        self._step[_H["token"]] = token
        self._step[_H["pos"]] = pos

    def _built(self, who: str) -> None:
        if self.buf is None:
            raise InvalidArgumentError(f"{who}: a built plan is needed")

    def run(self, jobs: range | None = None) -> None:
        """Run the jobs of a range (default all; e.g. a span or a union of spans) with every thread of the
        pool, one job at a time (gpt2asm_plan_run_<isa>)."""
        self._built("run")
        jobs = range(self.n_jobs) if jobs is None else jobs
        if not (isinstance(jobs, range) and jobs.step == 1 and 0 <= jobs.start <= jobs.stop <= self.n_jobs):
            raise InvalidArgumentError(f"run: jobs {shown(jobs)} outside 0..{self.n_jobs}")
        self._max = None                                # first_max() reads the slots
        self.k.execute(self.addr, jobs.start, jobs.stop)

    def step(self, token: int, pos: int) -> None:
        """set_step(token, pos) and a run of every job, in one call into the library
        (gpt2asm_plan_step_<isa>), which also reduces the argmax job's per-thread slots for first_max().
        A decode step's Python is mostly cache misses (the weights have just streamed through every
        cache): each numpy or ctypes operation saved here saves microseconds per token."""
        self._built("step")
        self.check_step(token, pos)
        self._max = None
        self._max = self.k.execute_step(self.addr, token, pos)

    def set_rows(self, n_tok: int, pos: int) -> None:
        """The per-run parameters of the row jobs: n_tok rows, the tokens at positions pos .. pos+n_tok-1
        (1 <= n_tok <= the rows of every row buffer; pos + n_tok <= n_ctx of every cache)."""
        if self.buf is None or self.max_rows is None:
            raise InvalidArgumentError("set_rows: a built plan with row jobs is needed")
        if self.rtab is not None:
            raise InvalidArgumentError("set_rows: a batched decode plan takes its rows from set_batch")
        if not (is_int(n_tok) and 1 <= n_tok <= self.max_rows):
            raise InvalidArgumentError(f"rows per run must be in 1..{self.max_rows}, got {shown(n_tok)}")
        limit = self.max_pos if self.max_pos is not None else 1 << 62
        if not (is_int(pos) and 0 <= pos and pos + n_tok <= limit):
            raise InvalidArgumentError(f"positions {shown(pos)} .. +{n_tok} outside 0..{limit - 1}")
        self._step[_H["pos"]] = pos
        self._step[_H["n_tok"]] = n_tok
