"""q8_0 / q4_0 models through the plan (issue 17; docs/kernels.md "q8_0 / q4_0 jobs" and the q8_0 / q4_0 contract).

Contract 1 for the integer dtypes: one SHA-256 of the logits per (checkpoint, prompts, dtype) on every x86
family the CPU has, with the VNNI and the plain kernel variants (GPT2ASM_Q0_PLAIN=1), at -j 1/2/3, by
cached steps and by prefill (logits and KV cache), the full-prefix forward, the AVX-512 family on the
emulated CPU, and a GGUF Q8_0 / Q4_0 of the checkpoint (the same blocks, so the same bits as --dtype).  The
plan equals the same forward pass as single kernel calls from Python through gpt2asm.q0kernels
(tests/oracle.py).  The q0 jobs refuse what does not fit before any address reaches assembly.

The pinned values are those of tests/test_fingerprint.py (computed natively on avx2, -j 1).
"""
from __future__ import annotations

import numpy as np
import pytest

from arm64_qemu import IS_ARM, qemu_config
from gpt2asm import GPT2, InvalidArgumentError, KernelUnavailableError
from gpt2asm.kernels import Kernels
from gpt2asm.model import PREFILL_ROWS, Transformer
from gpt2asm.weights import load_weights, aligned_zeros

import oracle
from test_fingerprint import (PINNED, PINNED_W256, PROMPTS, STEPS, same_checkpoint,  # noqa: F401  (fixtures)
                              same_checkpoint_w256)
from test_model import fingerprint
from test_plan import EmulatedAvx512, bits, emulator
from test_prefill import cached_steps, prompt, same_cache

DTYPES = ["q8_0", "q4_0"]
LENGTHS = [2, 5, 7, 33, 64]


@pytest.fixture(scope="module", params=DTYPES)
def tiny(request, ckpt_tiny):
    return request.param, load_weights(ckpt_tiny, request.param)


def variants(families) -> list[tuple[str, bool]]:
    """(family, plain) pairs: every family with its best variant and with the plain one (AArch64: the
    neon family with its best variants and with plain NEON; sme2 has one matvec / matmul variant)."""
    return [(fam, plain) for fam in families for plain in (False, True) if not (plain and fam == "sme2")]


def use_variant(monkeypatch, plain: bool) -> None:
    """The plain q0 kernels (x86: $GPT2ASM_Q0_PLAIN; AArch64: $GPT2ASM_ARM_Q0=neon) or the best ones."""
    if IS_ARM:
        if plain:
            monkeypatch.setenv("GPT2ASM_ARM_Q0", "neon")
        else:
            monkeypatch.delenv("GPT2ASM_ARM_Q0", raising=False)
    else:
        monkeypatch.setenv("GPT2ASM_Q0_PLAIN", "1" if plain else "0")


@pytest.mark.parametrize("ckpt", ["tiny", "w256"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fingerprint_every_family_variant_and_thread_count(request, families, monkeypatch, dtype, ckpt):
    """w256: a 256-wide model, whose q4_0 head is q6_k (tiny's falls back to q8_0)."""
    path = request.getfixturevalue("ckpt_tiny" if ckpt == "tiny" else "ckpt_w256")
    got, names = {}, set()
    for fam, plain in variants(families):
        use_variant(monkeypatch, plain)
        for threads in (1, 2, 3):
            m = GPT2.load(path, dtype=dtype, isa=fam, threads=threads)
            names.add(m.model.k.q0_names[f"matvec_{dtype}"])
            got[fam, plain, threads] = fingerprint(m, PROMPTS, STEPS)[0]
            m.close()
    print(f"\n{dtype}: {sorted(names)}")
    assert len(set(got.values())) == 1, got
    if ckpt == "tiny" and request.getfixturevalue("same_checkpoint"):
        assert set(got.values()) == {PINNED[dtype, None]}, got
    if ckpt == "w256" and request.getfixturevalue("same_checkpoint_w256"):
        assert set(got.values()) == {PINNED_W256[dtype]}, got


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_prefill_equals_cached_steps(tiny, families, threads, monkeypatch):
    """Every prompt length (one row, odd counts, whole and partial tiles of tokens), every family and
    variant: the logits of the last token and the KV cache of cached steps."""
    dtype, w = tiny
    k = Kernels(families[0])
    ref = {n: cached_steps(Transformer(w, k), prompt(n, seed=n)) for n in LENGTHS}
    k.close()
    for fam, plain in variants(families):
        use_variant(monkeypatch, plain)
        k = Kernels(fam, threads)
        model = Transformer(w, k)
        for n in LENGTHS:
            want, want_st = ref[n]
            st = model.new_state()
            got = model.prefill(st, prompt(n, seed=n))[0]
            what = f"{dtype} {fam} plain={plain} -j {threads} T={n}"
            assert np.array_equal(bits(got), bits(want[-1])), f"{what}: logits"
            assert same_cache(st, want_st, n), f"{what}: KV cache"
        k.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_after_steps_across_a_chunk_then_steps(ckpt_tiny, families, dtype):
    """From a filled cache, across a chunk boundary (PREFILL_ROWS) with a last chunk of one row; steps
    then continue as after cached steps; the full-prefix forward gives every position's logits."""
    w = load_weights(ckpt_tiny, dtype)
    head, body, tail = prompt(3, 1), prompt(PREFILL_ROWS + 1, 2), prompt(4, 3)
    k = Kernels(families[0])
    want, want_st = cached_steps(Transformer(w, k), head + body + tail)
    k.close()
    for threads in (1, 2):
        k = Kernels(families[-1], threads)
        model = Transformer(w, k)
        st = model.new_state()
        model.prefill(st, head)
        got = model.prefill(st, body)[0]
        assert np.array_equal(bits(got), bits(want[len(head + body) - 1])), f"-j {threads}"
        after = np.stack([model.step(st, t)[0].copy() for t in tail])
        assert np.array_equal(bits(after), bits(want[-len(tail):])), f"-j {threads}: steps after prefill"
        assert same_cache(st, want_st, len(want))
        fwd = model.forward(head + body + tail)
        assert np.array_equal(bits(fwd), bits(want)), f"-j {threads}: forward"
        k.close()


@pytest.mark.parametrize("dtype", DTYPES + ["q4_0-w256"])
def test_plan_equals_single_kernel_calls(request, families, dtype, monkeypatch):
    """The step and prefill plans against the same forward pass as single calls from Python
    (tests/oracle.py: the checked q0kernels wrappers for quantize / matvec / matmul, numpy adds).
    q4_0-w256: the 256-wide model, its q6_k head."""
    dtype, _, wide = dtype.partition("-")
    w = load_weights(request.getfixturevalue("ckpt_w256" if wide else "ckpt_tiny"), dtype)
    ids = prompt(9, 11)
    for fam, plain in variants(families):
        use_variant(monkeypatch, plain)
        k = Kernels(fam, 2)
        model = Transformer(w, k)
        a, b, c = model.new_state(), model.new_state(), model.new_state()
        for t in ids:
            got, first = model.step(a, t)
            want, want_first = oracle.step_reference(model, b, t)
            assert np.array_equal(bits(got), bits(want)) and first == want_first, f"{fam} plain={plain}"
        ref = oracle.prefill_reference(model, c, ids)[0]
        assert np.array_equal(bits(ref), bits(got)), f"{fam} plain={plain}: prefill reference"
        assert same_cache(a, b, len(ids)) and same_cache(a, c, len(ids))
        k.close()


def test_real_widths(tokenizer_dir, families):
    """GPT-2 124M's widths (768 / 3072 inputs, 12 heads, the 786-tile q8_0 head), two layers: prefill
    and steps of both dtypes agree on every family at -j 1 and 3."""
    from conftest import checkpoint
    d = checkpoint("124M-2layer", tokenizer_dir, size="124M", n_layer=2, seed=3)
    ids = prompt(21, 7)
    for dtype in DTYPES:
        w = load_weights(d, dtype)
        k = Kernels(families[0])
        want, want_st = cached_steps(Transformer(w, k), ids)
        k.close()
        for fam in families:
            for threads in (3,) if qemu_config() else (1, 3):      # qemu: -j 3 only (the slow emulated CPU)
                k = Kernels(fam, threads)
                model = Transformer(w, k)
                st = model.new_state()
                got = model.prefill(st, ids)[0]
                assert np.array_equal(bits(got), bits(want[-1])), f"{dtype} {fam} -j {threads}"
                assert same_cache(st, want_st, len(ids)), f"{dtype} {fam} -j {threads}: KV cache"
                first = model.step(st, ids[0])[1]
                assert first == int(np.argmax(st.logits_view))
                k.close()


class EmulatedQ0(EmulatedAvx512):
    """The avx512 family on the emulated CPU (Ice-Lake-like: AVX-512 VNNI, no AVX-VNNI) with a chosen
    q0 variant; the jobs call the emulated library's own copies of the kernels."""

    def __init__(self, emu, variant: str):
        self.variant = variant
        super().__init__(emu)

    def _q0_variant(self):
        return self.variant

    def _address(self, name):
        return self.emulator.address_of(name)


@pytest.mark.parametrize("variant", ["avx512vnni", "avx512vnni_zen4", "avx512"])
def test_emulated_avx512(ckpt_tiny, ckpt_w256, families, variant, monkeypatch):
    """The AVX-512 q0 plans under the emulator (one thread): q8_0 cached steps and prefill, q4_0 steps
    (also of the 256-wide model: the q6_k head, with prefill), against native avx2 (kept small: the emulator
    runs ~1000x slower).  avx512vnni_zen4: the VNNI variant with the Zen 4 decode tuning forced
    ($GPT2ASM_Q0_ZEN4)."""
    monkeypatch.setenv("GPT2ASM_Q0_ZEN4", "1" if variant.endswith("_zen4") else "0")
    tuned, variant = variant, variant.removesuffix("_zen4")
    emu = emulator()
    try:
        ids = prompt(5, 13)
        for dtype, ckpt in [(d, ckpt_tiny) for d in DTYPES] + [("q4_0-w256", ckpt_w256)]:
            dtype, _, wide = dtype.partition("-")
            w = load_weights(ckpt, dtype)
            k = Kernels(families[0])
            want, want_st = cached_steps(Transformer(w, k), ids)
            k.close()
            k = EmulatedQ0(emu, variant)
            assert k.q0_names[f"matvec_{dtype}"] == f"gpt2asm_matvec_{dtype}_{tuned}"
            model = Transformer(w, k)
            got, st = cached_steps(model, ids[:3])
            assert np.array_equal(bits(got), bits(want[:3])), f"{dtype} {variant}: steps"
            if dtype == "q8_0" or wide:
                st = model.new_state()
                got = model.prefill(st, ids)[0]
                assert np.array_equal(bits(got), bits(want[-1])), f"{dtype} {variant}: prefill"
                assert same_cache(st, want_st, len(ids))
    finally:
        emu.close()


@pytest.mark.parametrize("ftype, dtype", [("Q8_0", "q8_0"), ("Q4_0", "q4_0"), ("Q4_0", "q4_0-w256")])
def test_gguf_gives_the_dtype_bits(request, tmp_path, ftype, dtype):
    """A GGUF Q8_0 (Q4_0) of a checkpoint holds the blocks --dtype q8_0 (q4_0) quantizes: the same logits.
    q4_0-w256: the 256-wide model, whose GGUF (like llama-quantize's) stores the head as Q6_K."""
    dtype, _, wide = dtype.partition("-")
    ckpt_tiny = request.getfixturevalue("ckpt_w256" if wide else "ckpt_tiny")
    import sys
    from pathlib import Path
    pytest.importorskip("gguf")          # (the arm64 test sysroot has no gguf wheel: tools/arm64/requirements.txt)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    from make_gguf import write_gguf
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", ftype)
    with GPT2.load(ckpt_tiny, dtype=dtype, threads=2) as a, GPT2.load(g, threads=2) as b:
        assert b.dtype == dtype
        assert a.model.w.head_w.shape == b.model.w.head_w.shape == ((786, 1, 13440) if wide else (786, 4, 2176))
        assert fingerprint(a, PROMPTS[:1], 4) == fingerprint(b, PROMPTS[:1], 4)
        ids = a.encode(PROMPTS[0])
        assert np.array_equal(bits(a.logits(ids)), bits(b.logits(ids)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_resident_copies_give_the_same_bits(ckpt_tiny, families, dtype, monkeypatch):
    """The step and prefill plans rebuilt on the packed resident copies of the records: the same logits."""
    monkeypatch.setenv("GPT2ASM_RESIDENT", "1")
    with GPT2.load(ckpt_tiny, dtype=dtype, isa=families[-1], threads=2) as m:
        res = m.model.resident
        ids = prompt(6, 17)
        st = m.model.new_state()
        before = m.model.prefill(st, ids)[0].copy()
        if res is None or res.reason:
            pytest.skip(f"no resident copy here: {None if res is None else res.reason}")
        res.wait(60)
        st = m.model.new_state()
        after = m.model.prefill(st, ids)[0]
        assert res.adopted and m.model.w.layers[0].fc_w.dtype == np.uint8
        assert np.array_equal(bits(after), bits(before))
        assert np.array_equal(bits(cached_steps(m.model, ids)[0][-1]), bits(before))


# --------------------------------------------------------------------------------------------------
# the jobs' checks and the ROWQUANT job alone

def test_rows_quantize_job(families):
    """ROWQUANT over odd row counts (-j 1 and 3), with and without its LayerNorm: each row the
    quantizer's bits on that row (of the LayerNorm kernel's output)."""
    rng = np.random.default_rng(3)
    R, n = 11, 96
    x = aligned_zeros((R, n), np.float32)
    x[:] = rng.standard_normal((R, n)) * 3
    x[4, 32:64] = 0                                  # an all-zero block
    g, beta = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    for fam in families:
        q = oracle.q0_kernels(fam)
        for threads in (1, 3):
            k = Kernels(fam, threads)
            for ln in (None, (g, beta)):
                xq, xd = np.full((R, n), 99, np.int8), np.full((R, n // 32), np.nan, np.float32)
                p = k.new_plan()
                p.rows_quantize(x, xq, xd, ln=ln)
                p.build()
                for T in (1, 7, R):
                    xq[:], xd[:] = 99, np.nan
                    p.set_rows(T, 0)
                    p.run()
                    for t in range(T):
                        src = x[t] if ln is None else k.layernorm(x[t], g, beta)
                        wq, wd = q.quantize(np.ascontiguousarray(src))
                        assert np.array_equal(xq[t], wq) and np.array_equal(bits(xd[t]), bits(wd)), (fam, t)
                    assert (xq[T:] == 99).all()              # rows past n_tok untouched
            k.close()


def test_q0_jobs_refuse_what_does_not_fit(ckpt_tiny, families):
    w = load_weights(ckpt_tiny, "q8_0")
    L = w.layers[0]
    C = w.config.n_embd
    k = Kernels(families[0])
    p = k.new_plan()
    x, y = aligned_zeros((4, C), np.float32), aligned_zeros((4, 4 * C), np.float32)
    xq, xd = aligned_zeros((4, 4 * C), np.int8), aligned_zeros((4, 4 * C // 32), np.float32)
    with pytest.raises(InvalidArgumentError, match="xd"):
        p.matmul(L.fc_w, xq, L.fc_b, y)                                  # no scales of the rows
    with pytest.raises(InvalidArgumentError, match="dtype"):
        p.matmul(L.fc_w, x, L.fc_b, y, xd=xd)                            # float rows for a q0 matmul
    with pytest.raises(InvalidArgumentError, match="records"):
        p.matvec(L.fc_w.reshape(L.fc_w.shape[0], -1, 1088), x[0], L.fc_b, y[0])   # not a record size
    with pytest.raises(InvalidArgumentError):
        p.matvec(L.proj_w, x[0], L.proj_b, y[0])                         # 4C inputs, x holds C
    with pytest.raises(InvalidArgumentError, match="multiple of 32"):
        p.rows_quantize(x[:, :40], xq, xd)
    with pytest.raises(InvalidArgumentError, match="overlap"):
        p.matmul(L.fc_w, xq, L.fc_b, y, xd=xd, resid=y[:, :4 * C])
    assert len(p) == 0                                                   # nothing was added
    fw = load_weights(ckpt_tiny, "f32").layers[0].fc_w
    with pytest.raises(InvalidArgumentError, match="xd"):
        p.matmul(fw, x, L.fc_b, y, xd=xd)                                # scales of rows with float weights
    k.q0_fns, k.has_q8_0 = None, False                                  # a family without the q0 jobs
    with pytest.raises(KernelUnavailableError):
        p.matvec(L.fc_w, x[0], L.fc_b, y[0])
    with pytest.raises(KernelUnavailableError):
        p.rows_quantize(x, xq, xd)
    with pytest.raises(KernelUnavailableError):
        Transformer(w, k)
    k.close()
