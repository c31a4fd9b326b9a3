"""Where the time of one batched decode step goes: every job of the batched decode plan (Transformer.step_rows'
plan: B >= 2 rows, each at position --pos of its own random prompt) timed alone, the best of --reps passes
over the whole plan, summed per kind (and matrix shape) over the layers; the matmuls also as GMAC/s (B rows x
n_in x n_out) and, with --ghz, as cycles per 64 MACs (one vpdpbusd zmm, about one a cycle on Zen 4); BATTN as
the rate it reads the rows' caches at (B rows x heads x pos + 1 positions x 64 x k and v, in GB/s).

    taskset -c 1 python3 tools/profile_batch.py --model DIR --dtype q4_0 --isa avx512 --batch 16 [--ghz 3.5]
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from gpt2asm import plan_abi as abi
from gpt2asm.engine import GPT2

KINDS = {getattr(abi, k): k[5:] for k in dir(abi) if k.startswith("KIND_")}


def job_name(kind: int, f: dict) -> str:
    """A label per job shape: the kind, and for matmuls n_in x n_out."""
    name = KINDS.get(kind, str(kind))
    if name == "MATMUL":
        name += f" {f['n_in']}x{64 * f['n']}"
    elif "n_in" in f:
        name += f" {f['n_in']}"
    return name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="q4_0")
    ap.add_argument("--isa", default=None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--pos", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ghz", type=float, default=None, help="core clock, for cycles per vpdpbusd")
    a = ap.parse_args()
    m = GPT2.load(a.model, dtype=a.dtype, isa=a.isa, threads=1)
    T = m.model
    if getattr(T, "resident", None) is not None:       # the resident copy in, as make bench's rows do:
        T.resident.wait()                               # a plan built before it reads the tile cache's mapping
    rng = np.random.default_rng(3)
    states = []
    for _ in range(a.batch):
        st = T.new_state()
        T.prefill(st, [int(x) for x in rng.integers(0, m.config.vocab_size - 1, a.pos)])
        states.append(st)
    toks = [int(x) for x in rng.integers(0, m.config.vocab_size - 1, a.batch)]
    T.step_batch(states, toks)                          # builds the plan; warm
    p = T.batch_plan
    for s in states:
        s.n = a.pos
    p.set_batch(toks, [a.pos] * a.batch, [s.k for s in states], [s.v for s in states])
    best = [float("inf")] * p.n_jobs
    whole = float("inf")
    for _ in range(a.reps):
        t0 = time.perf_counter()
        p.run()
        whole = min(whole, time.perf_counter() - t0)
        for j in range(p.n_jobs):
            t0 = time.perf_counter()
            p.run(range(j, j + 1))
            best[j] = min(best[j], time.perf_counter() - t0)
    per = defaultdict(float)
    cnt = defaultdict(int)
    macs = defaultdict(int)
    kv_bytes = defaultdict(int)
    per_battn = a.batch * m.config.n_head * (a.pos + 1) * 64 * 2 * states[0].k.dtype.itemsize
    for j, (kind, flags, f) in enumerate(p.jobs):
        name = job_name(kind, f)
        per[name] += best[j]
        cnt[name] += 1
        if KINDS.get(kind) == "MATMUL":
            macs[name] += a.batch * f["n_in"] * 64 * f["n"]
        elif KINDS.get(kind) == "BATTN":
            kv_bytes[name] += per_battn
    tot = sum(best)
    print(f"{a.dtype} {m.model.k.family} B={a.batch} pos={a.pos}: whole step {whole * 1e3:.2f} ms "
          f"({a.batch / whole:.0f} tok/s), sum of jobs {tot * 1e3:.2f} ms")
    print(f"{'job':28} {'n':>3} {'ms':>8} {'%':>6} {'GMAC/s':>8}" + ("  cyc/64MAC" if a.ghz else "")
          + "  (BATTN: GB/s of cache read)")
    for name in sorted(per, key=lambda k: -per[k]):
        line = f"{name:28} {cnt[name]:3} {per[name] * 1e3:8.3f} {100 * per[name] / tot:6.1f}"
        if macs[name]:
            line += f" {macs[name] / per[name] / 1e9:8.1f}"
            if a.ghz:
                line += f"  {per[name] * a.ghz * 1e9 / (macs[name] / 64):.2f}"
        elif kv_bytes[name]:
            line += f" {kv_bytes[name] / per[name] / 1e9:8.1f} GB/s"
        print(line)
    m.close()


if __name__ == "__main__":
    main()
