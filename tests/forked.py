"""run_forked: run a test's kernel calls in a forked child, for the page-guard (over-read) tests.

A kernel that reads or writes one byte past a buffer butting against a PROT_NONE page faults; in a
child, that fault fails the test with the signal's name instead of killing pytest.
"""
from __future__ import annotations

import os
import signal
import time

import pytest


WHY = {0: "", 3: "wrong result", 4: "Python exception in the child"}     # the child's exit codes


def fork_status(check, timeout: float | None = None) -> tuple[str | None, int]:
    """Run check() (True: every result right) in a forked child: (the name of the signal that killed it,
    or None; its exit code: 0 all right, 3 a wrong result, 4 an exception).  After an exception its
    text (e.g. a ClobberError naming the kernel and the register) is in `last_error`.  With a timeout, a
    child still running after that many seconds is killed: ("TIMEOUT", -1)."""
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
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            last_error = f"the child was still running after {timeout} s (killed)"
            return "TIMEOUT", -1
        time.sleep(0.02)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    last_error = b"".join(chunks).decode(errors="replace")
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name, -1
    return None, os.WEXITSTATUS(status)


last_error = ""        # the exception text of the last fork_status child (empty: none)


def run_forked(check, timeout: float | None = None) -> None:
    """Run check() in a forked child (fork_status); fail on a signal (a fault: an access outside a
    buffer), a hang (timeout) or a nonzero exit code (3: a wrong result, 4: an exception, whose text is
    shown)."""
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    sig, code = fork_status(check, timeout)
    if sig == "TIMEOUT":
        pytest.fail(f"the forked child hung: {last_error}")
    if sig:
        pytest.fail(f"kernel faulted (signal {sig}): it read or wrote outside its buffers")
    assert code == 0, f"child failed with code {code} (3: wrong result){': ' + last_error if last_error else ''}"
