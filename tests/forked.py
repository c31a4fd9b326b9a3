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
    or None; its exit code: 0 all right, 3 a wrong result, 4 an exception)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            code = 0 if check() else 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name, -1
    return None, os.WEXITSTATUS(status)


def run_forked(check) -> None:
    """Run check() in a forked child (fork_status); fail on a signal (a fault: an access outside a
    buffer) or a nonzero exit code (3: a wrong result, 4: an exception)."""
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    sig, code = fork_status(check)
    if sig:
        pytest.fail(f"kernel faulted (signal {sig}): it read or wrote outside its buffers")
    assert code == 0, f"child failed with code {code} (3: wrong result)"
