"""Smoke check run by the arm64 Python under qemu (tools/arm64/setup.sh): numpy and ctypes import, the
auxiliary vector is read, and gpt2asm_rdsvl of the cross-built library answers when SME is there.

    qemu-aarch64 -L SYSROOT -cpu max,sme512=on,sme_fa64=off SYSROOT/usr/bin/python3.11 smoke.py LIB.so

Prints key=value lines: machine, numpy, hwcap, hwcap2, sme, sme2, sme_fa64, sme_f16f16, svl_bytes,
families.
"""
import ctypes
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
from gpt2asm import cpu  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])
lib.gpt2asm_build_id.restype = ctypes.c_char_p
f = cpu.arm_features(lib)
print(f"machine={platform.machine()}")
print(f"numpy={np.__version__} sum={float(np.arange(10, dtype=np.float32).sum())}")
print(f"hwcap={f['hwcap']:#x}")
print(f"hwcap2={f['hwcap2']:#x}")
for k in ("asimd", "asimdhp", "sme", "sme2", "sme_fa64", "sme_f16f16"):
    print(f"{k}={f[k]}")
print(f"svl_bytes={f['svl_bytes']}")
print(f"families={','.join(cpu.families_from(f))}")
print(f"build_id={lib.gpt2asm_build_id().decode()[:16]}")
