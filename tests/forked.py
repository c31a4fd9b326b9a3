"""run_forked: run a test's kernel calls in a forked child, for the page-guard (over-read) tests.

A kernel that reads or writes one byte past a buffer butting against a PROT_NONE page faults; in a
child, that fault fails the test with the signal's name instead of killing pytest.
"""
from __future__ import annotations

import os
import signal

import pytest


WHY = {0: "", 3: "wrong result", 4: "Python exception in the child"}     # the child's exit codes


def fork_status(check) -> tuple[str | None, int]:
    """Run check() (True: every result right) in a forked child: (the name of the signal that killed it,
    or None; its exit code: 0 all right, 3 a wrong result, 4 an exception).  After an exception its
    text (e.g. a ClobberError naming the kernel and the register) is in `last_error`."""
    global last_error
    last_error = ""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            code = 0 if check() else 3
        except BaseException as e:
            code = 4
            try:
                os.write(w, f"{type(e).__name__}: {e}".encode()[:4000])    # fits the pipe's buffer
            except BaseException:
                pass
        os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    last_error = b"".join(chunks).decode(errors="replace")
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name, -1
    return None, os.WEXITSTATUS(status)


last_error = ""        # the exception text of the last fork_status child (empty: none)


def run_forked(check) -> None:
    """Run check() in a forked child (fork_status); fail on a signal (a fault: an access outside a
    buffer) or a nonzero exit code (3: a wrong result, 4: an exception, whose text is shown)."""
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    sig, code = fork_status(check)
    if sig:
        pytest.fail(f"kernel faulted (signal {sig}): it read or wrote outside its buffers")
    assert code == 0, f"child failed with code {code} (3: wrong result){': ' + last_error if last_error else ''}"
