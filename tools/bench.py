#!/usr/bin/env python3
"""make bench: one table from one run -- gpt2asm per kernel family x dtype x -j, beside the machine's read
bandwidth bound, PyTorch and llama.cpp, all measured in this run.

    python tools/bench.py --model DIR [--quick] [--threads 1,2] [--isa avx2,avx512] [--dtypes f32,f16,q8]
                          [--no-torch] [--no-llamacpp] [--repeat N] [--out results/bench.md]

Every figure runs in its own fresh Python process (tools/bench.py --worker SPEC), one after the other, so
the measurements neither share memory nor threads. The machine is shared: compare ratios, not figures
from different runs. Columns:

    tok/s @200     greedy decode after a 9-token prompt, tokens 2..200 (the first one is the prompt's)
    tok/s @800     the same generation continued: the 64 tokens ending at position 800
    @800/@200      decode at position 800 over decode at position 200, both over the 64 tokens ending there
    @800/@200      a decode step at position 800 against one at position 200, alternating in one process
      paired       (the cache prefilled to 800): median of step time @200 / step time @800 over 15 pairs
    TTFT 512       seconds from a 512-token prompt to its first generated token
    start-up       seconds to the first forward step (weights, kernels, tokenizer, model; not the imports):
                   cold = no tile cache (weights.load_weights), warm = tiles mapped from the tile cache
    bound          read bandwidth at -j N (our streaming-read kernel over 1 GiB, N threads claiming 8 MB
                   chunks as the plan's workers claim tiles; measured right before and right after the
                   row's run, the higher of the two) / bytes of weight matrices per token
    steps/TTFT     the same 512-token prompt as 512 cached steps, over the TTFT of the batched prefill
    of FMA peak    the prefill's flop rate (its FMAs x 2 / TTFT) over the FMA peak at -j N (our FMA probe,
                   gpt2asm_fmapeak_f32_<isa>: 12 or 16 independent chains), which bounds steps/TTFT: every
                   (token, output) of a prefill is an exact fp32 FMA chain, as in a cached step
    step/read      a decode step at position 200 against a read of the same weight bytes (our read kernel,
      paired       same -j), alternating in one process: median of read time / step time over 15 pairs
    Python %       share of a decode step spent outside the library (Python, ctypes, sampling)
    llama.cpp      llama-bench -n 128 -p 0 (decode) and -n 0 -p 512 (prefill), same checkpoint as GGUF F32 /
                   F16 / Q8_0 (`make llamacpp` builds it; skipped when absent)
    PyTorch        transformers GPT2LMHeadModel, fp32, torch.set_num_threads(N): generate() 200 tokens, and
                   one forward over 512 tokens for TTFT
Results go to results/bench.md and results/bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

PROMPT = "Alan Turing theorized that computers would one day become"
LLAMA_TYPE = {"f32": "F32", "f16": "F16", "q8": "Q8_0"}
WORKER_TIMEOUT = 1200
READBW = {"x86_64": "gpt2asm_readbw_f32_avx2", "aarch64": "gpt2asm_readbw_f32_neon"}   # our read kernel
FMAPEAK = {"x86_64": ("gpt2asm_fmapeak_f32_avx2", 192), "aarch64": ("gpt2asm_fmapeak_f32_neon", 128)}  # flop/iter


def emulated() -> str:
    """The emulator's CPU model when this Python runs under qemu-user (tools/arm64/python), else ''."""
    return os.environ.get("QEMU_CPU", "") or os.environ.get("GPT2ASM_QEMU_CPU", "")


# ==================================================================================================
# workers (each runs in a fresh process)

def w_readbw(threads: int, nbytes: int = 1 << 30, reps: int = 3) -> dict:
    """GB/s of a streaming read of a 1 GiB buffer by `threads` threads (our read kernel, _read_span)."""
    fn, buf = _read_setup(nbytes)
    best = min(_read_span(fn, buf.ctypes.data, buf.size, threads) for _ in range(reps))
    return {"gbps": buf.nbytes / best / 1e9}


def _read_setup(nbytes: int):
    """(our read kernel, bound: float gpt2asm_readbw_f32_<isa>(const float *p, size_t n); a buffer of
    nbytes rounded up to 64 floats, filled with 1.0 so its pages are resident)."""
    import ctypes

    import numpy as np

    from gpt2asm.lib import ARCH, load_library
    from gpt2asm.weights import aligned_empty
    fn = getattr(load_library(), READBW[ARCH])
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_float
    buf = aligned_empty(max(64, -(-nbytes // 256) * 64), np.float32)
    buf[:] = 1.0
    return fn, buf


def _read_span(fn, base: int, n: int, threads: int, chunk: int = 2 << 20) -> float:
    """Seconds to read the n floats at base (n a multiple of 64) with our read kernel fn: one call on one
    thread; on several, threads that claim chunks of `chunk` floats (8 MB) from a shared counter, so a
    faster core reads more of the buffer (as the plan's workers claim tiles), timed from the first
    claim to the last chunk's end (the thread start-up is not counted)."""
    if threads == 1:
        return _timed(fn, base, n)
    import itertools
    import threading
    claims, marks = itertools.count(), []

    def work():
        t0 = time.perf_counter()
        while (i := next(claims)) * chunk < n:
            fn(base + 4 * i * chunk, min(chunk, n - i * chunk))
        marks.append((t0, time.perf_counter()))
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return max(e for _, e in marks) - min(b for b, _ in marks)


def _best_rate(fn, args: list[tuple], units: float, reps: int) -> float:
    """units / seconds of the fastest of reps runs of fn(*a) for every a in args, one thread each, at once."""
    import threading
    best = 0.0
    for _ in range(reps):
        ts = [threading.Thread(target=fn, args=a) for a in args]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, units / (time.perf_counter() - t0))
    return best


def w_fmapeak(threads: int, seconds: float = 0.3, reps: int = 3) -> dict:
    """GFLOP/s of fp32 FMAs on `threads` threads at once (our FMA probe, register operands only)."""
    import ctypes

    from gpt2asm.lib import ARCH, load_library
    name, flop = FMAPEAK[ARCH]
    fn = getattr(load_library(), name)
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_float
    t0 = time.perf_counter()
    fn(1 << 20)
    n = max(1 << 16, int((1 << 20) * seconds / max(time.perf_counter() - t0, 1e-6)))
    return {"gflops": _best_rate(fn, [(n,)] * threads, n * flop * threads / 1e9, reps)}


def prefill_flop(cfg, T: int) -> int:
    """Flop of a T-token prefill from an empty cache, 2 per FMA: the 4 matrices (12 C^2 FMAs per token) and
    the attention (q.k and p.v over positions 0..t for token t) of every layer but the last for every
    token; of the last layer c_attn (3 C^2) for every token (its cache rows), the rest of it and the LM head
    for the last token only (as Transformer.prefill runs it)."""
    C, L, H = cfg.n_embd, cfg.n_layer, cfg.n_head
    return 2 * (12 * C * C * (L - 1) * T + 3 * C * C * T + 9 * C * C
                + 2 * 64 * H * ((L - 1) * (T * (T + 1) // 2) + T) + C * cfg.vocab_size)


def _build(model: Path, dtype: str, isa, threads: int, cache: str):
    """(GPT2, seconds to the first forward step, detail): the tile cache per `cache` ('cold': none,
    'warm': tilecache), or GPT2.load for a dtype the tile cache does not know."""
    from gpt2asm import tilecache
    from gpt2asm.engine import DTYPES, GPT2
    from gpt2asm.kernels import Kernels
    from gpt2asm.model import Transformer
    from gpt2asm.tokenizer import Tokenizer
    from gpt2asm.weights import load_weights
    t0 = time.perf_counter()
    dt = DTYPES.get(dtype, dtype)
    if tilecache._layout(dt) is None:
        m = GPT2.load(model, dtype=dtype, isa=isa, threads=threads)
        return m, time.perf_counter() - t0, {"how": "GPT2.load"}
    k = Kernels(isa, threads)
    t1 = time.perf_counter()
    if cache == "cold":
        w, how = load_weights(model, dt), "load_weights"
    else:
        w, info = tilecache.load_weights_info(model, dt)
        how = f"tilecache {info.status}" + (f" ({info.reason})" if info.reason else "")
    t2 = time.perf_counter()
    tok = Tokenizer.from_dir(model)
    t3 = time.perf_counter()
    m = GPT2(Transformer(w, k), tok, model)
    m.model.start_resident()                          # as GPT2.load does (packs the matrices into one buffer)
    t4 = time.perf_counter()
    return m, t4 - t0, {"how": how, "weights_s": t2 - t1, "tokenizer_s": t3 - t2, "kernels_s": t1 - t0,
                        "model_s": t4 - t3}


def w_startup(model: str, dtype: str, cache: str) -> dict:
    t0 = time.perf_counter()
    import numpy  # noqa: F401
    import gpt2asm.engine  # noqa: F401
    imports = time.perf_counter() - t0
    m, secs, detail = _build(Path(model), dtype, None, 1, cache)
    st = m.model.new_state()
    t0 = time.perf_counter()
    m.model.step(st, 0)
    first = time.perf_counter() - t0
    m.close()
    return {"seconds": secs, "first_step_s": first, "imports_s": imports, **detail}


def w_ours(model: str, dtype: str, isa: str, threads: int, tokens: list, prompt_len: int, cache: str) -> dict:
    import numpy as np

    from gpt2asm.resident import matrix_slots
    m, load_s, detail = _build(Path(model), dtype, isa, threads, cache)
    mats = [getattr(o, n, None) for o, n in matrix_slots(m.model.w)]          # matrices and int8 scales
    nbytes = sum(a.nbytes for a in mats if a is not None)
    out = {"weight_bytes": nbytes, "load_s": load_s, **detail}
    # decode runs from anonymous memory: wait for the background copy of the mapped tiles (resident.py;
    # the start-up figures are measured separately, to the first forward step)
    res = getattr(m.model, "resident", None)
    if res is not None:
        t0 = time.perf_counter()
        res.wait()
        out["resident_wait_s"] = time.perf_counter() - t0
        out["resident"] = res.reason or f"copied {res.nbytes / 1e6:.0f} MB"
    # decode: one greedy generation to max(tokens), a timestamp per token
    n = max(tokens)
    ids = m.encode(PROMPT)
    stamps = []
    for _ in m.generate_ids(ids, n, temperature=0):
        stamps.append(time.perf_counter())
    pos0 = len(ids)                                   # position of the first generated token's step
    for t in tokens:
        g = t - pos0                                  # generated tokens up to position t
        if g < 2 or g > len(stamps):
            continue
        a = max(1, g - 64)                            # the local rate at position t: its last 64 tokens
        out[f"tok_s_{t}_local"] = (g - a) / (stamps[g - 1] - stamps[a - 1])
        if t == min(tokens):                          # from the start: comparable to llama-bench tg
            out[f"tok_s_{t}"] = (g - 1) / (stamps[g - 1] - stamps[0])
        else:
            out[f"tok_s_{t}"] = out[f"tok_s_{t}_local"]
    # per-token overhead: wall time of a step outside the library's plan_step (Python, ctypes, sampling)
    k = m.model.k
    if getattr(k, "plan_step", None) is not None:
        inner = k.plan_step
        spent = [0.0]

        def timed(*args, _f=inner, _t=time.perf_counter):
            t0 = _t()
            r = _f(*args)
            spent[0] += _t() - t0
            return r
        k.plan_step = timed
        marks = [(time.perf_counter(), spent[0]) for _ in m.generate_ids(ids, 72, temperature=0)]
        k.plan_step = inner
        (t0, s0), (t1, s1) = marks[8], marks[-1]              # steady state: tokens 9..72
        out["overhead_pct"] = 100.0 * ((t1 - t0) - (s1 - s0)) / (t1 - t0)
    if 2 <= min(tokens) <= m.config.n_ctx:
        out.update(_paired(m, nbytes, threads, min(tokens)))
    if 2 <= min(tokens) < max(tokens) <= m.config.n_ctx:
        out.update(_pos_paired(m, min(tokens), max(tokens)))
    # time to first token for a prompt of prompt_len tokens
    if prompt_len:
        rng = np.random.default_rng(0)
        pids = [int(x) for x in rng.integers(0, m.config.vocab_size - 1, prompt_len)]
        t0 = time.perf_counter()
        next(iter(m.generate_ids(pids, 1, temperature=0)))
        out["ttft_s"] = time.perf_counter() - t0
        out["prompt_len"] = prompt_len
        out["prefill_flop"] = prefill_flop(m.config, prompt_len)
        # the same prompt as prompt_len cached steps, and (with a prefill) its logits compared bit for bit
        st = m.model.new_state()
        t0 = time.perf_counter()
        for t in pids:
            logits = m.model.step(st, t)[0]
        out["steps_ttft_s"] = time.perf_counter() - t0
        pre = m.model.prefill(m.model.new_state(), pids)[0]
        out["prefill_identical"] = bool(np.array_equal(pre.view(np.uint32), logits.view(np.uint32)))
    m.close()
    return out


def _paired(m, nbytes: int, threads: int, pos: int, rounds: int = 15) -> dict:
    """A step at position pos against a read of the step's weight bytes (our read kernel on the same
    thread count, _read_span), alternating in this process, so that both see the same neighbours on a shared
    machine: the median of read time / step time over `rounds` pairs (the step rewrites the same cache
    position each time)."""
    import numpy as np

    fn, buf = _read_setup(nbytes)                                 # the step's weight bytes
    ids, st = _prefilled(m, pos, 1)
    n0, ratios = st.n, []
    for _ in range(rounds):
        t_read = _read_span(fn, buf.ctypes.data, buf.size, threads)
        st.n = n0
        t_step = _timed(m.model.step, st, ids[-1])
        ratios.append(t_read / t_step)
    return {"paired_ratio": float(np.median(ratios)), "paired_pos": pos, "paired_rounds": rounds}


def _prefilled(m, n: int, seed: int):
    """(n random token ids, a new state with the first n - 1 of them prefilled): the cache a step of the
    last one at position n - 1 reads."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = [int(x) for x in rng.integers(0, m.config.vocab_size - 1, n)]
    st = m.model.new_state()
    m.model.prefill(st, ids[:-1])
    return ids, st


def _pos_paired(m, lo: int, hi: int, rounds: int = 15) -> dict:
    """A step at position hi against a step at position lo, alternating in this process (the cache filled
    to hi by a prefill of the same tokens; each step rewrites its position with the bits it already
    holds), so that both see the same neighbours: the median of (time at lo) / (time at hi) over `rounds`
    pairs -- decode at position hi over decode at position lo, with the machine's noise paired out."""
    import numpy as np

    ids, st = _prefilled(m, hi, 2)
    ratios = []
    for _ in range(rounds):
        st.n = lo - 1
        t_lo = _timed(m.model.step, st, ids[lo - 1])
        st.n = hi - 1
        t_hi = _timed(m.model.step, st, ids[hi - 1])
        ratios.append(t_lo / t_hi)
    return {"pos_ratio": float(np.median(ratios)), "pos_lo": lo, "pos_hi": hi}


def _timed(f, *args) -> float:
    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0


def w_torch(model: str, threads: int, tokens: int, prompt_len: int) -> dict:
    try:
        import numpy as np
        import torch
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        return {"error": f"not installed ({e})"}
    from gpt2asm.tokenizer import Tokenizer
    torch.set_num_threads(threads)
    ref = GPT2LMHeadModel.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor([Tokenizer.from_dir(model).encode(PROMPT)])
    out = {"version": torch.__version__, "threads": threads}
    with torch.no_grad():
        ref.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=50256)   # warm-up
        t0 = time.perf_counter()
        res = ref.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           pad_token_id=50256, attention_mask=torch.ones_like(ids))
        out["tok_s"] = (res.shape[1] - ids.shape[1]) / (time.perf_counter() - t0)
        if prompt_len:
            rng = np.random.default_rng(0)
            p = torch.tensor([rng.integers(0, ref.config.vocab_size - 1, prompt_len)])
            ref(p[:, :16])
            best = None
            for _ in range(2):
                t0 = time.perf_counter()
                int(ref(p).logits[0, -1].argmax())
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
            out["ttft_s"] = best
    return out


WORKERS = {"readbw": w_readbw, "fmapeak": w_fmapeak, "startup": w_startup, "ours": w_ours, "torch": w_torch}


def worker_main(spec: str) -> int:
    s = json.loads(spec)
    kind = s.pop("kind")
    try:
        res = WORKERS[kind](**s)
    except Exception as e:                             # reported in the table, never fatal
        res = {"error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# ==================================================================================================
# orchestration

def spawn(kind: str, env: dict | None = None, **spec) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps({"kind": kind, **spec})]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT,
                           env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {WORKER_TIMEOUT} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": f"worker exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}"}


def best(runs: list[dict], key: str, lower: bool = False):
    vals = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    if not vals:
        return None
    return min(vals) if lower else max(vals)


def fmt(x, spec=".1f", none="–"):
    return none if x is None else format(x, spec)


def ratio(a, b, spec=".2f", suffix="x"):
    return "–" if a is None or b is None or not b else f"{a / b:{spec}}{suffix}"


def pct(a, b):
    return "–" if a is None or b is None or not b else f"{a / b:.0%}"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def q8_supported() -> bool:
    from gpt2asm.engine import DTYPES
    return "q8" in DTYPES


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", help="checkpoint directory")
    ap.add_argument("--quick", action="store_true",
                    help="a short run (~2-3 min): 200 tokens only, 128-token TTFT, one llama-bench repetition")
    ap.add_argument("--tokens", default=None, help="decode positions to report (default 200,800; quick 200)")
    ap.add_argument("--prompt", type=int, default=None, help="TTFT prompt length (default 512; quick 128)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--isa", default=None, help="kernel families (default: every one this CPU has)")
    ap.add_argument("--dtypes", default=None, help="default f32,f16 and q8 when the engine has it")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each of our rows; the best is kept")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--no-startup", action="store_true")
    ap.add_argument("--llama-reps", type=int, default=None, help="llama-bench -r (default 3; quick 1)")
    ap.add_argument("--cache", choices=("warm", "cold"), default="warm",
                    help="weights for our decode rows: mapped from the tile cache (default) or tiled in memory")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench.md"))
    a = ap.parse_args(argv)
    if a.worker:
        return worker_main(a.worker)
    if not a.model:
        ap.error("--model DIR is required")

    from gpt2asm.cpu import available_families
    d = Path(a.model).resolve()
    tokens = [int(t) for t in (a.tokens or ("200" if a.quick else "200,800")).split(",")]
    prompt_len = a.prompt if a.prompt is not None else (128 if a.quick else 512)
    threads = [int(t) for t in a.threads.split(",")]
    fams = a.isa.split(",") if a.isa else available_families()
    q8 = q8_supported()
    dtypes = a.dtypes.split(",") if a.dtypes else ["f32", "f16"] + (["q8"] if q8 else [])
    reps = a.llama_reps if a.llama_reps is not None else (1 if a.quick else 3)
    t_start = time.time()
    phases: dict = {}

    def say(msg):
        now = time.time()
        if phases:
            last = list(phases)[-1]
            phases[last] = round(now - phases[last], 1)
        phases[msg] = now
        print(f"[bench] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.machine(), "cpu": cpu_name(),
                 "cores": os.cpu_count(), "families": fams, "model": str(d), "tokens": tokens,
                 "prompt_len": prompt_len, "threads": threads, "dtypes": dtypes, "q8_in_engine": q8,
                 "decode_weights": a.cache}

    say("read bandwidth, FMA peak")
    bw = {j: [spawn("readbw", threads=j)] for j in threads}
    peak = {j: [spawn("fmapeak", threads=j)] for j in threads}

    startup = {}
    if not a.no_startup:
        for dt in dtypes:
            say(f"start-up {dt}")
            spawn("startup", model=str(d), dtype=dt, cache="warm")           # make sure the cache exists
            startup[dt] = {c: [spawn("startup", model=str(d), dtype=dt, cache=c) for _ in range(2)]
                           for c in ("cold", "warm")}
    elif a.cache == "warm":
        for dt in dtypes:
            spawn("startup", model=str(d), dtype=dt, cache="warm")

    rows = []
    for fam in fams:
        for dt in dtypes:
            for j in threads:
                say(f"ours {fam} {dt} -j {j}")
                runs, near = [], [spawn("readbw", threads=j)]     # the bound measured next to the row
                for _ in range(max(1, a.repeat)):
                    runs.append(spawn("ours", model=str(d), dtype=dt, isa=fam, threads=j, tokens=tokens,
                                      prompt_len=prompt_len, cache=a.cache))
                    near.append(spawn("readbw", threads=j))
                bw[j] += near
                for i, run in enumerate(runs):            # each run against the readings around it
                    run["gbps"] = best(near[i:i + 2], "gbps")
                rows.append({"isa": fam, "dtype": dt, "threads": j, "runs": runs})

    torch_res = {}
    if not a.no_torch:
        for j in threads:
            say(f"PyTorch -j {j}")
            torch_res[j] = spawn("torch", model=str(d), threads=j, tokens=min(tokens), prompt_len=prompt_len)

    llama = None
    llama_note = "skipped (--no-llamacpp)"
    if not a.no_llamacpp:
        import llamacpp
        st = llamacpp.status(d)
        if not st["llama-bench"]:
            llama_note = "not built: run `make llamacpp`"
        elif not any(st["gguf"].values()):
            llama_note = f"no GGUF of {d}: run `make llamacpp MODEL={a.model}`"
        else:
            say("llama.cpp")
            try:                                      # every type, Q8_0 too: the int8 target before we have q8
                llama = llamacpp.bench(d, threads, n_gen=128, n_prompt=prompt_len, reps=reps)
                llama_note = f"llama-cpp-python {llamacpp.VERSION} sdist, llama-bench -r {reps}"
            except Exception as e:
                llama_note = f"failed: {type(e).__name__}: {e}"

    say("read bandwidth, FMA peak (again)")
    for j in threads:
        bw[j].append(spawn("readbw", threads=j))
        peak[j].append(spawn("fmapeak", threads=j))
    say("done")
    phases.pop("done")

    # ---------------------------------------------------------------------------------------------
    res["phase_seconds"] = phases
    res["read_gbps"] = {j: [r.get("gbps") for r in bw[j]] for j in threads}
    res["fma_gflops"] = {j: [r.get("gflops") for r in peak[j]] for j in threads}
    fpeak = {j: best(peak[j], "gflops") for j in threads}
    res["startup"] = startup
    res["torch"] = torch_res
    res["llamacpp"] = {"note": llama_note, "rows": llama}
    def lrow(typ, j, test):
        return next((r for r in (llama or []) if (r["type"], r["threads"], r["test"]) == (typ, j, test)), None)

    t200, t800 = min(tokens), (max(tokens) if len(tokens) > 1 else None)
    hdr = ["kernels", "dtype", "-j", f"tok/s @{t200}"]
    hdr += [f"tok/s @{t800}", f"@{t800}/@{t200}", f"@{t800}/@{t200} paired"] if t800 else []
    hdr += [
        f"TTFT {prompt_len} s", "steps/TTFT", "of FMA peak", "Python %", "start-up cold / warm s (weights only)",
        "bound tok/s", "ours/bound", "step/read paired",
        "llama.cpp tok/s", "ours/llama.cpp", f"llama.cpp TTFT {prompt_len} s",
        "PyTorch tok/s", "ours/PyTorch", f"PyTorch TTFT {prompt_len} s"]
    table = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in rows:
        runs, j, dt = r["runs"], r["threads"], r["dtype"]
        errs = [x["error"] for x in runs if "error" in x]
        nb = best(runs, "weight_bytes")
        # the run with the best ratio to its own bound (the higher of the readings just before and after it)
        scored = [(x[f"tok_s_{t200}"] * nb / (x["gbps"] * 1e9), x) for x in runs
                  if x.get(f"tok_s_{t200}") and x.get("gbps") and nb]
        pick = max(scored, key=lambda q: q[0])[1] if scored else {}
        rate = pick.get(f"tok_s_{t200}")
        rate8 = pick.get(f"tok_s_{t800}") if t800 else None
        local = pick.get(f"tok_s_{t200}_local") or rate      # decode at position t200, for @t800/@t200
        paired = best(runs, "paired_ratio")
        pos_paired = best(runs, "pos_ratio")
        ttft = best(runs, "ttft_s", lower=True)
        bound = pick["gbps"] * 1e9 / nb if pick else None
        su = startup.get(dt, {})
        c_run, w_run = (_fastest(su.get(k, [])) for k in ("cold", "warm"))
        cold, warm = c_run.get("seconds"), w_run.get("seconds")
        wcold, wwarm = c_run.get("weights_s"), w_run.get("weights_s")
        lt = lrow(LLAMA_TYPE.get(dt), j, "tg128")
        lp = lrow(LLAMA_TYPE.get(dt), j, f"pp{prompt_len}")
        pt = torch_res.get(j, {})
        r.update(tok_s=rate, tok_s_800=rate8, tok_s_local=local, ttft_s=ttft, weight_bytes=nb, bound=bound,
                 paired_ratio=paired, pos_ratio=pos_paired,
                 llama_tok_s=lt and lt["tok_s"], llama_ttft_s=lp and prompt_len / lp["tok_s"])
        cells = [r["isa"], dt + (" (error)" if errs else ""), str(j), fmt(rate)]
        if t800:
            cells += [fmt(rate8), pct(rate8, local), pct(pos_paired, 1.0)]
        start = f"{fmt(cold, '.2f')} / {fmt(warm, '.2f')} ({fmt(wcold, '.2f')} / {fmt(wwarm, '.3f')})"
        steps_s = best(runs, "steps_ttft_s", lower=True)
        flop = best(runs, "prefill_flop")
        at_peak = flop / (fpeak[j] * 1e9) if flop and fpeak.get(j) else None    # the prefill at the FMA peak
        r.update(steps_s=steps_s, prefill_at_peak_s=at_peak)
        cells += [fmt(ttft, ".2f"), ratio(steps_s, ttft, ".1f"), pct(at_peak, ttft),
                  fmt(best(runs, "overhead_pct", lower=True), ".1f"),
                  start, fmt(bound), pct(rate, bound), pct(paired, 1.0),
                  f"{fmt(lt and lt['tok_s'])} ({LLAMA_TYPE.get(dt)})" if lt else "–",
                  ratio(rate, lt and lt["tok_s"]), fmt(r["llama_ttft_s"], ".2f"),
                  fmt(pt.get("tok_s")) if dt == "f32" else f"{fmt(pt.get('tok_s'))} (fp32)",
                  ratio(rate, pt.get("tok_s")), fmt(pt.get("ttft_s"), ".2f")]
        table.append("| " + " | ".join(cells) + " |")
    res["rows"] = rows

    lines = [f"# gpt2asm bench — {res['date']}", "",
             f"{res['cpu']}, {platform.machine()}, {os.cpu_count()} cores, kernel families {', '.join(fams)}; "
             f"model `{d}`" + (" (random-init)" if _random_init(d) else "") + "; one run of `tools/bench.py`"
             + (" --quick" if a.quick else "") + f", {time.time() - t_start:.0f} s. The machine may be shared: "
             "compare ratios within this table.", "",
             "read bandwidth (our streaming-read kernel, 1 GiB; every measurement of the run, in order): "
             + "; ".join(f"-j {j}: {' / '.join(fmt(x.get('gbps')) for x in bw[j])} GB/s" for j in threads),
             "", "FMA peak (our FMA probe, start / end of the run): "
             + "; ".join(f"-j {j}: {' / '.join(fmt(x.get('gflops')) for x in peak[j])} GFLOP/s" for j in threads),
             ""]
    if emulated():
        lines += [f"**Emulated ({platform.machine()} under qemu-user, CPU `{emulated()}`): these figures measure "
                  "the emulator, not the kernels — they mean nothing about speed on real hardware.**", ""]
    lines += table
    lines += ["", f"- tok/s @{t200}: greedy decode of tokens 2..{t200} after a 9-token prompt"
              + (f"; @{t800}: the 64 tokens ending at position {t800} of the same generation; @{t800}/@{t200}: "
                 f"decode at position {t800} over decode at position {t200} (the 64 tokens ending there)"
                 if t800 else "")
              + f"; TTFT: a {prompt_len}-token prompt to its first token (best of {max(1, a.repeat)} run(s)); "
              f"decode weights {'mapped from the tile cache' if a.cache == 'warm' else 'tiled in memory'}; "
              "KV cache: the default of each dtype (f32 for f32, binary16 for f16 and q8).",
              "- start-up: to the first forward step in a fresh process (weights + kernels + tokenizer + model), "
              "cold = weights.load_weights, warm = gpt2asm.tilecache (tiles mapped); best of 2.",
              "- bound = read bandwidth at -j N measured just before and after the run (the higher of the two) "
              "/ bytes of weight matrices per token; with --repeat, the run with the best ratio to its own bound "
              "is shown ("
              + ", ".join(f"{r['dtype']} {r['weight_bytes'] / 1e6:.0f} MB" for r in _uniq(rows)) + ").",
              *([f"- @{t800}/@{t200} paired: one decode step at position {t800} against one at position {t200}, "
                 "alternating in the row's process over a cache prefilled to that position (15 pairs, the median "
                 f"of step time @{t200} / step time @{t800}; the best of the row's runs): the position's cost "
                 "with the machine's neighbours paired out."] if t800 else []),
              f"- step/read paired: one decode step at position {t200} against one read of the same weight bytes "
              "with our read kernel on the same thread count, alternating in the row's process (15 pairs, the "
              "median of read time / step time; the best of the row's runs): the share of the bus a step "
              "reaches with both under the same load from the machine's neighbours.",
              f"- llama.cpp: {llama_note}; tg128 = `-n 128 -p 0`, TTFT = {prompt_len} / pp{prompt_len} "
              f"(`-n 0 -p {prompt_len}`), same thread count; q8 compares with Q8_0.",
              "- PyTorch: " + ((", ".join(f"-j {j}: {v.get('error') or 'torch ' + v.get('version', '?')}"
                                          for j, v in torch_res.items())
                                + f"; transformers fp32 generate() of {t200} tokens; TTFT = one forward over "
                                f"{prompt_len} tokens.") if torch_res else "skipped (--no-torch)."),
              "- q8: " + ("measured" if "q8" in dtypes else "not in --dtypes" if q8 else
                          "the engine has no dtype='q8' (gpt2asm.engine.DTYPES): skipped")]
    same = [x.get("prefill_identical") for r in rows for x in r["runs"] if "prefill_identical" in x]
    lines.append(f"- steps/TTFT: {prompt_len} cached steps (model.step) over the same prompt / TTFT through the "
                 "batched prefill; last-token logits of both bit-identical: "
                 + (("yes, every row" if all(same) else f"NO in {same.count(False)} row(s)") if same else "–"))
    lims = [f"{r['dtype']} -j {r['threads']} {r['steps_s'] / r['prefill_at_peak_s']:.1f}x" for r in rows
            if r.get("steps_s") and r.get("prefill_at_peak_s")]
    if lims:
        lines.append(f"- of FMA peak: the prefill's {prompt_len}-token flop count "
                     f"({best([x for r in rows for x in r['runs']], 'prefill_flop') / 1e9:.1f} GFLOP) over its TTFT, "
                     "against the FMA peak at the same -j (the higher of the two probe readings); at that peak, "
                     "steps/TTFT could reach at most: " + ", ".join(lims))
    lines.append("- Python %: share of a decode step's wall time spent outside the library's plan_step "
                 "(Python, ctypes, sampling), 64 greedy tokens.")
    waits = [f"{r['dtype']} -j {r['threads']}: {x['resident']} (waited {x['resident_wait_s']:.2f} s)"
             for r in rows for x in r["runs"][:1] if "resident" in x]
    if waits:
        lines.append("- decode weights: the tiles mapped at a warm start are copied into anonymous memory in the "
                     "background (gpt2asm/resident.py); the decode rows start once that is done: "
                     + "; ".join(waits))
    for dt, su in startup.items():
        w, c = _fastest(su.get("warm", [])), _fastest(su.get("cold", []))
        lines.append(f"- start-up {dt}: cold {_detail(c)}; warm {_detail(w)}")
    errors = [f"{r['isa']} {r['dtype']} -j {r['threads']}: {x['error']}"
              for r in rows for x in r["runs"] if "error" in x]
    if errors:
        lines += ["", "errors:"] + [f"- {e}" for e in errors]
    if llama:
        lines += ["", "llama.cpp rows (llama-bench -o json):", "",
                  "| type | -t | test | tok/s | ± |", "|---|---|---|---|---|"]
        lines += [f"| {r['type']} | {r['threads']} | {r['test']} | {r['tok_s']:.1f} | {r['tok_s_sd']:.1f} |"
                  for r in llama]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"written to {out} and {out.with_suffix('.json')}")
    return 0


def _fastest(runs: list) -> dict:
    ok = [r for r in runs if isinstance(r.get("seconds"), (int, float))]
    return min(ok, key=lambda r: r["seconds"]) if ok else (runs[0] if runs else {})


def _uniq(rows):
    seen = {}
    for r in rows:
        if r.get("weight_bytes") and r["dtype"] not in seen:
            seen[r["dtype"]] = r
    return list(seen.values())


def _detail(s: dict) -> str:
    if not s:
        return "–"
    if "error" in s:
        return s["error"]
    parts = [f"{s['seconds']:.2f} s"]
    for k, name in (("weights_s", "weights"), ("tokenizer_s", "tokenizer"), ("first_step_s", "first step"),
                    ("imports_s", "imports")):
        if k in s:
            parts.append(f"{name} {s[k]:.2f}")
    return " ".join(parts[:1]) + " (" + ", ".join(parts[1:]) + f"; {s.get('how', '')})"


def _random_init(d: Path) -> bool:
    try:
        return bool(json.loads((d / "config.json").read_text()).get("gpt2asm_random_init"))
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
