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


# ---------------------------------------------------------------------------------------------------
# q6_k: llama.cpp's Q6_K (quantize_row_q6_K_ref), the head of q4_0 models

F = np.float32


def _f32_bits(v) -> int:
    return int(np.array(v, np.float32).view(np.uint32))


def _ref_nearest_int(v) -> int:
    """ggml's nearest_int: the bits of v + 12582912.0f."""
    return (_f32_bits(F(v) + F(12582912.0)) & 0x7FFFFF) - 0x400000


def _ref_fp32_to_fp16(f) -> int:
    """ggml_compute_fp32_to_fp16 (ggml-impl.h), transliterated: binary16 bits."""
    base = (F(abs(f)) * F(2.0 ** 112)) * F(2.0 ** -110)
    w = _f32_bits(f)
    shl1_w = (w + w) & 0xFFFFFFFF
    sign = w & 0x80000000
    bias = max(shl1_w & 0xFF000000, 0x71000000)
    base = np.array((bias >> 1) + 0x07800000, np.uint32).view(np.float32)[()] + base
    b = _f32_bits(base)
    nonsign = ((b >> 13) & 0x7C00) + (b & 0x0FFF)
    return ((sign >> 16) | (0x7E00 if shl1_w > 0xFF000000 else nonsign)) & 0xFFFF


def _ref_make_qx_quants(x) -> tuple[np.float32, list[int]]:
    """make_qx_quants(16, 32, x, L, 1, NULL), one C statement at a time on binary32 scalars."""
    n, nmax = 16, 32
    mx, amax = F(0), F(0)
    for i in range(n):
        ax = F(abs(x[i]))
        if ax > amax:
            amax, mx = ax, x[i]
    if amax < F(1e-15):
        return F(0), [0] * n
    iscale = F(-nmax) / mx
    L = [0] * n
    sumlx = suml2 = F(0)
    for i in range(n):
        l = max(-nmax, min(nmax - 1, _ref_nearest_int(iscale * x[i])))
        L[i] = l + nmax
        w = x[i] * x[i]
        sumlx = sumlx + w * x[i] * F(l)
        suml2 = suml2 + w * F(l) * F(l)
    scale = sumlx / suml2 if suml2 else F(0)
    best = scale * sumlx
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        iscale = -(F(nmax) + F(0.1) * F(is_)) / mx
        sumlx = suml2 = F(0)
        for i in range(n):
            l = max(-nmax, min(nmax - 1, _ref_nearest_int(iscale * x[i])))
            w = x[i] * x[i]
            sumlx = sumlx + w * x[i] * F(l)
            suml2 = suml2 + w * F(l) * F(l)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            L = [nmax + max(-nmax, min(nmax - 1, _ref_nearest_int(iscale * x[i]))) for i in range(n)]
            scale = sumlx / suml2
            best = scale * sumlx
    return scale, L


def _ref_q6k_block(x) -> tuple[list[int], list[int], int]:
    """quantize_row_q6_K_ref of one super-block of 256 binary32 -> (q = L - 32, sc, d's binary16 bits)."""
    x = [F(v) for v in x]
    with np.errstate(all="ignore"):
        L, scales = [], []
        for ib in range(16):
            s, Lb = _ref_make_qx_quants(x[16 * ib:16 * ib + 16])
            scales.append(s)
            L += Lb
        max_scale = max_abs = F(0)
        for s in scales:
            if F(abs(s)) > max_abs:
                max_abs, max_scale = F(abs(s)), s
        if max_abs < F(1e-15):
            return [-32] * 256, [0] * 16, 0
        iscale = F(-128.0) / max_scale
        dbits = _ref_fp32_to_fp16(F(1) / iscale)
        sc = [(min(127, _ref_nearest_int(iscale * s)) + 128) % 256 - 128 for s in scales]
        dh = F(np.array(dbits, np.uint16).view(np.float16)[()])
        for j in range(16):
            d = dh * F(sc[j])
            if not d:
                continue
            for ii in range(16):
                L[16 * j + ii] = max(-32, min(31, _ref_nearest_int(x[16 * j + ii] / d))) + 32
    return [v - 32 for v in L], sc, dbits


def _adversarial_subblocks(rng, n_super: int) -> np.ndarray:
    """[n_super][256] float32: super-blocks of 16 sub-blocks of assorted hard kinds."""
    out = np.zeros((n_super * 16, 16), np.float32)
    for s in range(len(out)):
        kind = rng.integers(14)
        g = rng.standard_normal(16)
        if kind == 0:
            v = g * 10.0 ** rng.integers(-6, 4)
        elif kind == 1:                                  # max -32: iscale 1, x on halves -> ties
            v = rng.integers(-64, 64, 16) / 2.0; v[rng.integers(16)] = -32
        elif kind == 2:                                  # ties with a power-of-two scale
            v = (rng.integers(-63, 64, 16) / 2.0) * 2.0 ** rng.integers(-8, 8)
        elif kind == 3:                                  # all zero / signed zeros
            v = np.where(g > 0, 0.0, -0.0)
        elif kind == 4:                                  # around GROUP_MAX_EPS
            v = g * 1e-15
        elif kind == 5:                                  # tiny and subnormal
            v = g * 1e-40; v[0] = 2e-14
        elif kind == 6:                                  # equal |max|, opposite signs
            v = g * 0.1; v[3], v[9] = 1.5, -1.5
            if rng.random() < 0.5:
                v[3], v[9] = -1.5, 1.5
        elif kind == 7:                                  # negative max, mostly positive
            v = np.abs(g); v[rng.integers(16)] = -3 * np.abs(g).max() - 0.1
        elif kind == 8:                                  # constant
            v = np.full(16, g[0])
        elif kind == 9:                                  # one huge value
            v = g * 0.01; v[rng.integers(16)] = 1000.0 * np.sign(g[0])
        elif kind == 10:                                 # large: sumlx*sumlx overflows binary32
            v = g * 1e5
        elif kind == 11:                                 # much smaller than the neighbours: sc 0, L kept
            v = g * 1e-4
        elif kind == 12:                                 # integers in -40..40
            v = rng.integers(-40, 41, 16).astype(np.float64)
        else:                                            # sparse
            v = np.where(rng.random(16) < 0.2, g, 0.0)
        out[s] = v
    return out.reshape(n_super, 256)


def test_quantize_q6k_equals_scalar_transliteration():
    """The vectorised quantizer vs a statement-by-statement transliteration of ggml's C on binary32 scalars,
    on 480 sub-blocks of hard kinds (ties, tiny, zero, signed zeros, mixed signs, equal |max|, overflowing
    sums, the !d path)."""
    rng = np.random.default_rng(6)
    x = _adversarial_subblocks(rng, 30)
    x[0] = 0                                             # an all-zero super-block
    x[1, :16] *= 1e4                                     # the others' sc 0: L stays make_qx_quants'
    w = x.reshape(6, 1280)
    q, sc, d = Q.quantize_q6k(w)
    assert q.dtype == np.int8 and sc.dtype == np.int8 and d.dtype == np.float16
    assert q.shape == (6, 1280) and sc.shape == (6, 80) and d.shape == (6, 5)
    q, sc, d = q.reshape(30, 256), sc.reshape(30, 16), d.reshape(30)
    kept = 0
    for b in range(30):
        rq, rsc, rd = _ref_q6k_block(x[b])
        assert q[b].tolist() == rq and sc[b].tolist() == rsc and int(d[b:b + 1].view(np.uint16)[0]) == rd, b
        kept += sum(1 for j in range(16) if rsc[j] == 0 and rd and any(v != -32 for v in rq[16 * j:16 * j + 16]))
    assert kept > 0                                      # the `if (!d) continue;` path was exercised


def test_ref_fp16_conversion_is_nearest_even():
    """The transliterated GGML_FP32_TO_FP16 agrees with numpy's (what quantize_q6k uses) on hard values."""
    rng = np.random.default_rng(7)
    v = np.concatenate([rng.standard_normal(300) * 10.0 ** rng.integers(-9, 5, 300),
                        [0, -0.0, 6e-8, 2.98e-8, 2.9802322e-08, 65504, 65519.99, 1e-5, 6.1035156e-05]]).astype(F)
    h = np.array([_ref_fp32_to_fp16(t) for t in v], np.uint16)
    assert bits(h) == bits(v.astype(np.float16))


def _wte_and_gguf_q6k():
    """(the checkpoint's wte float32, llama-quantize's token_embd Q6_K bytes) of make llamacpp's Q4_0 GGUF of
    models/random-124M, or skip."""
    import llamacpp
    from pathlib import Path
    model = Path(__file__).resolve().parent.parent / "models" / "random-124M"
    g = llamacpp.converted(model, "Q4_0") if (model / "model.safetensors").is_file() else None
    if g is None:
        pytest.skip("no Q4_0 GGUF of models/random-124M (make llamacpp builds it; LLAMACPP_DIR names the cache)")
    from safetensors import safe_open
    with safe_open(model / "model.safetensors", "np") as f:
        key = next(k for k in f.keys() if k.split(".")[-2:] == ["wte", "weight"])
        wte = f.get_tensor(key)
    t = next(t for t in gguf.GGUFReader(g).tensors if t.name == "token_embd.weight")
    assert t.tensor_type == GQ.Q6_K
    return wte, np.asarray(t.data)


def test_quantize_q6k_equals_llama_quantize():
    """llama-quantize's Q4_0 GGUF holds the tied token embedding / head as Q6_K: quantize_q6k of the checkpoint's
    wte gives exactly its bytes, all 50257 rows."""
    wte, raw = _wte_and_gguf_q6k()
    assert wte.dtype == np.float32 and raw.shape == (wte.shape[0], wte.shape[1] // 256 * 210)
    t0 = time.perf_counter()
    q, sc, d = Q.quantize_q6k(wte)
    print(f"\nquantize_q6k {wte.shape}: {time.perf_counter() - t0:.2f} s")
    mine = Q.to_ggml_q6k(q, sc, d)
    differ = np.nonzero((mine != raw).any(axis=1))[0]
    assert len(differ) == 0, f"{len(differ)} rows differ, first {differ[:5].tolist()}"
    q2, sc2, d2 = Q.from_ggml_q6k(raw, wte.shape[1])
    assert bits(q2) == bits(q) and bits(sc2) == bits(sc) and bits(d2) == bits(d)
    deq = Q.dequantize_q6k(q, sc, d)
    assert bits(deq) == bits(quants.dequantize(raw, GQ.Q6_K).reshape(wte.shape).astype(np.float32))
    assert bits(Q.quantize_tiled(wte, "q6_k")) == bits(Q.tile_q6k(q, sc, d))


def test_ggml_q6k_bytes_round_trip_and_dequantize():
    """from_ggml_q6k / to_ggml_q6k are lossless on any bytes; dequantize_q6k equals gguf.quants' Q6_K
    (finite d) bit for bit; the ints decode as ggml's dequantize_row_q6_K does."""
    rng = np.random.default_rng(8)
    raw = rng.integers(0, 256, (37, 3 * 210), dtype=np.uint8)
    q, sc, d = Q.from_ggml_q6k(raw, 768)
    assert q.min() >= -32 and q.max() <= 31 and q.shape == (37, 768) and sc.shape == (37, 48) and d.shape == (37, 3)
    assert bits(Q.to_ggml_q6k(q, sc, d)) == bits(raw)
    # one block by hand: input 128h + 32s + l
    blk = raw[0, :210]
    ql, qh = blk[:128].astype(int), blk[128:192].astype(int)
    for h in range(2):
        for s in range(4):
            for l in (0, 17, 31):
                lo = ql[64 * h + l + 32 * (s & 1)]
                lo = lo >> 4 if s >= 2 else lo & 15
                assert q[0, 128 * h + 32 * s + l] == (lo | ((qh[32 * h + l] >> (2 * s)) & 3) << 4) - 32
    assert bits(sc[0, :16]) == bits(blk[192:208].view(np.int8))
    # finite scales for the dequantize comparison
    d = (rng.standard_normal(d.shape) * 0.01).astype(np.float16)
    d[0, 0], d[1, 1] = 0, np.float16(6e-8)
    raw = Q.to_ggml_q6k(q, sc, d)
    deq = Q.dequantize_q6k(q, sc, d)
    assert deq.dtype == np.float32 and deq.ctypes.data % 64 == 0
    assert bits(deq) == bits(quants.dequantize(raw, GQ.Q6_K).reshape(37, 768).astype(np.float32))
    ref = (np.repeat(d.astype(F), 16, axis=1) * sc.astype(F)).repeat(16, axis=1) * q.astype(F)
    assert bits(deq) == bits(ref.astype(F))


@pytest.mark.parametrize("n_out", [1, 63, 64, 65, 130, 300])
def test_tile_q6k_equals_q0ref(n_out):
    rng = np.random.default_rng(n_out)
    n_in = 512
    w = (rng.standard_normal((n_out, n_in)) * 0.05).astype(np.float32)
    q, sc, d = Q.quantize_q6k(w)
    t = Q.tile_q6k(q, sc, d)
    assert t.shape == Q.tiled_shape(n_out, n_in, "q6_k") == (-(-n_out // 64), 2, q0ref.SUPER6)
    assert Q.SUPER6 == q0ref.SUPER6 == 13440 and Q.RECORD6 == q0ref.RECORD6 and Q.QK_K == q0ref.QK_K
    assert t.dtype == np.uint8 and t.flags.c_contiguous and t.ctypes.data % 64 == 0
    assert t[0].nbytes == Q.tile_bytes(n_in, "q6_k") == q0ref.tile_bytes_q6k(n_in)
    assert bits(t) == bits(q0ref.tile_q6k(q, sc, d))
    assert bits(Q.quantize_tiled(w, "q6_k")) == bits(t)
    for got in (Q.untile_q6k(t, n_out, n_in), q0ref.untile_q6k(t, n_out, n_in)):
        assert all(bits(a) == bits(b) for a, b in zip(got, (q, sc, d))) and got[2].dtype == np.float16
    if n_out % 64:                                       # padding outputs: q 0, sc 0, d +0
        pq, psc, pd = Q.untile_q6k(t, len(t) * 64, n_in)
        assert (pq[n_out:] == 0).all() and (psc[n_out:] == 0).all() and (pd[n_out:].view(np.uint16) == 0).all()
    xq, xd = q0ref.quantize_act(rng.standard_normal(n_in).astype(np.float32))
    uq, usc, ud = Q.untile_q6k(t, n_out, n_in)
    assert bits(q0ref.matvec_q6k(uq, usc, ud, xq, xd, None)) == bits(q0ref.matvec_q6k(q, sc, d, xq, xd, None))


def test_quantize_q6k_edges():
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((12, 256)) * 0.1).astype(np.float32)
    w[0] = 0                                             # all-zero row: ggml's memset block
    w[1] = -0.0
    w[2, 100] = 3e4                                      # one huge value: the rest of the row's sc round to 0
    w[3] = -np.abs(w[3]); w[3, ::16] = -1                # negative maxima
    w[4] = np.abs(w[4]); w[4, 5::16] = -2                # negative max among positives
    w[5] = (np.arange(256) % 64 - 32) / 2                # halves: ties in nearest_int
    w[6] = 1e-16                                         # below GROUP_MAX_EPS: zero
    w[7, :16] = 1e-30                                    # a tiny group among normal ones
    w[8] = np.float32(65504 * 4096 * 0.9)                # near the largest d
    w[9, 0], w[9, 1] = 5.0, -5.0                         # equal |max|, opposite signs
    w[10, 0], w[10, 1] = -5.0, 5.0
    q, sc, d = Q.quantize_q6k(w)
    raw = Q.to_ggml_q6k(q, sc, d)
    for r in (0, 1, 6):
        assert (raw[r] == 0).all() and (q[r] == -32).all() and (sc[r] == 0).all() and (d[r].view(np.uint16) == 0).all()
    assert sc[2, 100 // 16] == -128 and q[2, 100] in (-32, -31)
    assert np.isfinite(d.astype(F)).all() and float(d[8, 0]) != 0
    for b in range(12):
        rq, rsc, rd = _ref_q6k_block(w[b])
        assert q[b].tolist() == rq and sc[b].tolist() == rsc and int(d[b].view(np.uint16)[0]) == rd, b
    # the dequantized head is close to the weights
    deq = Q.dequantize_q6k(q, sc, d)
    assert np.abs(deq[5] - w[5]).max() <= np.abs(w[5]).max() / 32


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_q6k_non_finite_weights_are_refused(bad):
    w = np.zeros((300, 256), np.float32)
    w[270, 40] = bad
    for fn in (Q.quantize_q6k, lambda w: Q.quantize_tiled(w, "q6_k")):
        with pytest.raises(InvalidArgumentError, match="output 270, input 40"):
            fn(w)


def test_q6k_scale_beyond_float16_is_refused():
    w = np.zeros((300, 512), np.float32)
    w[290, 300] = 65520.0 * 4096 * 1.1
    for fn in (Q.quantize_q6k, lambda w: Q.quantize_tiled(w, "q6_k")):
        with pytest.raises(InvalidArgumentError, match="output 290 .*beyond q6_k"):
            fn(w)
    w[290, 300] = 3e38                                   # sums overflow to inf / NaN in C
    with pytest.raises(InvalidArgumentError, match="beyond"):
        Q.quantize_q6k(w)


def test_q6k_bad_arguments():
    for shape in ((3, 128), (3, 288), (0, 256), (256,)):
        with pytest.raises(InvalidArgumentError):
            Q.quantize_q6k(np.zeros(shape, np.float32))
    with pytest.raises(InvalidArgumentError):
        Q.quantize_q6k(np.zeros((2, 256), np.int32))
    with pytest.raises(InvalidArgumentError):
        Q.quantize_tiled(np.zeros((2, 96), np.float32), "q6_k")
    q, sc, d = Q.quantize_q6k(np.ones((2, 256), np.float32))
    with pytest.raises(InvalidArgumentError):
        Q.tile_q6k(q, sc[:, :8], d)
    with pytest.raises(InvalidArgumentError):
        Q.to_ggml_q6k(q.astype(np.int16), sc, d)
    q[0, 0] = 40
    with pytest.raises(InvalidArgumentError, match="-32..31"):
        Q.tile_q6k(q, sc, d)
    with pytest.raises(InvalidArgumentError):
        Q.from_ggml_q6k(np.zeros((2, 209), np.uint8), 256)
    with pytest.raises(InvalidArgumentError):
        Q.from_ggml_q6k(np.zeros((2, 210), np.uint8), 288)
    with pytest.raises(InvalidArgumentError):
        Q.quantize(np.zeros((2, 288), np.float32), "q6_k")          # quantize routes q6_k to quantize_q6k
    z = Q.quantize(np.zeros((2, 256), np.float32), "q6_k")
    assert len(z) == 3 and Q.tile_blocks(z, "q6_k").shape == (1, 1, Q.SUPER6)
    assert not Q.dequantize_blocks(z, "q6_k").any()
    with pytest.raises(InvalidArgumentError):
        Q.tiled_shape(64, 256, "q5_0")


def test_head_kind_and_tile_bytes():
    """llama-quantize: a Q4_0 model's output / tied token embedding is Q6_K, Q8_0 when the row length is not a
    multiple of 256; a Q8_0 model's is Q8_0."""
    assert Q.head_kind("q4_0") == Q.head_kind("q4_0", 768) == "q6_k"
    assert Q.head_kind("q4_0", 96) == Q.head_kind("q4_0", 800) == "q8_0"
    assert Q.head_kind("q8_0") == Q.head_kind("q8_0", 768) == "q8_0"
    with pytest.raises(InvalidArgumentError):
        Q.head_kind("q6_k")
    assert Q.tiled_shape(50257, 768, "q6_k") == (786, 3, 13440)
    assert Q.tiled_shape(50257, 768, "q4_0") == (786, 24, Q.RECORD["q4_0"])
    assert Q.tile_bytes(768, "q6_k") == 3 * 13440
    assert Q.tile_bytes(768, "q8_0") == 24 * 2176 and Q.tile_bytes(768, "q4_0") == 24 * 1152
    assert Q.row_bytes(768, "q6_k") == 3 * 210 and Q.row_bytes(768, "q8_0") == 24 * 34


def test_quantize_q6k_equals_compiled_ggml(tmp_path):
    """ggml's own quantize_row_q6_K_ref (and nearest_int, make_qx_quants, GGML_FP32_TO_FP16), cut from the
    llama.cpp source make llamacpp extracts and compiled as ggml-base is (-O3, baseline ISA), on many rows."""
    import ctypes
    import glob
    import os
    import shutil
    import subprocess
    from pathlib import Path
    env = os.environ.get("LLAMACPP_DIR")
    base = Path(env) if env else Path(__file__).resolve().parent.parent / ".cache" / "llamacpp"
    found = sorted(glob.glob(str(base / "src-*" / "ggml" / "src" / "ggml-quants.c")))
    cc = shutil.which("cc") or shutil.which("gcc")
    if not found or cc is None:
        pytest.skip("no llama.cpp source (make llamacpp extracts it) or no C compiler")
    src = Path(found[-1]).read_text()
    impl = (Path(found[-1]).parent / "ggml-impl.h").read_text()

    def cut(start: str) -> str:
        i = src.index(start)
        return src[i:src.index("\n}\n", i) + 3]
    i = impl.index("static inline float fp32_from_bits")
    j = impl.index("#define GGML_FP32_TO_FP16(x)")
    code = ("#include <stdint.h>\n#include <string.h>\n#include <math.h>\n#include <assert.h>\n#include <stdbool.h>\n"
            "#define GGML_RESTRICT restrict\n#define QK_K 256\n#define MIN(a, b) ((a) < (b) ? (a) : (b))\n"
            "#define MAX(a, b) ((a) > (b) ? (a) : (b))\ntypedef uint16_t ggml_half; typedef uint16_t ggml_fp16_t;\n"
            "typedef struct { uint8_t ql[QK_K/2]; uint8_t qh[QK_K/4]; int8_t scales[QK_K/16]; ggml_half d; } block_q6_K;\n"
            + "\n".join(ln for ln in src.splitlines() if ln.startswith("#define GROUP_MAX_EPS ")) + "\n"
            + impl[i:impl.index("\n", j)] + "\n" + cut("static inline int nearest_int(float fval)")
            + cut("static float make_qx_quants(") + cut("void quantize_row_q6_K_ref("))
    (tmp_path / "q6.c").write_text(code)
    so = tmp_path / "libq6.so"
    p = subprocess.run([cc, "-O3", "-DNDEBUG", "-std=gnu11", "-fPIC", "-shared", "-o", str(so),
                        str(tmp_path / "q6.c")], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"could not compile ggml's quantizer: {p.stderr[-300:]}")
    lib = ctypes.CDLL(str(so))
    rng = np.random.default_rng(10)
    for w in (_adversarial_subblocks(rng, 2000).reshape(500, 1024),
              (rng.standard_normal((400, 768)) * 0.02).astype(np.float32),
              (rng.integers(-80, 80, (300, 512)) / np.float32(8)).astype(np.float32)):
        w = np.ascontiguousarray(w, np.float32)
        ref = np.zeros((w.shape[0], w.shape[1] // 256 * 210), np.uint8)
        lib.quantize_row_q6_K_ref(ctypes.c_void_p(w.ctypes.data), ctypes.c_void_p(ref.ctypes.data),
                                  ctypes.c_int64(w.size))
        mine = Q.to_ggml_q6k(*Q.quantize_q6k(w))
        differ = np.nonzero((mine != ref).any(axis=1))[0]
        assert len(differ) == 0, f"{len(differ)} rows differ, first {differ[:5].tolist()}"
