"""Warm start: the tiled weight matrices cached on disk and memory-mapped.

    from gpt2asm.tilecache import load_weights_cached
    w = load_weights_cached("models/gpt2", dtype="f32")      # same Weights as weights.load_weights

Tiling ~500 MB of matrices costs seconds at every start; a cache file holds them in the engine's layout
([out/64][in][64] tiles, f32 or f16, or q8_0 / q4_0 block records; the output head; wte as float32
when the checkpoint's own copy cannot be mapped 64-byte aligned), so a warm start maps it (read-only,
zero-copy) and reads from the checkpoint only the small tensors (LayerNorm parameters, biases, wpe), which
it validates as the cold path does.

One cache file per (checkpoint path, dtype, layout version), in `cache_dir`, else $GPT2ASM_CACHE, else
~/.cache/gpt2asm ($GPT2ASM_CACHE=off disables the cache); the least recently used files beyond
$GPT2ASM_CACHE_MAX_GB (default 8) are removed when a new one is written. Never stale: the file stores a
key that must equal the checkpoint's current one, made of

    the resolved path, st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns (ctime cannot be set back, so
    an in-place rewrite that restores mtime still changes the key), SHA-256 of the safetensors header,
    SHA-256 of 64 samples of 4 KiB spread over the data, SHA-256 of config.json, the dtype, the layout and
    format versions, the byte order, and SHA-256 of the code that lays the tiles out (weights.py, this
    module, a registered layout's modules).

A cache is written only from a cold load that validated everything (weights.load_weights), only when the
checkpoint did not change during the load and is not "racy" (its ctime within RACY_SECONDS of the
key's stat, when a later in-place write could get the same coarse timestamps), through a temp file +
fsync + rename (concurrent writers: the last rename wins, each file is whole; a process that mapped the
file it replaced keeps its mapping; no writer ever changes a cache file in place). A cache that is
missing, truncated, corrupt, of another key or of another structure is rebuilt; an unwritable cache
directory, a full disk or any other write failure leaves the cold result, without error.

File format (little-endian):

    0   8  magic b"G2ATILES"
    8   4  format version (FORMAT)         12  4  reserved (0)
    16  8  header length H                 24  8  data offset D (page-aligned)
    32  8  file size                       40 32  SHA-256 of the header
    72  H  header: JSON {"key", "layout", "layout_version", "arrays": [{name, dtype, shape, offset,
           nbytes, crc32}], "samples": SHA-256 of 4 KiB samples of the data, "source", "created"}
    D ...  the arrays, each at a page-aligned offset, in the header's order

Before any pointer can reach assembly the warm path checks: the magic, version, sizes (the file's size
equals the recorded one, so a truncated file is refused before it is mapped), the header's SHA-256, the
key, that every array the layout expects for this checkpoint's config is there with its dtype and shape
(any other array: a native numeric dtype the layout allows), that every offset is page-aligned, in the
data area and non-overlapping, the data samples, and the CRC-32 of every array (zlib.crc32 over threads:
~0.05 s for the 494 MB of 124M fp32 in the page cache; a bit flipped on disk is a rebuild, never a wrong
logit); the engine then checks each array it uses.  $GPT2ASM_CACHE_VERIFY=0 (or off) leaves out the CRCs:
the samples alone catch a torn or zeroed file, not a changed byte between them.

Layouts (how each dtype is stored, what a valid cache holds): gpt2asm.tilelayout.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import math
import mmap
import os
import re
import stat
import struct
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import weights as W
from .errors import CheckpointError, GPT2AsmError, shown
from .hub import CACHE_OFF, own_cache_dir
from .safefs import MAX_JSON, read_bytes
from .tilelayout import (LAYOUTS, Layout, q0_assemble, q0_expected, register_layout,  # noqa: F401
                         tiled_assemble, tiled_expected, tiled_stored)

MAGIC = b"G2ATILES"
FORMAT = 1
_PREFIX = struct.Struct("<8sIIQQQ32s")            # magic, format, reserved, H, D, file size, header sha
PAGE = 4096
MAX_HEADER = 16 << 20
N_SOURCE_SAMPLES = 64                             # 4 KiB samples of the checkpoint's data in the key
N_CACHE_SAMPLES = 256                             # 4 KiB samples of the cache's data, checked on open
SAMPLE = 4096
RACY_SECONDS = 2.0                                # a checkpoint changed more recently is not cached
FREE_MARGIN = 64 << 20                            # leave this much disk free when writing a cache
TMP_MAX_AGE = 3600                                # leftover temp files older than this are removed
MAX_BYTES_DEFAULT = 8 << 30                       # least recently used caches beyond this are removed


class CacheMiss(Exception):
    """The cache file cannot be used (missing, stale, corrupt): the reason, for CacheInfo."""


@dataclass
class CacheInfo:
    status: str                   # 'warm' (mapped), 'built' (cold load, cache written), 'cold' (not written)
    reason: str = ""              # why not warm / why not written
    file: Path | None = None      # the cache file (used or meant)
    seconds: float = 0.0          # time spent in load_weights_cached


# --------------------------------------------------------------------------------------------------
# where, and the key

def verify_requested() -> bool:
    """Whether a warm open checks every array's CRC-32: yes, unless $GPT2ASM_CACHE_VERIFY is off (0, off, no)."""
    return os.environ.get("GPT2ASM_CACHE_VERIFY", "").strip().lower() not in CACHE_OFF


def _crc_mismatch(views: list) -> str | None:
    """The name of the first (name, array, recorded CRC-32) whose data has another CRC-32, else None.
    zlib.crc32 releases the GIL: the arrays go over up to 4 threads."""
    from concurrent.futures import ThreadPoolExecutor
    if not views:
        return None
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1, len(views)))) as ex:
        crcs = list(ex.map(lambda v: zlib.crc32(v[1]), views))
    return next((name for (name, _, want), got in zip(views, crcs) if got != want), None)


def cache_root(cache_dir=None) -> Path | None:
    """The cache directory: cache_dir, else gpt2asm's own cache (hub.own_cache_dir: $GPT2ASM_CACHE,
    $XDG_CACHE_HOME/gpt2asm or ~/.cache/gpt2asm), or None when caching is off ($GPT2ASM_CACHE=off)."""
    if cache_dir is not None:
        return Path(cache_dir)
    return own_cache_dir()


def cache_file(root: Path, source: Path, dtype: str) -> Path:
    layout = LAYOUTS[dtype]
    src = Path(os.path.realpath(source))
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in src.parent.name)[:40] or "model"
    h = hashlib.sha256(os.fsencode(src)).hexdigest()[:16]
    return root / f"{slug}-{h}.{dtype}.L{layout.version}F{FORMAT}.tiles"


_code_hashes: dict = {}


def _code_hash(layout: Layout) -> str:
    mods = ("gpt2asm.tilecache",) + tuple(layout.modules)
    if mods not in _code_hashes:
        h = hashlib.sha256()
        for m in mods:
            mod = sys.modules.get(m) or __import__(m, fromlist=["_"])
            h.update(m.encode() + b"\0" + Path(mod.__file__).read_bytes())
        _code_hashes[mods] = h.hexdigest()
    return _code_hashes[mods]


def _stat_key(st: os.stat_result) -> dict:
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def source_key(file: Path, config_path: Path | None, dtype: str) -> dict:
    """Identity of a checkpoint as it is now, for one dtype (raises OSError when it cannot be read)."""
    layout = LAYOUTS[dtype]
    fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))     # a FIFO must not block us
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        head = os.pread(fd, 8, 0)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        header = os.pread(fd, min(n, W.MAX_HEADER), 8) if 0 < n <= W.MAX_HEADER else b""
        data0 = 8 + len(header)
        span = max(0, st.st_size - data0 - SAMPLE)
        sampler = hashlib.sha256()
        for k in range(N_SOURCE_SAMPLES):
            sampler.update(os.pread(fd, SAMPLE, data0 + span * k // (N_SOURCE_SAMPLES - 1)))
        sampler.update(os.pread(fd, SAMPLE, max(0, st.st_size - SAMPLE)))
    finally:
        os.close(fd)
    try:
        cfg = hashlib.sha256(read_bytes(config_path, MAX_JSON, CheckpointError, "config file")).hexdigest() \
            if config_path else None
    except CheckpointError as e:                          # a FIFO, /dev/zero, too large: the cold loader says so
        raise OSError(errno.EINVAL, str(e)) from None
    return {"path": os.path.realpath(file), **_stat_key(st),
            "header_sha256": hashlib.sha256(head + header).hexdigest(), "samples_sha256": sampler.hexdigest(),
            "config_sha256": cfg, "dtype": dtype, "layout_version": layout.version, "format": FORMAT,
            "byteorder": sys.byteorder, "code_sha256": _code_hash(layout)}


# --------------------------------------------------------------------------------------------------
# reading

def _canon(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _data_samples(buf, data_offset: int, size: int, arrays: list) -> str:
    """SHA-256 of the first and last 4 KiB of every array and of N_CACHE_SAMPLES 4 KiB pieces spread over
    the data area: catches a torn or zeroed file cheaply (the full check is the per-array CRC-32)."""
    h = hashlib.sha256()
    for a in arrays:
        o, n = a["offset"], a["nbytes"]
        h.update(buf[o:o + min(n, SAMPLE)])
        h.update(buf[o + max(0, n - SAMPLE):o + n])
    span = max(0, size - data_offset - SAMPLE)
    for k in range(N_CACHE_SAMPLES):
        o = data_offset + span * k // (N_CACHE_SAMPLES - 1)
        h.update(buf[o:o + SAMPLE])
    return h.hexdigest()


def _open_cache(path: Path, key: dict, expected: dict, extra_dtypes: tuple, verify: bool) -> dict:
    """Map the cache file and return {name: read-only array view}, or raise CacheMiss."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CacheMiss("no cache file") from None
    except OSError as e:
        raise CacheMiss(f"cannot open the cache file: {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheMiss("not a regular file")
        pre = os.pread(fd, _PREFIX.size, 0)
        if len(pre) < _PREFIX.size:
            raise CacheMiss(f"truncated ({st.st_size} bytes)")
        magic, fmt, _res, hlen, data_off, size, hsha = _PREFIX.unpack(pre)
        if magic != MAGIC:
            raise CacheMiss("bad magic")
        if fmt != FORMAT:
            raise CacheMiss(f"format {fmt}, expected {FORMAT}")
        if size != st.st_size:
            raise CacheMiss(f"file is {st.st_size} bytes, its header says {size} (truncated?)")
        if not (0 < hlen <= MAX_HEADER and data_off % PAGE == 0 and _PREFIX.size + hlen <= data_off <= size):
            raise CacheMiss("bad header length or data offset")
        raw = os.pread(fd, hlen, _PREFIX.size)
        if len(raw) != hlen or hashlib.sha256(raw).digest() != hsha:
            raise CacheMiss("header checksum mismatch (corrupt)")
        try:
            head = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise CacheMiss("header is not JSON") from None
        if not isinstance(head, dict) or not isinstance(head.get("arrays"), list):
            raise CacheMiss("header lacks the array table")
        if _canon(head.get("key")) != _canon(key):
            old = head.get("key") if isinstance(head.get("key"), dict) else {}
            diff = sorted(k for k in set(key) | set(old) if old.get(k) != key.get(k))
            raise CacheMiss(f"stale (source changed: {', '.join(diff)})")
        arrays = _check_table(head["arrays"], expected, extra_dtypes, data_off, size)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    views = v = None
    try:
        if _data_samples(mm, data_off, size, arrays) != head.get("samples"):
            raise CacheMiss("data samples mismatch (corrupt)")
        views = []
        for a in arrays:
            v = np.frombuffer(mm, dtype=a["np"], count=a["nbytes"] // a["np"].itemsize, offset=a["offset"])
            if v.ctypes.data % W.ALIGN:
                raise CacheMiss(f"{a['name']}: not {W.ALIGN}-byte aligned")
            views.append((a["name"], v, a.get("crc32")))
        bad = _crc_mismatch(views) if verify else None
        if bad is not None:
            raise CacheMiss(f"{bad}: CRC-32 mismatch (corrupt)")
        return {name: v.reshape(a["shape"]) for (name, v, _), a in zip(views, arrays)}
    except BaseException:
        views = v = None                                  # the map closes with its last view
        raise


def _check_table(table: list, expected: dict, extra_dtypes: tuple, data_off: int, size: int) -> list:
    """The array table, checked against what the layout expects and against the file's bounds."""
    names = [a.get("name") if isinstance(a, dict) else None for a in table]
    if None in names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise CacheMiss("bad array table")
    missing = [n for n in expected if n not in names]
    if missing:
        raise CacheMiss(f"array(s) missing: {', '.join(missing[:3])}")
    out, spans = [], []
    for a in table:
        name = a["name"]
        try:
            a_dt = np.dtype(a.get("dtype"))
        except TypeError:
            raise CacheMiss(f"{name}: bad dtype") from None
        shape = a.get("shape")
        if name in expected:
            dt, want = expected[name]
            if a_dt != dt or shape != list(want):
                raise CacheMiss(f"{name}: {a.get('dtype')} {shape}, expected {dt.str} {list(want)}")
        elif a_dt.str not in extra_dtypes:
            raise CacheMiss(f"unexpected array {shown(name)} ({a.get('dtype')})")
        if not a_dt.isnative or a_dt.hasobject:
            raise CacheMiss(f"{name}: dtype {a_dt.str} is not a native numeric type")
        if not (isinstance(shape, list) and 1 <= len(shape) <= 4
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise CacheMiss(f"{name}: bad shape {shown(shape)}")
        off, nb = a.get("offset"), a.get("nbytes")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (off, nb)):
            raise CacheMiss(f"{name}: bad offset/size")
        if nb != math.prod(shape) * a_dt.itemsize or off % PAGE or off < data_off or off + nb > size:
            raise CacheMiss(f"{name}: offset {off} / {nb} bytes out of bounds or misaligned")
        spans.append((off, off + nb, name))
        out.append({**a, "np": a_dt, "shape": tuple(shape)})
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CacheMiss(f"arrays {n0} and {n1} overlap")
    return out


# --------------------------------------------------------------------------------------------------
# writing

TEMPS = ".*.tiles.*.tmp"                            # the temp files of cache writers (_write_cache)
_WRITER_RE = re.compile(r"\.w-(?P<host>[A-Za-z0-9_-]{1,64})-(?P<pid>\d{1,10})\.[^./]+\.tmp$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", os.uname().nodename if hasattr(os, "uname") else "")[:64] or "host"


def temp_prefix(path: Path) -> str:
    """The name prefix of a temp file that will become `path`: it names the writer (host and process id),
    so that cleanup_temps can tell a dead writer's leftover from a live writer's file."""
    return f".{path.name}.w-{_host()}-{os.getpid()}."


def _writer_gone(name: str) -> bool:
    """True when the temp file's writer ran on this host and no process with its id exists any more."""
    m = _WRITER_RE.search(name)
    if not m or m["host"] != _host() or int(m["pid"]) == os.getpid():
        return False
    try:
        os.kill(int(m["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):                      # EPERM: alive (another user's)
        return False
    return False


def cleanup_temps(root: Path, pattern: str = TEMPS) -> None:
    """Remove the temp files (`pattern` in root) that interrupted writers left: at once when their writer
    (named in the file name, temp_prefix) is gone from this host, else once they are older than
    TMP_MAX_AGE (a writer on another host, or a file of an older version).  Also used for the tokenizer
    cache's temp files."""
    now = time.time()
    try:
        for p in root.glob(pattern):
            try:
                if _writer_gone(p.name) or now - p.stat().st_mtime > TMP_MAX_AGE:
                    p.unlink()
            except OSError:
                pass
    except OSError:
        pass


def _max_bytes() -> int:
    """$GPT2ASM_CACHE_MAX_GB in bytes: a number of GiB ≥ 0, 'inf' = no limit; anything else (unset, NaN,
    negative, not a number) = the default, 8 GiB."""
    try:
        gb = float(os.environ["GPT2ASM_CACHE_MAX_GB"])
    except (KeyError, ValueError):
        return MAX_BYTES_DEFAULT
    if not gb >= 0:                                       # NaN, negative
        return MAX_BYTES_DEFAULT
    return int(min(gb * (1 << 30), float(1 << 62)))       # inf and huge values: no limit


def _evict(root: Path, keep: Path) -> None:
    """Remove the least recently used cache files (mtime: set when written or used) until the directory
    holds at most $GPT2ASM_CACHE_MAX_GB (default 8); `keep` stays. Readers that mapped a removed file keep
    their mapping."""
    files, temps = [], 0
    for p in root.glob("*.tiles"):
        try:
            st = p.stat()
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, p))
    for p in root.glob(TEMPS):                            # live writers' files (the dead ones' are gone:
        try:                                              # cleanup_temps) count against the limit too
            temps += p.stat().st_size
        except OSError:
            pass
    total = sum(f[1] for f in files) + temps
    for _, size, p in sorted(files):
        if total <= _max_bytes():
            break
        if p != keep:
            _unlink(p)
            total -= size


def _touch(path: Path) -> None:
    try:                                                  # recently used, for _evict; best effort
        os.utime(path)
    except OSError:
        pass


def _remove_other_versions(path: Path) -> None:
    """Files of the same checkpoint and dtype in other layout/format versions are dead: remove them."""
    stem = path.name[:path.name.rindex(".L")]
    for p in path.parent.glob(f"{stem}.L*.tiles"):
        if p.name != path.name:
            _unlink(p)


def _write_cache(path: Path, key: dict, layout: Layout, w: W.Weights) -> None:
    """Write the cache atomically (temp file in the same directory, fsync, rename). Raises OSError."""
    arrays = layout.stored(w)
    table, rel = [], 0
    for name, a in arrays.items():
        if not (isinstance(a, np.ndarray) and a.flags.c_contiguous):
            raise ValueError(f"{name}: not a C-contiguous array")
        table.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": rel,
                      "nbytes": a.nbytes, "crc32": zlib.crc32(a)})
        rel += -(-a.nbytes // PAGE) * PAGE
    head = {"key": key, "layout": layout.dtype, "layout_version": layout.version, "arrays": table,
            "source": key["path"], "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "samples": "0" * 64}
    # room for the header with the largest offsets it can hold; the final JSON is no longer than this
    for t in table:
        t["offset"] += 1 << 50
    data_off = -(-(_PREFIX.size + len(json.dumps(head, sort_keys=True).encode())) // PAGE) * PAGE
    for t in table:
        t["offset"] += data_off - (1 << 50)
    size = data_off + rel
    fs = os.statvfs(path.parent)
    if fs.f_bavail * fs.f_frsize < size + FREE_MARGIN:
        raise OSError(errno.ENOSPC, f"not enough free disk space for {size} bytes")
    cleanup_temps(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path), suffix=".tmp")
    try:
        try:
            os.posix_fallocate(fd, 0, size)               # fail now, not halfway, when the disk is full
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
        os.ftruncate(fd, size)
        for t, a in zip(table, arrays.values()):
            _pwrite_all(fd, memoryview(a).cast("B"), t["offset"])
        with mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mm:   # what is in the file
            head["samples"] = _data_samples(mm, data_off, size, table)
        raw = json.dumps(head, sort_keys=True).encode()
        if _PREFIX.size + len(raw) > data_off:
            raise ValueError("cache header grew past the data offset")
        _pwrite_all(fd, memoryview(_PREFIX.pack(MAGIC, FORMAT, 0, len(raw), data_off, size,
                                                hashlib.sha256(raw).digest()) + raw), 0)
        os.fsync(fd)
        os.fchmod(fd, 0o644)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _unlink(tmp)
        raise
    try:                                                  # make the rename durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _pwrite_all(fd: int, mv: memoryview, off: int) -> None:
    while len(mv):
        n = os.pwrite(fd, mv[:1 << 30], off)
        if n <= 0:
            raise OSError(28, "short write")
        mv, off = mv[n:], off + n


def _unlink(p) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------------
# the entry points

_lock = threading.Lock()


def _layout(dtype) -> Layout | None:
    return LAYOUTS.get(dtype) if isinstance(dtype, str) else None


def load_weights_info(path, dtype: str = "f32", cache_dir=None) -> tuple[W.Weights, CacheInfo]:
    """load_weights_cached, also returning how the weights were obtained (CacheInfo)."""
    t0 = time.perf_counter()
    layout = _layout(dtype)
    if layout is None:                                    # not cacheable: the cold loader decides
        w = W.load_weights(path, dtype)
        return w, CacheInfo("cold", f"no cache layout for dtype {dtype!r}", None, time.perf_counter() - t0)
    root = cache_root(cache_dir)
    file, config_path = W._resolve(path)                 # ModelNotFoundError as load_weights raises it
    if root is None:
        w = layout.load(path, dtype)
        return w, CacheInfo("cold", "cache disabled ($GPT2ASM_CACHE=off)", None, time.perf_counter() - t0)
    cpath = cache_file(root, file, dtype)
    t_key = time.time()                                   # no later than the stat the key holds
    try:
        key = source_key(file, config_path, dtype)
    except OSError as e:                                  # unreadable: let the cold loader report it
        w = layout.load(path, dtype)
        return w, CacheInfo("cold", f"cannot read the checkpoint for its key: {e}", cpath,
                            time.perf_counter() - t0)

    # warm: the checkpoint's header and small tensors are validated by the same loader code
    try:
        ld = W._Loader(W.SafetensorsFile(file), config_path)
        expected = layout.expected(ld, dtype)
        arrays = _open_cache(cpath, key, expected, layout.extra_dtypes, verify_requested())
        w = layout.assemble(ld, dtype, arrays)
        _touch(cpath)
        w.cache_key = (root, key)                         # the key describes these weights (weights_digest)
        return w, CacheInfo("warm", "", cpath, time.perf_counter() - t0)
    except CacheMiss as e:
        reason = str(e)
    except GPT2AsmError as e:                             # the cold loader gives the authoritative error
        reason = f"checkpoint: {e}"
    except Exception as e:                                # e.g. a layout out of step with weights.py:
        reason = f"warm path failed: {type(e).__name__}: {e}"     # the cold path is always right

    w = layout.load(path, dtype)                         # cold: validates everything
    try:
        # The key describes what was loaded only if the checkpoint did not change since the key's stat
        # and any change after that stat gets a different ctime: the ctime (set from the kernel's clock,
        # never by a user) must be older than the coarse-timestamp window when the key was taken.
        st = os.stat(file)
        age = t_key - key["ctime_ns"] / 1e9
        if {k: key[k] for k in _stat_key(st)} != _stat_key(st):
            return w, CacheInfo("cold", f"{reason}; not written: the checkpoint changed while loading",
                                cpath, time.perf_counter() - t0)
        if age < RACY_SECONDS:
            return w, CacheInfo("cold", f"{reason}; not written: the checkpoint changed {age:.1f} s ago",
                                cpath, time.perf_counter() - t0)
        with _lock:
            os.makedirs(root, exist_ok=True)
            _write_cache(cpath, key, layout, w)
            _remove_other_versions(cpath)
            _evict(root, cpath)
    except (OSError, ValueError) as e:
        return w, CacheInfo("cold", f"{reason}; not written: {e}", cpath, time.perf_counter() - t0)
    w.cache_key = (root, key)
    return w, CacheInfo("built", reason, cpath, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------------
# the weights' digest (KV snapshots: engine.GPT2.fingerprint), remembered per cache key

FINGERPRINTS = "fingerprints.json"
MAX_FINGERPRINTS = 256


def _arrays_digest(w, extra) -> str:
    c = w.config
    h = hashlib.sha256(_canon([c.n_layer, c.n_embd, c.n_head, c.n_ctx, c.vocab_size, w.dtype, list(extra)])
                       .encode())
    named = [(f.name, getattr(w, f.name)) for f in dataclasses.fields(w) if f.name != "layers"]
    named += [(f"h.{i}.{f.name}", getattr(L, f.name)) for i, L in enumerate(w.layers) for f in dataclasses.fields(L)]
    for name, a in named:
        if not isinstance(a, np.ndarray):
            continue                                      # config, flags, paths; None (no scales, no bias)
        h.update(_canon([name, a.dtype.str, list(a.shape)]).encode())
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        for i in range(0, flat.size, 64 << 20):
            h.update(flat[i:i + (64 << 20)])
    return h.hexdigest()


def weights_digest(w, *extra) -> str:
    """SHA-256 of the configuration, the dtype, `extra` and every byte of every array of a Weights (the
    tiled matrices, scales, vectors, wte, wpe: everything the forward pass reads).  ~0.3 s per GB, so it
    is remembered in <cache>/fingerprints.json under the checkpoint's cache key when load_weights_info
    found the key to describe the loaded weights (w.cache_key; a warm or freshly written cache)."""
    ck = getattr(w, "cache_key", None)
    if ck is None:
        return _arrays_digest(w, extra)
    root, key = ck
    ident = hashlib.sha256(_canon([key, list(extra)]).encode()).hexdigest()
    path = Path(root) / FINGERPRINTS
    try:
        memo = json.loads(read_bytes(path, MAX_JSON, CheckpointError, FINGERPRINTS))
        if not isinstance(memo, dict):
            memo = {}
    except (GPT2AsmError, ValueError, RecursionError):
        memo = {}
    rec = memo.get(ident)
    if isinstance(rec, list) and len(rec) == 2 and isinstance(rec[0], str) and len(rec[0]) == 64:
        return rec[0]
    digest = _arrays_digest(w, extra)
    memo[ident] = [digest, time.time()]
    if len(memo) > MAX_FINGERPRINTS:                      # the most recently computed ones stay
        keep = sorted(memo, key=lambda k: memo[k][1] if isinstance(memo[k], list) and len(memo[k]) == 2
                      and isinstance(memo[k][1], (int, float)) else 0)[-MAX_FINGERPRINTS:]
        memo = {k: memo[k] for k in keep}
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{FINGERPRINTS}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(memo, f)
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise
    except OSError:
        pass                                              # read-only cache: computed again next time
    return digest


def load_weights_cached(path, dtype: str = "f32", cache_dir=None) -> W.Weights:
    """weights.load_weights(path, dtype), with the tiled matrices from (or written to) the tile cache.

    The arrays are bit-identical to load_weights'; on a warm start the cached ones are read-only views of
    the mapped cache file. Any cache problem falls back to the cold load without error."""
    return load_weights_info(path, dtype, cache_dir)[0]
