"""Contract 2: nothing unvalidated reaches assembly — bad arguments are typed errors, not crashes."""
from __future__ import annotations

import numpy as np
import pytest

from gpt2asm import InvalidArgumentError, KernelUnavailableError
from gpt2asm.cpu import FAMILIES, available_families, choose_family
from gpt2asm.kernels import Kernels
from gpt2asm.lib import ARCH
from gpt2asm.pool import split
from gpt2asm.weights import aligned_zeros, tile_matrix


@pytest.fixture(scope="module")
def K():
    return Kernels(threads=2)


def test_matvec_checked(K):
    w = tile_matrix(np.ones((5, 70), np.float32))            # [2][5][64]
    x = np.ones(5, np.float32)
    y = K.matvec(w, x)
    assert y.shape == (128,) and np.all(y[:70] == 5) and np.all(y[70:] == 0)
    bad = [
        (w, np.ones(4, np.float32), None),                    # wrong x length
        (w, np.ones(5, np.float64), None),                    # wrong dtype
        (w, np.ones(10, np.float32)[::2], None),              # not contiguous
        (w, x, np.zeros(70, np.float32)),                     # bias not padded
        (w.astype(np.float64), x, None),
        (w[:, :, :32], x, None),                              # not 64 wide
        (w.reshape(-1), x, None),
        ("w", x, None),
    ]
    for args in bad:
        with pytest.raises(InvalidArgumentError):
            K.matvec(*args)
    raw = aligned_zeros(w.size + 1, np.float32)[1:].reshape(w.shape)   # misaligned by 4 bytes
    with pytest.raises(InvalidArgumentError, match="aligned"):
        K.matvec(raw, x)


def test_unary_and_layernorm_checked(K):
    for fn in (K.gelu, K.expf, K.softmax):
        with pytest.raises(InvalidArgumentError):
            fn(np.zeros(0, np.float32))
        with pytest.raises(InvalidArgumentError):
            fn(np.zeros(3, np.int32))
        with pytest.raises(InvalidArgumentError):
            fn([1.0, 2.0])
    x = np.arange(7, dtype=np.float32)
    with pytest.raises(InvalidArgumentError):
        K.layernorm(x, np.ones(6, np.float32), np.zeros(7, np.float32))
    y = K.layernorm(x, np.ones(7, np.float32), np.zeros(7, np.float32))
    assert abs(float(y.mean())) < 1e-6


def test_attention_checked(K):
    k = np.zeros((2, 8, 64), np.float32)
    q = np.zeros(128, np.float32)
    assert K.attention(q, k, k.copy(), 8).shape == (128,)
    for n_pos in (0, 9, -1, 2.5):
        with pytest.raises(InvalidArgumentError):
            K.attention(q, k, k.copy(), n_pos)
    with pytest.raises(InvalidArgumentError):
        K.attention(np.zeros(64, np.float32), k, k.copy(), 1)
    with pytest.raises(InvalidArgumentError):
        K.attention(q, k, np.zeros((2, 7, 64), np.float32), 1)
    with pytest.raises(InvalidArgumentError):
        K.attention(q, np.zeros((2, 8, 32), np.float32), k, 1)


def test_family_choice():
    names = FAMILIES[ARCH]
    have = available_families()
    assert choose_family() == have[-1]
    for i, n in enumerate(names):
        if n in have:
            assert choose_family(i) == n == choose_family(n.upper())
        else:
            with pytest.raises(KernelUnavailableError):
                choose_family(i)
    with pytest.raises(InvalidArgumentError):
        choose_family(len(names))
    with pytest.raises(InvalidArgumentError):
        choose_family("sse2")


def test_family_from_environment(monkeypatch):
    monkeypatch.setenv("GPT2ASM_ISA", "0")
    assert choose_family() == FAMILIES[ARCH][0]
    monkeypatch.setenv("GPT2ASM_ISA", "nonsense")
    with pytest.raises(InvalidArgumentError):
        choose_family()


@pytest.mark.parametrize("threads", [0, -1, 1000, 1.5, "2"])
def test_bad_thread_counts(threads):
    with pytest.raises(InvalidArgumentError):
        Kernels(threads=threads)


def test_split_covers_exactly():
    for n in (1, 2, 7, 12, 786):
        for parts in (1, 2, 3, 8, 1000):
            r = split(n, parts)
            assert r[0][0] == 0 and r[-1][1] == n
            assert all(a < b for a, b in r) and all(r[i][1] == r[i + 1][0] for i in range(len(r) - 1))
