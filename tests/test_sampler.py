"""Sampling: greedy, temperature, top-k, top-p, repetition penalty, seeded PRNG, non-finite logits."""
from __future__ import annotations

import numpy as np
import pytest

from gpt2asm import InvalidArgumentError, NonFiniteLogitsError
from gpt2asm.kernels import Kernels
from gpt2asm.sampler import Rng, Sampler


@pytest.fixture(scope="module")
def softmax():
    return Kernels().softmax


def logits(n=1000, seed=0):
    return np.random.default_rng(seed).normal(0, 2, n).astype(np.float32)


def test_rng_is_fixed_and_uniform():
    r = Rng(42)
    xs = [r.random() for _ in range(20000)]
    assert all(0.0 <= x < 1.0 for x in xs)
    assert abs(np.mean(xs) - 0.5) < 0.01
    assert Rng(1).random() != Rng(2).random()
    # the stream is ours, not numpy's: pinned, so seeded text can never change silently
    r = Rng(0)
    assert [r.random() for _ in range(3)] == [0.4833481342839381, 0.8691389606829488, 0.7022433404894405]


def test_greedy_is_first_argmax(softmax):
    z = logits()
    z[[10, 20]] = z.max() + 1
    assert Sampler(softmax, temperature=0)(z) == 10


def test_top_k_1_and_tiny_top_p_are_greedy(softmax):
    z = logits()
    for s in (Sampler(softmax, 1.0, top_k=1, seed=3), Sampler(softmax, 1.0, top_p=1e-6, seed=3)):
        assert all(s(z) == int(np.argmax(z)) for _ in range(50))


def test_top_k_restricts_support(softmax):
    z = logits()
    top = set(np.argsort(-z)[:5].tolist())
    s = Sampler(softmax, 2.0, top_k=5, seed=1)
    seen = {s(z) for _ in range(300)}
    assert seen <= top and len(seen) > 1


def test_top_p_restricts_support(softmax):
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    s = Sampler(softmax, 1.0, top_p=0.75, seed=5)
    assert {s(z) for _ in range(300)} == {0, 1}


def test_sampling_matches_distribution(softmax):
    z = np.log(np.array([0.6, 0.3, 0.1], np.float32))
    s = Sampler(softmax, 1.0, seed=11)
    counts = np.bincount([s(z) for _ in range(6000)], minlength=3) / 6000
    assert np.allclose(counts, [0.6, 0.3, 0.1], atol=0.03)


def test_repetition_penalty(softmax):
    z = np.array([2.0, 1.9, -1.0], np.float32)
    assert Sampler(softmax, 0, repetition_penalty=1.5)(z, history=[0]) == 1
    assert Sampler(softmax, 0, repetition_penalty=1.5)(z, history=[2]) == 0
    assert z[0] == 2.0                                    # the caller's logits are untouched


def test_same_seed_same_choices(softmax):
    z = logits()
    s1, s2 = Sampler(softmax, 0.9, top_p=0.9, seed=9), Sampler(softmax, 0.9, top_p=0.9, seed=9)
    assert [s1(z) for _ in range(100)] == [s2(z) for _ in range(100)]


def test_greedy_through_the_argmax_kernel(softmax):
    k = Kernels()
    for seed in range(20):
        z = logits(50257, seed)
        z[[seed * 7, 40000 + seed]] = z.max() + 1                      # a tie: the first one wins
        assert Sampler(softmax, temperature=0, argmax=k.argmax)(z) == seed * 7 == int(np.argmax(z))
    z = logits()
    assert Sampler(softmax, 0, repetition_penalty=1.5, argmax=k.argmax)(z, history=[int(np.argmax(z))]) \
        == Sampler(softmax, 0, repetition_penalty=1.5)(z, history=[int(np.argmax(z))])


def test_greedy_takes_a_precomputed_first_maximum(softmax):
    """first_max (the argmax a model step returns, found by its LM head job) replaces the pass over the
    logits when sampling is greedy; None from it means non-finite logits; it is ignored otherwise."""
    z = logits()
    assert Sampler(softmax, 0, argmax=Kernels().argmax)(z, first_max=7) == 7           # taken as given
    assert Sampler(softmax, 0)(z, first_max=9) == 9
    with pytest.raises(NonFiniteLogitsError):
        Sampler(softmax, 0)(z, first_max=None)
    h = [int(np.argmax(z))]
    assert Sampler(softmax, 0, repetition_penalty=1.5)(z, h, first_max=11) == \
        Sampler(softmax, 0, repetition_penalty=1.5)(z, h)                             # penalised: not greedy
    assert Sampler(softmax, 0.8, seed=3)(z, first_max=13) == Sampler(softmax, 0.8, seed=3)(z)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_finite_logits_refused(softmax, bad, kernel, temperature):
    z = logits()
    z[3] = bad
    with pytest.raises(NonFiniteLogitsError):
        Sampler(softmax, temperature, argmax=Kernels().argmax if kernel else None)(z)


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=-1),
                                dict(top_k=-1.0), dict(top_k=40.0), dict(top_k=1.5), dict(top_p=0), dict(top_p=1.1),
                                dict(repetition_penalty=0), dict(seed=-1), dict(seed=1 << 64),
                                dict(temperature=10 ** 400), dict(top_p=10 ** 400), dict(repetition_penalty=10 ** 400)])
def test_bad_parameters(softmax, kw):
    with pytest.raises(InvalidArgumentError):
        Sampler(softmax, **kw)
