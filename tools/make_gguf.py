#!/usr/bin/env python3
"""Write a GPT-2 GGUF of a safetensors checkpoint the way llama.cpp's convert_hf_to_gguf.py (GPT2Model) does,
with gguf.GGUFWriter -- for tests, and for machines without llama.cpp's source.

    python tools/make_gguf.py --model DIR --out model-Q8_0.gguf --type Q8_0 [--output] [--no-tokenizer]

What the converter writes, and so this tool:
  - names: wte -> token_embd.weight, wpe -> position_embd.weight, h.N.ln_1 -> blk.N.attn_norm,
    h.N.attn.c_attn -> blk.N.attn_qkv, h.N.attn.c_proj -> blk.N.attn_output, h.N.ln_2 -> blk.N.ffn_norm,
    h.N.mlp.c_fc -> blk.N.ffn_up, h.N.mlp.c_proj -> blk.N.ffn_down, ln_f -> output_norm; the causal-mask
    buffers h.N.attn.bias / masked_bias are dropped; the Conv1D weights are transposed ([out][in]); no
    output.weight (the head tied to token_embd), as the converter of llama.cpp 0.3.36's sdist writes it
    (older converters wrote a copy of token_embd.weight as output.weight: --output);
  - types: 1-D tensors, position_embd and biases F32; the other 2-D weights F32 / F16 / Q8_0 (--type), by
    gguf.quants (ggml's reference quantizers).  --type Q4_0 (llama-quantize's job, not the converter's):
    the block matrices Q4_0, token_embd / output Q6_K as llama-quantize gives them (Q8_0 when the row length
    is not a multiple of 256), by gpt2asm.quant0.quantize_q6k (ggml's quantize_row_q6_K_ref, which
    gguf.quants lacks: the same bytes as llama-quantize's);
  - metadata: general.architecture gpt2, gpt2.block_count, context_length, embedding_length,
    feed_forward_length, attention.head_count, attention.layer_norm_epsilon, general.file_type; the
    tokenizer (when vocab.json / merges.txt are beside the checkpoint): tokenizer.ggml.model gpt2, pre
    gpt-2, tokens, token_type (1 normal, 3 control for <|endoftext|>), merges, bos / eos ids.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7}       # llama_ftype: ALL_F32, MOSTLY_F16, Q4_0, Q8_0
_RENAME = [(r"^wte\.weight$", "token_embd.weight"), (r"^wpe\.weight$", "position_embd.weight"),
           (r"^lm_head\.weight$", "output.weight"), (r"^ln_f\.", "output_norm."),
           (r"^h\.(\d+)\.ln_1\.", r"blk.\1.attn_norm."), (r"^h\.(\d+)\.attn\.c_attn\.", r"blk.\1.attn_qkv."),
           (r"^h\.(\d+)\.attn\.c_proj\.", r"blk.\1.attn_output."), (r"^h\.(\d+)\.ln_2\.", r"blk.\1.ffn_norm."),
           (r"^h\.(\d+)\.mlp\.c_fc\.", r"blk.\1.ffn_up."), (r"^h\.(\d+)\.mlp\.c_proj\.", r"blk.\1.ffn_down.")]
_CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")


def gguf_name(hf: str) -> str:
    bare = hf[len("transformer."):] if hf.startswith("transformer.") else hf
    for pat, rep in _RENAME:
        if re.search(pat, bare):
            return re.sub(pat, rep, bare)
    raise ValueError(f"no GGUF name for {hf!r}")


def converted_tensors(model_dir: Path, output: bool = False) -> dict[str, np.ndarray]:
    """GGUF name -> float array in the converter's orientation ([out][in] matrices)."""
    from safetensors.numpy import load_file
    out = {}
    for name, a in load_file(Path(model_dir) / "model.safetensors").items():
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if name.endswith(_CONV1D):
            a = a.T
        out[gguf_name(name)] = np.ascontiguousarray(a)
    if output and "output.weight" not in out:
        out["output.weight"] = out["token_embd.weight"]        # GPT-2's head is tied to wte
    return out


def tensor_type(name: str, a: np.ndarray, ftype: str) -> str:
    if a.ndim <= 1 or name == "position_embd.weight" or not name.endswith(".weight"):
        return "F32"
    if ftype == "Q4_0" and name in ("token_embd.weight", "output.weight"):
        return "Q6_K" if a.shape[-1] % 256 == 0 else "Q8_0"
    return ftype


def write_gguf(model_dir, out, ftype: str = "F32", *, output: bool = False, tokenizer: bool = True,
               arch: str = "gpt2", types: dict | None = None, tensors: dict | None = None,
               config: dict | None = None, hook=None) -> Path:
    """Write OUT from the checkpoint in MODEL_DIR (types: per-tensor type overrides; tensors / config:
    replace what is read; hook(writer): more metadata -- for tests that write damaged files). Atomic: temp
    file + rename."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    model_dir, out = Path(model_dir), Path(out)
    cfg = json.loads((model_dir / "config.json").read_text()) if config is None else config
    t = converted_tensors(model_dir, output) if tensors is None else tensors
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, arch)
    try:
        w.add_name(model_dir.name)
        n_embd = cfg["n_embd"]
        w.add_block_count(cfg["n_layer"])
        w.add_context_length(cfg.get("n_ctx", cfg.get("n_positions")))
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(4 * n_embd)
        w.add_head_count(cfg["n_head"])
        w.add_layer_norm_eps(cfg.get("layer_norm_epsilon", 1e-5))
        w.add_file_type(FILE_TYPE.get(ftype, 0))
        vocab_p, merges_p = model_dir / "vocab.json", model_dir / "merges.txt"
        if tokenizer and vocab_p.is_file() and merges_p.is_file():
            vocab = json.loads(vocab_p.read_text(encoding="utf-8"))
            tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
            lines = merges_p.read_text(encoding="utf-8").split("\n")
            merges = [ln for ln in lines if ln and not ln.startswith("#version")]
            w.add_tokenizer_model("gpt2")
            w.add_tokenizer_pre("gpt-2")
            w.add_token_list(tokens)
            w.add_token_types([3 if tok == "<|endoftext|>" else 1 for tok in tokens])
            w.add_token_merges(merges)
            eot = vocab.get("<|endoftext|>", len(tokens) - 1)
            w.add_bos_token_id(eot)
            w.add_eos_token_id(eot)
        if hook is not None:
            hook(w)
        for name, a in t.items():
            typ = (types or {}).get(name) or tensor_type(name, a, ftype)
            if typ == "F32":
                w.add_tensor(name, np.ascontiguousarray(a, np.float32))
            elif typ == "F16":
                w.add_tensor(name, np.ascontiguousarray(a, np.float16))
            elif typ == "Q6_K":
                from gpt2asm import quant0
                raw = quant0.to_ggml_q6k(*quant0.quantize_q6k(np.asarray(a, np.float32)))
                w.add_tensor(name, raw, raw_dtype=Q.Q6_K)
            else:
                qt = Q[typ]
                w.add_tensor(name, gguf.quants.quantize(np.asarray(a, np.float32), qt), raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (model.safetensors, config.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", default="F32", choices=list(FILE_TYPE))
    ap.add_argument("--output", action="store_true", help="write output.weight (a copy of token_embd.weight)")
    ap.add_argument("--no-tokenizer", action="store_true")
    a = ap.parse_args(argv)
    p = write_gguf(a.model, a.out, a.type, output=a.output, tokenizer=not a.no_tokenizer)
    print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB, {a.type})")
    return 0


if __name__ == "__main__":
    from gpt2asm.errors import GPT2AsmError
    try:
        sys.exit(main())
    except (GPT2AsmError, OSError) as e:                 # a bad argument or file: one line, status 2
        print(f"make_gguf.py: error: {e}", file=sys.stderr)
        sys.exit(2)
