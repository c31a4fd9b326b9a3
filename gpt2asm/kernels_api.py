"""The checked numpy API of Kernels (gpt2asm/kernels.py): numpy in, numpy out, every argument validated
(validate.py) first -- through a one-job Plan where the family has an executor, else through the
per-call jobs (Kernels.matvec_job ...).  A mixin of Kernels, whose bindings it calls through self.
"""
from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentError, KernelUnavailableError, LibraryError
from .plan import Plan
from .validate import HEAD_DIM, SIZE_MAX, TILE, addr, check, check_attention, check_matrix


class CheckedOps:
    """Kernels' .matvec .matmul .attention .layernorm .gelu .expf .softmax .argmax; see Kernels."""

    def matvec(self, w: np.ndarray, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """y[64*n_tiles] = W x + b for a tiled w [n_tiles][n_in][64] (float32 or float16)."""
        n_tiles, n_in, _ = check_matrix(w, "w")
        px = check(x, "x", np.float32, n_in)
        pb = None if b is None else check(b, "b", np.float32, n_tiles * TILE)
        y = np.empty(n_tiles * TILE, np.float32)
        if self.has_plan:
            p = Plan(self)
            p.matvec(w, x, b, y)
            p.build().run()
        else:
            self.run(*self.matvec_job(w, px, pb, addr(y), n_in, n_tiles))
        return y

    def matmul(self, w: np.ndarray, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """Y[t] = W X[t] + b for every row of x [T][n_in]: Y [T][64*n_tiles], each row the bits of
        matvec(w, x[t], b) (the batched-prefill kernels)."""
        n_tiles, n_in, _ = check_matrix(w, "w")
        if not (isinstance(x, np.ndarray) and x.ndim == 2 and x.shape[0] >= 1 and x.shape[1] == n_in):
            raise InvalidArgumentError(f"x: expected rows [T][{n_in}]")
        if b is not None:
            check(b, "b", np.float32, n_tiles * TILE)
        y = np.empty((x.shape[0], n_tiles * TILE), np.float32)
        if not self.has_matmul:
            raise KernelUnavailableError(f"the {self.family} family has no batched (matmul) kernels")
        if not self.has_plan:                   # per-call path (Arm): the tile ranges split over run()
            px = check(x, "x", np.float32)
            self.run(*self.matmul_job(w, px, n_in, None if b is None else addr(b), addr(y), n_tiles * TILE,
                                      x.shape[0], n_in, n_tiles))
            return y
        p = Plan(self)
        p.matmul(w, x, b, y)
        p.build().set_rows(x.shape[0], 0)
        p.run()
        return y

    def _unary(self, fn, x: np.ndarray, name: str) -> np.ndarray:
        px = check(x, name, np.float32)
        if x.size < 1:
            raise InvalidArgumentError(f"{name}: needs at least one element")
        y = np.empty_like(x)
        fn(px, addr(y), x.size)
        return y

    def gelu(self, x: np.ndarray) -> np.ndarray:
        return self._unary(self.gelu_f32, x, "x")

    def expf(self, x: np.ndarray) -> np.ndarray:
        return self._unary(self.expf_f32, x, "x")

    def softmax(self, x: np.ndarray) -> np.ndarray:
        return self._unary(self.softmax_f32, x, "x")

    def argmax(self, x: np.ndarray) -> int | None:
        """The index of the first maximum of x (numpy.argmax; -0.0 == +0.0), or None if x holds a NaN
        or an infinity (greedy sampling: gpt2asm_argmax_f32, comparisons only, the same on every ISA)."""
        px = check(x, "x", np.float32)
        if x.ndim != 1 or x.size < 1:
            raise InvalidArgumentError(f"x: expected a 1-D array of at least one element, got shape {x.shape}")
        if x.size >= 1 << 31:
            raise InvalidArgumentError(f"x: {x.size} elements, at most {(1 << 31) - 1}")
        i = self.argmax_f32(px, x.size)
        if i == SIZE_MAX:
            return None
        if not (isinstance(i, int) and 0 <= i < x.size):      # e.g. a binding without a return value
            raise LibraryError(f"{self._symbol('argmax_f32')} returned {i!r} for n = {x.size}")
        return i

    def layernorm(self, x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        px = check(x, "x", np.float32)
        if x.size < 1:
            raise InvalidArgumentError("x: needs at least one element")
        pg, pb = check(g, "g", np.float32, x.size), check(b, "b", np.float32, x.size)
        y = np.empty_like(x)
        self.layernorm_f32(px, pg, pb, addr(y), x.size)
        return y

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, n_pos: int) -> np.ndarray:
        """Attention of one query q [n_head*64] over cache k, v [n_head][n_ctx][64] (float32 or float16),
        positions < n_pos."""
        n_head, n_ctx = check_attention(q, k, v, n_pos)
        out = np.empty(n_head * HEAD_DIM, np.float32)
        if self.has_plan:
            p = Plan(self)
            p.attention(q, k, v, out, int(n_pos))
            p.build().run()
            return out
        scratch = [np.empty(n_head * (-(-n_pos // 16) * 16), np.float32) for _ in range(self.threads)]
        self.run(*self.attention_job(addr(q), addr(k), addr(v), addr(out), [addr(s) for s in scratch],
                                     int(n_pos), n_ctx * HEAD_DIM, n_head, k.dtype == np.float16))
        return out
