"""The weight matrices packed into one buffer of anonymous memory, in the background.

A warm start maps the tiled matrices from the tile cache (tilecache.py): the first forward step runs
within a fraction of a second.  But on the machines we measure (Linux guests), streaming reads from a
file mapping run at ~0.75x the rate of anonymous memory (`gpt2asm_readbw_f32_avx2` over the same 650 MB:
21-22 GB/s mapped from the page cache, 27-30 GB/s copied into anonymous memory), and decode speed is
that read rate.  Faulting in ~0.5 GB of fresh anonymous memory costs ~0.4-0.7 s there, too long for the
start-up, so the copy runs on a background thread while decoding proceeds from the mapping, and the
model adopts the copies between two steps (Transformer.step calls `poll`):

    r = Resident(weights)          # starts the copy (nothing to do if no matrix is file-mapped)
    ...
    r.poll()                       # non-blocking: True once, when the copies replace the mapped arrays
    r.wait()                       # block until done (benchmarks that measure the steady state)

The copy also packs the matrices into one buffer, in the order a forward step reads
them (layer 0 attn, attn_proj, fc, proj, layer 1 ..., the head), so that one step is one forward stream
that the hardware prefetchers follow across matrix boundaries.  On the 2-core CI machine, streaming the
f16 matrices of GPT-2 124M through `gpt2asm_matvec_f16_avx2`, one matrix after the other, ran at
26.5-26.7 GB/s from 49 separate arrays and 30.3-30.8 GB/s packed (f32: 28.6-30.0 -> 31.4-31.7 GB/s).
Cold-loaded weights (separate arrays in anonymous memory) are packed too.

The copies are the same bytes (np.copyto of the very arrays in use), so the logits do not change; the
arrays are replaced only between steps, and plans built over the old arrays are rebuilt by their owner.
The copy is skipped when the matrices are already packed, when the machine lacks the memory for it (MemAvailable < 2x the bytes + 1 GiB) or
with $GPT2ASM_RESIDENT=0.
"""
from __future__ import annotations

import mmap
import os
import threading
import weakref

import numpy as np

from .pool import start_thread
from .weights import aligned_empty

CHUNK = 16 << 20            # bytes per np.copyto (the GIL is released inside each)
PACK_ALIGN = 4096           # each array of the packed buffer starts on a page
BUF_ALIGN = 2 << 20         # the buffer itself on a huge page
OFF = ("0", "off", "no", "false")


def is_mapped(a: np.ndarray) -> bool:
    """Whether a's memory belongs to an mmap object (a file mapping)."""
    b = a
    while isinstance(b, np.ndarray):
        b = b.base
    if isinstance(b, memoryview):                  # np.frombuffer(mmap)
        b = b.obj
    return isinstance(b, mmap.mmap)


def mem_available() -> int | None:
    """Bytes the system can still give without swapping (Linux's MemAvailable), or None where it is unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def matrix_slots(w) -> list[tuple[object, str]]:
    """(owner, attribute) of every tiled matrix of a Weights object, in the order a forward step reads them."""
    names = ("attn_w", "attn_proj_w", "fc_w", "proj_w")
    return [(L, n) for L in w.layers for n in names] + [(w, "head_w")]


def _round(n: int) -> int:
    return -(-n // PACK_ALIGN) * PACK_ALIGN


def is_packed(arrays: list[np.ndarray]) -> bool:
    """Whether the arrays follow each other in memory in this order (each within PACK_ALIGN bytes of the
    end of the one before), as Resident lays them out."""
    end = None
    for a in arrays:
        if end is not None and not end <= a.ctypes.data < end + PACK_ALIGN:
            return False
        end = a.ctypes.data + a.nbytes
    return True


def _pack(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Copies of the arrays, one after the other in one buffer (page-aligned each), read-only."""
    buf = aligned_empty(sum(_round(a.nbytes) for a in arrays), np.uint8, BUF_ALIGN)
    out, off = [], 0
    for src in arrays:
        dst = buf[off:off + src.nbytes].view(src.dtype).reshape(src.shape)
        s, d = src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8)
        for i in range(0, s.size, CHUNK):
            np.copyto(d[i:i + CHUNK], s[i:i + CHUNK])
        dst.flags.writeable = False
        out.append(dst)
        off += _round(src.nbytes)
    return out


_COPYING: "weakref.WeakSet[Resident]" = weakref.WeakSet()     # started copies (done or not)


def _after_fork_in_child() -> None:
    for r in list(_COPYING):
        r._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Resident:
    def __init__(self, weights, start: bool = True):
        self.w = weights
        self.todo = [(o, n) for o, n in matrix_slots(weights) if isinstance(getattr(o, n, None), np.ndarray)]
        self.nbytes = sum(getattr(o, n).nbytes for o, n in self.todo)
        self.copies: list[np.ndarray] | None = None
        self.error: BaseException | None = None
        self.adopted = False
        self._done = threading.Event()
        self.reason = self._skip_reason()
        if self.reason:
            self.todo, self.nbytes = [], 0
        if not self.todo:
            self._done.set()
            self.adopted = True
            return
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpt2asm-resident")
        if start:
            self._start()
            _COPYING.add(self)

    def _start(self) -> None:
        """The copying thread; where the system refuses it, the weights stay where they are (as with
        a copy that ran out of memory)."""
        try:
            start_thread(self._thread)
        except RuntimeError as e:
            self.error = e
            self._done.set()

    def _after_fork(self) -> None:
        """In a fork()ed child the copying thread is gone (only the forking thread is copied): copy again
        there, with a fresh event, unless the copy was already done."""
        if self._done.is_set():
            return
        self.copies, self.error = None, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpt2asm-resident")
        self._start()

    def _skip_reason(self) -> str:
        arrays = [getattr(o, n) for o, n in self.todo]
        if not any(is_mapped(a) for a in arrays) and is_packed(arrays):
            return "already packed"
        if os.environ.get("GPT2ASM_RESIDENT", "").strip().lower() in OFF:
            return "$GPT2ASM_RESIDENT=0"
        avail = mem_available()
        if avail is not None and avail < 2 * self.nbytes + (1 << 30):
            return f"not enough free memory ({avail >> 20} MiB available)"
        return ""

    def _run(self) -> None:
        try:
            self.copies = _pack([getattr(o, n) for o, n in self.todo])
        except BaseException as e:            # e.g. MemoryError: keep running from the mapping
            self.error = e
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def poll(self) -> bool:
        """Adopt the copies if they are ready (call only between steps). True if this call adopted them."""
        if self.adopted or not self._done.is_set():
            return False
        self.adopted = True
        if self.copies is None:
            return False
        for (o, n), c in zip(self.todo, self.copies):
            setattr(o, n, c)
        self.copies = None
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the copy finished (or timeout); then the next poll() adopts it."""
        return self._done.wait(timeout)
