"""The plan ABI in Python, read from asm/plan_abi.h (the one source of pool_t, the plan header, the job
record, the job kinds and the flags) when this module is imported -- nothing here is written by hand.

    from gpt2asm import plan_abi as abi
    abi.J_SIZE, abi.KIND_QKV, abi.FL_KV16, abi.B_KV16 ...   every #define of the header, by its name
    abi.JOB["n_in"]     -> Field(name="J_NIN", offset=48, size=8)   job record fields by Python key
    abi.HEADER, abi.POOL, abi.ARGMAX_SLOT_FIELDS                     plan header / pool_t / ARGMAX slot
    abi.ROW_FIELDS                                                     a row table entry (batched decode)
    abi.ENTRIES         the index, in order: (name, size, value), the rows of the library's table
                        gpt2asm_plan_abi (tests/test_plan_abi.py compares them)

The header: a checkout's asm/plan_abi.h (the sources of its library), else -- an installed wheel -- the
copy build.py puts beside this module (gpt2asm/plan_abi.h), which was built into the wheel's library.  Its format is described at its top.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NamedTuple

_HERE = Path(__file__).resolve().parent
HEADER_PATHS = (_HERE.parent / "asm" / "plan_abi.h", _HERE / "plan_abi.h")   # checkout, wheel
_TYPES = {"u32": 4, "u64": 8}
_OPS = (ast.BitOr, ast.BitAnd, ast.BitXor, ast.LShift, ast.RShift, ast.Add, ast.Sub, ast.Mult)


class Field(NamedTuple):
    name: str           # the header's name, e.g. "J_NIN"
    offset: int         # bytes from the start of its record
    size: int           # 4 (u32) or 8 (u64)
    record: str         # the name of the record's size, e.g. "J_SIZE"


def header_path() -> Path:
    for p in HEADER_PATHS:
        if p.is_file():
            return p
    raise FileNotFoundError(f"plan_abi.h not found (looked for {', '.join(map(str, HEADER_PATHS))})")


def _eval(expr: str, env: dict[str, int], where: str) -> int:
    """An integer expression of the header: numbers, names defined above, | & ^ << >> + - * ~ ()."""
    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        if isinstance(n, ast.Name) and n.id in env:
            return env[n.id]
        if isinstance(n, ast.BinOp) and isinstance(n.op, _OPS):
            a, b = ev(n.left), ev(n.right)
            return {ast.BitOr: a | b, ast.BitAnd: a & b, ast.BitXor: a ^ b, ast.Add: a + b, ast.Sub: a - b,
                    ast.Mult: a * b, ast.LShift: a << b if b >= 0 else None,
                    ast.RShift: a >> b if b >= 0 else None}[type(n.op)]
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.Invert, ast.USub)):
            v = ev(n.operand)
            return ~v if isinstance(n.op, ast.Invert) else -v
        raise ValueError(f"{where}: cannot evaluate {ast.unparse(n) if isinstance(n, ast.AST) else n!r}")
    try:
        return ev(ast.parse(expr.strip(), mode="eval"))
    except SyntaxError:
        raise ValueError(f"{where}: not an integer expression: {expr!r}") from None


def parse(text: str, where: str = "plan_abi.h"):
    """(values: name -> int, entries: [(name, size, value)], fields: name -> (Field, key)) of a header."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    values: dict[str, int] = {}
    entries: list[tuple[str, int, int]] = []
    fields: dict[str, tuple[Field, str]] = {}
    in_asm = 0                                 # depth inside `#if defined(__ASSEMBLER__)` blocks
    depth = 0
    for no, line in enumerate(text.splitlines(), 1):
        at = f"{where}:{no}"
        s = line.strip()
        if s.startswith("#"):
            d = s[1:].strip()
            if d.startswith(("if", "ifdef", "ifndef")):
                depth += 1
                if in_asm or "__ASSEMBLER__" in d:
                    in_asm += 1
            elif d.startswith("endif"):
                depth -= 1
                in_asm = max(in_asm - 1, 0)
            elif d.startswith("define") and not in_asm:
                m = re.fullmatch(r"define\s+(\w+)(\(?)\s*(.*)", d)
                if not m:
                    raise ValueError(f"{at}: unreadable #define")
                name, fn, expr = m.groups()
                if fn or name.startswith(("GPT2ASM_", "PLAN_")):
                    continue                   # the header's own machinery
                if name in values:
                    raise ValueError(f"{at}: {name} defined twice")
                values[name] = _eval(expr, values, at)
            continue
        if in_asm:
            continue
        m = re.fullmatch(r"PLAN_FIELD\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)", s)
        if m:
            name, typ, rec, key = m.groups()
            if name not in values or rec not in values or typ not in _TYPES:
                raise ValueError(f"{at}: PLAN_FIELD of an undefined name, record or type")
            f = Field(name, values[name], _TYPES[typ], rec)
            if f.offset % f.size or not 0 <= f.offset <= values[rec] - f.size:
                raise ValueError(f"{at}: {name} does not fit inside {rec} or is misaligned")
            fields[name] = (f, key)
            entries.append((name, f.size, f.offset))
            continue
        m = re.fullmatch(r"PLAN_VALUE\(\s*(\w+)\s*\)", s)
        if m:
            if m.group(1) not in values:
                raise ValueError(f"{at}: PLAN_VALUE of an undefined name")
            entries.append((m.group(1), 0, values[m.group(1)]))
            continue
    listed = [n for n, _, _ in entries]
    if sorted(listed) != sorted(values) or len(set(listed)) != len(listed):
        missing = sorted(set(values) - set(listed))
        dup = sorted({n for n in listed if listed.count(n) > 1})
        raise ValueError(f"{where}: every #define must be in the index once (missing {missing}, twice {dup})")
    return values, entries, fields


def _records(fields, record: str) -> dict[str, Field]:
    return {key: f for f, key in fields.values() if f.record == record}


HEADER_FILE = header_path()
VALUES, ENTRIES, _FIELDS = parse(HEADER_FILE.read_text(), str(HEADER_FILE))
globals().update(VALUES)

POOL = _records(_FIELDS, "POOL_SIZE")              # pool_t fields by key
HEADER = _records(_FIELDS, "PL_HEADER")            # plan header fields
JOB = _records(_FIELDS, "J_SIZE")                  # job record fields
ARGMAX_SLOT_FIELDS = _records(_FIELDS, "ARGMAX_SLOT")
ROW_FIELDS = _records(_FIELDS, "RT_SIZE")          # an entry of a batched decode's row table
KINDS = {n[5:]: v for n, v in VALUES.items() if n.startswith("KIND_") and n != "KIND_COUNT"}

# u64 slot indices (byte offset / 8) of the u64 fields a plan encoder writes through a uint64 view
JOB_U64 = {k: f.offset // 8 for k, f in JOB.items() if f.size == 8 and f.offset < VALUES["J_COUNTERS"]}
HEADER_U64 = {k: f.offset // 8 for k, f in HEADER.items() if f.size == 8}
