"""python -m gpt2asm [options] PROMPT — generate text with GPT-2 on hand-written assembly kernels.

Compatible with the seed tool gpt2.s: -n, -t, -s, -j, -h (fp16; help is --help), -i.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .errors import GPT2AsmError
from .kernels import FAMILIES, ARCH


def positive_int(lo: int, hi: int):
    def parse(s: str) -> int:
        try:
            v = int(s, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, got {v}")
        return v
    return parse


def bounded_float(lo: float, hi: float, lo_open: bool = False):
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        if not (lo < v if lo_open else lo <= v) or not v <= hi:
            raise argparse.ArgumentTypeError(f"must be in {'(' if lo_open else '['}{lo}, {hi}], got {s}")
        return v
    return parse


def parser() -> argparse.ArgumentParser:
    names = FAMILIES.get(ARCH, [])
    ap = argparse.ArgumentParser(
        prog="python -m gpt2asm", add_help=False,
        description="GPT-2 text generation; every floating-point hot loop is hand-written assembly.")
    ap.add_argument("prompt", nargs="*", help="the prompt (words are joined with spaces; empty = <|endoftext|>)")
    ap.add_argument("-n", type=positive_int(0, 1 << 20), default=64, metavar="N",
                    help="tokens to generate (default 64)")
    ap.add_argument("-t", type=bounded_float(0.0, 100.0), default=0.8, metavar="T",
                    help="sampling temperature, 0 = greedy (default 0.8)")
    ap.add_argument("-s", metavar="ISA", default=None,
                    help=f"kernel family: {' | '.join(f'{i}={n}' for i, n in enumerate(names))} or a name "
                         "(default: best available, or $GPT2ASM_ISA)")
    ap.add_argument("-j", type=positive_int(1, 256), default=1, metavar="N",
                    help="threads sharing each matrix product (same output for every N; default 1)")
    ap.add_argument("-h", dest="fp16", action="store_true", help="fp16 weight matrices (half the memory traffic)")
    ap.add_argument("-i", dest="ids", action="store_true",
                    help="print token ids: line 1 the prompt, line 2 the output")
    ap.add_argument("--seed", type=positive_int(0, (1 << 64) - 1), default=None,
                    help="PRNG seed for sampling (default: random)")
    ap.add_argument("--model", metavar="DIR", default=None,
                    help="directory with model.safetensors, vocab.json, merges.txt (default: $GPT2ASM_MODEL, "
                         "else the current directory)")
    ap.add_argument("--top-k", type=positive_int(0, 1 << 20), default=0, metavar="K",
                    help="sample only from the K most likely tokens (0 = off)")
    ap.add_argument("--top-p", type=bounded_float(0.0, 1.0, lo_open=True), default=1.0, metavar="P",
                    help="nucleus sampling: the smallest set with probability ≥ P (1 = off)")
    ap.add_argument("--repetition-penalty", type=bounded_float(0.0, 100.0, lo_open=True), default=1.0,
                    metavar="R", help="divide logits of tokens already seen by R (1 = off)")
    ap.add_argument("--help", action="help", help="show this help and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(8), "little")
    stats: dict = {}
    model = None
    out = sys.stdout
    try:
        from .engine import GPT2
        t0 = time.perf_counter()
        model = GPT2.load(args.model, dtype="f16" if args.fp16 else "f32", isa=args.s, threads=args.j)
        load_s = time.perf_counter() - t0
        if model.random_init:
            print(f"[gpt2asm] note: {model.model_dir} holds randomly initialised weights "
                  "(tools/make_checkpoint.py): the text will be gibberish", file=sys.stderr)
        prompt = " ".join(args.prompt)
        prompt_ids = model.encode(prompt)
        gen = model.generate_ids(prompt_ids, args.n, temperature=args.t, top_k=args.top_k, top_p=args.top_p,
                                 repetition_penalty=args.repetition_penalty, seed=seed, stats=stats)
        if args.ids:
            print(" ".join(map(str, prompt_ids or [model.tokenizer.eot_id])), file=out, flush=True)
            for tok in gen:
                print(tok, end=" ", file=out, flush=True)
            print(file=out)
        else:
            import codecs
            dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
            out.write(prompt)
            out.flush()
            for tok in gen:
                out.write(dec.decode(model.tokenizer.token_bytes(tok)))
                out.flush()
            out.write(dec.decode(b"", final=True) + "\n")
        status = 0
    except KeyboardInterrupt:
        print(file=out)
        status = 130
    except GPT2AsmError as e:
        print(f"gpt2asm: error: {e}", file=sys.stderr)
        return 2
    finally:
        if model is not None:
            model.close()
    if stats:
        n, dt = stats["generated"], stats["decode_s"]
        rate = (n - 1) / dt if n > 1 and dt > 0 else 0.0
        print(f"[gpt2asm] {stats['prompt']} prompt + {n} generated tokens, {rate:.1f} tok/s "
              f"({model.isa}, {'fp16' if args.fp16 else 'fp32'}, -j {args.j}; load {load_s:.2f} s)",
              file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
