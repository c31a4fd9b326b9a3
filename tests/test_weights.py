"""Checkpoint writer (tools/make_checkpoint.py), config (gpt2asm/config.py) and loader (gpt2asm/weights.py)."""

import importlib.util
import json
import math
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpt2asm.config import GPT2Config, infer_config  # noqa: E402
from gpt2asm.errors import CheckpointError, InvalidArgumentError, ModelNotFoundError  # noqa: E402
from gpt2asm.weights import (Weights, load_weights, pad_vector, tile_head, tile_matrix)  # noqa: E402

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _import_tool():
    spec = importlib.util.spec_from_file_location("make_checkpoint", REPO / "tools" / "make_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mc = _import_tool()

SMALL = dict(size="tiny", vocab=100, n_ctx=32, tokenizer_dir=False)   # n_layer 2, n_embd 128, n_head 2
BLOCK_MATS = {"attn_w": "attn.c_attn.weight", "attn_proj_w": "attn.c_proj.weight",
              "fc_w": "mlp.c_fc.weight", "proj_w": "mlp.c_proj.weight"}
BLOCK_VECS = {"ln1_g": "ln_1.weight", "ln1_b": "ln_1.bias", "attn_b": "attn.c_attn.bias",
              "attn_proj_b": "attn.c_proj.bias", "ln2_g": "ln_2.weight", "ln2_b": "ln_2.bias",
              "fc_b": "mlp.c_fc.bias", "proj_b": "mlp.c_proj.bias"}


# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------

def bare(tensors: dict) -> dict:
    return {k.removeprefix("transformer."): v for k, v in tensors.items()}


def source(d: Path) -> dict:
    """The stored tensors as float32, bare names."""
    return {k: v.astype(np.float32) for k, v in bare(safetensors_numpy.load_file(d / "model.safetensors")).items()}


def read_st(path: Path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path: Path, header, data: bytes = b"", raw_header: bytes | None = None):
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def addr(a: np.ndarray) -> int:
    return a.ctypes.data


def check_tiled(tiled: np.ndarray, w: np.ndarray, dtype):
    """tiled[t][i][j] == W[i][64t+j], padding zero."""
    n_in, n_out = w.shape
    T = -(-n_out // 64)
    assert tiled.shape == (T, n_in, 64) and tiled.dtype == dtype
    assert tiled.flags.c_contiguous and addr(tiled) % 64 == 0
    padded = np.zeros((n_in, T * 64), np.float32)
    padded[:, :n_out] = w.astype(dtype).astype(np.float32)
    expect = padded.reshape(n_in, T, 64).transpose(1, 0, 2)
    np.testing.assert_array_equal(tiled.astype(np.float32), expect)
    # spot-check the defining formula element by element
    rng = np.random.default_rng(1)
    for _ in range(50):
        t, i, j = rng.integers(T), rng.integers(n_in), rng.integers(64)
        want = w[i, 64 * t + j].astype(dtype) if 64 * t + j < n_out else 0
        assert tiled[t, i, j] == want


@pytest.fixture(scope="module")
def small_ckpts(tmp_path_factory):
    """{(layout, stored dtype): dir} of small random checkpoints."""
    out = {}
    for layout in ("hf", "hub"):
        for dt in ("f32", "f16"):
            d = tmp_path_factory.mktemp(f"ck_{layout}_{dt}")
            mc.make_checkpoint(d, layout=layout, dtype=dt, seed=3, **SMALL)
            out[layout, dt] = d
    return out


@pytest.fixture
def ck(tmp_path, small_ckpts):
    """A fresh, modifiable copy of the small hf/f32 checkpoint."""
    d = tmp_path / "ck"
    shutil.copytree(small_ckpts["hf", "f32"], d)
    return d


def expect_error(path, *fragments, exc=CheckpointError, dtype="f32"):
    with pytest.raises(exc) as ei:
        load_weights(path, dtype)
    msg = str(ei.value)
    for f in fragments:
        assert f.lower() in msg.lower(), f"{f!r} not in {msg!r}"
    return msg


# ---------------------------------------------------------------------------------------------------
# writer
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["hf", "hub"])
def test_writer_names_shapes_and_config(small_ckpts, layout):
    d = small_ckpts[layout, "f32"]
    t = safetensors_numpy.load_file(d / "model.safetensors")
    if layout == "hf":
        assert all(k.startswith("transformer.") for k in t)
        assert "transformer.h.0.attn.c_attn.weight" in t and "transformer.wte.weight" in t
    else:
        assert not any(k.startswith("transformer.") for k in t)
        mask = t["h.1.attn.bias"]
        assert mask.shape == (1, 1, 32, 32) and mask.dtype == np.float32
        np.testing.assert_array_equal(mask[0, 0], np.tril(np.ones((32, 32), np.float32)))
    assert "lm_head.weight" not in t
    b = bare(t)
    assert b["wte.weight"].shape == (100, 128) and b["wpe.weight"].shape == (32, 128)
    assert b["h.0.attn.c_attn.weight"].shape == (128, 384) and b["h.1.mlp.c_proj.weight"].shape == (512, 128)
    # non-trivial biases and scales
    assert np.abs(b["h.0.attn.c_attn.bias"]).max() > 0 and np.abs(b["ln_f.weight"] - 1).max() > 0.05
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert (cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["n_positions"], cfg["n_ctx"], cfg["vocab_size"]) \
        == (2, 128, 2, 32, 32, 100)
    assert cfg["activation_function"] == "gelu_new" and cfg["layer_norm_epsilon"] == 1e-5
    assert cfg["gpt2asm_random_init"] is True
    from gpt2asm.files import is_random_init
    assert is_random_init(d)


def test_writer_deterministic_and_layout_independent(small_ckpts, tmp_path):
    mc.make_checkpoint(tmp_path / "again", layout="hf", dtype="f32", seed=3, **SMALL)
    a = (small_ckpts["hf", "f32"] / "model.safetensors").read_bytes()
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == a
    hf, hub = source(small_ckpts["hf", "f32"]), source(small_ckpts["hub", "f32"])
    for k, v in hf.items():
        np.testing.assert_array_equal(v, hub[k])
    f16 = source(small_ckpts["hf", "f16"])
    np.testing.assert_array_equal(f16["wte.weight"], hf["wte.weight"].astype(np.float16).astype(np.float32))
    mc.make_checkpoint(tmp_path / "other", layout="hf", dtype="f32", seed=4, **SMALL)
    assert not np.array_equal(source(tmp_path / "other")["wte.weight"], hf["wte.weight"])
    assert not list(tmp_path.glob("again/.*tmp*"))      # no temp files left behind


def test_writer_statistics(tmp_path):
    mc.make_checkpoint(tmp_path, size="tiny", n_layer=8, vocab=2000, n_ctx=64, tokenizer_dir=False)
    t = source(tmp_path)
    assert abs(t["wte.weight"].std() - 0.02) < 0.001
    assert abs(t["h.3.mlp.c_proj.weight"].std() - 0.02 / math.sqrt(16)) < 0.0005
    assert abs(t["h.3.ln_1.weight"].mean() - 1) < 0.03 and abs(t["h.3.ln_1.weight"].std() - 0.1) < 0.03


def test_writer_tokenizer_copy_and_bad_args(tmp_path, capsys):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.json").write_text('{"a": 0}')
    (tok / "merges.txt").write_text("#version: 0.2\n")
    out = mc.make_checkpoint(tmp_path / "m", size="tiny", vocab=64, n_ctx=8, tokenizer_dir=tok)
    assert (out / "vocab.json").read_text() == '{"a": 0}' and (out / "merges.txt").exists()
    assert "random" in capsys.readouterr().out.lower()
    (tok / "merges.txt").unlink()
    with pytest.raises(InvalidArgumentError, match="merges.txt"):
        mc.make_checkpoint(tmp_path / "m2", size="tiny", vocab=64, n_ctx=8, tokenizer_dir=tok)
    for kw in (dict(size="huge"), dict(layout="x"), dict(dtype="bf16"), dict(n_head=3), dict(n_ctx=0),
               dict(bogus=1)):
        with pytest.raises(InvalidArgumentError):
            mc.make_checkpoint(tmp_path / "m3", **{**dict(size="tiny", tokenizer_dir=False), **kw})


def test_writer_refuses_what_gpt2asm_would_not_load(tmp_path, tokenizer_dir, capsys):
    """The loader's rules at creation: head_dim 64 always, and a vocab holding the tokenizer's tokens when the
    checkpoint carries one (a smaller vocab without a tokenizer is fine: load_weights reads it).  One line,
    status 2, nothing written (such checkpoints were written, then refused by gpt2asm)."""
    for args, frag in ((["--vocab", "1000", "--tokenizer", str(tokenizer_dir)], "50257"),
                       (["--n-head", "4", "--no-tokenizer"], "head_dim"),
                       (["--n-embd", "256", "--no-tokenizer"], "head_dim")):
        out = tmp_path / "bad"
        assert mc.main(["--out", str(out), "--size", "tiny", "--n-ctx", "16", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("make_checkpoint.py: error: ") and err.count("\n") == 1 and frag in err, err
        assert not out.exists()
    with pytest.raises(InvalidArgumentError, match="endoftext"):
        tok = tmp_path / "tok"
        tok.mkdir()
        (tok / "vocab.json").write_text('{"a": 0, "<|endoftext|>": 70}')
        (tok / "merges.txt").write_text("#version: 0.2\n")
        mc.make_checkpoint(tmp_path / "m", size="tiny", vocab=64, n_ctx=8, tokenizer_dir=tok)
    assert mc.main(["--out", str(tmp_path / "ok"), "--size", "tiny", "--n-ctx", "16", "--vocab", "1000",
                    "--no-tokenizer"]) == 0
    assert load_weights(tmp_path / "ok").config == GPT2Config(2, 128, 2, 16, 1000)


def test_writer_cli(tmp_path):
    assert mc.main(["--out", str(tmp_path), "--size", "tiny", "--vocab", "64", "--n-ctx", "16",
                    "--layout", "hub", "--dtype", "f16", "--no-tokenizer", "--seed", "5"]) == 0
    w = load_weights(tmp_path)
    assert w.config == GPT2Config(2, 128, 2, 16, 64) and w.source_dtype == "F16"


# ---------------------------------------------------------------------------------------------------
# round trip
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("engine_dtype", ["f32", "f16"])
@pytest.mark.parametrize("layout,stored", [("hf", "f32"), ("hf", "f16"), ("hub", "f32"), ("hub", "f16")])
def test_round_trip(small_ckpts, layout, stored, engine_dtype):
    d = small_ckpts[layout, stored]
    src = source(d)
    w = load_weights(d, engine_dtype)
    assert isinstance(w, Weights)
    assert w.config == GPT2Config(n_layer=2, n_embd=128, n_head=2, n_ctx=32, vocab_size=100)
    assert w.config.head_dim == 64
    assert w.dtype == engine_dtype and w.n_vocab_padded == 128 and w.head_b is None and w.tied_head
    assert w.source_dtype == {"f32": "F32", "f16": "F16"}[stored]
    mdt = {"f32": np.float32, "f16": np.float16}[engine_dtype]

    np.testing.assert_array_equal(w.wte, src["wte.weight"])
    np.testing.assert_array_equal(w.wpe, src["wpe.weight"])
    np.testing.assert_array_equal(w.ln_f_g, src["ln_f.weight"])
    np.testing.assert_array_equal(w.ln_f_b, src["ln_f.bias"])
    check_tiled(w.head_w, src["wte.weight"].T, mdt)
    assert w.head_w.shape == (2, 128, 64)
    assert not w.head_w[1, :, 36:].any()                       # vocab 100 -> rows 100..127 are zero

    assert len(w.layers) == 2
    for i, layer in enumerate(w.layers):
        for attr, name in BLOCK_MATS.items():
            check_tiled(getattr(layer, attr), src[f"h.{i}.{name}"], mdt)
        for attr, name in BLOCK_VECS.items():
            v = getattr(layer, attr)
            assert v.dtype == np.float32
            np.testing.assert_array_equal(v, src[f"h.{i}.{name}"])

    arrays = [w.wte, w.wpe, w.ln_f_g, w.ln_f_b, w.head_w]
    arrays += [a for layer in w.layers for a in vars(layer).values() if a is not None]
    for a in arrays:
        assert a.flags.c_contiguous and addr(a) % 64 == 0
    for a in [w.wte, w.wpe, w.ln_f_g, w.ln_f_b]:
        assert a.dtype == np.float32
    if w.wte_is_mapped:                                         # zero-copy view of the file: read-only
        assert stored == "f32" and not w.wte.flags.writeable


def test_bad_dtypes(small_ckpts):
    d = small_ckpts["hf", "f32"]
    for bad in ("q4", "F32", None, np.int8):
        with pytest.raises(InvalidArgumentError, match="'f32', 'f16', 'q8_0' or 'q4_0'"):
            load_weights(d, bad)
    for old in ("q8", "int8"):                                   # retired (docs/notes.md): named successor
        with pytest.raises(InvalidArgumentError, match=f"dtype '{old}' was retired: use 'q8_0'"):
            load_weights(d, old)
    with pytest.raises(InvalidArgumentError):
        tile_matrix(np.ones((4, 64), np.float32), "q8_0")        # records come from gpt2asm.quant0 only


def test_load_file_path_and_inferred_config(ck):
    w = load_weights(ck / "model.safetensors")
    assert w.config.n_ctx == 32
    (ck / "config.json").unlink()
    w2 = load_weights(ck)
    assert w2.config == w.config                                # inferred: n_head = 128 // 64
    np.testing.assert_array_equal(w2.head_w, w.head_w)


def test_explicit_lm_head(ck):
    t = safetensors_numpy.load_file(ck / "model.safetensors")
    lm = np.random.default_rng(9).standard_normal((100, 128)).astype(np.float32)
    safetensors_numpy.save_file({**t, "lm_head.weight": lm}, ck / "model.safetensors")
    w = load_weights(ck)
    assert not w.tied_head
    check_tiled(w.head_w, lm.T, np.float32)
    np.testing.assert_array_equal(w.wte, t["transformer.wte.weight"])     # embeddings still from wte
    cfg = json.loads((ck / "config.json").read_text())
    for tie in (True, False):                    # the file's head either way, as transformers 5 loads it
        (ck / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": tie}))
        w = load_weights(ck)
        assert not w.tied_head and w.config.tie_word_embeddings is tie
        check_tiled(w.head_w, lm.T, np.float32)
    safetensors_numpy.save_file({**t, "lm_head.weight": lm[:, :64].copy()}, ck / "model.safetensors")
    expect_error(ck, "lm_head.weight", "[100, 64]", "[100, 128]")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_in_f16_file(tmp_path, small_ckpts, bad):
    t = safetensors_numpy.load_file(small_ckpts["hub", "f16"] / "model.safetensors")
    shutil.copy(small_ckpts["hub", "f16"] / "config.json", tmp_path)
    w = t["h.0.mlp.c_fc.weight"].copy()
    w[10, 20] = bad
    safetensors_numpy.save_file({**t, "h.0.mlp.c_fc.weight": w}, tmp_path / "model.safetensors")
    expect_error(tmp_path, "h.0.mlp.c_fc.weight", "1 non-finite", "[10, 20]")


def test_bf16(ck):
    t = source(ck)
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in t.items()}   # truncate to bf16
    header, data, off = {}, [], 0
    for k, b in bits.items():
        raw = b.tobytes()
        header[k] = {"dtype": "BF16", "shape": list(b.shape), "data_offsets": [off, off + len(raw)]}
        data.append(raw)
        off += len(raw)
    write_st(ck / "model.safetensors", header, b"".join(data))
    w = load_weights(ck)
    want = (bits["h.1.mlp.c_fc.weight"].astype(np.uint32) << 16).view(np.float32)
    check_tiled(w.layers[1].fc_w, want, np.float32)
    assert w.source_dtype == "BF16" and not w.wte_is_mapped
    bits["ln_f.bias"][3] = 0x7FC0                                                  # bf16 NaN
    write_st(ck / "model.safetensors", header, b"".join(b.tobytes() for b in bits.values()))
    expect_error(ck, "ln_f.bias", "non-finite")


def test_tile_functions():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((70, 100)).astype(np.float32)           # out = 100: one full + one partial tile
    for dt in (np.float32, np.float16, "f16"):
        want = np.dtype(np.float16 if dt == "f16" else dt)
        check_tiled(tile_matrix(w, dt), w, want)
    e = rng.standard_normal((130, 64)).astype(np.float32)           # head: V=130, C=64
    np.testing.assert_array_equal(tile_head(e), tile_matrix(e.T))
    h = tile_head(e, np.float16)
    assert h.shape == (3, 64, 64) and h.dtype == np.float16 and addr(h) % 64 == 0
    assert h[2, 5, 1] == np.float16(e[129, 5]) and not h[2, :, 2:].any()
    x = np.float32(1 + 2 ** -11)                                    # halfway between two f16: ties to even
    assert tile_matrix(np.full((1, 64), x), np.float16)[0, 0, 0] == np.float16(1.0)
    v = pad_vector(np.arange(5, dtype=np.float16), 64)
    assert v.shape == (64,) and v.dtype == np.float32 and addr(v) % 64 == 0
    assert list(v[:6]) == [0, 1, 2, 3, 4, 0] and not v[5:].any()
    assert pad_vector(np.ones(70)).shape == (128,)
    with pytest.raises(InvalidArgumentError):
        pad_vector(np.ones(10), 5)
    with pytest.raises(InvalidArgumentError):
        tile_matrix(w, np.float64)
    with pytest.raises(InvalidArgumentError):
        tile_matrix(np.ones(5), np.float32)


# ---------------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------------

def test_config_from_json_and_aliases(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"num_hidden_layers": 3, "hidden_size": 256, "num_attention_heads": 4,
                             "max_position_embeddings": 64, "vocab_size": 1000}))
    assert GPT2Config.from_json(p) == GPT2Config(3, 256, 4, 64, 1000)
    p.write_text(json.dumps({"n_layer": 3, "n_embd": 256, "n_head": 4, "n_ctx": 50, "vocab_size": 1000}))
    assert GPT2Config.from_json(p).n_ctx == 50
    p.write_text(json.dumps({"n_layer": 3, "n_embd": 256, "hidden_size": 256, "n_head": 4, "n_positions": 64,
                             "n_ctx": 1024, "vocab_size": 1000, "architectures": ["GPT2LMHeadModel"]}))
    assert GPT2Config.from_json(p) == GPT2Config(3, 256, 4, 64, 1000)     # agreeing aliases; n_ctx unused
    for bad, frag in [({"n_layer": 3, "n_embd": 256, "n_positions": 64, "vocab_size": 9}, "n_head"),
                      ({"n_layer": 3, "n_embd": 256, "n_head": 4, "n_positions": 64}, "vocab_size"),
                      ({"n_layer": 3, "n_embd": 256, "n_head": 8, "n_positions": 64, "vocab_size": 9}, "head_dim"),
                      ({"n_layer": 0, "n_embd": 256, "n_head": 4, "n_positions": 64, "vocab_size": 9}, "positive"),
                      ({"n_layer": "3", "n_embd": 256, "n_head": 4, "n_positions": 64, "vocab_size": 9}, "integer"),
                      ({"n_layer": 3, "n_embd": 256, "n_head": 4, "n_positions": 1 << 17, "vocab_size": 9}, "n_ctx"),
                      ({"n_layer": 3, "n_embd": 256, "n_head": 4, "n_positions": 64, "vocab_size": 2 ** 21},
                       "vocab"),
                      ({"n_layer": 3, "n_embd": 256, "n_head": 4, "n_positions": 64, "vocab_size": 9,
                        "activation_function": "relu"}, "activation"),
                      ({"n_layer": 3, "n_embd": 256, "n_head": 4, "n_positions": 64, "vocab_size": 9,
                        "model_type": "llama"}, "model_type"),
                      ({"n_layer": 3, "n_embd": 256, "n_head": 4, "n_positions": 64, "vocab_size": 9,
                        "architectures": ["LlamaForCausalLM"]}, "architectures"),
                      ({"n_layer": 3, "n_embd": 256, "n_head": 4, "n_positions": 64, "vocab_size": 9,
                        "hidden_size": 512}, "n_embd=256 and hidden_size=512 disagree"),
                      ({"n_layer": 3, "num_hidden_layers": 2, "n_embd": 256, "n_head": 4, "n_positions": 64,
                        "vocab_size": 9}, "disagree"),
                      ([1, 2], "object")]:
        p.write_text(json.dumps(bad))
        with pytest.raises(CheckpointError, match=frag):
            GPT2Config.from_json(p)
    p.write_text("{not json")
    with pytest.raises(CheckpointError, match="JSON"):
        GPT2Config.from_json(p)
    with pytest.raises(CheckpointError, match="head_dim 64"):
        GPT2Config(1, 96, 3, 8, 8)


def test_infer_config():
    shapes = {"transformer.wte.weight": (50257, 768), "transformer.wpe.weight": (1024, 768)}
    shapes.update({f"transformer.h.{i}.ln_1.weight": (768,) for i in range(12)})
    assert infer_config(shapes) == GPT2Config(12, 768, 12, 1024, 50257)
    with pytest.raises(CheckpointError, match="h.3"):
        infer_config({k: v for k, v in shapes.items() if ".h.3." not in k})
    with pytest.raises(CheckpointError, match="config.json"):
        infer_config({"wte.weight": (10, 96), "wpe.weight": (8, 96), "h.0.ln_1.weight": (96,)})


# ---------------------------------------------------------------------------------------------------
# validation errors
# ---------------------------------------------------------------------------------------------------

def test_missing_files(tmp_path):
    expect_error(tmp_path / "nope", "no such", exc=ModelNotFoundError)
    expect_error(tmp_path, "model.safetensors", exc=ModelNotFoundError)
    with pytest.raises(InvalidArgumentError):
        load_weights(tmp_path, "f64")


def test_structural_errors(ck):
    f = ck / "model.safetensors"
    header, data = read_st(f)
    good = dict(header)
    name = "transformer.h.0.ln_1.bias"
    b0, e0 = header[name]["data_offsets"]

    f.write_bytes(b"")
    expect_error(ck, "empty")
    f.write_bytes(b"\x05\x00\x00")
    expect_error(ck, "too short")
    write_st(f, good, data[:-100])                      # truncated data
    expect_error(ck, "beyond", "truncated")
    f.write_bytes(struct.pack("<Q", 10_000) + b"{}")
    expect_error(ck, "header length 10000", "beyond the end")
    f.write_bytes(struct.pack("<Q", 1 << 60) + b"{}" * 10)
    expect_error(ck, "absurd")
    write_st(f, None, data, raw_header=b'{"a": \xff\xfe}')
    expect_error(ck, "UTF-8")
    write_st(f, None, data, raw_header=b'{"transformer.wte.weight": {')
    expect_error(ck, "not valid JSON")
    write_st(f, [1, 2], data)
    expect_error(ck, "JSON object")
    write_st(f, None, data, raw_header=json.dumps(good).encode()[:-1] + b', "' + name.encode() + b'": '
             + json.dumps(good[name]).encode() + b"}")
    expect_error(ck, "duplicate", name)
    write_st(f, {**good, "__metadata__": "x"}, data)
    expect_error(ck, "__metadata__")

    def with_entry(**changes):
        e = {**good[name], **changes}
        for k, v in list(e.items()):
            if v is None:
                del e[k]
        write_st(f, {**good, name: e}, data)

    with_entry(dtype=None)
    expect_error(ck, name, "dtype")
    with_entry(shape=None)
    expect_error(ck, name, "shape")
    with_entry(data_offsets=None)
    expect_error(ck, name, "data_offsets")
    with_entry(data_offsets=[b0, float(e0)])
    expect_error(ck, name, "integers")
    with_entry(data_offsets=[b0, "x"])
    expect_error(ck, name, "integers")
    with_entry(data_offsets=[-4, e0])
    expect_error(ck, name, "non-negative")
    with_entry(data_offsets=[e0, b0])
    expect_error(ck, name, "end", "< begin")
    with_entry(data_offsets=[len(data) - 256, len(data) + 256])
    expect_error(ck, name, "beyond")
    with_entry(data_offsets=[b0, e0 - 4])
    expect_error(ck, name, "needs 512")
    with_entry(shape=[129])
    expect_error(ck, name, "needs 516")
    with_entry(shape=[-128])
    expect_error(ck, name, "shape")
    other = "transformer.h.0.ln_1.weight"
    with_entry(data_offsets=list(good[other]["data_offsets"]))
    expect_error(ck, "overlap", name, other)
    with_entry(dtype="Q7")
    expect_error(ck, name, "unknown dtype")
    with_entry(dtype="I32")
    expect_error(ck, name, "I32", "F32, F16, BF16")
    with_entry(dtype="F64", shape=[64])
    expect_error(ck, name, "F64")


def test_tensor_set_errors(ck):
    t = safetensors_numpy.load_file(ck / "model.safetensors")
    f = ck / "model.safetensors"

    def save(d):
        safetensors_numpy.save_file(d, f)

    save({**t, "wte.weight": t["transformer.wte.weight"]})
    expect_error(ck, "stored twice", "transformer.wte.weight")
    save({k: v for k, v in t.items() if k != "transformer.h.1.mlp.c_fc.bias"})
    expect_error(ck, "missing tensor", "h.1.mlp.c_fc.bias")
    save({**t, "transformer.h.0.attn.extra": np.zeros(3, np.float32), "score.weight": np.zeros(3, np.float32)})
    expect_error(ck, "unexpected tensor", "h.0.attn.extra", "score.weight")
    save({**t, "transformer.h.0.mlp.c_fc.weight": np.zeros((512, 128), np.float32)})
    expect_error(ck, "wrong shape", "h.0.mlp.c_fc.weight", "[512, 128]", "[128, 512]")
    save({**t, "transformer.h.2.ln_1.weight": np.zeros(128, np.float32)})
    expect_error(ck, "n_layer=2", "h.2")
    save({**t, "transformer.h.0.attn.bias": np.zeros((1, 1, 32, 32), np.uint8),
         "h.1.attn.masked_bias": np.zeros((), np.float32)})
    load_weights(ck)                                       # mask buffers of any dtype are ignored
    bad = t["transformer.h.1.attn.c_proj.weight"].copy()
    bad[3, 7] = np.nan
    save({**t, "transformer.h.1.attn.c_proj.weight": bad})
    expect_error(ck, "h.1.attn.c_proj.weight", "non-finite", "[3, 7]")
    bad = t["transformer.ln_f.bias"].copy()
    bad[5] = -np.inf
    save({**t, "transformer.ln_f.bias": bad})
    expect_error(ck, "ln_f.bias", "non-finite")
    big = t["transformer.h.0.mlp.c_fc.weight"].copy()
    big[0, 0] = 1e6
    save({**t, "transformer.h.0.mlp.c_fc.weight": big})
    assert load_weights(ck, "f32").layers[0].fc_w[0, 0, 0] == 1e6
    expect_error(ck, "float16", dtype="f16")


def test_config_errors(ck):
    cfg = json.loads((ck / "config.json").read_text())
    p = ck / "config.json"
    p.write_text(json.dumps({k: v for k, v in cfg.items() if k not in ("n_head",)}))
    expect_error(ck, "missing field", "n_head")
    p.write_text(json.dumps({k: v for k, v in cfg.items() if k not in ("n_positions", "n_ctx")}))
    expect_error(ck, "missing field", "n_positions")
    p.write_text("{")
    expect_error(ck, "config.json", "JSON")
    p.write_text(json.dumps({**cfg, "n_embd": 256, "n_head": 4}))
    expect_error(ck, "wrong shape", "wte.weight", "[100, 256]")
    p.write_text(json.dumps({**cfg, "n_layer": 3}))
    expect_error(ck, "missing tensor", "h.2.")
    p.write_text(json.dumps({**cfg, "n_head": 4}))
    expect_error(ck, "head_dim", "64")
    p.write_text(json.dumps({**cfg, "tie_word_embeddings": False}))     # no lm_head.weight in the file
    expect_error(ck, "tie_word_embeddings=false", "no lm_head.weight")
    p.write_text(json.dumps({**cfg, "tie_word_embeddings": "yes"}))
    expect_error(ck, "tie_word_embeddings must be true or false", "'yes'")
    p.write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    assert load_weights(ck).tied_head


# ---------------------------------------------------------------------------------------------------
# transformers agrees on the checkpoint
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["hf", "hub"])
def test_transformers_loads_checkpoint(tmp_path, layout):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = tmp_path / layout
    mc.make_checkpoint(d, size="tiny", layout=layout, seed=11, tokenizer_dir=False)
    try:
        model = transformers.GPT2LMHeadModel.from_pretrained(d, dtype=torch.float32)
    except TypeError:                                   # transformers < 4.56 spells it torch_dtype
        model = transformers.GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.float32)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    src = source(d)
    w = load_weights(d)
    assert model.config.n_layer == w.config.n_layer == 2 and model.config.vocab_size == 50257
    for k, v in src.items():
        if k.endswith("attn.bias"):
            continue
        np.testing.assert_array_equal(sd["transformer." + k], v, err_msg=k)
    np.testing.assert_array_equal(sd["lm_head.weight"], src["wte.weight"])   # tied
    np.testing.assert_array_equal(sd["transformer.wte.weight"], w.wte)
    for i, layer in enumerate(w.layers):
        check_tiled(layer.attn_w, sd[f"transformer.h.{i}.attn.c_attn.weight"], np.float32)
        np.testing.assert_array_equal(layer.ln2_g, sd[f"transformer.h.{i}.ln_2.weight"])
    check_tiled(w.head_w, sd["lm_head.weight"].T, np.float32)
