"""GGUF in (gpt2asm/ggufload.py): GPT-2 GGUFs in llama.cpp's converter layout (tools/make_gguf.py, gguf.GGUFWriter)
load to exactly the weights of the checkpoint they were made from; their tokenizer equals vocab.json/merges.txt's;
damaged or foreign files are CheckpointErrors."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from gpt2asm import quant0 as Q  # noqa: E402
from gpt2asm.errors import CheckpointError, ModelNotFoundError, TokenizerError  # noqa: E402
from gpt2asm.ggufload import GGUFModel, is_gguf, load_gguf_weights  # noqa: E402
from gpt2asm.weights import load_weights  # noqa: E402
from make_checkpoint import make_checkpoint  # noqa: E402
from make_gguf import converted_tensors, write_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(size="tiny", vocab=100, n_ctx=32, tokenizer_dir=False)


def bits(a) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def assert_same_weights(got, want, *, tied: bool | None = None) -> None:
    """Every array of two Weights is the same bits (dtype and shape too)."""
    for f in dataclasses.fields(want):
        x, y = getattr(got, f.name), getattr(want, f.name)
        if f.name == "layers":
            assert len(x) == len(y)
            for i, (L, M) in enumerate(zip(x, y)):
                for g in dataclasses.fields(M):
                    u, v = getattr(L, g.name), getattr(M, g.name)
                    if v is None:
                        assert u is None, (i, g.name)
                    else:
                        assert (u.dtype, u.shape) == (v.dtype, v.shape) and bits(u) == bits(v), (i, g.name)
        elif isinstance(y, np.ndarray):
            assert (x.dtype, x.shape) == (y.dtype, y.shape) and bits(x) == bits(y), f.name
        elif f.name in ("config", "dtype", "n_vocab_padded"):
            assert x == y, f.name
    if tied is not None:
        assert got.tied_head == tied


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ck") / "m", seed=7, layout="hub", **SMALL)


@pytest.fixture(scope="module")
def ckpt16(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ck16") / "m", seed=8, layout="hf", dtype="f16", **SMALL)


# ---------------------------------------------------------------------------------------------------
# round trips: checkpoint -> GGUF -> the same weights

@pytest.mark.parametrize("output", [True, False], ids=["output", "tied"])
@pytest.mark.parametrize("ftype,dtype", [("F32", "f32"), ("Q8_0", "q8_0"), ("Q4_0", "q4_0")])
def test_gguf_equals_checkpoint(ckpt, tmp_path, ftype, dtype, output):
    """A Q8_0 GGUF gives exactly --dtype q8_0's ints and scales (blocks repacked, not requantized); Q4_0
    likewise; F32 the f32 arrays."""
    g = write_gguf(ckpt, tmp_path / f"m-{ftype}.gguf", ftype, output=output)
    m = GGUFModel(g)
    assert m.file_dtype() == dtype and m.config == load_weights(ckpt, "f32").config
    w = m.weights()
    assert w.dtype == dtype
    assert_same_weights(w, load_weights(ckpt, dtype), tied=True)    # an older converter's output.weight: a copy


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
def test_f32_gguf_in_every_dtype(ckpt, tmp_path, dtype):
    """A float GGUF converts like the checkpoint in every run dtype."""
    g = write_gguf(ckpt, tmp_path / "m.gguf", "F32")
    assert_same_weights(load_gguf_weights(g, dtype), load_weights(ckpt, dtype))


def test_bf16_gguf(ckpt, tmp_path):
    """BF16 tensors are widened exactly (the high half of a float32)."""
    t = converted_tensors(ckpt)
    types = {n: "BF16" for n, a in t.items() if a.ndim == 2 and n != "position_embd.weight"}
    m = GGUFModel(write_gguf(ckpt, tmp_path / "m.gguf", "F32", types=types))
    assert m.types["blk.0.ffn_up.weight"] == "BF16" and m.file_dtype() == "f32"
    a = t["blk.0.ffn_up.weight"]
    want = ((a.view(np.uint32) + 0x7FFF + ((a.view(np.uint32) >> 16) & 1)) >> 16 << 16).view(np.float32)
    assert bits(m.float32("blk.0.ffn_up.weight")) == bits(want)
    w = m.weights("f32")
    from gpt2asm.weights import tile_matrix
    assert bits(w.layers[0].fc_w) == bits(tile_matrix(want.T))


def test_f16_gguf_equals_f16_checkpoint(ckpt16, tmp_path):
    g = write_gguf(ckpt16, tmp_path / "m-F16.gguf", "F16")
    m = GGUFModel(g)
    assert m.file_dtype() == "f16" and m.types["position_embd.weight"] == "F32"
    assert m.types["blk.0.attn_qkv.weight"] == "F16" and m.types["blk.0.attn_qkv.bias"] == "F32"
    for dtype in ("f16", "f32", "q8_0"):
        assert_same_weights(m.weights(dtype), load_weights(ckpt16, dtype))


def test_converter_layout(ckpt, tmp_path):
    """Names, numpy shapes ([out][in]: the converter transposes Conv1D) and types as the converter writes them."""
    g = write_gguf(ckpt, tmp_path / "m.gguf", "Q8_0", output=True)
    r = gguf.GGUFReader(g)
    t = {x.name: x for x in r.tensors}
    C = 128
    assert t["blk.0.attn_qkv.weight"].tensor_type.name == "Q8_0"
    assert [int(v) for v in t["blk.0.attn_qkv.weight"].shape] == [C, 3 * C]          # ggml ne: [in, out]
    assert [int(v) for v in t["blk.1.ffn_down.weight"].shape] == [4 * C, C]
    assert t["token_embd.weight"].tensor_type.name == t["output.weight"].tensor_type.name == "Q8_0"
    assert t["position_embd.weight"].tensor_type.name == "F32"
    assert t["blk.1.ffn_norm.bias"].tensor_type.name == "F32"
    assert r.fields["general.architecture"].contents() == "gpt2"


def test_requantized_gguf_is_defined(ckpt, tmp_path):
    """q4_0 from a Q8_0 GGUF: the blocks dequantized (ggml) and quantized again -- not the checkpoint's q4_0."""
    m = GGUFModel(write_gguf(ckpt, tmp_path / "m.gguf", "Q8_0"))
    w = m.weights("q4_0")
    want = Q.quantize(Q.dequantize(*m.blocks("blk.0.ffn_up.weight")), "q4_0")
    assert bits(w.layers[0].fc_w) == bits(Q.tile(*want, "q4_0"))
    assert bits(w.head_w) == bits(load_weights(ckpt, "q8_0").head_w)    # the head stays q8_0, as stored


def test_untied_output(ckpt, tmp_path):
    """An output.weight that differs from token_embd is the head; token_embd stays the lookup."""
    t = converted_tensors(ckpt)
    t["output.weight"] = (t["token_embd.weight"] * 0.5).astype(np.float32)
    g = write_gguf(ckpt, tmp_path / "m.gguf", "Q8_0", tensors=t)
    w = load_gguf_weights(g)
    assert not w.tied_head
    assert bits(w.head_w) == bits(Q.tile(*Q.quantize(t["output.weight"], "q8_0"), "q8_0"))
    assert bits(w.wte) == bits(Q.dequantize(*Q.quantize(t["token_embd.weight"], "q8_0")))


def test_q6k_head_is_dequantized(tmp_path):
    """llama-quantize's Q4_0 GPT-2 has a Q6_K output tensor: dequantized as gguf.quants does; a q4_0 run keeps
    its blocks as stored (the q6_k head), a q8_0 run requantizes the dequantized values to q8_0."""
    ck = make_checkpoint(tmp_path / "m", seed=9, layout="hub", size="tiny", n_embd=256, n_head=4, vocab=64,
                         n_ctx=32, tokenizer_dir=False)                 # Q6_K blocks are 256 wide
    t = converted_tensors(ck, output=True)
    V, C = t["output.weight"].shape
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (V * C // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = np.full((len(blocks), 1), np.float16(1e-3)).view(np.uint8)   # d: finite
    g = tmp_path / "q6k.gguf"
    w = gguf.GGUFWriter(g, "gpt2")
    w.add_block_count(2); w.add_context_length(32); w.add_embedding_length(C); w.add_head_count(4)
    for n, a in t.items():
        if n == "output.weight":
            w.add_tensor(n, blocks.reshape(V, -1), raw_dtype=gguf.GGMLQuantizationType.Q6_K)
        else:
            w.add_tensor(n, a.astype(np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    m = GGUFModel(g)
    head = m.float32("output.weight")
    ref = gguf.quants.dequantize(blocks.reshape(V, -1), gguf.GGMLQuantizationType.Q6_K)
    assert bits(head) == bits(ref.astype(np.float32))
    ws = m.weights("q4_0")
    assert not ws.tied_head and bits(ws.head_w) == bits(Q.tile_q6k(*Q.from_ggml_q6k(blocks.reshape(V, -1), C)))
    ws = m.weights("q8_0")
    assert bits(ws.head_w) == bits(Q.tile(*Q.quantize(head, "q8_0"), "q8_0"))


# ---------------------------------------------------------------------------------------------------
# the tokenizer from the metadata, and the whole model

def test_tokenizer_equals_vocab_files(ckpt_tiny, tmp_path):
    from tokenizer_cases import CORPUS, fuzz_strings
    from gpt2asm.tokenizer import Tokenizer
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "F32")
    a, b = Tokenizer.from_dir(ckpt_tiny, cache_dir=False), GGUFModel(g).tokenizer()
    assert (b.vocab_size, b.eot_id) == (a.vocab_size, a.eot_id) and b.encoder == a.encoder and b.ranks == a.ranks
    for s in CORPUS + list(fuzz_strings(300, seed=17)):
        ids = a.encode(s)
        assert b.encode(s) == ids, s
        assert b.decode(ids) == a.decode(ids)
    assert b.decode_bytes(range(b.vocab_size)) == a.decode_bytes(range(a.vocab_size))


def test_gpt2_load_gguf_runs_the_same(ckpt_tiny, tmp_path):
    from gpt2asm import GPT2
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "F32")
    with GPT2.load(ckpt_tiny) as a, GPT2.load(g) as b:
        assert (b.dtype, b.model_dir) == ("f32", g)
        ids = a.encode("Alan Turing theorized that computers")
        assert b.encode("Alan Turing theorized that computers") == ids
        assert bits(b.logits(ids)) == bits(a.logits(ids))
        assert list(b.generate_ids(ids, 5, temperature=0)) == list(a.generate_ids(ids, 5, temperature=0))


def test_gguf_from_env(ckpt_tiny, tmp_path, monkeypatch):
    """$GPT2ASM_MODEL names a GGUF as --model does (files.named_spec: blank-padded values stripped)."""
    from gpt2asm import GPT2
    from gpt2asm.ggufload import resolve
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "F32")
    monkeypatch.setenv("GPT2ASM_MODEL", f"  {g}\n")
    assert resolve(None) == g
    assert resolve(123) is None                          # the load's InvalidArgumentError, not resolve's
    with GPT2.load() as m:
        assert m.model_dir == g
    monkeypatch.setenv("GPT2ASM_MODEL", " ")
    assert resolve(None) is None


def test_cli_gguf(ckpt_tiny, tmp_path, capsys):
    from gpt2asm.__main__ import main
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "F32")
    assert main(["--model", str(g), "-t", "0", "-n", "3", "-i", "Hello"]) == 0
    out = capsys.readouterr()
    assert "fp32" in out.err
    assert main(["--model", str(g), "--dtype", "f16", "-t", "0", "-n", "3", "-i", "Hello"]) == 0
    assert "fp16" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# typed errors

def _write(ckpt, path, **kw) -> Path:
    return write_gguf(ckpt, path, kw.pop("ftype", "Q8_0"), **kw)


def test_other_architecture(ckpt, tmp_path):
    with pytest.raises(CheckpointError, match="architecture is 'llama'"):
        GGUFModel(_write(ckpt, tmp_path / "m.gguf", arch="llama"))


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("blk.1.ffn_up.bias"), "missing tensor"),
    (lambda t: t.update({"blk.0.extra.weight": np.zeros(4, np.float32)}), "unexpected tensor"),
    (lambda t: t.update({"blk.5.attn_norm.weight": np.zeros(128, np.float32)}), "blocks up to blk.5"),
    (lambda t: t.update({"blk.0.attn_qkv.weight": np.ascontiguousarray(t["blk.0.attn_qkv.weight"].T)}),
     "blk.0.attn_qkv.weight is"),
    (lambda t: t.update({"position_embd.weight": t["position_embd.weight"][:16]}), "position_embd.weight is"),
    (lambda t: t.update({"output_norm.bias": np.full(128, np.nan, np.float32)}), "non-finite"),
])
def test_bad_tensors(ckpt, tmp_path, edit, match):
    t = converted_tensors(ckpt)
    edit(t)
    with pytest.raises(CheckpointError, match=match):
        load_gguf_weights(_write(ckpt, tmp_path / "m.gguf", tensors=t, ftype="F32"))


def test_unsupported_type(ckpt, tmp_path):
    g = _write(ckpt, tmp_path / "m.gguf", types={"blk.0.ffn_up.weight": "Q5_0"})
    with pytest.raises(CheckpointError, match="blk.0.ffn_up.weight has type Q5_0"):
        GGUFModel(g)


def test_non_finite_block_scale(ckpt, tmp_path):
    t = converted_tensors(ckpt)
    g = _write(ckpt, tmp_path / "m.gguf", tensors=t)
    r = gguf.GGUFReader(g)
    off = next(x for x in r.tensors if x.name == "blk.1.attn_output.weight").data_offset
    raw = bytearray(g.read_bytes())
    raw[off + 34 * 5: off + 34 * 5 + 2] = np.float16(np.inf).tobytes()          # block 5's d
    g.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="not finite"):
        load_gguf_weights(g)


@pytest.mark.parametrize("edit,match", [
    ({"n_layer": 3}, "missing tensor"), ({"n_head": 3}, "head_dim|divisible"),
    ({"n_embd": 256, "n_head": 4}, "is \\["), ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon"),
])
def test_bad_metadata(ckpt, tmp_path, edit, match):
    import json
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(edit)
    with pytest.raises(CheckpointError, match=match):
        GGUFModel(_write(ckpt, tmp_path / "m.gguf", config=cfg))


def test_truncated_and_damaged(ckpt, tmp_path):
    g = _write(ckpt, tmp_path / "m.gguf")
    raw = g.read_bytes()
    bad = tmp_path / "bad.gguf"
    rng = np.random.default_rng(1)
    cuts = [0, 3, 4, 10, 24, 100, 1000, len(raw) // 2, len(raw) - 1] + list(rng.integers(1, len(raw), 12))
    for n in cuts:
        bad.write_bytes(raw[:n])
        with pytest.raises(CheckpointError):
            load_gguf_weights(bad)
    bad.write_bytes(b"GGUF" + bytes(rng.integers(0, 256, 4000, dtype=np.uint8)))
    with pytest.raises(CheckpointError):
        load_gguf_weights(bad)
    for _ in range(30):                                        # flipped header bytes: typed errors or a load
        b = bytearray(raw)
        for i in rng.integers(4, 2000, 3):
            b[i] ^= 1 << int(rng.integers(0, 8))
        bad.write_bytes(bytes(b))
        try:
            load_gguf_weights(bad)
        except CheckpointError:
            pass


def test_not_a_file(tmp_path):
    from gpt2asm import GPT2
    (tmp_path / "d.gguf").mkdir()
    with pytest.raises(CheckpointError, match="not a regular file"):
        GGUFModel(tmp_path / "d.gguf")
    with pytest.raises(ModelNotFoundError):
        GPT2.load(tmp_path / "missing.gguf")
    (tmp_path / "x.gguf").write_bytes(b"PK\3\4" + bytes(100))
    with pytest.raises(CheckpointError, match="no GGUF magic"):
        GPT2.load(tmp_path / "x.gguf")
    assert is_gguf(tmp_path / "x.gguf") and not is_gguf(tmp_path)


def test_tokenizer_metadata_shapes(ckpt_tiny, tmp_path):
    def types_short(w):
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b"])
        w.add_token_types([1])
    with pytest.raises(TokenizerError):                      # a 2-token vocabulary without the bytes
        GGUFModel(write_gguf(ckpt_tiny, tmp_path / "a.gguf", "F32", tokenizer=False, hook=types_short)).tokenizer()
    def llama(w):
        w.add_tokenizer_model("llama")
    with pytest.raises(TokenizerError, match="'llama'"):
        GGUFModel(write_gguf(ckpt_tiny, tmp_path / "b.gguf", "F32", tokenizer=False, hook=llama)).tokenizer()
    import json
    tokens = [t for t, _ in sorted(json.loads((ckpt_tiny / "vocab.json").read_text()).items(), key=lambda kv: kv[1])]
    merges = [ln for ln in (ckpt_tiny / "merges.txt").read_text().split("\n") if ln and not ln.startswith("#")]
    def bad_types(w):
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types([1] * 10)
    with pytest.raises(TokenizerError, match="token_type has 10 entries"):
        GGUFModel(write_gguf(ckpt_tiny, tmp_path / "c.gguf", "F32", tokenizer=False, hook=bad_types)).tokenizer()


def test_bad_tokenizer_metadata(ckpt_tiny, tmp_path):
    import json
    from gpt2asm import GPT2
    d = tmp_path / "m"
    shutil.copytree(ckpt_tiny, d)
    merges = (d / "merges.txt").read_text().split("\n")
    (d / "merges.txt").write_text("\n".join(merges[:100] + ["Ġx notatoken"] + merges[100:]))
    with pytest.raises(TokenizerError, match="notatoken"):
        GPT2.load(write_gguf(d, tmp_path / "m.gguf", "F32"))
    vocab = json.loads((d / "vocab.json").read_text())
    vocab.pop("<|endoftext|>")
    vocab["<|x|>"] = 50256
    shutil.copy(ckpt_tiny / "merges.txt", d / "merges.txt")
    (d / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(TokenizerError):
        GPT2.load(write_gguf(d, tmp_path / "m2.gguf", "F32"))


@pytest.mark.parametrize("refusal", ["MemoryError", "ENOMEM"])
def test_out_of_memory_is_not_a_damaged_gguf(ckpt_tiny, tmp_path, monkeypatch, refusal):
    """The system refusing memory while the GGUF is read (RLIMIT_AS: the reader's np.memmap gets ENOMEM,
    its parsing a MemoryError) is said as such -- "cannot map the file: Cannot allocate memory", or the
    MemoryError the CLI turns into "out of memory" -- never "damaged or truncated GGUF" of a good file."""
    import errno
    import gpt2asm.ggufload as gl
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "F32")

    class Refused:
        def __init__(self, *a, **k):
            if refusal == "MemoryError":
                raise MemoryError()
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
    monkeypatch.setattr(gl, "_reader_class", lambda: Refused)
    if refusal == "MemoryError":
        with pytest.raises(MemoryError):
            GGUFModel(g)
    else:
        with pytest.raises(CheckpointError, match="cannot map the file: Cannot allocate memory"):
            GGUFModel(g)
    monkeypatch.undo()
    assert GGUFModel(g).config.n_layer == 2


def test_damaged_array_count(ckpt_tiny, tmp_path):
    """An array count past the file (up to 2^64 - 1) is a prompt CheckpointError: gguf's reader alone would
    append empty elements until memory ran out."""
    import struct
    import time
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "F32")
    f = gguf.GGUFReader(g).fields["tokenizer.ggml.tokens"]
    klen = struct.unpack_from("<Q", g.read_bytes(), f.offset)[0]
    count_at = f.offset + 8 + klen + 4 + 4                      # key, value type, element type, count
    bad = tmp_path / "bad.gguf"
    for n in (2**20 + 1, 2**31, 2**62, 2**64 - 1):
        b = bytearray(g.read_bytes())
        struct.pack_into("<Q", b, count_at, n)
        bad.write_bytes(bytes(b))
        t0 = time.perf_counter()
        with pytest.raises(CheckpointError, match="damaged"):
            GGUFModel(bad)
        assert time.perf_counter() - t0 < 30


@pytest.mark.parametrize("move", ["zero", "plus1", "wrap", "next"])
def test_tensor_offsets_follow_ggml(ckpt, tmp_path, move):
    """Each tensor where ggml puts it (after the one before, aligned): an offset that overlaps, is unaligned
    or wraps around is refused, never read as weights."""
    import struct
    g = _write(ckpt, tmp_path / "m.gguf", ftype="F32")
    r = gguf.GGUFReader(g)
    i = next(k for k, t in enumerate(r.tensors) if t.name == "output_norm.bias")
    t, nxt = r.tensors[i], r.tensors[(i + 1) % len(r.tensors)]
    name_len, _, n_dims, *_ = t.field.parts
    at = t.field.offset + 8 + int(name_len[0]) + 4 + 8 * int(n_dims[0]) + 4       # its offset field
    old = struct.unpack_from("<Q", g.read_bytes(), at)[0]
    new = {"zero": 0, "plus1": old + 1, "wrap": 2**64 - 32, "next": nxt.data_offset - r.data_offset}[move]
    b = bytearray(g.read_bytes())
    struct.pack_into("<Q", b, at, new)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(b))
    with pytest.raises(CheckpointError):
        load_gguf_weights(bad)


@pytest.mark.parametrize("missing", ["merges", "tokens"])
def test_tokenizer_metadata_missing(ckpt_tiny, tmp_path, missing):
    """A tokenizer array the file does not have (gguf's writer drops an empty one) is named as missing."""
    tokens = [t for t, _ in sorted(json.loads((ckpt_tiny / "vocab.json").read_text()).items(), key=lambda kv: kv[1])]
    merges = [ln for ln in (ckpt_tiny / "merges.txt").read_text().split("\n") if ln and not ln.startswith("#")]

    def hook(w):
        w.add_tokenizer_model("gpt2")
        if missing != "tokens":
            w.add_token_list(tokens)
        if missing != "merges":
            w.add_token_merges(merges)
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "F32", tokenizer=False, hook=hook)
    with pytest.raises(TokenizerError, match=f"tokenizer.ggml.{missing} is missing"):
        GGUFModel(g).tokenizer()


@pytest.mark.parametrize("what", ["merge line break", "bool bos", "bool eos"])
def test_tokenizer_metadata_types(ckpt_tiny, tmp_path, what):
    tokens = [t for t, _ in sorted(json.loads((ckpt_tiny / "vocab.json").read_text()).items(), key=lambda kv: kv[1])]
    merges = [ln for ln in (ckpt_tiny / "merges.txt").read_text().split("\n") if ln and not ln.startswith("#")]

    def hook(w):
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        w.add_token_merges(merges[:10] + [merges[10] + "\n" + merges[11]] + merges[12:]
                           if what == "merge line break" else merges)
        if what != "merge line break":
            w.add_bool(f"tokenizer.ggml.{what[5:]}_token_id", True)
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "F32", tokenizer=False, hook=hook)
    with pytest.raises(TokenizerError, match="line break|token id|eos_token_id"):
        GGUFModel(g).tokenizer()


# ---------------------------------------------------------------------------------------------------
# llama.cpp's own converter, when its source is here (make llamacpp extracts it)

def _converter() -> Path | None:
    env = os.environ.get("LLAMACPP_DIR")
    base = Path(env) if env else ROOT / ".cache" / "llamacpp"
    found = sorted(glob.glob(str(base / "src-*" / "convert_hf_to_gguf.py")))
    return Path(found[-1]) if found else None


@pytest.mark.parametrize("outtype,dtype", [("f32", "f32"), ("q8_0", "q8_0")])
def test_llamacpp_converter(ckpt_tiny, tmp_path, outtype, dtype):
    conv = _converter()
    if conv is None:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py is not here (make llamacpp extracts it)")
    out = tmp_path / f"m-{outtype}.gguf"
    env = {**os.environ, "PYTHONPATH": str(conv.parent / "gguf-py"),
           "TQDM_DISABLE": "1"}
    p = subprocess.run([sys.executable, str(conv), str(ckpt_tiny), "--outtype", outtype, "--outfile", str(out)],
                       capture_output=True, text=True, env=env, cwd=conv.parent, timeout=600)
    if p.returncode != 0:
        pytest.skip(f"the converter failed here: {p.stderr.strip()[-300:]}")
    w = load_gguf_weights(out)
    assert w.dtype == dtype
    assert_same_weights(w, load_weights(ckpt_tiny, dtype))
    from gpt2asm.tokenizer import Tokenizer
    tok, ref = GGUFModel(out).tokenizer(), Tokenizer.from_dir(ckpt_tiny, cache_dir=False)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encoder == ref.encoder and tok.ranks == ref.ranks and tok.eot_id == ref.eot_id


def _quantizer() -> Path | None:
    """llama-quantize of make llamacpp's build, if there."""
    env = os.environ.get("LLAMACPP_DIR")
    base = Path(env) if env else ROOT / ".cache" / "llamacpp"
    found = sorted(glob.glob(str(base / "build-*" / "bin" / "llama-quantize")))
    return Path(found[-1]) if found else None


def test_llamacpp_quantize_q4_0(ckpt_tiny, tmp_path):
    """llama-quantize's Q4_0 of the converter's F32 GGUF loads to exactly the weights of --dtype q4_0 of the
    checkpoint: the same ints and scales in every block matrix (ggml's C reference quantizer = gguf.quants =
    quant0), and the output / token embedding in the same kind with the same blocks (Q6_K, or Q8_0 when the
    row length is not a multiple of 256: quant0.head_kind, as llama-quantize chooses)."""
    conv, quant = _converter(), _quantizer()
    if conv is None or quant is None:
        pytest.skip("llama.cpp's converter / llama-quantize are not here (make llamacpp builds them)")
    f32, q4 = tmp_path / "m-f32.gguf", tmp_path / "m-q4_0.gguf"
    env = {**os.environ, "PYTHONPATH": str(conv.parent / "gguf-py"), "TQDM_DISABLE": "1"}
    p = subprocess.run([sys.executable, str(conv), str(ckpt_tiny), "--outtype", "f32", "--outfile", str(f32)],
                       capture_output=True, text=True, env=env, cwd=conv.parent, timeout=600)
    if p.returncode != 0:
        pytest.skip(f"the converter failed here: {p.stderr.strip()[-300:]}")
    p = subprocess.run([str(quant), str(f32), str(q4), "Q4_0", "1"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-800:]
    got, want = load_gguf_weights(q4), load_weights(ckpt_tiny, "q4_0")
    assert got.dtype == "q4_0"
    assert_same_weights(got, want)


# ---------------------------------------------------------------------------------------------------
# warm start: load_gguf caches everything a cold load gives

def _tok_same(a, b) -> None:
    assert a.encoder == b.encoder and a.ranks == b.ranks and a.eot_id == b.eot_id
    assert a.decode_bytes(range(a.vocab_size)) == b.decode_bytes(range(b.vocab_size))


@pytest.mark.parametrize("ftype,dtype", [("Q8_0", None), ("Q8_0", "f32"), ("Q4_0", None), ("F16", "q8_0")])
def test_gguf_warm_equals_cold(ckpt_tiny, tmp_path, monkeypatch, ftype, dtype):
    import time
    from gpt2asm import tilecache as tc
    from gpt2asm.ggufload import load_gguf
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", ftype)
    m = GGUFModel(g)
    cold, ctok = m.weights(dtype), m.tokenizer()
    for want in ("built", "warm", "warm"):
        t0 = time.perf_counter()
        w, tok, info = load_gguf(g, dtype, tmp_path / "cache")
        assert info.status == want, info
        assert_same_weights(w, cold, tied=cold.tied_head)
        assert (w.source_dtype, w.path) == (cold.source_dtype, cold.path)
        _tok_same(tok, ctok)
    print(f"\nwarm GGUF {ftype} -> {w.dtype}: {time.perf_counter() - t0:.3f} s")
    assert not w.layers[0].fc_w.flags.writeable                       # mapped
    # the file changes: a new key, loaded cold again
    write_gguf(ckpt_tiny, g, ftype, output=True)
    w, tok, info = load_gguf(g, dtype, tmp_path / "cache")
    assert info.status == "built" and "stale" in info.reason and w.tied_head      # output.weight: a copy


def test_gguf_without_tokenizer(ckpt, tmp_path, monkeypatch):
    """GPT2.load needs the tokenizer from the metadata: without it, a TokenizerError and nothing cached."""
    from gpt2asm import tilecache as tc
    from gpt2asm.ggufload import load_gguf
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    g = write_gguf(ckpt, tmp_path / "m.gguf", "Q8_0", tokenizer=False)
    cdir = tmp_path / "cache"
    with pytest.raises(TokenizerError):
        load_gguf(g, "f32", cdir)
    assert not list(cdir.glob("*.tiles"))
    assert load_gguf_weights(g).dtype == "q8_0"              # the weights alone load


def test_gguf_cache_dtype_none_after_another_dtype(ckpt_tiny, tmp_path, monkeypatch):
    """A cache of a Q8_0 GGUF run as f32 is not what dtype None (the file's own, q8_0) takes."""
    from gpt2asm import tilecache as tc
    from gpt2asm.ggufload import load_gguf
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "Q8_0")
    cdir = tmp_path / "cache"
    assert load_gguf(g, "f32", cdir)[2].status == "built"
    w, _, info = load_gguf(g, None, cdir)
    assert w.dtype == "q8_0" and info.status == "built"
    for dt in (None, "f32"):
        w, _, info = load_gguf(g, dt, cdir)
        assert info.status == "warm" and w.dtype == (dt or "q8_0")


def test_gguf_corrupt_cache_is_rebuilt(ckpt_tiny, tmp_path, monkeypatch):
    from gpt2asm import tilecache as tc
    from gpt2asm.ggufload import load_gguf
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    g = write_gguf(ckpt_tiny, tmp_path / "m.gguf", "Q4_0")
    cdir = tmp_path / "cache"
    cold = load_gguf(g, None, cdir)[0]
    (f,) = cdir.glob("*.tiles")
    raw = bytearray(f.read_bytes())
    raw[-5000] ^= 0xFF                                        # in the data
    raw[200] ^= 0x01                                          # in the header
    f.write_bytes(bytes(raw))
    w, _, info = load_gguf(g, None, cdir)
    assert info.status == "built", info
    assert_same_weights(w, cold)
