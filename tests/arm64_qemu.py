"""What a test needs to know about the Arm machine it runs on, emulated (tools/arm64/) or real.

tools/arm64/run_tests.py (make test-arm64) runs each test file under qemu-aarch64 with these variables:
    GPT2ASM_QEMU       the configuration's name: sme512, sme256, sme128 or nosme
    GPT2ASM_QEMU_CPU   the qemu -cpu value, e.g. max,sme512=on,sme_fa64=off
    GPT2ASM_QEMU_SVL   the streaming vector length in bits it gives (512, 256, 128; 0 = no SME)
On real hardware none is set: the helpers return None and tests use what the CPU reports.

    from arm64_qemu import IS_ARM, qemu_config, qemu_svl_bits, first_config, neon_once_marks
    pytestmark = pytest.mark.skipif(not IS_ARM, reason="AArch64 only")     # (NEON tests: neon_once_marks())
"""
from __future__ import annotations

import os
import platform
import re

IS_ARM = platform.machine().lower() in ("aarch64", "arm64")


def qemu_config() -> str | None:
    """The emulated configuration's name (sme512, sme256, sme128, nosme, ...), None on real hardware."""
    return os.environ.get("GPT2ASM_QEMU") or None


def qemu_cpu() -> str | None:
    return os.environ.get("GPT2ASM_QEMU_CPU") or None


def qemu_svl_bits() -> int | None:
    """The SVL the emulated CPU was given (0 without SME); None on real hardware or if unknown."""
    if os.environ.get("GPT2ASM_QEMU_SVL"):
        return int(os.environ["GPT2ASM_QEMU_SVL"])
    cpu = qemu_cpu()
    if cpu is None:
        return None
    if re.search(r"(^|,)sme=off", cpu):
        return 0
    lengths = [int(n) for n in re.findall(r"(?:^|,)sme(\d+)=on", cpu)]
    return max(lengths) if lengths else None


def first_config() -> bool:
    """True in the run that should do the SVL-independent work (NEON tests): the first emulated
    configuration (sme512 by default), or always on real hardware."""
    name = qemu_config()
    return name is None or name == os.environ.get("GPT2ASM_QEMU_FIRST", name)


def neon_once_marks() -> list:
    """The pytest marks of an SVL-independent (NEON) AArch64 test: AArch64 only, and only in the first
    emulated CPU configuration (first_config); as a module's pytestmark, or each applied to a function."""
    import pytest
    return [pytest.mark.skipif(not IS_ARM, reason="AArch64 only (make test-arm64 runs it under qemu)"),
            pytest.mark.skipif(IS_ARM and not first_config(),
                               reason="NEON does not depend on the SME configuration: first one only")]
