"""The files a user points us at, read safely: `~` expanded without surprises, only regular files opened
(a FIFO would block, /dev/zero would never end), every read bounded by a size cap.

    text = read_text(path, MAX_JSON, CheckpointError, "config file")
    d = expand_user("~nouser/x", "--model")        # InvalidArgumentError: no such user

Every small file the loaders read (config.json, vocab.json, merges.txt, the hub's pins and refs) goes
through read_bytes; model.safetensors is mapped by weights.SafetensorsFile, which makes the same checks.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import GPT2AsmError, InvalidArgumentError, shown

MAX_JSON = 16 << 20              # config.json, pins, verified.json: a real one is a few KiB
MAX_TOKENIZER = 64 << 20         # vocab.json (1 MB for GPT-2) and merges.txt (456 KB)


def expand_user(p: str | os.PathLike, what: str) -> Path:
    """Path(p) with a leading ~ or ~user expanded; InvalidArgumentError (saying `what` it was) when the
    user or the home directory is unknown (Path.expanduser's RuntimeError), or p holds a NUL."""
    s = os.fspath(p)
    if isinstance(s, bytes):
        s = os.fsdecode(s)
    if "\0" in s:                                  # no file has one: os.stat would raise ValueError
        raise InvalidArgumentError(f"{what} {shown(s, 200)}: a path cannot contain a NUL character")
    if not s.startswith("~"):
        return Path(s)
    out = os.path.expanduser(s)
    if out.startswith("~"):                        # os.path.expanduser leaves what it cannot expand
        user = s[1:].split(os.sep, 1)[0]
        raise InvalidArgumentError(f"{what} {shown(s, 200)}: cannot expand '~{user}' "
                                   f"({'no such user' if user else 'no home directory'})")
    return Path(out)


def read_bytes(path: str | os.PathLike, limit: int, error: type[GPT2AsmError], what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or error(message): missing, not a regular
    file (directory, FIFO, device, socket), larger than the limit, unreadable.  Opened without blocking
    (O_NONBLOCK: a FIFO is refused, not waited on) and read no further than limit + 1 bytes, so a file
    that grows while it is read is refused too."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{what} not found: {p}") from None
    except OSError as e:
        raise error(f"cannot open {what} {p}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {p} is not a regular file")
        if st.st_size > limit:
            raise error(f"{what} {p} is {st.st_size:,} bytes, more than the limit of {limit:,}")
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > limit:
            raise error(f"{what} {p} grew beyond the limit of {limit:,} bytes while it was read")
        return b"".join(chunks)
    except OSError as e:
        raise error(f"cannot read {what} {p}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_text(path, limit: int, error: type[GPT2AsmError], what: str) -> str:
    """read_bytes decoded as UTF-8 (error(...) if it is not)."""
    raw = read_bytes(path, limit, error, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not valid UTF-8: {e}") from None


def os_error_text(e: OSError) -> str:
    """'File name too long' rather than '[Errno 36] File name too long: <5000 characters>'."""
    return e.strerror or errno.errorcode.get(e.errno or 0, "") or type(e).__name__
