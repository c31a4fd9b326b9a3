"""The plan ABI has one source, asm/plan_abi.h: the library (both executors include it), the Python
mirror (gpt2asm/plan_abi.py parses it), the plan encoder (gpt2asm/plan.py) and docs/kernels.md's tables
must all say what it says.

- the library's table gpt2asm_plan_abi ({size, value} per index line of the header, built from the same
  macros the executors use) equals the mirror entry by entry: a header edited without a rebuild, or a
  mirror that computes something else, fails here (x86 natively; AArch64 under qemu);
- the mirror equals a fresh parse of the header, and the encoder's tables (_J, _H, kinds, flags, sizes)
  are the mirror's;
- the header's assemble-time guards refuse a field outside its record or misaligned (where a C compiler
  is at hand);
- the docs' pool_t / plan_t tables (offsets, types, kinds, flag bits) agree with the header.
"""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpt2asm import kernels, plan as encoder, plan_abi as abi
from gpt2asm.kernels import load_library

ROOT = Path(__file__).resolve().parent.parent
END = (1 << 64) - 1


def library_table() -> list[tuple[int, int]]:
    """The rows of the library's gpt2asm_plan_abi up to its { ~0, ~0 } end."""
    lib = load_library()
    base = ctypes.addressof(ctypes.c_uint64.in_dll(lib, "gpt2asm_plan_abi"))
    rows = []
    for i in range(4096):
        size, value = (ctypes.c_uint64 * 2).from_address(base + 16 * i)
        if (size, value) == (END, END):
            return rows
        rows.append((size, value))
    raise AssertionError("gpt2asm_plan_abi has no end marker in 4096 rows")


def test_library_table_is_the_mirror():
    rows = library_table()
    mirror = [(size, value & END) for _, size, value in abi.ENTRIES]
    bad = [f"{name}: library {rows[i] if i < len(rows) else None}, mirror {mirror[i]}"
           for i, (name, _, _) in enumerate(abi.ENTRIES) if i >= len(rows) or rows[i] != mirror[i]]
    assert not bad and len(rows) == len(mirror), (
        f"the library and asm/plan_abi.h disagree ({len(rows)} rows against {len(mirror)} index lines; "
        f"rebuild with `make build`?): " + "; ".join(bad))


def test_mirror_is_the_header():
    values, entries, _ = abi.parse(abi.HEADER_FILE.read_text())
    assert entries == abi.ENTRIES
    for name, value in values.items():
        assert getattr(abi, name) == value, name
    # every field once, inside its record, aligned (the assembler checks this too)
    for rec, fields in ((abi.POOL_SIZE, abi.POOL), (abi.PL_HEADER, abi.HEADER), (abi.J_SIZE, abi.JOB),
                        (abi.ARGMAX_SLOT, abi.ARGMAX_SLOT_FIELDS)):
        spans = sorted((f.offset, f.offset + f.size) for f in fields.values())
        assert all(0 <= a and b <= rec and a % (b - a) == 0 for a, b in spans)
        assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:])), "fields overlap"


def test_encoder_uses_the_mirror():
    """gpt2asm/plan.py (the plan encoder) writes what the header says."""
    assert encoder._J == {k: f.offset // 8 for k, f in abi.JOB.items()
                          if f.size == 8 and f.offset < abi.J_COUNTERS}
    assert encoder._H == {k: f.offset // 8 for k, f in abi.HEADER.items()}
    assert (encoder.POOL_BYTES, encoder.PLAN_HEADER, encoder.JOB_BYTES) == (abi.POOL_SIZE, abi.PL_HEADER,
                                                                            abi.J_SIZE)
    for name in ("KIND_MATVEC", "KIND_QKV", "KIND_ATTN", "KIND_MATMUL", "KIND_ROWLN", "KIND_ROWATTN",
                 "PRO_LN", "PRO_EMBED", "FL_F16", "EPI_GELU", "EPI_RESID", "EPI_ARGMAX", "FL_ROWS",
                 "FL_KV", "FL_KV16", "ROWATTN_ROWS", "CTX_SEQ", "CTX_SEQ_SLEEPERS", "CTX_NTHREADS",
                 "CTX_SPIN", "CTX_YIELD", "CTX_PARKS", "FL_Q0", "KIND_ROWQUANT"):
        assert getattr(encoder, name) == getattr(abi, name), name
    assert sorted(abi.KINDS.values()) == list(range(abi.KIND_COUNT))
    # a flag's mask is its bit
    for b, mask in (("B_PRO_LN", "PRO_LN"), ("B_PRO_EMBED", "PRO_EMBED"), ("B_F16", "FL_F16"),
                    ("B_ROWS", "FL_ROWS"), ("B_KV", "FL_KV"), ("B_KV16", "FL_KV16"),
                    ("B_EPI_GELU", "EPI_GELU"), ("B_Q0", "FL_Q0")):
        assert 1 << getattr(abi, b) == getattr(abi, mask), (b, mask)


def test_encoded_record_layout():
    """A built plan's bytes: kind, flags and the fields at the header's offsets."""
    import numpy as np
    from gpt2asm.weights import aligned_zeros
    k = kernels.Kernels(threads=1)
    try:
        p = k.new_plan()
        x, y = aligned_zeros((2, 64), np.float32), aligned_zeros((2, 64), np.float32)
        p.rows_layernorm(x, np.ones(64, np.float32), np.zeros(64, np.float32), y)
        p.build()
        buf = p.buf
        rec = buf[abi.PL_HEADER:abi.PL_HEADER + abi.J_SIZE]
        u32 = lambda off: int(rec[off:off + 4].view(np.uint32)[0])          # noqa: E731
        u64 = lambda b, off: int(b[off:off + 8].view(np.uint64)[0])         # noqa: E731
        assert u32(abi.J_KIND) == abi.KIND_ROWLN
        assert u32(abi.J_FLAGS) & abi.FL_ROWS
        assert u64(rec, abi.J_Y) == y.ctypes.data and u64(rec, abi.J_X) == x.ctypes.data
        assert u64(rec, abi.J_NIN) == 64 and u64(rec, abi.J_LDX) == 64 and u64(rec, abi.J_N) == 1
        assert u64(buf, abi.PL_NJOBS) == 1
        p.set_rows(2, 0)
        assert (u64(buf, abi.PL_NTOK), u64(buf, abi.PL_POS)) == (2, 0)
    finally:
        k.close()


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
@pytest.mark.parametrize("edit, message", [
    ("#define J_LDR              152", "#define J_LDR              196"),        # over the counters
    ("#define J_LDX              136", "#define J_LDX              260"),        # outside the record
    ("#define PL_ARGMAX          112", "#define PL_ARGMAX          116"),        # misaligned
])
def test_guards_refuse_a_bad_header(tmp_path, edit, message):
    """The header's .if/.error guards stop the build of a header whose field leaves its record."""
    text = abi.HEADER_FILE.read_text()
    bad = re.sub(r"^" + re.escape(edit.split()[0] + " " + edit.split()[1]) + r"\s+\d+",
                 message, text, count=1, flags=re.M)
    assert bad != text
    src = '#define PLAN_ABI_TABLE\n#include "plan_abi.h"\n'
    for d, h in (("good", text), ("bad", bad)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "plan_abi.h").write_text(h)
        (tmp_path / d / "t.S").write_text(src)
    cc = shutil.which("cc") or shutil.which("gcc")
    good, r = (subprocess.run([cc, "-c", "-x", "assembler-with-cpp", "-o", str(tmp_path / d / "t.o"),
                               str(tmp_path / d / "t.S")], capture_output=True, text=True)
               for d in ("good", "bad"))
    if good.returncode:
        pytest.skip(f"the compiler cannot assemble the header here: {good.stderr[:200]}")
    assert r.returncode != 0 and "plan_abi.h:" in r.stderr


def _doc_tables() -> list[tuple[str, list[list[str]]]]:
    """(heading, rows) of the pool_t and plan_t sections of the docs."""
    out = []
    for md in sorted((ROOT / "docs").glob("*.md")) if (ROOT / "docs").is_dir() else []:
        heading, rows = None, []
        for line in md.read_text().splitlines():
            if line.startswith("#"):
                if heading and rows:
                    out.append((heading, rows))
                heading = line if re.match(r"### `(pool_t|plan_t)`", line) else None
                rows = []
            elif heading and line.startswith("| ") and re.match(r"\| ([\d, ]+|offset) \|", line):
                rows.append([c.strip() for c in line.strip("|").split("|")])
        if heading and rows:
            out.append((heading, rows))
    return out


def test_docs_tables_match_the_header():
    tables = _doc_tables()
    if not tables:
        pytest.skip("no docs/ with the pool_t / plan_t tables (a staged or installed tree)")
    seen = {"pool": set(), "header": set(), "job": set()}
    for heading, rows in tables:
        pool = "pool_t" in heading
        if pool:
            assert f"({abi.POOL_SIZE} bytes" in heading
        else:
            assert f"header ({abi.PL_HEADER} bytes)" in heading and f"records of {abi.J_SIZE} bytes" in heading
        part = "pool"
        for cells in rows:
            if cells[0] == "offset":                           # a table's heading row
                part = "job" if cells[2] == "job field" else "header" if cells[2] == "header field" else part
                continue
            offsets = [int(o) for o in cells[0].split(",")]
            if not cells[1]:
                continue                                       # the unused bytes
            names = re.findall(r"`([^`]+)`", cells[2])[:len(offsets)]
            fields = {"pool": abi.POOL, "header": abi.HEADER, "job": abi.JOB}[part]
            for off, name in zip(offsets, names):
                f = fields.get(name)
                assert f is not None, f"docs: {name!r} ({part}) is no field of asm/plan_abi.h"
                assert (off, cells[1]) == (f.offset, f"u{8 * f.size}"), (
                    f"docs: {part} field {name} at {off} {cells[1]}, header {f.offset} u{8 * f.size}")
                seen[part].add(name)
            if names == ["kind"]:
                kinds = {f"KIND_{n}": int(v) for v, n in re.findall(r"(\d+) ([A-Z]+)", cells[2])}
                assert kinds == {f"KIND_{n}": v for n, v in abi.KINDS.items()}
            if names == ["flags"]:
                for lo, hi, name in re.findall(r"bits? (\d+)(?:-(\d+))? `(\w+)`", cells[2]):
                    lo, hi = int(lo), int(hi or lo)
                    assert getattr(abi, name) == ((1 << (hi + 1)) - (1 << lo)), f"docs: flag {name}"
    assert seen["pool"] == set(abi.POOL), "docs: pool_t fields missing"
    assert seen["header"] == set(abi.HEADER), "docs: header fields missing"
    assert seen["job"] == set(abi.JOB), "docs: job fields missing"


@pytest.mark.parametrize("kind", [abi.KIND_COUNT, 99, (1 << 32) - 1])
def test_unknown_kind_takes_the_guard_entry(kind):
    """The executors reach a kind's routine through a jump table; a kind past it (Python never builds
    one) takes the guard entry: no work, the barrier, the next job -- never a wild jump."""
    import numpy as np
    from gpt2asm.weights import aligned_zeros
    k = kernels.Kernels(threads=1)
    try:
        p = k.new_plan()
        x, y = aligned_zeros((2, 64), np.float32), aligned_zeros((2, 64), np.float32)
        for _ in range(2):
            p.rows_layernorm(x, np.ones(64, np.float32), np.ones(64, np.float32), y)
        p.build()
        p.set_rows(2, 0)
        p.buf[abi.PL_HEADER + abi.J_KIND:abi.PL_HEADER + abi.J_KIND + 4].view(np.uint32)[0] = kind
        k.run_plan(p)
        assert (y == 1).all()                   # the second job ran: layernorm(0) * 1 + 1
        y[:] = 0
        p.buf[abi.PL_HEADER + abi.J_SIZE + abi.J_KIND:][:4].view(np.uint32)[0] = kind
        k.run_plan(p)
        assert (y == 0).all()                   # neither ran
    finally:
        k.close()
