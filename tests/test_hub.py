"""Getting the model: hub names, the Hugging Face cache, gpt2asm's cache, downloads (against a loopback
imitation of the hub: tests/hubserver.py), corruption, dropped connections, offline use. No test here
reaches beyond 127.0.0.1."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt2asm import GPT2, ModelNotFoundError
from gpt2asm import hub
from gpt2asm.errors import DownloadError
from hubserver import FakeHub

pytest.importorskip("huggingface_hub")

ROOT = Path(__file__).resolve().parent.parent
REPO = "openai-community/gpt2"
REV = hub.PINS[REPO].revision
FILES = hub.FILES


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Every name this process resolves during a test must be the loopback's: record others, refuse them,
    and fail the test (huggingface_hub swallows some errors, so refusing alone would not show)."""
    real, tried = socket.getaddrinfo, []

    def guarded(host, *a, **k):
        h = host.decode() if isinstance(host, bytes) else str(host)
        if h not in ("127.0.0.1", "localhost", "::1"):
            tried.append(h)
            raise socket.gaierror(socket.EAI_NONAME, f"tests may not resolve {h}")
        return real(host, *a, **k)
    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    yield
    assert not tried, f"the test tried to reach {sorted(set(tried))}"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Fresh, private caches; no offline flags, no pins file, no model from the environment."""
    for k in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "GPT2ASM_HUB_PINS",
              "GPT2ASM_MODEL", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("GPT2ASM_CACHE", str(tmp_path / "own"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    point_hub_at(monkeypatch, "http://127.0.0.1:9")                # nothing listens there: no accidental hub
    monkeypatch.chdir(tmp_path)                                    # no model in the current directory
    return tmp_path


def point_hub_at(monkeypatch, url: str) -> None:
    """HF_ENDPOINT for gpt2asm (read per call), and huggingface_hub's own copy of it, read when it was first
    imported (maybe by transformers, before this test): its side requests (e.g. a registry of agent
    harnesses) must not leave the machine either."""
    monkeypatch.setenv("HF_ENDPOINT", url)
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "ENDPOINT", url)
    monkeypatch.setattr(c, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def pins_for(d: Path, repo: str = REPO, revision: str = REV) -> dict:
    return {repo: {"revision": revision,
                   "files": {f: {"sha256": hashlib.sha256((d / f).read_bytes()).hexdigest(),
                                 "size": (d / f).stat().st_size} for f in FILES}}}


@pytest.fixture
def served(ckpt_tiny, env, monkeypatch):
    """The tiny checkpoint served as openai-community/gpt2 at the pinned revision, and as distilgpt2 at an
    unpinned 'main'."""
    files = {f: (ckpt_tiny / f).read_bytes() for f in FILES}
    with FakeHub({REPO: files, "distilbert/distilgpt2": dict(files)}, {REPO: REV}) as h:
        point_hub_at(monkeypatch, h.url)
        yield h


def same_files(a: Path, b: Path) -> bool:
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in FILES)


def test_names():
    assert hub.repo_id("gpt2") == REPO == hub.repo_id("GPT2") == hub.repo_id(REPO)
    assert hub.repo_id("gpt2-medium") == "openai-community/gpt2-medium"
    assert hub.repo_id("gpt2-large") == "openai-community/gpt2-large"
    assert hub.repo_id("gpt2-xl") == "openai-community/gpt2-xl"
    assert hub.repo_id("distilgpt2") == "distilbert/distilgpt2"
    for bad in ("gpt3", "models/gpt2", "", None, 7, "openai-community/gpt5"):
        assert hub.repo_id(bad) is None
    pin = hub.PINS[REPO]
    assert re.fullmatch(r"[0-9a-f]{40}", pin.revision)
    assert pin.files["model.safetensors"].size == 548_105_171
    assert pin.files["vocab.json"].size == 1_042_301
    assert all(re.fullmatch(r"[0-9a-f]{64}", p.sha256) for p in pin.files.values())


def test_own_cache_dir_one_rule(env, monkeypatch):
    """gpt2asm's own cache is one directory for the hub and the tile cache: $GPT2ASM_CACHE, else
    $XDG_CACHE_HOME/gpt2asm, else ~/.cache/gpt2asm; $GPT2ASM_CACHE=off (or blank) is no cache for both,
    never a directory named 'off'."""
    from gpt2asm import tilecache
    assert hub.own_cache_dir() == tilecache.cache_root() == env / "own"
    monkeypatch.delenv("GPT2ASM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(env / "xdg"))
    assert hub.own_cache_dir() == tilecache.cache_root() == env / "xdg" / "gpt2asm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert hub.own_cache_dir() == tilecache.cache_root() == Path.home() / ".cache" / "gpt2asm"
    for off in ("off", "OFF", "0", " "):
        monkeypatch.setenv("GPT2ASM_CACHE", off)
        assert hub.own_cache_dir() is tilecache.cache_root() is None
    snap, looked = hub.find_cached("openai-community/gpt2")
    assert snap is None and any("gpt2asm's cache: off" in line for line in looked), looked
    with pytest.raises(ModelNotFoundError):
        GPT2.load("gpt2", download=False)
    assert not (env / "off").exists()


def test_download_verify_and_reuse(served, ckpt_tiny, capfd):
    pins = pins_for(ckpt_tiny)
    d = hub.resolve("gpt2", pins=pins)
    assert d.name == REV and same_files(d, ckpt_tiny)
    assert str(d).startswith(os.environ["HF_HOME"])              # the HF cache transformers shares
    # every file at the pinned commit, never at a moving branch
    resolves = [p for m, p, _ in served.log if "/resolve/" in p]
    assert resolves and all(f"/resolve/{REV}/" in p for p in resolves)
    assert "downloading openai-community/gpt2" in capfd.readouterr().err
    n = len(served.log)
    assert hub.resolve("gpt2", pins=pins) == d                    # cached: no request at all
    assert len(served.log) == n
    with pytest.raises(ModelNotFoundError):                       # not cached elsewhere, and offline
        hub.resolve("gpt2-medium", download_ok=False)


def test_gpt2_load_by_name_matches_local(served, ckpt_tiny, tmp_path, monkeypatch):
    pf = tmp_path / "pins.json"
    pf.write_text(json.dumps(pins_for(ckpt_tiny)))
    monkeypatch.setenv("GPT2ASM_HUB_PINS", str(pf))
    m = GPT2.load("gpt2", progress=False)
    want = GPT2.load(ckpt_tiny).generate("Hello there", max_new_tokens=8, temperature=0)
    assert m.generate("Hello there", max_new_tokens=8, temperature=0) == want
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                     # cached now: offline is fine
    assert GPT2.load("gpt2").model_dir == m.model_dir


def test_unpinned_repo_freezes_one_commit(served, ckpt_tiny):
    d = hub.resolve("distilgpt2")
    commit = served.commits["distilbert/distilgpt2"]
    assert d.name == commit and same_files(d, ckpt_tiny)
    resolves = [p for m, p, _ in served.log if "/resolve/" in p and "distilgpt2" in p]
    assert resolves[0].endswith("/resolve/main/config.json")      # ask once what main is ...
    assert all(f"/resolve/{commit}/" in p for p in resolves[1:])  # ... then fetch only that commit
    # the large file was checked against the hub's content hash (its blob name)
    assert (d / "model.safetensors").resolve().name == hashlib.sha256(
        (ckpt_tiny / "model.safetensors").read_bytes()).hexdigest()


def test_dropped_connection_resumes(served, ckpt_tiny):
    served.drop_after[(REPO, "model.safetensors")] = 15_000_000    # past huggingface_hub's 10 MB chunk
    d = hub.resolve("gpt2", pins=pins_for(ckpt_tiny), progress=False)
    assert same_files(d, ckpt_tiny)
    ranges = [r for m, p, r in served.log if m == "GET" and p.startswith("/lfs/")]
    assert len(ranges) == 2 and ranges[0] is None and re.fullmatch(r"bytes=\d+-", ranges[1])
    assert int(ranges[1][6:-1]) > 0                                # resumed where it stopped, not from 0


def test_corrupt_download_detected_removed_and_refetched(served, ckpt_tiny):
    data = bytearray((ckpt_tiny / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x40
    served.corrupt[(REPO, "model.safetensors")] = bytes(data)
    pins = pins_for(ckpt_tiny)
    with pytest.raises(DownloadError, match=r"corrupt.*SHA-256") as e:
        hub.resolve("gpt2", pins=pins, progress=False)
    assert "deleted" in str(e.value)
    snap = hub.hf_cache_dir() / "models--openai-community--gpt2" / "snapshots" / REV
    assert not (snap / "model.safetensors").exists()               # nothing left that looks complete
    blobs = list((snap.parent.parent / "blobs").iterdir())
    assert not any(b.stat().st_size == len(data) for b in blobs)
    del served.corrupt[(REPO, "model.safetensors")]
    assert same_files(hub.resolve("gpt2", pins=pins, progress=False), ckpt_tiny)


def test_corruption_caught_by_etag_without_pin(served, ckpt_tiny):
    """Unpinned repo: the hub's own content hash (blob name) catches a bad transfer."""
    data = bytearray((ckpt_tiny / "model.safetensors").read_bytes())
    data[100_000] ^= 1
    served.corrupt[("distilbert/distilgpt2", "model.safetensors")] = bytes(data)
    with pytest.raises(DownloadError, match="content hash"):
        hub.resolve("distilgpt2", progress=False)


def test_pin_mismatch_is_an_error(served, ckpt_tiny):
    """The hub serves self-consistent files, but not the pinned ones: the pin wins."""
    pins = pins_for(ckpt_tiny)
    pins[REPO]["files"]["vocab.json"]["sha256"] = "0" * 64
    with pytest.raises(DownloadError, match=r"vocab.json has SHA-256 [0-9a-f]{64}, expected 0{64} \(pinned\)"):
        hub.resolve("gpt2", pins=pins, progress=False)


def test_real_pins_refuse_a_fake_gpt2(served):
    """With the built-in pins, a 27 MB file served as GPT-2's 548 MB model.safetensors is refused."""
    with pytest.raises(DownloadError, match="548,105,171"):
        hub.resolve("gpt2", progress=False)


def test_offline_explains(env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as e:
        hub.resolve("gpt2")
    msg = str(e.value)
    for what in ("offline", "HF_HUB_OFFLINE", str(hub.hf_cache_dir()), "model.safetensors", "vocab.json",
                 "merges.txt", "config.json", "--model DIR", REPO, REV, "make_checkpoint"):
        assert what in msg, what
    assert not isinstance(e.value, DownloadError)


def test_no_huggingface_hub_package(env, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)      # import fails
    with pytest.raises(ModelNotFoundError, match="pip install huggingface_hub"):
        hub.resolve("gpt2")


def test_repository_missing_on_the_hub(env, monkeypatch, ckpt_tiny):
    with FakeHub({"someone/else": {"config.json": b"{}"}}) as h:
        point_hub_at(monkeypatch, h.url)
        with pytest.raises(ModelNotFoundError, match="has no repository") as e:
            hub.resolve("gpt2-xl", progress=False)
    assert "openai-community/gpt2-xl" in str(e.value)


def fake_hf_cache(cache: Path, folder: str, commit: str, src: Path, main: bool = True) -> Path:
    """A Hugging Face cache entry laid out as huggingface_hub does: blobs named by content hash,
    snapshot symlinks, refs/main."""
    repo_dir = cache / folder
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo_dir / "blobs").mkdir()
    for f in FILES:
        data = (src / f).read_bytes()
        name = (hashlib.sha256(data).hexdigest() if f == "model.safetensors"
                else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (repo_dir / "blobs" / name).write_bytes(data)
        (snap / f).symlink_to(Path("../../blobs") / name)
    if main:
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / "main").write_text(commit)
    return snap


def test_finds_legacy_hf_cache_offline(env, ckpt_tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = fake_hf_cache(hub.hf_cache_dir(), "models--gpt2", "a" * 40, ckpt_tiny)
    assert hub.resolve("gpt2") == snap
    m = GPT2.load(None)                                          # the default model, from the cache
    assert m.model_dir == snap


def test_prefers_pinned_snapshot_and_checks_it(env, ckpt_tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = hub.hf_cache_dir()
    pinned = fake_hf_cache(cache, "models--openai-community--gpt2", REV, ckpt_tiny, main=False)
    other = cache / "models--openai-community--gpt2" / "snapshots" / ("b" * 40)
    shutil.copytree(pinned, other, symlinks=True)
    # the pinned snapshot fails the real pins (a tiny checkpoint is not GPT-2): removed, the other is used
    assert hub.resolve("gpt2") == other
    assert not (pinned / "model.safetensors").exists()
    assert hub.resolve("gpt2", pins=pins_for(ckpt_tiny)) == other


def test_damaged_cache_blob_is_removed(env, ckpt_tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = fake_hf_cache(hub.hf_cache_dir(), "models--distilbert--distilgpt2", "c" * 40, ckpt_tiny)
    blob = (snap / "merges.txt").resolve()
    blob.write_bytes(blob.read_bytes()[:-10])                     # bit rot / truncated copy
    with pytest.raises(ModelNotFoundError, match="removed damaged file.*merges.txt has git blob id"):
        hub.resolve("distilgpt2")
    assert not blob.exists()


def test_own_cache(env, ckpt_tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    d = hub.own_cache_dir() / "models" / "openai-community--gpt2-large" / ("d" * 40)
    d.mkdir(parents=True)
    for f in FILES:
        shutil.copy(ckpt_tiny / f, d / f)
    assert hub.resolve("gpt2-large") == d


def test_verified_hash_is_remembered(env, ckpt_tiny, monkeypatch):
    f = env / "x.bin"
    f.write_bytes(b"abc" * 1000)
    v = hub._Verified()
    calls = []
    real = hub.sha256_file
    monkeypatch.setattr(hub, "sha256_file", lambda p: calls.append(p) or real(p))
    assert v.sha256(f) == hashlib.sha256(b"abc" * 1000).hexdigest()
    assert hub._Verified().sha256(f) == v.sha256(f) and len(calls) == 1
    time.sleep(0.01)
    f.write_bytes(b"abd" * 1000)                                   # changed: hashed again
    assert hub._Verified().sha256(f) == hashlib.sha256(b"abd" * 1000).hexdigest() and len(calls) == 2


def test_verified_json_on_a_full_disk_leaves_no_temp_file(tmp_path):
    """verified.json written where the file size is refused part-way (a full disk, RLIMIT_FSIZE: EFBIG) is
    not kept, and neither is its temp file (a partial .verified.json.<pid>.tmp was left behind by every
    process that tried)."""
    code = """if True:
        import hashlib, resource
        from pathlib import Path
        from gpt2asm import hub
        f = Path("x.bin"); f.write_bytes(b"abc" * 1000)
        v = hub._Verified()
        v.data = {f"/nowhere/{i}": [1, 2, 3, "0" * 64] for i in range(20)}
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))
        assert v.sha256(f) == hashlib.sha256(b"abc" * 1000).hexdigest()
    """
    own = tmp_path / "own"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, GPT2ASM_CACHE=str(own), PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in own.iterdir()) == [], sorted(p.name for p in own.iterdir())


# -- the command line: a fresh install needs only `python -m gpt2asm "..."` ------------------------------

def cli_env(tmp_path: Path, **extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GPT2ASM_", "TRANSFORMERS_"))}
    e.update(HF_HOME=str(tmp_path / "hf"), GPT2ASM_CACHE=str(tmp_path / "own"), PYTHONPATH=str(ROOT),
             NO_PROXY="127.0.0.1,localhost", HF_ENDPOINT="http://127.0.0.1:9")
    e.update(extra)
    return e


def test_cli_fresh_install_downloads_then_works_offline(served, ckpt_tiny, tmp_path):
    pf = tmp_path / "pins.json"
    pf.write_text(json.dumps(pins_for(ckpt_tiny)))
    work = tmp_path / "empty"
    work.mkdir()
    e = cli_env(tmp_path, HF_ENDPOINT=served.url, GPT2ASM_HUB_PINS=str(pf))
    r = subprocess.run([sys.executable, "-m", "gpt2asm", "-n", "8", "-t", "0", "Hello there"], cwd=work, env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    want = GPT2.load(ckpt_tiny).generate("Hello there", max_new_tokens=8, temperature=0)
    assert r.stdout == "Hello there" + want + "\n"
    assert "downloading openai-community/gpt2" in r.stderr
    n = len(served.log)
    e["HF_HUB_OFFLINE"] = "1"
    r2 = subprocess.run([sys.executable, "-m", "gpt2asm", "-n", "8", "-t", "0", "Hello there"], cwd=work, env=e,
                        capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout == r.stdout and len(served.log) == n and "downloading" not in r2.stderr


def test_cli_malformed_endpoint(env, tmp_path):
    """An $HF_ENDPOINT no URL parser accepts (huggingface_hub's import fails on it): one line naming it,
    status 2, from the CLI; ModelNotFoundError from the API (was a ValueError traceback)."""
    e = cli_env(tmp_path, HF_ENDPOINT="http://[::1")
    r = subprocess.run([sys.executable, "-m", "gpt2asm", "--model", "gpt2", "-n", "2", "hi"], cwd=tmp_path, env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "is not a valid http(s) URL" in r.stderr, r.stderr
    with pytest.raises(ModelNotFoundError, match="not a valid"):
        hub.download("openai-community/gpt2", endpoint_url="ftp://example")


def test_cli_offline_explains(env, tmp_path):
    work = tmp_path / "empty"
    work.mkdir()
    r = subprocess.run([sys.executable, "-m", "gpt2asm", "-n", "3", "Hi"], cwd=work, capture_output=True,
                       text=True, timeout=120, env=cli_env(tmp_path, HF_HUB_OFFLINE="1"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("gpt2asm: error: GPT-2 model 'gpt2'")
    for what in ("current directory", "Hugging Face cache", "offline", "--model DIR", "model.safetensors"):
        assert what in r.stderr, what
    r = subprocess.run([sys.executable, "-m", "gpt2asm", "--offline", "--model", "gpt2-xl", "Hi"], cwd=work,
                       capture_output=True, text=True, timeout=120, env=cli_env(tmp_path))
    assert r.returncode == 2 and "--offline" in r.stderr and "openai-community/gpt2-xl" in r.stderr


def test_cli_interrupted_download_leaves_no_complete_looking_file(served, ckpt_tiny, tmp_path):
    """Ctrl-C in the middle of the transfer: exit 130, and no file in the cache under its final name."""
    served.throttle = 0.05                                        # seconds per MiB: ~1.5 s for the file
    e = cli_env(tmp_path, HF_ENDPOINT=served.url, GPT2ASM_HUB_PINS=str(tmp_path / "p.json"))
    (tmp_path / "p.json").write_text(json.dumps(pins_for(ckpt_tiny)))
    work = tmp_path / "empty"
    work.mkdir()
    p = subprocess.Popen([sys.executable, "-m", "gpt2asm", "-n", "3", "Hi"], cwd=work, env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not served.gets() or not any(p_.startswith("/lfs/") for _, p_, _ in served.gets()):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.02)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err
    repo_dir = Path(e["HF_HOME"]) / "hub" / "models--openai-community--gpt2"
    assert not (repo_dir / "snapshots" / REV / "model.safetensors").exists()
    sha = hashlib.sha256((ckpt_tiny / "model.safetensors").read_bytes()).hexdigest()
    assert not (repo_dir / "blobs" / sha).exists()


def test_read_only_hf_cache_falls_back_to_own_cache(served, ckpt_tiny, monkeypatch):
    hf = hub.hf_cache_dir()
    real = hub._writable
    monkeypatch.setattr(hub, "_writable", lambda d: False if Path(d) == hf else real(d))
    d = hub.resolve("gpt2", pins=pins_for(ckpt_tiny), progress=False)
    assert d == hub.own_cache_dir() / "models" / "openai-community--gpt2" / REV and same_files(d, ckpt_tiny)
    n = len(served.log)
    assert hub.resolve("gpt2", pins=pins_for(ckpt_tiny)) == d and len(served.log) == n   # found there next time


def test_bad_pins_file(env, monkeypatch, tmp_path):
    from gpt2asm import InvalidArgumentError
    for text in ("not json", '{"a": {"revision": "main"}}', '{"a": {"revision": "' + "a" * 40 + '", "files": '
                 '{"x": {"sha256": "zz"}}}}', "[]"):
        (tmp_path / "p.json").write_text(text)
        monkeypatch.setenv("GPT2ASM_HUB_PINS", str(tmp_path / "p.json"))
        with pytest.raises(InvalidArgumentError, match="GPT2ASM_HUB_PINS"):
            hub.load_pins()


def test_local_path_that_is_not_a_directory(tmp_path):
    """A path that exists but is not a directory (a file, /dev/null) says so, not "no such directory"."""
    from gpt2asm.files import find_model_dir
    f = tmp_path / "config.json"
    f.write_text("{}")
    for p, what in ((f, "not a directory"), ("/dev/null", "not a directory"), (tmp_path / "nope", "no such directory")):
        with pytest.raises(ModelNotFoundError, match=what):
            find_model_dir(str(p), download=False)
