"""gpt2asm/resident.py: the matrices (file-mapped tiles of a warm tile cache, or the separate arrays of a cold
load) packed into one buffer of anonymous memory in the background and adopted between steps.  The copies
are the same bytes, so the logits never change; plans built over the old arrays are rebuilt; nothing is
copied when disabled or when the matrices are already packed."""
from __future__ import annotations

import numpy as np
import pytest

from gpt2asm import tilecache
from gpt2asm.kernels import Kernels
from gpt2asm.model import Transformer
from gpt2asm.resident import Resident, is_mapped, is_packed, matrix_slots
from gpt2asm.weights import load_weights

MATS = ("attn_w", "attn_proj_w", "fc_w", "proj_w")


def mats(w):
    return [getattr(L, n) for L in w.layers for n in MATS] + [w.head_w]


def slots(w):
    return [a for a in (getattr(o, n) for o, n in matrix_slots(w)) if a is not None]


def warm(ckpt, cdir, dtype):
    tilecache.load_weights_cached(ckpt, dtype, cache_dir=cdir)           # builds the cache
    w, info = tilecache.load_weights_info(ckpt, dtype, cache_dir=cdir)
    assert info.status == "warm"
    return w


def run(model, ids):
    s = model.new_state()
    return np.stack([model.step(s, t)[0].copy() for t in ids]), s


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("threads", [1, 2])
def test_adopted_copies_give_the_same_logits(ckpt_tiny, tmp_path, dtype, threads, monkeypatch):
    monkeypatch.delenv("GPT2ASM_RESIDENT", raising=False)
    ids = [50256, 464, 3290, 318, 257, 1332, 286, 262]
    k = Kernels(None, threads)
    try:
        ref, _ = run(Transformer(load_weights(ckpt_tiny, dtype), k), ids)
        w = warm(ckpt_tiny, tmp_path, dtype)
        assert all(is_mapped(a) for a in mats(w))
        m = Transformer(w, k)
        s = m.new_state()
        out = [m.step(s, ids[0])[0].copy()]                 # a plan over the mapped arrays
        old_plan = s.plan
        m.start_resident()
        assert m.resident.reason == "" and m.resident.nbytes > 0
        m.resident.wait(60)
        out += [m.step(s, t)[0].copy() for t in ids[1:]]       # adopted at the next step
        assert m.resident.adopted and not any(is_mapped(a) for a in mats(w))
        assert is_packed(slots(w))
        assert s.plan is not old_plan                       # rebuilt over the copies
        assert np.array_equal(np.stack(out).view(np.uint32), ref.view(np.uint32))
        for a in mats(w):
            assert a.ctypes.data % 64 == 0 and not a.flags.writeable
        pre = m.prefill(m.new_state(), ids)[0]              # and the batched prefill over the copies
        assert np.array_equal(pre.view(np.uint32), ref[-1].view(np.uint32))
    finally:
        k.close()


def test_disabled_or_nothing_mapped(ckpt_tiny, tmp_path, monkeypatch):
    w = warm(ckpt_tiny, tmp_path, "f32")
    monkeypatch.setenv("GPT2ASM_RESIDENT", "0")
    r = Resident(w)
    assert r.reason == "$GPT2ASM_RESIDENT=0" and r.done and not r.poll()
    assert all(is_mapped(a) for a in mats(w))
    monkeypatch.delenv("GPT2ASM_RESIDENT")
    cold = load_weights(ckpt_tiny, "f32")                   # cold weights: separate arrays, packed as well
    before = [a.copy() for a in slots(cold)]
    assert not is_packed(slots(cold))
    r = Resident(cold)
    assert r.reason == "" and r.nbytes == sum(a.nbytes for a in before)
    r.wait(60)
    assert r.poll() and is_packed(slots(cold))
    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(slots(cold), before))
    r = Resident(cold)                                      # already packed: nothing to do
    assert r.reason == "already packed" and r.nbytes == 0 and r.done and not r.poll()


def test_not_enough_memory_keeps_the_mapping(ckpt_tiny, tmp_path, monkeypatch):
    import gpt2asm.resident as R
    monkeypatch.delenv("GPT2ASM_RESIDENT", raising=False)
    monkeypatch.setattr(R, "mem_available", lambda: 1 << 20)
    w = warm(ckpt_tiny, tmp_path, "f32")
    r = Resident(w)
    assert r.reason.startswith("not enough free memory") and not r.poll()
    assert all(is_mapped(a) for a in mats(w))


def test_copy_failure_keeps_running_from_the_mapping(ckpt_tiny, tmp_path, monkeypatch):
    import gpt2asm.resident as R
    monkeypatch.delenv("GPT2ASM_RESIDENT", raising=False)

    def boom(a):
        raise MemoryError("no memory")
    monkeypatch.setattr(R, "_pack", boom)
    w = warm(ckpt_tiny, tmp_path, "f32")
    k = Kernels(None, 1)
    try:
        m = Transformer(w, k)
        m.start_resident()
        m.resident.wait(60)
        s = m.new_state()
        m.step(s, 50256)
        assert isinstance(m.resident.error, MemoryError) and m.resident.adopted
        assert all(is_mapped(a) for a in mats(w))
    finally:
        k.close()


def test_a_copy_in_flight_at_fork_is_made_again_in_the_child(ckpt_tiny, tmp_path, monkeypatch):
    """fork() does not copy the copying thread: the child starts its own copy (resident.py), so its wait()
    returns and poll() adopts the same bytes, instead of waiting forever for a thread it does not have."""
    import sys
    from pathlib import Path
    import threading
    import gpt2asm.resident as res
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from forked import run_forked
    monkeypatch.delenv("GPT2ASM_RESIDENT", raising=False)
    w = warm(ckpt_tiny, tmp_path, "f32")
    before = [a.copy() for a in slots(w)]
    gate, pack = threading.Event(), res._pack
    monkeypatch.setattr(res, "_pack", lambda arrays: (gate.wait(), pack(arrays))[1])
    r = Resident(w)
    assert r.reason == "" and not r.done                    # the parent's copy waits at the gate

    def check():
        gate.set()
        return (r.wait(60) and r.poll() and all(np.array_equal(a, b) for a, b in zip(slots(w), before))
                and not any(is_mapped(a) for a in mats(w)))
    run_forked(check, timeout=120)
    gate.set()
    assert r.wait(60) and r.poll() and all(np.array_equal(a, b) for a, b in zip(slots(w), before))
