#!/usr/bin/env python3
"""make bench: one table from one run -- gpt2asm per kernel family x dtype x -j, beside the machine's read
bandwidth bound, PyTorch and llama.cpp, all measured in this run.

    python tools/bench.py --model DIR [--quick] [--threads 1,2] [--isa avx2,avx512] [--dtypes f32,f16,q8_0,q4_0]
                          [--batch 1,2,4,8,16,32] [--no-batch] [--no-server] [--no-ppl]
                          [--no-torch] [--no-llamacpp] [--repeat N] [--out results/bench.md]

Every figure runs in its own fresh Python process (tools/bench.py --worker SPEC), one after the other, so
the measurements neither share memory nor threads. The machine is shared: compare ratios, not figures
from different runs. Columns:

    tok/s @200     greedy decode after a 9-token prompt, tokens 2..200 (the first one is the prompt's); the
                   best of --decode-runs generations (default 3) in the row's process
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
    of FMA peak    the prefill's flop rate (its FMAs x 2 / TTFT) over the FMA peak of the row's kernel family at
                   -j N (its own FMA probe, gpt2asm_fmapeak_f32_<family>: 12 or 16 independent chains), which
                   bounds steps/TTFT: every (token, output) of a float prefill is an exact fp32 FMA chain, as
                   in a cached step (q8_0 / q4_0 prefills are integer: no share)
    step/read      a decode step at position 200 against a read of the same weight bytes (our read kernel,
      paired       same -j), alternating in one process: median of read time / step time over 15 pairs
    Python %       share of a decode step spent outside the library (Python, ctypes, sampling)
    llama.cpp      llama-bench -n 128 -p 0 (decode) and -n 0 -p 512 (prefill), same checkpoint as GGUF F32 /
                   F16 / Q8_0 / Q4_0 (`make llamacpp` builds it; skipped when absent)
    vs llama.cpp   the row's decode tok/s over llama.cpp's Q8_0 and Q4_0 tg128
      Q8_0 / Q4_0
    TTFT 512 vs    fp32's TTFT of the same family and -j in this run over the row's, and llama.cpp's Q8_0
      f32 / Q8_0   512 / pp512 over the row's (> 1x: the row is faster)
    PPL vs fp32    perplexity over tools/data/ppl.txt (public domain, ~3k tokens; gpt2asm.scoring's sliding
                   windows) and its change from fp32's; a table beside it: greedy agreement with fp32 and
                   max |logit - fp32 logit| over every scored position
    q8_0 / q4_0    bound = bytes of their matrices per token: 34 / 18 bytes per 32 weights (the fp16 scale
                   included), the LM head in q8_0; skipped with a note while the build cannot run them
                   (KernelUnavailableError)
Tables after the main one:
    batched        aggregate greedy decode tok/s of B = 1, 2, 4, 8, 16, 32 concurrent streams per dtype and
                   -j (each stream prefilled with its own prompt to position ~200, then N steps of
                   Transformer.step_batch for all B) and its ratio to B = 1; llama.cpp's
                   llama-batched-bench S_TG beside it (-npp 200 -ntg N, prompts not shared) where built
    no VNNI        on a CPU with VNNI: q8_0 / q4_0 TTFT with the family's plain integer kernels
                   (GPT2ASM_Q0_PLAIN=1, what a CPU without VNNI runs) against fp32 and the VNNI rows (--no-plain)
    server         `python -m gpt2asm serve` on 127.0.0.1 (ephemeral port) per dtype at the largest -j,
                   8 concurrent streaming greedy clients: TTFT and inter-token p50 / p99, aggregate tok/s
    PyTorch        transformers GPT2LMHeadModel, fp32, torch.set_num_threads(N): generate() 200 tokens, and
                   one forward over 512 tokens for TTFT
Results go to results/bench.md and results/bench.json.
"""
from __future__ import annotations

import argparse
import hashlib
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
LLAMA_TYPE = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}
Q0_DTYPES = ("q8_0", "q4_0")
WORKER_TIMEOUT = 1200
READBW = {"x86_64": "gpt2asm_readbw_f32_avx2", "aarch64": "gpt2asm_readbw_f32_neon"}   # our read kernel
# each kernel family's own FMA probe: (symbol, flop per iteration); a family without one uses its arch's first
FMAPEAK = {"x86_64": {"avx2": ("gpt2asm_fmapeak_f32_avx2", 192), "avx512": ("gpt2asm_fmapeak_f32_avx512", 384)},
           "aarch64": {"neon": ("gpt2asm_fmapeak_f32_neon", 128)}}
TEXT = ROOT / "tools" / "data" / "ppl.txt"      # the public-domain text of the "PPL vs fp32" column
BATCHES = (1, 2, 4, 8, 16, 32)
TTFT_RUNS = 3                                   # TTFT: the best of this many prompts per row process
DECODE_RUNS = 3                                 # tok/s @200: the best of this many generations per row process
BATCH_SWEEPS = 2                                # batched decode: each B the best of this many sweeps over B


def fmapeak_probe(arch: str, isa: str | None) -> tuple[str, int, str]:
    """(symbol, flop per iteration, the family it measures) of the FMA probe of kernel family isa."""
    probes = FMAPEAK[arch]
    fam = isa if isa in probes else next(iter(probes))
    return (*probes[fam], fam)


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


def w_fmapeak(threads: int, isa: str | None = None, seconds: float = 0.3, reps: int = 3) -> dict:
    """GFLOP/s of fp32 FMAs on `threads` threads at once (the FMA probe of kernel family isa, register
    operands only)."""
    import ctypes

    from gpt2asm.lib import ARCH, load_library
    name, flop, fam = fmapeak_probe(ARCH, isa)
    lib = load_library()
    if not hasattr(lib, name):                         # an older library: the arch's first probe, said so
        name, flop, fam = fmapeak_probe(ARCH, None)
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_float
    t0 = time.perf_counter()
    fn(1 << 20)
    n = max(1 << 16, int((1 << 20) * seconds / max(time.perf_counter() - t0, 1e-6)))
    return {"gflops": _best_rate(fn, [(n,)] * threads, n * flop * threads / 1e9, reps), "probe": name,
            "probe_family": fam}


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
    _check_q0(dt, k)
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


def _check_q0(dtype: str, kernels) -> None:
    """KernelUnavailableError where GPT2.load would raise it (q8_0 / q4_0 before the plan runs them)."""
    from gpt2asm import engine
    check = getattr(engine, "_check_kernels_for", None)
    if check is not None:
        try:
            check(dtype, kernels)
        except BaseException:
            kernels.close()
            raise


def q0_matrix_bytes(w) -> int:
    """Bytes a q8_0 / q4_0 decode step reads of weight matrices: the 4 block matrices of every layer in the
    dtype's blocks (34 or 18 bytes per 32 weights, the fp16 scale included) and the LM head in its kind
    (quant0.head_kind: q8_0 34 bytes per 32, q6_k 210 per 256), its vocabulary padded as the tiles are."""
    from gpt2asm.quant0 import head_kind, row_bytes
    cfg = w.config
    C, L, V = cfg.n_embd, cfg.n_layer, getattr(w, "n_vocab_padded", cfg.vocab_size)
    # per layer c_attn 3C, attn c_proj C and c_fc 4C rows of C inputs, mlp c_proj C rows of 4C
    return L * (8 * C * row_bytes(C, w.dtype) + C * row_bytes(4 * C, w.dtype)) + V * row_bytes(C, head_kind(w.dtype, C))


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


def from_start(stamps: list, g: int) -> float:
    """tok/s over generated tokens 2..g (the first token's time is the prompt's)."""
    return (g - 1) / (stamps[g - 1] - stamps[0])


def w_ours(model: str, dtype: str, isa: str, threads: int, tokens: list, prompt_len: int, cache: str,
           decode_runs: int = 1) -> dict:
    import numpy as np

    from gpt2asm.resident import matrix_slots
    m, load_s, detail = _build(Path(model), dtype, isa, threads, cache)
    mats = [getattr(o, n, None) for o, n in matrix_slots(m.model.w)]          # the matrices
    nbytes = sum(a.nbytes for a in mats if a is not None)
    out = {"weight_bytes": nbytes, "load_s": load_s, **detail}
    if dtype in Q0_DTYPES:                            # the blocks' bytes (the records may hold padding)
        out["record_bytes"], nbytes = nbytes, q0_matrix_bytes(m.model.w)
        out["weight_bytes"] = nbytes
    # decode runs from anonymous memory: wait for the background copy of the mapped tiles (resident.py;
    # the start-up figures are measured separately, to the first forward step)
    res = getattr(m.model, "resident", None)
    if res is not None:
        t0 = time.perf_counter()
        res.wait()
        out["resident_wait_s"] = time.perf_counter() - t0
        out["resident"] = res.reason or f"copied {res.nbytes / 1e6:.0f} MB"
    # decode: one greedy generation to max(tokens), a timestamp per token
    def gen_stamps(n: int) -> list:                   # a timestamp per generated token
        return [time.perf_counter() for _ in m.generate_ids(ids, n, temperature=0)]

    ids = m.encode(PROMPT)
    stamps = gen_stamps(max(tokens))
    pos0 = len(ids)                                   # position of the first generated token's step
    for t in tokens:
        g = t - pos0                                  # generated tokens up to position t
        if g < 2 or g > len(stamps):
            continue
        a = max(1, g - 64)                            # the local rate at position t: its last 64 tokens
        out[f"tok_s_{t}_local"] = (g - a) / (stamps[g - 1] - stamps[a - 1])
        if t == min(tokens):                          # from the start: comparable to llama-bench tg
            out[f"tok_s_{t}"] = from_start(stamps, g)
        else:
            out[f"tok_s_{t}"] = out[f"tok_s_{t}_local"]
    # the first position's rate again, from the start (decode_runs generations in all): one generation is
    # at the mercy of the machine's neighbours for its few seconds; the best of them is kept
    t = min(tokens)
    if f"tok_s_{t}" in out and decode_runs > 1:
        rates = [out[f"tok_s_{t}"]] + [from_start(gen_stamps(t - pos0), t - pos0) for _ in range(decode_runs - 1)]
        out[f"tok_s_{t}"], out[f"tok_s_{t}_runs"] = max(rates), rates
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
    if prompt_len:
        out.update(_ttft(m, prompt_len))
    m.close()
    return out


def _ttft(m, prompt_len: int, steps: bool = True) -> dict:
    """Time to first token for a prompt of prompt_len tokens (the best of TTFT_RUNS random prompts: one run
    is at the bus's mercy), and the SHA-256 of the first prompt's last-token logits: from prompt_len cached
    steps, compared bit for bit with the prefill's (steps=True), or from the prefill alone."""
    import numpy as np

    rng = np.random.default_rng(0)
    prompts = [[int(x) for x in rng.integers(0, m.config.vocab_size - 1, prompt_len)] for _ in range(TTFT_RUNS)]
    pids = prompts[0]
    ttfts = []
    for p in prompts:
        t0 = time.perf_counter()
        next(iter(m.generate_ids(p, 1, temperature=0)))
        ttfts.append(time.perf_counter() - t0)
    out = {"ttft_s": min(ttfts), "ttft_runs_s": ttfts, "prompt_len": prompt_len,
           "prefill_flop": prefill_flop(m.config, prompt_len)}
    pre = m.model.prefill(m.model.new_state(), pids)[0]
    logits = pre
    if steps:                                         # the same prompt as prompt_len cached steps
        st = m.model.new_state()
        t0 = time.perf_counter()
        for t in pids:
            logits = m.model.step(st, t)[0]
        out["steps_ttft_s"] = time.perf_counter() - t0
        out["prefill_identical"] = bool(np.array_equal(pre.view(np.uint32), logits.view(np.uint32)))
    out["logits_sha"] = hashlib.sha256(np.ascontiguousarray(logits, dtype=np.float32).tobytes()).hexdigest()
    return out


def w_plain(model: str, dtype: str, isa: str, threads: int, prompt_len: int, cache: str) -> dict:
    """A q8_0 / q4_0 prefill with the family's plain integer kernels (run with GPT2ASM_Q0_PLAIN=1: what a CPU
    without VNNI runs): its TTFT and logits hash (from the prefill, which equals the cached steps' in every
    main row)."""
    m, _, _ = _build(Path(model), dtype, isa, threads, cache)
    res = getattr(m.model, "resident", None)
    if res is not None:
        res.wait()
    out = {"variant": m.model.k._q0_variant(), **_ttft(m, prompt_len, steps=False)}
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


def w_quality(model: str, dtypes: list, isa: str | None, threads: int, text: str, max_tokens: int) -> dict:
    """Each dtype against fp32 over the text in file `text` (its first max_tokens tokens; 0 = all), scored
    as gpt2asm.scoring scores text (transformers' sliding windows of n_ctx, stride 512; log-softmax in
    float64): PPL, and over every scored position greedy agreement (argmax of the dtype's logits = fp32's)
    and max |logit - fp32 logit|.  A dtype the build cannot run yet is 'skipped' with its message."""
    import numpy as np

    from gpt2asm import scoring
    from gpt2asm.engine import GPT2
    from gpt2asm.errors import KernelUnavailableError
    body = "".join(line for line in Path(text).read_text(encoding="utf-8").splitlines(keepends=True)
                   if not line.startswith("#"))                    # the header lines name the source
    ref = GPT2.load(model, dtype="f32", isa=isa, threads=threads)
    ids = ref.encode(body)
    ids = ids[:max_tokens] if max_tokens else ids
    models, out = {}, {"tokens": len(ids), "text": str(text), "dtypes": {}}
    for dt in dtypes:
        if dt == "f32":
            continue
        try:
            models[dt] = GPT2.load(model, dtype=dt, isa=isa, threads=threads)
        except KernelUnavailableError as e:
            out["dtypes"][dt] = {"skipped": str(e).split(";")[0]}
        except Exception as e:
            out["dtypes"][dt] = {"error": f"{type(e).__name__}: {e}"}
    acc = {dt: {"lp": np.full(len(ids), np.nan), "agree": 0, "n": 0, "max_dlogit": 0.0, "s": 0.0}
           for dt in ["f32", *models]}
    stride = scoring.default_stride(ref.config.n_ctx)
    for begin, end, first in scoring.windows(len(ids), ref.config.n_ctx, stride):
        if first >= end:
            continue
        rows, tgt = slice(first - 1 - begin, end - 1 - begin), ids[first:end]
        t0 = time.perf_counter()
        r = ref.logits(ids[begin:end])[rows]                    # [end - first][V] predicting tokens first..end-1
        acc["f32"]["s"] += time.perf_counter() - t0
        top = r.argmax(axis=-1)
        for dt, m in [("f32", ref), *models.items()]:
            a = acc[dt]
            if dt != "f32":
                t0 = time.perf_counter()
                x = m.logits(ids[begin:end])[rows]
                a["s"] += time.perf_counter() - t0
                a["max_dlogit"] = max(a["max_dlogit"], float(np.abs(x.astype(np.float64) - r).max()))
            else:
                x = r
            a["lp"][first:end] = scoring.picked_log_softmax(x, np.asarray(tgt))
            a["agree"] += int((x.argmax(axis=-1) == top).sum())
            a["n"] += end - first
    skips = out["dtypes"]
    out["dtypes"] = {}                                # fp32 first, then the dtypes in the order asked
    for dt, a in acc.items():
        out["dtypes"][dt] = {"ppl": scoring.perplexity(a["lp"]), "agreement": a["agree"] / max(a["n"], 1),
                             "max_dlogit": a["max_dlogit"], "scored": a["n"],
                             "tok_s": a["n"] / a["s"] if a["s"] else None}
    out["dtypes"].update(skips)
    for m in [ref, *models.values()]:
        m.close()
    return out


def w_batch(model: str, dtype: str, isa: str | None, threads: int, batches: list, pos: int, steps: int) -> dict:
    """Aggregate greedy decode of B streams at once (Transformer.step_batch: one engine call per step for all
    B): max(batches) states each prefilled with its own random prompt of pos tokens; once the resident copy
    of the weights is in, BATCH_SWEEPS sweeps over B (forward, backward, ...): for each B, the first B states
    rewound to position pos (each step rewrites cache rows a step already wrote), one untimed step, rewound
    again, then `steps` timed steps, each feeding every stream its own argmax.  tokens/s summed over the B
    streams, each B's fastest sweep."""
    import numpy as np

    from gpt2asm.engine import GPT2
    m = GPT2.load(model, dtype=dtype, isa=isa, threads=threads)
    rng = np.random.default_rng(3)
    states, first = [], []
    for _ in range(max(batches)):
        st = m.model.new_state()
        first.append(m.model.prefill(st, [int(x) for x in rng.integers(0, m.config.vocab_size - 1, pos)])[1] or 0)
        states.append(st)
    res = getattr(m.model, "resident", None)          # time the anonymous copy, not the mapped tiles
    if res is not None:
        res.wait()
    n0 = states[0].n
    out = {"pos": n0, "steps": steps, "rows": {}, "sweeps": BATCH_SWEEPS}
    order = list(batches)
    for sweep in range(BATCH_SWEEPS):                 # forward, then backward: each B's best of the sweeps
        for B in (order if sweep % 2 == 0 else order[::-1]):
            sts = states[:B]
            for s in sts:
                s.n = n0
            m.model.step_batch(sts, first[:B])                     # warm-up
            for s in sts:
                s.n = n0
            cur = first[:B]
            t0 = time.perf_counter()
            for _ in range(steps):
                cur = [a or 0 for a in m.model.step_batch(sts, cur)[1]]
            dt = time.perf_counter() - t0
            prev = out["rows"].get(str(B))
            if prev is None or dt / steps < prev["step_s"]:
                out["rows"][str(B)] = {"tok_s": B * steps / dt, "step_s": dt / steps}
    m.close()
    return out


def w_server(model: str, dtype: str, isa: str | None, threads: int, clients: int, requests: int,
             max_tokens: int, limit_s: float) -> dict:
    """`python -m gpt2asm serve` on 127.0.0.1 (an ephemeral port), then `clients` concurrent streaming
    greedy clients, each sending `requests` completions of max_tokens one after the other (after one
    untimed round of `clients` concurrent requests): TTFT (request sent to first streamed token) and inter-token gaps (between a stream's
    successive chunks), p50 / p99 over all.  Everything bounded by limit_s; the server gets SIGTERM."""
    import http.client
    import signal
    import socket
    import tempfile
    import threading

    import numpy as np
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "gpt2asm", "serve", "--model", model, "--dtype", dtype, "-j", str(threads),
           "--host", "127.0.0.1", "--port", str(port), "--max-batch", str(max(8, clients)),
           "--log-level", "warning", "--offline"] + (["-s", isa] if isa else [])
    log = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + limit_s

    def tail():
        log.seek(0)
        return log.read().strip()[-400:]

    def request(prompt: str, stamps: list) -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=max(1.0, deadline - time.monotonic()))
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True})
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        stamps.append(t0)
        while time.monotonic() < deadline:
            line = r.readline()
            if not line or line.strip() == b"data: [DONE]":
                break
            if line.startswith(b"data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(str(chunk["error"])[:200])
                for ch in chunk.get("choices", []):
                    if ch.get("finish_reason") == "error":
                        raise RuntimeError("a stream ended with finish_reason 'error'")
                if any(ch.get("text") for ch in chunk.get("choices", [])):
                    stamps.append(time.perf_counter())
        c.close()
    try:
        while True:                                             # until /health says the model is loaded
            if p.poll() is not None:
                return {"error": f"the server exited {p.returncode}: {tail()}"}
            if time.monotonic() > deadline:
                return {"error": f"the server did not come up in {limit_s:.0f} s"}
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        def round_of(target) -> None:
            """target(i) for every client i, concurrently, until all end or the deadline."""
            ts = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(clients)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(max(0.0, deadline - time.monotonic()))

        def warm_one(i):
            try:
                request(f"{PROMPT} (w{i})", [])
            except Exception:                               # noqa: BLE001 -- the timed rounds report errors
                pass
        # warm-up: one untimed round of `clients` concurrent requests, so that the timed rounds find the
        # slots' KV caches allocated and touched and the batch / prefill plans of those sizes built
        round_of(warm_one)
        streams, errors = [], []

        def client(i):
            for k in range(requests):
                st = []
                try:
                    request(f"{PROMPT} ({i}.{k})", st)
                except Exception as e:
                    errors.append(f"{type(e).__name__}: {e}")
                    return
                streams.append(st)
        t0 = time.perf_counter()
        round_of(client)
        wall = time.perf_counter() - t0
        ttft = [s[1] - s[0] for s in streams if len(s) > 1]
        gaps = [b - a for s in streams for a, b in zip(s[1:], s[2:])]
        out = {"clients": clients, "threads": threads, "requests": len(streams), "errors": errors[:3],
               "max_tokens": max_tokens,
               "tokens": sum(len(s) - 1 for s in streams), "wall_s": wall}
        for name, v in (("ttft", ttft), ("itl", gaps)):
            if v:
                out[f"{name}_p50"], out[f"{name}_p99"] = (float(x) for x in np.percentile(v, [50, 99]))
        out["tok_s"] = out["tokens"] / wall if wall else None
        return out
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()


WORKERS = {"readbw": w_readbw, "fmapeak": w_fmapeak, "startup": w_startup, "ours": w_ours, "torch": w_torch,
           "quality": w_quality, "batch": w_batch, "server": w_server, "plain": w_plain}


def worker_main(spec: str) -> int:
    s = json.loads(spec)
    kind = s.pop("kind")
    try:
        res = WORKERS[kind](**s)
    except Exception as e:                             # reported in the table, never fatal
        if type(e).__name__ == "KernelUnavailableError":       # q8_0 / q4_0 before the plan runs them
            res = {"skipped": str(e).split(";")[0]}
        else:
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
    ap.add_argument("--dtypes", default=None,
                    help="default f32,f16 and those of q8_0,q4_0 the engine knows (a dtype the build cannot "
                         "run yet is skipped with a note)")
    ap.add_argument("--batch", default=None, metavar="B,..",
                    help="concurrent greedy streams of the batch table (default 1,2,4,8,16,32; quick 1,2,4,8)")
    ap.add_argument("--batch-steps", type=int, default=None, help="timed steps per B (default 32; quick 8)")
    ap.add_argument("--no-batch", action="store_true", help="no batch table")
    ap.add_argument("--no-server", action="store_true", help="no server latency table")
    ap.add_argument("--server-clients", type=int, default=8, help="concurrent streaming clients (default 8)")
    ap.add_argument("--server-requests", type=int, default=None, help="requests per client (default 4; quick 1)")
    ap.add_argument("--server-tokens", type=int, default=None, help="max_tokens per request (default 64; quick 16)")
    ap.add_argument("--no-plain", action="store_true",
                    help="no TTFT table of the plain (no-VNNI) q8_0 / q4_0 kernels on a CPU with VNNI")
    ap.add_argument("--no-ppl", action="store_true", help="no PPL / greedy agreement / max |dlogit| vs fp32")
    ap.add_argument("--ppl-tokens", type=int, default=None,
                    help=f"tokens of {TEXT.relative_to(ROOT)} to score (default 0 = all; quick 256)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each of our rows; the best is kept")
    ap.add_argument("--decode-runs", type=int, default=None,
                    help=f"greedy generations to the first --tokens position per row process, the best rate "
                         f"kept (default {DECODE_RUNS}; quick 1)")
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
    from gpt2asm.engine import DTYPES
    dtypes = a.dtypes.split(",") if a.dtypes else ["f32", "f16"] + [q for q in Q0_DTYPES if q in DTYPES]
    from gpt2asm.args import not_retired
    from gpt2asm.errors import GPT2AsmError
    try:
        for dt in dtypes:
            not_retired(dt)                                # named with its successor, before any run
    except GPT2AsmError as e:
        ap.error(f"--dtypes: {e}")
    batches = [int(b) for b in (a.batch or ("1,2,4,8" if a.quick else ",".join(map(str, BATCHES)))).split(",")]
    if not batches or min(batches) < 1:
        ap.error("--batch: positive stream counts")
    batch_steps = a.batch_steps or (8 if a.quick else 32)
    srv_requests = a.server_requests or (1 if a.quick else 4)
    srv_tokens = a.server_tokens or (16 if a.quick else 64)
    ppl_tokens = a.ppl_tokens if a.ppl_tokens is not None else (256 if a.quick else 0)
    reps = a.llama_reps if a.llama_reps is not None else (1 if a.quick else 3)
    decode_runs = a.decode_runs if a.decode_runs is not None else (1 if a.quick else DECODE_RUNS)
    if decode_runs < 1:
        ap.error("--decode-runs: at least 1")
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
                 "prompt_len": prompt_len, "threads": threads, "dtypes": dtypes,
                 "decode_weights": a.cache, "decode_runs": decode_runs}

    say("read bandwidth, FMA peak")
    bw = {j: [spawn("readbw", threads=j)] for j in threads}
    peak = {(f, j): [spawn("fmapeak", threads=j, isa=f)] for f in fams for j in threads}   # each family's own

    startup, skipped = {}, {}                         # skipped: dtype -> why (the build cannot run it yet)
    if not a.no_startup:
        for dt in dtypes:
            say(f"start-up {dt}")
            first = spawn("startup", model=str(d), dtype=dt, cache="warm")     # make sure the cache exists
            if "skipped" in first:
                skipped[dt] = first["skipped"]
                continue
            startup[dt] = {c: [spawn("startup", model=str(d), dtype=dt, cache=c) for _ in range(2)]
                           for c in ("cold", "warm")}
    elif a.cache == "warm":
        for dt in dtypes:
            spawn("startup", model=str(d), dtype=dt, cache="warm")

    rows = []
    for fam in fams:
        for dt in dtypes:
            for j in threads:
                if dt in skipped:
                    rows.append({"isa": fam, "dtype": dt, "threads": j, "runs": [], "skipped": skipped[dt]})
                    continue
                say(f"ours {fam} {dt} -j {j}")
                runs, near = [], [spawn("readbw", threads=j)]     # the bound measured next to the row
                for _ in range(max(1, a.repeat)):
                    runs.append(spawn("ours", model=str(d), dtype=dt, isa=fam, threads=j, tokens=tokens,
                                      prompt_len=prompt_len, cache=a.cache, decode_runs=decode_runs))
                    near.append(spawn("readbw", threads=j))
                bw[j] += near
                for i, run in enumerate(runs):            # each run against the readings around it
                    run["gbps"] = best(near[i:i + 2], "gbps")
                if any("skipped" in x for x in runs):
                    skipped[dt] = next(x["skipped"] for x in runs if "skipped" in x)
                    rows.append({"isa": fam, "dtype": dt, "threads": j, "runs": [], "skipped": skipped[dt]})
                    continue
                rows.append({"isa": fam, "dtype": dt, "threads": j, "runs": runs})

    plain = []                                        # the plain integer kernels where this CPU has VNNI
    if not a.no_plain and prompt_len:
        from gpt2asm.q0kernels import q0_variant
        for fam in fams:
            try:
                vnni, base = q0_variant(fam, plain=False), q0_variant(fam, plain=True)
            except GPT2AsmError:                          # a family without q0 kernels
                continue
            if vnni == base:                              # no VNNI here: the main rows are the plain ones
                continue
            for j in threads:
                say(f"plain integer kernels {fam} -j {j}: TTFT {prompt_len}")
                row = {"isa": fam, "threads": j, "vnni": vnni}
                for dt in (x for x in dtypes if x in Q0_DTYPES and x not in skipped):
                    row[dt] = spawn("plain", env={"GPT2ASM_Q0_PLAIN": "1"}, model=str(d), dtype=dt, isa=fam,
                                    threads=j, prompt_len=prompt_len, cache=a.cache)
                plain.append(row)

    quality = {}
    if not a.no_ppl:
        say("PPL, greedy agreement, max |dlogit| vs fp32")
        quality = spawn("quality", model=str(d), dtypes=[x for x in dtypes if x not in skipped], isa=None,
                        threads=max(threads), text=str(TEXT), max_tokens=ppl_tokens)
        for dt, q in quality.get("dtypes", {}).items():
            if "skipped" in q:
                skipped.setdefault(dt, q["skipped"])

    batch_res = {}
    if not a.no_batch:
        for dt in dtypes:
            for j in threads:
                if dt in skipped:
                    continue
                say(f"batched decode {dt} -j {j}: B = {','.join(map(str, batches))}")
                batch_res[dt, j] = spawn("batch", model=str(d), dtype=dt, isa=None, threads=j, batches=batches,
                                         pos=min(tokens), steps=batch_steps)

    server_res = {}
    if not a.no_server:
        for dt in dtypes:
            if dt in skipped:
                continue
            say(f"server {dt} -j {max(threads)}: {a.server_clients} streaming clients")
            server_res[dt] = spawn("server", model=str(d), dtype=dt, isa=None, threads=max(threads),
                                   clients=a.server_clients, requests=srv_requests, max_tokens=srv_tokens,
                                   limit_s=600.0)

    torch_res = {}
    if not a.no_torch:
        for j in threads:
            say(f"PyTorch -j {j}")
            torch_res[j] = spawn("torch", model=str(d), threads=j, tokens=min(tokens), prompt_len=prompt_len)

    llama = llama_batched = None
    llama_note = "skipped (--no-llamacpp)"
    llama_batched_note = ("not built: `make llamacpp` builds llama-batched-bench" if not a.no_llamacpp
                          else llama_note)
    if not a.no_llamacpp:
        import llamacpp
        st = llamacpp.status(d)
        if not st["llama-bench"]:
            llama_note = "not built: run `make llamacpp`"
        elif not any(st["gguf"].values()):
            llama_note = f"no GGUF of {d}: run `make llamacpp MODEL={a.model}`"
        else:
            say("llama.cpp")
            try:                                      # every type, Q8_0 and Q4_0 too
                llama = llamacpp.bench(d, threads, n_gen=128, n_prompt=prompt_len, reps=reps)
                llama_note = f"llama-cpp-python {llamacpp.VERSION} sdist, llama-bench -r {reps}"
            except Exception as e:
                llama_note = f"failed: {type(e).__name__}: {e}"
            if not a.no_batch and st.get("llama-batched-bench"):
                say("llama.cpp batched")
                try:
                    llama_batched = llamacpp.batched_bench(d, threads, batches, n_prompt=min(tokens),
                                                           n_gen=batch_steps)
                    llama_batched_note = (f"llama-batched-bench -npp {min(tokens)} -ntg {batch_steps} -npl "
                                          f"{','.join(map(str, batches))} (prompts not shared), S_TG")
                except Exception as e:
                    llama_batched_note = f"failed: {type(e).__name__}: {e}"

    say("read bandwidth, FMA peak (again)")
    for j in threads:
        bw[j].append(spawn("readbw", threads=j))
        for f in fams:
            peak[f, j].append(spawn("fmapeak", threads=j, isa=f))
    say("done")
    phases.pop("done")

    # ---------------------------------------------------------------------------------------------
    res["phase_seconds"] = phases
    res["read_gbps"] = {j: [r.get("gbps") for r in bw[j]] for j in threads}
    res["fma_gflops"] = {f"{f} -j {j}": [r.get("gflops") for r in v] for (f, j), v in peak.items()}
    fpeak = {k: best(v, "gflops") for k, v in peak.items()}
    res["quality"] = quality
    res["batch"] = {f"{dt} -j {j}": v for (dt, j), v in batch_res.items()}
    res["server"] = server_res
    res["llamacpp_batched"] = {"note": llama_batched_note, "rows": llama_batched}
    res["skipped"] = skipped
    res["plain"] = plain
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
        "llama.cpp tok/s", "ours/llama.cpp", "vs llama.cpp Q8_0 / Q4_0", f"llama.cpp TTFT {prompt_len} s",
        f"TTFT {prompt_len} vs f32 / vs llama.cpp Q8_0", "PPL vs fp32",
        "PyTorch tok/s", "ours/PyTorch", f"PyTorch TTFT {prompt_len} s"]
    table = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    qual = quality.get("dtypes", {})
    f32_ttft = {}                                     # (family, -j) -> fp32's TTFT of this run
    for r in rows:
        if r["dtype"] == "f32":
            f32_ttft[r["isa"], r["threads"]] = best(r["runs"], "ttft_s", lower=True)
    for r in rows:
        runs, j, dt = r["runs"], r["threads"], r["dtype"]
        if "skipped" in r:
            table.append("| " + " | ".join([r["isa"], f"{dt} (skipped)", str(j)] + ["–"] * (len(hdr) - 3)) + " |")
            continue
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
        lq8 = lrow("Q8_0", j, f"pp{prompt_len}")
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
        fp = fpeak.get((r["isa"], j))                 # the family's own FMA peak; integer prefills: none
        at_peak = flop / (fp * 1e9) if flop and fp and dt not in Q0_DTYPES else None
        r.update(steps_s=steps_s, prefill_at_peak_s=at_peak)
        cells += [fmt(ttft, ".2f"), ratio(steps_s, ttft, ".1f"), pct(at_peak, ttft),
                  fmt(best(runs, "overhead_pct", lower=True), ".1f"),
                  start, fmt(bound), pct(rate, bound), pct(paired, 1.0),
                  f"{fmt(lt and lt['tok_s'])} ({LLAMA_TYPE.get(dt)})" if lt else "–",
                  ratio(rate, lt and lt["tok_s"]),
                  " / ".join(ratio(rate, (lrow(t, j, "tg128") or {}).get("tok_s")) for t in ("Q8_0", "Q4_0")),
                  fmt(r["llama_ttft_s"], ".2f"),
                  " / ".join([ratio(f32_ttft.get((r["isa"], j)), ttft) if dt != "f32" else "1x",
                              ratio(lq8 and prompt_len / lq8["tok_s"], ttft)]),
                  _ppl_cell(qual.get(dt), qual.get("f32")),
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
             "", "FMA peak (each kernel family's own FMA probe, gpt2asm_fmapeak_f32_<family>; start / end of the "
             "run): " + "; ".join(f"{f} -j {j}: {' / '.join(fmt(x.get('gflops')) for x in v)} GFLOP/s"
                                  + (f" ({v[0]['probe_family']}'s probe)" if v and v[0].get("probe_family")
                                     not in (None, f) else "") for (f, j), v in peak.items()),
             ""]
    if emulated():
        lines += [f"**Emulated ({platform.machine()} under qemu-user, CPU `{emulated()}`): these figures measure "
                  "the emulator, not the kernels — they mean nothing about speed on real hardware.**", ""]
    lines += table
    lines += ["", f"- tok/s @{t200}: greedy decode of tokens 2..{t200} after a 9-token prompt (the best of "
              f"{decode_runs} generation(s) in each run)"
              + (f"; @{t800}: the 64 tokens ending at position {t800} of the same generation; @{t800}/@{t200}: "
                 f"decode at position {t800} over decode at position {t200} (the 64 tokens ending there)"
                 if t800 else "")
              + f"; TTFT: a {prompt_len}-token prompt to its first token (the best of {TTFT_RUNS} random prompts in each of "
              f"{max(1, a.repeat)} run(s)); "
              f"decode weights {'mapped from the tile cache' if a.cache == 'warm' else 'tiled in memory'}; "
              "KV cache: the default of each dtype (f32 for f32, binary16 for the others).",
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
              f"(`-n 0 -p {prompt_len}`), same thread count; q8_0 compares with Q8_0, q4_0 with Q4_0 (llama-quantize of the F32 GGUF).",
              "- PyTorch: " + ((", ".join(f"-j {j}: {v.get('error') or 'torch ' + v.get('version', '?')}"
                                          for j, v in torch_res.items())
                                + f"; transformers fp32 generate() of {t200} tokens; TTFT = one forward over "
                                f"{prompt_len} tokens.") if torch_res else "skipped (--no-torch).")]
    same = [x.get("prefill_identical") for r in rows for x in r["runs"] if "prefill_identical" in x]
    lines.append(f"- steps/TTFT: {prompt_len} cached steps (model.step) over the same prompt / TTFT through the "
                 "batched prefill; last-token logits of both bit-identical: "
                 + (("yes, every row" if all(same) else f"NO in {same.count(False)} row(s)") if same else "–"))
    shas: dict = {}                                   # dtype -> {sha: {'family -j N', ...}}
    for r in rows:
        for x in r["runs"]:
            if x.get("logits_sha"):
                shas.setdefault(r["dtype"], {}).setdefault(x["logits_sha"], set()).add(f"{r['isa']} -j {r['threads']}")
    for p in plain:                                   # the plain kernels' prefills (docs: same bits)
        for dt in Q0_DTYPES:
            if (p.get(dt) or {}).get("logits_sha"):
                shas.setdefault(dt, {}).setdefault(p[dt]["logits_sha"], set()).add(
                    f"{p['isa']} {p[dt]['variant']} -j {p['threads']}")
    if shas:
        lines.append(f"- bit-identity: SHA-256 of the last-token logits of the {prompt_len}-token prompt (cached "
                     "steps; the plain integer kernels' rows: their prefill), per dtype over every family, variant "
                     "and -j of this run: "
                     + "; ".join(f"{dt} {next(iter(v))[:16]} (one hash, {len(next(iter(v.values())))} rows)"
                                 if len(v) == 1 else f"{dt}: {len(v)} DIFFERENT hashes" for dt, v in shas.items()))
    lims = [f"{r['isa']} {r['dtype']} -j {r['threads']} {r['steps_s'] / r['prefill_at_peak_s']:.1f}x" for r in rows
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
    from gpt2asm.quant0 import BLOCK_BYTES
    lines.append(f"- q8_0 / q4_0: bound = read bandwidth / bytes of their matrices per token (the block "
                 f"matrices in the dtype's blocks, {BLOCK_BYTES['q8_0']} / {BLOCK_BYTES['q4_0']} bytes per 32 "
                 "weights with the fp16 scale; the LM head in q8_0 for q8_0, in q6_k (210 bytes per 256) for q4_0); "
                 "their prefill is integer, so no FMA-peak share. "
                 f"TTFT {prompt_len} vs f32 / vs llama.cpp Q8_0: fp32's TTFT of the same family and -j in this run, "
                 f"and llama.cpp's {prompt_len} / pp{prompt_len} of its Q8_0 GGUF, over the row's TTFT (> 1x: "
                 "faster). vs llama.cpp Q8_0 / Q4_0: the row's decode tok/s over llama.cpp's tg128 of each.")
    for dt, why in skipped.items():
        lines.append(f"- {dt}: skipped, this build cannot run it yet ({why})")
    if quality:
        lines.append(_quality_note(quality))
    errors = [f"{r['isa']} {r['dtype']} -j {r['threads']}: {x['error']}"
              for r in rows for x in r["runs"] if "error" in x]
    if errors:
        lines += ["", "errors:"] + [f"- {e}" for e in errors]
    lines += _quality_table(quality)
    lines += _plain_table(plain, rows, prompt_len)
    lines += _batch_table(batch_res, batches, batch_steps, llama_batched, llama_batched_note, a.no_batch)
    lines += _server_table(server_res, a.server_clients, srv_requests, srv_tokens, a.no_server)
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


def _plain_table(plain: list, rows: list, prompt_len: int) -> list[str]:
    """The q8_0 / q4_0 prefill with the plain integer kernels (what a CPU without VNNI runs: vpmaddubsw /
    vpmaddwd), run here by GPT2ASM_Q0_PLAIN=1 on a CPU that has VNNI, beside fp32's and the VNNI rows' TTFT
    of the same family and -j from the main table."""
    if not plain:
        return []
    ttft = {(r["isa"], r["dtype"], r["threads"]): r.get("ttft_s") for r in rows}
    out = ["", f"Integer prefill without VNNI (TTFT {prompt_len}, s): the plain q8_0 / q4_0 kernels "
           "(`GPT2ASM_Q0_PLAIN=1`, what a CPU without AVX-VNNI / AVX512-VNNI runs) on this CPU, against fp32 "
           "and the VNNI kernels of the same family and -j (main table); > 1x: the plain row is faster. Port "
           "rates differ between CPUs: a CPU without VNNI may differ.", "",
           "| kernels | -j | q8_0 plain | vs f32 | vs q8_0 VNNI | q4_0 plain | vs f32 | vs q4_0 VNNI |",
           "|---|---|---|---|---|---|---|---|"]
    for p in plain:
        fam, j = p["isa"], p["threads"]
        cells = [f"{fam} ({p.get('q8_0', p.get('q4_0', {})).get('variant', '?')} vs {p['vnni']})", str(j)]
        for dt in Q0_DTYPES:
            x = p.get(dt) or {}
            t = x.get("ttft_s")
            cells += ([f"{fmt(t, '.3f')}", ratio(ttft.get((fam, "f32", j)), t), ratio(ttft.get((fam, dt, j)), t)]
                      if t else [x.get("error") or x.get("skipped") or "–", "–", "–"])
        out.append("| " + " | ".join(cells) + " |")
    return out


def _ppl_cell(q: dict | None, ref: dict | None) -> str:
    """'PPL (+d %)' of a dtype against fp32's over the shipped text."""
    if not q or "ppl" not in q:
        return "skipped" if q and "skipped" in q else "–"
    if not ref or "ppl" not in ref or q is ref:
        return f"{q['ppl']:.2f}"
    return f"{q['ppl']:.2f} ({q['ppl'] / ref['ppl'] - 1:+.2%})"


def _rel(p) -> str:
    p = Path(p)
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _quality_note(quality: dict) -> str:
    if "error" in quality:
        return f"- PPL vs fp32: failed: {quality['error']}"
    return (f"- PPL vs fp32: perplexity over the first {quality.get('tokens')} tokens of "
            f"`{_rel(quality.get('text', TEXT))}` "
            "(public domain; gpt2asm.scoring: transformers' sliding windows, stride 512), and its change from "
            "fp32's; the table below adds greedy agreement (the dtype's argmax = fp32's at every scored position, "
            "the text teacher-forced) and the largest |logit - fp32 logit| there. Logits are the same bits on "
            "every family and -j (tests/test_fingerprint.py), so this is measured once per dtype.")


def _quality_table(quality: dict) -> list[str]:
    q = quality.get("dtypes") or {}
    if not q:
        return []
    ref = q.get("f32", {})
    out = ["", "| dtype | PPL | PPL vs fp32 | greedy agreement | max abs dlogit | scored tokens | scoring tok/s |",
           "|---|---|---|---|---|---|---|"]
    for dt, v in q.items():
        if "ppl" not in v:
            out.append(f"| {dt} | {'skipped' if 'skipped' in v else 'error: ' + v.get('error', '?')} |"
                       + " – |" * 5)
            continue
        d = f"{v['ppl'] / ref['ppl'] - 1:+.3%}" if ref.get("ppl") else "–"
        out.append(f"| {dt} | {v['ppl']:.3f} | {d} "
                   f"| {v['agreement']:.2%} | {v['max_dlogit']:.4g} | {v['scored']} | {fmt(v.get('tok_s'))} |")
    return out


def _batch_table(batch_res: dict, batches: list, steps: int, llama_rows, llama_note: str, off: bool) -> list[str]:
    """Aggregate decode tok/s of B concurrent greedy streams and its ratio to B = 1, ours and llama.cpp's."""
    if off:
        return ["", "- batched decode: skipped (--no-batch)"]
    hdr = ["", "dtype", "-j"] + [f"B={b} tok/s" for b in batches]
    out = ["", f"Batched decode: aggregate tok/s of B concurrent greedy streams, each at position ~{'?'} after its own "
           f"prompt, {steps} timed steps of Transformer.step_batch for all B, each B the best of {BATCH_SWEEPS} sweeps over B "
           f"(forward, backward) after the resident copy of the weights is in (x: over B = 1 in the same row).", "",
           "| " + " | ".join(hdr[1:]) + " |", "|" + "---|" * (len(hdr) - 1)]
    pos = None
    for (dt, j), v in batch_res.items():
        pos = v.get("pos", pos)
        cells = [dt, str(j)]
        one = (v.get("rows") or {}).get("1", {}).get("tok_s")
        for b in batches:
            t = (v.get("rows") or {}).get(str(b), {}).get("tok_s")
            cells.append("–" if t is None else f"{t:.1f}" + (f" ({t / one:.2f}x)" if one and b != 1 else ""))
        if "rows" not in v:
            cells[2:] = [v.get("error") or v.get("skipped") or "?"] + ["–"] * (len(batches) - 1)
        out.append("| " + " | ".join(cells) + " |")
    out[1] = out[1].replace("~?", f"~{pos}" if pos else "~?")
    if llama_rows:
        by = {}
        for r in llama_rows:
            by.setdefault((r["type"], r["threads"]), {})[r["pl"]] = r["speed_tg"]
        for (typ, j), v in by.items():
            one = v.get(1)
            out.append("| " + " | ".join([f"llama.cpp {typ}", str(j)] + [
                "–" if v.get(b) is None else f"{v[b]:.1f}" + (f" ({v[b] / one:.2f}x)" if one and b != 1 else "")
                for b in batches]) + " |")
    out += ["", f"- llama.cpp batched: {llama_note}"]
    return out


def _server_table(server_res: dict, clients: int, requests: int, tokens: int, off: bool) -> list[str]:
    """The server's latency under `clients` concurrent streaming clients."""
    if off:
        return ["", "- server: skipped (--no-server)"]
    if not server_res:
        return []
    out = ["", f"Server (`python -m gpt2asm serve` on 127.0.0.1, {clients} concurrent streaming greedy clients, "
           f"{requests} request(s) of {tokens} tokens each, after one untimed round of {clients} concurrent requests):", "",
           "| dtype | -j | requests | tokens | TTFT p50 / p99 ms | inter-token p50 / p99 ms | aggregate tok/s | errors |",
           "|---|---|---|---|---|---|---|---|"]
    for dt, v in server_res.items():
        if "requests" not in v:
            out.append(f"| {dt} | {v.get('threads', '–')} | – | – | – | – | – | {v.get('error') or v.get('skipped')} |")
            continue
        ms = lambda k: fmt(v.get(k) and v[k] * 1e3, ".0f")          # noqa: E731
        out.append(f"| {dt} | {v.get('threads', '–')} | {v['requests']} | {v['tokens']} | {ms('ttft_p50')} / "
                   f"{ms('ttft_p99')} | {ms('itl_p50')} / {ms('itl_p99')} | {fmt(v.get('tok_s'))} | "
                   f"{'; '.join(v.get('errors') or []) or '–'} |")
    return out


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
