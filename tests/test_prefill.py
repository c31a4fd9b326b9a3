"""Batched prefill (Transformer.prefill, the plan's MATMUL / ROWLN / ROWATTN jobs, docs/kernels.md).

Contract: prefill(state, tokens) gives the logits of the last token and the KV cache of cached steps
bit for bit -- for f32 and f16 weights (q8_0 / q4_0: test_q0_model.py), every thread count, prompts of any length (chunks of
PREFILL_ROWS rows, a last chunk of one row), from an empty or a filled cache (and step() continues
from it identically), natively and on the emulated AVX-512 CPU; the row jobs refuse what does not fit
before any address reaches assembly; bad token lists raise typed errors and leave the state unchanged.
The full-prefix forward (GPT2.logits) runs the same row plan plus the head on every row: the logits of
cached steps at every position.

The Arm families (neon, sme2) run the same row plans (asm/aarch64/plan_aarch64.S): the same tests run on
them (make test-arm64 / tools/arm64/run_tests.py, with shorter prompts under qemu).  The per-call path of
a family without a plan executor, tests/oracle.py's prefill_reference (kernel calls from Python, the matmul
kernels over the rows), is checked with every family forced onto it (test_prefill_reference_*).
"""
from __future__ import annotations

import numpy as np
import pytest

from arm64_qemu import IS_ARM, qemu_config
from gpt2asm import ContextOverflowError, InvalidArgumentError
from gpt2asm.kernels import Kernels
from gpt2asm.pool import Pool
from gpt2asm.model import PREFILL_ROWS, Transformer
from gpt2asm.weights import load_weights, pad_vector, tile_matrix

import oracle
from test_plan import EmulatedAvx512, bits, emulator

EMULATED = IS_ARM and qemu_config() is not None          # numpy and the kernels run under qemu: slow
LENGTHS = [1, 2, 5, 9, 20] if EMULATED else [1, 2, 5, 7, 64, 130]


def prompt(n: int, seed: int = 0, vocab: int = 50257) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def cached_steps(model: Transformer, ids: list[int], st=None):
    """(logits after each token, state) of one step() per token."""
    st = model.new_state() if st is None else st
    return np.stack([model.step(st, t)[0].copy() for t in ids]), st


def reference_steps(w, family: str, ids: list[int]):
    """(logits after each token, state) of cached steps on `family` at -j 1: a prefill test's reference."""
    k = Kernels(family)
    try:
        return cached_steps(Transformer(w, k), ids)
    finally:
        k.close()


def same_cache(a, b, n: int) -> bool:
    return (np.array_equal(bits(a.k[:, :, :n]), bits(b.k[:, :, :n]))
            and np.array_equal(bits(a.v[:, :, :n]), bits(b.v[:, :, :n])))


@pytest.fixture(scope="module", params=["f32", "f16"])
def tiny(request, ckpt_tiny, families):
    """Weights of one dtype and the cached-step reference (-j 1) for every prompt length."""
    w = load_weights(ckpt_tiny, request.param)
    k = Kernels(families[0])
    model = Transformer(w, k)
    ref = {n: cached_steps(model, prompt(n, seed=n)) for n in LENGTHS}
    yield request.param, w, ref
    k.close()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_prefill_equals_cached_steps(tiny, families, threads):
    dtype, w, ref = tiny
    for fam in families:
        k = Kernels(fam, threads)
        model = Transformer(w, k)
        for n in LENGTHS:
            want, want_st = ref[n]
            st = model.new_state()
            got = model.prefill(st, prompt(n, seed=n))[0]
            assert st.n == n
            assert np.array_equal(bits(got), bits(want[-1])), f"{dtype} {fam} -j {threads} T={n}: logits"
            assert same_cache(st, want_st, n), f"{dtype} {fam} -j {threads} T={n}: KV cache"
        k.close()


@pytest.mark.parametrize("zen4", ["0", "1"])
def test_float_matmul_variants_give_the_same_bits(tiny, families, zen4, monkeypatch):
    """The avx512 family's float matmuls and their Zen 4 variants (binary16 without blocks of 8 tokens,
    fp32 without the small calls' prefetch hints; GPT2ASM_F16_ZEN4 / GPT2ASM_F32_ZEN4 force them, and
    the plan's MATMUL jobs then call them through J_FN): prefill and an 8-row batched step give the
    cached steps' bits."""
    dtype, w, ref = tiny
    if dtype not in ("f32", "f16") or "avx512" not in families:
        pytest.skip("a float dtype on a native avx512 family")
    monkeypatch.setenv(f"GPT2ASM_{dtype.upper()}_ZEN4", zen4)
    k = Kernels("avx512", 2)
    assert (k.matmul_fn[dtype] != 0) == (zen4 == "1")
    model = Transformer(w, k)
    for n in LENGTHS:
        want, want_st = ref[n]
        st = model.new_state()
        got = model.prefill(st, prompt(n, seed=n))[0]
        assert np.array_equal(bits(got), bits(want[-1])) and same_cache(st, want_st, n), f"T={n}"
    ids = [prompt(3 + b, seed=100 + b) for b in range(8)]
    states = [model.new_state() for _ in ids]
    for st, p in zip(states, ids):
        model.prefill(st, p[:-1])
    got = model.step_batch(states, [p[-1] for p in ids])[0]
    for b, p in enumerate(ids):
        assert np.array_equal(bits(got[b]), bits(cached_steps(model, p)[0][-1])), f"row {b}"
    k.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_forward_equals_cached_steps(tiny, families, threads):
    """The full-prefix forward (GPT2.logits: the prefill's row plan, then LayerNorm f and the LM head as
    a matmul over every row): every position's logits are those of the cached steps, bit for bit,
    across a chunk boundary (PREFILL_ROWS) too."""
    dtype, w, ref = tiny
    n = max(LENGTHS)
    ids = prompt(n, seed=n)
    if not EMULATED:                                    # past the first chunk of PREFILL_ROWS rows
        ids += prompt(PREFILL_ROWS + 3 - n, seed=99)
    k = Kernels(families[0], threads)
    try:
        model = Transformer(w, k)
        want = ref[n][0] if len(ids) == n else cached_steps(model, ids)[0]
        got = model.forward(ids)
        assert got.shape == want.shape
        assert np.array_equal(bits(got), bits(want)), f"{dtype} -j {threads}"
    finally:
        k.close()


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_prefill_after_steps_then_steps(ckpt_tiny, families, dtype):
    """Prefill from a filled cache (pos0 > 0), across a chunk boundary and with a last chunk of one row;
    step() then continues exactly as after cached steps."""
    w = load_weights(ckpt_tiny, dtype)
    head, body, tail = prompt(3, 1), prompt(PREFILL_ROWS + 1, 2), prompt(4, 3)
    want, want_st = reference_steps(w, families[0], head + body + tail)
    for threads in (1, 2):
        k = Kernels(families[-1], threads)
        model = Transformer(w, k)
        st = model.new_state()
        model.prefill(st, head)
        got = model.prefill(st, body)[0]
        assert st.n == len(head + body)
        assert np.array_equal(bits(got), bits(want[len(head + body) - 1]))
        after = np.stack([model.step(st, t)[0].copy() for t in tail])
        assert np.array_equal(bits(after), bits(want[-len(tail):])), f"{dtype} -j {threads}: steps after prefill"
        assert same_cache(st, want_st, len(want))
        k.close()


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_prefill_of_a_one_layer_model(tokenizer_dir, families, dtype):
    """The prefill runs the last layer's rows only up to its cache rows, and the step plan's jobs of that
    layer for the last token: with one layer that is layer 0, whose step job also adds the embedding.
    Logits, cache and the steps after it as cached steps, across a chunk boundary."""
    from conftest import checkpoint
    d = checkpoint("one-layer-hf", tokenizer_dir, size="tiny", n_layer=1, n_ctx=PREFILL_ROWS + 16, seed=5,
                   layout="hf")
    w = load_weights(d, dtype)
    assert w.config.n_layer == 1
    ids = prompt(9 if EMULATED else PREFILL_ROWS + 3, 6)
    want, want_st = reference_steps(w, families[0], ids)
    for fam in families:
        for threads in (1, 2):
            k = Kernels(fam, threads)
            model = Transformer(w, k)
            st = model.new_state()
            got = model.prefill(st, ids[:-2])[0]
            assert np.array_equal(bits(got), bits(want[-3])), f"{dtype} {fam} -j {threads}: logits"
            after = np.stack([model.step(st, t)[0].copy() for t in ids[-2:]])
            assert np.array_equal(bits(after), bits(want[-2:])), f"{dtype} {fam} -j {threads}: steps after"
            assert same_cache(st, want_st, len(ids)), f"{dtype} {fam} -j {threads}: KV cache"
            k.close()


def test_prefill_to_the_end_of_the_context(ckpt_tiny, families):
    """The last positions of the context (n_ctx - 3 .. n_ctx - 1) from an arbitrary (zero) cache."""
    w = load_weights(ckpt_tiny, "f16")
    k = Kernels(families[0], 2)
    model = Transformer(w, k)
    n_ctx, ids = w.config.n_ctx, prompt(3, 4)
    a, b = model.new_state(), model.new_state()
    a.n = b.n = n_ctx - 3
    want, _ = cached_steps(model, ids, a)
    assert np.array_equal(bits(model.prefill(b, ids)[0]), bits(want[-1]))
    assert b.n == n_ctx and same_cache(a, b, n_ctx)
    with pytest.raises(ContextOverflowError):
        model.prefill(b, ids[:1])
    k.close()


@pytest.mark.skipif(EMULATED, reason="too slow under qemu (the kernel tests cover the widths)")
def test_prefill_124m(ckpt_124m, families):
    """The real widths (768 / 3072 inputs, 12 heads, the 786-tile head) at -j 1 and 2, fp32, T = 40."""
    w = load_weights(ckpt_124m, "f32")
    ids = prompt(40, 5)
    want, want_st = reference_steps(w, families[0], ids)
    for fam in families:
        for threads in (1, 2):
            k = Kernels(fam, threads)
            st = Transformer(w, k).new_state()
            got = Transformer(w, k).prefill(st, ids)[0]
            k.close()
            assert np.array_equal(bits(got), bits(want[-1])), f"{fam} -j {threads}"
            assert same_cache(st, want_st, len(ids)), f"{fam} -j {threads}: KV cache"


def test_prefill_without_matmul_falls_back_to_steps(ckpt_tiny, families):
    """A family without the batched kernels prefills by cached steps."""
    w = load_weights(ckpt_tiny, "f32")
    k = Kernels(families[0])
    model = Transformer(w, k)
    ids = prompt(6, 6)
    want, want_st = cached_steps(model, ids)
    k.has_matmul = False
    st = model.new_state()
    assert np.array_equal(bits(model.prefill(st, ids)[0]), bits(want[-1]))
    assert st.prefill_plan is None and same_cache(st, want_st, 6)
    k.close()


def per_call_kernels(fam: str, threads: int) -> Kernels:
    """Kernels of fam on the path of a family without a plan executor: single kernel calls from Python,
    the Python Pool for threads > 1.  Every family (x86 and Arm) is forced onto it (has_plan False)."""
    k = Kernels(fam, threads)
    if k.has_plan:
        k.close()
        k = Kernels(fam, 1)
        k.has_plan, k.threads = False, threads
        k.pool = Pool(threads) if threads > 1 else None
    return k


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_prefill_reference_equals_cached_steps(ckpt_tiny, families, dtype):
    """The per-call prefill (oracle.prefill_reference: LayerNorm / attention / GELU kernel calls per
    row, the matmul kernels over the rows with the tiles split over Kernels.run, numpy adds and cache
    copies) on every family at -j 1 and 2, after a first prefill (pos > 0): the logits and KV cache of
    cached steps, and step() continues identically.  Natively on x86 too (per_call_kernels)."""
    w = load_weights(ckpt_tiny, dtype)
    head, body, tail = prompt(3, 11), prompt(13 if EMULATED else 37, 12), prompt(2, 13)
    want, want_st = reference_steps(w, families[0], head + body + tail)
    n = len(head + body)
    for fam in families:
        for threads in (1, 2):
            k = per_call_kernels(fam, threads)
            model = Transformer(w, k)
            st = model.new_state()
            oracle.prefill_reference(model, st, head)
            got = oracle.prefill_reference(model, st, body)[0]
            assert st.n == n and st.prefill_plan is None and st.rows is not None    # the batched per-call path
            assert np.array_equal(bits(got), bits(want[n - 1])), f"{dtype} {fam} -j {threads}: logits"
            assert same_cache(st, want_st, n), f"{dtype} {fam} -j {threads}: KV cache"
            after = np.stack([oracle.step_reference(model, st, t)[0].copy() for t in tail])
            assert np.array_equal(bits(after), bits(want[n:])), f"{dtype} {fam} -j {threads}: steps after"
            assert same_cache(st, want_st, len(want))
            k.close()


def test_prefill_errors_are_typed_and_change_nothing(ckpt_tiny, families):
    w = load_weights(ckpt_tiny, "f32")
    k = Kernels(families[0])
    model = Transformer(w, k)
    st = model.new_state()
    model.prefill(st, [1, 2, 3])
    k_before = st.k.copy()
    V, n_ctx = w.config.vocab_size, w.config.n_ctx
    for bad in ([], [1, V], [-1], [1, 2.0], [True], "abc", 7, None, [1, None]):
        with pytest.raises(InvalidArgumentError):
            model.prefill(st, bad)
    with pytest.raises(ContextOverflowError) as e:
        model.prefill(st, [0] * (n_ctx - 2))
    assert e.value.needed == n_ctx + 1 and e.value.available == n_ctx
    assert st.n == 3 and np.array_equal(st.k, k_before)
    model.prefill(st, np.array([4, 5], np.int64))                     # numpy ids are fine
    assert st.n == 5
    k.close()


def test_row_job_validation(families):
    k = Kernels(families[0], 2)
    if not k.has_plan:
        k.close()
        pytest.skip(f"the {families[0]} family has no plan executor (no row jobs)")
    R, C = 8, 128
    W = tile_matrix(np.ones((C, 3 * C), np.float32))                   # c_attn of 2 heads: 6 tiles
    x, y = np.zeros((R, C), np.float32), np.zeros((R, 3 * C), np.float32)
    kc = np.zeros((2, 16, 64), np.float32)
    vc = kc.copy()
    bad = [
        lambda p: p.matmul(W, x[:, :100].copy(), None, y),                       # rows narrower than n_in
        lambda p: p.matmul(W, x, None, y[:, :300].copy()),                       # outputs don't fit
        lambda p: p.matmul(W, x.ravel(), None, y),                               # not rows
        lambda p: p.matmul(W, x, np.zeros(100, np.float32), y),                  # bias size
        lambda p: p.matmul(W, y[:, :C], None, y),                                # y overlaps x
        lambda p: p.matmul(W, x, None, y, gelu=True, resid=np.zeros((R, 3 * C), np.float32)),
        lambda p: p.matmul(W, x, None, y, resid=np.zeros((R, 100), np.float32)),
        lambda p: p.matmul(tile_matrix(np.ones((C, C), np.float32)), x, None, y[:, :C], resid=x),  # resid = x
        lambda p: p.matmul(W, x, None, y, kv=(kc[:1].copy(), vc[:1].copy())),   # tiles != 3H
        lambda p: p.matmul(W, x, None, y, kv=(kc, vc), gelu=True),               # kv takes no epilogue
        lambda p: p.matmul(W, x, None, y, kv=(kc, vc[:, :8].copy())),            # v != k
        lambda p: p.matmul(W.astype(np.int8), x, None, y),                       # no int8 weights
        lambda p: p.rows_layernorm(x, np.ones(C, np.float32), np.zeros(C - 1, np.float32), x.copy()),
        lambda p: p.rows_layernorm(x, np.ones(C, np.float32), np.zeros(C, np.float32), y[:, :64].copy()),
        lambda p: p.rows_attention(x, kc, vc, x),                                # out overlaps q
        lambda p: p.rows_attention(x[:, :64].copy(), kc, vc, y),                 # q rows narrower than 64H
    ]
    for i, fn in enumerate(bad):
        with pytest.raises(InvalidArgumentError):
            fn(k.new_plan())
    p = k.new_plan()
    p.matmul(W, x, None, y[:, :C], kv=(kc, vc))                                  # q into y, k/v into caches
    p.rows_attention(y[:, :C], kc, vc, np.zeros((R - 2, C), np.float32))        # R - 2 rows at most
    with pytest.raises(InvalidArgumentError):
        p.set_rows(1, 0)                                                         # not built
    p.build()
    for n, pos in ((0, 0), (R - 1, 0), (2, 15), (1, -1), (1.0, 0), (True, 0)):
        with pytest.raises(InvalidArgumentError):
            p.set_rows(n, pos)                                                  # rows and positions
    p.set_rows(R - 2, 16 - (R - 2))
    k.run_plan(p)
    assert np.all(kc[:, 16 - (R - 2):] == 0) and np.all(vc == 0)                # zero inputs: zero rows
    step = k.new_plan()
    step.matvec(W, x[0], None, y[0])
    with pytest.raises(InvalidArgumentError):
        step.build().set_rows(1, 0)                                              # no row jobs
    k.close()


def test_checked_matmul_equals_matvec_rows(families):
    rng = np.random.default_rng(8)
    W = rng.standard_normal((96, 64 * 6 + 5)).astype(np.float32)
    X = rng.standard_normal((11, 96)).astype(np.float32)
    b = pad_vector(rng.standard_normal(64 * 6 + 5).astype(np.float32))
    for fam in families:
        for threads in (1, 3):
            k = Kernels(fam, threads)
            for w in (tile_matrix(W), tile_matrix(W, np.float16)):
                Y = k.matmul(w, X, b)
                rows = np.stack([k.matvec(w, X[t].copy(), b) for t in range(len(X))])
                assert np.array_equal(bits(Y), bits(rows)), (fam, threads, w.dtype)
            k.close()


@pytest.mark.skipif(IS_ARM, reason="x86-64 only (the AVX-512 emulator)")
def test_prefill_on_the_emulated_avx512_plan(ckpt_tiny):
    """The prefill plan through gpt2asm_plan_run_avx512 (matmul_avx512 kernels) on the emulated CPU:
    the native cached steps' logits and cache, fp32 and fp16, 5 tokens after 2."""
    ids = prompt(7, 9)
    with emulator() as emu:
        for w in (load_weights(ckpt_tiny, "f32"), load_weights(ckpt_tiny, "f16")):
            native = Kernels("avx2")
            want, want_st = cached_steps(Transformer(w, native), ids)
            native.close()
            model = Transformer(w, EmulatedAvx512(emu))
            st = model.new_state()
            model.prefill(st, ids[:2])
            got = model.prefill(st, ids[2:])[0]
            assert np.array_equal(bits(got), bits(want[-1])), f"{w.dtype}: emulated prefill logits"
            assert same_cache(st, want_st, len(ids)), f"{w.dtype}: emulated prefill cache"
