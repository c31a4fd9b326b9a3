"""The kernels of one family bound through ctypes, and their checked numpy API (kernels_api.py).

    Kernels(family, threads)   binds gpt2asm_<op>_<family> (KERNELS, EXECUTOR below: each with its C
                               prototype), starts the library's -j worker threads, and offers
      .matvec .matmul .attention .layernorm .gelu .expf .softmax .argmax
                               numpy in, numpy out, every argument validated (validate.py) first
      .new_plan()              a Plan (plan.py) of jobs run by the library's executor in one call
      .matvec_job ... .run     the per-call path over prevalidated addresses (a family without an
                               executor, the test oracles of tests/oracle.py)

The assembly trusts its arguments, so everything that reaches it passes through here or plan.py first.
With -j N the library's own worker threads (gpt2asm_worker_<family>) are started once and stay inside
the library, parked between plans, until close().  docs/kernels.md documents each symbol and record.
Loading the library: lib.py; choosing the family by CPU probing: cpu.py; the Python pool: pool.py.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import threading
import weakref
from ctypes import c_size_t, c_void_p

import numpy as np

from .cpu import choose_family
from .errors import InvalidArgumentError, KernelUnavailableError, LibraryError, ResourceError, shown
from .kernels_api import CheckedOps
from .lib import ARCH, bind, load_library
from .plan import CTX_NTHREADS, CTX_PARKS, CTX_SEQ, CTX_SEQ_SLEEPERS, CTX_SPIN, CTX_YIELD, POOL_BYTES, Plan
from .pool import Pool, split, start_thread, thread_refused
from .validate import addr, aligned_bytes

# a family that lacks an op takes it from this one (sme2 has only the f32 / f16 matrix-vector and the matmul kernels)
FAMILY_FALLBACK = {"sme2": "neon"}
# single ops one family takes from another (the binary16-cache attention of avx2 serves avx512 too)
SHARED_OPS = {("avx512", "attention_f16"): "avx2"}

P, N = c_void_p, c_size_t
# The kernels, bound as attribute <op> from gpt2asm_<op>_<family> (or the family's fallback's):
# op -> (argument types, return type).
KERNELS = {
    # void gpt2asm_matvec_f32_<isa>(const float *w, const float *x, const float *b, float *y,
    #                               size_t n_in, size_t tile_begin, size_t tile_end);
    "matvec_f32": ([P, P, P, P, N, N, N], None),
    # void gpt2asm_matvec_f16_<isa>(const uint16_t *w, const float *x, const float *b, float *y,
    #                               size_t n_in, size_t tile_begin, size_t tile_end);
    "matvec_f16": ([P, P, P, P, N, N, N], None),
    # void gpt2asm_matmul_f32_<isa>(const float *w, const float *x, size_t ldx, const float *b, float *y,
    #                               size_t ldy, size_t n_tokens, size_t n_in, size_t tile_begin, size_t tile_end);
    "matmul_f32": ([P, P, N, P, P, N, N, N, N, N], None),
    # void gpt2asm_matmul_f16_<isa>(const uint16_t *w, <the same>);
    "matmul_f16": ([P, P, N, P, P, N, N, N, N, N], None),
    # void gpt2asm_layernorm_f32_<isa>(const float *x, const float *g, const float *b, float *y, size_t n);
    "layernorm_f32": ([P, P, P, P, N], None),
    # void gpt2asm_gelu_f32_<isa>(const float *x, float *y, size_t n);
    "gelu_f32": ([P, P, N], None),
    # void gpt2asm_expf_f32_<isa>(const float *x, float *y, size_t n);
    "expf_f32": ([P, P, N], None),
    # void gpt2asm_softmax_f32_<isa>(const float *x, float *y, size_t n);
    "softmax_f32": ([P, P, N], None),
    # void gpt2asm_attention_f32_<isa>(const float *q, const float *k, const float *v, float *out,
    #                                  float *scratch, size_t n_pos, size_t head_stride,
    #                                  size_t head_begin, size_t head_end);
    "attention_f32": ([P, P, P, P, P, N, N, N, N], None),
    # void gpt2asm_attention_f16_<isa>(const float *q, const uint16_t *k, const uint16_t *v, float *out,
    #                                  float *scratch, size_t n_pos, size_t head_stride,
    #                                  size_t head_begin, size_t head_end);   (a binary16 cache; avx512
    #                                  uses avx2's, sme2 neon's)
    "attention_f16": ([P, P, P, P, P, N, N, N, N], None),
    # size_t gpt2asm_argmax_f32_<isa>(const float *x, size_t n);   (SIZE_MAX: a NaN or +-inf in x)
    "argmax_f32": ([P, N], c_size_t),
}
# Optional kernels: a family without them binds None (has_matmul False, both or none: prompts are
# prefilled by cached steps).
OPTIONAL = {"matmul_f32", "matmul_f16"}
# The families whose plan executor runs the batched decode kinds (BATTN, ROWARGMAX, ROWLN with EMBED:
# docs/kernels.md "Batched decode"); has_batch, with the plan and the matmul kernels.  (Until a family's
# executor has them its jump table sends them to the guard entry: step_batch steps its rows one by one.)
BATCH_FAMILIES = ("avx2", "avx512", "neon", "sme2")
# The plan executor, bound from gpt2asm_<op>_<family> itself (has_plan; no fallback).
EXECUTOR = {
    # void gpt2asm_plan_run_<isa>(pool_t *ctx, plan_t *plan, size_t job_begin, size_t job_end);
    "plan_run": ([P, P, N, N], None),
    # size_t gpt2asm_plan_step_<isa>(pool_t *ctx, plan_t *plan, size_t token, size_t pos);
    "plan_step": ([P, P, N, N], c_size_t),
}
# q8_0 / q4_0 through the plan (FL_Q0 jobs and ROWQUANT, docs/kernels.md "q8_0 / q4_0 jobs"): the
# families whose executor runs them.  A job carries the addresses of the kernel variants chosen for this
# CPU (Kernels.q0_fns), so the executor knows no variant (AArch64: Kernels._q0_symbols picks them).
Q0_PLAN_FAMILIES = ("avx2", "avx512", "neon", "sme2")
# The library's pool (started only with threads > 1):
#   void gpt2asm_worker_<isa>(pool_t *ctx, size_t tid);   returns at gpt2asm_pool_shutdown
WORKER = ([P, N], None)
#   void gpt2asm_pool_shutdown(pool_t *ctx);
POOL_SHUTDOWN = ([P], None)

SPIN_TICKS = 1_000_000        # TSC ticks a waiting thread spins before it parks (~0.4 ms: longer than the
                              # Python gap between two decode steps, so workers stay awake while decoding)
SPIN_TICKS_OVERSUBSCRIBED = 200_000   # ... with more threads than CPUs (~0.1 ms)
# AArch64 (plan_aarch64.S): the same waits in nanoseconds (converted with CNTFRQ_EL0, whose rate varies
# from 24 MHz to 1 GHz between implementations)
SPIN_NS, SPIN_NS_OVERSUBSCRIBED = 400_000, 100_000


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _spin_ticks(threads: int) -> tuple[int, int]:
    """(spin, yield) TSC ticks (AArch64: nanoseconds) of a waiting thread: spin with pause, from `yield`
    on calling sched_yield between rounds, then park.  Yielding from the start costs nothing on an idle
    machine (measured: the same 0.2 us per job barrier at -j 2) and is what keeps -j 2 near -j 1 speed
    when another process competes for the cores (measured with one busy process on 2 cores: 11.8
    ms/token fp16 against 18.2 without yielding, -j 1 10.2); with more threads than CPUs the thread
    waited for may need this very CPU, so the waiter parks sooner."""
    spin, oversubscribed = ((SPIN_NS, SPIN_NS_OVERSUBSCRIBED) if ARCH == "aarch64"
                            else (SPIN_TICKS, SPIN_TICKS_OVERSUBSCRIBED))
    return (spin if threads <= _cpus() else oversubscribed), 0


class Kernels(CheckedOps):
    """One kernel family bound, plus the -j pool.  Methods take numpy arrays and validate them.

    With threads > 1 the library's worker threads (gpt2asm_worker_<family>) are started here and stay
    inside the library, parked between plans, until close()."""

    def __init__(self, family: str | int | None = None, threads: int = 1):
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 256:
            raise InvalidArgumentError(f"threads must be an integer in 1..256, got {shown(threads)}")
        self.lib = load_library()
        self.family = self._choose(family)
        self.threads = threads
        self.pool = None                  # the Python pool (families without a plan executor)
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()     # one plan at a time per pool
        self._restart = self._restart_pool = False   # workers / Python pool to start again (after fork)
        for op, (argtypes, restype) in KERNELS.items():
            name = self._symbol(op)
            fn = None
            if op not in OPTIONAL or hasattr(self.lib, name):
                fn = self._bind(name, argtypes)
                if restype is not None:
                    fn.restype = restype
            setattr(self, op, fn)
        self.has_matmul = all(getattr(self, f"matmul_{d}") is not None for d in ("f32", "f16"))
        self.has_plan = hasattr(self.lib, f"gpt2asm_plan_run_{self.family}")
        self.has_batch = self.has_plan and self.has_matmul and self.family in BATCH_FAMILIES
        for op, (argtypes, restype) in EXECUTOR.items():
            fn = self._bind(f"gpt2asm_{op}_{self.family}", argtypes) if self.has_plan else None
            if fn is not None and restype is not None:
                fn.restype = restype
            setattr(self, op, fn)
        # q8_0 / q4_0 / q6_k: {"quantize", "matvec_<kind>", "matmul_<kind>"} -> address
        self.q0_names = self._q0_symbols() if self.has_plan and self.family in Q0_PLAN_FAMILIES else None
        self.q0_fns = None if self.q0_names is None else {
            k: self._address(name) for k, name in self.q0_names.items()}
        self.has_q8_0 = self.has_q4_0 = self.q0_fns is not None
        # the float MATMUL jobs' kernel variants (J_FN; 0: the family's own): matmul_variant
        self.matmul_fn = {}
        for dt in ("f32", "f16"):
            v = matmul_variant(self.family, dt) if self.has_plan else None
            name = None if v is None else f"gpt2asm_matmul_{dt}_{v}"
            self.matmul_fn[dt] = self._address(name) if name and hasattr(self.lib, name) else 0
        self._new_ctx(threads if self.has_plan else 1)
        if threads > 1:
            if self.has_plan:
                self._start_workers()
            else:
                self.pool = Pool(threads)
        _LIVE.add(self)

    def _symbol(self, op: str) -> str:
        """gpt2asm_<op>_<family>, or the fallback family's symbol when the family lacks the op."""
        fam = SHARED_OPS.get((self.family, op), self.family)
        while not hasattr(self.lib, f"gpt2asm_{op}_{fam}") and fam in FAMILY_FALLBACK:
            fam = FAMILY_FALLBACK[fam]
        return f"gpt2asm_{op}_{fam}"

    def _choose(self, family):
        """The family to bind (a test harness may override this and _bind, e.g. to emulate)."""
        return choose_family(family)

    def _bind(self, name: str, argtypes):
        """A callable for one exported symbol taking integer addresses and sizes (a test harness may
        override it, e.g. to emulate)."""
        return bind(self.lib, name, argtypes)

    def _q0_variant(self) -> str:
        """The q8_0 / q4_0 kernel variant of the family on this CPU (q0kernels.q0_variant: VNNI where the
        CPU has it; $GPT2ASM_Q0_PLAIN=1 forces the plain one).  A test harness may override it."""
        from .q0kernels import q0_variant
        return q0_variant(self.family)

    def _q6k_variant(self) -> str:
        """The q6_k (q4_0 models' head) kernels' variant: x86 avx512vnni where the q0 variant is (the avx512
        family on a CPU with AVX512-VNNI), else avx2; AArch64 neon (the sme2 family too).  Same bits."""
        if ARCH == "aarch64":
            return "neon"
        from .q0kernels import q6k_variant
        return q6k_variant(self._q0_variant())

    def _q0_symbols(self) -> dict[str, str] | None:
        """The q0 kernels the plan jobs call, by job use -> exported symbol; None if the library lacks any.
        x86: the family's variant (_q0_variant) for every op (the matvecs, q6_k's too, in their CPU tuning:
        q0kernels.mv_variant),
        the quantizer of its width.  AArch64 (its
        families are in Q0_PLAN_FAMILIES): neon's quantizer, cpu.q0_isa's best neon variant per
        op ($GPT2ASM_ARM_Q0 caps it), or the sme2 matvec / matmul for the sme2 family (as ArmQ0)."""
        kinds = ("q8_0", "q4_0")
        if ARCH == "aarch64":
            from .cpu import q0_isa
            isa = ({op: "sme2" for op in ("matvec", "matmul")} if self.family == "sme2" else
                   {op: q0_isa(op, self.lib) for op in ("matvec", "matmul")})
            names = {"quantize": "gpt2asm_quantize_q8_0_neon"}
            names.update({f"{op}_{k}": f"gpt2asm_{op}_{k}_{isa[op]}" for op in isa for k in kinds})
            names.update({f"{op}_q6_k": f"gpt2asm_{op}_q6_k_{self._q6k_variant()}" for op in ("matvec", "matmul")})
        else:
            from .q0kernels import mv_variant
            v = self._q0_variant()
            qisa = "avx512" if v.startswith("avx512") else "avx2"
            names = {"quantize": f"gpt2asm_quantize_q8_0_{qisa}"}
            names.update({f"matvec_{k}": f"gpt2asm_matvec_{k}_{mv_variant(v)}" for k in kinds})
            names.update({f"matmul_{k}": f"gpt2asm_matmul_{k}_{v}" for k in kinds})
            q6 = self._q6k_variant()
            names.update({"matvec_q6_k": f"gpt2asm_matvec_q6_k_{mv_variant(q6)}",
                          "matmul_q6_k": f"gpt2asm_matmul_q6_k_{q6}"})
        return names if all(hasattr(self.lib, n) for n in names.values()) else None

    def _address(self, name: str) -> int:
        """The address of an exported function of the library (dlsym: the function itself, never a
        test harness's trampoline), for a plan job to call.  A test harness may override it."""
        return ctypes.addressof(ctypes.c_char.in_dll(self.lib, name))

    # -- the library's pool ---------------------------------------------------------------------------

    def _start_workers(self) -> None:
        """Threads 1..threads-1 of the pool context; if the system refuses one, those started are stopped
        and joined, the context left single-threaded, and ResourceError raised."""
        worker = bind(self.lib, f"gpt2asm_worker_{self.family}", *WORKER)
        self._shutdown = bind(self.lib, "gpt2asm_pool_shutdown", *POOL_SHUTDOWN)
        ctx = addr(self.ctx)
        for tid in range(1, self.threads):
            t = threading.Thread(target=worker, args=(ctx, tid), daemon=True, name=f"gpt2asm-worker-{tid}")
            try:
                start_thread(t)
            except RuntimeError as e:               # "can't start new thread": a thread or memory limit
                self._stop_workers()
                raise thread_refused(self.threads, e) from None
            self._workers.append(t)

    def _stop_workers(self) -> None:
        """Shut down and join the workers started; the context then serves the calling thread alone."""
        if self._workers:
            self._shutdown(addr(self.ctx))
            for t in self._workers:
                t.join()
            self._workers = []
        self._ctx32[CTX_NTHREADS // 4] = 1

    def _ensure_workers(self) -> None:
        """After a fork(), the child's workers are started by its first plan (not in the fork handler,
        where a refused thread could only be ignored, and which every fork of the process pays for)."""
        if self._restart:
            self._restart = False
            self._new_ctx(self.threads)
            try:
                self._start_workers()
            except ResourceError:
                self._restart = True
                raise

    def _new_ctx(self, participants: int) -> None:
        """A zeroed pool_t for `participants` threads (the caller included), its spin times set."""
        self.ctx = aligned_bytes(POOL_BYTES)
        ctx32, ctx64 = self.ctx.view(np.uint32), self.ctx.view(np.uint64)
        ctx32[CTX_NTHREADS // 4] = participants
        ctx64[CTX_SPIN // 8], ctx64[CTX_YIELD // 8] = _spin_ticks(self.threads)
        self._ctx32, self._ctx64 = ctx32, ctx64
        self._ctx_addr = addr(self.ctx)

    def _after_fork(self) -> None:
        """In a fork()ed child: only the forking thread was copied, so the -j workers (and the Python
        pool's threads) are gone and the pool context and lock hold their last state in the parent.  A
        fresh context, a fresh lock, and the workers started again: the child runs plans as the parent
        did.  Both are started by the child's first plan or job (_ensure_workers, run), not here."""
        self._lock = threading.Lock()
        self._restart = self._restart or bool(self._workers)
        self._restart_pool = self._restart_pool or self.pool is not None
        self._workers, self.pool = [], None
        self._new_ctx(1)

    def pool_stats(self) -> dict:
        """Workers alive, parked right now, and futex waits so far (for tests and benchmarks)."""
        return {"workers": sum(t.is_alive() for t in self._workers),
                "parked": int(self._ctx32[CTX_SEQ_SLEEPERS // 4]),
                "parks": int(self._ctx64[CTX_PARKS // 8]),
                "plans": int(self._ctx32[CTX_SEQ // 4])}

    def close(self) -> None:
        """Stop and join the worker threads (idempotent; the object stays usable single-threaded)."""
        with self._lock:
            self._restart = self._restart_pool = False
            self._stop_workers()
            if self.pool:
                self.pool.close()
                self.pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def new_plan(self) -> Plan:
        if not self.has_plan:
            raise LibraryError(f"the {self.family} family has no plan executor in this library")
        return Plan(self)

    def run_plan(self, plan: Plan, job_begin: int = 0, job_end: int | None = None) -> None:
        """Run jobs [job_begin, job_end) of a built plan of this object (Plan.run)."""
        self._check_own(plan, "run_plan")
        plan.run(range(job_begin, plan.n_jobs if job_end is None else job_end))

    def run_step(self, plan: Plan, token: int, pos: int) -> None:
        """Plan.step of a built plan of this object."""
        self._check_own(plan, "run_step")
        plan.step(token, pos)

    def _check_own(self, plan: Plan, who: str) -> None:
        if plan.k is not self or plan.buf is None:
            raise InvalidArgumentError(f"{who}: a built plan of this Kernels object is needed")

    def execute(self, plan_addr: int, job_begin: int, job_end: int) -> None:
        """gpt2asm_plan_run_<isa> on every thread of the pool, one plan at a time: for Plan.run, which
        has checked the plan and the range."""
        with self._lock:
            self._ensure_workers()
            self.plan_run(self._ctx_addr, plan_addr, job_begin, job_end)

    def execute_step(self, plan_addr: int, token: int, pos: int) -> int:
        """gpt2asm_plan_step_<isa>: for Plan.step, which has checked token and pos.  Returns the argmax
        slots' reduction (SIZE_MAX - 1: a non-finite output)."""
        with self._lock:
            self._ensure_workers()
            return self.plan_step(self._ctx_addr, plan_addr, token, pos)

    # -- parallel dispatch over prevalidated addresses (per-call path) --------------------------------

    def run(self, fn, args: list[tuple]) -> None:
        """Run one job: args[i] for thread i (len(args) ≤ threads); serially without a Python pool."""
        if self._restart_pool:
            self.pool = Pool(self.threads)
            self._restart_pool = False
        if len(args) == 1 or self.pool is None:
            for a in args:
                fn(*a)
        else:
            self.pool.run(fn, args)

    def _kernel(self, op: str, w: np.ndarray):
        """gpt2asm_<op>_<dtype> for w's dtype (op 'matvec' or 'matmul')."""
        return getattr(self, op + ("_f16" if w.dtype == np.float16 else "_f32"))

    def matvec_job(self, w: np.ndarray, x: int, b: int | None, y: int, n_in: int, n_tiles: int):
        """(fn, per-thread args) for y = W x + b, tiles split across the threads.  Addresses are
        prevalidated."""
        fn = self._kernel("matvec", w)
        return fn, [(addr(w), x, b, y, n_in, t0, t1) for t0, t1 in split(n_tiles, self.threads if self.pool else 1)]

    def matmul_job(self, w: np.ndarray, x: int, ldx: int, b: int | None, y: int, ldy: int, n_tok: int,
                   n_in: int, n_tiles: int):
        """(fn, per-thread args) for Y[t] = W X[t] + b, t < n_tok (rows ldx / ldy floats apart), the tiles
        split across the threads.  Addresses are prevalidated."""
        if not self.has_matmul:
            raise KernelUnavailableError(f"the {self.family} family has no batched (matmul) kernels")
        fn = self._kernel("matmul", w)
        return fn, [(addr(w), x, ldx, b, y, ldy, n_tok, n_in, t0, t1)
                    for t0, t1 in split(n_tiles, self.threads if self.pool else 1)]

    def attention_job(self, q: int, k: int, v: int, out: int, scratch: list[int], n_pos: int,
                      head_stride: int, n_head: int, f16: bool = False):
        """(kernel, per-thread args) of attention over a float32 cache, or a binary16 one (f16); each
        scratch holds a row of roundup16(n_pos) floats for every head of its thread's share."""
        parts = self.threads if self.pool else 1
        return self.attention_f16 if f16 else self.attention_f32, [(q, k, v, out, s, n_pos, head_stride, h0, h1)
                                    for (h0, h1), s in zip(split(n_head, parts), scratch)]


def matmul_variant(family: str, dtype: str) -> str | None:
    """The variant of the family's float matmul (prefill, batched decode; dtype "f32" or "f16") for this CPU,
    or None for the family's own: avx512_zen4 on Zen 4, whose AVX-512 runs on a 256-bit datapath
    (q0kernels.is_zen4) -- binary16 without blocks of 8 tokens, fp32 without the small calls' prefetch hints.
    $GPT2ASM_F16_ZEN4 / $GPT2ASM_F32_ZEN4 = 1 / 0 forces / forbids it.  Every variant gives the same bits."""
    if family != "avx512":
        return None
    from .q0kernels import env_switch, is_zen4
    force = env_switch(f"GPT2ASM_{dtype.upper()}_ZEN4")
    zen4 = is_zen4() if force is None else force
    return "avx512_zen4" if zen4 else None


_LIVE: "weakref.WeakSet[Kernels]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for k in list(_LIVE):
        k._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_all() -> None:
    """Join the library's worker threads before the interpreter frees what they point at."""
    for k in list(_LIVE):
        try:
            k.close()
        except Exception:
            pass
