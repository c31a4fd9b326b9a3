"""run_forked: run a test's kernel calls in a forked child, for the page-guard (over-read) tests.

A kernel that reads or writes one byte past a buffer butting against a PROT_NONE page faults; in a
child, that fault fails the test with the signal's name instead of killing pytest.
"""
from __future__ import annotations

import os
import signal

import pytest


def run_forked(check) -> None:
    """Run check() (True: every result right) in a forked child; fail on a signal (a fault: an access
    outside a buffer) or a nonzero exit code (3: a wrong result, 4: an exception)."""
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
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
        pytest.fail(f"kernel faulted (signal {signal.Signals(os.WTERMSIG(status)).name}): "
                    "it read or wrote outside its buffers")
    assert os.WEXITSTATUS(status) == 0, f"child failed with code {os.WEXITSTATUS(status)} (3: wrong result)"
