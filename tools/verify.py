#!/usr/bin/env python3
"""Greedy parity with Hugging Face transformers (PyTorch, fp32): prints ALL PASS or what differs.

    python tools/verify.py --model DIR [--dtype f32|f16] [-s ISA] [-j N]

- 12 tokenizer cases: our ids must equal GPT2TokenizerFast's;
- 4 prompts x 40 greedy tokens: our ids must equal GPT2LMHeadModel.generate's (fp32, greedy).
Needs the test-only dependencies transformers and torch (`make test-deps`).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tokenizer_cases import VERIFY_CASES  # noqa: E402

PROMPTS = ["Alan Turing theorized that computers would one day become",
           "The meaning of life is",
           "In a shocking finding, scientists discovered a herd of unicorns living in",
           "Hello, my name is"]
STEPS = 40


def hf_tokenizer(model_dir: Path):
    from transformers import GPT2TokenizerFast
    with tempfile.TemporaryDirectory() as tmp:          # just the two files: a plain GPT-2 tokenizer
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(model_dir / f, tmp)
        return GPT2TokenizerFast.from_pretrained(tmp)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("GPT2ASM_MODEL", "."), help="model directory")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16"])
    ap.add_argument("-s", dest="isa", default=None, help="kernel family (default: best)")
    ap.add_argument("-j", dest="threads", type=int, default=1)
    a = ap.parse_args(argv)

    import torch
    from transformers import GPT2LMHeadModel

    from gpt2asm import GPT2
    from gpt2asm.files import find_model_dir
    d = find_model_dir(a.model)
    ours = GPT2.load(d, dtype=a.dtype, isa=a.isa, threads=a.threads)
    print(f"model {d}{' (random weights)' if ours.random_init else ''}, {ours.isa}, {a.dtype}, -j {a.threads}")
    failures = 0

    tok = hf_tokenizer(d)
    for i, text in enumerate(VERIFY_CASES):
        want, got = tok.encode(text), ours.encode(text)
        ok = want == got
        failures += not ok
        print(f"tokenizer {i + 1:2d}/{len(VERIFY_CASES)} {'PASS' if ok else 'FAIL'} {text!r:.40}"
              + ("" if ok else f"\n    hf:   {want}\n    ours: {got}"))

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ref = GPT2LMHeadModel.from_pretrained(str(d), dtype=torch.float32).eval()
    for i, p in enumerate(PROMPTS):
        ids = ours.encode(p)
        with torch.no_grad():
            out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=STEPS, do_sample=False, pad_token_id=ours.tokenizer.eot_id)
        want = out[0, len(ids):].tolist()
        got = list(ours.generate_ids(ids, STEPS, temperature=0))
        ok = want == got
        failures += not ok
        print(f"generate  {i + 1}/{len(PROMPTS)} {'PASS' if ok else 'FAIL'} {p!r:.50}")
        if not ok:
            k = next(j for j in range(STEPS) if want[j] != got[j])
            print(f"    first difference at token {k}: hf {want[k]} ours {got[k]}")
    ours.close()
    print("ALL PASS" if not failures else f"{failures} FAILED")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
