"""python -m gpt2asm.perplexity --model M [--dtype D] [-j N] [--stride S] FILE — the perplexity of a text.

The text (UTF-8; '-' = stdin) is tokenized whole and scored by scoring.token_logprobs_many: windows of
n_ctx tokens every S tokens (default min(512, n_ctx // 2)), each scoring only the tokens the window
before it did not (transformers' "Perplexity of fixed-length models").  A progress bar on stderr; at the
end, on stdout: the perplexity, the tokens scored, and the tokens/s of the forward passes.  The text is
held whole (its tokens too): at most MAX_TEXT bytes are read, and a text past that, or one the memory
cannot hold, is refused in one line.
Exit status: 0 done, 2 a user error (one line on stderr; a text too large included), 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import stat
import sys
import time

from .__main__ import DTYPE_LABELS, _OutputError, _silence_stdout, _write, positive_int
from .errors import GPT2AsmError, InvalidArgumentError, say, shown
from .safefs import os_error_text

MAX_TEXT = 64 << 20         # bytes of text: ~16M tokens, hours of scoring; text and tokens take ~15x that


class Progress:
    """A one-line bar on stderr (default): tokens scored of the total, tokens/s.  A closed or failing
    stream (`2>&-`, `2>/dev/full`) ends the bar, not the scoring."""

    def __init__(self, total: int, out=None, width: int = 30):
        self.total, self.done, self.out, self.width = max(total, 1), 0, out or sys.stderr, width
        self.t0 = time.perf_counter()

    def _show(self, text: str) -> None:
        if self.out is not None and not say(text, "", self.out):
            self.out = None                             # a failed write ends the bar

    def __call__(self, n: int) -> None:
        self.done += n
        f = min(self.done / self.total, 1.0)
        dt = time.perf_counter() - self.t0
        bar = "#" * int(f * self.width)
        rate = self.done / dt if dt > 0 else 0.0
        self._show(f"\r[{bar:<{self.width}}] {self.done}/{self.total} tokens  {rate:.0f} tok/s")

    def end(self) -> None:
        self._show("\n")


def read_text(file: str, limit: int | None = None) -> str:
    """The UTF-8 text of `file` ('-': stdin), read no further than limit (MAX_TEXT) + 1 bytes (a pipe or
    /dev/zero may never end): InvalidArgumentError if it is unreadable, not UTF-8 or longer than the limit."""
    limit = MAX_TEXT if limit is None else limit
    what = "stdin" if file == "-" else shown(file, 200)
    try:
        if file == "-":
            if sys.stdin is None:                     # started with descriptor 0 closed (`<&-`)
                raise InvalidArgumentError("cannot read stdin: it is closed")
            raw = sys.stdin.buffer.read(limit + 1)
        else:
            try:
                fifo = stat.S_ISFIFO(os.stat(file).st_mode)
            except OSError:
                fifo = False                          # open() says why
            if fifo:                                  # open() waits for a writer: say so, not hang silently
                say(f"gpt2asm.perplexity: {what} is a FIFO: waiting for a writer (Ctrl-C to stop)")
            with open(file, "rb") as f:
                st = os.fstat(f.fileno())
                if stat.S_ISREG(st.st_mode) and st.st_size > limit:
                    raise InvalidArgumentError(f"{what} is {st.st_size:,} bytes, more than the limit of "
                                               f"{limit:,}")
                raw = f.read(limit + 1)
        if len(raw) > limit:
            raise InvalidArgumentError(f"{what} is more than the limit of {limit:,} bytes")
        return raw.decode("utf-8")
    except OSError as e:
        raise InvalidArgumentError(f"cannot read {what}: {os_error_text(e)}") from None
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"cannot read {what}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpt2asm.perplexity",
                                 description="Perplexity of a text file (sliding windows past n_ctx).")
    ap.add_argument("file", help="a UTF-8 text file, or - for stdin")
    ap.add_argument("--model", metavar="DIR|FILE|NAME", default=None, help="as python -m gpt2asm --model")
    ap.add_argument("--dtype", choices=DTYPE_LABELS, default=None,
                    help="weight matrices (default f32; a GGUF's own type for a .gguf)")
    ap.add_argument("-j", type=positive_int(1, 256), default=1, metavar="N", help="threads (default 1)")
    ap.add_argument("-s", dest="isa", metavar="ISA", default=None, help="kernel family (default: best)")
    ap.add_argument("--stride", type=positive_int(1, 1 << 20), default=None, metavar="S",
                    help="tokens between window starts (default min(512, n_ctx // 2))")
    ap.add_argument("--offline", action="store_true", help="never download the model")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if sys.stdout is None:                            # started with stdout closed (`>&-`): no work for nothing
        say("gpt2asm.perplexity: error: standard output is closed; nowhere to write the result")
        return 2
    model = None
    try:
        from .engine import GPT2
        from .scoring import default_stride, perplexity, token_logprobs_many
        text = read_text(args.file)
        model = GPT2.load(args.model, dtype=args.dtype, isa=args.isa, threads=args.j,
                          download=not args.offline, progress=not args.quiet)
        ids = model.encode(text)
        if len(ids) < 2:
            say("gpt2asm.perplexity: error: the text has fewer than two tokens")
            return 2
        bar = None if args.quiet else Progress(len(ids) - 1)
        t0 = time.perf_counter()
        lp = token_logprobs_many(model, [ids], args.stride, progress=bar)[0]
        dt = time.perf_counter() - t0
        if bar is not None:
            bar.end()
        stride = args.stride or default_stride(model.n_ctx)
        n = int((lp == lp).sum())
        _write(sys.stdout, f"perplexity {perplexity(lp):.4f} over {n} tokens (n_ctx {model.n_ctx}, stride "
                           f"{stride}; {model.isa}, {DTYPE_LABELS[model.dtype]}, -j {model.threads}); "
                           f"{n / dt:.1f} tokens/s\n")
        return 0
    except BrokenPipeError:                           # `... | head -c 0`: the reader is gone
        _silence_stdout()
        return 141
    except _OutputError as e:                         # /dev/full, a closed descriptor
        _silence_stdout()
        say(f"gpt2asm.perplexity: error: cannot write to standard output: {e}")
        return 2
    except KeyboardInterrupt:
        say("\ngpt2asm.perplexity: interrupted")
        return 130
    except MemoryError:
        say("gpt2asm.perplexity: error: out of memory: the text and its tokens are held whole; "
            "try a shorter text")
        return 2
    except GPT2AsmError as e:
        say(f"gpt2asm.perplexity: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return 2
    finally:
        if model is not None:
            model.close()


if __name__ == "__main__":
    sys.exit(main())
