"""The cross-ISA logits fingerprint: one SHA-256 per (checkpoint, prompts) on every kernel family.

The values below were computed natively with AVX2 on x86-64.  Natively this test checks every family the
CPU has (AVX2, AVX-512) and -j 1/2 against them; under qemu-aarch64 (`make test-arm64`) the same test
checks NEON and SME2 at each streaming vector length — contract 1 across machines and architectures.
"""
from __future__ import annotations

import hashlib

import pytest

from gpt2asm import GPT2
from test_model import fingerprint

PROMPTS = ["Alan Turing theorized that computers would one day become", "日本語 and émojis 🙂 too"]
STEPS = 8
CHECKPOINT_SHA256 = "c1bc16bc2a9a695fa92e15660e4bc5c502f79a814ace6f5525cb71cd46996285"   # tiny-hf, seed 1
# (weight dtype, KV cache dtype; None = the default: f32 with f32 weights, f16 with f16 weights)
PINNED = {("f32", None): "da2d2b23e9b41a544a4da45c56e9a238df68441bb854d65b86bf434975c7b7ed",
          ("f16", None): "7c3d11101eaa809fc94f3b83227560b7efc3c5fd79dad0004942e95f23f01449",
          ("f16", "f32"): "9eb7876ea7ca6db07bc8528ea8e0dfd8be219a23096693b9eaed1155111099fe",
          # q8_0 / q4_0 (issue 17): integer dot products, the same bits with and without VNNI
          # (tests/test_q0_model.py: plain variants, -j 3, prefill, the emulator, GGUF)
          ("q8_0", None): "d85f4325c40ad5975e097240cb3994e49ea3b760eecdcfb250f71638fffb6eb2",
          ("q4_0", None): "3afdbf09b2503520faeb130b60ce9d10d4dd3fa94d8de5c2039449646d52cb0a"}
# the 256-wide checkpoint (conftest ckpt_w256): its q4_0 model has the q6_k head (llama.cpp's Q6_K; tiny-hf's
# 128-wide rows fall back to q8_0 as llama-quantize's do)
CHECKPOINT_W256_SHA256 = "ae40f5dd5635accc9e2109a2ce485654a4e8484ec093809107e78a32e2a58c07"   # w256-hf, seed 4
PINNED_W256 = {"q4_0": "2292fd3ad6735eab092fa03cbb9943e6c3068991660e962d1a7a7032d2cc0e39",
               "q8_0": "22d6a0b8719347da39b5cac1855cb92662a820f11950f7b6f0cb35846821258f"}


@pytest.fixture(scope="module")
def same_checkpoint(ckpt_tiny) -> bool:
    return hashlib.sha256((ckpt_tiny / "model.safetensors").read_bytes()).hexdigest() == CHECKPOINT_SHA256


@pytest.fixture(scope="module")
def same_checkpoint_w256(ckpt_w256) -> bool:
    return hashlib.sha256((ckpt_w256 / "model.safetensors").read_bytes()).hexdigest() == CHECKPOINT_W256_SHA256


def agreed_fingerprint(ckpt, families, dtype, check=None, **load) -> str:
    """The logits fingerprint of ckpt at dtype, the same on every family here that runs dtype's plan jobs
    (q8_0 / q4_0: kernels.Q0_PLAN_FAMILIES; skipped if none) at -j 1 and 2; check(model) on each first."""
    if dtype in ("q8_0", "q4_0"):                  # the families whose executor runs the q0 jobs
        from gpt2asm.kernels import Q0_PLAN_FAMILIES
        families = [f for f in families if f in Q0_PLAN_FAMILIES]
        if not families:
            pytest.skip(f"no kernel family here runs the {dtype} plan jobs yet")
    got = {}
    for fam in families:
        for threads in (1, 2):
            m = GPT2.load(ckpt, dtype=dtype, isa=fam, threads=threads, **load)
            if check is not None:
                check(m)
            got[fam, threads] = fingerprint(m, PROMPTS, STEPS)[0]
            m.close()
    assert len(set(got.values())) == 1, got
    return next(iter(got.values()))


@pytest.mark.parametrize("dtype, kv", list(PINNED), ids=lambda p: str(p))
def test_fingerprint_pinned_on_every_family(ckpt_tiny, families, same_checkpoint, dtype, kv):
    got = agreed_fingerprint(ckpt_tiny, families, dtype, kv=kv)
    if not same_checkpoint:
        pytest.skip("the random checkpoint generator produced other weights (numpy changed?): "
                    "families agree with each other, the pinned x86 value cannot be compared")
    assert got == PINNED[dtype, kv], got


@pytest.mark.parametrize("dtype", list(PINNED_W256))
def test_fingerprint_w256_pinned_on_every_family(ckpt_w256, families, same_checkpoint_w256, dtype):
    """The q6_k head (q4_0 of a 256-wide model) and the q8_0 one on every family, -j 1 / 2."""
    def head_kind(m):
        assert m.model.w.head_w.shape[2] == (13440 if dtype == "q4_0" else 2176)
    got = agreed_fingerprint(ckpt_w256, families, dtype, check=head_kind)
    if not same_checkpoint_w256:
        pytest.skip("the random checkpoint generator produced other weights: families agree, pinned not compared")
    assert got == PINNED_W256[dtype], got
