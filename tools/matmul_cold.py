"""The batched matmul kernels at decode's batch sizes, on weights in no cache: each library's
gpt2asm_matmul_<dtype>_<isa> of T tokens over the 124M shapes of one decode step (12 x (c_attn, attn.c_proj,
c_fc, mlp.c_proj) + the head, laid out back to back in a fresh buffer each time, as a batched step streams
them) against a plain read of the same bytes (gpt2asm_readbw_f32_avx2), interleaved rounds (order reversed
every other round); prints per library the median ratio read time / kernel time and the kernel's time.
For A/B runs of builds with other -D knobs (GPT2ASM_ASFLAGS='-DMM_PF_DIST=4096' python build.py --out DIR).

    taskset -c 1 python tools/matmul_cold.py f32:avx512 8 [LIB ...]      (default: the package's library)
"""
from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np

from gpt2asm.lib import LIB_NAME, PKG_DIR

P, S = ctypes.c_void_p, ctypes.c_size_t
# (n_in, tiles of 64 outputs) of the 124M step: c_attn, attn.c_proj, c_fc, mlp.c_proj per layer; the head
SHAPES = [(768, 2304 // 64), (768, 12), (768, 48), (3072, 12)] * 12 + [(768, 50304 // 64)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", help="dtype:isa, e.g. f32:avx512")
    ap.add_argument("tokens", type=int)
    ap.add_argument("libs", nargs="*", default=[str(PKG_DIR / LIB_NAME)])
    ap.add_argument("--rounds", type=int, default=11)
    a = ap.parse_args()
    dt, isa = a.kernel.split(":")
    es = {"f32": 4, "f16": 2}[dt]
    fns = []
    for path in a.libs:
        lib = ctypes.CDLL(path)
        # void gpt2asm_matmul_<dt>_<isa>(const void *w, const float *x, size_t ldx, const float *b, float *y,
        #                                size_t ldy, size_t n_tokens, size_t n_in, size_t tile_begin, size_t tile_end);
        fn = getattr(lib, f"gpt2asm_matmul_{dt}_{isa}")
        fn.argtypes, fn.restype = [P, P, S, P, P, S, S, S, S, S], None
        fns.append(fn)
    # float gpt2asm_readbw_f32_avx2(const float *p, size_t n);
    readbw = ctypes.CDLL(a.libs[0]).gpt2asm_readbw_f32_avx2
    readbw.argtypes, readbw.restype = [P, S], ctypes.c_float
    total = sum(n_in * nt * 64 * es for n_in, nt in SHAPES)
    bufs = [np.full(total + 4096, 0x11, np.uint8) for _ in range(3)]     # finite as f32 / f16
    ptrs = [b.ctypes.data + (-b.ctypes.data) % 4096 for b in bufs]
    T = a.tokens
    X = (np.random.default_rng(0).standard_normal((T, 3072)) * 0.1).astype(np.float32)
    Y = np.empty((T, 50304), np.float32)
    bias = np.zeros(50304, np.float32)
    k = [0]

    def fresh() -> int:                                 # 3 buffers in turn: none is in cache (L3 << total)
        k[0] = (k[0] + 1) % len(ptrs)
        return ptrs[k[0]]

    def kernel(fn) -> float:
        p, off = fresh(), 0
        t0 = time.thread_time()
        for n_in, nt in SHAPES:
            fn(p + off, X.ctypes.data, 3072, bias.ctypes.data, Y.ctypes.data, 50304, T, n_in, 0, nt)
            off += n_in * nt * 64 * es
        return time.thread_time() - t0

    def read() -> float:
        p = fresh()
        t0 = time.thread_time()
        readbw(p, total // 4)
        return time.thread_time() - t0

    ratio = [[] for _ in fns]
    ms = [[] for _ in fns]
    for r in range(a.rounds):
        order = list(enumerate(fns))
        for i, fn in (order if r % 2 == 0 else order[::-1]):
            tk = kernel(fn)
            ratio[i].append(read() / tk)
            ms[i].append(tk * 1e3)
    print(f"{dt} {isa}, {T} tokens, {total / 1e6:.1f} MB of weights; medians of {a.rounds} rounds (thread CPU time)")
    for path, rr, tt in zip(a.libs, ratio, ms):
        print(f"  {path:40s} read/kernel {np.median(rr):.3f} (quartiles {np.quantile(rr, 0.25):.3f}-"
              f"{np.quantile(rr, 0.75):.3f})  kernel {np.median(tt):.2f} ms")


if __name__ == "__main__":
    main()
