"""checkasm-style tests (and a benchmark) for the elementwise and attention kernels.

    gpt2asm_expf_f32_*, gpt2asm_gelu_f32_*, gpt2asm_softmax_f32_*, gpt2asm_layernorm_f32_*,
    gpt2asm_attention_f32_*                               for * in avx2, avx512   (docs/kernels.md)
    gpt2asm_attention_f16_avx2                            (the binary16 cache; both families call it)
    gpt2asm_attention_rows_{f32,f16}_*                    for * in avx2, avx512   (the prefill's rows)

Every variant the CPU has runs natively; the AVX-512 ones also run under tests/avx512emu.py (an
emulated AVX-512 CPU) when that is available, else they are skipped with the reason.  Each call is
checked against

  * the contract itself, bit for bit: numpy models (`expf_c`, `hsum16`, `softmax_c`, ...) replay the
    documented sequence of binary32 operations, with an exact FMA model (float64 product, error-free
    sum, correctly rounded to binary32 with ties broken by the exact residual).  NaN-ness must agree;
  * the other ISA, bit for bit, NaN payloads included (every AVX-512 result is compared with AVX2);
  * a float64 reference (picoGPT style: layer_norm, tanh gelu, softmax, attention) within the bounds
    docs/kernels.md states, and special values (+-inf, NaN, -0.0, denormals, huge/tiny magnitudes);
  * the memory contract: natively every buffer sits inside 4 KiB of canary bytes on each side at a
    varying misalignment (also odd byte offsets), inputs must stay unchanged, and a forked child runs
    every kernel with every buffer ending (or starting) at a PROT_NONE page, so a single byte of
    over-read faults; under emulation the emulator page-guards and canaries every array itself
    (inputs mapped read-only), and in its raw-pointer mode the AVX-512 kernels also run on the native
    harness's misaligned canary-guarded buffers and on PROT_NONE-fenced ones (an access is a CpuFault).

Run:  pytest tests/test_kernels_ops.py
      python tests/test_kernels_ops.py --bench        (ns per call at GPT-2 sizes, native variants)
      python tests/test_kernels_ops.py --bench-argmax (greedy sampling on 50257 logits, cold and hot)
"""
from __future__ import annotations

import ctypes
import itertools
import math
import mmap
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
# GPT2ASM_TEST_LIB=path tests a library built elsewhere (nothing is built then)
LIB_PATH = Path(os.environ.get("GPT2ASM_TEST_LIB") or ROOT / "gpt2asm" / "libgpt2asm.so")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(ROOT))                                       # gpt2asm (run as a script)

from forked import run_forked  # noqa: E402
from test_kernels_matvec import cpu_isas, isas_from_cpuid, open_built  # noqa: E402

ISAS = ("avx2", "avx512")
GUARD = 4096                                     # canary bytes before and after every native buffer
LENGTHS = (1, 2, 7, 8, 9, 15, 16, 17, 24, 25, 31, 33, 100, 768, 1023, 1600, 3072, 50257)
NPOS = (1, 2, 15, 16, 17, 100, 1024)
HEAD = 64
F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)
MIN_NORMAL = 2.0 ** -126

# argument kinds per kernel: i = input array, o = output array, w = workspace (written, contents
# unspecified: not compared between variants), n = size_t
SIGS = {
    "expf": "ion",
    "gelu": "ion",
    "softmax": "ion",
    "layernorm": "iiion",
    "attention": "iiiownnnn",
    "attention16": "iiiownnnn",                  # gpt2asm_attention_f16_avx2: k, v binary16
    "attnrows": "iiiownnnn",                     # gpt2asm_attention_rows_f32_<isa>: one head, 1..4 rows
    "attnrows16": "iiiownnnn",                   # gpt2asm_attention_rows_f16_<isa>
}
# ops whose symbol is not gpt2asm_<op>_f32_<isa> (only for these ISAs), and the others
SYMBOLS = {("attention16", "avx2"): "gpt2asm_attention_f16_avx2",
           ("attention16", "neon"): "gpt2asm_attention_f16_neon",
           ("attnrows", "avx2"): "gpt2asm_attention_rows_f32_avx2",
           ("attnrows16", "avx2"): "gpt2asm_attention_rows_f16_avx2",
           ("attnrows", "avx512"): "gpt2asm_attention_rows_f32_avx512",
           ("attnrows16", "avx512"): "gpt2asm_attention_rows_f16_avx512"}
F32_OPS = [op for op in SIGS if op not in {o for o, _ in SYMBOLS}]


# --------------------------------------------------------------------------------------------------
# library, CPU features, emulator

_LIB = None


def load_lib(build: bool = True) -> ctypes.CDLL:
    """Build the library once per session (python build.py -q) and load it."""
    global _LIB
    if _LIB is None:
        lib = open_built(build)
        for op, sig in SIGS.items():
            for isa in ISAS:
                if op not in F32_OPS and (op, isa) not in SYMBOLS:
                    continue
                fn = getattr(lib, symbol(op, isa))
                fn.argtypes = [ctypes.c_size_t if k == "n" else ctypes.c_void_p for k in sig]
                fn.restype = None
        _LIB = lib
    return _LIB


def symbol(op: str, isa: str) -> str:
    return SYMBOLS.get((op, isa), f"gpt2asm_{op}_f32_{isa}")


def native_isas() -> set[str]:
    return cpu_isas(load_lib())


_EMU: list = []                                  # [emulator, None] or [None, reason]


def emulator():
    """(Avx512Emulator, None) or (None, why not).  The emulated CPU is itself probed with the
    library's gpt2asm_cpuid / gpt2asm_xgetbv, run under emulation."""
    if not _EMU:
        try:
            import avx512emu
            if not avx512emu.available():
                _EMU[:] = [None, avx512emu.why_unavailable()]
            else:
                load_lib()
                emu = avx512emu.Avx512Emulator(str(LIB_PATH), timeout=300.0)

                def cpuid(leaf, sub):
                    regs = np.zeros(4, np.uint32)
                    emu.call("gpt2asm_cpuid", leaf, sub, regs, ret=None)
                    return tuple(int(r) for r in regs)
                have = isas_from_cpuid(cpuid, lambda x: emu.call("gpt2asm_xgetbv", x))
                if "avx512" in have:
                    _EMU[:] = [emu, None]
                else:
                    _EMU[:] = [None, f"the emulated CPU does not report AVX-512 ({sorted(have)})"]
        except Exception as e:                             # missing file, or an emulator bug
            _EMU[:] = [None, f"tests/avx512emu.py not usable: {type(e).__name__}: {e}"]
    return _EMU[0], _EMU[1]


# --------------------------------------------------------------------------------------------------
# runners: call a kernel on numpy arrays (outputs are written back into the caller's arrays)

class Guarded:
    """`nbytes` of payload inside GUARD canary bytes on each side, starting `misalign` bytes after a
    64-byte boundary."""

    def __init__(self, a: np.ndarray, misalign: int, seed: int):
        nbytes = a.nbytes
        self.raw = np.empty(2 * GUARD + 64 + nbytes + 64, np.uint8)
        self.start = (-self.raw.ctypes.data) % 64 + GUARD + misalign
        self.end = self.start + nbytes
        self.canary = np.random.default_rng(seed).integers(0, 256, self.raw.size, dtype=np.uint8)
        self.raw[:] = self.canary
        self.raw[self.start:self.end] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        self.orig = self.raw[self.start:self.end].copy()
        self.addr = self.raw.ctypes.data + self.start

    def payload(self) -> np.ndarray:
        return self.raw[self.start:self.end]

    def check(self, what: str) -> None:
        for lo, hi, where in ((0, self.start, "before"), (self.end, self.raw.size, "after")):
            bad = np.flatnonzero(self.raw[lo:hi] != self.canary[lo:hi])
            assert bad.size == 0, (f"{what}: canary bytes {where} the buffer changed at byte offsets "
                                   f"{(bad[:8] + lo - self.start).tolist()}")


MISALIGN = (0, 4, 1, 8, 60, 2, 12, 3, 36, 20, 44, 5)


class Native:
    """A variant run natively.  Each call copies every array into its own canary-guarded buffer at a
    rotating misalignment (odd byte offsets included), checks the canaries and that inputs are
    unchanged, and copies outputs back."""

    def __init__(self, isa: str):
        self.isa, self.lib = isa, load_lib()
        self.name = f"{isa} (native)"
        self._mis = itertools.cycle(MISALIGN)
        self._seed = itertools.count(1)

    def __call__(self, op: str, *args) -> None:
        sig = SIGS[op]
        assert len(args) == len(sig), (op, len(args))
        outs = {id(a) for k, a in zip(sig, args) if k in "ow"}
        placed: dict[int, Guarded] = {}
        cargs = []
        for k, a in zip(sig, args):
            if k == "n":
                cargs.append(int(a))
                continue
            assert a.dtype in (np.float32, np.float16) and a.flags.c_contiguous
            g = placed.get(id(a))
            if g is None:
                g = placed[id(a)] = Guarded(a, next(self._mis), next(self._seed))
            cargs.append(g.addr)
        self._invoke(symbol(op, self.isa), cargs)
        for k, a in zip(sig, args):
            if k == "n":
                continue
            g = placed[id(a)]
            g.check(f"{op}_{self.isa}")
            if id(a) in outs:
                a.reshape(-1).view(np.uint8)[:] = g.payload()
            else:
                assert np.array_equal(g.payload(), g.orig), f"{op}_{self.isa} wrote into an input"


    def _invoke(self, symbol: str, cargs: list[int]) -> None:
        getattr(self.lib, symbol)(*cargs)


class EmulatedRaw(Native):
    """The emulated CPU in raw-pointer mode (guest VA == host VA): the same canary-guarded, misaligned
    host buffers as Native, read and written in place by the emulated kernel."""

    def __init__(self, emu, isa: str):
        super().__init__(isa)
        self.emu = emu
        self.name = f"{isa} (emulated, raw pointers)"

    def _invoke(self, symbol: str, cargs: list[int]) -> None:
        self.emu.call_raw(symbol, *cargs, ret=None)


class Emulated:
    """A variant run on the emulated AVX-512 CPU: arrays are copied into page-guarded buffers
    (inputs mapped read-only, canaries checked by the emulator) and outputs copied back."""

    def __init__(self, emu, isa: str):
        self.emu, self.isa = emu, isa
        self.name = f"{isa} (emulated)"

    def __call__(self, op: str, *args) -> None:
        sig = SIGS[op]
        outs = {id(a) for k, a in zip(sig, args) if k in "ow"}
        eargs = []
        for k, a in zip(sig, args):
            if k == "n":
                eargs.append(int(a))
            elif id(a) in outs:
                eargs.append(a)
            else:
                ro = np.array(a, copy=True)
                ro.flags.writeable = False
                eargs.append(ro)
        self.emu.call(symbol(op, self.isa), *eargs, ret=None)


_RUNNERS: dict[str, object] = {}


def runner(isa: str):
    """The runner of an ISA (native if the CPU has it, else emulated), or pytest.skip."""
    if isa not in _RUNNERS:
        if isa in native_isas():
            _RUNNERS[isa] = Native(isa)
        elif isa == "avx512":
            emu, why = emulator()
            _RUNNERS[isa] = Emulated(emu, isa) if emu is not None else \
                f"no AVX-512 on this CPU and no emulator: {why}"
        else:
            _RUNNERS[isa] = f"this CPU/OS cannot run {isa}"
    r = _RUNNERS[isa]
    if isinstance(r, str):
        pytest.skip(r)
    return r


def baseline():
    """The AVX2 variant natively, to compare other ISAs with (None if the CPU lacks AVX2)."""
    if "avx2" not in native_isas() or "avx2" not in ISAS:
        return None
    return runner("avx2")


@pytest.fixture(params=ISAS)
def variant(request):
    return runner(request.param)


@pytest.fixture
def emulated(variant):
    """True when the variant runs under emulation (tests then use smaller sweeps)."""
    return isinstance(variant, Emulated)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a, F32).view(np.uint32), np.asarray(b, F32).view(np.uint32))


def model_equal(got: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """Elementwise: same bits, or both NaN (the models do not track NaN payloads)."""
    g, e = np.asarray(got, F32), np.asarray(exp, F32)
    return (g.view(np.uint32) == e.view(np.uint32)) | (np.isnan(g) & np.isnan(e))


def assert_model(got, exp, what: str) -> None:
    ok = model_equal(got, exp)
    if not ok.all():
        i = np.flatnonzero(~ok.reshape(-1))
        g, e = np.asarray(got).reshape(-1), np.asarray(exp).reshape(-1)
        raise AssertionError(f"{what}: {i.size} outputs differ from the contract model, first at "
                             f"{i[:5].tolist()}: got {g[i[:5]].tolist()} expected {e[i[:5]].tolist()}")


def run(variant, op: str, *args) -> None:
    """Run `op` on `variant`; if that is not native AVX2, also run native AVX2 on copies of the same
    arguments and require bit-identical outputs (NaN payloads included)."""
    base = baseline()
    copies = None
    if base is not None and base is not variant:
        memo: dict[int, np.ndarray] = {}
        copies = [a if isinstance(a, int) else memo.setdefault(id(a), a.copy()) for a in args]
    variant(op, *args)
    if copies is not None:
        base(op, *copies)
        for k, a, c in zip(SIGS[op], args, copies):
            if k == "o" and not same_bits(a, c):
                d = np.flatnonzero(a.reshape(-1).view(np.uint32) != c.reshape(-1).view(np.uint32))
                raise AssertionError(f"{op}: {variant.name} and {base.name} differ at {d[:8].tolist()}: "
                                     f"{a.reshape(-1)[d[:4]].tolist()} vs {c.reshape(-1)[d[:4]].tolist()}")


# --------------------------------------------------------------------------------------------------
# the contract in numpy: exact binary32 models of docs/kernels.md

def fma32(a, b, c) -> np.ndarray:
    """Correctly rounded binary32 fma(a, b, c): the float64 product of two binary32 is exact; the sum
    is split into its float64 rounding s and the exact residual e (TwoSum); rounding s to binary32 is
    correct unless s lies exactly on a binary32 midpoint and e != 0, then e decides."""
    a, b, c = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32), np.asarray(c, F32))
    with np.errstate(all="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        cd = c.astype(np.float64)
        s = p + cd
        bb = s - p
        e = (p - (s - bb)) + (cd - bb)
        r = s.astype(F32)
        rd = r.astype(np.float64)
        fin = np.isfinite(s) & np.isfinite(rd)
        nb = np.nextafter(r, np.where(s > rd, F32(np.inf), F32(-np.inf)))
        mid = (rd + nb.astype(np.float64)) * 0.5
        fix = fin & (s != rd) & (s == mid) & np.isfinite(e) & (e != 0)
        up = np.where(e > 0, np.maximum(r, nb), np.minimum(r, nb))
        return np.where(fix, up, r).astype(F32)


def bits_f32(u: int) -> np.float32:
    return np.array([u], np.uint32).view(F32)[0]


EXP_LO, EXP_HI = F32(-104.0), F32(89.0)
LOG2E = bits_f32(0x3FB8AA3B)
NLN2HI = bits_f32(0xBF318000)
LN2LO = bits_f32(0x395E8083)
POLY = [F32(1.9875691500e-4), F32(1.3981999507e-3), F32(8.3334519073e-3), F32(4.1665795894e-2),
        F32(1.6666665459e-1), F32(5.0000001201e-1)]
GELU_C = F32(0.044715)
GELU_M = bits_f32(0xBFCC422A)                    # -1.59576912f = -2 sqrt(2/pi)
EPS = F32(1e-5)


def expf_c(x) -> np.ndarray:
    """docs/kernels.md expf_c, elementwise on binary32."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        xc = np.minimum(np.maximum(x, EXP_LO), EXP_HI)
        n = np.rint(xc * LOG2E)
        r = fma32(n, NLN2HI, xc)
        r = fma32(n, LN2LO, r)
        r2 = r * r
        p = fma32(POLY[0], r, POLY[1])
        for c in POLY[2:]:
            p = fma32(p, r, c)
        p = fma32(p, r2, r)
        p = p + F32(1)
        k = np.where(np.isnan(n), 0, n).astype(np.int32)
        a = k >> 1
        b = k - a
        two_a = ((a + 127) << 23).astype(np.int32).view(F32)
        two_b = ((b + 127) << 23).astype(np.int32).view(F32)
        y = (p * two_a) * two_b
        return np.where(np.isnan(x), x, y).astype(F32)


def lanes16(v, fill) -> np.ndarray:
    """v as rows of 16 lanes (element i in row i//16, lane i%16), padded with `fill`."""
    v = np.asarray(v, F32).reshape(-1)
    rows = -(-v.size // 16)
    out = np.full(rows * 16, fill, F32)
    out[:v.size] = v
    return out.reshape(rows, 16)


def tree16(s, op) -> np.float32:
    s = np.array(s, F32)
    for w in (8, 4, 2, 1):
        s[:w] = op(s[:w], s[w:2 * w])
    return s[0]


def add32(a, b):
    with np.errstate(all="ignore"):
        return (a + b).astype(F32)


def gtmax(a, b):
    """(a > b) ? a : b, as vmaxps with a as first source."""
    return np.where(a > b, a, b).astype(F32)


def hsum16(v) -> np.float32:
    """s[l] = +0.0; s[i mod 16] += v[i] in increasing i; pairwise tree 8, 4, 2, 1."""
    rows = np.vstack([np.zeros((1, 16), F32), lanes16(v, 0.0)])
    with np.errstate(all="ignore"):
        s = np.cumsum(rows, axis=0, dtype=F32)[-1]       # sequential binary32 adds, in row order
    return tree16(s, add32)


def hmax16(v) -> np.float32:
    m = np.full(16, -np.inf, F32)
    for row in lanes16(v, -np.inf):
        m = gtmax(row, m)
    return tree16(m, gtmax)


def gelu_c(x) -> np.ndarray:
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        t = (x * x) * x
        v = fma32(GELU_C, t, x)
        w = v * GELU_M
        e = expf_c(w)
        return (x / (F32(1) + e)).astype(F32)


def softmax_c(x) -> np.ndarray:
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        m = hmax16(x)
        e = expf_c(x - m)
        s = hsum16(e)
        return (e / s).astype(F32)


def layernorm_c(x, g, b) -> np.ndarray:
    x, g, b = (np.asarray(a, F32) for a in (x, g, b))
    n = F32(x.size)                                   # (float)n, rounded to nearest
    with np.errstate(all="ignore"):
        mean = hsum16(x) / n
        d = lanes16(x - mean, 0.0)                    # +0.0 past the end
        q = np.zeros(16, F32)
        for row in d:
            q = fma32(row, row, q)
        var = tree16(q, add32) / n
        rstd = F32(1) / np.sqrt(var + EPS)
        return fma32((x - mean) * rstd, g, b)


def dot64_rows(qh, K) -> np.ndarray:
    """dot64(qh, K[t]) for every row t: 16 lanes, fma over c = 0..3, then the hsum16 tree."""
    acc = np.zeros((K.shape[0], 16), F32)
    for c in range(4):
        acc = fma32(qh[None, 16 * c:16 * c + 16], K[:, 16 * c:16 * c + 16], acc)
    for w in (8, 4, 2, 1):
        acc[:, :w] = add32(acc[:, :w], acc[:, w:2 * w])
    return acc[:, 0].copy()


def attention_c(q, k, v, n_pos, hb, he) -> np.ndarray:
    """out[hb*64 .. he*64) of gpt2asm_attention_f32 (k, v: [n_head][n_ctx][64])."""
    P = np.empty((he - hb, n_pos), F32)
    for i, h in enumerate(range(hb, he)):
        with np.errstate(all="ignore"):
            s = dot64_rows(q[h * HEAD:(h + 1) * HEAD], k[h, :n_pos]) * F32(0.125)
        P[i] = softmax_c(s)
    o = np.zeros((he - hb, HEAD), F32)
    for t in range(n_pos):
        o = fma32(P[:, t:t + 1], v[hb:he, t], o)
    return o.reshape(-1)


# float64 references, picoGPT style
def gelu64(x):
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu64_stable(x):
    """The same function as gelu64, as x * sigmoid(2u): 1 + tanh(u) cancels catastrophically in
    float64 for x < -3 or so (relative error 1e-16 / (1 + tanh u)), this form does not."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def layer_norm64(x, g, b, eps=1e-5):
    x = np.asarray(x, np.float64)
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(var + eps) + b


def attention64(q, k, v, n_pos, hb, he):
    out = []
    for h in range(hb, he):
        qh = q[h * HEAD:(h + 1) * HEAD].astype(np.float64)
        K, V = k[h, :n_pos].astype(np.float64), v[h, :n_pos].astype(np.float64)
        out.append(softmax64(qh @ K.T / np.sqrt(HEAD)) @ V)
    return np.concatenate(out) if out else np.zeros(0)


def ulp_error(y, ref) -> np.ndarray:
    """|y - ref| in units of the binary32 ulp at ref (ref float64, normal range)."""
    e = np.maximum(np.floor(np.log2(np.abs(ref))), -126)
    return np.abs(y.astype(np.float64) - ref) / np.exp2(e - 23)


def test_models_self_check():
    """The numpy models themselves: fma32 against exact rationals, hsum16 against a Python loop."""
    from fractions import Fraction
    rng = np.random.default_rng(0)
    # short mantissas make many exact midpoints (the double-rounding trap)
    a = (rng.integers(1, 1 << 12, 4000) * 2.0 ** rng.integers(-20, 0, 4000)).astype(F32)
    b = (rng.integers(1, 1 << 12, 4000) * 2.0 ** rng.integers(-20, 0, 4000)).astype(F32)
    c = (rng.choice([-1, 1], 4000) * rng.integers(1, 1 << 24, 4000) * 2.0 ** rng.integers(-40, 0, 4000)).astype(F32)
    got = fma32(a, b, c)
    for i in range(4000):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        lo = F32(float(exact))                       # float(Fraction) is correctly rounded to f64
        # correctly rounded binary32 of the exact value: check the neighbours
        cands = [lo, np.nextafter(lo, F32(np.inf)), np.nextafter(lo, F32(-np.inf))]
        best = min(cands, key=lambda z: (abs(Fraction(float(z)) - exact),
                                         int(np.array([z], F32).view(np.uint32)[0]) & 1))
        assert got[i] == best, (a[i], b[i], c[i], got[i], best)
    v = rng.standard_normal(1000).astype(F32)
    s = [F32(0)] * 16
    for i, x in enumerate(v):
        s[i % 16] = F32(s[i % 16] + x)
    for w in (8, 4, 2, 1):
        for j in range(w):
            s[j] = F32(s[j] + s[j + w])
    assert hsum16(v) == s[0]


# --------------------------------------------------------------------------------------------------
# input generators

def specials() -> np.ndarray:
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, -3e-39,
                     1.17549435e-38, FLT_MAX, -FLT_MAX, 1e30, -1e30, 89.0, 88.72283, 88.72284,
                     -103.97, -104.0, -87.3, 1.0, -1.0, 0.5, 1e-7, -1e-7], F32)


def mixed(rng, n: int, with_specials: bool = True) -> np.ndarray:
    """Random binary32 in several regimes, with special values sprinkled in."""
    parts = [rng.uniform(-110, 95, n), rng.standard_normal(n) * 3, rng.standard_normal(n) * 1e-3,
             np.exp(rng.uniform(-100, 80, n)) * rng.choice([-1, 1], n)]
    x = np.choose(rng.integers(0, 4, n), parts).astype(F32)
    if with_specials and n >= 4:
        sp = specials()
        idx = rng.choice(n, min(n // 4, sp.size), replace=False)
        x[idx] = rng.choice(sp, idx.size)
    return x


def nan_payloads(n: int, rng) -> np.ndarray:
    """NaNs of both signs with various payloads (quiet and signalling)."""
    pay = rng.integers(1, 1 << 22, n).astype(np.uint32)
    quiet = rng.integers(0, 2, n).astype(np.uint32) << 22
    sign = rng.integers(0, 2, n).astype(np.uint32) << 31
    return (sign | np.uint32(0x7F800000) | quiet | pay).view(F32)


# --------------------------------------------------------------------------------------------------
# expf

@pytest.mark.parametrize("n", LENGTHS)
def test_expf_model(variant, n):
    rng = np.random.default_rng(n)
    x = mixed(rng, n)
    y = np.full(n, np.nan, F32)
    run(variant, "expf", x, y, n)
    assert_model(y, expf_c(x), f"expf n={n}")
    check_expf_accuracy(x, y, f"expf n={n}")


def test_expf_inplace_and_nan_payloads(variant):
    rng = np.random.default_rng(5)
    x = mixed(rng, 1000)
    x[::7] = nan_payloads(x[::7].size, rng)
    exp = expf_c(x)
    y = x.copy()
    run(variant, "expf", y, y, y.size)
    assert_model(y, exp, "expf in place")
    nan = np.isnan(x)
    # NaN in -> a quiet NaN out, sign and payload kept (vmaxps/vminps return x, every later operation
    # propagates its first NaN operand)
    assert same_bits(y[nan], (x[nan].view(np.uint32) | np.uint32(1 << 22)).view(F32))


def float_range(lo: float, hi: float) -> np.ndarray:
    """Every binary32 in [lo, hi] (same sign)."""
    a, b = sorted(int(np.array([v], F32).view(np.uint32)[0]) for v in (lo, hi))
    return np.arange(a, b + 1, dtype=np.uint32).view(F32)


def check_expf_accuracy(x, y, where: str) -> float:
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64))
    normal = (ref >= MIN_NORMAL) & (ref <= FLT_MAX)
    u = ulp_error(y[normal], ref[normal])
    worst = float(u.max()) if u.size else 0.0
    assert worst <= 2.0, f"{where}: {worst:.3f} ulp at x = {x[normal][np.argmax(u)]!r}"
    sub = ref < MIN_NORMAL
    if sub.any():
        err = np.abs(y[sub].astype(np.float64) - ref[sub])
        assert err.max() <= 2.0 ** -148, f"{where}: subnormal error {err.max() / 2.0 ** -149} * 2^-149"
    over = ref >= 2.0 ** 128                         # rounds to +inf even when correctly rounded
    assert np.all(np.isposinf(y[over])), where
    assert np.all(np.isfinite(y[ref < FLT_MAX * (1 - 2.0 ** -21)])), where
    return worst


def test_expf_accuracy(variant, emulated):
    """<= 2 ulp against float64 exp on a dense sweep of [-104, 89] (2M evenly spaced points) plus every
    binary32 of several subranges: the overflow and underflow ends, and natively two full binades and
    2M random points (under emulation a small slice instead)."""
    sweeps = {"dense": np.linspace(-104, 89, 2_000_000).astype(F32)}
    if emulated:                                     # ~5 M emulated instructions per second
        sweeps.update(top=float_range(80.0, 89.0), bottom=float_range(-104.0, -86.0),
                      mid=float_range(0.5, 0.5078125))
    else:
        sweeps.update(top=float_range(80.0, 89.0), bottom=float_range(-104.0, -86.0),
                      near1=float_range(0.25, 0.5), neg=float_range(-0.5, -0.25),
                      random=np.random.default_rng(3).uniform(-104, 89, 2_000_000).astype(F32))
    worst = 0.0
    for where, x in sweeps.items():
        y = np.empty_like(x)
        run(variant, "expf", x, y, x.size)
        worst = max(worst, check_expf_accuracy(x, y, f"expf {where}"))
        if not emulated and where in ("dense", "top", "bottom"):
            assert_model(y, expf_c(x), f"expf {where}")
    print(f"\nexpf {variant.name}: max error {worst:.4f} ulp over the sweeps")


def test_expf_special_values(variant):
    cases = [(0.0, 1.0), (-0.0, 1.0), (np.inf, np.inf), (-np.inf, 0.0), (89.0, np.inf),
             (88.72284, np.inf), (1e30, np.inf), (FLT_MAX, np.inf), (-104.0, 0.0), (-200.0, 0.0),
             (-1e30, 0.0), (-FLT_MAX, 0.0), (1e-45, 1.0), (-1e-45, 1.0), (1e-30, 1.0), (-1e-8, 1.0), (-3e-8, 0.99999994),
             (-103.2, 2.0 ** -149)]
    x = np.array([c[0] for c in cases] + [np.nan, 88.72283, 1.0, -87.5, -103.0], F32)
    y = np.empty_like(x)
    run(variant, "expf", x, y, x.size)
    for i, (xi, yi) in enumerate(cases):
        assert same_bits(y[i:i + 1], np.array([yi], F32)), f"expf({xi}) = {y[i]!r}, want {yi}"
    assert np.isnan(y[len(cases)])
    top, e1, sub, tiny = y[len(cases) + 1:]
    assert np.isfinite(top) and top > 3.4e38                     # just below the overflow threshold
    assert abs(float(e1) - math.e) <= 2 * 2.0 ** -22             # within 2 ulp of e
    assert 0 < sub < MIN_NORMAL and abs(float(sub) - math.exp(-87.5)) <= 2.0 ** -148
    assert 0 < tiny < MIN_NORMAL
    # the overflow threshold: the largest finite result and the first +inf straddle ln(FLT_MAX)
    xs = float_range(88.7228, 88.72284)
    ys = np.empty_like(xs)
    run(variant, "expf", xs, ys, xs.size)
    fin = np.isfinite(ys)
    assert fin[0] and not fin[-1] and np.all(np.diff(fin.astype(int)) <= 0)
    assert abs(float(xs[np.argmin(fin)]) - math.log(FLT_MAX)) < 2e-5
    # the underflow end: monotone, reaches +0.0 exactly, and 2^-149 is produced
    xs = float_range(-104.0, -103.0)                 # from -103 down to -104
    ys = np.empty_like(xs)
    run(variant, "expf", xs, ys, xs.size)
    assert np.all(np.diff(ys.astype(np.float64)) <= 0) and ys[-1] == 0 and (ys == 2.0 ** -149).any()


# --------------------------------------------------------------------------------------------------
# gelu

@pytest.mark.parametrize("n", LENGTHS)
def test_gelu_model(variant, n):
    rng = np.random.default_rng(100 + n)
    x = np.where(rng.random(n) < 0.7, rng.standard_normal(n) * 3, mixed(rng, n)).astype(F32)
    y = np.full(n, np.nan, F32)
    run(variant, "gelu", x, y, n)
    assert_model(y, gelu_c(x), f"gelu n={n}")
    fin = np.isfinite(x)
    ref = gelu64_stable(x[fin])
    assert np.all(np.abs(y[fin] - ref) <= gelu_bound(x[fin], ref)), f"gelu n={n} vs float64"


def gelu_bound(x, ref):
    """docs/kernels.md: |y - ref| <= (4 + 3|w|) 2^-24 |ref| + 1e-37, w = 2 sqrt(2/pi)(x + 0.044715x^3)."""
    xd = x.astype(np.float64)
    w = np.abs(2 * np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3))
    return (4 + 3 * w) * 2.0 ** -24 * np.abs(ref) + 1e-37


def test_gelu_accuracy(variant, emulated):
    rng = np.random.default_rng(7)
    n = 100_000 if emulated else 1_000_000
    x = np.concatenate([rng.uniform(-12, 12, n), rng.standard_normal(n),
                        np.linspace(-11, 11, n)]).astype(F32)
    y = np.empty_like(x)
    run(variant, "gelu", x, y, x.size)
    ref = gelu64_stable(x)
    tanh_ok = x >= -3                                # where picoGPT's tanh form is itself accurate
    assert np.allclose(gelu64(x[tanh_ok]), ref[tanh_ok], rtol=1e-13, atol=1e-300)
    err = np.abs(y - ref)
    bad = err > gelu_bound(x, ref)
    assert not bad.any(), f"gelu error bound broken at x = {x[bad][:5]}: {y[bad][:5]} vs {ref[bad][:5]}"
    pos = (x >= 0) & (ref >= MIN_NORMAL)
    u = ulp_error(y[pos], ref[pos])
    assert u.max() <= 4.0, f"gelu x >= 0: {u.max():.2f} ulp"
    near = (np.abs(x) <= 3) & (np.abs(ref) >= MIN_NORMAL)        # the range GPT-2 activations live in
    assert ulp_error(y[near], ref[near]).max() <= 16.0


def test_gelu_special_values(variant):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, -20.0, -1e30, 20.0, 1e30, FLT_MAX, -FLT_MAX,
                  1e-45, -1e-45, 1e-39, -2.5e-38], F32)
    y = np.empty_like(x)
    run(variant, "gelu", x, y, x.size)
    assert y[0] == np.inf
    assert np.isnan(y[1]) and np.isnan(y[2])                     # -inf: -inf / inf
    assert same_bits(y[3:7], np.array([0.0, -0.0, -0.0, -0.0], F32))
    assert same_bits(y[7:11], np.array([20.0, 1e30, FLT_MAX, -0.0], F32))
    assert same_bits(y[11:], (x[11:] / F32(2)).astype(F32))      # e = 1 exactly: y = x / 2


# --------------------------------------------------------------------------------------------------
# softmax

def softmax_inputs(rng, n: int):
    yield "normal", (rng.standard_normal(n) * 4).astype(F32)
    yield "logits", (rng.standard_normal(n) * 20 - 50).astype(F32)
    yield "wide", rng.uniform(-200, 200, n).astype(F32)


@pytest.mark.parametrize("n", LENGTHS)
def test_softmax_model(variant, n):
    rng = np.random.default_rng(200 + n)
    for kind, x in softmax_inputs(rng, n):
        y = np.full(n, np.nan, F32)
        run(variant, "softmax", x, y, n)
        assert_model(y, softmax_c(x), f"softmax {kind} n={n}")
        # accuracy against float64 (docs/kernels.md)
        ref = softmax64(x)
        m = float(np.max(x))
        bound = ref * (np.abs(x - m) + -(-n // 16) + 10) * 2.0 ** -24 + 2.0 ** -147
        assert np.all(np.abs(y - ref) <= bound), f"softmax {kind} n={n}: {np.max(np.abs(y - ref) / bound)}"
        assert abs(float(np.sum(y, dtype=np.float64)) - 1) <= (n + 8) * 2.0 ** -23


def test_softmax_inplace(variant):
    x = (np.random.default_rng(3).standard_normal(1023) * 5).astype(F32)
    exp = softmax_c(x)
    run(variant, "softmax", x, x, x.size)
    assert_model(x, exp, "softmax in place")


@pytest.mark.parametrize("n", (1, 2, 17, 100, 1024, 50257))
def test_softmax_special_values(variant, n):
    rng = np.random.default_rng(n)

    def sm(x):
        y = np.full(n, np.nan, F32)
        run(variant, "softmax", x, y, n)
        return y
    # one dominant value: exactly one-hot
    k = int(rng.integers(0, n))
    x = (rng.standard_normal(n)).astype(F32)
    x[k] = 200
    assert same_bits(sm(x), np.eye(1, n, k, dtype=F32)[0])
    # all equal (any magnitude, +-0 mixed): exactly 1/n
    for c in (0.0, -0.0, 3.5, -1e30, 1e30, -FLT_MAX, 1e-40):
        x = np.full(n, c, F32)
        if c == 0.0:
            x[::2] = -0.0
        assert same_bits(sm(x), np.full(n, F32(1) / F32(n), F32)), c
    # very negative values: the max subtraction keeps it exact where exp(x - m) is
    x = (rng.standard_normal(n) - 1e4).astype(F32)
    ref = softmax64(x)
    assert np.allclose(sm(x), ref, rtol=2e-3, atol=1e-30)
    # -inf entries get probability +0.0 (unless all are -inf)
    x = rng.standard_normal(n).astype(F32)
    if n > 1:
        x[::3] = -np.inf
        y = sm(x)
        assert same_bits(y[::3], np.zeros(y[::3].size, F32)) and np.allclose(y, softmax64(x), rtol=1e-5)
    # all -inf, any NaN, any +inf: NaN everywhere (docs/kernels.md)
    assert np.isnan(sm(np.full(n, -np.inf, F32))).all()
    x = rng.standard_normal(n).astype(F32)
    x[k] = np.nan
    assert np.isnan(sm(x)).all()
    x[k] = np.inf
    assert np.isnan(sm(x)).all()
    # denormal inputs: all exp(~0) = 1
    x = (rng.standard_normal(n) * 1e-40).astype(F32)
    assert same_bits(sm(x), softmax_c(x)) and np.allclose(sm(x), 1 / n, rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# layernorm

def ln_case(rng, n: int, mean=0.3, std=2.0):
    x = (rng.standard_normal(n) * std + mean).astype(F32)
    g = (1 + 0.2 * rng.standard_normal(n)).astype(F32)
    b = (0.1 * rng.standard_normal(n)).astype(F32)
    return x, g, b


def ln(variant, x, g, b, y=None):
    y = np.full(x.size, np.nan, F32) if y is None else y
    run(variant, "layernorm", x, g, b, y, x.size)
    return y


def ln_bound(x, g, y_ref):
    """docs/kernels.md: |y - ref| <= 2^-20 max|ref| + |g| rstd (n/16 + 5) 2^-24 mean|x|."""
    xd = x.astype(np.float64)
    rstd = 1 / np.sqrt(np.var(xd) + 1e-5)
    return (2.0 ** -20 * np.max(np.abs(y_ref))
            + np.abs(g) * rstd * (x.size / 16 + 5) * 2.0 ** -24 * np.mean(np.abs(xd)))


@pytest.mark.parametrize("n", LENGTHS)
def test_layernorm_model(variant, n):
    rng = np.random.default_rng(300 + n)
    for mean, std in ((0.3, 2.0), (50.0, 0.5), (0.0, 1e-3)):
        x, g, b = ln_case(rng, n, mean, std)
        y = ln(variant, x, g, b)
        assert_model(y, layernorm_c(x, g, b), f"layernorm n={n} mean={mean} std={std}")
        ref = layer_norm64(x, g, b)
        err = np.abs(y - ref)
        assert np.all(err <= ln_bound(x, g, ref)), f"n={n}: {err.max()}"
        if n >= 16 and abs(mean) <= 2 * std:                     # well conditioned: 1e-5 of max|y|
            assert err.max() <= 1e-5 * np.max(np.abs(ref)), err.max()


def test_layernorm_inplace(variant):
    x, g, b = ln_case(np.random.default_rng(1), 1600)
    exp = layernorm_c(x, g, b)
    ln(variant, x, g, b, y=x)
    assert_model(x, exp, "layernorm in place")


@pytest.mark.parametrize("n", (1, 2, 17, 768, 1600))
def test_layernorm_special_values(variant, n):
    rng = np.random.default_rng(n)
    _, g, b = ln_case(rng, n)
    # n = 1 or a constant vector with an exact mean: d = 0 exactly, so y = b exactly
    for c in (0.0, -0.0, 1.0, -3.0, 2.0 ** 40, 2.0 ** -140):
        x = np.full(n, c, F32)                      # n*c and every partial sum are exact here
        assert same_bits(ln(variant, x, g, b), b), c
    # constant vector whose mean rounds: y = b + (c - mean) rstd g, with |c - mean| a few ulp of c
    for c in (0.1, -7.3, 1234.567):
        x = np.full(n, c, F32)
        y = ln(variant, x, g, b)
        assert_model(y, layernorm_c(x, g, b), f"constant {c}")
        assert np.all(np.abs(y - b) <= np.abs(g) * 317 * abs(c) * (n / 16 + 5) * 2.0 ** -24)
    # huge and tiny magnitudes, denormals, -0.0
    for scale in (1e15, 1e-20, 1e-41):
        x = (rng.standard_normal(n) * scale).astype(F32)
        x[::5] = -0.0
        y = ln(variant, x, g, b)
        assert_model(y, layernorm_c(x, g, b), f"scale {scale}")
        ref = layer_norm64(x, g, b)
        assert np.all(np.abs(y - ref) <= ln_bound(x, g, ref) + 1e-6 * np.abs(ref)), scale
    # sum((x - mean)^2) overflows: var = inf, rstd = 0, y = b exactly (docs/kernels.md)
    if n > 1:
        x = (rng.standard_normal(n) * 1e20).astype(F32)
        assert same_bits(ln(variant, x, g, b), b)
    # NaN or +-inf anywhere: NaN everywhere
    for bad in (np.nan, np.inf, -np.inf):
        x = rng.standard_normal(n).astype(F32)
        x[n // 2] = bad
        assert np.isnan(ln(variant, x, g, b)).all(), bad


def test_layernorm_order_witness(variant):
    """An input whose sum depends on the order of the adds: 2^24 and then ones (each one added to
    2^24 alone is absorbed, ties to even).  The contract's 16 lanes give 2^24 + 44; exact is 2^24 + 46,
    8 lanes give 2^24 + 40, a sequential sum 2^24, numpy's pairwise sum 2^24 + 36."""
    n = 47
    x = np.ones(n, F32)
    x[0] = 2.0 ** 24
    g = np.ones(n, F32)
    b = np.zeros(n, F32)
    y = ln(variant, x, g, b)
    assert_model(y, layernorm_c(x, g, b), "order witness")
    assert hsum16(x) == 2.0 ** 24 + 44
    lanes8 = np.cumsum(np.vstack([np.zeros((1, 8), F32), lanes16(x, 0).reshape(-1, 8)]), axis=0, dtype=F32)
    alternatives = {tree16(lanes8[-1].tolist() + [0] * 8, add32), np.sum(x, dtype=F32),
                    F32(2.0 ** 24)}                  # 8 lanes, pairwise, sequential
    assert hsum16(x) not in alternatives


# --------------------------------------------------------------------------------------------------
# attention

def attn_case(rng, n_head: int, n_ctx: int, n_pos: int, qscale=0.5):
    q = (rng.standard_normal(n_head * HEAD) * qscale).astype(F32)
    k = rng.standard_normal((n_head, n_ctx, HEAD)).astype(F32)
    v = rng.standard_normal((n_head, n_ctx, HEAD)).astype(F32)
    k[:, n_pos:] = np.nan                            # cache rows past n_pos must not matter
    v[:, n_pos:] = np.nan
    return q, k, v


OUT_FILL = bits_f32(0x7FC0DEAD)


def attn_scratch(n_pos, hb, he) -> int:
    """floats of attention scratch: a row of roundup16(n_pos) per head (at least one row)."""
    return max(1, he - hb) * (-(-n_pos // 16) * 16)


def attn(variant, q, k, v, n_pos, hb, he):
    n_head, n_ctx = k.shape[:2]
    out = np.full(n_head * HEAD, OUT_FILL, F32)
    scratch = np.full(attn_scratch(n_pos, hb, he), OUT_FILL, F32)
    run(variant, "attention", q, k, v, out, scratch, n_pos, n_ctx * HEAD, hb, he)
    untouched = np.ones(n_head * HEAD, bool)
    untouched[hb * HEAD:he * HEAD] = False
    assert same_bits(out[untouched], np.full(untouched.sum(), OUT_FILL, F32)), "wrote other heads"
    return out[hb * HEAD:he * HEAD]


def attn_bound(q, k, v, n_pos, hb, he):
    """docs/kernels.md: |o - ref| <= 2^-20 (n_pos + 64 + max|s|) max|v|, per head."""
    out = []
    for h in range(hb, he):
        s = k[h, :n_pos].astype(np.float64) @ q[h * HEAD:(h + 1) * HEAD].astype(np.float64) / 8
        vmax = np.max(np.abs(v[h, :n_pos]))
        out.append(np.full(HEAD, 2.0 ** -20 * (n_pos + 64 + np.max(np.abs(s))) * vmax))
    return np.concatenate(out) if out else np.zeros(0)


ATTN_CASES = [(n_pos, hr) for n_pos in NPOS for hr in ((0, 12), (3, 7), (11, 12), (5, 5))]


@pytest.mark.parametrize("n_pos,heads", ATTN_CASES)
def test_attention_model(variant, n_pos, heads):
    hb, he = heads
    rng = np.random.default_rng(n_pos * 100 + hb)
    n_ctx = n_pos + int(rng.integers(0, 20))
    q, k, v = attn_case(rng, 12, n_ctx, n_pos)
    got = attn(variant, q, k, v, n_pos, hb, he)
    assert_model(got, attention_c(q, k, v, n_pos, hb, he), f"attention n_pos={n_pos} heads={heads}")
    ref = attention64(q, k, v, n_pos, hb, he)
    assert np.all(np.abs(got - ref) <= attn_bound(q, k, v, n_pos, hb, he))


@pytest.mark.parametrize("n_pos", [255, 256, 257])
@pytest.mark.parametrize("heads", [(0, 9), (2, 7)])
def test_attention_head_groups(variant, n_pos, heads):
    """Around the AVX2 kernel's switch from groups of 4 interleaved heads to single heads (float32 rows
    of 64 KiB = 256 positions), with head counts that leave a partial group (9 = 4 + 4 + 1, 5 = 4 + 1)."""
    hb, he = heads
    rng = np.random.default_rng(n_pos + 17 * hb)
    q, k, v = attn_case(rng, 10, n_pos + 3, n_pos)
    got = attn(variant, q, k, v, n_pos, hb, he)
    assert_model(got, attention_c(q, k, v, n_pos, hb, he), f"attention n_pos={n_pos} heads={heads}")


@pytest.mark.parametrize("n_pos", [511, 512, 513])
@pytest.mark.parametrize("heads", [(0, 9), (2, 7)])
def test_attention_f16_head_groups(n_pos, heads):
    """The same switch for binary16 rows (64 KiB = 512 positions)."""
    check_attention_f16_widened(runner("avx2"), n_pos, heads)


def test_attention_sharp_and_flat(variant):
    """Sharp scores (one key dominates: the output is exactly its value row), flat scores (q = 0: the
    output is the mean of the values) and large scores."""
    rng = np.random.default_rng(11)
    n_pos, n_ctx = 37, 40
    q, k, v = attn_case(rng, 4, n_ctx, n_pos)
    q[:] = 0
    got = attn(variant, q, k, v, n_pos, 0, 4)
    assert_model(got, attention_c(q, k, v, n_pos, 0, 4), "q = 0")
    assert np.allclose(got, v[:, :n_pos].mean(axis=1).reshape(-1), rtol=1e-5, atol=1e-6)
    q = (rng.standard_normal(4 * HEAD)).astype(F32)
    for h in range(4):                               # key t_h aligned with q_h and scaled up
        t = (7 * h + 3) % n_pos
        k[h, t] = q[h * HEAD:(h + 1) * HEAD] * F32(100)
    got = attn(variant, q, k, v, n_pos, 0, 4)
    assert_model(got, attention_c(q, k, v, n_pos, 0, 4), "sharp")
    for h in range(4):
        assert same_bits(got[h * HEAD:(h + 1) * HEAD], v[h, (7 * h + 3) % n_pos]), h
    q *= F32(30)                                     # scores in the thousands
    got = attn(variant, q, k, v, n_pos, 0, 4)
    assert_model(got, attention_c(q, k, v, n_pos, 0, 4), "large scores")


def test_attention_order_witness(variant):
    """dot64 lane order: two keys whose dot products with q = 1 are both 2^24 + 4 in exact
    arithmetic but differ in the contract's 16-lane order; the softmax of the two scores shows it."""
    q = np.ones(HEAD, F32)
    k = np.zeros((1, 2, HEAD), F32)
    v = np.zeros((1, 2, HEAD), F32)
    k[0, 0, [0, 16, 32, 48]] = [2.0 ** 24, 1, 1, 2]  # one lane, c = 0..3: 2^24, 2^24, 2^24, 2^24 + 2
    k[0, 1, [0, 1, 2, 3]] = [2.0 ** 24, 1, 1, 2]     # four lanes; tree: (2^24 + 1) + (1 + 2) -> 2^24 + 4
    v[0, 0] = 1.0
    v[0, 1] = -1.0
    got = attn(variant, q, k, v, 2, 0, 1)
    exp = attention_c(q, k, v, 2, 0, 1)
    assert_model(got, exp, "order witness")
    s = dot64_rows(q, k[0]) * F32(0.125)
    assert s[0] == 2.0 ** 21 + 0.25 and s[1] == 2.0 ** 21 + 0.5    # the contract's order, evaluated
    p1 = 1 / (1 + math.exp(-0.25))
    assert np.allclose(got, 1 - 2 * p1, rtol=1e-6)  # equal scores would give 0


def test_attention_scratch_is_exactly_roundup16_per_head(variant):
    """scratch of exactly (head_end - head_begin) rows of roundup16(n_pos) floats (the guards check
    nothing is written past it) and n_ctx = n_pos (the cache ends right after the last row read)."""
    rng = np.random.default_rng(5)
    for n_pos in (1, 3, 5, 15, 16, 17, 33, 47, 63, 64, 65):
        q, k, v = attn_case(rng, 3, n_pos, n_pos)
        for hb, he in ((1, 2), (0, 3), (1, 3)):
            got = attn(variant, q, k, v, n_pos, hb, he)
            assert_model(got, attention_c(q, k, v, n_pos, hb, he), f"n_pos={n_pos} heads {hb}..{he}")


# --------------------------------------------------------------------------------------------------
# attention over a binary16 cache: gpt2asm_attention_f16_avx2 (the avx2 and avx512 families' kernel)

def attn16(r, q, k16, v16, n_pos, hb, he):
    """gpt2asm_attention_f16 of runner r (guarded, misaligned buffers), and the f32 kernel of the same
    runner on the rows widened to float32: their outputs, which the contract says are the same bits."""
    n_head, n_ctx = k16.shape[:2]
    out = np.full(n_head * HEAD, OUT_FILL, F32)
    scratch = np.full(attn_scratch(n_pos, hb, he), OUT_FILL, F32)
    r("attention16", q, k16, v16, out, scratch, n_pos, n_ctx * HEAD, hb, he)
    untouched = np.ones(n_head * HEAD, bool)
    untouched[hb * HEAD:he * HEAD] = False
    assert same_bits(out[untouched], np.full(untouched.sum(), OUT_FILL, F32)), "wrote other heads"
    return out[hb * HEAD:he * HEAD], attn(r, q, k16.astype(F32), v16.astype(F32), n_pos, hb, he)


@pytest.mark.parametrize("n_pos,heads", [c for c in ATTN_CASES if c[1] != (11, 12)])
def test_attention_f16_is_f32_on_widened_rows(n_pos, heads):
    """The binary16-cache kernel (natively; the avx512 family calls the same one): bit for bit the f32
    kernel on the widened rows and the contract model, within the f32 kernel's bound of float64
    attention on the stored values; cache rows past n_pos (NaN) are never read."""
    check_attention_f16_widened(runner("avx2"), n_pos, heads)


def test_attention_f16_extreme_halves():
    check_attention_f16_extremes(runner("avx2"))


def check_attention_f16_widened(r, n_pos, heads):
    hb, he = heads
    rng = np.random.default_rng(n_pos * 100 + hb + 7)
    n_ctx = n_pos + int(rng.integers(0, 20))
    q, k, v = attn_case(rng, 12, n_ctx, n_pos)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    got, want = attn16(r, q, k16, v16, n_pos, hb, he)
    assert same_bits(got, want)
    kw, vw = k16.astype(F32), v16.astype(F32)
    assert_model(got, attention_c(q, kw, vw, n_pos, hb, he), f"attention f16 n_pos={n_pos} heads={heads}")
    assert np.all(np.abs(got - attention64(q, kw, vw, n_pos, hb, he)) <= attn_bound(q, kw, vw, n_pos, hb, he))


def check_attention_f16_extremes(r):
    """binary16 extremes in the cache: the largest finite half (65504), subnormal halves (2^-24 ..),
    signed zeros, an infinite value row (inf / NaN outputs as the f32 kernel gives them) -- all widened
    exactly, so still the f32 kernel's bits."""
    rng = np.random.default_rng(3)
    for n_pos in (1, 5, 19, 64):
        q, k, v = attn_case(rng, 3, n_pos + 3, n_pos, qscale=0.01)
        k16, v16 = k.astype(np.float16), v.astype(np.float16)
        k16[0, :n_pos, ::3] = np.float16(65504)
        k16[1, :n_pos] = (rng.integers(-1023, 1024, (n_pos, HEAD)) * 2.0 ** -24).astype(np.float16)  # subnormal
        v16[1, :n_pos, ::2] = np.float16(-0.0)
        v16[2, :n_pos, 5] = np.float16(65504)
        v16[2, n_pos - 1, 7] = np.float16(np.inf)
        got, want = attn16(r, q, k16, v16, n_pos, 0, 3)
        assert same_bits(got, want) or np.array_equal(got, want, equal_nan=True), n_pos
        assert_model(got, attention_c(q, k16.astype(F32), v16.astype(F32), n_pos, 0, 3), f"extremes n_pos={n_pos}")


# --------------------------------------------------------------------------------------------------
# several query rows of one head: gpt2asm_attention_rows_{f32,f16}_{avx2,avx512} (the prefill plan's ROWATTN)

# the rows kernels' runners: avx2 and avx512 natively (avx512 emulated if the CPU lacks it), and avx512 under
# the emulator even when the CPU has it ("avx512emu"; small sizes)
ROWS_ISAS = ("avx2", "avx512", "avx512emu")


def rows_runner(isa: str):
    if isa != "avx512emu":
        return runner(isa)
    if "avx512emu" not in _RUNNERS:
        emu, why = emulator()
        _RUNNERS["avx512emu"] = Emulated(emu, "avx512") if emu is not None else f"no AVX-512 emulator: {why}"
    r = _RUNNERS["avx512emu"]
    if isinstance(r, str):
        pytest.skip(r)
    return r


def rows_emulated(r) -> bool:
    return isinstance(r, Emulated)


def rows_case(rng, n_pos: int, n_rows: int, n_ctx: int, dt=F32, qscale=0.5):
    """One head: q [n_rows][ldq], k, v [n_ctx][64] (rows past n_pos + n_rows - 2 NaN: never read)."""
    ldq = HEAD + int(rng.integers(0, 9))
    q = (rng.standard_normal((n_rows, ldq)) * qscale).astype(F32)
    k = rng.standard_normal((n_ctx, HEAD)).astype(dt)
    v = rng.standard_normal((n_ctx, HEAD)).astype(dt)
    k[n_pos + n_rows - 1:] = np.nan
    v[n_pos + n_rows - 1:] = np.nan
    return q, k, v


def rows_scratch(n_pos: int, n_rows: int) -> int:
    return n_rows * (-(-(n_pos + n_rows - 1) // 16) * 16)


def attn_rows(r, q, k, v, n_pos, n_rows, ldo=None):
    """gpt2asm_attention_rows of runner r (guarded, misaligned buffers): the n_rows output rows; the
    floats between rows (ldo > 64) must stay untouched."""
    op = "attnrows" if k.dtype == F32 else "attnrows16"
    ldo = ldo or HEAD + 3
    out = np.full((max(n_rows, 1), ldo), OUT_FILL, F32)
    scratch = np.full(max(rows_scratch(n_pos, n_rows), 1), OUT_FILL, F32)
    r(op, q, k, v, out, scratch, n_pos, n_rows, q.shape[1], ldo)
    assert same_bits(out[:, HEAD:], np.full(out[:, HEAD:].shape, OUT_FILL, F32)), "wrote between rows"
    base = baseline()
    if base is not None and base is not r:             # the AVX-512 kernels: bit for bit the AVX2 ones
        out2 = np.full((max(n_rows, 1), ldo), OUT_FILL, F32)
        base(op, q, k, v, out2, np.full(scratch.shape, OUT_FILL, F32), n_pos, n_rows, q.shape[1], ldo)
        assert same_bits(out, out2), f"{r.name} differs from avx2 (n_pos={n_pos} n_rows={n_rows})"
    return out[:, :HEAD]


def rows_model(q, k, v, n_pos, r):
    """Row r by the contract: gpt2asm_attention_f32 of q[r] over the first n_pos + r (widened) rows."""
    return attention_c(q[r, :HEAD], k.astype(F32)[None], v.astype(F32)[None], n_pos + r, 0, 1)


@pytest.mark.parametrize("isa", ROWS_ISAS)
@pytest.mark.parametrize("dt", [F32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("n_pos", [1, 2, 3, 4, 5, 15, 16, 17, 31, 33, 64, 100, 257, 513])
def test_attention_rows_are_single_rows(isa, dt, n_pos):
    """Every row r < n_rows (1..4) is bit for bit the single-row kernel over n_pos + r positions (the
    contract model; f16: on the widened rows) and within its float64 bound; the kernel reads no cache
    row past n_pos + n_rows - 2 (NaN there) and writes only its rows and R rows of scratch.  avx512:
    also bit for bit the AVX2 rows kernel (attn_rows), and its single-row kernel is avx512's."""
    r = rows_runner(isa)
    if rows_emulated(r) and n_pos not in (1, 2, 5, 16, 17, 33):
        pytest.skip("emulated: small sizes only")
    rng = np.random.default_rng(n_pos * 7 + (dt == F32))
    for n_rows in (1, 2, 3, 4):
        n_ctx = n_pos + n_rows - 1 + int(rng.integers(0, 4))
        q, k, v = rows_case(rng, n_pos, n_rows, n_ctx, dt)
        got = attn_rows(r, q, k, v, n_pos, n_rows)
        kw, vw = k.astype(F32), v.astype(F32)
        for i in range(n_rows):
            exp = rows_model(q, k, v, n_pos, i)
            assert_model(got[i], exp, f"rows n_pos={n_pos} n_rows={n_rows} row {i}")
            single = attn(r, q[i, :HEAD].copy(), kw[None], vw[None], n_pos + i, 0, 1)
            assert same_bits(got[i], single)
            ref = attention64(q[i, :HEAD], kw[None], vw[None], n_pos + i, 0, 1)
            assert np.all(np.abs(got[i] - ref) <= attn_bound(q[i, :HEAD], kw[None], vw[None], n_pos + i, 0, 1))


@pytest.mark.parametrize("isa", ROWS_ISAS)
def test_attention_rows_count_outside_1_to_4_does_nothing(isa):
    r = rows_runner(isa)
    rng = np.random.default_rng(4)
    q, k, v = rows_case(rng, 9, 4, 16)
    for op, kk, vv in (("attnrows", k, v), ("attnrows16", k.astype(np.float16), v.astype(np.float16))):
        for n_rows in (0, 5, 1 << 40):
            out = np.full((4, HEAD), OUT_FILL, F32)
            scratch = np.full(64, OUT_FILL, F32)
            r(op, q, kk, vv, out, scratch, 9, n_rows, q.shape[1], HEAD)
            assert same_bits(out, np.full(out.shape, OUT_FILL, F32))
            assert same_bits(scratch, np.full(64, OUT_FILL, F32))


@pytest.mark.parametrize("isa", ROWS_ISAS)
@pytest.mark.parametrize("dt", [F32, np.float16], ids=["f32", "f16"])
def test_attention_rows_extremes(isa, dt):
    """Sharp scores (row r's output is exactly one value row), q = 0 (the mean of the values), large
    scores, and an infinite value in a row only the last query row reaches (NaN / inf there alone).
    avx512: every case also bit for bit the AVX2 kernel (attn_rows)."""
    r = rows_runner(isa)
    rng = np.random.default_rng(8)
    n_pos, n_rows = 21, 4
    q, k, v = rows_case(rng, n_pos, n_rows, n_pos + 3, dt)
    for i in range(n_rows):                          # row i: key 2i + 1 aligned with q[i], scaled up
        k[2 * i + 1] = (q[i, :HEAD] * 100).astype(dt)
    got = attn_rows(r, q, k, v, n_pos, n_rows)
    for i in range(n_rows):
        assert_model(got[i], rows_model(q, k, v, n_pos, i), f"sharp row {i}")
    q2 = q * F32(30)
    got = attn_rows(r, q2, k, v, n_pos, n_rows)
    for i in range(n_rows):
        assert_model(got[i], rows_model(q2, k, v, n_pos, i), f"large row {i}")
    q0 = np.zeros_like(q)
    v[n_pos + n_rows - 2, 5] = np.inf                # only the last row's range includes it
    got = attn_rows(r, q0, k, v, n_pos, n_rows)
    for i in range(n_rows):
        assert_model(got[i], rows_model(q0, k, v, n_pos, i), f"q = 0 row {i}")
    assert np.isfinite(got[:n_rows - 1]).all() and not np.isfinite(got[n_rows - 1, 5])
    qn = q.copy()                                    # NaN in one query row: that row alone is NaN
    qn[2, 7] = np.nan
    got = attn_rows(r, qn, k, v, n_pos, 3)
    assert np.isnan(got[2]).all() and np.isfinite(got[:2]).all()
    for i in range(2):
        assert_model(got[i], rows_model(qn, k, v, n_pos, i), f"NaN q row {i}")


@pytest.mark.parametrize("isa", ISAS)
def test_attention_rows_page_guards(isa):
    """Natively, in a forked child: q, k, v, out and scratch each butting against a PROT_NONE page on
    one side, then the other (k, v end with row n_pos + n_rows - 2, scratch is exactly n_rows rows)."""
    if isa not in native_isas():
        pytest.skip(f"needs {isa} natively")
    lib = load_lib()
    rng = np.random.default_rng(19)
    jobs = []
    for dt, name in ((F32, f"gpt2asm_attention_rows_f32_{isa}"), (np.float16, f"gpt2asm_attention_rows_f16_{isa}")):
        for n_pos in (1, 2, 7, 16, 17, 40):
            for n_rows in (1, 2, 3, 4):
                q, k, v = rows_case(rng, n_pos, n_rows, n_pos + n_rows - 1, dt)
                q = np.ascontiguousarray(q[:, :HEAD])
                exp = np.stack([rows_model(q, k, v, n_pos, i) for i in range(n_rows)])
                args = (q, k, v, np.zeros((n_rows, HEAD), F32), np.zeros(rows_scratch(n_pos, n_rows), F32),
                        n_pos, n_rows, HEAD, HEAD)
                jobs.append((name, args, exp))

    def child() -> bool:
        ok = True
        for name, args, exp in jobs:
            for at_end in (True, False):
                got = fenced_call(getattr(lib, name), args, 3, at_end)
                ok &= bool(model_equal(got.reshape(exp.shape), exp).all())
        return ok
    run_forked(child)


# --------------------------------------------------------------------------------------------------
# over-read: every buffer against a PROT_NONE page (natively, in a forked child)

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class PageFenced:
    """An anonymous mapping with PROT_NONE pages around a payload that ends exactly at (or starts
    exactly at) a page boundary."""

    def __init__(self, a: np.ndarray, at_end: bool):
        nbytes = a.nbytes
        npages = -(-(nbytes + 64) // _PAGE) + 2
        self.map = mmap.mmap(-1, npages * _PAGE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.off = (npages - 1) * _PAGE - nbytes if at_end else _PAGE
        assert _libc.mprotect(self.base, _PAGE, 0) == 0
        assert _libc.mprotect(self.base + (npages - 1) * _PAGE, _PAGE, 0) == 0
        self.addr = self.base + self.off
        self.nbytes = nbytes
        self.map[self.off:self.off + nbytes] = np.ascontiguousarray(a).tobytes()

    def get(self) -> np.ndarray:
        return np.frombuffer(self.map[self.off:self.off + self.nbytes], F32).copy()


def fenced_call(call, args, out_i: int, at_end: bool) -> np.ndarray:
    """call(*addresses) with every array of args copied into its own PageFenced buffer (ints passed as
    they are), each at the `at_end` side of its fence; returns the contents of array out_i after it."""
    fenced = [a if isinstance(a, int) else PageFenced(a, at_end) for a in args]
    call(*[f if isinstance(f, int) else f.addr for f in fenced])
    return fenced[out_i].get()


def test_page_guards_overread():
    """Natively, in a forked child: every kernel and native variant with every buffer butting against
    a PROT_NONE page on one side, then the other.  Any over-read or over-write faults."""
    lib = load_lib()
    have = sorted(native_isas())
    if not have:
        pytest.skip("no variant runs natively")
    jobs = fence_jobs(np.random.default_rng(9))

    def child() -> bool:
        ok = True
        for isa in have:
            for op, args, out_i, exp in jobs:
                for at_end in (True, False):
                    got = fenced_call(getattr(lib, f"gpt2asm_{op}_f32_{isa}"), args, out_i, at_end)
                    ok &= bool(model_equal(got, exp).all())
        return ok
    run_forked(child)


def fence_jobs(rng):
    """(op, args, index of the output, contract result) for the page-fence tests."""
    jobs = []
    for n in (1, 3, 8, 9, 15, 16, 17, 24, 25, 31, 33, 100):
        x = rng.standard_normal(n).astype(F32)
        g, b = ln_case(rng, n)[1:]
        jobs.append(("expf", (x, np.zeros(n, F32), n), 1, expf_c(x)))
        jobs.append(("gelu", (x, np.zeros(n, F32), n), 1, gelu_c(x)))
        jobs.append(("softmax", (x, np.zeros(n, F32), n), 1, softmax_c(x)))
        jobs.append(("layernorm", (x, g, b, np.zeros(n, F32), n), 3, layernorm_c(x, g, b)))
    for n_pos in (1, 2, 5, 16, 17, 31):
        q, k, v = attn_case(rng, 3, n_pos, n_pos)     # n_ctx = n_pos: the last head ends the cache
        args = (q, k, v, np.zeros(3 * HEAD, F32), np.zeros(attn_scratch(n_pos, 0, 3), F32),
                n_pos, n_pos * HEAD, 0, 3)
        jobs.append(("attention", args, 3, attention_c(q, k, v, n_pos, 0, 3)))
    return jobs


def emulator_raw():
    emu, why = emulator()
    if emu is None:
        pytest.skip(f"no emulator: {why}")
    if not hasattr(emu, "call_raw"):
        pytest.skip("tests/avx512emu.py has no raw-pointer mode (call_raw)")
    return emu


def test_emulated_page_guards_overread():
    """The AVX-512 variants on the emulated CPU in raw-pointer mode, every buffer butting against a
    PROT_NONE host page on one side, then the other: an access to it is a CpuFault."""
    emu = emulator_raw()
    for op, args, out_i, exp in fence_jobs(np.random.default_rng(10)):
        for at_end in (True, False):
            got = fenced_call(lambda *a, op=op: emu.call_raw(f"gpt2asm_{op}_f32_avx512", *a, ret=None),
                              args, out_i, at_end)
            assert_model(got, exp, f"{op} fenced at_end={at_end}")


def test_emulated_raw_misaligned():
    """The AVX-512 variants on the emulated CPU with the native harness's buffers: 4 KiB canaries on
    both sides, misaligned (odd byte offsets too), inputs checked unchanged, in place too."""
    r = EmulatedRaw(emulator_raw(), "avx512")
    rng = np.random.default_rng(12)
    for n in (1, 7, 8, 9, 16, 17, 33, 100, 1023):
        x = mixed(rng, n)
        for op, model in (("expf", expf_c), ("gelu", gelu_c)):
            y = np.empty(n, F32)
            run(r, op, x, y, n)
            assert_model(y, model(x), f"{op} n={n}")
        x = (rng.standard_normal(n) * 5).astype(F32)
        y = np.empty(n, F32)
        run(r, "softmax", x, y, n)
        assert_model(y, softmax_c(x), f"softmax n={n}")
        y = x.copy()
        run(r, "softmax", y, y, n)
        assert_model(y, softmax_c(x), f"softmax in place n={n}")
        x, g, b = ln_case(rng, n)
        y = np.empty(n, F32)
        run(r, "layernorm", x, g, b, y, n)
        assert_model(y, layernorm_c(x, g, b), f"layernorm n={n}")
    for n_pos in (1, 17, 100):
        q, k, v = attn_case(rng, 4, n_pos + 1, n_pos)
        got = attn(r, q, k, v, n_pos, 1, 4)
        assert_model(got, attention_c(q, k, v, n_pos, 1, 4), f"attention n_pos={n_pos}")


def test_cross_variant_bits():
    """AVX2 and AVX-512 (native or emulated) on the same awkward inputs give identical bits, NaN
    payloads included (run() compares every non-AVX2 call with AVX2 as well)."""
    isas = [i for i in ISAS if i in native_isas() or (i == "avx512" and emulator()[0] is not None)]
    if len(isas) < 2:
        pytest.skip(f"only {isas} can run here")
    rng = np.random.default_rng(77)
    for n in (5, 16, 47, 1000):
        x = mixed(rng, n)
        x[::9] = nan_payloads(x[::9].size, rng)
        g, b = rng.standard_normal(n).astype(F32), rng.standard_normal(n).astype(F32)
        outs = {}
        for isa in isas:
            r = runner(isa)
            res = []
            for op in ("expf", "gelu", "softmax"):
                y = np.empty(n, F32)
                r(op, x, y, n)
                res.append(y)
            y = np.empty(n, F32)
            r("layernorm", x, g, b, y, n)
            res.append(y)
            outs[isa] = res
        for a, b_ in zip(outs[isas[0]], outs[isas[1]]):
            assert same_bits(a, b_)


# --------------------------------------------------------------------------------------------------
# argmax (greedy sampling): size_t gpt2asm_argmax_f32_<isa>(const float *x, size_t n)
#   the first maximum (numpy.argmax, -0.0 == +0.0), SIZE_MAX if any NaN or +-inf (docs/kernels.md)

SIZE_MAX = (1 << 64) - 1
DENORM_MIN = float(np.uint32(1).view(F32))


def argmax_ref(x) -> int:
    """The contract: numpy.argmax on finite data, SIZE_MAX if any element is NaN or +-inf."""
    x = np.asarray(x, F32)
    return SIZE_MAX if x.size == 0 or not np.isfinite(x).all() else int(np.argmax(x))


def argmax_fn(lib: ctypes.CDLL, isa: str):
    fn = getattr(lib, f"gpt2asm_argmax_f32_{isa}")
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_size_t
    return fn


class ArgmaxNative:
    """gpt2asm_argmax_f32_<isa> run natively on x copied into a canary-guarded buffer at a rotating
    misalignment (odd byte offsets too); checks the canaries and that x is unchanged; returns the index."""

    def __init__(self, isa: str, lib: ctypes.CDLL | None = None):
        self.isa = isa
        self.lib = lib if lib is not None else load_lib()
        self.name = f"argmax_{isa} (native)"
        self._mis = itertools.cycle(MISALIGN)
        self._seed = itertools.count(1)

    def _invoke(self, addr: int, n: int) -> int:
        return argmax_fn(self.lib, self.isa)(addr, n)

    def __call__(self, x: np.ndarray) -> int:
        x = np.ascontiguousarray(x, F32)
        g = Guarded(x, next(self._mis), next(self._seed))
        r = int(self._invoke(g.addr, x.size))
        g.check(self.name)
        assert np.array_equal(g.payload(), g.orig), f"{self.name} wrote into x"
        return r


class ArgmaxEmulatedRaw(ArgmaxNative):
    """The emulated AVX-512 CPU in raw-pointer mode on ArgmaxNative's guarded, misaligned host buffers."""

    def __init__(self, emu, isa: str = "avx512"):
        super().__init__(isa)
        self.emu = emu
        self.name = f"argmax_{isa} (emulated, raw pointers)"

    def _invoke(self, addr: int, n: int) -> int:
        return self.emu.call_raw(f"gpt2asm_argmax_f32_{self.isa}", addr, n, ret="int")


class ArgmaxEmulated:
    """The emulated AVX-512 CPU: x copied into a page-guarded, read-only buffer."""

    def __init__(self, emu, isa: str = "avx512"):
        self.emu, self.isa = emu, isa
        self.name = f"argmax_{isa} (emulated)"

    def __call__(self, x: np.ndarray) -> int:
        ro = np.array(x, F32, copy=True)
        ro.flags.writeable = False
        return self.emu.call(f"gpt2asm_argmax_f32_{self.isa}", ro, ro.size, ret="int")


def argmax_runner(isa: str):
    if isa in native_isas():
        return ArgmaxNative(isa)
    if isa == "avx512":
        emu, why = emulator()
        if emu is None:
            pytest.skip(f"no AVX-512 on this CPU and no emulator: {why}")
        return ArgmaxEmulated(emu, isa)
    pytest.skip(f"this CPU/OS cannot run {isa}")


@pytest.fixture(params=ISAS)
def amax(request):
    """A callable x -> index (the kernel of one ISA, natively or emulated)."""
    return argmax_runner(request.param)


def check_argmax(amax, x, what: str = "") -> None:
    got, exp = amax(x), argmax_ref(x)
    if got != exp:
        x = np.asarray(x, F32)
        show = lambda i: f"{i} (x = {float(x[i])!r})" if i < x.size else str(i)     # noqa: E731
        raise AssertionError(f"{amax.name} {what} n={x.size}: got {show(got)}, expected {show(exp)}")


# tie offsets: the next lane, the same lane in the other sets / iterations (8-lane AVX2 x4, 16-lane
# AVX-512 x4, 4-lane NEON x4), into the whole-vector and the masked tails
TIE_OFFSETS = (1, 3, 4, 7, 8, 12, 15, 16, 24, 31, 32, 48, 63, 64, 96, 127, 128)
ARGMAX_TIE_LENGTHS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 95, 96, 97, 127,
                      128, 129, 135, 200)


def test_argmax_random(amax):
    """Every length 1..300 and 50257: normal data, and small integers (many ties)."""
    rng = np.random.default_rng(101)
    for n in list(range(1, 301)) + [50257]:
        check_argmax(amax, (rng.standard_normal(n) * 3).astype(F32), "normal")
        check_argmax(amax, rng.integers(-4, 5, n).astype(F32), "small integers")
        check_argmax(amax, mixed(rng, n, with_specials=False), "mixed magnitudes")


def test_argmax_ties_every_position(amax):
    """The maximum at every position p (every lane, every set, the whole-vector and the masked tail),
    tied at later positions in the same lane of the other sets and in other lanes: p wins."""
    rng = np.random.default_rng(102)
    for n in ARGMAX_TIE_LENGTHS:
        for p in range(n):
            x = rng.uniform(-1.0, 0.5, n).astype(F32)
            x[p] = 1.0
            later = [p + d for d in TIE_OFFSETS if p + d < n]
            x[later] = 1.0
            if n - p > 1:
                x[rng.integers(p + 1, n, 3)] = 1.0
            check_argmax(amax, x, f"max at {p}, ties at {later}")
            y = np.full(n, -2.0, F32)                       # everything before p lower, all later tied
            y[p:] = 7.5
            check_argmax(amax, y, f"all from {p} tied")


def test_argmax_ties_large(amax):
    """50257 logits with the maximum tied at scattered positions, the first in each region."""
    rng = np.random.default_rng(103)
    n = 50257
    for first in (0, 5, 31, 64, 1000, 25000, 50176, 50240, 50250, 50255, 50256):
        x = (rng.standard_normal(n) * 3).astype(F32)
        x[first] = 100.0
        tail = rng.integers(first, n, 20)
        x[tail] = 100.0
        check_argmax(amax, x, f"first max at {first}")


def test_argmax_all_equal(amax):
    for n in (1, 2, 7, 8, 9, 16, 17, 33, 64, 65, 100, 257, 50257):
        for c in (0.0, -0.0, 1.5, -7.0, FLT_MAX, -FLT_MAX, DENORM_MIN, -DENORM_MIN, MIN_NORMAL):
            x = np.full(n, c, F32)
            assert amax(x) == 0, (amax.name, n, c)
        z = np.zeros(n, F32)
        z[np.random.default_rng(n).integers(0, 2, n).astype(bool)] = -0.0
        assert amax(z) == 0, (amax.name, n, "mixed zeros")


def test_argmax_signed_zeros(amax):
    """-0.0 == +0.0: whichever zero comes first wins, in every lane/set combination."""
    rng = np.random.default_rng(104)
    for n in (2, 3, 9, 17, 40, 70, 130):
        for _ in range(12):
            p, q = sorted(rng.choice(n, 2, replace=False))
            for zp, zq in ((-0.0, 0.0), (0.0, -0.0), (-0.0, -0.0)):
                x = -rng.uniform(1e-30, 5, n).astype(F32)
                x[p], x[q] = zp, zq
                assert amax(x) == p, (amax.name, n, p, q, zp, zq)
                check_argmax(amax, x, "signed zeros")


def test_argmax_extremes(amax):
    """FLT_MAX, -FLT_MAX, very negative values and denormals compare exactly (no FTZ/DAZ)."""
    rng = np.random.default_rng(105)
    nextup = lambda v: float(np.nextafter(F32(v), F32(np.inf)))                 # noqa: E731
    for n in (1, 5, 8, 13, 16, 29, 64, 77, 200, 1029):
        x = np.full(n, -FLT_MAX, F32)
        check_argmax(amax, x, "all -FLT_MAX")
        p = int(rng.integers(n))
        x[p] = nextup(-FLT_MAX)
        assert amax(x) == p
        x = (rng.standard_normal(n) * 3e37).astype(F32)
        x[rng.integers(0, n, 3)] = FLT_MAX
        check_argmax(amax, x, "FLT_MAX")
        x = -np.exp(rng.uniform(80, 88.7, n)).astype(F32)                     # all around -1e38
        check_argmax(amax, x, "very negative")
        bits = rng.integers(1, 1 << 23, n).astype(np.uint32) | (rng.integers(0, 2, n).astype(np.uint32) << 31)
        x = bits.view(F32)                                                     # denormals of both signs
        check_argmax(amax, x, "denormals")
        x = np.full(n, -DENORM_MIN, F32)
        x[p] = 0.0 if p % 2 else -0.0
        assert amax(x) == p, "a zero above -denorm_min"
        x[:] = -0.0
        x[p] = DENORM_MIN
        assert amax(x) == p, "denorm_min above the zeros"


def test_argmax_nonfinite(amax):
    """A NaN (any payload, quiet or signalling, either sign), +inf or -inf at the first, a middle, the
    last position, in each set and in the tails: SIZE_MAX, whatever the maximum."""
    rng = np.random.default_rng(106)
    nans = nan_payloads(8, rng)
    for n in (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 79, 100, 129, 1000, 50257):
        spots = {0, n // 2, n - 1} | {p for p in (4, 8, 16, 24, 32, 48, 64, 96) if p < n}
        spots |= {n - 1 - k for k in range(min(n, 17))}
        if n > 1000:
            spots = {0, 1, n // 2, 50175, 50176, 50239, 50240, 50250, n - 2, n - 1}
        for p in sorted(spots):
            for bad in (np.inf, -np.inf, nans[p % 8], np.nan):
                x = (rng.standard_normal(n) * 3).astype(F32)
                x[(p + 1) % n] = 50.0                                         # a finite maximum elsewhere
                x[p] = bad
                got = amax(x)
                assert got == SIZE_MAX, (amax.name, n, p, float(bad), got)
    for n in (1, 9, 70):
        assert amax(np.full(n, -np.inf, F32)) == SIZE_MAX
        assert amax(np.full(n, np.inf, F32)) == SIZE_MAX
        assert amax(nan_payloads(n, rng)) == SIZE_MAX


def argmax_fence_jobs(rng):
    """(x, expected) for the page-fence tests: every length 1..70 and a few larger, finite and with a
    non-finite value at the last element (which must then be read)."""
    jobs = []
    for n in list(range(1, 71)) + [100, 127, 128, 129, 255, 1000, 1029]:
        x = (rng.standard_normal(n) * 3).astype(F32)
        jobs.append((x, argmax_ref(x)))
        x = x.copy()
        x[-1] = FLT_MAX
        jobs.append((x, n - 1))
        x = x.copy()
        x[-1] = np.inf
        jobs.append((x, SIZE_MAX))
    return jobs


def test_argmax_page_guards_overread():
    """Natively, in a forked child: x butting against a PROT_NONE page at its end, then its start."""
    lib = load_lib()
    have = sorted(native_isas())
    if not have:
        pytest.skip("no variant runs natively")
    jobs = argmax_fence_jobs(np.random.default_rng(107))
    fns = [argmax_fn(lib, isa) for isa in have]

    def child() -> bool:
        ok = True
        for fn in fns:
            for x, exp in jobs:
                for at_end in (True, False):
                    f = PageFenced(x, at_end)
                    ok &= fn(f.addr, x.size) == exp
        return ok
    run_forked(child)


def test_argmax_emulated_page_guards_overread():
    """gpt2asm_argmax_f32_avx512 on the emulated CPU in raw-pointer mode, x butting against a PROT_NONE
    host page on either side: any access to it is a CpuFault."""
    emu = emulator_raw()
    for x, exp in argmax_fence_jobs(np.random.default_rng(108)):
        for at_end in (True, False):
            f = PageFenced(x, at_end)
            got = emu.call_raw("gpt2asm_argmax_f32_avx512", f.addr, x.size, ret="int")
            assert got == exp, (x.size, at_end, got, exp)


def test_argmax_emulated_raw_misaligned():
    """gpt2asm_argmax_f32_avx512 emulated on the native harness's misaligned canary-guarded buffers."""
    r = ArgmaxEmulatedRaw(emulator_raw())
    rng = np.random.default_rng(109)
    for n in (1, 7, 15, 16, 17, 63, 64, 65, 100, 1023, 50257):
        check_argmax(r, (rng.standard_normal(n) * 3).astype(F32), "normal")
        check_argmax(r, rng.integers(-2, 3, n).astype(F32), "ties")
        x = (rng.standard_normal(n) * 3).astype(F32)
        x[-1] = np.nan
        check_argmax(r, x, "NaN last")


def test_argmax_zero_length():
    """n = 0 (Python never passes it) returns SIZE_MAX without reading x."""
    lib = load_lib()
    for isa in sorted(native_isas()):
        assert argmax_fn(lib, isa)(None, 0) == SIZE_MAX
    emu, _ = emulator()
    if emu is not None:
        assert emu.call("gpt2asm_argmax_f32_avx512", None, 0, ret="int") == SIZE_MAX


def test_argmax_kernels_wrapper():
    """Kernels.argmax: the checked wrapper (int, None for non-finite, InvalidArgumentError otherwise)."""
    load_lib()
    sys.path.insert(0, str(ROOT))
    from gpt2asm.errors import InvalidArgumentError
    from gpt2asm.kernels import Kernels
    fams = sorted(native_isas())
    if not fams:
        pytest.skip("no variant runs natively")
    rng = np.random.default_rng(110)
    for fam in fams:
        k = Kernels(fam)
        try:
            for n in (1, 2, 33, 50257):
                x = (rng.standard_normal(n) * 3).astype(F32)
                i = k.argmax(x)
                assert type(i) is int and i == int(np.argmax(x))
                x[n // 2] = np.nan
                assert k.argmax(x) is None
                x[n // 2] = -np.inf
                assert k.argmax(x) is None
            for bad in (np.zeros(5, np.float64), np.zeros((2, 3), F32), np.zeros(0, F32),
                        np.zeros(10, F32)[::2], [1.0, 2.0], np.zeros(4, np.float16)):
                with pytest.raises(InvalidArgumentError):
                    k.argmax(bad)
        finally:
            k.close()


# --------------------------------------------------------------------------------------------------
# benchmark: python tests/test_kernels_ops.py --bench

def bench(min_time: float = 0.3) -> None:
    lib = load_lib()
    have = native_isas()
    rng = np.random.default_rng(0)

    def timeit(fn, args) -> float:
        """Best of 8 timed loops of >= min_time/8 each (a shared machine: the minimum is the signal)."""
        fn(*args)
        reps = 1
        while True:
            t0 = time.perf_counter_ns()
            for _ in range(reps):
                fn(*args)
            dt = time.perf_counter_ns() - t0
            if dt > min_time * 1e9 / 8:
                break
            reps *= 4
        best = dt / reps
        for _ in range(7):
            t0 = time.perf_counter_ns()
            for _ in range(reps):
                fn(*args)
            best = min(best, (time.perf_counter_ns() - t0) / reps)
        return best

    keep = []

    def buf(a):
        keep.append(a)
        return a.ctypes.data

    def elem(n):
        return buf((rng.standard_normal(n) * 3).astype(F32))
    cases = []
    for n in (768, 1600):
        cases.append(("layernorm", f"n={n}", (elem(n), elem(n), elem(n), elem(n), n), n))
    for n in (3072, 6400):
        cases.append(("gelu", f"n={n}", (elem(n), elem(n), n), n))
    cases.append(("expf", "n=3072", (elem(3072), elem(3072), 3072), 3072))
    for n in (1024, 50257):
        cases.append(("softmax", f"n={n}", (elem(n), elem(n), n), n))
    n_ctx = 1024
    k = buf(rng.standard_normal((12, n_ctx, HEAD)).astype(F32))
    v = buf(rng.standard_normal((12, n_ctx, HEAD)).astype(F32))
    for n_pos in (200, 800):
        args = (elem(12 * HEAD), k, v, elem(12 * HEAD), elem(12 * n_ctx), n_pos, n_ctx * HEAD, 0, 12)
        cases.append(("attention", f"n_pos={n_pos} 12 heads", args, 12 * n_pos))
    empty = 0.0
    if "avx2" in have:
        nop = (lib.gpt2asm_expf_f32_avx2, (elem(16), elem(16), 0))
        empty = min(timeit(*nop) for _ in range(3))
    print(f"ctypes call overhead (expf with n = 0): {empty:.0f} ns: included in ns/call, subtracted "
          "for ns/elem")
    print(f"{'kernel':12s} {'size':22s}" + "".join(f"{isa + ' ns/call':>18s}{'ns/elem':>9s}" for isa in ISAS))
    for op, desc, args, units in cases:
        line = f"{op:12s} {desc:22s}"
        for isa in ISAS:
            if isa not in have:
                line += f"{'(not on this CPU)':>27s}"
                continue
            ns = timeit(getattr(lib, f"gpt2asm_{op}_f32_{isa}"), args)
            line += f"{ns:18.0f}{max(ns - empty, 0) / units:9.3f}"
        print(line)
    print("(attention ns/elem = per head and position; AVX-512 is only benchmarked on a CPU that has it)")
    if "avx2" in have:                       # the prefill's rows: one head, its cache in L2
        print("prefill attention, one head, 4 consecutive query rows: 4 single-row calls against one "
              "gpt2asm_attention_rows call (ns per row and position; the same loop of ctypes calls of "
              "expf with n = 0 subtracted)")

        def calls(fn, arglists):
            def go():
                for a in arglists:
                    fn(*a)
            return go
        nop4 = min(timeit(calls(nop[0], [nop[1]] * 4), ()) for _ in range(3))
        for (dt, sfx), isa in itertools.product(((F32, "f32"), (np.float16, "f16")), sorted(have & {"avx2", "avx512"})):
            single = getattr(lib, f"gpt2asm_attention_{sfx}_{isa if sfx == 'f32' else 'avx2'}")
            rows = getattr(lib, f"gpt2asm_attention_rows_{sfx}_{isa}")
            for n_pos in (256, 512):
                kh, vh = (buf(rng.standard_normal((n_pos + 3, HEAD)).astype(dt)) for _ in range(2))
                q, out, scr = elem(4 * HEAD), elem(4 * HEAD), elem(4 * (n_pos + 16))
                one = [(q + 4 * HEAD * r, kh, vh, out + 4 * HEAD * r, scr, n_pos + r, 0, 0, 1) for r in range(4)]
                t1 = (timeit(calls(single, one), ()) - nop4) / (4 * n_pos)
                t4 = (timeit(rows, (q, kh, vh, out, scr, n_pos, 4, HEAD, HEAD)) - empty) / (4 * n_pos)
                print(f"  {sfx} {isa} n_pos={n_pos}: single rows {t1:.2f}, 4-row calls {t4:.2f} ({t1 / t4:.2f}x)")
    for isa in sorted(have):
        x = np.concatenate([np.linspace(-104, 89, 4_000_000).astype(F32), float_range(80.0, 89.0),
                            float_range(-104.0, -86.0), float_range(0.25, 1.0), float_range(-1.0, -0.25)])
        y = np.empty_like(x)
        getattr(lib, f"gpt2asm_expf_f32_{isa}")(x.ctypes.data, y.ctypes.data, x.size)
        print(f"expf_{isa} accuracy: max {check_expf_accuracy(x, y, isa):.4f} ulp over {x.size} points "
              f"(dense sweep of [-104, 89] and every binary32 of 4 subranges)")


def bench_argmax(reps: int = 300) -> None:
    """Greedy sampling on 50257 logits: gpt2asm_argmax_f32_<isa> (and the checked Kernels.argmax) vs
    numpy's isfinite(x).all() + argmax(x), hot and with the cache evicted (64 MB streamed) before each
    call.  Median and minimum of `reps` calls in us (ctypes call included), interleaved."""
    lib = load_lib()
    have = sorted(native_isas())
    sys.path.insert(0, str(ROOT))
    from gpt2asm.kernels import Kernels
    rng = np.random.default_rng(0)
    n = 50257
    x = (rng.standard_normal(n) * 3).astype(F32)
    evict = np.ones(64 << 20 >> 2, F32)
    readbw = lib.gpt2asm_readbw_f32_avx2 if "avx2" in have else None
    if readbw is not None:
        readbw.argtypes, readbw.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_float
    kern = Kernels(have[-1]) if have else None

    def flush():
        if readbw is not None:
            readbw(evict.ctypes.data, evict.size)
        else:
            evict.sum()

    def numpy_greedy():
        return int(np.argmax(x)) if np.isfinite(x).all() else None
    cases = [(f"gpt2asm_argmax_f32_{isa}", (lambda fn: lambda: fn(x.ctypes.data, n))(argmax_fn(lib, isa)))
             for isa in have]
    if readbw is not None:                   # the memory baseline: stream the same bytes, no compute
        xa = np.empty(n + 64, F32)
        xa = xa[(-xa.ctypes.data) % 64 // 4:][:n - n % 64]
        xa[:] = x[:xa.size]
        cases.append(("(read baseline: readbw_f32_avx2, same bytes)", lambda: readbw(xa.ctypes.data, xa.size)))
    if kern is not None:
        cases.append((f"Kernels.argmax ({kern.family}, checked)", lambda: kern.argmax(x)))
    cases.append(("numpy isfinite().all() + argmax()", numpy_greedy))
    want = int(np.argmax(x))
    for name, fn in cases:
        assert name.startswith("(") or fn() == want
    times = {name: ([], []) for name, _ in cases}
    for _ in range(reps):
        for name, fn in cases:
            flush()
            t0 = time.perf_counter_ns()
            fn()
            t1 = time.perf_counter_ns()
            fn()
            t2 = time.perf_counter_ns()
            times[name][0].append((t1 - t0) / 1e3)
            times[name][1].append((t2 - t1) / 1e3)
    print(f"argmax over n = {n} floats ({4 * n} bytes), {reps} calls each, us per call "
          "(cold: after streaming 64 MB; hot: the call right after)")
    print(f"{'':40s}{'cold median':>12s}{'cold min':>10s}{'hot median':>12s}{'hot min':>10s}")
    for name, (cold, hot) in times.items():
        print(f"{name:40s}{np.median(cold):12.1f}{min(cold):10.1f}{np.median(hot):12.1f}{min(hot):10.1f}")
    if kern is not None:
        kern.close()


if __name__ == "__main__":
    if "--bench-argmax" in sys.argv[1:]:
        bench_argmax()
    elif "--bench" in sys.argv[1:]:
        bench()
    else:
        sys.exit(pytest.main([__file__, "-q"] + sys.argv[1:]))
