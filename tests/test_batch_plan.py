"""The batched decode plan (Transformer.step_rows / step_batch; docs/kernels.md "Batched decode").

Contract: one library call steps B sequences, each at its own position with its own KV cache, and each
row gets the bits of stepping that sequence alone -- logits, argmax (None on NaN/inf) and the cache rows
written -- for B = 1, 2, 3, 8, 32, every native x86 family, f32 / f16 (binary16 cache), -j 1/2/3, and
q8_0 / q4_0 (B = 1, 2, 3, 8) with each family's best and plain q0 variants; the AVX-512 family also under
the emulator.  Rows join and leave without a plan rebuild; bad rows are
refused before anything is fed.
"""
from __future__ import annotations

import numpy as np
import pytest

from arm64_qemu import IS_ARM, qemu_config
from gpt2asm import GPT2, ContextOverflowError, InvalidArgumentError
from gpt2asm import model as model_mod

# under qemu (make test-arm64) a smaller sweep: B = 1, 3, 8 at -j 1 and 3 (the emulated CPU is ~50x slower)
QEMU = qemu_config() is not None
BATCHES = (1, 3, 8) if QEMU else (1, 2, 3, 8, 32)
THREADS = [1, 3] if QEMU else [1, 2, 3]


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def twins(M, rng, B: int, max_prompt: int = 9):
    """B pairs of states holding the same random prompts of different lengths (so different positions)."""
    a, b = [], []
    for i in range(B):
        ids = [int(t) for t in rng.integers(0, M.cfg.vocab_size, 1 + (i * 5 + 3) % max_prompt)]
        s, r = M.new_state(), M.new_state()
        M.prefill(s, ids)
        M.prefill(r, ids)
        a.append(s)
        b.append(r)
    return a, b


def check_rows_equal_alone(M, batch, alone, toks, lg, am, where: str) -> None:
    for i, (s, r, t) in enumerate(zip(batch, alone, toks)):
        want, first = M.step(r, t)
        assert np.array_equal(bits(lg[i]), bits(want)), f"{where}: row {i} logits differ from its step alone"
        assert am[i] == first, f"{where}: row {i} argmax {am[i]} != {first}"
        assert s.n == r.n
        assert np.array_equal(bits(s.k[:, :, :s.n]), bits(r.k[:, :, :r.n])), f"{where}: row {i} k cache"
        assert np.array_equal(bits(s.v[:, :, :s.n]), bits(r.v[:, :, :r.n])), f"{where}: row {i} v cache"


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_rows_same_bits_as_alone(ckpt_tiny, families, dtype, threads):
    for fam in families:
        rows_same_bits_as_alone(ckpt_tiny, fam, dtype, threads, BATCHES, f"{fam} {dtype} -j{threads}")


def rows_same_bits_as_alone(ckpt, fam: str, dtype: str, threads: int, sizes, where: str) -> None:
    with GPT2.load(ckpt, dtype=dtype, threads=threads, isa=fam) as m:
        M = m.model
        if not M.k.has_batch:
            return
        rng = np.random.default_rng(7)
        for B in sizes:
            batch, alone = twins(M, rng, B)
            for step in range(2):
                toks = [int(t) for t in rng.integers(0, M.cfg.vocab_size, B)]
                lg, am = M.step_rows(batch, toks)
                check_rows_equal_alone(M, batch, alone, toks, lg, am, f"{where} B={B}")


@pytest.mark.parametrize("threads", [3] if QEMU else [1, 2, 3])
@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_q0_rows_same_bits_as_alone(ckpt_tiny, families, dtype, threads, monkeypatch):
    """q8_0 / q4_0: ROWQUANT rows (LayerNorm folded in) into the q0 matmuls, the q8_0 head: every family
    with its best q0 variant and the plain one."""
    for fam in families:
        for plain in (False, True):
            monkeypatch.setenv("GPT2ASM_Q0_PLAIN", "1" if plain else "0")           # x86: the plain variants
            if plain:                                                               # AArch64: base ARMv8.0
                monkeypatch.setenv("GPT2ASM_ARM_Q0", "neon")
            else:
                monkeypatch.delenv("GPT2ASM_ARM_Q0", raising=False)
            rows_same_bits_as_alone(ckpt_tiny, fam, dtype, threads, (1, 3) if QEMU else (1, 2, 3, 8),
                                    f"{fam} {dtype} plain={plain} -j{threads}")


def test_rows_join_and_leave_without_rebuild(ckpt_tiny):
    with GPT2.load(ckpt_tiny, dtype="f16", threads=2) as m:
        M = m.model
        if not M.k.has_batch:
            pytest.skip(f"{M.k.family}: no batched decode executor")
        if M.resident is not None:          # adopting the resident copy (once) rebuilds every plan: first
            M.resident.wait(60)
        rng = np.random.default_rng(3)
        batch, alone = twins(M, rng, 8)
        plan = None
        for rows in ([0, 1, 2, 3, 4, 5, 6, 7], [5, 2, 7], [1, 0, 3, 6, 4, 2], [6], [7, 4]):
            toks = [int(t) for t in rng.integers(0, M.cfg.vocab_size, len(rows))]
            lg, am = M.step_batch([batch[i] for i in rows], toks)
            assert plan is None or M.batch_plan is plan or len(rows) == 1, "the plan was rebuilt"
            plan = M.batch_plan if len(rows) > 1 else plan
            check_rows_equal_alone(M, [batch[i] for i in rows], [alone[i] for i in rows], toks, lg, am,
                                   f"rows {rows}")


def test_more_rows_than_a_run(ckpt_tiny, monkeypatch):
    """step_batch cuts B > BATCH_ROWS rows into runs of at most BATCH_ROWS: the same bits."""
    monkeypatch.setattr(model_mod, "BATCH_ROWS", 4)
    with GPT2.load(ckpt_tiny, dtype="q8_0") as m:
        M = m.model
        if not M.k.has_batch:
            pytest.skip(f"{M.k.family}: no batched decode executor")
        rng = np.random.default_rng(4)
        batch, alone = twins(M, rng, 9)
        toks = [int(t) for t in rng.integers(0, M.cfg.vocab_size, 9)]
        lg, am = M.step_batch(batch, toks)
        assert M.batch_plan.max_rows == 4
        check_rows_equal_alone(M, batch, alone, toks, lg, am, "9 rows in runs of 4")


def test_argmax_per_row_none_on_non_finite(ckpt_tiny):
    """A row whose logits hold a NaN gets None (as its step alone); the other rows their first maximum."""
    with GPT2.load(ckpt_tiny, dtype="f32", threads=2) as m:
        M = m.model
        if not M.k.has_batch:
            pytest.skip(f"{M.k.family}: no batched decode executor")
        rng = np.random.default_rng(5)
        batch, alone = twins(M, rng, 3)
        for s in (batch[1], alone[1]):
            s.v[0, 0, 0, 5] = np.inf                      # poisons row 1's attention, hence its logits
        toks = [11, 22, 33]
        lg, am = M.step_rows(batch, toks)
        assert am[1] is None and am[0] is not None and am[2] is not None
        assert am[0] == int(np.argmax(lg[0])) and am[2] == int(np.argmax(lg[2]))
        assert not np.isfinite(lg[1]).all()
        check_rows_equal_alone(M, batch, alone, toks, lg, am, "a non-finite row")


def test_bad_rows_refused_before_anything_is_fed(ckpt_tiny):
    with GPT2.load(ckpt_tiny, dtype="f32") as m:
        M = m.model
        if not M.k.has_batch:
            pytest.skip(f"{M.k.family}: no batched decode executor")
        a, b = M.new_state(), M.new_state()
        M.prefill(a, [1, 2, 3])
        M.prefill(b, [4])
        full = M.new_state()
        full.n = M.cfg.n_ctx
        snap = (a.n, b.n, bits(a.k).copy(), bits(b.k).copy())

        def unchanged():
            assert (a.n, b.n) == snap[:2]
            assert np.array_equal(bits(a.k), snap[2]) and np.array_equal(bits(b.k), snap[3])

        for states, toks, err in (([a, b], [1, M.cfg.vocab_size], InvalidArgumentError),
                                  ([a, b], [1, -1], InvalidArgumentError),
                                  ([a, b], [1, 2.5], InvalidArgumentError),
                                  ([a, a], [1, 2], InvalidArgumentError),
                                  ([a, b], [1], InvalidArgumentError),
                                  ([a, "b"], [1, 2], InvalidArgumentError),
                                  ([a, b, full], [1, 2, 3], ContextOverflowError)):
            with pytest.raises(err):
                M.step_batch(states, toks)
            unchanged()
        with GPT2.load(ckpt_tiny, dtype="f16") as m16:             # a binary16 cache: not this plan's
            odd = m16.model.new_state()
        with pytest.raises(InvalidArgumentError):
            M.step_batch([a, odd], [1, 2])
        unchanged()
        M.step_batch([a, b], [5, 6])                               # builds the plan
        p = M.batch_plan
        with pytest.raises(InvalidArgumentError, match="share a cache"):
            p.set_batch([1, 2], [3, 1], [a.k, a.k], [a.v, b.v])
        with pytest.raises(InvalidArgumentError):
            p.set_batch([1, 2], [3, M.cfg.n_ctx], [a.k, b.k], [a.v, b.v])
        with pytest.raises(InvalidArgumentError):
            p.set_batch([1] * (p.max_rows + 1), [0] * (p.max_rows + 1), [a.k] * (p.max_rows + 1),
                        [a.v] * (p.max_rows + 1))
        with pytest.raises(InvalidArgumentError):
            p.set_batch([1, 2], [3, 1], [a.k, b.k[:1]], [a.v, b.v])
        with pytest.raises(InvalidArgumentError, match="set_batch"):
            p.set_rows(1, 0)


# --------------------------------------------------------------------------------------------------
# the AVX-512 family's BATTN / ROWARGMAX / ROWLN+EMBED (and ROWQUANT + q0 MATMUL) under the emulator
# (small: 3 rows, one step)

def test_avx512_emulated_rows_equal_native(ckpt_tiny):
    import avx512emu
    if not avx512emu.available():
        pytest.skip(avx512emu.why_unavailable())
    from avx512emu import Avx512Emulator
    from gpt2asm.cpu import available_families
    from gpt2asm.kernels import Kernels
    from gpt2asm.lib import LIB_NAME, PKG_DIR, load_library
    from gpt2asm.model import Transformer
    from gpt2asm.weights import load_weights
    if "avx2" not in available_families():
        pytest.skip("the host CPU lacks AVX2/FMA/F16C: no native reference")

    class Emulated(Kernels):
        def __init__(self, emulator, variant: str = "avx512vnni"):
            self.emulator, self.variant = emulator, variant
            super().__init__("avx512", threads=1)

        def _choose(self, family):
            return "avx512"

        def _bind(self, name, argtypes):
            return self.emulator.bind(name, ret="int" if name.startswith("gpt2asm_plan_step") else None)

        def _q0_variant(self):                   # the emulated CPU's (Ice-Lake-like: VNNI, no AVX-VNNI)
            return self.variant

        def _address(self, name):                # q0 jobs call the emulated library's kernels
            return self.emulator.address_of(name)

    lib = load_library()
    emu = Avx512Emulator(PKG_DIR / LIB_NAME, timeout=300.0)
    try:
        if emu.read_cstring(emu.call("gpt2asm_build_id")) != lib.gpt2asm_build_id():
            pytest.fail("the library on disk changed after gpt2asm loaded it (rebuilt meanwhile?)")
        cases = [("f32", None), ("f16", None)]
        if not IS_ARM:                           # q0 rows: ROWQUANT + the q0 matmul, one variant each
            cases += [("q8_0", "avx512vnni"), ("q4_0", "avx512")]
        for dtype, variant in cases:
            w = load_weights(ckpt_tiny, dtype)
            native = Kernels("avx2")
            N = Transformer(w, native)
            E = Transformer(w, Emulated(emu) if variant is None else Emulated(emu, variant))
            if variant is not None:
                assert E.k.q0_names[f"matmul_{dtype}"] == f"gpt2asm_matmul_{dtype}_{variant}"
            assert E.k.has_batch
            rng = np.random.default_rng(11)
            batch, alone = twins(N, rng, 3)              # caches filled natively: the same bits everywhere
            toks = [int(t) for t in rng.integers(0, N.cfg.vocab_size, 3)]
            lg, am = E.step_rows(batch, toks)
            check_rows_equal_alone(N, batch, alone, toks, lg, am, f"avx512 emulated {dtype}")
            native.close()
    finally:
        emu.close()


# --------------------------------------------------------------------------------------------------
# the job kinds alone, against the checked kernels (odd sizes: 3 heads, n_ctx 37, 133 logits)

@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("kv", [np.float32, np.float16])
def test_battn_and_rowargmax_jobs(families, kv, threads):
    from gpt2asm.kernels import Kernels
    from gpt2asm.weights import aligned_zeros
    L, H, T, R, B, n = 2, 3, 37, 8, 6, 133
    rng = np.random.default_rng(21)
    for fam in families:
        k = Kernels(fam, threads)
        if not k.has_batch:
            k.close()
            continue
        p = k.new_plan()
        p.row_table(R, (L, H, T), kv)
        qkv = aligned_zeros((R, 3 * H * 64 + 16), np.float32)           # rows with a gap
        qkv[:] = rng.standard_normal(qkv.shape).astype(np.float32)
        out = aligned_zeros((R, H * 64), np.float32)
        logits = aligned_zeros((R, 192), np.float32)
        p.batch_attention(qkv, out, 1)
        p.rows_argmax(logits, n)
        p.build()
        ks = [(rng.standard_normal((L, H, T, 64)) * 2).astype(kv) for _ in range(B)]
        vs = [rng.standard_normal((L, H, T, 64)).astype(kv) for _ in range(B)]
        ks = [np.ascontiguousarray(a) for a in ks]
        vs = [np.ascontiguousarray(a) for a in vs]
        pos = [0, T - 1, 5, 17, 1, 36][:B]
        want_k, want_v = [a.copy() for a in ks], [a.copy() for a in vs]
        for t in range(B):
            want_k[t][1, :, pos[t]] = qkv[t, H * 64:2 * H * 64].reshape(H, 64).astype(kv)
            want_v[t][1, :, pos[t]] = qkv[t, 2 * H * 64:3 * H * 64].reshape(H, 64).astype(kv)
        rows = rng.standard_normal((B, n)).astype(np.float32)
        rows[1, [7, 90]] = rows[1].max() + 1                           # a tie: the first wins
        rows[2, 50] = np.nan
        rows[3, -1] = np.inf
        rows[4, :] = 0.0
        rows[4, 3] = -0.0
        rows[5, -1] = rows[5].max() + 1                                # the last output
        logits[:B, :n] = rows
        logits[:B, n:] = 1e30                                          # past n: never counts
        p.set_batch([0] * B, pos, ks, vs)
        p.run()
        for t in range(B):
            assert np.array_equal(bits(ks[t]), bits(want_k[t])), f"{fam} row {t}: k cache"
            assert np.array_equal(bits(vs[t]), bits(want_v[t])), f"{fam} row {t}: v cache"
            ref = k.attention(np.ascontiguousarray(qkv[t, :H * 64]), want_k[t][1], want_v[t][1], pos[t] + 1)
            assert np.array_equal(bits(out[t]), bits(ref)), f"{fam} -j{threads} row {t}: attention"
        want = [k.argmax(np.ascontiguousarray(rows[t])) for t in range(B)]
        assert want[1] == 7 and want[2] is None and want[3] is None and want[4] == 0 and want[5] == n - 1
        assert p.batch_argmax() == want
        k.close()


def test_124m_shape_rows_same_bits_as_alone(tokenizer_dir):
    """The real widths: 12 heads (claims of heads that cross rows), 768 / 3072 inputs, the 786-tile head
    (q8_0 / q4_0: its q8_0 records)."""
    from conftest import checkpoint
    ck = checkpoint("124M-2layer", tokenizer_dir, size="124M", n_layer=2, seed=3)
    cases = [("f16", 3), ("q8_0", 3)] if QEMU else [("f16", 3), ("q8_0", 3), ("q4_0", 2)]
    for dtype, threads in cases:
        with GPT2.load(ck, dtype=dtype, threads=threads) as m:
            M = m.model
            if not M.k.has_batch:
                pytest.skip(f"{M.k.family}: no batched decode executor")
            rng = np.random.default_rng(8)
            batch, alone = twins(M, rng, 5)
            toks = [int(t) for t in rng.integers(0, M.cfg.vocab_size, 5)]
            lg, am = M.step_batch(batch, toks)
            check_rows_equal_alone(M, batch, alone, toks, lg, am, f"124M shape {dtype} -j{threads}")
