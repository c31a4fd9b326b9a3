#!/usr/bin/env python3
"""Greedy parity with Hugging Face transformers (PyTorch, fp32): prints ALL PASS or what differs.

    python tools/verify.py --model DIR [--dtype f32|f16|q8_0|q4_0] [--kv f32|f16] [-s ISA] [-j N]

- 12 tokenizer cases: our ids must equal GPT2TokenizerFast's;
- 4 prompts x 40 greedy tokens: our ids must equal GPT2LMHeadModel.generate's (fp32, greedy).
  Each prompt also reports the greedy agreement (tokens equal before the first difference, and at equal
  positions) and the max |logit error| over the prompt + transformers' 40 tokens: against transformers,
  and for the other dtypes against our own f32 logits (also relative to the f32 logits' standard deviation).
  f32 and f16 must match exactly; q8_0 and q4_0 (quantised weights -- and for q8_0 / q4_0 activations:
  the logits change by far more than fp32 rounding) may legitimately pick other tokens, so for them the
  agreement is reported, not judged.
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

from gpt2asm.__main__ import dtype_arg  # noqa: E402
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
    ap.add_argument("--dtype", default="f32", type=dtype_arg, choices=["f32", "f16", "q8_0", "q4_0"],
                    help="weight dtype (q8_0, q4_0: greedy agreement reported, not required)")
    ap.add_argument("--kv", default=None, choices=["f32", "f16"],
                    help="KV cache dtype (default: f32 with f32 weights, f16 with the others)")
    ap.add_argument("-s", dest="isa", default=None, help="kernel family (default: best)")
    ap.add_argument("-j", dest="threads", type=int, default=1)
    a = ap.parse_args(argv)

    import torch
    from transformers import GPT2LMHeadModel

    from gpt2asm import GPT2
    from gpt2asm.files import find_model_dir
    d = find_model_dir(a.model)
    ours = GPT2.load(d, dtype=a.dtype, isa=a.isa, threads=a.threads, kv=a.kv)
    print(f"model {d}{' (random weights)' if ours.random_init else ''}, {ours.isa}, {a.dtype}, KV cache {ours.kv}, "
          f"-j {a.threads}")
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
    strict = a.dtype in ("f32", "f16")                  # quantised: agreement is reported, not required
    f32 = ours if a.dtype == "f32" else GPT2.load(d, dtype="f32", isa=a.isa, threads=a.threads)
    agree_total, worst_hf, worst_f32, worst_rel = 0, 0.0, 0.0, 0.0
    for i, p in enumerate(PROMPTS):
        ids = ours.encode(p)
        with torch.no_grad():
            out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=STEPS, do_sample=False, pad_token_id=ours.tokenizer.eot_id)
        want = out[0, len(ids):].tolist()
        got = list(ours.generate_ids(ids, STEPS, temperature=0))
        ok = want == got
        k = next((j for j in range(STEPS) if want[j] != got[j]), STEPS)     # tokens equal before a difference
        same = sum(x == y for x, y in zip(want, got))
        agree_total += k
        # logits over the same tokens (prompt + transformers' continuation, teacher-forced)
        seq = ids + want
        with torch.no_grad():
            hf_logits = ref(torch.tensor([seq])).logits[0].float().numpy()
        mine = ours.logits(seq)
        err_hf = float(abs(mine - hf_logits).max())
        worst_hf = max(worst_hf, err_hf)
        detail = f"max|logit - transformers| {err_hf:.3g}"
        if f32 is not ours:
            base = f32.logits(seq)
            err = float(abs(mine - base).max())
            rel = err / float(base.std())
            worst_f32, worst_rel = max(worst_f32, err), max(worst_rel, rel)
            detail += f", max|logit - our f32| {err:.3g} ({rel:.3g} x logit std)"
        failures += strict and not ok
        verdict = "PASS" if ok else ("FAIL" if strict else "DIFF")
        print(f"generate  {i + 1}/{len(PROMPTS)} {verdict} {p!r:.50}")
        print(f"    agreement: {k}/{STEPS} tokens before the first difference, {same}/{STEPS} at equal "
              f"positions; {detail}")
        if not ok:
            print(f"    first difference at token {k}: hf {want[k]} ours {got[k]}")
    if f32 is not ours:
        f32.close()
    ours.close()
    print(f"{a.dtype}: greedy agreement {agree_total}/{STEPS * len(PROMPTS)} tokens (before each prompt's first "
          f"difference); max|logit error| vs transformers {worst_hf:.3g}"
          + (f", vs our f32 {worst_f32:.3g} ({worst_rel:.3g} x logit std)" if a.dtype != "f32" else ""))
    if not strict:
        print(f"({a.dtype}: the greedy tokens may differ from fp32's; reported, not judged)")
    print("ALL PASS" if not failures else f"{failures} FAILED")
    return 0 if not failures else 1


if __name__ == "__main__":
    from gpt2asm.errors import GPT2AsmError
    try:
        sys.exit(main())
    except (GPT2AsmError, OSError) as e:                 # a bad argument or file: one line, status 2
        print(f"verify.py: error: {e}", file=sys.stderr)
        sys.exit(2)
