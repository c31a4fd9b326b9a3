#!/usr/bin/env python3
"""Fuzz the checkpoint and tokenizer loaders with seeded, structure-aware mutations.

Every case takes a valid micro model (2 layers, 64 wide, 16 positions, a 300-token byte-level BPE
tokenizer; safetensors in both naming layouts, F32/F16/BF16) and damages one file in one to three ways:

  checkpoint (model.safetensors, config.json): the header length field; the JSON header re-serialised
      with entries mutated (dtype, shape, data_offsets, names, missing or extra keys and tensors,
      __metadata__, non-object headers, deep nesting, invalid UTF-8, duplicate keys); raw bytes flipped,
      inserted, deleted, truncated or appended; tensor data overwritten with NaN / inf / huge values;
      config.json fields changed to wrong values or types, deleted, or the file made invalid.
  tokenizer (vocab.json, merges.txt): entries deleted, added, renamed or given bad ids (duplicate,
      out of range, negative, float, string, bool, null, huge); JSON made invalid, nested, empty,
      non-object, BOM-prefixed or non-UTF-8; merge lines deleted, duplicated, swapped, malformed,
      referring to unknown tokens, with CRLF, tabs, NULs or a version header.

Then it loads the result the way the engine does. A case passes when the load either raises a typed
gpt2asm error (GPT2AsmError) or succeeds and the model then works: for a checkpoint, two forward steps
and two generated tokens (a NonFiniteLogitsError is a typed outcome too); for a tokenizer, encode ->
decode round trips on a few strings and a short generation with the micro model. Anything else — another
exception, a wrong round trip, a crash (the worker process dies) or a hang (no progress for --timeout
seconds) — is a failure. Cases run in a worker subprocess that the driver restarts after a crash or
hang, so one bad case cannot stop the run. Case k is a pure function of (--seed, k): `--repro K` reruns
one case in-process, prints its mutations and outcome, and keeps its files.

Usage: python tools/fuzz.py [--cases N] [--seed S] [--target all|ckpt|tok] [--timeout SEC] [--repro K]
Exit status 0 when every case passed; 1 otherwise (the failing cases are listed).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

TOOLS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TOOLS_DIR.parent
for p in (str(REPO_ROOT), str(TOOLS_DIR)):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402

MEMORY_LIMIT = 8 << 30            # address space of a worker process
N_MERGES = 43                      # 256 byte tokens + 43 merges + <|endoftext|> = 300 tokens
MICRO = dict(size="tiny", n_layer=2, n_embd=64, n_head=1, n_ctx=16, vocab=300)
DTYPES_ALL = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "U16", "I16", "F16", "BF16", "U32", "I32", "F32",
              "U64", "I64", "F64", "C64"]
STRINGS = ["Hello world", "", " ", "héllo wörld — 日本語 🙂", "<|endoftext|>a<|endoftext|>", "a\n\n\tb  c",
           "The quick brown fox jumps over the lazy dog 12345."]


# ----------------------------------------------------------------------------------------------------
# the base corpus

def micro_tokenizer(out: Path) -> None:
    """A valid byte-level BPE tokenizer: the 256 byte tokens, N_MERGES merges, <|endoftext|>."""
    from gpt2asm.tokenizer import BYTE_ENCODER
    rng = random.Random(1234)
    tokens = [BYTE_ENCODER[b] for b in range(256)]
    have = set(tokens)
    common = [BYTE_ENCODER[b] for b in b" etaoinshrdlu"]
    merges = []
    while len(merges) < N_MERGES:
        a = rng.choice(common + tokens[256:] if len(tokens) > 256 else common)
        b = rng.choice(common)
        if a + b not in have:
            merges.append((a, b))
            tokens.append(a + b)
            have.add(a + b)
    tokens.append("<|endoftext|>")
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False),
                                    encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")


def make_corpus(root: Path) -> dict[str, Path]:
    """Base directories: 'hf' (transformer.-prefixed F32), 'hub' (bare names + mask buffers), 'f16',
    'bf16' (header rewritten to BF16), 'noconfig' (config inferred), each with the tokenizer."""
    import contextlib
    import io
    from make_checkpoint import make_checkpoint
    bases = {}
    for name, kw in (("hf", dict(layout="hf")), ("hub", dict(layout="hub")), ("f16", dict(dtype="f16"))):
        d = root / name
        with contextlib.redirect_stdout(io.StringIO()):
            make_checkpoint(d, seed=7, tokenizer_dir=False, **kw, **MICRO)
        micro_tokenizer(d)
        bases[name] = d
    # BF16: the F32 file's values truncated to their high halves, under a BF16 header
    d = root / "bf16"
    shutil.copytree(bases["hf"], d)
    header, data = read_st(d / "model.safetensors")
    new_data, off = bytearray(), 0
    for k in sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0]):
        b, e = header[k]["data_offsets"]
        a = np.frombuffer(data[b:e], np.uint32)
        hb = (a >> 16).astype(np.uint16).tobytes()
        header[k] = {"dtype": "BF16", "shape": header[k]["shape"], "data_offsets": [off, off + len(hb)]}
        new_data += hb
        off += len(hb)
    write_st(d / "model.safetensors", header, bytes(new_data))
    bases["bf16"] = d
    d = root / "noconfig"
    shutil.copytree(bases["hub"], d)
    (d / "config.json").unlink()
    bases["noconfig"] = d
    try:                                  # a GGUF Q8_0 in the converter's layout, its tokenizer inside
        from make_gguf import write_gguf
        d = root / "gguf"
        shutil.copytree(bases["hf"], d)
        write_gguf(d, d / "model.gguf", "Q8_0")
        (d / "model.safetensors").unlink()
        bases["gguf"] = d
    except ImportError:                   # no `gguf` package: no GGUF cases
        shutil.rmtree(root / "gguf", ignore_errors=True)
    return bases


def read_st(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path: Path, header: dict, data: bytes, pad: bool = True) -> None:
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


# ----------------------------------------------------------------------------------------------------
# mutations

def weird_int(rng: random.Random, around: int | None = None):
    choices = [0, 1, -1, 2, 3, 7, 8, 15, 16, 17, 63, 64, 65, 127, 128, 255, 256, 300, 1023, 1024, 2 ** 31 - 1,
               2 ** 31, 2 ** 32, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, 10 ** 30, -(2 ** 63)]
    if around is not None:
        choices += [around + d for d in (-64, -8, -4, -2, -1, 1, 2, 4, 8, 64)] + [around * 2, around // 2]
    return rng.choice(choices)


def weird_value(rng: random.Random, around: int | None = None):
    r = rng.random()
    if r < 0.55:
        return weird_int(rng, around)
    return rng.choice([None, True, False, 1.5, -0.0, float(around or 1), "64", "", [], {}, [1, 2], {"a": 1},
                       1e308, "F32", "x" * 1000])


def mutate_header(rng: random.Random, header: dict, log: list) -> dict | list | int | str | None:
    names = [k for k in header if k != "__metadata__"]
    kind = rng.choice(["dtype", "shape", "shape", "offsets", "offsets", "overlap", "delete", "rename",
                       "duplicate", "extra", "entry_keys", "entry_type", "metadata", "root", "swap_data"])
    name = rng.choice(names)
    e = header[name]
    log.append(f"header:{kind}:{name}")
    if kind == "dtype":
        e["dtype"] = rng.choice(DTYPES_ALL + ["F33", "f32", "", None, 7, ["F32"], {"x": 1}])
    elif kind == "shape":
        s = list(e["shape"])
        op = rng.randrange(6)
        if op == 0 and s:
            i = rng.randrange(len(s))
            s[i] = weird_value(rng, s[i])
        elif op == 1:
            s.append(rng.choice([1, 2, 0, 64]))
        elif op == 2 and s:
            s.pop(rng.randrange(len(s)))
        elif op == 3:
            s = s[::-1]
        elif op == 4 and len(s) > 1:                          # same element count, other shape
            s = [s[0] * s[1]] + s[2:]
        else:
            s = weird_value(rng)
        e["shape"] = s
    elif kind == "offsets":
        b, end = e["data_offsets"]
        op = rng.randrange(5)
        if op == 0:
            e["data_offsets"] = [weird_value(rng, b), end]
        elif op == 1:
            e["data_offsets"] = [b, weird_value(rng, end)]
        elif op == 2:
            e["data_offsets"] = [end, b]
        elif op == 3:
            d = rng.choice([-8, -4, -2, -1, 1, 2, 4, 8, 4096])
            e["data_offsets"] = [b + d, end + d]
        else:
            e["data_offsets"] = rng.choice([[b], [b, end, end], [], None, "0,4", {"begin": b}, [float(b), end]])
    elif kind == "overlap":
        other = header[rng.choice(names)]
        e["data_offsets"] = list(other["data_offsets"])
        if rng.random() < 0.5:
            e["shape"], e["dtype"] = list(other["shape"]), other["dtype"]
    elif kind == "delete":
        del header[name]
    elif kind == "rename":
        new = rng.choice([name.replace("transformer.", ""), "transformer." + name, name + "x", "",
                          name.replace("h.0.", "h.9."), name.replace("h.0.", "h.2."), name.replace("h.1.", "h.01."),
                          "h.0.attn.bias", "lm_head.weight", "h." + "9" * 50 + ".ln_1.weight",
                          name.replace(".weight", ".bias"), "wte.weight", "transformer.wte.weight"])
        header[new] = header.pop(name)
    elif kind == "duplicate":
        alias = name[len("transformer."):] if name.startswith("transformer.") else "transformer." + name
        header[alias] = dict(e)
    elif kind == "extra":
        header[rng.choice(["lm_head.weight", "h.0.attn.masked_bias", "extra.weight", "h.2.ln_1.weight",
                           "transformer.h.0.attn.bias"])] = dict(e)
    elif kind == "entry_keys":
        k = rng.choice(["dtype", "shape", "data_offsets"])
        if rng.random() < 0.7:
            del e[k]
        else:
            e["extra_" + k] = e[k]
    elif kind == "entry_type":
        header[name] = weird_value(rng)
    elif kind == "metadata":
        header["__metadata__"] = rng.choice([None, 1, "pt", [], {"format": ["pt"]}, {"format": "pt", "x": {}}])
    elif kind == "root":
        return rng.choice([[], [header], 7, "header", None, True])
    elif kind == "swap_data":                                 # two same-sized tensors exchange their bytes
        same = [k for k in names if k != name and header[k].get("data_offsets") and
                isinstance(header[k]["data_offsets"], list) and len(header[k]["data_offsets"]) == 2 and
                header[k]["data_offsets"][1] - header[k]["data_offsets"][0] ==
                e["data_offsets"][1] - e["data_offsets"][0]]
        if same:
            o = header[rng.choice(same)]
            o["data_offsets"], e["data_offsets"] = e["data_offsets"], o["data_offsets"]
    return header


def mutate_bytes(rng: random.Random, raw: bytes, log: list, header_end: int) -> bytes:
    b = bytearray(raw)
    op = rng.choice(["flip", "flip", "set", "truncate", "append", "insert", "delete", "lenfield"])
    in_header = rng.random() < 0.6 and header_end > 8
    lo, hi = (0, header_end) if in_header else (0, len(b))
    log.append(f"bytes:{op}:{'header' if in_header else 'any'}")
    if op == "flip" and b:
        for _ in range(rng.choice([1, 1, 2, 4, 16])):
            i = rng.randrange(lo, max(lo + 1, hi))
            b[i % len(b)] ^= 1 << rng.randrange(8)
    elif op == "set" and b:
        i = rng.randrange(lo, max(lo + 1, hi)) % len(b)
        val = rng.choice([b"\x00", b"\xff", b"{", b"}", b"\"", b"[", b"]", b",", b":", b"-", b"9", b"\xc3", b"\\"])
        b[i:i + 1] = val
    elif op == "truncate":
        cut = rng.choice([0, 1, 4, 7, 8, 9, header_end - 1, header_end, header_end + 1,
                          rng.randrange(len(b) + 1), len(b) - 1, len(b) - 4])
        b = b[:max(0, cut)]
    elif op == "append":
        b += bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 8, 100])))
    elif op == "insert":
        i = rng.randrange(lo, max(lo + 1, hi))
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.choice([1, 2, 8])))
    elif op == "delete" and b:
        i = rng.randrange(lo, max(lo + 1, hi))
        del b[i:i + rng.choice([1, 2, 8, 64])]
    elif op == "lenfield" and len(b) >= 8:
        n = struct.unpack_from("<Q", b)[0]
        new = rng.choice([0, 1, 2, n - 1, n + 1, n + 8, len(b) - 8, len(b) - 7, len(b), 2 ** 63, 2 ** 64 - 1,
                          100_000_001, rng.randrange(2 ** 64)])
        b[:8] = struct.pack("<Q", new % (2 ** 64))
    return bytes(b)


def mutate_data(rng: random.Random, header: dict, data: bytes, log: list) -> bytes:
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    e = header[name]
    b, end = e["data_offsets"]
    if end <= b:
        return data
    d = bytearray(data)
    item = {"F32": 4, "F16": 2, "BF16": 2}.get(e["dtype"], 4)
    val = rng.choice(["nan", "inf", "-inf", "big"])
    log.append(f"data:{val}:{name}")
    i = b + rng.randrange((end - b) // item) * item
    if item == 4:
        v = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "big": 3e38}[val]
        d[i:i + 4] = struct.pack("<f", v)
    elif e["dtype"] == "F16":
        d[i:i + 2] = {"nan": b"\x00\x7e", "inf": b"\x00\x7c", "-inf": b"\x00\xfc", "big": b"\xff\x7b"}[val]
    else:                                                     # BF16
        d[i:i + 2] = {"nan": b"\xc0\x7f", "inf": b"\x80\x7f", "-inf": b"\x80\xff", "big": b"\x7f\x7f"}[val]
    return bytes(d)


def mutate_config(rng: random.Random, d: Path, log: list) -> None:
    p = d / "config.json"
    if not p.exists():
        return
    cfg = json.loads(p.read_text())
    op = rng.choice(["field", "field", "field", "delete", "arch", "text", "remove", "root"])
    log.append(f"config:{op}")
    if op == "field":
        k = rng.choice(["n_layer", "n_embd", "n_head", "n_positions", "n_ctx", "vocab_size"])
        if rng.random() < 0.3:                                # sizes that would cost hours or terabytes
            cfg[k] = rng.choice([2 ** 31, 2 ** 40, 10 ** 12, 4097, 65537, (1 << 20) + 1, 10 ** 100])
        else:
            cfg[k] = weird_value(rng, cfg.get(k) if isinstance(cfg.get(k), int) else None)
    elif op == "delete":
        cfg.pop(rng.choice(["n_layer", "n_embd", "n_head", "n_positions", "n_ctx", "vocab_size"]), None)
    elif op == "arch":
        k = rng.choice(["model_type", "activation_function", "layer_norm_epsilon", "n_inner",
                        "scale_attn_by_inverse_layer_idx", "scale_attn_weights", "add_cross_attention"])
        cfg[k] = rng.choice(["gpt2", "llama", "relu", "gelu_new", 1e-6, 1e-5, 10 ** 400 if k == "n_inner" else 256,
                             True, False, None, [], {"a": 1}])
    if op == "text":
        text = json.dumps(cfg)
        p.write_text(rng.choice([text[:rng.randrange(len(text))], text + "}", "[" * 100000, "", "\ufeff" + text,
                                 text.replace(":", "=", 1)]))
        return
    if op == "remove":
        p.unlink()
        return
    if op == "root":
        cfg = rng.choice([[], 1, "gpt2", None])
    p.write_text(json.dumps(cfg, default=str))


def mutate_checkpoint(rng: random.Random, d: Path, log: list) -> None:
    path = d / "model.safetensors"
    for _ in range(rng.choice([1, 1, 2, 3])):
        raw = path.read_bytes()
        try:
            n = struct.unpack_from("<Q", raw)[0]
            header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
            if not isinstance(header, dict) or not all(isinstance(v, dict) for k, v in header.items()
                                                       if k != "__metadata__"):
                raise ValueError
        except Exception:
            header, data, n = None, raw, 0
        r = rng.random()
        try:
            _mutate_checkpoint_once(rng, d, path, raw, header, data, n, r, log)
        except Exception as e:                    # the file no longer parses the way that step needs
            log.append(f"fallback({type(e).__name__})")
            path.write_bytes(mutate_bytes(rng, path.read_bytes(), log, 8 + n))


def mutate_gguf(rng: random.Random, path: Path, log: list) -> None:
    """A GGUF's bytes: header flips / truncation (mutate_bytes), or a weird integer over a u32/u64 field."""
    for _ in range(rng.choice([1, 1, 2, 3])):
        raw = path.read_bytes()
        try:
            import gguf
            header_end = gguf.GGUFReader(path).data_offset
        except Exception:
            header_end = max(24, len(raw) // 10)
        if rng.random() < 0.3 and header_end > 32:
            b = bytearray(raw)
            i = rng.randrange(8, header_end - 8)
            width = rng.choice([4, 8])
            v = weird_int(rng) % (1 << (8 * width))
            b[i:i + width] = v.to_bytes(width, "little")
            log.append(f"gguf:int{width * 8}@{i}={v}")
            path.write_bytes(bytes(b))
        else:
            path.write_bytes(mutate_bytes(rng, raw, log, header_end))


def _mutate_checkpoint_once(rng, d, path, raw, header, data, n, r, log) -> None:
    if header is not None and r < 0.45:
        h = mutate_header(rng, header, log)
        style = rng.random()
        if style < 0.8:
            write_st(path, h, data, pad=rng.random() < 0.8)
        else:                                             # odd serialisations of the header
            text = json.dumps(h, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5).encode()
            text = rng.choice([text, text + b"\x00\x00", b"\xef\xbb\xbf" + text, text.replace(b"{", b"{\"a\":1,\"a\":2,", 1),
                               text[:-1] + b"\xff}", b"[" * 5000 + b"]" * 5000])
            path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    elif header is not None and r < 0.6:
        path.write_bytes(raw[:8 + n] + mutate_data(rng, header, data, log))
    elif r < 0.85:
        path.write_bytes(mutate_bytes(rng, raw, log, 8 + n))
    else:
        mutate_config(rng, d, log)


def mutate_vocab(rng: random.Random, p: Path, log: list) -> None:
    text = p.read_text(encoding="utf-8")
    vocab = json.loads(text)
    items = list(vocab.items())
    op = rng.choice(["delete", "id", "id", "rename", "add", "swap", "text", "bytes", "whole"])
    log.append(f"vocab:{op}")
    if op == "delete":
        for _ in range(rng.choice([1, 1, 5])):
            k = rng.choice([rng.choice(items)[0], "<|endoftext|>", items[rng.randrange(256)][0]])
            vocab.pop(k, None)
    elif op == "id":
        k = rng.choice(items)[0]
        vocab[k] = rng.choice([weird_value(rng, len(items)), vocab[rng.choice(items)[0]], len(items), -1, 1.0,
                               True, None, "5", 10 ** 50, 2 ** 63])
    elif op == "rename":
        k = rng.choice(items)[0]
        new = rng.choice(["", " ", "a b", "\x00", "é", "日本", k + k, "<|endoftext|>", k.upper(), "Ġ" * 3, "\ud800"])
        vocab[new] = vocab.pop(k)
    elif op == "add":
        vocab[rng.choice(["Ġzz", "new", "", "ĠĠ", "\n"])] = rng.choice([len(vocab), len(vocab) + 1, 0, -5])
    elif op == "swap":
        a, b = rng.choice(items)[0], rng.choice(items)[0]
        vocab[a], vocab[b] = vocab[b], vocab[a]
    if op in ("delete", "id", "rename", "add", "swap"):
        try:
            text = json.dumps(vocab, ensure_ascii=rng.random() < 0.5)
        except (ValueError, UnicodeEncodeError):
            text = json.dumps(vocab, ensure_ascii=True)
        p.write_text(text, encoding="utf-8", errors="surrogatepass")
        return
    if op == "text":
        i = rng.randrange(len(text))
        text = rng.choice([text[:i], text[:i] + text[i + 1:], text[:i] + rng.choice("{}[]\":,\\x0") + text[i:],
                           text.replace('"', "'", 1), text + "]", "\ufeff" + text,
                           text[:i] + '"' + text[i:] ])
        p.write_text(text, encoding="utf-8")
    elif op == "bytes":
        b = bytearray(p.read_bytes())
        for _ in range(rng.choice([1, 3])):
            i = rng.randrange(len(b))
            b[i] = rng.choice([0x00, 0xff, 0xc3, 0x80, ord("\\"), ord('"'), b[i] ^ (1 << rng.randrange(8))])
        p.write_bytes(bytes(b))
    else:
        p.write_bytes(rng.choice([b"", b"{}", b"[]", b"null", b"7", b'"vocab"', b"[" * 100000 + b"]" * 100000,
                                 b'{"a": ' * 5000 + b"1" + b"}" * 5000, b"\xff\xfe{}",
                                 text.encode()[: len(text) // 2], ("{" + text[1:-1] + "," + text[1:-1] + "}").encode()]))


def mutate_merges(rng: random.Random, p: Path, log: list) -> None:
    lines = p.read_text(encoding="utf-8").split("\n")
    body = [i for i in range(len(lines)) if lines[i] and not lines[i].startswith("#")]
    op = rng.choice(["delete", "duplicate", "swap", "unknown", "parts", "space", "crlf", "version", "bytes",
                     "whole", "reverse"])
    log.append(f"merges:{op}")
    i = rng.choice(body) if body else 0
    if op == "delete" and body:
        del lines[i]
    elif op == "duplicate" and body:
        lines.insert(i, lines[i])
    elif op == "swap" and len(body) > 1:
        j = rng.choice(body)
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "unknown":
        lines.insert(i, rng.choice(["zz qq", "Ġ ĠĠĠĠĠĠ", "a \u00e9x", "\x00 a", "<|endoftext|> a"]))
    elif op == "parts" and body:
        lines[i] = rng.choice([lines[i] + " x", lines[i].replace(" ", ""), " " + lines[i], lines[i] + " ", "",
                               lines[i].replace(" ", "\t"), lines[i].replace(" ", "  ")])
    elif op == "space":
        lines.insert(i, rng.choice([" ", "  ", "\t", " a", "a "]))
    elif op == "crlf":
        p.write_bytes("\r\n".join(lines).encode())
        return
    elif op == "version":
        lines[0] = rng.choice(["#version: 0.2", "#", "version: 0.2", "# version", "#version: 0.2 extra", ""])
    elif op == "reverse" and body:
        a, b = lines[i].split(" ")
        lines[i] = f"{b} {a}"
    if op == "bytes":
        b = bytearray(p.read_bytes())
        for _ in range(rng.choice([1, 3])):
            j = rng.randrange(len(b))
            b[j] = rng.choice([0x00, 0xff, 0xc3, 0x0a, 0x20, 0x0d, b[j] ^ (1 << rng.randrange(8))])
        p.write_bytes(bytes(b))
        return
    if op == "whole":
        p.write_bytes(rng.choice([b"", b"\n", b"#version: 0.2\n", b"\xff\xfe", b"a b c\n", b"\n\n\n",
                                  "\n".join(lines).encode()[: rng.randrange(1, 400)]]))
        return
    p.write_text("\n".join(lines), encoding="utf-8")


# ----------------------------------------------------------------------------------------------------
# one case

class Runner:
    def __init__(self, corpus: Path, workdir: Path, seed: int):
        from gpt2asm.kernels import Kernels
        self.corpus, self.workdir, self.seed = corpus, workdir, seed
        self.bases = sorted(p.name for p in corpus.iterdir() if p.is_dir())
        self.kernels = Kernels(None, 1)

    def target(self, k: int, target: str) -> str:
        return target if target != "all" else ("ckpt" if k % 2 == 0 else "tok")

    def prepare(self, k: int, target: str) -> tuple[Path, str, list[str], str]:
        rng = random.Random(self.seed * 1_000_003 + k)
        t = self.target(k, target)
        base = rng.choice(self.bases) if t == "ckpt" else rng.choice(["hf", "hub"])
        d = self.workdir / "case"
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(self.corpus / base, d)
        log = [f"base:{base}"]
        if t == "ckpt" and base == "gguf":
            mutate_gguf(rng, d / "model.gguf", log)
        elif t == "ckpt":
            mutate_checkpoint(rng, d, log)
        else:
            for _ in range(rng.choice([1, 1, 2])):
                f = d / ("vocab.json" if rng.random() < 0.5 else "merges.txt")
                try:
                    (mutate_vocab if f.name == "vocab.json" else mutate_merges)(rng, f, log)
                except Exception as e:            # already damaged by an earlier step: damage its bytes
                    log.append(f"fallback({type(e).__name__})")
                    raw = f.read_bytes()
                    f.write_bytes(mutate_bytes(rng, raw, log, len(raw)))
        dtype = rng.choice(["f32", "f16"])
        return d, t, log, dtype

    def run(self, k: int, target: str) -> tuple[str, str, list[str]]:
        """(outcome, detail, mutations); outcome 'ok', 'typed' or 'FAIL'."""
        from gpt2asm.errors import GPT2AsmError
        try:
            d, t, log, dtype = self.prepare(k, target)
        except Exception as e:                        # the mutator itself: not a finding about the engine
            return "skip", f"mutator: {type(e).__name__}: {e}", []
        try:
            detail = self.check_ckpt(d, dtype) if t == "ckpt" else self.check_tok(d)
            return "ok", detail, log
        except GPT2AsmError as e:
            return "typed", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}", log
        except Exception:
            return "FAIL", traceback.format_exc(limit=8), log

    def check_ckpt(self, d: Path, dtype: str) -> str:
        from gpt2asm.engine import GPT2
        from gpt2asm.model import Transformer
        from gpt2asm.tokenizer import Tokenizer
        from gpt2asm.weights import load_weights
        if (d / "model.gguf").exists():          # GGUF: weights (also as q8_0 blocks) and tokenizer from it
            from gpt2asm.ggufload import GGUFModel
            g = GGUFModel(d / "model.gguf")
            g.weights("q8_0")
            w, gtok = g.weights(dtype), g.tokenizer()
        else:
            w, gtok = load_weights(d, dtype), None
        tf = Transformer(w, self.kernels)
        V = tf.cfg.vocab_size
        st = tf.new_state()
        for tok in (0, min(5, V - 1)):
            logits = tf.step(st, tok)[0]
            if logits.shape != (V,):
                raise AssertionError(f"logits shape {logits.shape}, expected ({V},)")
        m = GPT2(tf, gtok if gtok is not None else Tokenizer.from_dir(d), d)
        out = list(m.generate_ids([1, 2], max_new_tokens=2, temperature=0))
        if len(out) != 2 or not all(0 <= t < m.tokenizer.vocab_size for t in out):
            raise AssertionError(f"bad generated ids {out}")
        return f"loaded {w.source_dtype} -> {dtype}"

    def check_tok(self, d: Path) -> str:
        from gpt2asm.engine import GPT2
        from gpt2asm.model import Transformer
        from gpt2asm.tokenizer import Tokenizer
        from gpt2asm.weights import load_weights
        tok = Tokenizer.from_dir(d)
        for s in STRINGS:
            ids = tok.encode(s)
            if not all(type(i) is int and 0 <= i < tok.vocab_size for i in ids):
                raise AssertionError(f"encode({s!r}) gave ids out of range: {ids}")
            back = tok.decode(ids)
            if back != s:
                raise AssertionError(f"round trip of {s!r} gave {back!r}")
        m = GPT2(Transformer(load_weights(self.corpus / "hf", "f32"), self.kernels), tok, d)
        m.generate("Hello", max_new_tokens=2, temperature=0)
        return f"loaded {tok.vocab_size} tokens"


# ----------------------------------------------------------------------------------------------------
# driver: a worker subprocess per stretch of cases, restarted after a crash or a hang

def worker(corpus: Path, workdir: Path, seed: int, start: int, end: int, target: str) -> int:
    try:                          # a runaway allocation becomes a MemoryError (a failure), not an OOM kill
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass
    r = Runner(corpus, workdir, seed)
    out = sys.stdout
    for k in range(start, end):
        out.write(f"S {k}\n")
        out.flush()
        outcome, detail, log = r.run(k, target)
        rec = {"k": k, "outcome": outcome, "detail": detail if outcome == "FAIL" else detail[:200], "log": log}
        out.write("R " + json.dumps(rec) + "\n")
        out.flush()
    return 0


def drive(cases: int, seed: int, target: str, timeout: float, start: int = 0, verbose: bool = False,
          workdir: Path | None = None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="gpt2asm-fuzz-", dir=workdir))
    try:
        corpus = tmp / "corpus"
        corpus.mkdir()
        make_corpus(corpus)
        t0 = time.perf_counter()
        results, failures = Counter(), []
        errors = Counter()
        k, end = start, start + cases
        restarts = 0
        while k < end:
            wd = tmp / f"w{restarts}"
            wd.mkdir()
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(corpus), str(wd),
                                     str(seed), str(k), str(end), target], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, bufsize=1)
            current, dead, started = None, None, False
            import selectors
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            last = time.monotonic()
            while True:
                ready = sel.select(timeout=1.0)
                if ready:
                    line = proc.stdout.readline()
                    if not line:
                        break
                    last = time.monotonic()
                    if line.startswith("S "):
                        current = int(line[2:])
                        started = True
                    elif line.startswith("R "):
                        rec = json.loads(line[2:])
                        results[rec["outcome"]] += 1
                        if rec["outcome"] == "typed":
                            errors[rec["detail"].split(":", 1)[0]] += 1
                        if rec["outcome"] == "FAIL":
                            failures.append(rec)
                        current = None
                        k = rec["k"] + 1
                        if verbose:
                            print(f"{rec['k']}: {rec['outcome']} {rec['log']} {rec['detail'][:120]}")
                elif time.monotonic() - last > timeout:
                    dead = "hang"
                    proc.kill()
                    break
            proc.wait()
            if not started and proc.returncode != 0:       # not a case: the worker cannot run at all
                raise SystemExit(f"fuzz: the worker process failed before its first case:\n"
                                 f"{proc.stderr.read()[-3000:]}")
            if dead is None and proc.returncode != 0:
                dead = f"crash (exit status {proc.returncode})"
            if dead is not None:
                if current is None:
                    current = k
                err = proc.stderr.read()[-2000:] if proc.stderr else ""
                rec = {"k": current, "outcome": "FAIL", "detail": f"{dead}; stderr: {err}",
                       "log": Runner.describe(corpus, tmp, seed, current, target)}
                failures.append(rec)
                results["FAIL"] += 1
                results["hang" if dead == "hang" else "crash"] += 1
                k = current + 1
                restarts += 1
            elif k < end:                                   # worker ended early without a failure report
                restarts += 1
            proc.stdout.close()
            proc.stderr.close()
            shutil.rmtree(wd, ignore_errors=True)
        return {"cases": cases, "seed": seed, "target": target, "seconds": time.perf_counter() - t0,
                "ok": results["ok"], "typed": results["typed"], "skip": results["skip"],
                "failures": failures, "crashes": results["crash"], "hangs": results["hang"],
                "errors": dict(errors)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _describe(corpus: Path, tmp: Path, seed: int, k: int, target: str) -> list[str]:
    """The mutations of case k (replayed without running it)."""
    try:
        wd = tmp / "describe"
        wd.mkdir(exist_ok=True)
        r = Runner.__new__(Runner)
        r.corpus, r.workdir, r.seed = corpus, wd, seed
        r.bases = sorted(p.name for p in corpus.iterdir() if p.is_dir())
        return r.prepare(k, target)[2]
    except Exception as e:
        return [f"(cannot replay: {e})"]


Runner.describe = staticmethod(_describe)


def repro(k: int, seed: int, target: str) -> int:
    tmp = Path(tempfile.mkdtemp(prefix=f"gpt2asm-fuzz-case{k}-"))
    corpus = tmp / "corpus"
    corpus.mkdir()
    make_corpus(corpus)
    r = Runner(corpus, tmp, seed)
    outcome, detail, log = r.run(k, target)
    print(f"case {k} (seed {seed}, target {r.target(k, target)}): {outcome}\nmutations: {log}\n{detail}")
    print(f"files kept in {tmp / 'case'}")
    return 1 if outcome == "FAIL" else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        corpus, wd, seed, start, end, target = argv[1:7]
        return worker(Path(corpus), Path(wd), int(seed), int(start), int(end), target)
    ap = argparse.ArgumentParser(description="Fuzz the checkpoint and tokenizer loaders.")
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--target", choices=("all", "ckpt", "tok"), default="all")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds without progress that count as a hang")
    ap.add_argument("--repro", type=int, metavar="K", help="run case K in-process and keep its files")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.repro is not None:
        return repro(a.repro, a.seed, a.target)
    if a.cases < 1:
        ap.error("--cases must be ≥ 1")
    r = drive(a.cases, a.seed, a.target, a.timeout, a.start, a.verbose)
    print(f"fuzz: {r['cases']} cases (seed {r['seed']}, target {r['target']}) in {r['seconds']:.1f} s: "
          f"{r['ok']} valid loads, {r['typed']} typed errors, {r['skip']} skipped, {len(r['failures'])} failures "
          f"({r['crashes']} crashes, {r['hangs']} hangs)")
    print("typed errors: " + ", ".join(f"{k} {v}" for k, v in sorted(r["errors"].items())))
    kinds = Counter((f["detail"].strip().splitlines() or ["?"])[-1][:100] for f in r["failures"])
    for kind, n in kinds.most_common():
        print(f"  {n} x {kind}")
    for f in r["failures"][:20]:
        print(f"FAIL case {f['k']}: {f['log']}\n{f['detail']}\n  reproduce: python tools/fuzz.py --seed {r['seed']} "
              f"--target {r['target']} --repro {f['k']}")
    print(f"{r['cases'] - len(r['failures'])} passed, {len(r['failures'])} failed")
    return 1 if r["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
