"""The whole GPT-2 forward pass on the AVX-512 kernels, run under the emulated CPU, against native AVX2.

The determinism contract says the logits are the same bits on every kernel family.  This machine has no
AVX-512, so the engine (gpt2asm.model.Transformer) runs on an `EmulatedKernels` whose bound callables are
tests/avx512emu.py's raw-pointer mode (`Avx512Emulator.bind`): the engine's raw host addresses are used
as they are (guest VA == host VA, host pages mapped into the emulated CPU on demand), so the kernels read
the real weights and write the real activation buffers, nothing is copied.

A cached step is one call of the plan executor (gpt2asm_plan_run_avx512, docs/kernels.md), which runs
under emulation like any kernel (one emulated CPU: threads=1, so the executor never waits or parks) and
calls the AVX-512 kernels from inside the emulated library.  The full-prefix forward runs the same plan's
jobs layer by layer.

When the logits differ, the failure message names the first kernel calls whose AVX-512 result differs
from AVX2 on the same inputs (`DifferentialKernels` on the per-call path `oracle.step_reference`:
every call runs both ways, and the model goes on with the AVX2 result so that each call is compared on
identical inputs).
"""
from __future__ import annotations

import ctypes
import hashlib
import time
from pathlib import Path

import numpy as np
import pytest

import avx512emu
from avx512emu import Avx512Emulator

if not avx512emu.available():
    pytest.skip(avx512emu.why_unavailable(), allow_module_level=True)

from gpt2asm.cpu import available_families  # noqa: E402
from gpt2asm.kernels import Kernels  # noqa: E402
from gpt2asm.lib import LIB_NAME, PKG_DIR, load_library  # noqa: E402
from gpt2asm.model import Transformer  # noqa: E402
from gpt2asm.tokenizer import Tokenizer  # noqa: E402
from gpt2asm.weights import load_weights  # noqa: E402

import oracle  # noqa: E402

PROMPT = "Alan Turing theorized that computers would one day become"
N_PROMPT = 6           # prompt tokens fed one by one (cached steps) ...
N_STEPS = 4            # ... then greedy steps
DTYPES = ["f32", "f16"]


@pytest.fixture(scope="module")
def native_family():
    if "avx2" not in available_families():
        pytest.skip("the host CPU lacks AVX2/FMA/F16C: no native reference")
    return "avx2"


@pytest.fixture(scope="module")
def emu() -> Avx512Emulator:
    lib = load_library()                                  # the library the native kernels use
    e = Avx512Emulator(PKG_DIR / LIB_NAME, timeout=300.0)
    emulated_id = e.read_cstring(e.call("gpt2asm_build_id"))
    if emulated_id != lib.gpt2asm_build_id():
        e.close()
        pytest.fail("the library on disk changed after gpt2asm loaded it (rebuilt meanwhile?)")
    yield e
    e.close()


class EmulatedKernels(Kernels):
    """The avx512 family, every kernel run on the emulated CPU; pointers are raw host addresses."""

    def __init__(self, emulator: Avx512Emulator):
        self.emulator = emulator
        super().__init__("avx512", threads=1)             # one emulated CPU: no worker pool

    def _choose(self, family):
        return "avx512"                                   # no CPUID probing: the host has no AVX-512

    def _bind(self, name, argtypes):
        return self.emulator.bind(name, ret="int" if name.startswith("gpt2asm_plan_step") else None)

    def _address(self, name):                             # kernels a job calls by address (J_FN)
        return self.emulator.address_of(name)


# --------------------------------------------------------------------------------------------------
# per-call comparison, for the failure message

def _f32(addr: int, n: int) -> np.ndarray:
    return np.frombuffer(ctypes.string_at(addr, 4 * n), np.float32).copy()


def _written(op: str, args) -> list[tuple[int, int]]:
    """(address, float count) of what a call writes and is specified (docs/kernels.md)."""
    if op.startswith("matvec"):
        w, x, b, y, n_in, t0, t1 = args
        return [(y + 256 * t0, 64 * (t1 - t0))]
    if op == "layernorm_f32":
        return [(args[3], args[4])]
    if op in ("gelu_f32", "expf_f32", "softmax_f32"):
        return [(args[1], args[2])]
    if op == "attention_f32":
        q, k, v, out, scratch, n_pos, stride, h0, h1 = args       # scratch row i: p of head h0 + i
        return [(out + 256 * h0, 64 * (h1 - h0))] + [(scratch + 4 * i * (-(-n_pos // 16) * 16), n_pos)
                                                     for i in range(h1 - h0)]
    raise KeyError(op)


def _hexf(a: np.ndarray, i: int) -> str:
    return f"{float(a[i]):.9g} (0x{int(a[i:i + 1].view(np.uint32)[0]):08x})"


def _describe(op: str, args, inputs: np.ndarray | None, region: int, got: np.ndarray,
              want: np.ndarray, call: int) -> str:
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    i = int(bad[0])
    if op.startswith("matvec"):
        _, _, b, _, n_in, t0, t1 = args
        where = f"(n_in={n_in}, tiles {t0}..{t1}, bias={'yes' if b else 'NULL'}): output {64 * t0 + i}"
    elif op == "attention_f32":
        n_pos, h0 = args[5], args[7]
        where = (f"(n_pos={n_pos}, heads {h0}..{args[8]}): "
                 + (f"out[head {h0 + i // 64}][{i % 64}]" if region == 0 else
                    f"scratch p[{i}] of head {h0 + region - 1}"))
    else:
        where = f"(n={args[-1]}): y[{i}]"
        if inputs is not None:
            where += f" for x[{i}] = {_hexf(inputs, i)}"
    return (f"call #{call} {op} {where}: AVX-512 {_hexf(got, i)} != AVX2 {_hexf(want, i)}; "
            f"{bad.size} of {got.size} values differ")


class DifferentialKernels(Kernels):
    """Each kernel call runs emulated (AVX-512) and natively (AVX2) on the same inputs; differences are
    recorded in self.mismatches, and the model continues with the AVX2 result."""

    def __init__(self, emulator: Avx512Emulator):
        self.emulator = emulator
        self.native = Kernels("avx2")
        self.mismatches: list[str] = []
        self.calls = 0
        super().__init__("avx512", threads=1)

    def _choose(self, family):
        return "avx512"

    def _bind(self, name, argtypes):
        if not name.endswith("_avx512"):        # avx2 kernels the avx512 family shares (attention_f16)
            return super()._bind(name, argtypes)
        op = name[len("gpt2asm_"):-len("_avx512")]
        if op in ("plan_run", "plan_step"):     # a whole step: not comparable call by call (unused here)
            return self.emulator.bind(name, ret="int" if op == "plan_step" else None)
        emulated, native = self.emulator.bind(name), getattr(self.native, op)

        def fn(*args):
            self.calls += 1
            regions = _written(op, args)
            before = [ctypes.string_at(a, 4 * n) for a, n in regions]       # outputs may alias inputs
            inputs = _f32(args[0], args[-1]) if op in ("gelu_f32", "expf_f32", "softmax_f32",
                                                      "layernorm_f32") else None
            emulated(*args)
            got = [_f32(a, n) for a, n in regions]
            for (a, n), b in zip(regions, before):
                ctypes.memmove(a, b, 4 * n)
            native(*args)
            for r, ((a, n), g) in enumerate(zip(regions, got)):
                want = _f32(a, n)
                if not np.array_equal(g.view(np.uint32), want.view(np.uint32)):
                    self.mismatches.append(_describe(op, args, inputs, r, g, want, self.calls))
        return fn


def first_kernel_mismatches(emulator, weights, ids: list[int], limit: int = 6) -> str:
    k = DifferentialKernels(emulator)
    model = Transformer(weights, k)
    st = model.new_state()
    for t in ids:
        oracle.step_reference(model, st, t)          # the per-call path: every kernel call compared
    k.native.close()
    if not k.mismatches:
        return f"no single kernel call differs ({k.calls} calls compared)"
    more = len(k.mismatches) - limit
    return ("first differing kernel calls (same inputs, AVX-512 emulated vs AVX2 native):\n  "
            + "\n  ".join(k.mismatches[:limit]) + (f"\n  ... and {more} more" if more > 0 else ""))


# --------------------------------------------------------------------------------------------------
# the tests

def prompt_ids(ckpt: Path) -> list[int]:
    ids = Tokenizer.from_dir(ckpt).encode(PROMPT)[:N_PROMPT]
    assert len(ids) == N_PROMPT
    return ids


def cached_steps(model: Transformer, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Feed the prompt token by token, then `steps` greedy tokens: (all ids, logits of every step)."""
    st = model.new_state()
    ids, out = list(prompt), []
    for t in prompt:
        out.append(model.step(st, t)[0].copy())
    for _ in range(steps):
        ids.append(int(np.argmax(out[-1])))
        out.append(model.step(st, ids[-1])[0].copy())
    return ids, np.stack(out)


def fingerprint(logits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(logits, np.float32).tobytes()).hexdigest()


def compare_with_native(emu, ckpt: Path, dtype: str, *, full_prefix: bool, report) -> None:
    weights = load_weights(ckpt, dtype)
    prompt = prompt_ids(ckpt)
    native = Kernels("avx2")
    want_ids, want = cached_steps(Transformer(weights, native), prompt, N_STEPS)
    native.close()

    model = Transformer(weights, EmulatedKernels(emu))
    stats0 = dict(emu.raw_stats)
    t0 = time.perf_counter()
    got_ids, got = cached_steps(model, prompt, N_STEPS)
    t_steps = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = model.forward(want_ids) if full_prefix else None
    t_full = time.perf_counter() - t0
    calls = emu.raw_stats["calls"] - stats0["calls"]
    faults = emu.raw_stats["faults"] - stats0["faults"]
    report(f"{ckpt.name} {dtype}: {len(want)} cached steps {t_steps:.1f} s"
           + (f", full-prefix forward of {len(want_ids)} tokens {t_full:.1f} s" if full_prefix else "")
           + f" under emulation ({calls} kernel calls, {faults} page faults resolved); "
           f"fingerprint {fingerprint(want)[:16]}")

    diff = [i for i in range(min(len(got), len(want)))
            if not np.array_equal(got[i].view(np.uint32), want[i].view(np.uint32))]
    if diff or got_ids != want_ids:
        where = f"steps {diff} of {len(want)} differ" if diff else "greedy tokens differ"
        pytest.fail(f"{ckpt.name} {dtype}: AVX-512 (emulated) logits != AVX2 (native): {where} "
                    f"(fingerprints {fingerprint(got)[:16]} vs {fingerprint(want)[:16]}); "
                    + first_kernel_mismatches(emu, weights, want_ids[:len(want)]))
    assert fingerprint(got) == fingerprint(want)
    if full_prefix:
        bad = [i for i in range(len(want)) if not np.array_equal(full[i].view(np.uint32),
                                                                 want[i].view(np.uint32))]
        assert not bad, (f"{ckpt.name} {dtype}: emulated full-prefix forward != native cached steps at "
                         f"positions {bad}")


@pytest.fixture
def report(capsys, record_property):
    def say(line: str):
        record_property("emulated_model", line)
        with capsys.disabled():
            print("\n" + line)
    return say


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_model_avx512_emulated_equals_avx2(emu, native_family, ckpt_tiny, dtype, report):
    """Tiny checkpoint (2 layers, 128 wide, 2 heads, vocab 50257): 6 prompt tokens + 4 greedy steps,
    every step's logits bit-identical, and the full-prefix forward under emulation equal to them."""
    compare_with_native(emu, ckpt_tiny, dtype, full_prefix=True, report=report)


@pytest.fixture(scope="module")
def ckpt_124m_2layer(tokenizer_dir) -> Path:
    """The GPT-2 124M shape (768 wide, 12 heads, vocab 50257) with only 2 layers."""
    from conftest import checkpoint
    return checkpoint("124M-2layer", tokenizer_dir, size="124M", n_layer=2, seed=3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_124m_shape_2_layers_avx512_emulated_equals_avx2(emu, native_family, ckpt_124m_2layer, dtype,
                                                         report):
    """The real widths (matvec n_in 768/3072, 12 heads, the 786-tile LM head over 768 inputs)."""
    compare_with_native(emu, ckpt_124m_2layer, dtype, full_prefix=False, report=report)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_kernel_call_of_the_tiny_model_bit_identical(emu, native_family, ckpt_tiny, dtype):
    """Kernel by kernel on the model's real inputs (4 tokens): each AVX-512 call's output (including the
    attention probabilities left in scratch) equals the AVX2 call's on identical inputs."""
    msg = first_kernel_mismatches(emu, load_weights(ckpt_tiny, dtype), prompt_ids(ckpt_tiny)[:4])
    assert msg.startswith("no single kernel call differs"), msg


# --------------------------------------------------------------------------------------------------
# the raw-pointer mode itself

def test_raw_call_reads_and_writes_host_arrays_in_place(emu):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(3000) * 20).astype(np.float32)
    y, ref = np.full_like(x, np.nan), np.empty_like(x)
    emu.call("gpt2asm_expf_f32_avx512", x, ref, x.size)                # copy mode
    expf = emu.bind("gpt2asm_expf_f32_avx512")
    assert expf(x.ctypes.data, y.ctypes.data, x.size) is None
    assert np.array_equal(y.view(np.uint32), ref.view(np.uint32))
    assert emu.last.raw_faults >= 1                                    # host pages were mapped on demand
    expf(x.ctypes.data, x.ctypes.data, x.size)                         # in place, same buffer
    assert np.array_equal(x.view(np.uint32), ref.view(np.uint32))
    want = np.empty(3, np.float32)
    emu.call("gpt2asm_expf_f32_avx512", ref[:3].copy(), want, 3)
    out = np.full(8, -1.0, np.float32)
    emu.call_raw("gpt2asm_expf_f32_avx512", ref, out[2:], 3)           # arrays pass their address
    assert np.array_equal(out[2:5].view(np.uint32), want.view(np.uint32))
    assert (out[:2] == -1).all() and (out[5:] == -1).all()              # masked tail: nothing else


def test_raw_call_faults_are_reported_and_the_emulator_stays_usable(emu):
    import mmap
    x = np.ones(64, np.float32)
    expf = emu.bind("gpt2asm_expf_f32_avx512")
    with pytest.raises(avx512emu.CpuFault, match="read at .*not mapped in the host process") as e:
        expf(0x1000, x.ctypes.data, 16)                                # nothing is mapped at 4 KiB
    assert e.value.vector == 14 and e.value.cr2 == 0x1000
    ro = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ)             # read-only in the host
    ro_addr = np.frombuffer(ro, np.uint8).ctypes.data
    with pytest.raises(avx512emu.CpuFault, match="write at .*read-only host mapping"):
        expf(x.ctypes.data, ro_addr, 16)
    zeros = np.frombuffer(ro, np.float32)                              # reading it is fine
    y = np.zeros(16, np.float32)
    expf(zeros.ctypes.data, y.ctypes.data, 16)
    assert (y == 1.0).all()
    guard = emu._va(emu._p_image - 1)                                  # the guard page before the library
    with pytest.raises(avx512emu.CpuFault, match="read at .*guard page"):
        expf(guard, y.ctypes.data, 16)                                 # stays a guard in raw mode
    expf(x.ctypes.data, y.ctypes.data, 16)
    assert np.array_equal(y.view(np.uint32), np.full(16, y[0]).view(np.uint32))
    assert abs(float(y[0]) - np.e) < 1e-6
