"""Warm start: the parsed-tokenizer cache and the bulk checks of gpt2asm.tokenizer, and the time from
GPT2.load to the first forward step.

The cache must never change a result: a warm tokenizer equals a freshly parsed one (vocabulary, merge
ranks, token bytes, every encoding of a broad corpus), a changed file is never served from the cache,
and a damaged, foreign or unreadable cache file only means parsing again. The bulk checks must accept
exactly what the line-by-line checks accept and leave the error messages to them.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from gpt2asm import tilecache
from gpt2asm import tokenizer as T
from gpt2asm.errors import TokenizerError
from gpt2asm.tokenizer import BYTE_ENCODER, EOT, Tokenizer

from tokenizer_cases import CORPUS, fuzz_strings

TEXTS = CORPUS + fuzz_strings(300, seed=99) + ["<|endoftext|>a<|endoftext|>", "x" * 500 + " y" * 200]


@pytest.fixture
def tok_copy(tokenizer_dir, tmp_path) -> Path:
    """The real tokenizer's two files in a directory of our own (so that they can be changed)."""
    d = tmp_path / "tok"
    d.mkdir()
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(tokenizer_dir / f, d / f)
    return d


@pytest.fixture
def cdir(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("GPT2ASM_CACHE", raising=False)


def assert_same(a: Tokenizer, b: Tokenizer, texts=TEXTS) -> None:
    assert a.encoder == b.encoder and list(a.encoder) == list(b.encoder)
    assert a.ranks == b.ranks and a._bytes == b._bytes
    assert (a.vocab_size, a.eot_id) == (b.vocab_size, b.eot_id)
    for t in texts:
        ids = a.encode(t)
        assert ids == b.encode(t), t
        assert a.decode(ids) == b.decode(ids)


def no_parsing(monkeypatch):
    """Make any parse of the files fail: what loads now comes from the cache."""
    def refuse(*a, **k):
        raise AssertionError("parsed the files instead of using the cache")
    monkeypatch.setattr(T, "_parse_vocab", refuse)
    monkeypatch.setattr(T, "_merge_lines", refuse)


def cache_file(cdir: Path) -> Path:
    files = list(cdir.glob("tokenizer-*.tok"))
    assert len(files) == 1, files
    return files[0]


# ---------------------------------------------------------------------------------------------------
# cold == warm == uncached

def test_cold_warm_and_uncached_are_identical(tokenizer_dir, cdir, monkeypatch):
    ref = Tokenizer.from_dir(tokenizer_dir, cache_dir=False)
    assert not cdir.exists()
    cold = Tokenizer.from_dir(tokenizer_dir, cache_dir=cdir)              # parses, writes the cache
    p = cache_file(cdir)
    assert p.stat().st_size > 0 and not [q for q in cdir.iterdir() if q.name.endswith(".tmp")]
    with monkeypatch.context() as mpc:
        no_parsing(mpc)
        warm = Tokenizer.from_dir(tokenizer_dir, cache_dir=cdir)
    assert_same(cold, ref)
    assert_same(warm, ref)
    assert warm.encode("Hello world") == [15496, 995] and warm.eot_id == 50256


def test_public_pieces_unchanged(tokenizer_dir):
    """load_vocab / load_merges / Tokenizer(vocab, merges) still work as they did."""
    vocab = T.load_vocab(tokenizer_dir / "vocab.json")
    merges = T.load_merges(tokenizer_dir / "merges.txt", vocab)
    assert merges[0] == ("Ġ", "t") and all(isinstance(m, tuple) and len(m) == 2 for m in merges)
    assert_same(Tokenizer(vocab, merges), Tokenizer.from_dir(tokenizer_dir, cache_dir=False), TEXTS[:200])
    with pytest.raises(TokenizerError, match="space"):
        Tokenizer(vocab, [("a b", "c")])


def test_default_cache_dir_and_off(tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2ASM_CACHE", str(tmp_path / "env"))
    Tokenizer.from_dir(tokenizer_dir)
    assert cache_file(tmp_path / "env")
    for off in ("off", "0", "none", " "):
        monkeypatch.setenv("GPT2ASM_CACHE", off)
        assert T.cache_root() is None
    monkeypatch.setenv("GPT2ASM_CACHE", "off")
    t = Tokenizer.from_dir(tokenizer_dir)
    assert t.encode("Hello world") == [15496, 995]
    assert [p.name for p in tmp_path.iterdir()] == ["env"]


# ---------------------------------------------------------------------------------------------------
# never stale

def test_changed_merges_are_never_served_from_the_cache(tok_copy, cdir):
    old = Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    m = tok_copy / "merges.txt"
    lines = m.read_text(encoding="utf-8").split("\n")
    lines[1], lines[2] = lines[2], lines[1]                              # swap the two first ranks
    m.write_text("\n".join(lines), encoding="utf-8")
    new = Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    assert_same(new, Tokenizer.from_dir(tok_copy, cache_dir=False), TEXTS[:100])
    assert new.ranks != old.ranks
    assert len(list(cdir.glob("tokenizer-*.tok"))) == 2                  # one file per content


def test_same_size_same_mtime_rewrite_is_seen(tok_copy, cdir):
    """The key is the files' content (SHA-256), not their size or timestamps."""
    Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    v = tok_copy / "vocab.json"
    st = v.stat()
    vocab = json.loads(v.read_text(encoding="utf-8"))
    a, b = "Ġthe", "Ġand"                                                 # ids of the same width, swapped
    assert len(str(vocab[a])) == len(str(vocab[b]))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    text = json.dumps(vocab, ensure_ascii=False)
    v.write_text(text, encoding="utf-8")
    os.utime(v, ns=(st.st_atime_ns, st.st_mtime_ns))
    t = Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    assert t.encoder[a] == vocab[a] and t.encoder[b] == vocab[b]
    assert_same(t, Tokenizer.from_dir(tok_copy, cache_dir=False), TEXTS[:100])


def test_code_change_invalidates(tok_copy, cdir, monkeypatch):
    Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    monkeypatch.setattr(T, "_code_sha", "0" * 64)
    calls = []
    real = T._parse_vocab
    monkeypatch.setattr(T, "_parse_vocab", lambda *a: calls.append(1) or real(*a))
    Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    assert calls == [1]                                                  # parsed again, and rewritten:
    Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    assert calls == [1]


def test_a_bad_file_is_reported_even_with_a_cache(tok_copy, cdir):
    Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    (tok_copy / "merges.txt").write_text("#version: 0.2\nzzq qqz\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match="not in the vocab"):
        Tokenizer.from_dir(tok_copy, cache_dir=cdir)
    (tok_copy / "merges.txt").unlink()
    (tok_copy / "vocab.json").write_text("{", encoding="utf-8")
    with pytest.raises(TokenizerError, match="vocab.json is not valid JSON"):   # the vocab first, as always
        Tokenizer.from_dir(tok_copy, cache_dir=cdir)


# ---------------------------------------------------------------------------------------------------
# damaged caches are parsed around and rewritten

def _flip(offset):
    def f(p: Path):
        raw = bytearray(p.read_bytes())
        raw[offset] ^= 0x5A
        p.write_bytes(bytes(raw))
    return f


def _rewrite(edit):
    """Edit the cache's JSON header (or its sections) and fix the checksum, so that only the structure
    checks can catch it."""
    def f(p: Path):
        raw = p.read_bytes()
        magic, fmt, res, _, hlen = T._CACHE_PREFIX.unpack_from(raw)
        body = raw[T._CACHE_PREFIX.size:]
        head, rest = json.loads(body[:hlen]), body[hlen:]
        head, rest = edit(head, rest)
        h = json.dumps(head).encode()
        new = h + rest
        p.write_bytes(T._CACHE_PREFIX.pack(magic, fmt, res, hashlib.sha256(new).digest(), len(h)) + new)
    return f


def _h(**kw):
    return _rewrite(lambda h, r: ({**h, **kw}, r))


DAMAGE = {
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(os.urandom(10000)),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-1000]),
    "prefix-only": lambda p: p.write_bytes(p.read_bytes()[:T._CACHE_PREFIX.size]),
    "magic": _flip(0),
    "format": _flip(8),
    "checksum": _flip(20),
    "header-byte": _flip(T._CACHE_PREFIX.size + 5),
    "token-byte": _flip(-200000),
    "last-byte": _flip(-1),
    "appended": lambda p: p.write_bytes(p.read_bytes() + b"\0"),
    "key": _rewrite(lambda h, r: ({**h, "key": {**h["key"], "vocab_sha256": "0" * 64}}, r)),
    "n_vocab": _h(n_vocab=50256),
    "n_merges": _h(n_merges=1),
    "sections": _h(tokens_nbytes=1000, merges_nbytes=1000),
    "negative": _h(tokens_nbytes=-1),
    "blob-length": _rewrite(lambda h, r: (h, r[:-1] + b"\0\0")),
    "not-utf8": _rewrite(lambda h, r: (h, b"\xff" + r[1:])),
    "header-list": _rewrite(lambda h, r: ([h], r)),
    "directory": lambda p: (p.unlink(), p.mkdir()),
    "fifo": lambda p: (p.unlink(), os.mkfifo(p)),
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_cache_falls_back_to_parsing(tokenizer_dir, cdir, monkeypatch, how):
    ref = Tokenizer.from_dir(tokenizer_dir, cache_dir=cdir)
    p = cache_file(cdir)
    DAMAGE[how](p)
    t = Tokenizer.from_dir(tokenizer_dir, cache_dir=cdir)                # parses again (and rewrites)
    assert_same(t, ref, TEXTS[:100])
    if how == "directory":                                               # cannot be replaced: never mind
        assert p.is_dir()
        return
    assert p.is_file()
    with monkeypatch.context() as mpc:
        no_parsing(mpc)
        assert_same(Tokenizer.from_dir(tokenizer_dir, cache_dir=cdir), ref, TEXTS[:50])


def test_unwritable_cache_is_no_error(tokenizer_dir, tmp_path, monkeypatch):
    f = tmp_path / "a-file"
    f.write_text("x")
    t = Tokenizer.from_dir(tokenizer_dir, cache_dir=f / "cache")        # the directory cannot exist
    assert t.encode("Hello world") == [15496, 995]

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(T.os, "fsync", full)
    d = tmp_path / "full"
    t = Tokenizer.from_dir(tokenizer_dir, cache_dir=d)
    assert t.encode("Hello world") == [15496, 995]
    assert list(d.iterdir()) == []                                       # no file, no temp file left


def test_least_recently_used_caches_are_evicted(tmp_path, cdir, monkeypatch):
    """Many distinct tokenizers (a fuzzer's) leave at most CACHE_MAX_FILES cache files; one in use stays."""
    monkeypatch.setattr(T, "CACHE_MAX_FILES", 3)
    dirs = []
    for k in range(5):
        d = tmp_path / f"t{k}"
        d.mkdir()
        (d / "vocab.json").write_text(json.dumps(_tiny_vocab(("ab",))), encoding="utf-8")
        (d / "merges.txt").write_text("#version: 0.2\n" + "a b\n" * (k + 1), encoding="utf-8")
        dirs.append(d)
    Tokenizer.from_dir(dirs[0], cache_dir=cdir)
    first = cache_file(cdir)
    old = time.time() - 100
    for k, d in enumerate(dirs[1:], 1):
        for p in cdir.glob("tokenizer-*.tok"):
            if p != first:
                os.utime(p, (old - k, old - k))
        Tokenizer.from_dir(dirs[0], cache_dir=cdir)                     # used: the most recent
        Tokenizer.from_dir(d, cache_dir=cdir)
    names = {p.name for p in cdir.glob("tokenizer-*.tok")}
    assert len(names) == 3 and first.name in names


def test_old_temp_files_are_removed(tokenizer_dir, cdir):
    cdir.mkdir()
    old = cdir / ".tokenizer-x.F1.tok.abc.tmp"
    old.write_bytes(b"junk")
    os.utime(old, (time.time() - 2 * tilecache.TMP_MAX_AGE,) * 2)
    young = cdir / ".tokenizer-y.F1.tok.abc.tmp"
    young.write_bytes(b"being written")
    Tokenizer.from_dir(tokenizer_dir, cache_dir=cdir)
    assert not old.exists() and young.exists()


def _load_worker(args):
    d, cdir = args
    t = Tokenizer.from_dir(d, cache_dir=cdir)
    return hashlib.sha256(json.dumps([t.encode(x) for x in TEXTS[:100]]).encode()).hexdigest()


def test_concurrent_loaders(tokenizer_dir, cdir):
    with mp.get_context("spawn").Pool(3) as pool:
        res = pool.map(_load_worker, [(str(tokenizer_dir), str(cdir))] * 6)
    assert len(set(res)) == 1
    assert [p.name for p in cdir.iterdir()] == [cache_file(cdir).name]  # whole files only, no temp left
    assert res[0] == _load_worker((tokenizer_dir, None))


# ---------------------------------------------------------------------------------------------------
# the bulk checks accept exactly what the line-by-line checks accept

def _outcome(fn, *a):
    try:
        return "ok", fn(*a)
    except TokenizerError as e:
        return "error", str(e)


def _tiny_vocab(extra=("ab", "ba", "aba", "aa", "bb", "Ġa")):
    toks = [BYTE_ENCODER[b] for b in range(256)] + list(extra) + [EOT]
    return {t: i for i, t in enumerate(toks)}


def _vocab_texts():
    v = _tiny_vocab()
    base = json.dumps(v, ensure_ascii=False)
    out = [base, json.dumps(v), base.replace(", ", ",\r\n"), "{}", "[]", "[[\"a\", 0]]", '"x"', "1", "null",
           base[:-1] + ', "ab": 300}', base[:-1] + ', "zz": {"a": 1}}', base[:-1] + ', "": 262}',
           base[:-1] + ', "a b": 262}', base[:-1] + ', "x": 262.0}', base[:-1] + ', "x": true}',
           base[:-1] + ', "x": "262"}', base[:-1] + ', "x": 10000000000000000000000}',
           base[:-1] + ', "x": 263}', base[:-1] + ', "x": -1}', base[:-1] + ', "x": 0}',
           base.replace('"<|endoftext|>"', '"<|endoftext|"'), base.replace('"!": 0, ', ""),
           base.replace('"!": 0', '"!": 262').replace('"ab": 256', '"ab": 0'), '{"a": 0, "a": 0}']
    rng = random.Random(7)
    ids = list(v.items())
    for _ in range(60):                                       # random id shuffles and deletions
        items = ids[:]
        k = rng.randrange(4)
        if k == 0:
            i, j = rng.randrange(len(items)), rng.randrange(len(items))
            items[i] = (items[i][0], items[j][1])
        elif k == 1:
            del items[rng.randrange(len(items))]
        elif k == 2:
            rng.shuffle(items)
        else:
            items.append((rng.choice(["Ā", "ĠĠ", "a\t", "é", "Ł", "\u0100\u0101"]), rng.randrange(-2, 270)))
        out.append("{" + ", ".join(f"{json.dumps(t)}: {i}" for t, i in items) + "}")
    return out


@pytest.mark.parametrize("k", range(len(_vocab_texts())))
def test_bulk_vocab_checks_agree_with_the_detailed_ones(k):
    text = _vocab_texts()[k]
    p = Path("vocab.json")
    fast, slow = _outcome(T._parse_vocab, text, p), _outcome(T._check_vocab, text, p)
    assert fast == slow


def _merges_texts():
    good = ["a b", "ab a", "b a", "a a", "b b", "Ġ a"]
    out = ["", "\n", "#version: 0.2\n", "#version: 0.2\n" + "\n".join(good) + "\n", "\n".join(good),
           "\n".join(good) + "\n\n", "#version: 0.2\r\n" + "\r\n".join(good) + "\r\n", "a b\r\nb\ra\n",
           "a  b\n", " a b\n", "a b \n", "a\tb\n", "a b c\n", "ab\n", "a b\n\nb a\n", "a b\nzz z\n",
           "a b\na c\n", "#version: 0.2\n#version: 0.2\n", "a b\n#version: 0.2\n", "Ġ Ġ\n", "a b\na b\n",
           "\u00a0 a\n", "a b\n ", " \n", "a\n", "aba a\n"]
    rng = random.Random(3)
    for _ in range(60):
        lines = good[:]
        for _ in range(rng.randrange(1, 3)):
            i = rng.randrange(len(lines))
            lines[i] = rng.choice([lines[i][::-1], lines[i] + " ", lines[i].replace(" ", ""), "ab b",
                                   "a" + lines[i], lines[i] + "b", "Ġa a", " ", "", "a\u3000b", "b ab"])
        out.append("\n".join(lines) + rng.choice(["", "\n", "\r\n"]))
    return out


@pytest.mark.parametrize("k", range(len(_merges_texts())))
def test_bulk_merge_checks_agree_with_the_detailed_ones(k):
    text, vocab, p = _merges_texts()[k], _tiny_vocab(), Path("merges.txt")
    fast = _outcome(T._merge_lines, T._decode_text(text.encode(), p, "merges file"), p, vocab)
    lines = T._decode_text(text.encode(), p, "merges file").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    slow = _outcome(T._check_merges, lines, p, vocab)
    assert fast == slow


# ---------------------------------------------------------------------------------------------------
# the time to the first forward step

def test_warm_start_to_first_step(ckpt_124m, tmp_path, monkeypatch):
    """GPT2.load + one step on the 124M shape, warm: the tiles come mapped from the tile cache and the
    tokenizer from its cache (~0.12 s on a quiet 2-core machine; timings are printed, not asserted:
    `make bench` measures start-up)."""
    from gpt2asm import GPT2
    monkeypatch.setenv("GPT2ASM_CACHE", str(tmp_path / "cache"))
    GPT2.load(ckpt_124m).close()                                          # cold: writes both caches
    best = {}
    for _ in range(3):
        t0 = time.perf_counter()
        m = GPT2.load(ckpt_124m)
        t1 = time.perf_counter()
        assert m.tokenizer.from_cache and m.model.resident.nbytes > 0      # both caches used
        m.model.step(m.model.new_state(), m.tokenizer.eot_id)
        t2 = time.perf_counter()
        m.close()
        t3 = time.perf_counter()
        Tokenizer.from_dir(ckpt_124m)
        t4 = time.perf_counter()
        Tokenizer.from_dir(ckpt_124m, cache_dir=False)
        t5 = time.perf_counter()
        for k, v in (("load", t1 - t0), ("step", t2 - t1), ("tok_warm", t4 - t3), ("tok_parse", t5 - t4)):
            best[k] = min(best.get(k, 1e9), v)
    print(f"\nwarm GPT2.load {best['load']:.3f} s + first step {best['step']:.3f} s; tokenizer from its "
          f"cache {best['tok_warm']:.3f} s, parsed {best['tok_parse']:.3f} s")

