"""gpt2asm/tilecache.py: warm start from mapped tiles, never stale, always falls back to the cold path."""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import multiprocessing as mp
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from gpt2asm import tilecache as tc
from gpt2asm.errors import InvalidArgumentError, ModelNotFoundError
from gpt2asm.weights import load_weights

pytest.importorskip("safetensors.numpy")
from make_checkpoint import make_checkpoint  # noqa: E402  (tools/ is on sys.path: conftest)

SMALL = dict(size="tiny", vocab=100, n_ctx=32, tokenizer_dir=False)


@pytest.fixture(autouse=True)
def _not_racy(monkeypatch):
    """Checkpoints made by a test are seconds old; the racy guard has its own test."""
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    monkeypatch.delenv("GPT2ASM_CACHE_VERIFY", raising=False)
    monkeypatch.delenv("GPT2ASM_CACHE", raising=False)


@pytest.fixture
def ckpt(tmp_path) -> Path:
    return make_checkpoint(tmp_path / "m", seed=3, layout="hub", **SMALL)


@pytest.fixture
def cdir(tmp_path) -> Path:
    return tmp_path / "cache"


def flat(w) -> dict:
    """Every field of a Weights (layers flattened) -> value."""
    out = {}
    for f in dataclasses.fields(w):
        v = getattr(w, f.name)
        if f.name == "layers":
            out["n_layers"] = len(v)
            for i, L in enumerate(v):
                for g in dataclasses.fields(L):
                    out[f"h.{i}.{g.name}"] = getattr(L, g.name)
        else:
            out[f.name] = v
    return out


def assert_same(got, want) -> None:
    a, b = flat(got), flat(want)
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(y, np.ndarray):
            assert isinstance(x, np.ndarray), k
            assert (x.dtype, x.shape) == (y.dtype, y.shape), k
            assert x.flags.c_contiguous and x.ctypes.data % 64 == 0, k
            assert x.tobytes() == y.tobytes(), f"{k} differs"
        else:
            assert x == y, (k, x, y)


def load(path, dtype, cdir):
    return tc.load_weights_info(path, dtype, cdir)


def cache_path(cdir: Path) -> Path:
    files = list(cdir.glob("*.tiles"))
    assert len(files) == 1, files
    return files[0]


# ---------------------------------------------------------------------------------------------------
# warm == cold

@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
def test_warm_equals_cold_124m(ckpt_124m, tmp_path, dtype):
    t0 = time.perf_counter()
    cold = load_weights(ckpt_124m, dtype)
    t_cold = time.perf_counter() - t0
    built, binfo = load(ckpt_124m, dtype, tmp_path)
    assert binfo.status == "built", binfo
    assert_same(built, cold)
    del built
    t0 = time.perf_counter()
    warm, info = load(ckpt_124m, dtype, tmp_path)
    t_warm = time.perf_counter() - t0
    assert info.status == "warm", info
    assert_same(warm, cold)
    assert not warm.head_w.flags.writeable and not warm.layers[0].fc_w.flags.writeable   # mapped
    print(f"\n124M {dtype}: cold load_weights {t_cold:.3f} s, cold + cache write {binfo.seconds:.3f} s, "
          f"warm {t_warm:.3f} s")
    assert t_warm < 1.0          # ≤ 0.3 s on a quiet machine; loose here for a shared CI machine


def test_warm_equals_cold_layouts_and_dtypes(tmp_path):
    """hf layout (transformer. names), f16-stored checkpoint, untied lm_head -- each warm == cold."""
    from safetensors.numpy import load_file, save_file
    hf = make_checkpoint(tmp_path / "hf", seed=4, layout="hf", **SMALL)
    f16 = make_checkpoint(tmp_path / "f16", seed=5, layout="hub", dtype="f16", **SMALL)
    untied = make_checkpoint(tmp_path / "untied", seed=6, layout="hf", **SMALL)
    t = load_file(untied / "model.safetensors")
    t["lm_head.weight"] = (t["transformer.wte.weight"] * 0.5).astype(np.float32)
    save_file(t, untied / "model.safetensors")
    for d in (hf, f16, untied):
        for dtype in ("f32", "f16", "q8_0"):
            cold = load_weights(d, dtype)
            for want in ("built", "warm"):
                w, info = load(d, dtype, tmp_path / "cache")
                assert info.status == want, (d, dtype, info)
                assert_same(w, cold)


def test_warm_weights_run_the_same(ckpt, cdir, families):
    """The mapped, read-only arrays go through the engine's validation and give the same logits."""
    from gpt2asm.kernels import Kernels
    from gpt2asm.model import Transformer
    load(ckpt, "f32", cdir)
    warm, info = load(ckpt, "f32", cdir)
    assert info.status == "warm"
    ids = [1, 7, 42, 99, 3]
    for fam in families:
        k = Kernels(fam, 1)
        a = Transformer(warm, k).forward(ids)
        b = Transformer(load_weights(ckpt, "f32"), k).forward(ids)
        k.close()
        assert a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------------------------------
# never stale

def test_mtime_change_invalidates(ckpt, cdir):
    load(ckpt, "f32", cdir)
    f = ckpt / "model.safetensors"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    w, info = load(ckpt, "f32", cdir)
    assert info.status == "built" and "stale" in info.reason and "mtime_ns" in info.reason, info
    assert load(ckpt, "f32", cdir)[1].status == "warm"


def test_rewrite_with_other_weights_invalidates(ckpt, cdir):
    old, _ = load(ckpt, "f32", cdir)
    old_head = old.head_w.copy()
    size = (ckpt / "model.safetensors").stat().st_size
    make_checkpoint(ckpt, seed=9, layout="hub", **SMALL)                  # same shapes, other values
    assert (ckpt / "model.safetensors").stat().st_size == size
    w, info = load(ckpt, "f32", cdir)
    assert info.status == "built" and "stale" in info.reason, info
    assert_same(w, load_weights(ckpt, "f32"))
    assert w.head_w.tobytes() != old_head.tobytes()


def test_in_place_rewrite_keeping_mtime_invalidates(ckpt, cdir):
    """Same inode, same size, mtime put back: ctime (and the content samples) still give it away."""
    load(ckpt, "f32", cdir)
    f = ckpt / "model.safetensors"
    st = f.stat()
    n = struct.unpack("<Q", f.read_bytes()[:8])[0]
    hdr = json.loads(f.read_bytes()[8:8 + n])
    b, e = hdr["h.1.mlp.c_fc.weight"]["data_offsets"]
    with open(f, "r+b") as fh:                                            # scale one matrix, in place
        fh.seek(8 + n + b)
        a = np.frombuffer(fh.read(e - b), np.float32) * 2
        fh.seek(8 + n + b)
        fh.write(a.tobytes())
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_ino, f.stat().st_size, f.stat().st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    w, info = load(ckpt, "f32", cdir)
    assert info.status == "built" and "stale" in info.reason, info
    assert_same(w, load_weights(ckpt, "f32"))


def test_config_change_invalidates(ckpt, cdir):
    load(ckpt, "f32", cdir)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["note"] = "changed"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _, info = load(ckpt, "f32", cdir)
    assert info.status == "built" and "config_sha256" in info.reason, info


def test_code_change_invalidates(ckpt, cdir, monkeypatch):
    load(ckpt, "f32", cdir)
    monkeypatch.setattr(tc, "_code_hashes", {k: "0" * 64 for k in tc._code_hashes})
    _, info = load(ckpt, "f32", cdir)
    assert info.status == "built" and "code_sha256" in info.reason, info


def test_dtypes_have_their_own_files(ckpt, cdir):
    for dt in ("f32", "f16", "q8_0"):
        assert load(ckpt, dt, cdir)[1].status == "built"
    for dt in ("f32", "f16", "q8_0"):
        w, info = load(ckpt, dt, cdir)
        assert info.status == "warm" and w.dtype == dt
    assert len(list(cdir.glob("*.tiles"))) == 3


def test_racy_checkpoint_is_not_cached(ckpt, cdir, monkeypatch):
    monkeypatch.setattr(tc, "RACY_SECONDS", 60.0)
    w, info = load(ckpt, "f32", cdir)
    assert info.status == "cold" and "ago" in info.reason, info
    assert not list(cdir.glob("*.tiles")) if cdir.exists() else True
    assert_same(w, load_weights(ckpt, "f32"))


# ---------------------------------------------------------------------------------------------------
# corrupt caches are rebuilt

def _rewrite_header(path: Path, edit) -> None:
    """Edit the JSON header and fix its checksum, so only the structure checks can catch it."""
    raw = path.read_bytes()
    magic, fmt, res, hlen, doff, size, _ = tc._PREFIX.unpack(raw[:tc._PREFIX.size])
    head = json.loads(raw[tc._PREFIX.size:tc._PREFIX.size + hlen])
    edit(head)
    new = json.dumps(head, sort_keys=True).encode()
    assert tc._PREFIX.size + len(new) <= doff
    pre = tc._PREFIX.pack(magic, fmt, res, len(new), doff, size, hashlib.sha256(new).digest())
    with open(path, "r+b") as f:
        f.write(pre + new)


def _truncate(p):
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size - 4096)


def _flip(offset):
    def f(p):
        with open(p, "r+b") as fh:
            fh.seek(offset if offset >= 0 else p.stat().st_size + offset)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 0xFF]))
    return f


def _table_edit(fn):
    return lambda p: _rewrite_header(p, fn)


def _set(name, key, value):
    def edit(h):
        for a in h["arrays"]:
            if a["name"] == name:
                a[key] = value(a) if callable(value) else value
    return edit


CORRUPTIONS = {
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(os.urandom(5000)),
    "truncated": _truncate,
    "truncated-header": lambda p: p.write_bytes(p.read_bytes()[:100]),
    "magic": _flip(0),
    "header-byte": _flip(tc._PREFIX.size + 10),
    "data-first-byte": _flip(-1),
    "offset-out-of-file": _table_edit(_set("head_w", "offset", lambda a: a["offset"] + (1 << 30))),
    "offset-misaligned": _table_edit(_set("head_w", "offset", lambda a: a["offset"] + 64)),
    "offset-in-header": _table_edit(_set("head_w", "offset", 0)),
    "overlap": _table_edit(lambda h: h["arrays"][1].update(offset=h["arrays"][0]["offset"])),
    "shape": _table_edit(_set("head_w", "shape", lambda a: [a["shape"][0] + 1, *a["shape"][1:]])),
    "dtype": _table_edit(_set("h.0.fc_w", "dtype", "<f2")),
    "missing-array": _table_edit(lambda h: h["arrays"].pop()),
    "extra-array": _table_edit(lambda h: h["arrays"].append(dict(h["arrays"][0], name="evil"))),
    "extra-array-odd-dtype": _table_edit(lambda h: h["arrays"].append(dict(h["arrays"][0], name="e", dtype="|O"))),
    "extra-array-past-end": _table_edit(lambda h: h["arrays"].append(
        dict(h["arrays"][0], name="e", offset=h["arrays"][-1]["offset"] + (1 << 20)))),
    "duplicate-name": _table_edit(lambda h: h["arrays"].append(dict(h["arrays"][0]))),
    "key": _table_edit(lambda h: h["key"].update(size=1)),
    "not-a-table": _table_edit(lambda h: h.update(arrays={"a": 1})),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_corrupt_cache_is_rebuilt(ckpt, cdir, how):
    check_rebuilt(ckpt, cdir, "f32", CORRUPTIONS[how])


def check_rebuilt(ckpt, cdir, dtype, corrupt):
    """A cache file damaged by corrupt(path) is rebuilt (the cold result), then loads warm again."""
    cold = load_weights(ckpt, dtype)
    load(ckpt, dtype, cdir)
    corrupt(cache_path(cdir))
    w, info = load(ckpt, dtype, cdir)
    assert info.status == "built", info
    assert_same(w, cold)
    w, info = load(ckpt, dtype, cdir)
    assert info.status == "warm", info
    assert_same(w, cold)


def test_data_corruption_between_samples_caught_by_crc(ckpt, cdir, monkeypatch):
    """A bit flipped where no sample looks: the CRC-32 of every array sees it (a rebuild, the same weights);
    $GPT2ASM_CACHE_VERIFY=0 leaves the CRCs out, and only the samples are checked."""
    monkeypatch.setattr(tc, "N_CACHE_SAMPLES", 2)       # so that the middle of an array is not sampled
    load(ckpt, "f32", cdir)
    p = cache_path(cdir)

    def flip():
        raw = p.read_bytes()
        hlen = tc._PREFIX.unpack(raw[:tc._PREFIX.size])[3]
        head = json.loads(raw[tc._PREFIX.size:tc._PREFIX.size + hlen])
        a = next(a for a in head["arrays"] if a["name"] == "h.0.fc_w")
        _flip(a["offset"] + a["nbytes"] // 2 + 1234)(p)
    flip()
    w, info = load(ckpt, "f32", cdir)
    assert info.status == "built" and "CRC-32" in info.reason, info
    assert_same(w, load_weights(ckpt, "f32"))
    assert load(ckpt, "f32", cdir)[1].status == "warm"
    flip()
    monkeypatch.setenv("GPT2ASM_CACHE_VERIFY", "0")
    assert load(ckpt, "f32", cdir)[1].status == "warm"        # not sampled: not seen without the CRCs
    monkeypatch.delenv("GPT2ASM_CACHE_VERIFY")
    assert load(ckpt, "f32", cdir)[1].status == "built"


# ---------------------------------------------------------------------------------------------------
# a cache that cannot be written is no error

def test_read_only_dir_falls_back(ckpt, tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        def denied(*a, **k):
            raise PermissionError(errno.EACCES, "Permission denied")
        if os.geteuid() == 0:                     # root writes anywhere: make mkstemp fail as it would
            monkeypatch.setattr(tc.tempfile, "mkstemp", denied)
        for _ in range(2):
            w, info = load(ckpt, "f32", ro)
            assert info.status == "cold" and "not written" in info.reason, info
            assert_same(w, load_weights(ckpt, "f32"))
        assert list(ro.iterdir()) == []
    finally:
        os.chmod(ro, 0o755)


def test_read_only_dir_with_a_cache_is_used(ckpt, tmp_path):
    d = tmp_path / "c"
    load(ckpt, "f32", d)
    os.chmod(d, 0o555)
    try:
        w, info = load(ckpt, "f32", d)
        assert info.status == "warm", info
        assert_same(w, load_weights(ckpt, "f32"))
    finally:
        os.chmod(d, 0o755)


def test_cache_dir_that_cannot_exist(ckpt, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    w, info = load(ckpt, "f32", f / "cache")
    assert info.status == "cold" and "not written" in info.reason, info
    assert_same(w, load_weights(ckpt, "f32"))


@pytest.mark.parametrize("where", ["statvfs", "fallocate", "write", "fsync"])
def test_disk_full(ckpt, cdir, monkeypatch, where):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    if where == "statvfs":
        real = os.statvfs
        monkeypatch.setattr(tc.os, "statvfs", lambda p: os.statvfs_result(
            (4096, 4096, 100, 1, 1, 100, 10, 10, 0, 255)) if Path(p) == cdir else real(p))
    elif where == "fallocate":
        monkeypatch.setattr(tc.os, "posix_fallocate", full)
    elif where == "write":
        calls = []
        real = tc._pwrite_all

        def half(fd, mv, off):                    # the disk fills up after a few arrays
            calls.append(1)
            if len(calls) > 3:
                full()
            real(fd, mv, off)
        monkeypatch.setattr(tc, "_pwrite_all", half)
    else:
        monkeypatch.setattr(tc.os, "fsync", full)
    w, info = load(ckpt, "f32", cdir)
    assert info.status == "cold" and ("No space" in info.reason or "not enough" in info.reason), info
    assert_same(w, load_weights(ckpt, "f32"))
    assert list(cdir.iterdir()) == []             # no temp file left behind


def test_disabled_by_environment(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2ASM_CACHE", "off")
    w, info = tc.load_weights_info(ckpt, "f32")
    assert info.status == "cold" and "disabled" in info.reason
    monkeypatch.setenv("GPT2ASM_CACHE", str(tmp_path / "env-cache"))
    assert tc.load_weights_info(ckpt, "f32")[1].status == "built"
    assert tc.load_weights_info(ckpt, "f32")[1].status == "warm"
    assert list((tmp_path / "env-cache").glob("*.tiles"))


def test_errors_are_the_cold_loaders(tmp_path, cdir):
    with pytest.raises(ModelNotFoundError):
        tc.load_weights_cached(tmp_path / "nothing", "f32", cdir)
    with pytest.raises(Exception) as e1:
        load_weights(tmp_path, "f64")
    with pytest.raises(type(e1.value)):
        tc.load_weights_cached(tmp_path, "f64", cdir)


def test_other_versions_are_removed(ckpt, cdir):
    load(ckpt, "f32", cdir)
    p = cache_path(cdir)
    old = p.with_name(p.name.replace(".L1F", ".L0F"))
    p.rename(old)
    other_dtype = p.with_name(p.name.replace(".f32.", ".f16."))
    other_dtype.write_bytes(b"x")
    assert load(ckpt, "f32", cdir)[1].status == "built"
    assert p.exists() and not old.exists() and other_dtype.exists()


def test_least_recently_used_are_evicted(tmp_path, cdir, monkeypatch):
    a = make_checkpoint(tmp_path / "a", seed=1, layout="hub", **SMALL)
    b = make_checkpoint(tmp_path / "b", seed=2, layout="hub", **SMALL)
    load(a, "f32", cdir)
    size = cache_path(cdir).stat().st_size
    monkeypatch.setenv("GPT2ASM_CACHE_MAX_GB", str(1.5 * size / (1 << 30)))
    old = time.time() - 100
    os.utime(cache_path(cdir), (old, old))
    assert load(b, "f32", cdir)[1].status == "built"               # a's cache goes: over the limit
    assert [p.name for p in cdir.glob("*.tiles")] == [tc.cache_file(cdir, b / "model.safetensors", "f32").name]
    assert load(a, "f32", cdir)[1].status == "built"


def test_leftover_temp_files_are_removed(ckpt, cdir):
    cdir.mkdir()
    old = cdir / ".x.tiles.abc.tmp"
    old.write_bytes(b"junk")
    os.utime(old, (time.time() - 2 * tc.TMP_MAX_AGE,) * 2)
    assert load(ckpt, "f32", cdir)[1].status == "built"
    assert not old.exists()


# ---------------------------------------------------------------------------------------------------
# concurrency

def _worker(args):
    path, cdir = args
    tc.RACY_SECONDS = 0.0
    w, info = tc.load_weights_info(path, "f32", cdir)
    return info.status, hashlib.sha256(b"".join(a.tobytes() for L in w.layers for a in (L.fc_w, L.proj_w))
                                       + w.head_w.tobytes()).hexdigest()


def test_concurrent_writers(ckpt, cdir):
    with mp.get_context("spawn").Pool(4) as pool:
        res = pool.map(_worker, [(str(ckpt), str(cdir))] * 4)
    assert len({h for _, h in res}) == 1
    assert all(s in ("built", "warm") for s, _ in res), res
    w, info = load(ckpt, "f32", cdir)
    assert info.status == "warm"
    assert_same(w, load_weights(ckpt, "f32"))
    assert [p.name for p in cdir.iterdir()] == [cache_path(cdir).name]     # no temp files left


def test_mapped_cache_survives_replacement(ckpt, cdir):
    """A process holding the old mapping keeps valid arrays when another process replaces the file."""
    load(ckpt, "f32", cdir)
    w, info = load(ckpt, "f32", cdir)
    assert info.status == "warm"
    before = w.head_w.tobytes()
    cache_path(cdir).unlink()
    assert load(ckpt, "f32", cdir)[1].status == "built"
    assert w.head_w.tobytes() == before


# ---------------------------------------------------------------------------------------------------
# another weight format plugs in (here: int8 tiles + per-output float32 scales)

@dataclasses.dataclass
class _QLayer(tc.W.Layer):
    fc_s: np.ndarray | None = None


@dataclasses.dataclass
class _QWeights(tc.W.Weights):
    head_s: np.ndarray | None = None


def _toy_load(path, dtype):
    w = load_weights(path, "f32")

    def q(t):                                 # int8 tiles + one scale per output, 64-byte aligned
        s = np.abs(t).max(axis=1).reshape(-1) / 127
        qt = tc.W.aligned_empty(t.shape, np.int8)
        qt[:] = np.rint(t / np.where(s == 0, 1, s).reshape(t.shape[0], 1, 64))
        sa = tc.W.aligned_empty(s.shape, np.float32)
        sa[:] = s
        return qt, sa
    layers = []
    for L in w.layers:
        fc, fc_s = q(L.fc_w)
        layers.append(_QLayer(**{**vars(L), "fc_w": fc, "fc_s": fc_s}))
    head, head_s = q(w.head_w)
    return _QWeights(**{**{f.name: getattr(w, f.name) for f in dataclasses.fields(w)},
                        "layers": layers, "head_w": head, "dtype": dtype, "head_s": head_s})


def _toy_expected(ld, dtype):
    exp = tc.tiled_expected(ld, dtype, mat_dtype=np.float32)
    C, V = ld.config.n_embd, ld.config.vocab_size
    for i in range(ld.config.n_layer):
        exp[f"h.{i}.fc_w"] = (np.dtype(np.int8), exp[f"h.{i}.fc_w"][1])
        exp[f"h.{i}.fc_s"] = (np.dtype(np.float32), (4 * C,))
    exp["head_w"] = (np.dtype(np.int8), exp["head_w"][1])
    exp["head_s"] = (np.dtype(np.float32), (-(-V // 64) * 64,))
    return exp


def test_a_registered_layout_with_scales(ckpt, cdir, monkeypatch):
    import functools
    layout = tc.Layout("toyq8", 1, _toy_load, tc.tiled_stored, _toy_expected,
                       functools.partial(tc.tiled_assemble, weights_cls=_QWeights, layer_cls=_QLayer))
    monkeypatch.setitem(tc.LAYOUTS, "toyq8", layout)
    cold = _toy_load(ckpt, "toyq8")
    assert load(ckpt, "toyq8", cdir)[1].status == "built"
    w, info = load(ckpt, "toyq8", cdir)
    assert info.status == "warm", info
    assert isinstance(w, _QWeights) and isinstance(w.layers[0], _QLayer)
    assert_same(w, cold)
    assert w.layers[1].fc_w.dtype == np.int8 and w.head_s.shape == cold.head_s.shape


def test_fifo_in_place_of_the_cache_does_not_block(ckpt, cdir):
    load(ckpt, "f32", cdir)
    p = cache_path(cdir)
    p.unlink()
    os.mkfifo(p)
    w, info = load(ckpt, "f32", cdir)                 # opened non-blocking, refused, replaced by a file
    assert info.status == "built" and "regular" in info.reason, info
    assert p.is_file() and load(ckpt, "f32", cdir)[1].status == "warm"


# ---------------------------------------------------------------------------------------------------
# q8_0: block records (and wte, the dequantized q8_0 embedding), cached and mapped like f32 / f16

@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_q0_expected_covers_every_stored_array(ckpt, dtype):
    """The layout's expected table is exactly what the cold loader stores: no array is left to the
    permissive 'extra' rule."""
    w = load_weights(ckpt, dtype)
    ld = tc.W._Loader(tc.W.SafetensorsFile(ckpt / "model.safetensors"), ckpt / "config.json")
    exp = tc.LAYOUTS[dtype].expected(ld, dtype)
    stored = tc.LAYOUTS[dtype].stored(w)
    assert stored.keys() == exp.keys()
    for name, a in stored.items():
        assert (a.dtype, a.shape) == exp[name], name
    assert all(a.dtype == np.uint8 for n, a in stored.items() if n.endswith("_w"))


@pytest.mark.parametrize("change", ["mtime", "rewrite", "in-place", "config", "quantiser"])
def test_q8_0_stale_cache_is_never_used(ckpt, cdir, monkeypatch, change):
    old, _ = load(ckpt, "q8_0", cdir)
    old_bytes = old.head_w.tobytes() + old.wte.tobytes()
    f = ckpt / "model.safetensors"
    if change == "mtime":
        st = f.stat()
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    elif change == "rewrite":
        make_checkpoint(ckpt, seed=9, layout="hub", **SMALL)               # same shapes, other values
    elif change == "in-place":                                            # scale wte in place, mtime put back
        st = f.stat()
        n = struct.unpack("<Q", f.read_bytes()[:8])[0]
        b, e = json.loads(f.read_bytes()[8:8 + n])["wte.weight"]["data_offsets"]
        with open(f, "r+b") as fh:
            fh.seek(8 + n + b)
            a = np.frombuffer(fh.read(e - b), np.float32) * 2
            fh.seek(8 + n + b)
            fh.write(a.tobytes())
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "config":
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["note"] = "changed"
        (ckpt / "config.json").write_text(json.dumps(cfg))
    else:                                                  # another quantiser: gpt2asm/quant0.py is in the key
        assert "gpt2asm.quant0" in tc.LAYOUTS["q8_0"].modules
        mods = ("gpt2asm.tilecache",) + tuple(tc.LAYOUTS["q8_0"].modules)
        assert mods in tc._code_hashes
        monkeypatch.setitem(tc._code_hashes, mods, "0" * 64)
    w, info = load(ckpt, "q8_0", cdir)
    assert info.status == "built" and "stale" in info.reason, info
    assert_same(w, load_weights(ckpt, "q8_0"))
    if change in ("rewrite", "in-place"):
        assert w.head_w.tobytes() + w.wte.tobytes() != old_bytes
    assert load(ckpt, "q8_0", cdir)[1].status == "warm"


def test_q8_0_quantiser_change_leaves_f32_warm(ckpt, cdir, monkeypatch):
    load(ckpt, "f32", cdir)
    load(ckpt, "q8_0", cdir)
    mods = ("gpt2asm.tilecache",) + tuple(tc.LAYOUTS["q8_0"].modules)
    monkeypatch.setitem(tc._code_hashes, mods, "0" * 64)
    assert load(ckpt, "f32", cdir)[1].status == "warm"
    assert load(ckpt, "q8_0", cdir)[1].status == "built"


Q0_CORRUPTIONS = {
    "records-dtype": _table_edit(_set("h.0.attn_w", "dtype", "<f4")),
    "records-shape": _table_edit(_set("head_w", "shape", lambda a: [a["shape"][0] - 1, *a["shape"][1:]])),
    "records-missing": _table_edit(lambda h: h["arrays"].remove(
        next(a for a in h["arrays"] if a["name"] == "h.1.proj_w"))),
    "wte-out-of-file": _table_edit(_set("wte", "offset", lambda a: a["offset"] + (1 << 30))),
    "data-last-byte": _flip(-1),
    "truncated": _truncate,
}


@pytest.mark.parametrize("how", sorted(Q0_CORRUPTIONS))
def test_q8_0_corrupt_cache_is_rebuilt(ckpt, cdir, how):
    check_rebuilt(ckpt, cdir, "q8_0", Q0_CORRUPTIONS[how])


def test_retired_dtype_cache_file_is_left_alone(ckpt, cdir):
    """A tile-cache file of the retired int8 dtype (docs/notes.md) is never looked up again: loading
    every current dtype works beside it, and asking for the old dtype is its InvalidArgumentError."""
    load(ckpt, "f32", cdir)
    old = cache_path(cdir)
    retired = old.with_name(old.name.replace(".f32.", ".q8."))
    retired.write_bytes(old.read_bytes()[:4096])               # any bytes: nothing reads them
    for dt in ("f32", "f16", "q8_0"):
        load(ckpt, dt, cdir)
        assert load(ckpt, dt, cdir)[1].status == "warm"
    with pytest.raises(InvalidArgumentError, match="'q8' was retired: use 'q8_0'"):
        load(ckpt, "q8", cdir)
