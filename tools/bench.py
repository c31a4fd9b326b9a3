#!/usr/bin/env python3
"""make bench: decode speed per kernel family x dtype x -j, beside PyTorch and the bandwidth bound.

All figures come from this one run (shared 2-core machines vary between runs: compare ratios).
    python tools/bench.py --model DIR [--tokens 200] [--threads 1,2] [--no-torch] [--out results/bench.md]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpt2asm import GPT2  # noqa: E402
from gpt2asm.kernels import available_families, load_library  # noqa: E402
from gpt2asm.weights import aligned_empty  # noqa: E402

PROMPT = "Alan Turing theorized that computers would one day become"


def read_bandwidth(threads: int, nbytes: int = 1 << 30, reps: int = 3) -> float:
    """GB/s of one streaming read of a 1 GiB buffer split over `threads` threads (our read kernel)."""
    lib = load_library()
    fn = lib.gpt2asm_readbw_f32_avx2
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_float
    buf = aligned_empty(nbytes // 4, np.float32)
    buf[:] = 1.0
    n = buf.size // threads // 64 * 64
    parts = [buf.ctypes.data + i * n * 4 for i in range(threads)]
    best = 0.0
    for _ in range(reps):
        ts = [threading.Thread(target=fn, args=(p, n)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, n * 4 * threads / (time.perf_counter() - t0) / 1e9)
    return best


def weight_bytes(m: GPT2) -> int:
    w = m.model.w
    mats = [w.head_w] + [a for L in w.layers for a in (L.attn_w, L.attn_proj_w, L.fc_w, L.proj_w)]
    return sum(a.nbytes for a in mats)


def ours(model_dir: Path, isa: str, dtype: str, threads: int, tokens: int) -> tuple[float, int]:
    m = GPT2.load(model_dir, dtype=dtype, isa=isa, threads=threads)
    stats: dict = {}
    for _ in m.generate_ids(m.encode(PROMPT), tokens, temperature=0, stats=stats):
        pass
    nb = weight_bytes(m)
    m.close()
    return (stats["generated"] - 1) / stats["decode_s"], nb


def pytorch(model_dir: Path, threads: int, tokens: int) -> float | None:
    try:
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError:
        return None
    torch.set_num_threads(threads)
    ref = GPT2LMHeadModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([GPT2.load(model_dir).encode(PROMPT)])
    with torch.no_grad():
        ref.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=50256)   # warm-up
        t0 = time.perf_counter()
        out = ref.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           pad_token_id=50256, attention_mask=torch.ones_like(ids))
        dt = time.perf_counter() - t0
    return (out.shape[1] - ids.shape[1]) / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.md"))
    a = ap.parse_args(argv)
    d = Path(a.model)
    threads = [int(t) for t in a.threads.split(",")]
    fams = available_families()
    lines = [f"# gpt2asm bench — {time.strftime('%Y-%m-%d %H:%M')} — {platform.machine()}, "
             f"{os.cpu_count()} cores, families {', '.join(fams)}",
             f"model {d}, greedy, {a.tokens} generated tokens after a {len(PROMPT.split())}-word prompt", ""]
    bw = {j: read_bandwidth(j) for j in threads}
    lines.append("read bandwidth (our streaming-read kernel, 1 GiB): "
                 + ", ".join(f"{bw[j]:.1f} GB/s at -j {j}" for j in threads))
    torch_rate = {} if a.no_torch else {j: pytorch(d, j, a.tokens) for j in threads}
    lines += ["", "| kernels | dtype | -j | tok/s | bound tok/s | ours/bound | PyTorch fp32 tok/s | ours/PyTorch |",
              "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for fam in fams:
        for dtype in ("f32", "f16"):
            for j in threads:
                rate, nb = ours(d, fam, dtype, j, a.tokens)
                bound = bw[j] * 1e9 / nb
                pt = torch_rate.get(j)
                row = (f"| {fam} | {dtype} | {j} | {rate:.1f} | {bound:.1f} | {rate / bound:.0%} | "
                       f"{pt:.1f} | {rate / pt:.2f}x |" if pt else
                       f"| {fam} | {dtype} | {j} | {rate:.1f} | {bound:.1f} | {rate / bound:.0%} | – | – |")
                lines.append(row)
                print(row, flush=True)
    lines.append("")
    lines.append("bound = read bandwidth / bytes of weight matrices streamed per token "
                 "(fp32 ≈ 498 MB, fp16 half of it for 124M).")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
