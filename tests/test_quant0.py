"""gpt2asm/quant0.py: q8_0 / q4_0 weights equal gguf.quants (ggml's reference quantizers), tile as tests/q0ref.py,
and load / tile-cache as dtypes 'q8_0' / 'q4_0' (which the forward pass refuses until the kernels exist)."""
from __future__ import annotations

import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GQ  # noqa: E402
from gguf import quants  # noqa: E402

import q0ref  # noqa: E402
from gpt2asm import quant0 as Q  # noqa: E402
from gpt2asm import tilecache as tc  # noqa: E402
from gpt2asm.errors import CheckpointError, InvalidArgumentError, KernelUnavailableError  # noqa: E402
from gpt2asm.weights import load_weights  # noqa: E402
from make_checkpoint import make_checkpoint  # noqa: E402

KINDS = {"q8_0": GQ.Q8_0, "q4_0": GQ.Q4_0}
SMALL = dict(size="tiny", vocab=100, n_ctx=32, tokenizer_dir=False)


def bits(a) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def matrices(seed: int):
    """[n_out][n_in] float32 matrices with the cases a quantizer can get wrong."""
    rng = np.random.default_rng(seed)
    yield "normal", (rng.standard_normal((130, 96)) * 0.02).astype(np.float32)
    w = (rng.standard_normal((64, 64)) * 3).astype(np.float32)
    w[0] = 0                                         # all-zero blocks
    w[1, :32] = -0.0
    w[2, :32] = 5.0                                  # constant block
    w[3, 0], w[3, 1] = 7.0, -7.0                     # equal |x|, opposite signs: q4_0 takes the first
    w[4, 0], w[4, 1] = -7.0, 7.0
    w[5, :32] = np.arange(32) - 15.5                 # halves after scaling
    w[6, :32] = 0; w[6, 0] = 127; w[6, 1] = np.float32(0.49999997); w[6, 2] = -np.float32(0.49999997)
    w[6, 3:7] = [0.5, 1.5, 2.5, -2.5]                # q8_0 with d = 1: roundf's ties and its near-tie
    w[7, :32] = 1e-30                                # tiny but normal scale
    w[8] = 1e-40                                     # subnormal: 1/d overflows (q = 0 defined here)
    w[9, :32] = np.float32(65504 * 127 * 0.999)      # near the largest q8_0 scale
    yield "edges", w
    yield "outliers", np.where(rng.random((200, 128)) < 0.01, 50.0, 0.01 * rng.standard_normal((200, 128))
                               ).astype(np.float32)
    yield "fp16", (rng.standard_normal((70, 64)) * 0.1).astype(np.float16)
    yield "single", rng.standard_normal((1, 32)).astype(np.float32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantize_equals_gguf_quants(kind, seed):
    for what, w in matrices(seed):
        if kind == "q4_0" and what == "edges":
            w = w.copy(); w[9] = 1.0                 # 65504*127 overflows q4_0's scale (tested below)
        q, d = Q.quantize(w, kind)
        assert q.dtype == np.int8 and d.dtype == np.float16 and q.shape == w.shape
        with np.errstate(all="ignore"):             # gguf.quants on the subnormal row
            ref = quants.quantize(np.asarray(w, np.float32), KINDS[kind])
        mine = Q.to_ggml(q, d, kind)
        if what == "edges":                          # row 8: ggml's int8 conversion of inf/NaN is undefined
            keep = np.ones(w.shape[0], bool); keep[8] = False
            assert bits(mine[keep]) == bits(ref[keep]), (kind, what)
            assert (q[8] == 0).all() and (d[8] == 0).all()
        else:
            assert bits(mine) == bits(ref), (kind, what)
        q2, d2 = Q.from_ggml(ref, kind, w.shape[1])
        if what != "edges":
            assert bits(q2) == bits(q) and bits(d2) == bits(d)
        deq = Q.dequantize(q, d)
        assert bits(deq) == bits(quants.dequantize(mine, KINDS[kind]).reshape(w.shape).astype(np.float32))
        if kind == "q4_0":
            assert q.min() >= -8 and q.max() <= 7


def test_roundf_near_half():
    """0.49999997f: ggml's roundf gives 0; floor(x + 0.5) gives 1 (what q0ref did before)."""
    w = np.zeros((1, 32), np.float32)
    w[0, 0], w[0, 1], w[0, 2] = 127, np.float32(0.49999997), np.float32(-0.49999997)
    q, _ = Q.quantize(w, "q8_0")
    assert q[0, :3].tolist() == [127, 0, 0]
    assert q0ref.quantize_blocks_q8_0(w)[0][0, :3].tolist() == [127, 0, 0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_out", [1, 63, 64, 65, 130, 300])
def test_tile_equals_q0ref(kind, n_out):
    rng = np.random.default_rng(n_out)
    n_in = 96
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    q, d = Q.quantize(w, kind)
    rq, rd = (q0ref.quantize_blocks_q8_0 if kind == "q8_0" else q0ref.quantize_blocks_q4_0)(w)
    assert bits(q) == bits(rq) and bits(d) == bits(rd)
    t = Q.tile(q, d, kind)
    assert t.shape == Q.tiled_shape(n_out, n_in, kind) == (-(-n_out // 64), 3, q0ref.RECORD[kind])
    assert t.dtype == np.uint8 and t.flags.c_contiguous and t.ctypes.data % 64 == 0
    assert bits(t) == bits(q0ref.tile(q, d, kind))
    assert bits(Q.quantize_tiled(w, kind)) == bits(t)
    uq, ud = Q.untile(t, kind, n_out, n_in)
    assert bits(uq) == bits(q) and bits(ud) == bits(d)
    rq2, rd2 = q0ref.untile(t, kind, n_out, n_in)
    assert bits(rq2) == bits(q) and bits(rd2) == bits(d)
    # padding outputs: quants 0 (q4_0: nibble 8), scales +0.0
    if n_out % 64:
        last = t[-1]
        scales = last[:, :128].copy().view(np.uint16)[:, n_out % 64:]
        assert (scales == 0).all()
        pq, _ = Q.untile(t, kind, len(t) * 64, n_in)
        assert (pq[n_out:] == 0).all()


def test_matvec_of_tiled_weights_matches_q0ref():
    """The contract model computes the same outputs from our (q, d) as from its own."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((70, 64)).astype(np.float32)
    x = rng.standard_normal(64).astype(np.float32)
    xq, xd = q0ref.quantize_act(x)
    for kind in KINDS:
        q, d = Q.untile(Q.quantize_tiled(w, kind), kind, 70, 64)
        rq, rd = (q0ref.quantize_blocks_q8_0 if kind == "q8_0" else q0ref.quantize_blocks_q4_0)(w)
        assert bits(q0ref.matvec(q, d, xq, xd, None)) == bits(q0ref.matvec(rq, rd, xq, xd, None))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused(kind, bad):
    w = np.zeros((100, 64), np.float32)
    w[70, 40] = bad
    for fn in (Q.quantize, Q.quantize_tiled):
        with pytest.raises(InvalidArgumentError, match="output 70, input 40"):
            fn(w, kind)


@pytest.mark.parametrize("kind,big", [("q8_0", 65520.0 * 127), ("q4_0", 65520.0 * 8)])
def test_scale_beyond_float16_is_refused(kind, big):
    w = np.zeros((2, 32), np.float32)
    w[1, 3] = big
    with pytest.raises(InvalidArgumentError, match="beyond"):
        Q.quantize(w, kind)


@pytest.mark.parametrize("args", [((3, 33), "q8_0"), ((0, 32), "q8_0"), ((4,), "q4_0"), ((2, 32), "q5_0")])
def test_bad_arguments(args):
    shape, kind = args
    with pytest.raises(InvalidArgumentError):
        Q.quantize(np.zeros(shape, np.float32), kind)
    with pytest.raises(InvalidArgumentError):
        Q.quantize(np.zeros((2, 32), np.int32), "q8_0")


# ---------------------------------------------------------------------------------------------------
# weights: load_weights(dtype='q8_0' / 'q4_0'), the tile cache

@pytest.fixture
def ckpt(tmp_path):
    return make_checkpoint(tmp_path / "m", seed=3, layout="hub", **SMALL)


def _check_weights(w, src: dict, kind: str, cfg) -> None:
    """Every matrix is quantize(W.T) of the checkpoint, the head and wte q8_0 of wte."""
    C = cfg.n_embd
    mats = {"attn_w": ("attn.c_attn.weight", 3 * C, C), "attn_proj_w": ("attn.c_proj.weight", C, C),
            "fc_w": ("mlp.c_fc.weight", 4 * C, C), "proj_w": ("mlp.c_proj.weight", C, 4 * C)}
    for i, L in enumerate(w.layers):
        for f, (name, n_out, n_in) in mats.items():
            t = getattr(L, f)
            assert t.dtype == np.uint8 and t.shape == Q.tiled_shape(n_out, n_in, kind) and t.ctypes.data % 64 == 0
            q, d = Q.quantize(np.asarray(src[f"h.{i}.{name}"], np.float32).T, kind)
            assert bits(t) == bits(Q.tile(q, d, kind)), (i, f)
    q, d = Q.quantize(np.asarray(src["wte.weight"], np.float32), "q8_0")
    assert bits(w.head_w) == bits(Q.tile(q, d, "q8_0"))
    assert w.wte.dtype == np.float32 and bits(w.wte) == bits(Q.dequantize(q, d))
    assert bits(w.wte) == bits(quants.dequantize(Q.to_ggml(q, d, "q8_0"), GQ.Q8_0).reshape(w.wte.shape))
    assert not w.wte_is_mapped and w.dtype == kind


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stored", ["f32", "f16"])
def test_load_weights(tmp_path, kind, stored):
    from safetensors.numpy import load_file
    d = make_checkpoint(tmp_path / stored, seed=4, layout="hub", dtype=stored, **SMALL)
    w = load_weights(d, kind)
    _check_weights(w, load_file(d / "model.safetensors"), kind, w.config)
    f32 = load_weights(d, "f32")                    # the float tensors are the same as f32's
    assert bits(w.wpe) == bits(f32.wpe) and bits(w.layers[1].fc_b) == bits(f32.layers[1].fc_b)


@pytest.mark.parametrize("kind", KINDS)
def test_warm_equals_cold(ckpt, tmp_path, kind, monkeypatch):
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    cold = load_weights(ckpt, kind)
    for want in ("built", "warm"):
        w, info = tc.load_weights_info(ckpt, kind, tmp_path / "cache")
        assert info.status == want, info
        for i, L in enumerate(w.layers):
            for f in ("attn_w", "attn_proj_w", "fc_w", "proj_w", "ln1_g", "attn_b", "proj_b"):
                assert bits(getattr(L, f)) == bits(getattr(cold.layers[i], f)), (i, f)
        for f in ("head_w", "wte", "wpe", "ln_f_g", "ln_f_b"):
            assert bits(getattr(w, f)) == bits(getattr(cold, f)), f
        assert (w.dtype, w.wte_is_mapped, w.tied_head) == (kind, False, True)
    assert not w.layers[0].fc_w.flags.writeable and not w.wte.flags.writeable          # mapped
    assert len(list((tmp_path / "cache").glob(f"*.{kind}.*.tiles"))) == 1


def test_warm_start_124m(ckpt_124m, tmp_path, monkeypatch):
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    w, info = tc.load_weights_info(ckpt_124m, "q8_0", tmp_path)
    assert info.status == "built", info
    del w
    t0 = time.perf_counter()
    w, info = tc.load_weights_info(ckpt_124m, "q8_0", tmp_path)
    dt = time.perf_counter() - t0
    assert info.status == "warm", info
    print(f"\n124M q8_0: cold + cache write, then warm {dt:.3f} s")
    assert dt < 1.0                # ≤ 0.3 s on a quiet machine; loose on a shared one (no timed asserts)


@pytest.mark.parametrize("bad,match", [(np.nan, "non-finite"), (1e10, "beyond")])
def test_bad_checkpoint_values(tmp_path, bad, match):
    from safetensors.numpy import load_file, save_file
    d = make_checkpoint(tmp_path / "m", seed=5, layout="hub", **SMALL)
    t = load_file(d / "model.safetensors")
    t["h.1.mlp.c_fc.weight"][3, 5] = bad
    save_file(t, d / "model.safetensors")
    for kind in KINDS:
        with pytest.raises(CheckpointError, match=match):
            load_weights(d, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_forward_pass_refuses_without_the_plan_jobs(ckpt_tiny, kind, monkeypatch):
    """A kernel family whose executor does not run the q0 jobs (kernels.Q0_PLAN_FAMILIES) refuses the
    dtype by name -- never another dtype instead (the x86 families run them: tests/test_q0_model.py)."""
    from gpt2asm import GPT2, kernels
    monkeypatch.setattr(kernels, "Q0_PLAN_FAMILIES", ())
    with pytest.raises(KernelUnavailableError, match=f"gpt2asm_matvec_{kind}"):
        GPT2.load(ckpt_tiny, dtype=kind)


def test_cli_dtype_q8_0_is_a_clean_error(ckpt_tiny, capsys, monkeypatch):
    from gpt2asm import kernels
    from gpt2asm.__main__ import main
    monkeypatch.setattr(kernels, "Q0_PLAN_FAMILIES", ())
    assert main(["--model", str(ckpt_tiny), "--dtype", "q4_0", "-n", "2", "hi"]) == 2
    err = capsys.readouterr().err
    assert "q4_0" in err and "Traceback" not in err
