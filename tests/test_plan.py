"""The plan executor and the library's thread pool (gpt2asm_plan_run_*, gpt2asm_worker_*, docs/kernels.md):
asm/x86_64/plan_x86.S natively, asm/aarch64/plan_aarch64.S under qemu (`make test-arm64`, both Arm families).

Contract 1: a plan gives the same logits bits as the per-call reference path, for every thread count
(-j 1..4, including more threads than cores) and dtype (f32, f16; q8_0 / q4_0: test_q0_model.py),
natively and on the emulated AVX-512 CPU; the full-prefix forward equals cached steps.
The pool: workers park when idle (no busy spinning), close() joins them, start/stop cycles leak nothing,
a model closed while idle stays usable, concurrent callers are serialised.  The LM head's ARGMAX
epilogue gives numpy's first maximum for every thread count and claim size.  Contract 2: plans refuse
arrays that do not fit before any address reaches assembly.
"""
from __future__ import annotations

import gc
import hashlib
import threading
import time
from functools import partial

import numpy as np
import pytest

from gpt2asm import GPT2, InvalidArgumentError
from gpt2asm.cpu import FAMILIES
from gpt2asm.kernels import Kernels
from gpt2asm.lib import ARCH
from gpt2asm.model import Transformer
from gpt2asm.tokenizer import Tokenizer
from gpt2asm.weights import aligned_zeros, load_weights, pad_vector, tile_matrix

import oracle

PROMPT = "Alan Turing theorized that computers would one day become"


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def steps(model: Transformer, ids: list[int], greedy: int = 4, reference: bool = False) -> np.ndarray:
    """Logits of every prompt token, then of `greedy` greedy steps (cached steps)."""
    st = model.new_state()
    step = partial(oracle.step_reference, model) if reference else model.step
    out = [step(st, t)[0].copy() for t in ids]
    for _ in range(greedy):
        out.append(step(st, int(np.argmax(out[-1])))[0].copy())
    return np.stack(out)


class EmulatedAvx512(Kernels):
    """The avx512 family on tests/avx512emu.py's emulated CPU (one thread), raw host pointers."""

    def __init__(self, emu):
        self.emulator = emu
        super().__init__("avx512", threads=1)

    def _choose(self, family):
        return "avx512"

    def _bind(self, name, argtypes):
        return self.emulator.bind(name, ret="int" if name.startswith("gpt2asm_plan_step") else None)

    def _address(self, name):                    # kernels a job calls by address (J_FN): the emulated ones
        return self.emulator.address_of(name)


def emulator():
    """An Avx512Emulator on the library gpt2asm loaded, or a pytest skip."""
    import avx512emu
    if not avx512emu.available():
        pytest.skip(avx512emu.why_unavailable())
    from gpt2asm.lib import LIB_NAME, PKG_DIR
    return avx512emu.Avx512Emulator(PKG_DIR / LIB_NAME, timeout=300.0)


def worker_threads() -> int:
    return sum(t.name.startswith("gpt2asm-worker") and t.is_alive() for t in threading.enumerate())


def reference_case(w, ckpt, n: int, greedy: int = 4):
    """(w, the first n ids of PROMPT, steps() of the per-call reference on the baseline family)."""
    ids = Tokenizer.from_dir(ckpt).encode(PROMPT)[:n]
    k = Kernels(FAMILIES[ARCH][0])                    # the baseline family: avx2, neon
    ref = steps(Transformer(w, k), ids, greedy=greedy, reference=True)
    k.close()
    return w, ids, ref


@pytest.fixture(scope="module", params=["f32", "f16"])
def tiny(request, ckpt_tiny):
    return reference_case(load_weights(ckpt_tiny, request.param), ckpt_tiny, 8)


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_plan_equals_reference_for_every_thread_count(tiny, families, threads):
    w, ids, ref = tiny
    for fam in families:
        k = Kernels(fam, threads)
        model = Transformer(w, k)
        got = steps(model, ids)
        full = model.forward(ids + [int(np.argmax(got[i])) for i in range(len(ids) - 1, len(got) - 1)])
        k.close()
        assert np.array_equal(bits(got), bits(ref)), f"{fam} -j {threads}: plan != per-call reference"
        assert np.array_equal(bits(full), bits(ref)), f"{fam} -j {threads}: full-prefix forward != steps"


def test_124m_plan_equals_reference(ckpt_124m, families):
    """The real widths (768/3072 inputs, 12 heads, 786-tile head) at -j 1 and 2, fp32."""
    w = load_weights(ckpt_124m, "f32")
    ids = Tokenizer.from_dir(ckpt_124m).encode(PROMPT)[:4]
    k1 = Kernels(families[0])
    ref = steps(Transformer(w, k1), ids, greedy=2, reference=True)
    k1.close()
    for fam in families:
        for threads in (1, 2):
            k = Kernels(fam, threads)
            got = steps(Transformer(w, k), ids, greedy=2)
            k.close()
            assert np.array_equal(bits(got), bits(ref)), f"{fam} -j {threads}"


def test_workers_park_when_idle_and_close_joins_them(ckpt_tiny):
    before = worker_threads()
    m = GPT2.load(ckpt_tiny, threads=3)
    k = m.model.k
    assert worker_threads() == before + 2
    st = m.model.new_state()
    for t in m.encode(PROMPT)[:3]:
        m.model.step(st, t)
    deadline = time.monotonic() + 5
    while k.pool_stats()["parked"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert k.pool_stats()["parked"] == 2, k.pool_stats()
    cpu0 = time.process_time()                       # parked workers use no CPU
    time.sleep(0.3)
    assert time.process_time() - cpu0 < 0.1
    logits = m.model.step(st, 1)[0].copy()           # wakes them
    t0 = time.monotonic()
    m.close()                                        # closed while idle
    assert time.monotonic() - t0 < 2
    assert worker_threads() == before and k.pool_stats()["workers"] == 0
    m.close()                                        # idempotent
    st2 = m.model.new_state()                        # still usable, single-threaded
    for t in m.encode(PROMPT)[:3]:
        m.model.step(st2, t)
    assert np.array_equal(bits(m.model.step(st2, 1)[0]), bits(logits))


def test_many_start_stop_cycles(families):
    fam = families[-1]
    w = tile_matrix(np.random.default_rng(0).standard_normal((96, 640)).astype(np.float32))
    x = np.linspace(-1, 1, 96, dtype=np.float32)
    want = Kernels(fam).matvec(w, x)
    before = worker_threads()
    for i in range(60):
        k = Kernels(fam, 2 + i % 3)
        if i % 2:                                    # half of them never run a plan
            assert np.array_equal(bits(k.matvec(w, x)), bits(want))
        k.close()
    assert worker_threads() == before


def test_runs_with_idle_gaps_around_the_spin_limit(families):
    """Thousands of runs of sub-ranges, some after gaps that let the workers park: no lost wake-up, and
    every run complete (its outputs written)."""
    import random
    rng = random.Random(3)
    w = tile_matrix(np.random.default_rng(4).standard_normal((24, 64 * 7)).astype(np.float32))
    x = np.ones(24, np.float32)
    want = Kernels(families[0]).matvec(w, x)
    for threads in (2, 3, 4):
        k = Kernels(families[0], threads)
        ys = [np.zeros(64 * 7, np.float32) for _ in range(4)]
        p = k.new_plan()
        for y in ys:
            p.matvec(w, x, None, y)
        p.build()
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            j0 = rng.randrange(4)
            for y in ys[j0:]:
                y[:] = 0
            k.run_plan(p, j0, 4)
            assert all(np.array_equal(bits(y), bits(want)) for y in ys[j0:])
            if rng.random() < 0.05:
                time.sleep(rng.random() * 0.001)
        k.close()


def test_dropped_kernels_join_their_workers(families):
    before = worker_threads()
    k = Kernels(families[0], 3)
    assert worker_threads() == before + 2
    del k
    gc.collect()
    deadline = time.monotonic() + 5
    while worker_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker_threads() == before


def test_checked_kernels_split_over_threads(families):
    rng = np.random.default_rng(1)
    w = tile_matrix(rng.standard_normal((200, 64 * 37 + 5)).astype(np.float32))
    x = rng.standard_normal(200).astype(np.float32)
    b = pad_vector(rng.standard_normal(64 * 37 + 5).astype(np.float32))
    kc = (rng.standard_normal((5, 40, 64)) * 0.5).astype(np.float32)
    vc = rng.standard_normal((5, 40, 64)).astype(np.float32)
    q = rng.standard_normal(5 * 64).astype(np.float32)
    k1 = Kernels(families[0])
    want_y, want_a = k1.matvec(w, x, b), k1.attention(q, kc, vc, 33)
    for fam in families:
        for threads in (1, 2, 3, 4):
            k = Kernels(fam, threads)
            assert np.array_equal(bits(k.matvec(w, x, b)), bits(want_y)), (fam, threads)
            assert np.array_equal(bits(k.attention(q, kc, vc, 33)), bits(want_a)), (fam, threads)
            k.close()


def test_concurrent_callers_are_serialised(ckpt_tiny):
    m = GPT2.load(ckpt_tiny, threads=2)
    ids = m.encode(PROMPT)[:6]
    want = steps(m.model, ids, greedy=0)
    got: dict[int, np.ndarray] = {}

    def run(i):
        got[i] = steps(m.model, ids, greedy=0)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    m.close()
    assert all(np.array_equal(bits(g), bits(want)) for g in got.values())


def test_plan_validation(families):
    k = Kernels(families[0], 2)
    w = tile_matrix(np.ones((8, 128), np.float32))               # [2][8][64]
    x, y = np.ones(8, np.float32), np.zeros(128, np.float32)
    bad = [
        dict(w=w, x=np.ones(7, np.float32), b=None, y=y),            # x length
        dict(w=w, x=x, b=np.zeros(100, np.float32), y=y),             # bias not padded
        dict(w=w, x=x, b=None, y=np.zeros(64, np.float32)),           # y too short
        dict(w=w, x=x, b=None, y=np.zeros(128, np.float32)[::-1]),    # not contiguous
        dict(w=w, x=x.astype(np.float64), b=None, y=y),
        dict(w=w[:, :, :32], x=x, b=None, y=y),
        dict(w=w, x=x, b=None, y=y, resid=np.zeros(64, np.float32)),  # residual too short
        dict(w=w, x=x, b=None, y=y, gelu=True, resid=np.zeros(128, np.float32)),
        dict(w=w, x=x, b=None, y=y, chunk=0),
    ]
    for kw in bad:
        p = k.new_plan()
        with pytest.raises(InvalidArgumentError):
            p.matvec(**kw)
    ro = np.zeros(128, np.float32)
    ro.flags.writeable = False
    with pytest.raises(InvalidArgumentError):
        k.new_plan().matvec(w, x, None, ro)
    with pytest.raises(InvalidArgumentError):
        k.new_plan().build()                                         # no job
    p = k.new_plan()
    p.matvec(w, x, None, y)
    with pytest.raises(InvalidArgumentError):
        k.run_plan(p)                                                # not built
    p.build()
    with pytest.raises(InvalidArgumentError):
        p.matvec(w, x, None, y)                                      # built: immutable
    for j0, j1 in ((0, 2), (1, 0), (-1, 1)):
        with pytest.raises(InvalidArgumentError):
            k.run_plan(p, j0, j1)
    other = Kernels(families[0])
    with pytest.raises(InvalidArgumentError):
        other.run_plan(p)                                            # another pool's plan
    k.run_plan(p)
    assert np.all(y == 8)
    # embedding / position bounds
    wte, wpe = aligned_zeros((10, 64), np.float32), aligned_zeros((5, 64), np.float32)
    xs = aligned_zeros(64, np.float32)
    p = k.new_plan()
    p.set_embedding(wte, wpe, xs)
    p.matvec(tile_matrix(np.ones((64, 64), np.float32)), None, None, np.zeros(64, np.float32),
             ln=(xs, np.ones(64, np.float32), np.zeros(64, np.float32)), embed=True)
    p.build()
    for tok, pos in ((10, 0), (-1, 0), (0, 5), (0, -1), (1.0, 0), (0, 2.5), (True, 0), ("1", 0)):
        with pytest.raises(InvalidArgumentError):
            p.set_step(tok, pos)
        with pytest.raises(InvalidArgumentError):
            p.step(tok, pos)                                         # the one-call step checks the same
    p.set_step(9, 4)
    k.run_plan(p)
    p.step(np.int64(9), 4)
    k.close()
    other.close()


def test_fingerprint_identical_across_threads_124m(ckpt_124m):
    """One SHA-256 of the logits for -j 1..4 on the 124M shape (plan path, fp16 to keep it quick)."""
    fps = set()
    for threads in (1, 2, 3, 4):
        m = GPT2.load(ckpt_124m, dtype="f16", threads=threads)
        st, h = m.model.new_state(), hashlib.sha256()
        logits = None
        for t in m.encode(PROMPT)[:3]:
            logits = m.model.step(st, t)[0]
            h.update(logits.tobytes())
        for _ in range(3):
            logits = m.model.step(st, int(np.argmax(logits)))[0]
            h.update(logits.tobytes())
        m.close()
        fps.add(h.hexdigest())
    assert len(fps) == 1


def test_checked_kernels_through_the_emulated_avx512_plan(families):
    """Kernels.matvec / .attention run one-job plans (MATVEC, ATTN) through gpt2asm_plan_run_avx512 on the
    emulated CPU (threads=1): the same bits as the native first family."""
    import avx512emu
    if not avx512emu.available():
        pytest.skip(avx512emu.why_unavailable())
    from gpt2asm.lib import LIB_NAME, PKG_DIR

    rng = np.random.default_rng(2)
    w16 = tile_matrix(rng.standard_normal((77, 64 * 5 + 3)).astype(np.float32), np.float16)
    x = rng.standard_normal(77).astype(np.float32)
    b = pad_vector(rng.standard_normal(64 * 5 + 3).astype(np.float32))
    kc = rng.standard_normal((3, 20, 64)).astype(np.float32)
    vc = rng.standard_normal((3, 20, 64)).astype(np.float32)
    q = rng.standard_normal(3 * 64).astype(np.float32)
    native = Kernels(families[0])
    with avx512emu.Avx512Emulator(PKG_DIR / LIB_NAME, timeout=120.0) as emu:
        k = EmulatedAvx512(emu)
        assert k.has_plan
        assert np.array_equal(bits(k.matvec(w16, x, b)), bits(native.matvec(w16, x, b)))
        for n_pos in (1, 17, 20):
            assert np.array_equal(bits(k.attention(q, kc, vc, n_pos)), bits(native.attention(q, kc, vc, n_pos)))
        k16, v16 = kc.astype(np.float16), vc.astype(np.float16)        # a binary16 cache: ATTN with KV16
        for n_pos in (1, 17):
            assert np.array_equal(bits(k.attention(q, k16, v16, n_pos)), bits(native.attention(q, k16, v16, n_pos)))


# --------------------------------------------------------------------------------------------------
# the ARGMAX epilogue (greedy sampling inside the LM head job)

def _argmax_case(values: np.ndarray, n_tiles: int) -> tuple[np.ndarray, np.ndarray]:
    """(tiled w, x) whose matvec gives exactly `values` (padded outputs: +1e30, larger than any of
    them, so that counting one of them would show): x = e_0, row 0 of W = the values."""
    W = np.zeros((3, 64 * n_tiles), np.float32)
    W[0] = 1e30
    W[0, :values.size] = values
    x = np.zeros(3, np.float32)
    x[0] = 1
    return tile_matrix(W), x


def _first_max(values: np.ndarray):
    return None if not np.isfinite(values).all() else int(np.argmax(values))


def _argmax_cases(rng):
    """(values, n_tiles): ties across tiles (the first wins), all negative (the padded outputs past
    n must not count), non-finite inside and past n, the maximum first and last."""
    n_tiles, n = 37, 64 * 36 + 29
    base = lambda: (rng.standard_normal(n) * 3).astype(np.float32)      # noqa: E731
    for first in (5, 64 * 17 + 3, 64 * 30):
        v = base()
        v[[first, 64 * 31 + 2, n - 1]] = v.max() + 1                      # equal maxima in later claims
        yield v, n_tiles
    v = -np.abs(base()) - 1
    yield v, n_tiles
    for bad in (np.nan, np.inf, -np.inf):
        v = base()
        v[int(rng.integers(0, n))] = bad
        yield v, n_tiles
    v = base()
    v[0] = 100
    yield v, n_tiles
    v = base()
    v[n - 1] = 100
    yield v, n_tiles
    yield base()[:64], 1                                                   # one tile, all of it
    yield base()[:65], 2


def test_argmax_epilogue_is_the_first_maximum(families):
    """MATVEC with argmax=n: Plan.first_max() is numpy's first maximum of y[0..n) (None with a NaN or an
    infinity among them) for every thread count and claim size, y itself unchanged: from the per-thread
    slots after run_plan (read by Python), and as reduced by gpt2asm_plan_step after Plan.step."""
    rng = np.random.default_rng(8)
    cases = list(_argmax_cases(rng))
    for fam in families:
        for threads in (1, 2, 3):
            k = Kernels(fam, threads)
            for values, n_tiles in cases:
                w, x = _argmax_case(values, n_tiles)
                for chunk in (None, 1, 7, n_tiles):
                    y = np.zeros(64 * n_tiles, np.float32)
                    p = k.new_plan()
                    p.matvec(w, x, None, y, argmax=values.size, chunk=chunk)
                    k.run_plan(p.build())
                    assert np.array_equal(bits(y[:values.size]), bits(values))
                    assert p._max is None
                    assert p.first_max() == _first_max(values), (fam, threads, chunk, values.size)
                    y[:] = 0
                    p.step(0, 0)                                 # the same run, reduced in the library
                    assert np.array_equal(bits(y[:values.size]), bits(values))
                    assert p._max is not None
                    assert p.first_max() == _first_max(values), (fam, threads, chunk, values.size)
            k.close()


def test_argmax_epilogue_on_the_emulated_avx512_plan(families):
    """The avx512 plan calls gpt2asm_argmax_f32_avx512 in the epilogue: the same first maximum."""
    import avx512emu
    if not avx512emu.available():
        pytest.skip(avx512emu.why_unavailable())
    from gpt2asm.lib import LIB_NAME, PKG_DIR
    rng = np.random.default_rng(9)
    cases = list(_argmax_cases(rng))[:5]
    with avx512emu.Avx512Emulator(PKG_DIR / LIB_NAME, timeout=120.0) as emu:
        k = EmulatedAvx512(emu)
        for values, n_tiles in cases:
            w, x = _argmax_case(values, n_tiles)
            y = np.zeros(64 * n_tiles, np.float32)
            p = k.new_plan()
            p.matvec(w, x, None, y, argmax=values.size, chunk=4)
            k.run_plan(p.build())
            assert p.first_max() == _first_max(values)
            p.step(0, 0)                                         # gpt2asm_plan_step_avx512's reduction
            assert p._max is not None and p.first_max() == _first_max(values)


def test_argmax_epilogue_validation(families):
    k = Kernels(families[0])
    w = tile_matrix(np.ones((8, 130), np.float32))               # [3][8][64]
    x, y = np.ones(8, np.float32), np.zeros(192, np.float32)
    for n in (0, 128, 193, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            k.new_plan().matvec(w, x, None, y, argmax=n)
    for kw in (dict(gelu=True), dict(resid=np.zeros(192, np.float32))):
        with pytest.raises(InvalidArgumentError):
            k.new_plan().matvec(w, x, None, y, argmax=130, **kw)
    p = k.new_plan()
    p.matvec(w, x, None, y, argmax=130)
    with pytest.raises(InvalidArgumentError):
        p.matvec(w, x, None, np.zeros(192, np.float32), argmax=130)       # one argmax job per plan
    q = k.new_plan()
    q.matvec(w, x, None, y)
    with pytest.raises(InvalidArgumentError):
        q.build().first_max()                                            # no argmax job
    q.step(0, 0)                                                         # runs; still no argmax result
    assert np.array_equal(y[:130], np.full(130, 8, np.float32))
    with pytest.raises(InvalidArgumentError):
        q.first_max()
    k.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_model_steps_carry_the_first_maximum(tiny, families, threads):
    """Every plan step and prefill returns the argmax of the logits it returned (what greedy decoding
    samples), and generate() takes it: the same tokens as numpy's argmax."""
    w, ids, _ = tiny
    for fam in families:
        k = Kernels(fam, threads)
        model = Transformer(w, k)
        s = model.new_state()
        logits, first_max = model.prefill(s, ids)
        toks = []
        for _ in range(6):
            assert first_max == int(np.argmax(logits))
            toks.append(int(np.argmax(logits)))
            logits, first_max = model.step(s, toks[-1])
        logits, first_max = oracle.step_reference(model, s, toks[-1])
        assert first_max == int(np.argmax(logits))                      # the reference: numpy's
        k.close()


def _rounding_biases(rng, n: int) -> np.ndarray:
    """n float32 values on and around binary16 rounding boundaries (ties to even either way, the top
    of the range and past it, subnormal halves and below them, signed values), then normals."""
    e = [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, -(1 + 2.0 ** -11), 65504, 65519, 65520, -65520, 1e9,
         2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, -2.0 ** -25, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 1e-8,
         -0.0, 0.0, 1 / 3, -2 / 3, 1234.5678, np.nextafter(np.float32(2.0 ** -24), np.float32(0))]
    b = rng.standard_normal(n).astype(np.float32) * np.float32(3)
    b[:len(e)] = np.array(e, np.float32)
    return rng.permutation(b).astype(np.float32)


def test_binary16_cache_rows_round_as_numpy(families):
    """The plan's writes into a binary16 KV cache -- QKV of a step and MATMUL+KV of a prefill run: the
    kernel's float32 outputs into a staging row, then vcvtps2ph -- round as numpy's astype(float16),
    which the per-call path uses: ties to even, overflow to inf, subnormal halves, signs.  c_attn has
    zero weights here, so its outputs are exactly 0 + bias, chosen on the rounding boundaries."""
    H, C, n_ctx, R = 2, 128, 12, 5
    rng = np.random.default_rng(16)

    def half(a):                                              # numpy's rounding (overflow to inf: expected)
        with np.errstate(over="ignore"):
            return np.asarray(a, np.float32).astype(np.float16).view(np.uint16)
    w = tile_matrix(np.zeros((C, 3 * C), np.float32))
    for fam in families:
        for threads in (1, 2):
            k = Kernels(fam, threads)
            kc, vc = aligned_zeros((H, n_ctx, 64), np.float16), aligned_zeros((H, n_ctx, 64), np.float16)
            # a step at position 3 (QKV job)
            b = _rounding_biases(rng, 3 * C)
            src = rng.standard_normal(C).astype(np.float32)
            q, out = np.zeros(3 * C, np.float32), np.zeros(C, np.float32)
            p = k.new_plan()
            p.qkv_attention(w, b, q, kc, vc, out, ln=(src, np.ones(C, np.float32), np.zeros(C, np.float32)))
            p.build()
            p.set_step(0, 3)
            k.run_plan(p)
            y = np.float32(0) + b                                 # the kernel's outputs
            assert np.array_equal(kc[:, 3].view(np.uint16), half(y[C:2 * C]).reshape(H, 64))
            assert np.array_equal(vc[:, 3].view(np.uint16), half(y[2 * C:]).reshape(H, 64))
            # a prefill run of 4 rows at positions 6 .. 9 (MATMUL+KV job)
            b = _rounding_biases(rng, 3 * C)
            x, yq = rng.standard_normal((R, C)).astype(np.float32), np.zeros((R, C), np.float32)
            p = k.new_plan()
            p.matmul(w, x, b, yq, kv=(kc, vc))
            p.build()
            p.set_rows(4, 6)
            k.run_plan(p)
            y = np.float32(0) + b
            for t in range(4):
                assert np.array_equal(kc[:, 6 + t].view(np.uint16), half(y[C:2 * C]).reshape(H, 64)), (fam, threads, t)
                assert np.array_equal(vc[:, 6 + t].view(np.uint16), half(y[2 * C:]).reshape(H, 64)), (fam, threads, t)
            assert not kc[:, 10:].any() and not kc[:, 4:6].any()  # nothing else written
            k.close()


def test_python_pool_waits_for_its_workers_when_the_caller_fails():
    """The Python pool (families without a plan executor): an exception (or Ctrl-C) in the caller's part
    of a job still waits for the workers' parts, so no stale completion is left for the next job."""
    from gpt2asm.pool import Pool
    done = []

    def part(i, fail):
        if fail:
            raise KeyboardInterrupt
        time.sleep(0.2)
        done.append(i)

    pool = Pool(3)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.run(part, [(0, True), (1, False), (2, False)])
        assert sorted(done) == [1, 2]                        # both workers finished before run returned
        done.clear()
        pool.run(part, [(0, False), (1, False), (2, False)])
        assert sorted(done) == [0, 1, 2]                     # the next job waited for its own parts
    finally:
        pool.close()
