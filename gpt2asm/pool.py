"""The Python thread pool: for a kernel family without the library's plan executor (Kernels.has_plan).

The families with a plan executor run every plan on the library's own pool instead
(gpt2asm_worker_<family>, started by Kernels; docs/kernels.md, "Thread pool and plans").
"""
from __future__ import annotations

import mmap
import queue
import threading

from .errors import ResourceError

try:
    import resource
except ImportError:                                 # not on every platform; no address-space limit there
    resource = None

# What a new thread needs beyond its stack before its first Python frame runs (the interpreter's
# frame-stack chunk, malloc's first blocks, the worker's own) -- with a wide margin.
THREAD_HEADROOM = 16 << 20


def _stack_bytes() -> int:
    """The stack a new thread gets: threading.stack_size(), else pthreads' default (the soft
    RLIMIT_STACK, or at most 32 MiB where that is unlimited)."""
    if size := threading.stack_size():
        return size
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return soft if 0 < soft < (32 << 20) else 32 << 20


def start_thread(t: threading.Thread) -> None:
    """t.start(), refused with RuntimeError up front where an address-space limit (RLIMIT_AS) leaves no
    room for the thread's stack and its first allocations.  Without that check the limit can let the
    stack be mapped and then refuse the new thread its first Python frame: the thread dies with
    "Exception ignored in thread started by ... MemoryError" before it signals that it started, and
    Thread.start() waits for that signal for ever."""
    if resource is not None and resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        need = _stack_bytes() + THREAD_HEADROOM
        try:                                        # an inaccessible private mapping: counts against
            mmap.mmap(-1, need, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0).close()  # RLIMIT_AS
        except OSError:                             # only, never touched, unmapped at once
            raise RuntimeError(f"no address space left for another thread (its stack and first "
                               f"allocations: {need >> 20} MiB)") from None
    t.start()


def thread_refused(n: int, e: BaseException) -> ResourceError:
    return ResourceError(f"cannot start the {n - 1} worker thread(s) of -j {n}: {e} (the system's limit "
                         "on threads or address space); use a smaller -j")


class Pool:
    """n-1 worker threads plus the caller.  run(fn, args) calls fn(*args[i]) on thread i and waits.

    ctypes drops the GIL for the length of each foreign call, so the kernels of one job run in parallel.
    Every output is computed whole by one thread, so results do not depend on n.
    """

    def __init__(self, n: int):
        self.n = n
        self._todo = [queue.SimpleQueue() for _ in range(n - 1)]
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = []
        for i, q in enumerate(self._todo):
            t = threading.Thread(target=self._work, args=(q,), daemon=True, name=f"gpt2asm-{i + 1}")
            try:
                start_thread(t)
            except RuntimeError as e:               # "can't start new thread": a thread or memory limit
                self._todo = self._todo[:i]
                self.close()
                raise thread_refused(n, e) from None
            self._threads.append(t)

    def _work(self, q: queue.SimpleQueue) -> None:
        while (job := q.get()) is not None:
            fn, args = job
            try:
                fn(*args)
            finally:
                self._done.put(None)

    def run(self, fn, args: list[tuple]) -> None:
        """Returns (or raises) only once every worker finished its part: an exception or Ctrl-C on the
        calling thread still waits for the kernels running on the others (they write the job's outputs),
        so no completion of this job can be taken for one of the next."""
        sent = 0
        try:
            for q, a in zip(self._todo, args[1:]):
                q.put((fn, a))
                sent += 1
            fn(*args[0])
        finally:
            interrupted = None
            while sent:
                try:
                    self._done.get()
                    sent -= 1
                except KeyboardInterrupt as e:     # a kernel call is short: keep waiting, then re-raise
                    interrupted = e
            if interrupted is not None:
                raise interrupted

    def close(self) -> None:
        for q in self._todo:
            q.put(None)
        for t in self._threads:
            t.join()
        self._todo = []

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous near-equal ranges covering 0..n (empty ranges dropped)."""
    parts = max(1, min(parts, n))
    return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]
