"""End-to-end forward pass: determinism fingerprints across kernel families, -j and loop order.

Contract 1 (DEVELOPERS.md): one SHA-256 of the logits per (checkpoint, prompts) on every kernel
family, every thread count, and for cached steps vs a full-prefix recompute.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from gpt2asm import GPT2, ContextOverflowError, InvalidArgumentError

PROMPTS = ["Alan Turing theorized that computers would one day become",
           "The meaning of life is",
           "\n\nIn 1905, Einstein's \"annus mirabilis\" papers",
           "Hello"]
STEPS = 32


def fingerprint(model: GPT2, prompts=PROMPTS, steps=STEPS) -> tuple[str, list[list[int]]]:
    """SHA-256 over the float32 logits of every prompt token and every greedy step."""
    h = hashlib.sha256()
    outs = []
    for p in prompts:
        st = model.model.new_state()
        for t in model.encode(p):
            logits = model.model.step(st, t)[0]
            h.update(logits.tobytes())
        out = []
        for _ in range(steps):
            out.append(int(np.argmax(logits)))
            logits = model.model.step(st, out[-1])[0]
            h.update(logits.tobytes())
        outs.append(out)
    return h.hexdigest(), outs


@pytest.fixture(scope="module", params=["f32", "f16"])
def reference(request, ckpt_124m, families):
    """The fingerprint of the first family, -j 1, for each dtype."""
    m = GPT2.load(ckpt_124m, dtype=request.param, isa=families[0], threads=1)
    fp = fingerprint(m)
    m.close()
    return request.param, fp


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fingerprint_same_for_every_family_and_thread_count(reference, ckpt_124m, families, threads):
    dtype, (want, want_ids) = reference
    for fam in families:
        if fam == families[0] and threads == 1:
            continue
        m = GPT2.load(ckpt_124m, dtype=dtype, isa=fam, threads=threads)
        got, ids = fingerprint(m)
        m.close()
        assert ids == want_ids, f"{fam} -j {threads} {dtype}: greedy tokens differ"
        assert got == want, f"{fam} -j {threads} {dtype}: logits differ from {families[0]} -j 1"


def test_cached_steps_equal_full_prefix_recompute(ckpt_124m, families):
    for fam in families:
        m = GPT2.load(ckpt_124m, isa=fam, threads=2)
        ids = m.encode(PROMPTS[0])
        st = m.model.new_state()
        steps = []
        for t in ids:
            steps.append(m.model.step(st, t)[0].copy())
        for _ in range(12):                               # extend greedily, then recompute it all
            ids.append(int(np.argmax(steps[-1])))
            steps.append(m.model.step(st, ids[-1])[0].copy())
        full = m.logits(ids)
        m.close()
        assert full.shape == (len(ids), m.config.vocab_size)
        assert np.array_equal(full.view(np.uint32), np.stack(steps).view(np.uint32))


def test_fp16_close_to_fp32(ckpt_tiny):
    a = GPT2.load(ckpt_tiny, dtype="f32")
    b = GPT2.load(ckpt_tiny, dtype="f16")
    ids = a.encode(PROMPTS[1])
    la, lb = a.logits(ids), b.logits(ids)
    assert np.abs(la - lb).max() < 0.05 * np.abs(la).max() + 1e-3


def test_tiny_fingerprint_every_family_and_threads(ckpt_tiny, families):
    fps = {(f, j): fingerprint(GPT2.load(ckpt_tiny, isa=f, threads=j))[0]
           for f in families for j in (1, 2, 3, 4)}
    assert len(set(fps.values())) == 1, fps


def test_context_overflow_is_typed_and_model_stays_usable(ckpt_tiny):
    m = GPT2.load(ckpt_tiny)
    n_ctx = m.config.n_ctx
    with pytest.raises(ContextOverflowError) as e:
        list(m.generate_ids([1] * (n_ctx - 2), max_new_tokens=5))
    assert (e.value.needed, e.value.available) == (n_ctx + 3, n_ctx)
    st = m.model.new_state()
    for _ in range(n_ctx):
        m.model.step(st, 1)
    with pytest.raises(ContextOverflowError):
        m.model.step(st, 1)
    assert m.generate("Hello", max_new_tokens=3, temperature=0)  # still fine


def test_bad_token_ids_rejected(ckpt_tiny):
    m = GPT2.load(ckpt_tiny)
    for bad in ([-1], [m.config.vocab_size], [10**12]):
        with pytest.raises(InvalidArgumentError):
            m.logits(bad)
    with pytest.raises(InvalidArgumentError):
        m.model.step(m.model.new_state(), m.config.vocab_size)
    # a dict or a set is no token sequence (their order is not the text's): refused, as str and bytes are
    for bad in ({15496: "x", 995: "y"}, {15496, 995}, frozenset([1]), "abc", b"ab"):
        with pytest.raises(InvalidArgumentError, match="sequence of token ids"):
            m.logits(bad)
        with pytest.raises(InvalidArgumentError):
            m.decode(bad)
        with pytest.raises(InvalidArgumentError):
            list(m.generate_ids([bad], max_new_tokens=1, temperature=0))
    assert m.decode(iter([15496, 995])) == m.decode([15496, 995])       # an iterator is a sequence in order


def test_transformer_calls_check_their_state(ckpt_tiny):
    """Transformer.step / prefill / step_batch given something else than a State, a State whose position was
    set out of range, or one State for the list: InvalidArgumentError, never AttributeError / ValueError."""
    with GPT2.load(ckpt_tiny) as m:
        M, st = m.model, m.model.new_state()
        for call in (lambda: M.step(None, 1), lambda: M.prefill("state", [1, 2]), lambda: M.step_batch(st, [1]),
                     lambda: M.step_batch([st], 1)):
            with pytest.raises(InvalidArgumentError):
                call()
        st.n = -3                                           # prefill's embeddings would slice wpe[-3:0]
        with pytest.raises(InvalidArgumentError):
            M.prefill(st, [1, 2, 3])
        st.n = 0
        assert M.prefill(st, [1, 2, 3])[1] is not None      # still usable


def test_empty_prompt_starts_from_endoftext(ckpt_tiny):
    m = GPT2.load(ckpt_tiny)
    a = list(m.generate_ids([], max_new_tokens=5, temperature=0))
    b = list(m.generate_ids([m.tokenizer.eot_id], max_new_tokens=5, temperature=0))
    assert a == b


def test_seeded_sampling_repeatable(ckpt_tiny):
    m = GPT2.load(ckpt_tiny)
    kw = dict(max_new_tokens=20, temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.2)
    a = m.generate("Once upon a time", seed=7, **kw)
    assert a == m.generate("Once upon a time", seed=7, **kw)
    assert a != m.generate("Once upon a time", seed=8, **kw)


def test_stream_pieces_join_to_generate(ckpt_tiny):
    m = GPT2.load(ckpt_tiny)
    pieces = list(m.stream("Hi", max_new_tokens=15, temperature=0))
    assert "".join(pieces) == m.generate("Hi", max_new_tokens=15, temperature=0)
