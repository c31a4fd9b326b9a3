"""python -m gpt2asm [options] PROMPT — generate text with GPT-2 on hand-written assembly kernels.
python -m gpt2asm serve [options] — the OpenAI-compatible server (server.py; a prompt starting with the
word serve: python -m gpt2asm -- serve ...).

Compatible with the seed tool gpt2.s: -n, -t, -s, -j, -h (fp16; help is --help), -i.
Weight dtype: --dtype f32 (default) | f16 (= -h) | q8_0 | q4_0 (llama.cpp's blocks of 32, integer dot
products). --model FILE.gguf: a GPT-2 GGUF.
Exit status: 0 done, 2 a user error (one message on stderr, no traceback), 130 interrupted (Ctrl-C; the
stats line is still printed).
"""
import sys                                 # (already loaded: nothing to find) -- and no __future__ import,
                                           # which would be found and loaded before the guard below
_sigints = []                              # Ctrl-C while the modules load (numpy, the library): no traceback.
try:                                       # numpy turns one that lands inside its C imports into an
    import signal                          # ImportError, so the handler also notes that it ran.

    def _on_sigint(signum, frame):
        _sigints.append(signum)
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:                     # not the main thread (imported, not run): nothing to guard
        pass
    import os
    import argparse
    import time

    from .args import not_retired, sampling as check_sampling
    from .cpu import FAMILIES
    from .errors import GPT2AsmError, say, shown
    from .lib import ARCH
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
except KeyboardInterrupt:
    sys.stderr.write("gpt2asm: interrupted\n")
    sys.exit(130)
except ImportError as e:
    if _sigints:
        sys.stderr.write("gpt2asm: interrupted\n")
        sys.exit(130)
    sys.stderr.write(f"gpt2asm: error: cannot import {e.name or 'a module'}: {(str(e).splitlines() or [''])[0]}\n")
    sys.exit(2)

DTYPE_LABELS = {"f32": "fp32", "f16": "fp16", "q8_0": "q8_0", "q4_0": "q4_0"}   # --dtype -> the stats line's name


def dtype_arg(s: str) -> str:
    """--dtype's type: a retired dtype is refused with the message naming its successor (args.not_retired)."""
    try:
        not_retired(s)
    except GPT2AsmError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


def positive_int(lo: int, hi: int):
    def parse(s: str) -> int:
        try:
            v = int(s, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {shown(s)}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, got {shown(v)}")
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
    ap.add_argument("-t", type=float, default=0.8, metavar="T",
                    help="sampling temperature, 0 = greedy, as is anything below 1e-4 (default 0.8)")
    ap.add_argument("-s", metavar="ISA", default=None,
                    help=f"kernel family: {' | '.join(f'{i}={n}' for i, n in enumerate(names))} or a name "
                         "(default: best available, or $GPT2ASM_ISA)")
    ap.add_argument("-j", type=positive_int(1, 256), default=1, metavar="N",
                    help="threads sharing each matrix product (same output for every N; default 1)")
    ap.add_argument("-h", dest="fp16", action="store_true",
                    help="fp16 weight matrices (half the memory traffic; same as --dtype f16)")
    ap.add_argument("--dtype", type=dtype_arg, choices=DTYPE_LABELS, default=None,
                    help="weight matrices: f32 (default; a GGUF's own type for a .gguf), f16 (as -h), q8_0 or "
                         "q4_0 (llama.cpp's blocks of 32 inputs with an fp16 scale, integer dot products; "
                         "logits close to f32's, not the same)")
    ap.add_argument("--kv", choices=("f32", "f16"), default=None,
                    help="KV cache: f32 or f16 (default: f32 with f32 weights, f16 with the others -- half the "
                         "bytes attention reads at long context)")
    ap.add_argument("-i", dest="ids", action="store_true",
                    help="print token ids: line 1 the prompt, line 2 the output")
    ap.add_argument("--seed", type=int, default=None,
                    help="PRNG seed for sampling (default: random)")
    ap.add_argument("--model", metavar="DIR|FILE|NAME", default=None,
                    help="directory with model.safetensors, vocab.json, merges.txt (+ config.json), a GPT-2 "
                         "GGUF file (llama.cpp's; F32/F16/BF16/Q8_0/Q4_0, Q6_K head; tokenizer from its "
                         "metadata), or a hub name: gpt2, distilgpt2, gpt2-medium, gpt2-large, gpt2-xl (from "
                         "the Hugging Face cache, else downloaded). Default: $GPT2ASM_MODEL, else the current "
                         "directory, else gpt2")
    ap.add_argument("--offline", action="store_true",
                    help="never download (as HF_HUB_OFFLINE=1): use local and cached files only")
    ap.add_argument("--top-k", type=int, default=0, metavar="K",
                    help="sample only from the K most likely tokens (0 = off)")
    ap.add_argument("--top-p", type=float, default=1.0, metavar="P",
                    help="nucleus sampling: the smallest set with probability ≥ P (1 = off)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0,
                    metavar="R", help="divide logits of tokens already seen by R, 1e-4..100 (1 = off)")
    ap.add_argument("--help", action="help", help="show this help and exit")
    return ap


def weight_dtype(ap: argparse.ArgumentParser, args) -> str | None:
    """-h and --dtype -> 'f32' | 'f16' | 'q8_0' | 'q4_0', or None (f32; a GGUF's own type) when
    neither is given (-h with another --dtype is a usage error)."""
    if args.fp16 and args.dtype not in (None, "f16"):
        ap.error(f"-h (fp16) contradicts --dtype {args.dtype}")
    return "f16" if args.fp16 else args.dtype


class _OutputError(Exception):
    """Standard output cannot take the text (a full disk, a closed or broken descriptor)."""


def _write(out, text: str) -> None:
    if out is None:                        # the process started with that descriptor closed (`>&-`)
        raise _OutputError("it is closed")
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:     # ENOSPC (/dev/full), EIO, EBADF; ValueError: closed file
        raise _OutputError(getattr(e, "strerror", None) or str(e)) from None


def argv_text(a: str) -> str:
    """A command-line argument as the text its bytes spell in UTF-8: under a locale that is not UTF-8
    (LC_ALL=C with Python's UTF-8 mode and locale coercion off) Python decodes argv with
    surrogateescape, which leaves each non-ASCII byte a lone surrogate; bytes that are not UTF-8 stay so
    (and the tokenizer refuses them)."""
    try:
        a.encode("utf-8")
        return a
    except UnicodeEncodeError:
        pass
    try:
        return os.fsencode(a).decode("utf-8")
    except (UnicodeError, ValueError):
        return a


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:              # Ctrl-C before or after the model's own handling (argument parsing)
        say("gpt2asm: interrupted")
        return 130


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:                       # python -m gpt2asm serve ...: the server (server.py)
        from .server import main as serve
        return serve(argv[1:])
    ap = parser()
    args = ap.parse_args(argv)
    dtype = weight_dtype(ap, args)
    try:                                            # the API's own check, before anything is loaded
        sampling = check_sampling(args.t, args.top_k, args.top_p, args.repetition_penalty, args.seed)
    except GPT2AsmError as e:                       # one line, as every other user error
        say(f"gpt2asm: error: {e}")
        return 2
    stats: dict = {}
    model = None
    load_s = 0.0
    out = sys.stdout
    if out is None:                                 # started with stdout closed (`>&-`)
        say("gpt2asm: error: standard output is closed; nowhere to write the text")
        return 2
    try:
        out.reconfigure(errors="replace")           # never die on a terminal that cannot show a character
    except (AttributeError, ValueError):
        pass
    status, midline = 0, False
    try:
        from .engine import GPT2
        t0 = time.perf_counter()
        model = GPT2.load(args.model, dtype=dtype, isa=args.s, threads=args.j,
                          download=not args.offline, kv=args.kv)
        load_s = time.perf_counter() - t0
        if model.random_init:
            say(f"[gpt2asm] note: {model.model_dir} holds randomly initialised weights "
                "(tools/make_checkpoint.py): the text will be gibberish")
        prompt = " ".join(map(argv_text, args.prompt))
        prompt_ids = model.encode(prompt)
        gen = model.generate_ids(prompt_ids, args.n, **sampling, stats=stats)
        if args.ids:
            _write(out, " ".join(map(str, prompt_ids or [model.tokenizer.eot_id])) + "\n")
            midline = True
            for tok in gen:
                _write(out, f"{tok} ")
            _write(out, "\n")
        else:
            import codecs
            dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
            _write(out, prompt)
            midline = True
            for tok in gen:
                _write(out, dec.decode(model.tokenizer.token_bytes(tok)))
            _write(out, dec.decode(b"", final=True) + "\n")
        midline = False
    except KeyboardInterrupt:                         # Ctrl-C: stop cleanly, still say what was done
        status = 130
        if stats:
            stats["interrupted"] = True
        else:
            say("gpt2asm: interrupted")
    except BrokenPipeError:                           # `... | head`: the reader is gone, so are we
        _silence_stdout()
        return 141
    except _OutputError as e:                         # /dev/full, a closed or failing descriptor
        status = 2
        _silence_stdout()                             # the interpreter's last flush must not fail again
        say(f"gpt2asm: error: cannot write to standard output: {e}")
        stats.clear()
    except GPT2AsmError as e:
        status = 2
        lines = str(e).splitlines() or [type(e).__name__]
        _end_line(out, midline)
        say(f"gpt2asm: error: {lines[0]}")
        for line in lines[1:]:
            say(f"  {line}" if not line.startswith(" ") else line)
        stats.clear()
    except MemoryError:
        status = 2
        _end_line(out, midline)
        say("gpt2asm: error: out of memory (try -h for fp16 or --dtype q8_0 for 8-bit weights, "
            "or a smaller model)")
        stats.clear()
    finally:
        if model is not None:
            model.close()
    if status == 130:
        _end_line(out, midline)
    if stats and model is not None:
        n, dt = stats.get("generated", 0), stats.get("decode_s", 0.0)
        rate = (n - 1) / dt if n > 1 and dt > 0 else 0.0
        say(f"[gpt2asm] {stats['prompt']} prompt + {n} generated tokens, {rate:.1f} tok/s "
            f"({model.isa}, {DTYPE_LABELS[model.dtype]}, -j {args.j}; load {load_s:.2f} s)"
            + ("; interrupted" if stats.get("interrupted") else ""))
    return status


def _end_line(out, midline: bool) -> None:
    if midline:
        try:
            out.write("\n")
            out.flush()
        except (OSError, ValueError):
            pass


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush does not complain."""
    if sys.stdout is None:                 # closed from the start: nothing will flush it
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
