"""GPT-2's files from the Hugging Face hub: name resolution, cache look-up, download, verification.

    python -m gpt2asm --model gpt2-medium "..."     # a hub name instead of a directory
    GPT2.load("distilgpt2")

A hub name resolves to a snapshot directory holding model.safetensors, vocab.json, merges.txt and
config.json, looked for in this order:

1. the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub), under the
   repository's id (models--openai-community--gpt2) and its legacy short id (models--gpt2): the snapshot
   of the pinned revision first, then the one refs/main points to, then any complete one;
2. gpt2asm's own cache ($GPT2ASM_CACHE, else $XDG_CACHE_HOME/gpt2asm, else ~/.cache/gpt2asm),
   models/<org>--<name>/<revision>/;
3. a download with huggingface_hub (a dependency of gpt2asm, imported only here and only when needed) into the Hugging Face cache that transformers shares — or into gpt2asm's
   own cache when that one is not writable. The endpoint is huggingface_hub's own default, overridden
   by $HF_ENDPOINT; $HF_HUB_OFFLINE (or $TRANSFORMERS_OFFLINE) forbids the download.

Downloads come from one fixed revision: the pinned commit where we know it (openai-community/gpt2),
otherwise the commit `main` points to when the download starts, so the four files always belong
together. huggingface_hub writes each file under a temporary name and renames it into place when it is
complete, retries a dropped connection from where it stopped (an HTTP Range request), and shows a
progress bar on stderr. Every file is then verified: against the pinned size and SHA-256 where known,
and against the hub's own content hash (the blob name in the cache: SHA-256 for large files, git's
blob SHA-1 for small ones) otherwise. A file that fails is deleted from the cache, so a rerun downloads
it again, and the failure is a DownloadError. A successful check is remembered (by path, size, mtime
and inode in <gpt2asm cache>/verified.json), so a 500 MB file is hashed once, not at every start.

Pins can be replaced for a mirror or a test: `pins=` arguments, or $GPT2ASM_HUB_PINS naming a JSON
file {repo_id: {"revision": COMMIT, "files": {name: {"size": N, "sha256": HEX}}}}.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DownloadError, GPT2AsmError, InvalidArgumentError, ModelNotFoundError, say, shown
from .safefs import MAX_JSON, expand_user, read_text

FILES = ("model.safetensors", "vocab.json", "merges.txt", "config.json")
NEEDED = ("model.safetensors", "vocab.json", "merges.txt")

# short name -> repository id on the hub
MODELS = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
_REPO_TO_NAME = {v: k for k, v in MODELS.items()}


@dataclass(frozen=True)
class FilePin:
    sha256: str
    size: int | None = None


@dataclass(frozen=True)
class Pin:
    revision: str                                    # a 40-hex commit id
    files: dict = field(default_factory=dict)       # file name -> FilePin


PINS: dict[str, Pin] = {
    "openai-community/gpt2": Pin("607a30d783dfa663caf39e06633721c8d4cfcd7e", {
        "model.safetensors": FilePin("248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707",
                                     548_105_171),
        "vocab.json": FilePin("196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783", 1_042_301),
        "merges.txt": FilePin("1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
        "config.json": FilePin("0daed7749b4f02b8f76240d5444551d7b08712dab4d0adb8239c56ba823bb7b4"),
    }),
}

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 22


# ----------------------------------------------------------------------------------------------------
# names, places, pins

def repo_id(name: str) -> str | None:
    """The hub repository for a model name ('gpt2', 'openai-community/gpt2', ...), or None."""
    if not isinstance(name, str):
        return None
    n = name.strip()
    if n.lower() in MODELS:
        return MODELS[n.lower()]
    return n if n in _REPO_TO_NAME else None


def is_hub_name(name) -> bool:
    return repo_id(name) is not None


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def offline() -> bool:
    """True when the environment forbids hub access (huggingface_hub's and transformers' variables)."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, resolved from the environment now (as huggingface_hub does at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        if os.environ.get(var):
            d = expand_user(os.path.expandvars(os.environ[var]), f"${var}")
            return d / "hub" if var == "HF_HOME" else d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "huggingface" / "hub"


CACHE_OFF = {"off", "0", "no", "none", "false", "disabled"}     # $GPT2ASM_CACHE values (or blank): no cache


def own_cache_dir() -> Path | None:
    """gpt2asm's own cache -- the tile cache, the tokenizer's, verified.json, and models downloaded when the
    Hugging Face cache is read-only: $GPT2ASM_CACHE, else $XDG_CACHE_HOME/gpt2asm, else ~/.cache/gpt2asm;
    None when $GPT2ASM_CACHE is off (CACHE_OFF or blank)."""
    env = os.environ.get("GPT2ASM_CACHE")
    if env is not None:
        if not env.strip() or env.strip().lower() in CACHE_OFF:
            return None
        return expand_user(env, "$GPT2ASM_CACHE")
    if os.environ.get("XDG_CACHE_HOME", "").strip():
        return expand_user(os.environ["XDG_CACHE_HOME"], "$XDG_CACHE_HOME") / "gpt2asm"
    return expand_user("~", "the home directory (for ~/.cache/gpt2asm)") / ".cache" / "gpt2asm"


def endpoint() -> str | None:
    """$HF_ENDPOINT when set (read now), else None: huggingface_hub's own default."""
    e = os.environ.get("HF_ENDPOINT", "").strip()
    return e.rstrip("/") or None


def valid_url(url: str) -> bool:
    """Whether url is an http(s) URL with a host (and a valid port, if any)."""
    from urllib.parse import urlsplit
    try:
        u = urlsplit(url)
        u.port                                        # raises ValueError when out of range or not a number
    except ValueError:
        return False
    return u.scheme in ("http", "https") and bool(u.hostname)


def load_pins(pins: dict | None = None) -> dict[str, Pin]:
    """The pins in force: `pins` if given, else $GPT2ASM_HUB_PINS's file if set, else PINS."""
    if pins is not None:
        return {k: _as_pin(k, v) for k, v in pins.items()}
    path = os.environ.get("GPT2ASM_HUB_PINS")
    if not path:
        return dict(PINS)
    try:
        raw = json.loads(read_text(path, MAX_JSON, InvalidArgumentError, "pins file"))
        if not isinstance(raw, dict):
            raise ValueError("expected a JSON object")
        return {k: _as_pin(k, v) for k, v in raw.items()}
    except (GPT2AsmError, ValueError, RecursionError, TypeError, KeyError) as e:
        raise InvalidArgumentError(f"$GPT2ASM_HUB_PINS={path}: cannot use it: {e}") from None


def _as_pin(repo: str, v) -> Pin:
    if isinstance(v, Pin):
        return v
    rev = v["revision"]
    if not (isinstance(rev, str) and _HEX40.match(rev)):
        raise ValueError(f"{repo}: revision must be a 40-hex commit id, got {rev!r}")
    files = {}
    for name, fp in (v.get("files") or {}).items():
        if isinstance(fp, FilePin):
            files[name] = fp
            continue
        sha, size = fp["sha256"], fp.get("size")
        if not (isinstance(sha, str) and _HEX64.match(sha)) or not (size is None or type(size) is int):
            raise ValueError(f"{repo}/{name}: sha256 must be 64 hex digits and size an integer")
        files[name] = FilePin(sha, size)
    return Pin(rev, files)


def _cache_repo_dirs(repo: str, cache: Path) -> list[Path]:
    """The cache folders a repo may live in: its id, and the legacy short id (models--gpt2)."""
    ids = [repo]
    short = _REPO_TO_NAME.get(repo)
    if short and short != repo:
        ids.append(short)
    return [cache / ("models--" + i.replace("/", "--")) for i in ids]


def _complete(d: Path) -> bool:
    return all((d / f).is_file() for f in NEEDED)


def _snapshots(repo_dir: Path, revision: str | None) -> list[Path]:
    """Snapshot directories of a cached repo, best first: the pinned revision, refs/main, the rest by age."""
    snaps = repo_dir / "snapshots"
    try:
        all_snaps = [p for p in snaps.iterdir() if p.is_dir()]
    except OSError:
        return []
    order = []
    if revision:
        order.append(snaps / revision)
    try:
        main = read_text(repo_dir / "refs" / "main", 4096, ModelNotFoundError, "refs/main").strip()
        if _HEX40.match(main):
            order.append(snaps / main)
    except GPT2AsmError:
        pass
    rest = sorted(all_snaps, key=lambda p: _mtime(p), reverse=True)
    out = []
    for p in order + rest:
        if p not in out and p.is_dir():
            out.append(p)
    return out


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


# ----------------------------------------------------------------------------------------------------
# verification

def _open_regular(path: Path):
    """The file opened for reading if it is a regular file (a FIFO is not waited on, a device not read
    without end), else OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return open(fd, "rb")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with _open_regular(path) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """git's object id of a file: SHA-1 over 'blob <size>\\0' + content (the hub's ETag of small files)."""
    with _open_regular(path) as f:
        h = hashlib.sha1()
        h.update(b"blob %d\0" % os.fstat(f.fileno()).st_size)
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class _Verified:
    """Remembers files that passed: realpath -> [size, mtime_ns, inode, sha256]."""

    def __init__(self):
        own = own_cache_dir()
        self.path = None if own is None else own / "verified.json"    # None: $GPT2ASM_CACHE=off, not kept
        self.data = {}
        if self.path is not None:
            try:
                data = json.loads(read_text(self.path, MAX_JSON, ModelNotFoundError, "verified.json"))
                self.data = data if isinstance(data, dict) else {}
            except (GPT2AsmError, ValueError, RecursionError):
                pass

    @staticmethod
    def _key(p: Path) -> tuple[str, list]:
        real = p.resolve()
        st = real.stat()
        return str(real), [st.st_size, st.st_mtime_ns, st.st_ino]

    def sha256(self, p: Path) -> str:
        key, sig = self._key(p)
        rec = self.data.get(key)
        if isinstance(rec, list) and len(rec) == 4 and rec[:3] == sig and isinstance(rec[3], str):
            return rec[3]
        digest = sha256_file(p)
        self.data[key] = sig + [digest]
        self._save()
        return digest

    def forget(self, p: Path) -> None:
        try:
            self.data.pop(str(p.resolve()), None)
        except OSError:
            pass

    def _save(self) -> None:
        if self.path is None:                     # $GPT2ASM_CACHE=off: hashed again next time
            return
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            with open(fd, "w", encoding="utf-8") as f:   # a name of its own: threads of one process too
                f.write(json.dumps(self.data, indent=0, sort_keys=True))
                os.fchmod(f.fileno(), 0o644)                  # as the file it replaces (mkstemp: 0600)
            os.replace(tmp, self.path)
        except OSError:                           # a read-only cache only costs a re-hash next time; a full
            if tmp is not None:                   # disk leaves no partial temp file behind
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def verify_file(path: Path, name: str, pin: FilePin | None, verified: _Verified | None = None) -> str | None:
    """None if `path` is what it should be, else what is wrong with it.

    Checks the pin (size, SHA-256) when there is one, and the content hash the hub names its blobs by
    (the symlink target in the HF cache: 64 hex = SHA-256, 40 hex = git blob SHA-1)."""
    verified = verified or _Verified()
    try:
        size = path.stat().st_size
        if pin is not None:
            if pin.size is not None and size != pin.size:
                return f"{name} is {size:,} bytes, expected {pin.size:,} (pinned)"
            got = verified.sha256(path)
            if got != pin.sha256:
                return f"{name} has SHA-256 {got}, expected {pin.sha256} (pinned)"
        blob = path.resolve().name if path.is_symlink() else ""
        if _HEX64.match(blob) and (pin is None or pin.sha256 != blob):
            got = verified.sha256(path)
            if got != blob:
                return f"{name} has SHA-256 {got}, but the hub's content hash is {blob}"
        elif _HEX40.match(blob):
            got = git_blob_sha1(path)
            if got != blob:
                return f"{name} has git blob id {got}, but the hub's is {blob}"
    except OSError as e:
        return f"{name}: cannot read it: {e}"
    return None


def _blob_intact(blob: Path, verified: _Verified) -> bool:
    """Whether a cache blob holds what its name (the hub's content hash) says."""
    try:
        if _HEX64.match(blob.name):
            return verified.sha256(blob) == blob.name
        if _HEX40.match(blob.name):
            return git_blob_sha1(blob) == blob.name
    except OSError:
        pass
    return False


def _remove_cached(path: Path, verified: _Verified) -> None:
    """Delete a bad file from a cache: the snapshot link, and the blob it points to unless that blob is
    intact (blobs are shared between snapshots; a pin mismatch may be the link's fault, not the blob's)."""
    targets = [path]
    try:
        if path.is_symlink():
            blob = path.resolve()
            if not _blob_intact(blob, verified):
                targets.insert(0, blob)
    except OSError:
        pass
    verified.forget(path)
    for t in targets:
        try:
            t.unlink()
        except OSError:
            pass


def check_snapshot(d: Path, repo: str, pins: dict[str, Pin] | None = None, remove_bad: bool = True) -> list[str]:
    """Problems of a snapshot directory's files (empty list: all good). Bad files are removed if asked."""
    pin = load_pins(pins).get(repo)
    pinned = pin is not None and d.name == pin.revision
    verified = _Verified()
    problems = []
    for name in FILES:
        p = d / name
        if not p.exists():
            continue
        err = verify_file(p, name, pin.files.get(name) if pinned else None, verified)
        if err:
            problems.append(err)
            if remove_bad:
                _remove_cached(p, verified)
    return problems


# ----------------------------------------------------------------------------------------------------
# look-up and download

def _first_verified(dirs, repo: str, pins, looked: list[str]) -> Path | None:
    """The first complete directory of dirs whose files verify; damaged ones are noted in looked."""
    for d in dirs:
        if _complete(d):
            bad = check_snapshot(d, repo, pins)
            if not bad:
                return d
            looked.append(f"  {d}: removed damaged file(s): {'; '.join(bad)}")
    return None


def find_cached(repo: str, pins: dict[str, Pin] | None = None) -> tuple[Path | None, list[str]]:
    """(a verified complete snapshot directory or None, lines saying where we looked)."""
    pin = load_pins(pins).get(repo)
    rev = pin.revision if pin else None
    looked = []
    hf = hf_cache_dir()
    snap = _first_verified((s for d in _cache_repo_dirs(repo, hf) for s in _snapshots(d, rev)), repo, pins, looked)
    if snap is not None:
        return snap, looked
    looked.append(f"  the Hugging Face cache {hf}: no complete snapshot of {repo}")
    own = own_cache_dir()
    if own is None:
        looked.append("  gpt2asm's cache: off ($GPT2ASM_CACHE)")
        return None, looked
    own = own / "models" / repo.replace("/", "--")
    cands = []
    if rev:
        cands.append(own / rev)
    try:
        cands += sorted((p for p in own.iterdir() if p.is_dir()), key=_mtime, reverse=True)
    except OSError:
        pass
    snap = _first_verified(dict.fromkeys(cands), repo, pins, looked)
    if snap is not None:
        return snap, looked
    looked.append(f"  gpt2asm's cache {own}: nothing complete")
    return None, looked


def how_to_provide(repo: str, pins: dict[str, Pin] | None = None) -> str:
    pin = load_pins(pins).get(repo)
    rev = f" --revision {pin.revision}" if pin else ""
    return (f"To provide it: on a machine with internet, run `python -m gpt2asm --model {_REPO_TO_NAME.get(repo, repo)} "
            f"-n 1 hi` (or `hf download {repo} {' '.join(FILES)}{rev}`) and copy the Hugging Face cache "
            f"({hf_cache_dir()}) here; or put {', '.join(FILES)} from the hub repository {repo} in one "
            f"directory and pass --model DIR (or set GPT2ASM_MODEL); or point HF_ENDPOINT at a reachable "
            f"mirror. Without them, `python tools/make_checkpoint.py --out models/random-124M` writes a "
            f"randomly initialised GPT-2 124M (its text is gibberish).")


def _hf():
    try:
        import huggingface_hub
    except ImportError:
        return None
    return huggingface_hub


def _hf_error_types() -> dict:
    try:
        from huggingface_hub import errors as mod           # huggingface_hub >= 0.23
    except ImportError:
        from huggingface_hub import utils as mod
    names = ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "OfflineModeIsEnabled",
             "LocalEntryNotFoundError")
    return {n: getattr(mod, n, None) for n in names}


def _classify(e: BaseException, repo: str, ep: str | None) -> tuple[type, str]:
    """(error class, reason) for an exception out of huggingface_hub: ModelNotFoundError when the hub
    cannot be reached or has no such thing, DownloadError when a transfer went wrong."""
    t = _hf_error_types()
    where = ep or "the Hugging Face hub"
    # LocalEntryNotFoundError first: newer huggingface_hub derives it from EntryNotFoundError
    kinds = [("LocalEntryNotFoundError", f"cannot reach the hub at {where} (no network?)"),
             ("RepositoryNotFoundError", f"the hub at {where} has no repository {repo} (or it is private)"),
             ("RevisionNotFoundError", f"the hub at {where} has no such revision of {repo}"),
             ("EntryNotFoundError", f"the hub at {where} lacks a file of {repo}"),
             ("OfflineModeIsEnabled", "huggingface_hub is in offline mode (HF_HUB_OFFLINE)")]
    for type_name, why in kinds:
        if t[type_name] is not None and isinstance(e, t[type_name]):
            return ModelNotFoundError, f"{why}: {_first_line(e)}"
    name = type(e).__name__
    if name in ("ConnectError", "ConnectTimeout", "ConnectionError", "TimeoutException", "ReadTimeout",
                "ProxyError") or isinstance(e, (ConnectionError, TimeoutError)):
        return ModelNotFoundError, f"cannot reach the hub at {where}: {name}: {_first_line(e)}"
    return DownloadError, f"{name}: {_first_line(e)}"


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else type(e).__name__


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".gpt2asm-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
PROBE_TIMEOUT = 3.0


def unreachable(ep: str | None, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why a TCP connection to the hub's host cannot be opened, or None if it can (or a proxy is set, so
    only huggingface_hub can tell).  One quick look before huggingface_hub, which retries a failed
    connection with back-off for half a minute: offline, "not reachable" comes in a moment."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    import socket
    from urllib.parse import urlsplit
    if not ep:
        from huggingface_hub import constants
        ep = constants.ENDPOINT
    try:
        u = urlsplit(ep)
        host, port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None
    if not host:
        return None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return None


def download(repo: str, *, pins: dict | None = None, progress: bool = True, endpoint_url: str | None = None,
             cache_dir: str | os.PathLike | None = None, log=None) -> Path:
    """Download the four files of `repo` at one fixed revision; return the verified snapshot directory."""
    pins_ = load_pins(pins)
    pin = pins_.get(repo)
    ep = endpoint_url or endpoint()
    if ep is not None and not valid_url(ep):          # (huggingface_hub's import would fail on it)
        src = "the endpoint" if endpoint_url else "$HF_ENDPOINT"
        raise ModelNotFoundError(f"cannot download {repo}: {src} {ep!r} is not a valid http(s) URL")
    hf = _hf()
    if hf is None:
        raise ModelNotFoundError(f"cannot download {repo}: the Python package huggingface_hub is not installed "
                                 "(it is a dependency of gpt2asm: pip install huggingface_hub, or reinstall gpt2asm)")
    why = unreachable(ep)
    if why:
        raise ModelNotFoundError(f"cannot download {repo}: cannot reach the hub at {ep or 'the Hugging Face hub'} "
                                 f"(no network?): {why}")
    log = log or say
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    quiet = not progress and not are_progress_bars_disabled()
    if quiet:
        disable_progress_bars()
    try:
        return _download(repo, pin, ep, log, cache_dir, hf_hub_download)
    finally:
        if quiet:
            enable_progress_bars()


def _download(repo: str, pin: Pin | None, ep: str | None, log, cache_dir, hf_hub_download) -> Path:
    try:
        if pin is not None:
            revision = pin.revision
        else:                                             # freeze `main` to one commit for all four files
            from huggingface_hub import get_hf_file_metadata, hf_hub_url
            meta = get_hf_file_metadata(hf_hub_url(repo, "config.json", revision="main", endpoint=ep))
            revision = meta.commit_hash
            if not (isinstance(revision, str) and _HEX40.match(revision)):
                raise DownloadError(f"the hub did not name the commit of {repo}'s main branch")
    except (KeyboardInterrupt, SystemExit, GPT2AsmError):
        raise
    except Exception as e:
        cls, why = _classify(e, repo, ep)
        raise cls(f"cannot download {repo}: {why}") from None

    hf_cache = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    local_dir = None
    if not _writable(hf_cache):
        own = own_cache_dir()
        if own is None:
            raise DownloadError(f"cannot download {repo}: the Hugging Face cache {hf_cache} is not writable "
                                f"and gpt2asm's own cache is off ($GPT2ASM_CACHE)")
        local_dir = own / "models" / repo.replace("/", "--") / revision
        if not _writable(local_dir):
            raise DownloadError(f"cannot download {repo}: neither the Hugging Face cache {hf_cache} nor "
                                f"{local_dir} is writable")
    log(f"[gpt2asm] downloading {repo} (revision {revision[:12]}) from {ep or 'the Hugging Face hub'} "
        f"into {local_dir or hf_cache}")
    verified = _Verified()
    paths = {}
    for name in FILES:
        try:
            kw = dict(local_dir=str(local_dir)) if local_dir else dict(cache_dir=str(hf_cache))
            p = Path(hf_hub_download(repo, name, revision=revision, endpoint=ep, **kw))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            cls, why = _classify(e, repo, ep)
            raise cls(f"cannot download {name} of {repo}: {why}") from None
        err = verify_file(p, name, pin.files.get(name) if pin else None, verified)
        if err:
            _remove_cached(p, verified)
            raise DownloadError(f"downloaded {repo}/{name} is corrupt: {err}; it was deleted from the cache "
                                f"(run again to retry; if it persists, the server or a proxy serves other bytes)")
        paths[name] = p
    snap = paths["model.safetensors"].parent
    if not all(paths[n].parent == snap for n in FILES):
        raise DownloadError(f"the files of {repo} did not land in one snapshot directory")
    return snap


def resolve(name: str, *, download_ok: bool = True, progress: bool = True, pins: dict | None = None,
            searched: list[str] | None = None) -> Path:
    """A directory with the model files for a hub name: cached, or downloaded; else ModelNotFoundError."""
    repo = repo_id(name)
    if repo is None:
        raise InvalidArgumentError(f"{shown(name)} is not a known hub model ({', '.join(MODELS)})")
    found, looked = find_cached(repo, pins)
    if found is not None:
        return found
    looked = list(searched or []) + looked
    if not download_ok:
        why = "downloading is switched off (--offline, or download=False)"
    elif offline():
        why = "offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE), so nothing was downloaded"
    else:
        try:
            return download(repo, pins=pins, progress=progress)
        except DownloadError:
            raise                                         # it arrived, but broken: say exactly that
        except ModelNotFoundError as e:                   # no hub, no package, no such repository
            why = str(e)
    raise ModelNotFoundError(
        f"GPT-2 model {shown(name)} ({repo}) not found; looked in:\n" + "\n".join(looked)
        + f"\nand {why}.\nNeeded: {', '.join(FILES)}.\n" + how_to_provide(repo, pins))
