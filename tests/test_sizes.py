"""Every GPT-2 size through the same code: random-init checkpoints of each shape (real vocabulary and
context; fewer layers for the wide ones) match transformers' logits within 1e-3.

    distilgpt2  6 x 768, 12 heads (all 6 layers; the hub's bare names with mask buffers)
    gpt2-medium 1024 wide, 16 heads  (2 of 24 layers)
    gpt2-large  1280 wide, 20 heads  (2 of 36 layers)
    gpt2-xl     1600 wide, 25 heads  (2 of 48 layers)
The 124M shape is covered by test_parity.py. Checkpoints are cached in .cache/test-models.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

from conftest import checkpoint
from gpt2asm import GPT2

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-3
PROMPT = "The quick brown fox jumps over the lazy dog. Ünïcödé 🙂"
SIZES = {                       # name -> (make_checkpoint size, overrides, layout, (n_layer, n_embd, n_head))
    "distilgpt2": ("distil", {}, "hub", (6, 768, 12)),
    "gpt2-medium": ("medium", {"n_layer": 2}, "hf", (2, 1024, 16)),
    "gpt2-large": ("large", {"n_layer": 2}, "hf", (2, 1280, 20)),
    "gpt2-xl": ("xl", {"n_layer": 2}, "hf", (2, 1600, 25)),
}


@pytest.mark.parametrize("name", list(SIZES))
def test_size_matches_transformers(name, tokenizer_dir):
    size, over, layout, dims = SIZES[name]
    d = checkpoint(f"{name}-{layout}", tokenizer_dir, size=size, seed=11, layout=layout, **over)
    m = GPT2.load(d, threads=2)
    c = m.config
    assert (c.n_layer, c.n_embd, c.n_head) == dims and (c.n_ctx, c.vocab_size) == (1024, 50257)
    ids = m.encode(PROMPT)
    st = m.model.new_state()
    got = [m.model.step(st, t)[0].copy() for t in ids]
    for _ in range(4):                                        # and a few greedy steps past the prompt
        ids.append(int(np.argmax(got[-1])))
        got.append(m.model.step(st, ids[-1])[0].copy())
    got = np.stack(got)
    full = m.logits(ids)                                      # the full-prefix path gives the same bits
    assert np.array_equal(full.view(np.uint32), got.view(np.uint32))
    m.close()
    del m, st, full
    gc.collect()
    torch.set_num_threads(2)
    ref = transformers.GPT2LMHeadModel.from_pretrained(str(d), dtype=torch.float32).eval()
    assert (ref.config.n_layer, ref.config.n_embd, ref.config.n_head) == dims
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    del ref
    gc.collect()
    err = np.abs(got - want).max()
    assert err < TOL, f"{name}: max |logit diff| {err:.2e}"
