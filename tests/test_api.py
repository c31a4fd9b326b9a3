"""The Python API: load, encode/decode, logits, generate/stream with stop strings, sessions that reuse the
KV cache (identical to a cold start), KV snapshots to bytes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpt2asm import GPT2, ContextOverflowError, InvalidArgumentError
from gpt2asm.engine import Session

PROMPT = "Alan Turing theorized that computers would one day become"


@pytest.fixture(scope="module")
def m(ckpt_tiny):
    with GPT2.load(ckpt_tiny) as model:
        yield model


def test_load_forms(ckpt_tiny):
    a = GPT2.load(ckpt_tiny)
    b = GPT2.load(str(ckpt_tiny / "model.safetensors"), dtype="fp32", threads=2)
    c = GPT2.load(ckpt_tiny, dtype="F16")
    assert a.model_dir == b.model_dir and b.threads == 2 and c.dtype == "f16"
    assert "n_layer=2" in repr(a)
    ids = a.encode(PROMPT)
    assert np.array_equal(a.logits(ids), b.logits(ids))            # -j does not change a bit
    assert GPT2.load(ckpt_tiny, dtype=None).dtype == "f32"           # None: f32 (a GGUF: the file's own)
    for bad in (dict(dtype="f64"), dict(dtype=3), dict(threads=0), dict(threads=True), dict(threads=2.0),
                dict(threads=257), dict(isa="sse9"), dict(isa=99)):
        with pytest.raises(InvalidArgumentError):
            GPT2.load(ckpt_tiny, **bad)
    with pytest.raises(InvalidArgumentError):
        GPT2.load(12345)


@pytest.mark.parametrize("dtype", ["q8", "Q8", "int8"])
def test_retired_dtype_names_its_successor(ckpt_tiny, dtype):
    """The old int8 dtype was retired (docs/notes.md): every loader refuses it with InvalidArgumentError
    naming q8_0 -- before touching the model or the kernels."""
    from gpt2asm import ggufload, tilecache, weights
    msg = f"dtype '{dtype}' was retired: use 'q8_0'"
    for load in (GPT2.load, weights.load_weights, tilecache.load_weights_cached, ggufload.load_gguf):
        with pytest.raises(InvalidArgumentError, match=msg):
            load(ckpt_tiny, dtype)


def test_kv_cache_dtype(ckpt_tiny):
    """kv: f32 by default with f32 weights, f16 with the other dtypes; either may be asked for.  A binary16 cache
    is half the bytes, its logits close to an f32 cache's (rounding of keys and values, not more), and a
    snapshot restores only into a session with the same cache dtype."""
    with GPT2.load(ckpt_tiny) as a, GPT2.load(ckpt_tiny, kv="f16") as b, GPT2.load(ckpt_tiny, dtype="f16") as c, \
            GPT2.load(ckpt_tiny, dtype="f16", kv="f32") as d:
        assert (a.kv, b.kv, c.kv, d.kv) == ("f32", "f16", "f16", "f32")
        sa, sb = a.session(), b.session()
        assert sa._state.k.dtype == np.float32 and sb._state.k.dtype == np.float16
        assert sb._state.k.nbytes * 2 == sa._state.k.nbytes
        ids = a.encode(PROMPT)
        la, lb = a.logits(ids), b.logits(ids)
        assert not np.array_equal(la, lb)
        assert float(np.abs(la - lb).max()) <= 1e-2 * float(la.std())
        sb.generate(PROMPT, max_new_tokens=3, temperature=0)
        with pytest.raises(InvalidArgumentError, match="another model"):
            sa.restore(sb.snapshot())
        assert b.session(sb.snapshot()).tokens == sb.tokens
    for bad in ("f64", "f 16", "", 16, True):
        with pytest.raises(InvalidArgumentError):
            GPT2.load(ckpt_tiny, kv=bad)
    with GPT2.load(ckpt_tiny, dtype=" F16 ", kv=" F32", isa=f" {a.isa.upper()} ") as e:   # names: any case, blanks
        assert (e.dtype, e.kv, e.isa) == ("f16", "f32", a.isa)


def test_encode_decode_logits(m):
    ids = m.encode("Hello world, ünïcödé 🙂")
    assert m.decode(ids) == "Hello world, ünïcödé 🙂"
    assert m.decode(np.array(ids, dtype=np.int64)) == m.decode(ids)
    full = m.logits(ids)
    assert full.shape == (len(ids), m.config.vocab_size) and full.dtype == np.float32
    st = m.model.new_state()
    steps = np.stack([m.model.step(st, t)[0].copy() for t in ids])
    assert np.array_equal(full.view(np.uint32), steps.view(np.uint32))
    with pytest.raises(InvalidArgumentError):
        m.logits([])
    with pytest.raises(ContextOverflowError) as e:
        m.logits([1] * (m.n_ctx + 1))
    assert (e.value.needed, e.value.available) == (m.n_ctx + 1, m.n_ctx)


def test_generate_and_stream(m):
    text = m.generate(PROMPT, max_new_tokens=24, temperature=0)
    assert "".join(m.stream(PROMPT, max_new_tokens=24, temperature=0)) == text
    assert m.generate(PROMPT, max_new_tokens=0) == ""
    # the same seed gives the same text; no seed gives fresh randomness
    kw = dict(max_new_tokens=16, temperature=1.0, top_k=40, top_p=0.95, repetition_penalty=1.1)
    assert m.generate(PROMPT, seed=5, **kw) == m.generate(PROMPT, seed=5, **kw)
    assert len({m.generate(PROMPT, **kw) for _ in range(4)}) > 1
    ids = list(m.generate_ids(m.encode(PROMPT), 24, temperature=0))
    assert m.decode(ids) == text


def test_stop_strings(m):
    text = m.generate(PROMPT, max_new_tokens=40, temperature=0)
    stop = text[12:16]
    cut = text.find(stop)
    assert m.generate(PROMPT, max_new_tokens=40, temperature=0, stop=[stop]) == text[:cut]
    assert m.generate(PROMPT, max_new_tokens=40, temperature=0, stop=stop) == text[:cut]
    assert "".join(m.stream(PROMPT, max_new_tokens=40, temperature=0, stop=["zzzz-never", stop])) == text[:cut]
    assert m.generate(PROMPT, max_new_tokens=40, temperature=0, stop=["zzzz-never"]) == text
    for bad in (5, [1], [b"x"], {"a": 1}):
        with pytest.raises(InvalidArgumentError):
            m.generate(PROMPT, max_new_tokens=4, stop=bad)


@pytest.mark.parametrize("kw", [dict(max_new_tokens=-1), dict(max_new_tokens=1.5), dict(max_new_tokens=True),
                                dict(max_new_tokens="3"), dict(temperature=-0.1), dict(temperature=float("nan")),
                                dict(temperature=float("inf")), dict(temperature=101), dict(temperature="1"),
                                dict(top_k=-1), dict(top_k=2.5), dict(top_k=True), dict(top_p=0), dict(top_p=1.01),
                                dict(top_p=float("nan")), dict(repetition_penalty=0),
                                dict(repetition_penalty=-1), dict(repetition_penalty=1000), dict(seed=-1),
                                dict(seed=2 ** 64), dict(seed=1.0), dict(seed="7"), dict(temp=0.5)])
def test_every_argument_checked(m, kw):
    kw = {"max_new_tokens": 3, **kw}
    with pytest.raises(InvalidArgumentError):
        m.generate("Hi", **kw)
    with pytest.raises(InvalidArgumentError):
        m.stream("Hi", **kw)                       # checked before the first piece is asked for
    with pytest.raises(InvalidArgumentError):
        m.session().generate("Hi", **kw)
    assert m.generate("Hi", max_new_tokens=2, temperature=0)   # and the model is still fine


def test_session_reuses_prefix_and_matches_cold_start(m):
    s = m.session()
    chat = "Q: What is a computer?\nA:"
    for turn, (temp, seed) in enumerate([(0, 1), (0.9, 2), (1.2, 3), (0, 4)]):
        kw = dict(max_new_tokens=12, temperature=temp, seed=seed, top_k=50)
        cold = m.generate(chat, **kw)
        warm = s.generate(chat, **kw)
        assert warm == cold, f"turn {turn}"
        if turn:
            assert s.reused > 0 and s.prefilled < len(m.encode(chat))
        last = chat
        chat += warm + f"\nQ: And number {turn}?\nA:"
    n = len(s.tokens)
    assert s.n == n > 0
    # the same text again: everything but the last token comes from the cache
    again = s.generate(last, max_new_tokens=5, temperature=0)
    assert s.reused == len(m.encode(last)) - 1 and s.prefilled == 1
    assert again == m.generate(last, max_new_tokens=5, temperature=0)
    # a different text: only the shared prefix is reused
    other = "Q: What is a computer?\nA: a dog"
    assert s.generate(other, max_new_tokens=6, temperature=0) == m.generate(other, max_new_tokens=6, temperature=0)
    assert 0 < s.reused < len(m.encode(other))


def test_session_streaming_and_stop(m):
    s = m.session()
    text = m.generate(PROMPT, max_new_tokens=30, temperature=0)
    stop = text[10:13]
    got = "".join(s.stream(PROMPT, max_new_tokens=30, temperature=0, stop=[stop]))
    assert got == text[:text.find(stop)]
    follow = PROMPT + got + " and"
    assert s.generate(follow, max_new_tokens=8, temperature=0) == m.generate(follow, max_new_tokens=8, temperature=0)
    assert s.reused >= len(m.encode(PROMPT))


def test_session_survives_errors_and_abandoned_streams(m):
    s = m.session()
    s.generate("Hello", max_new_tokens=4, temperature=0)
    before = list(s.tokens)
    with pytest.raises(ContextOverflowError) as e:
        s.generate("Hello", max_new_tokens=m.n_ctx)
    assert e.value.available == m.n_ctx and e.value.needed > m.n_ctx
    assert s.tokens == before
    it = s.stream("Hello there, friend", max_new_tokens=20, temperature=0)
    next(it)
    next(it)
    it.close()                                               # abandoned half way: cache and tokens agree
    assert s._state.n == len(s.tokens)
    p = "Hello there, friend of mine"
    assert s.generate(p, max_new_tokens=6, temperature=0) == m.generate(p, max_new_tokens=6, temperature=0)
    s.reset()
    assert s.n == 0 and s.generate(p, max_new_tokens=6, temperature=0) == m.generate(p, max_new_tokens=6,
                                                                                     temperature=0)


def test_session_logits(m):
    s = m.session()
    ids = m.encode(PROMPT)
    full = m.logits(ids)
    assert np.array_equal(s.logits(ids[:5]), full[4])
    assert np.array_equal(s.logits(ids), full[-1]) and s.reused == 5
    with pytest.raises(InvalidArgumentError):
        s.logits([m.config.vocab_size])


def test_snapshot_roundtrip(m, ckpt_tiny):
    s = m.session()
    s.generate(PROMPT, max_new_tokens=10, temperature=0.7, seed=9)
    blob = s.snapshot()
    assert isinstance(blob, bytes)
    cont = PROMPT + " and so"
    r = Session.from_bytes(m, blob)
    assert r.tokens == s.tokens
    assert r.generate(cont, max_new_tokens=8, temperature=0) == m.generate(cont, max_new_tokens=8, temperature=0)
    assert r.reused >= len(m.encode(PROMPT))
    # into an existing session, replacing what it held
    t = m.session()
    t.generate("Something else entirely", max_new_tokens=3, temperature=0)
    t.restore(blob)
    assert t.tokens == s.tokens
    # an empty session's snapshot; the model's shortcut
    assert Session.from_bytes(m, m.session().snapshot()).n == 0
    assert m.session(blob).tokens == s.tokens


def test_copies_of_sessions_branch_and_a_model_is_not_copied(m):
    """copy.copy of a Session used to share its KV cache (two texts mixed in it: wrong logits, silently);
    now copy / deepcopy / s.copy() are branches, each the bits of a fresh model.  A GPT2 copied would
    share its -j pool (closing one stopped the other's workers): copy, deepcopy and pickle are refused
    with NotCopyableError (also a TypeError, as pickle's own refusals)."""
    import copy
    import pickle
    from gpt2asm import NotCopyableError
    s = m.session()
    s.generate(PROMPT, max_new_tokens=6, temperature=0)
    held = list(s.tokens)
    for branch in (copy.copy(s), copy.deepcopy(s), s.copy()):
        assert branch is not s and branch.tokens == held and branch.gpt2 is m
        a, b = PROMPT + " one way", PROMPT + " and another"
        assert branch.generate(a, max_new_tokens=5, temperature=0) == m.generate(a, max_new_tokens=5, temperature=0)
        assert branch.reused >= len(m.encode(PROMPT))
        assert s.generate(b, max_new_tokens=5, temperature=0) == m.generate(b, max_new_tokens=5, temperature=0)
    for refuse in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(NotCopyableError, match="GPT2 model cannot be"):
            refuse(m)
        with pytest.raises(TypeError):
            refuse(m)
    with pytest.raises(NotCopyableError, match="snapshot"):
        pickle.dumps(s)
    assert m.generate(PROMPT, max_new_tokens=3, temperature=0)       # the model is untouched


def test_snapshot_rejects_damage_and_other_models(m, ckpt_tiny):
    s = m.session()
    s.generate(PROMPT, max_new_tokens=4, temperature=0)
    blob = s.snapshot()
    victim = m.session()
    victim.generate("Keep me", max_new_tokens=2, temperature=0)
    keep = list(victim.tokens)
    bad = [b"", b"GPT2ASM", blob[:-1], blob[:40], blob + b"x", b"x" + blob[1:], "not bytes", None,
           bytes(len(blob))]
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 1
    bad.append(bytes(flipped))
    for b in bad:
        with pytest.raises(InvalidArgumentError):
            victim.restore(b)
        assert victim.tokens == keep                          # nothing changed
    other = GPT2.load(ckpt_tiny, dtype="f16")                 # same shapes, other numbers
    with pytest.raises(InvalidArgumentError, match="another model"):
        other.session().restore(blob)


def test_reused_caches_change_no_bit(ckpt_tiny):
    """A finished call's State goes back to the model and the next call takes it (lease_state): whatever an
    earlier, longer text left in it beyond the new text's positions, the logits and tokens are those of a
    fresh model; the idle States stay within IDLE_STATE_BYTES (always one); close() lets them go."""
    import gpt2asm.model as gm
    ids_long = list(range(40, 140))
    ids_short = [464, 3290, 318]
    with GPT2.load(ckpt_tiny) as fresh:
        want_short = fresh.logits(ids_short).tobytes()
        want_gen = list(fresh.generate_ids(ids_short, 12, temperature=0))
    with GPT2.load(ckpt_tiny) as model:
        T = model.model
        model.logits(ids_long)
        assert len(T._idle) == 1
        st = T._idle[0]
        assert T.lease_state() is st and st.n == 0
        T.release_state(st)
        T.release_state(st)                                  # twice: kept once
        assert len(T._idle) == 1
        list(model.generate_ids(ids_long, 20, temperature=0))  # the same State: 120 positions written
        assert T._idle == [st]
        assert model.logits(ids_short).tobytes() == want_short
        assert list(model.generate_ids(ids_short, 12, temperature=0)) == want_gen
        assert T._idle == [st]
        g = model.generate_ids(ids_short, 12, temperature=0)   # a live generator holds its State
        next(g)
        assert T._idle == []
        assert model.logits(ids_short).tobytes() == want_short  # meanwhile: a new State
        g.close()
        assert len(T._idle) == 2 and T._idle[0] is not T._idle[1]
        # the bound: no more than IDLE_STATE_BYTES of idle States (the first is always kept)
        size = st.nbytes
        old = gm.IDLE_STATE_BYTES
        try:
            gm.IDLE_STATE_BYTES = size
            T.drop_idle_states()
            a, b = T.lease_state(), T.lease_state()
            T.release_state(a)
            T.release_state(b)
            assert T._idle == [a]
        finally:
            gm.IDLE_STATE_BYTES = old
        # the batch API's sequences take the idle States and hand them back when every one has ended
        outs = model.generate(["Hello", "Hi there"], max_new_tokens=5, temperature=0)
        assert outs == [model.generate(p, max_new_tokens=5, temperature=0) for p in ("Hello", "Hi there")]
        assert len(T._idle) == 2
    assert T._idle == []                                         # close()


def test_reused_caches_skip_the_prefix_they_hold(ckpt_tiny):
    """A call whose prompt begins with tokens an idle State caches feeds only the rest (stats['reused']):
    the same tokens and logits as a fresh model, for a prompt that extends, repeats, or leaves the cached
    text part-way; logits() leaves its tokens cached for the next call."""
    base = list(range(300, 360))
    with GPT2.load(ckpt_tiny) as fresh:
        want = {k: list(fresh.generate_ids(p, 10, temperature=0))
                for k, p in (("ext", base + [11, 12]), ("same", base), ("fork", base[:25] + [7, 8, 9]))}
        want_logits = fresh.logits(base + [5]).tobytes()
    with GPT2.load(ckpt_tiny) as model:
        st = {}
        first = list(model.generate_ids(base, 10, temperature=0, stats=st))
        assert st["reused"] == 0 and first == want["same"]
        st = {}
        list(model.generate_ids(base + first[:3], 4, temperature=0, stats=st))   # prompt + what was generated
        assert st["reused"] == 60 + 2
        for key, p, reused in (("ext", base + [11, 12], 60), ("same", base, 59), ("fork", base[:25] + [7, 8, 9], 25)):
            st = {}
            assert list(model.generate_ids(p, 10, temperature=0, stats=st)) == want[key], key
            assert st["reused"] == reused, (key, st)
        assert model.logits(base + [5]).tobytes() == want_logits                # a forward: reuses nothing
        st = {}
        list(model.generate_ids(base + [5, 6], 3, temperature=0, stats=st))     # ... but leaves it cached
        assert st["reused"] == 61
        # a generator closed after its first token: its prompt stays cached
        g = model.generate_ids(base + [1, 2, 3], 5, temperature=0, stats=(st := {}))
        next(g)
        g.close()
        assert model.model._idle[-1].tokens == base + [1, 2, 3]


def test_a_generator_collected_under_the_idle_lock_does_not_deadlock(ckpt_tiny):
    """A started generator left in a reference cycle is finalized by the garbage collector, which runs at
    any allocation -- also one inside lease_state / release_state, under the idle States' lock -- and its
    finally hands its State back (release_state, the same lock): with a plain Lock that thread waited for
    itself for ever (seen with the default gc thresholds).  Here the collector is made to run there (in a
    child process: a deadlock fails the test instead of hanging it)."""
    import subprocess
    import sys
    code = f"""
import gc
import gpt2asm.model as gm
from gpt2asm import GPT2
model = GPT2.load({str(ckpt_tiny)!r})
a, b = model.generate_ids([1, 2], 2, temperature=0), model.generate_ids([1, 2], 2, temperature=0)
next(a), next(b)
a.close(), b.close()                                    # two idle States: lease_state runs best_reuse
box = [model.generate_ids([1, 2, 3, 4], 5, temperature=0)]
next(box[0])
box.append(box)                                         # only the collector frees it
del box
real = gm.best_reuse
gm.best_reuse = lambda states, ids: (gc.collect(), real(states, ids))[1]
got = list(model.generate_ids([1, 2, 3], 2, temperature=0))
gm.best_reuse = real
assert got == list(model.generate_ids([1, 2, 3], 2, temperature=0))
assert len(model.model._idle) == 2, model.model._idle
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=str(Path(__file__).resolve().parent.parent))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_release_state_takes_only_this_models_states(ckpt_tiny):
    """A State of another Transformer (another cache dtype, thread count or shape) handed to release_state
    was kept and leased by the next call: other bits (an f16 cache under an f32 model's logits) or every later
    call failing on its buffers' sizes.  It is refused with InvalidArgumentError, as is a non-State."""
    ids = list(range(1, 40))
    with GPT2.load(ckpt_tiny, kv="f32") as model, GPT2.load(ckpt_tiny, kv="f16") as other:
        want = model.logits(ids).tobytes()
        model.model.drop_idle_states()
        for s in (other.model.new_state(), None, "state"):
            with pytest.raises(InvalidArgumentError, match="release_state takes a State of this model"):
                model.model.release_state(s, ids[:30])
        assert model.model._idle == []
        assert model.logits(ids).tobytes() == want


def test_logits_by_cached_steps_are_every_positions(ckpt_tiny, monkeypatch):
    """A kernel family without the optional matmul kernels computes logits() by cached steps; each step
    returns a view of the State's one logits buffer, so every row came out as the last token's logits."""
    ids = [464, 3290, 318, 257, 1332]
    with GPT2.load(ckpt_tiny) as model:
        want = model.logits(ids)
        monkeypatch.setattr(model.model.k, "has_matmul", False)
        got = model.logits(ids)
        assert got.tobytes() == want.tobytes() and not np.array_equal(got[0], got[-1])
