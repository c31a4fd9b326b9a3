"""One exception family for everything a user can get wrong.

Every error that bad input, a bad file or a bad flag can cause is a GPT2AsmError, so callers (and the
CLI, which turns them into one line and exit status 2) can tell user errors from bugs.  A bad value is
quoted in a message by shown(): a bad argument or a damaged file may be of any size, a message is a line.
"""

import sys

SHOWN_LIMIT = 100            # characters of a bad value an error message quotes
_SIZED = {str: "characters", bytes: "bytes", bytearray: "bytes", list: "items", tuple: "items", dict: "items"}


def shown(v, limit: int = SHOWN_LIMIT) -> str:
    """repr(v) for an error message, at most `limit` characters of it; past that, the first `limit`, '...'
    and the size of v: "'aaaa...'... (3000000 characters)", "[1, 1, ...... (500000 items)".  A long string
    or list is cut before its repr is made; a value repr refuses (an int past Python's digit limit, a list
    nested too deep) is named by its type."""
    unit = next((u for t, u in _SIZED.items() if isinstance(v, t)), None)
    try:
        r = repr(v[:limit + 1] if unit and not isinstance(v, dict) else v)
    except (ValueError, RecursionError):
        r = f"<int of {v.bit_length()} bits>" if isinstance(v, int) else f"<{type(v).__name__}>"
    if len(r) <= limit:
        return r
    return r[:limit] + "..." + (f" ({len(v)} {unit})" if unit else f" ({len(r)} characters)")


def say(text: str, end: str = "\n", out=None) -> bool:
    """One diagnostic line (text + end) on out (default stderr) for the command-line tools; False if it
    could not be written.  A closed or failing stream (`2>&-`, `2>/dev/full`) loses the line, never the
    output on stdout or the exit status."""
    err = sys.stderr if out is None else out
    if err is None:                          # started with descriptor 2 closed
        return False
    try:
        err.write(text + end)
        err.flush()
    except (OSError, ValueError):            # EBADF, ENOSPC, EIO; ValueError: a closed file object
        return False
    return True


class GPT2AsmError(Exception):
    """Base class of every user-facing gpt2asm error."""


class InvalidArgumentError(GPT2AsmError, ValueError):
    """A size, flag, token id or other argument is out of range or of the wrong kind."""


class CheckpointError(GPT2AsmError):
    """model.safetensors / config.json is missing, malformed, truncated or not a GPT-2 checkpoint."""


class TokenizerError(GPT2AsmError):
    """vocab.json / merges.txt is missing or malformed, or a token cannot be encoded/decoded."""


class ModelNotFoundError(GPT2AsmError):
    """No model files where they were looked for (and none could be downloaded)."""


class DownloadError(ModelNotFoundError):
    """Fetching the model from the hub failed, or what arrived is not what was pinned (size, SHA-256)."""


class LibraryError(GPT2AsmError):
    """The assembly library is missing, stale or cannot be loaded."""


class KernelUnavailableError(GPT2AsmError):
    """The requested kernel family (ISA) is not supported by this CPU/OS."""


class SessionBusyError(GPT2AsmError):
    """A Session is already generating (a live generator of it, or another thread): one user at a time."""


class ContextOverflowError(GPT2AsmError):
    """More tokens than the model's context holds."""

    def __init__(self, needed: int, available: int):
        self.needed = needed
        self.available = available
        super().__init__(f"context overflow: {shown(needed)} tokens needed, the model holds {available}")


class NotCopyableError(GPT2AsmError, TypeError):
    """copy / deepcopy / pickle of an object that owns native threads and memory (GPT2)."""


class ResourceError(GPT2AsmError):
    """The system refused what gpt2asm asked of it (a -j worker thread: a thread or address-space limit; the
    memory of a sequence's KV cache in a call of many)."""


class NonFiniteLogitsError(GPT2AsmError):
    """The forward pass produced NaN or infinite logits (bad weights?); nothing is sampled from them."""
