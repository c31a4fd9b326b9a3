"""Continuous batching (gpt2asm/scheduler.py) and the list / n forms of the API (gpt2asm/batch.py).

Contract: a sequence run through the Scheduler -- joining while others run, prefilled in chunks between
decode steps, leaving at its own step, beside cancelled ones -- gets the logits bits (SHA-256 of each
step's logits) and tokens of decoding it alone, for f32, f16, q8_0 and q4_0 at -j 1 and 2; the API's
lists give what one call per prompt gives, in order, sample k of a prompt with seed s the text of seed s + k
alone.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from arm64_qemu import qemu_config
from gpt2asm import GPT2, ContextOverflowError, InvalidArgumentError
from gpt2asm.sampler import Sampler
from gpt2asm.scheduler import (QueueFullError, RequestTooLargeError, SchedulerClosedError, Scheduler, SeqSpec,
                               sample_seed)


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


class Recording(Scheduler):
    """A Scheduler that records the SHA-256 of the logits each sequence samples from."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: dict = {}

    def _sample(self, s, logits, argmax):
        self.seen.setdefault((s.req.id, s.index), []).append(sha(logits))
        return super()._sample(s, logits, argmax)


def alone(m: GPT2, ids: list[int], n: int, **sampling) -> tuple[list[int], list[str]]:
    """Tokens and per-step logits hashes of GPT2.generate_ids's path alone: prefill, then steps."""
    s = dict(dict(temperature=0.8, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=0), **sampling)
    sampler = Sampler(m.model.k.softmax, s["temperature"], s["top_k"], s["top_p"], s["repetition_penalty"],
                      s["seed"], argmax=m.model.k.argmax)
    st = m.model.new_state()
    logits, am = m.model.prefill(st, ids or [m.tokenizer.eot_id])
    fused = m.n_sample == m.config.vocab_size
    toks, hashes, hist = [], [], list(ids)
    for k in range(n):
        hashes.append(sha(logits))
        t = sampler(logits[:m.n_sample], hist, am) if fused else sampler(logits[:m.n_sample], hist)
        hist.append(t)
        toks.append(t)
        if k + 1 < n:
            logits, am = m.model.step(st, t)
    assert toks == list(m.generate_ids(ids, n, **s))
    return toks, hashes


def prompt(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 50257, n)]


CASES = [  # (prompt length, max tokens, sampling, join at driver step, cancel after step or None)
    (3, 12, dict(temperature=0), 0, None),
    (17, 5, dict(temperature=0.9, seed=5), 0, None),
    (1, 20, dict(temperature=1.0, top_k=40, seed=9), 2, None),
    (40, 9, dict(temperature=0), 3, None),                          # prefilled over several chunks
    (8, 30, dict(temperature=0.7, top_p=0.9, seed=3), 4, 16),        # cancelled mid-flight
    (11, 7, dict(temperature=0, repetition_penalty=1.3), 6, None),
    (5, 15, dict(temperature=1.2, seed=1), 9, None),
]


# under qemu (make test-arm64): f16 (binary16 caches) at -j 2 only
@pytest.mark.parametrize("threads", [2] if qemu_config() else [1, 2])
@pytest.mark.parametrize("dtype", ["f16"] if qemu_config() else ["f32", "f16", "q8_0", "q4_0", "q4_0-w256"])
def test_join_and_leave_same_bits_as_alone(request, families, dtype, threads):
    """q4_0-w256: the 256-wide model, whose q4_0 head is q6_k (batched through its matmul)."""
    dtype, _, wide = dtype.partition("-")
    ckpt = request.getfixturevalue("ckpt_w256" if wide else "ckpt_tiny")
    for fam in families[-1:] if qemu_config() else families:        # qemu: the last family (sme2 / neon)
        join_and_leave(ckpt, fam, dtype, threads)


def join_and_leave(ckpt_tiny, fam, dtype, threads):
    with GPT2.load(ckpt_tiny, dtype=dtype, threads=threads, isa=fam) as m:
        sched = Recording(m, max_batch=4, max_queue=16, prefill_chunk=6)
        reqs, step = {}, 0
        while step < 10 or not sched.idle:
            for i, (L, n, samp, join, cancel) in enumerate(CASES):
                if join == step:
                    reqs[i] = sched.submit([SeqSpec(prompt(L, i), n, dict(samp, seed=samp.get("seed", 0)))],
                                           callback=lambda ev, i=i: got[i].append(ev))
                if cancel == step:
                    reqs[i].cancel()
            if step == 0:
                got = {i: [] for i in range(len(CASES))}
            sched.step()
            step += 1
            assert sched.running <= 4
            assert step < 500
        for i, (L, n, samp, join, cancel) in enumerate(CASES):
            toks = [e.token for e in got[i] if e.token is not None]
            fin = [e.finish_reason for e in got[i] if e.finish_reason]
            want_toks, want_hashes = alone(m, prompt(L, i), n, **dict(samp, seed=samp.get("seed", 0)))
            have = sched.seen[(reqs[i].id, 0)]
            if cancel is None:
                assert fin == ["length"] and toks == want_toks, f"{fam} case {i}"
                assert have == want_hashes, f"{fam} case {i}: logits bits differ from decoding alone"
            else:
                assert fin == ["cancelled"] and 0 < len(toks) < n
                assert toks == want_toks[:len(toks)] and have == want_hashes[:len(have)]


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_samples_share_the_prompt_prefill(ckpt_tiny, dtype):
    """n samples of one prompt: one prefill, its cache copied into the others' slots; each sample the
    logits bits and tokens of its seed alone (also when the pool is too small for all of them at once)."""
    with GPT2.load(ckpt_tiny, dtype=dtype) as m:
        ids = prompt(30, 7)
        for max_batch in (5, 2):
            sched = Recording(m, max_batch=max_batch, prefill_chunk=8)
            sp = [SeqSpec(ids, 6 + k, dict(temperature=1.0, top_k=20, seed=sample_seed(3, k))) for k in range(4)]
            sp.append(SeqSpec(prompt(5, 8), 4, dict(temperature=0)))
            got: dict = {}
            req = sched.submit(sp, callback=lambda ev: got.setdefault(ev.index, []).append(ev))
            prefills = []
            real = m.model.prefill
            m.model.prefill = lambda st, toks: (prefills.append(len(toks)), real(st, toks))[1]
            try:
                sched.run()
            finally:
                m.model.prefill = real
            if max_batch == 5:
                assert sum(prefills) == 30 + 5                        # the shared prompt prefilled once
            for k, spec in enumerate(sp):
                want_toks, want_hashes = alone(m, spec.prompt_ids, spec.max_tokens, **spec.sampling)
                assert [e.token for e in got[k] if e.token is not None] == want_toks
                assert sched.seen[(req.id, k)] == want_hashes


def test_step_batch_is_step(ckpt_tiny):
    with GPT2.load(ckpt_tiny) as m:
        M = m.model
        a, b, c = M.new_state(), M.new_state(), M.new_state()
        M.prefill(a, [1, 2, 3])
        M.prefill(b, [7])
        logits, am = M.step_batch([a, b], [4, 8])
        ref = [M.step(M.new_state(), 7)]
        M.prefill(c, [1, 2, 3])
        want = M.step(c, 4)[0].copy()
        assert np.array_equal(logits[0], want) and am[0] == int(np.argmax(want))
        d = M.new_state()
        M.step(d, 7)
        assert np.array_equal(logits[1], M.step(d, 8)[0]) and ref
        with pytest.raises(InvalidArgumentError):
            M.step_batch([a, a], [1, 2])


def test_threaded_scheduler_queue_and_close(ckpt_tiny):
    with GPT2.load(ckpt_tiny) as m:
        sched = Scheduler(m, max_batch=2, max_queue=1).start()
        try:
            r = sched.submit([SeqSpec(m.encode("Hello"), 10, dict(temperature=0))])
            text = "".join(e.text for e in r)
            assert text == m.generate("Hello", 10, temperature=0)
            sched.drain()                                            # nothing new once draining
            with pytest.raises(SchedulerClosedError):
                sched.submit([SeqSpec([1], 1)])
        finally:
            sched.close()
        full = Scheduler(m, max_batch=2, max_queue=1)                # not started: nothing leaves the queue
        full.submit([SeqSpec([1], 2)])                               # slots free: taken whatever the queue
        full.submit([SeqSpec([2], 2)])
        full.submit([SeqSpec([2], 2)])                               # the one place in the queue
        with pytest.raises(QueueFullError):
            full.submit([SeqSpec([3], 2)])
        with pytest.raises(ContextOverflowError):
            full.submit([SeqSpec([1] * 10, m.n_ctx)])
        with pytest.raises(InvalidArgumentError):
            full.submit([SeqSpec([1], 2, dict(temperature=-1))])
        full.close()
        assert full.idle
        calls = Scheduler(m, max_batch=2)                            # call(): one a step, in order (first: ahead)
        order, futs = [], [calls.call(lambda i=i: order.append(i) or i) for i in range(3)]
        futs.append(calls.call(lambda: order.append("first"), first=True))
        futs[1].cancel()                                             # cancelled before it ran: skipped
        calls.step()
        assert order == ["first"]
        calls.step()
        calls.step()
        assert order == ["first", 0, 2] and futs[2].result() == 2 and calls.idle
        late = [calls.call(lambda: order.append("late")) for _ in range(3)]
        calls.close()                                                # every queued call cancelled
        assert all(f.cancelled() for f in late) and order == ["first", 0, 2]


def test_a_slot_caching_the_prompts_prefix_skips_it(ckpt_tiny):
    """A sequence takes the free slot whose cache holds the longest prefix of its prompt and prefills only
    the rest (Scheduler.reused): every completion the same as GPT2.generate alone, whether the prompt
    extends a finished one's text, repeats it, or shares only its start; the n samples of one prompt still
    share its one prefill."""
    shared = "The history of the printing press begins in the fifteenth century, when"
    prompts = [shared, shared + " a goldsmith named", shared, shared[:30] + " something else entirely",
               "Unrelated"]
    with GPT2.load(ckpt_tiny) as m:
        want = [m.generate(p, 6, temperature=0) for p in prompts]
        want_n = [m.generate(shared + " x", 6, seed=sample_seed(3, k)) for k in range(3)]
        sched = Scheduler(m, max_batch=2)
        got, reused = [], []
        for p in prompts:
            before = sched.reused
            r = sched.submit([SeqSpec(m.encode(p), 6, dict(temperature=0))])
            while not r.done:
                sched.step()
            got.append("".join(e.text for e in r))
            reused.append(sched.reused - before)
        assert got == want
        n_shared = len(m.encode(shared))
        assert reused[0] >= 0 and reused[1] == n_shared and reused[2] == n_shared - 1, reused
        assert 0 < reused[3] < n_shared and reused[4] == 0, reused
        r = sched.submit([SeqSpec(m.encode(shared), 1, dict(temperature=0))])
        while not r.done:
            sched.step()
        before = sched.reused
        r = sched.submit([SeqSpec(m.encode(shared + " x"), 6, dict(seed=sample_seed(3, k))) for k in range(3)])
        while not r.done:
            sched.step()
        texts = ["", "", ""]
        for e in r:
            texts[e.index] += e.text
        assert texts == want_n and sched.reused - before >= n_shared
        sched.close()


def test_a_failed_run_of_a_batched_step_feeds_no_row_twice(ckpt_tiny, monkeypatch):
    """step_batch runs BATCH_ROWS rows a library call: when a later run fails, the rows of the runs before
    it are fed already.  The scheduler's fallback (each sequence alone, to find the one at fault) fed them
    again -- their tokens silently changed, and their caches, one position ahead of the tokens they were
    said to hold, went back to the pool for a later prompt to reuse.  They sample from the step they had."""
    import gpt2asm.model as gm
    from gpt2asm import ResourceError
    prompts = [[10, 11, 12], [20, 21], [30, 31, 32, 33], [40]]
    with GPT2.load(ckpt_tiny) as m:
        want = [list(m.generate_ids(p, 6, temperature=1.0, seed=7)) for p in prompts]
        later = prompts[0] + want[0] + [5]
        want_later = list(m.generate_ids(later, 4, temperature=0))
        real, calls = gm.Transformer.step_rows, []

        def flaky(self, states, tokens):
            calls.append(len(states))
            if len(calls) == 4:                   # the second run of the second batched step
                raise ResourceError("injected: this run failed")
            return real(self, states, tokens)
        monkeypatch.setattr(gm, "BATCH_ROWS", 2)
        monkeypatch.setattr(gm.Transformer, "step_rows", flaky)
        sched = Scheduler(m, max_batch=4)
        r = sched.submit([SeqSpec(p, 6, dict(temperature=1.0, seed=7)) for p in prompts])
        sched.run()
        got = [[] for _ in prompts]
        for e in r:
            if e.token is not None:
                got[e.index].append(e.token)
            if e.finish_reason:
                assert e.finish_reason == "length", e
        assert len(calls) > 4 and got == want
        for st in sched._free:                    # every cache holds what it says it holds
            assert st.n == len(st.tokens) and any(st.tokens == p + w[:5] for p, w in zip(prompts, want))
        monkeypatch.undo()
        r = sched.submit([SeqSpec(later, 4, dict(temperature=0))])
        before = sched.reused
        sched.run()
        assert [e.token for e in r if e.token is not None] == want_later and sched.reused - before == len(later) - 2
        sched.close()


def test_a_request_that_can_never_start_is_refused(ckpt_tiny):
    """With max_queue 0 nothing may wait, so a request of more sequences than max_batch can never start:
    RequestTooLargeError (the server's 400), not QueueFullError (429, retried for ever).  With a queue it is
    admitted in part and the rest waits for slots."""
    with GPT2.load(ckpt_tiny) as m:
        none = Scheduler(m, max_batch=2, max_queue=0)
        with pytest.raises(RequestTooLargeError, match="could never start"):
            none.submit([SeqSpec([1], 2)] * 3)
        none.submit([SeqSpec([1], 2)] * 2)                           # fits the slots
        with pytest.raises(QueueFullError):                          # busy now: a retry may succeed
            none.submit([SeqSpec([2], 2)])
        none.close()
        one = Scheduler(m, max_batch=2, max_queue=1)
        r = one.submit([SeqSpec([1], 2, dict(temperature=0))] * 3)
        one.run()
        assert r.done and [e.finish_reason for e in r.events(timeout=0) if e.finish_reason] == ["length"] * 3
        one.close()


def test_api_lists_and_samples(ckpt_tiny):
    with GPT2.load(ckpt_tiny) as m:
        # a prompt given twice, the copy adopting its twin's prefill, with no new tokens: nothing (as alone)
        assert m.generate(["Hello", "Hello"], max_new_tokens=[5, 0], temperature=0) == [m.generate("Hello", 5, temperature=0), ""]
        assert [i for i, _ in m.generate_ids([[15496], [15496]], max_new_tokens=[3, 0], temperature=0)] == [0, 0, 0]
        # n=None is "not given" everywhere: the single-prompt forms
        assert m.generate("Hello", 3, n=None, temperature=0) == m.generate("Hello", 3, temperature=0)
        assert list(m.stream("Hello", 3, n=None, temperature=0)) == list(m.stream("Hello", 3, temperature=0))
        prompts = ["Hello there", "The quick brown fox", ""]
        out = m.generate(prompts, max_new_tokens=[5, 12, 3], temperature=0)
        assert out == [m.generate(p, n, temperature=0) for p, n in zip(prompts, [5, 12, 3])]
        s = m.generate("Once upon", max_new_tokens=8, n=3, seed=11, temperature=1.0)
        assert s == [m.generate("Once upon", 8, seed=sample_seed(11, k), temperature=1.0) for k in range(3)]
        both = m.generate(["a", "b"], max_new_tokens=6, n=2, seed=100, top_k=5)
        assert both == [m.generate(p, 6, seed=100 + j, top_k=5) for j, p in enumerate(["a", "a", "b", "b"])]
        per = m.generate(["a", "b"], max_new_tokens=6, seed=[4, 9], temperature=[0.5, 1.5])
        assert per == [m.generate("a", 6, seed=4, temperature=0.5), m.generate("b", 6, seed=9, temperature=1.5)]
        stop = m.generate(["x y z", "x y z"], max_new_tokens=20, temperature=0, stop=[[" the"], None])
        assert stop == [m.generate("x y z", 20, temperature=0, stop=[" the"]), m.generate("x y z", 20, temperature=0)]
        pieces: dict = {}
        for i, piece in m.stream(prompts, max_new_tokens=7, seed=2):
            pieces[i] = pieces.get(i, "") + piece
        assert [pieces.get(i, "") for i in range(3)] == m.generate(prompts, max_new_tokens=7, seed=2)
        ids = [m.encode("Hello"), m.encode("World wide")]
        pairs = list(m.generate_ids(ids, 4, temperature=0))
        assert [t for i, t in pairs if i == 1] == list(m.generate_ids(ids[1], 4, temperature=0))
        assert list(m.generate_ids(ids[0], 4, temperature=0, n=1)) == [(0, t) for t in m.generate_ids(ids[0], 4, temperature=0)]
        for bad in (dict(max_new_tokens=[1]), dict(n=0), dict(seed=-1), dict(temperature="hot"), dict(n=True),
                    dict(bogus=1)):
            with pytest.raises(InvalidArgumentError):
                m.generate(["a", "b"], **bad)
        with pytest.raises(InvalidArgumentError):
            m.stream(["a", 3])
        with pytest.raises(InvalidArgumentError, match="more than 65,536"):         # refused before any work
            m.generate(["a"] * 1000, 2, n=1000)
        with pytest.raises(ContextOverflowError):
            m.generate(["a"], max_new_tokens=m.n_ctx)
        assert m.generate("Hello", 5, temperature=0) == m.generate(["Hello"], 5, temperature=0)[0]


def test_an_error_mid_batch_frees_every_kv_cache(ckpt_tiny, monkeypatch):
    """A batched call that fails part-way (here: no memory for a sixth KV cache) drops every cache it had
    at once, with the garbage collector off: the samples of one prompt reference each other, and those
    caches used to stay until a collection, so under a memory limit every later call failed too."""
    import gc
    import weakref
    from gpt2asm import ResourceError
    m = GPT2.load(ckpt_tiny)
    made = []
    new_state = m.model.new_state

    def limited():
        if len(made) >= 5:
            raise MemoryError("no memory for another KV cache")
        st = new_state()
        made.append(weakref.ref(st))
        return st
    monkeypatch.setattr(m.model, "new_state", limited)
    was = gc.isenabled()
    gc.disable()
    try:
        with pytest.raises(ResourceError, match="out of memory"):     # the system's refusal, typed
            m.generate(["Hello", "Hi there"], 8, n=4, seed=1)
        assert len(made) == 5 and all(r() is None for r in made)
        with pytest.raises(ResourceError):                     # a stream closed part-way: the same
            for _ in m.stream(["Hello", "Hi there"], 8, n=4, seed=1):
                pass
    finally:
        if was:
            gc.enable()
    assert all(r() is None for r in made)
    made.clear()
    monkeypatch.setattr(m.model, "new_state", new_state)
    assert m.generate(["Hello", "Hi there"], 8, n=4, seed=1) == [m.generate(p, 8, seed=1 + 4 * i + k)
                                                                  for i, p in enumerate(("Hello", "Hi there"))
                                                                  for k in range(4)]


def test_logprobs_name_only_tokens_the_tokenizer_prints(ckpt_tiny):
    """A checkpoint may pad its vocabulary past the tokenizer's (GPT2.n_sample < vocab_size): sampling
    stays below n_sample, and so must the top-k alternatives of logprobs (the server prints them; an
    unprintable id used to turn a completion into a 400 and break a stream).  The log-probabilities stay
    over the whole vocabulary, as GPT2.logprobs scores.  Here n_sample is lowered to 1000 to stand for
    such a checkpoint."""
    from gpt2asm.scoring import log_softmax
    from gpt2asm.server import prompt_logprobs
    m = GPT2.load(ckpt_tiny)
    m.n_sample = 1000
    ids = m.encode("The quick brown fox jumps over the lazy dog")
    sched = Scheduler(m, max_batch=2)
    req = sched.submit([SeqSpec(ids, 6, dict(temperature=0), logprobs=5),
                        SeqSpec(ids, 6, dict(temperature=1.0, seed=3), logprobs=5)])
    sched.run()
    evs = [e for e in req.events(timeout=0) if e.token is not None]
    assert len(evs) == 12
    for e in evs:
        assert e.token < 1000 and len(e.top) == 5 and all(i < 1000 for i in e.top)
    lps, tops = prompt_logprobs(m, ids, 5)
    want = log_softmax(m.logits(ids))
    for t in range(1, len(ids)):
        assert all(i < 1000 for i in tops[t]) and len(tops[t]) == 5
        assert lps[t] == want[t - 1, ids[t]]                        # normalized over every id
