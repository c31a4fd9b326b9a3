"""GPT-2 byte-level BPE tokenizer (vocab.json + merges.txt), matching Hugging Face's GPT2TokenizerFast.

encode: text -> split on the literal "<|endoftext|>" (kept as one id, 50256) -> GPT-2 regex
pre-tokenizer -> each piece's UTF-8 bytes mapped to printable chars (bytes_to_unicode) -> BPE
merges by rank -> ids.  decode: ids -> bytes of each token -> UTF-8 (invalid bytes -> U+FFFD).
Only the stdlib and `regex` (for \\p{L} / \\p{N}) are needed.

Loading is fast: vocab.json and merges.txt are checked in bulk (set operations and C-level loops) and
only a file that fails those checks goes through the line-by-line checks that name the problem. Merge
ranks are keyed by the merges.txt line 'left right' itself (no token holds U+0020). The parsed result is
also cached beside the tile cache (`cache_dir`, else $GPT2ASM_CACHE, else ~/.cache/gpt2asm;
$GPT2ASM_CACHE=off disables it) in one file per tokenizer content, `tokenizer-<hash>.F<format>.tok`
(the tokens by id, the merge lines by rank, the tokens' bytes), keyed by the SHA-256 of both files' bytes
and of this module's source (never stale: the files are hashed at every load), written atomically (temp
file + fsync + rename; the CACHE_MAX_FILES least recently used are kept), and checked by its own SHA-256
and section sizes before use: a missing, corrupt or foreign cache file means parsing the files again.
Warm, the 50k-token GPT-2 tokenizer loads in ~0.04 s (parsed: ~0.13 s; before either: ~0.23 s).
"""
from __future__ import annotations

import codecs
import hashlib
import heapq
import itertools
import json
import operator
import os
import stat
import struct
import tempfile
from pathlib import Path

import regex

from . import safefs, tilecache
from .errors import InvalidArgumentError, TokenizerError, shown

EOT = "<|endoftext|>"

# The GPT-2 pre-tokenizer: contractions, optional space + letters / digits / other symbols, spaces.
PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

CACHE_MAX = 1 << 16  # words kept in the encode cache before it is emptied


def check_fits(n_tokens: int, eot_id: int, vocab_size: int) -> None:
    """TokenizerError unless a tokenizer of n_tokens tokens, <|endoftext|> at eot_id, fits a model of vocab_size
    (GPT2 at load; tools/make_checkpoint.py before it writes a checkpoint)."""
    if n_tokens > vocab_size:
        raise TokenizerError(f"the tokenizer has {n_tokens} tokens but the model only {vocab_size}")
    if eot_id >= vocab_size:
        raise TokenizerError(f"<|endoftext|> has id {eot_id}, beyond the model's vocabulary")


def bytes_to_unicode() -> dict[int, str]:
    """byte (0..255) -> printable char; printable Latin-1 bytes map to themselves, the rest to 256+n."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_ENCODER = bytes_to_unicode()                          # int -> str (1 char)
BYTE_DECODER = {c: b for b, c in BYTE_ENCODER.items()}     # str (1 char) -> int
BYTE_TABLE = [BYTE_ENCODER[b] for b in range(256)]          # list[str], indexed by byte
_BYTE_CHARS = frozenset(BYTE_DECODER)                       # the characters a token may hold
_BYTE_MAP = codecs.charmap_build("".join(BYTE_TABLE))      # token chars -> their bytes, in C


def _read_bytes(path: Path, what: str) -> bytes:
    """A regular file of at most MAX_TOKENIZER bytes (a directory, FIFO or device is refused unopened)."""
    return safefs.read_bytes(path, safefs.MAX_TOKENIZER, TokenizerError, what)


def _decode_text(raw: bytes, path: Path, what: str) -> str:
    """UTF-8 with universal newlines (\\r\\n and \\r -> \\n), as Path.read_text gives it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{what} is not valid UTF-8: {path}: {e}") from None
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _read_text(path: Path, what: str) -> str:
    return _decode_text(_read_bytes(path, what), path, what)


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {shown(k)}")
        d[k] = v
    return d


class _Pairs(list):
    """object_pairs_hook of the fast vocab parse: an object's (key, value) pairs as parsed, in one call."""
    __slots__ = ()


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """vocab.json: a JSON object token -> id, the ids being exactly 0..N-1 (each once)."""
    path = Path(path)
    return _parse_vocab(_read_text(path, "vocab file"), path)


def _parse_vocab(text: str, path: Path) -> dict[str, int]:
    """The vocab checked in bulk; anything the bulk checks refuse goes through _check_vocab, which names
    the problem exactly as it always has."""
    try:
        pairs = json.loads(text, object_pairs_hook=_Pairs)
    except (ValueError, RecursionError) as e:        # JSONDecodeError, integers too long, deep nesting
        raise TokenizerError(f"vocab file {path} is not valid JSON: {shown(str(e), 200)}") from None
    if type(pairs) is _Pairs:
        vocab = dict(pairs)
        if len(vocab) == len(pairs) and _vocab_ok(vocab):
            return vocab
    return _check_vocab(text, path)


def _vocab_ok(vocab: dict) -> bool:
    """Every condition of _check_vocab, in bulk (C loops): ids the integers 0..N-1 once each, tokens
    non-empty strings of byte characters, every byte and <|endoftext|> present."""
    n = len(vocab)
    ids = vocab.values()
    if not n or set(map(type, ids)) != {int}:
        return False
    seen = set(ids)
    return (len(seen) == n and min(seen) == 0 and max(seen) == n - 1 and "" not in vocab
            and set("".join(vocab)) <= _BYTE_CHARS and all(map(vocab.__contains__, BYTE_TABLE))
            and EOT in vocab)


def _check_vocab(text: str, path: Path) -> dict[str, int]:
    """The detailed checks: raise the TokenizerError that names the first problem."""
    try:
        vocab = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except (ValueError, RecursionError) as e:        # JSONDecodeError, duplicate keys, deep nesting
        raise TokenizerError(f"vocab file {path} is not valid JSON: {shown(str(e), 200)}") from None
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"vocab file {path} must hold a non-empty JSON object token -> id")
    seen: dict[int, str] = {}
    for tok, i in vocab.items():
        if type(i) is not int:
            raise TokenizerError(f"vocab file {path}: id of {shown(tok)} is {shown(i)}, not an integer")
        if i in seen:
            raise TokenizerError(f"vocab file {path}: id {i} is used by both {shown(seen[i])} and {shown(tok)}")
        if not 0 <= i < len(vocab):
            raise TokenizerError(f"vocab file {path}: id {shown(i)} of {shown(tok)} is outside 0..{len(vocab) - 1}")
        if not tok or any(c not in BYTE_DECODER for c in tok):
            raise TokenizerError(f"vocab file {path}: token {shown(tok)} is not a byte-level BPE token")
        seen[i] = tok
    missing = [b for b in range(256) if BYTE_ENCODER[b] not in vocab]
    if missing:
        raise TokenizerError(f"vocab file {path}: no token for byte(s) {missing[:8]}")
    if EOT not in vocab:
        raise TokenizerError(f"vocab file {path}: no {EOT} token")
    return vocab


def load_merges(path: str | os.PathLike, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """merges.txt: optional '#version' first line, then one 'left right' pair per line, by rank."""
    path = Path(path)
    return [tuple(line.split(" ")) for line in _merge_lines(_read_text(path, "merges file"), path, vocab)]


def _merge_lines(text: str, path: Path, vocab: dict[str, int]) -> list[str]:
    """merges.txt -> its 'left right' lines by rank, checked in bulk: exactly one space per line, not at
    either end, and left, right and left+right all in the vocab. A file the bulk checks refuse goes
    through _check_merges, which names the first problem."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    body = lines[1:] if lines and lines[0].startswith("#version") else lines
    if not body:
        return body
    joined = "\n".join(body)
    if (set(map(str.count, body, itertools.repeat(" ", len(body)))) == {1} and joined[0] != " "
            and joined[-1] != " " and " \n" not in joined and "\n " not in joined):
        has = vocab.__contains__
        if (all(map(has, joined.replace("\n", " ").split(" ")))             # every left and right
                and all(map(has, joined.replace(" ", "").split("\n")))):    # every merged token
            return body
    return _check_merges(lines, path, vocab)


def _check_merges(lines: list[str], path: Path, vocab: dict[str, int]) -> list[str]:
    """The line-by-line checks: raise the TokenizerError that names the first problem."""
    merges = []
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if lineno == 1 and line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise TokenizerError(f"merges file {path}, line {lineno}: expected 'left right', got {shown(line)}")
        for tok in (parts[0], parts[1], parts[0] + parts[1]):
            if tok not in vocab:
                raise TokenizerError(f"merges file {path}, line {lineno}: {shown(tok)} is not in the vocab")
        merges.append(parts[0] + " " + parts[1])
    return merges


def _tokens_by_id(vocab: dict[str, int]) -> list[str]:
    """The tokens in id order (vocab.json is normally written in that order already)."""
    n = len(vocab)
    if list(vocab.values()) == list(range(n)):
        return list(vocab)
    tokens = [""] * n
    for tok, i in vocab.items():
        tokens[i] = tok
    return tokens


def _token_blob(tokens: list[str]) -> bytes:
    """The tokens' bytes, concatenated: each character is one byte (bytes_to_unicode inverted, in C)."""
    return codecs.charmap_encode("".join(tokens), "strict", _BYTE_MAP)[0]


# ----------------------------------------------------------------------------------------------------
# the parsed-tokenizer cache (one file per vocab.json + merges.txt content; see the module docstring)

CACHE_MAGIC = b"G2ATOKEN"
CACHE_FORMAT = 1
_CACHE_PREFIX = struct.Struct("<8sII32sQ")      # magic, format, reserved, SHA-256 of the rest, header length
_CACHE_MAX = 256 << 20                          # a bigger file is not ours
CACHE_MAX_FILES = 16                            # tokenizer caches kept per directory (least recently used go)
_code_sha: str | None = None


def cache_root(cache_dir=None) -> Path | None:
    """The cache directory (the tile cache's, tilecache.cache_root): cache_dir, else $GPT2ASM_CACHE, else
    ~/.cache/gpt2asm; None when off (cache_dir=False, or $GPT2ASM_CACHE=off)."""
    return None if cache_dir is False else tilecache.cache_root(cache_dir)


def _cache_key(vocab_raw: bytes, merges_raw: bytes) -> dict:
    global _code_sha
    if _code_sha is None:
        _code_sha = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return {"vocab_sha256": hashlib.sha256(vocab_raw).hexdigest(),
            "merges_sha256": hashlib.sha256(merges_raw).hexdigest(),
            "code_sha256": _code_sha, "format": CACHE_FORMAT}


def _cache_path(root: Path, key: dict) -> Path:
    h = hashlib.sha256((key["vocab_sha256"] + key["merges_sha256"]).encode()).hexdigest()[:24]
    return root / f"tokenizer-{h}.F{CACHE_FORMAT}.tok"


def _read_cache(path: Path, key: dict):
    """(tokens by id, merge lines by rank, the tokens' bytes concatenated) from a cache file, or None when
    it is missing, not a regular file, corrupt (its SHA-256), of another key or inconsistent."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))     # a FIFO must not block us
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _CACHE_PREFIX.size <= st.st_size <= _CACHE_MAX:
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read(st.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) != st.st_size:
        return None
    magic, fmt, _res, digest, hlen = _CACHE_PREFIX.unpack_from(data)
    body = memoryview(data)[_CACHE_PREFIX.size:]
    if magic != CACHE_MAGIC or fmt != CACHE_FORMAT or hashlib.sha256(body).digest() != digest:
        return None
    try:
        head = json.loads(bytes(body[:hlen]))
        if head["key"] != key:
            return None
        nt, nm, nb = head["tokens_nbytes"], head["merges_nbytes"], head["blob_nbytes"]
        if not all(type(x) is int and x >= 0 for x in (nt, nm, nb)) or hlen + nt + nm + nb != len(body):
            return None
        o = hlen
        tokens = str(body[o:o + nt], "utf-8").split("\n")
        o += nt
        lines = str(body[o:o + nm], "utf-8").split("\n") if nm else []
        blob = bytes(body[o + nm:])
        if (len(tokens) != head["n_vocab"] or len(lines) != head["n_merges"]
                or sum(map(len, tokens)) != nb):
            return None
        return tokens, lines, blob
    except (ValueError, KeyError, TypeError, AttributeError):      # UnicodeDecodeError is a ValueError
        return None


def _write_cache(path: Path, key: dict, tokens: list[str], lines: list[str], blob: bytes) -> None:
    """Write the cache file atomically (temp file in the same directory, fsync, rename). Raises OSError."""
    t, m = "\n".join(tokens).encode("utf-8"), "\n".join(lines).encode("utf-8")
    head = json.dumps({"key": key, "n_vocab": len(tokens), "n_merges": len(lines), "tokens_nbytes": len(t),
                       "merges_nbytes": len(m), "blob_nbytes": len(blob)}, sort_keys=True).encode()
    body = b"".join((head, t, m, blob))
    data = _CACHE_PREFIX.pack(CACHE_MAGIC, CACHE_FORMAT, 0, hashlib.sha256(body).digest(), len(head)) + body
    path.parent.mkdir(parents=True, exist_ok=True)
    tilecache.cleanup_temps(path.parent, ".tokenizer-*.tok.*.tmp")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=tilecache.temp_prefix(path), suffix=".tmp")
    try:
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _evict(path)


def _evict(keep: Path) -> None:
    """At most CACHE_MAX_FILES tokenizer caches per directory: the least recently used (mtime, set when
    written or used) beyond that are removed (many distinct tokenizers, e.g. a fuzzer's, stay bounded)."""
    files = []
    for p in keep.parent.glob("tokenizer-*.tok"):
        try:
            files.append((p.stat().st_mtime, p))
        except OSError:
            pass
    files.sort()
    for _, p in files[:max(0, len(files) - CACHE_MAX_FILES)]:
        if p != keep:
            try:
                p.unlink()
            except OSError:
                pass


class Tokenizer:
    """GPT-2 byte-level BPE. ids are ints in [0, vocab_size)."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]):
        lines = []
        for a, b in merges:
            if " " in a or " " in b:                                # (no byte-level token holds U+0020)
                raise TokenizerError(f"merge ({shown(a)}, {shown(b)}): a token cannot contain a space")
            lines.append(a + " " + b)
        self._setup(vocab, lines)

    def _setup(self, vocab: dict[str, int], merge_lines: list[str], tokens: list[str] | None = None,
               blob: bytes | None = None) -> None:
        """vocab token -> id; merge_lines 'left right' by rank; tokens (by id) and blob (their bytes,
        concatenated) when already known."""
        self.encoder = vocab                                        # str token -> id
        self.vocab_size = len(vocab)
        self.eot_id = vocab[EOT]                                    # 50256 for GPT-2
        # 'left right' -> rank (lower merges first; a repeated pair keeps its last rank)
        self.ranks = dict(zip(merge_lines, range(len(merge_lines))))
        if tokens is None:
            tokens = _tokens_by_id(vocab)
        if blob is None:
            blob = _token_blob(tokens)
        ends = list(itertools.accumulate(map(len, tokens)))        # one byte per token character
        self._bytes = [blob[s:e] for s, e in zip(itertools.chain((0,), ends), ends)]   # id -> bytes
        self._cache: dict[str, list[int]] = {}                     # pre-token text -> ids
        self.from_cache = False                                    # loaded from the parsed-tokenizer cache

    @classmethod
    def _from_parsed(cls, vocab, merge_lines, tokens=None, blob=None) -> "Tokenizer":
        self = cls.__new__(cls)
        self._setup(vocab, merge_lines, tokens, blob)
        return self

    @classmethod
    def from_files(cls, vocab_path: str | os.PathLike, merges_path: str | os.PathLike, *,
                   cache_dir=None) -> "Tokenizer":
        """Load vocab.json and merges.txt. The parsed result is cached (see the module's docstring):
        cache_dir None = $GPT2ASM_CACHE, else ~/.cache/gpt2asm; False = no cache."""
        vocab_path, merges_path = Path(vocab_path), Path(merges_path)
        vraw = _read_bytes(vocab_path, "vocab file")
        try:
            mraw = _read_bytes(merges_path, "merges file")
        except TokenizerError:                                      # a bad vocab.json is reported first
            _parse_vocab(_decode_text(vraw, vocab_path, "vocab file"), vocab_path)
            raise
        root = cache_root(cache_dir)
        cpath = key = None
        if root is not None:
            key = _cache_key(vraw, mraw)
            cpath = _cache_path(root, key)
            hit = _read_cache(cpath, key)
            if hit is not None:
                tokens, lines, blob = hit
                vocab = dict(zip(tokens, range(len(tokens))))
                if len(vocab) == len(tokens) and EOT in vocab:
                    try:
                        os.utime(cpath)                             # recently used (for _evict)
                    except OSError:
                        pass
                    tok = cls._from_parsed(vocab, lines, tokens, blob)
                    tok.from_cache = True
                    return tok
        vocab = _parse_vocab(_decode_text(vraw, vocab_path, "vocab file"), vocab_path)
        lines = _merge_lines(_decode_text(mraw, merges_path, "merges file"), merges_path, vocab)
        tokens = _tokens_by_id(vocab)
        blob = _token_blob(tokens)
        tok = cls._from_parsed(vocab, lines, tokens, blob)
        if cpath is not None:
            try:
                _write_cache(cpath, key, tokens, lines, blob)
            except (OSError, ValueError):                          # read-only, full disk...: no cache
                pass
        return tok

    @classmethod
    def from_dir(cls, path: str | os.PathLike, *, cache_dir=None) -> "Tokenizer":
        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(f"tokenizer directory not found: {path}")
        return cls.from_files(path / "vocab.json", path / "merges.txt", cache_dir=cache_dir)

    # --- encode ---

    def _bpe(self, word: str) -> list[int]:
        """word: a pre-token already mapped through bytes_to_unicode -> ids.

        Merges the lowest-ranked adjacent pair (leftmost on ties) until no pair merges, exactly as
        HF's tokenizers does. A heap of (rank, position) and a linked list keep long words O(n log n).
        A pair is looked up as 'left right' (no part holds a space: U+0020 is no byte character).
        """
        ranks = self.ranks
        parts: list = list(word)                 # parts[i]: str, or None once merged into a left neighbour
        n = len(parts)
        nxt = list(range(1, n + 1))              # index of the next live part (n: none)
        prv = list(range(-1, n - 1))             # index of the previous live part (-1: none)
        heap = [(r, i) for i in range(n - 1) if (r := ranks.get(parts[i] + " " + parts[i + 1])) is not None]
        heapq.heapify(heap)
        while heap:
            r, i = heapq.heappop(heap)
            j = nxt[i]
            if parts[i] is None or j == n or ranks.get(parts[i] + " " + parts[j]) != r:
                continue                         # stale: that pair is gone
            parts[i] += parts[j]                 # merge j into i
            parts[j] = None
            nxt[i] = k = nxt[j]
            if k < n:
                prv[k] = i
                if (r2 := ranks.get(parts[i] + " " + parts[k])) is not None:
                    heapq.heappush(heap, (r2, i))
            p = prv[i]
            if p >= 0 and (r2 := ranks.get(parts[p] + " " + parts[i])) is not None:
                heapq.heappush(heap, (r2, p))
        enc = self.encoder
        return [enc[t] for t in parts if t is not None]

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        """Append the ids of text (no special tokens in it) to out."""
        cache = self._cache
        for piece in PAT.findall(text):
            ids = cache.get(piece)
            if ids is None:
                try:
                    raw = piece.encode("utf-8")
                except UnicodeEncodeError as e:  # lone surrogates (e.start: within this piece, not the text)
                    raise TokenizerError(f"text cannot be encoded as UTF-8: it holds the lone surrogate "
                                         f"U+{ord(piece[e.start]):04X}") from None
                ids = self._bpe("".join([BYTE_TABLE[b] for b in raw]))
                if len(cache) >= CACHE_MAX:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)

    def encode(self, text: str) -> list[int]:
        """str -> list[int]. A literal '<|endoftext|>' in text becomes the single id eot_id."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"encode() takes a str, got {type(text).__name__}")
        out: list[int] = []
        for k, chunk in enumerate(text.split(EOT)):
            if k:
                out.append(self.eot_id)
            self._encode_ordinary(chunk, out)
        return out

    # --- decode ---

    def _check_id(self, i) -> int:
        if type(i) is not int:
            if isinstance(i, bool):
                raise InvalidArgumentError(f"token id must be an integer, got {shown(i)}")
            try:
                i = operator.index(i)  # numpy integers etc.
            except TypeError:
                raise InvalidArgumentError(f"token id must be an integer, got {type(i).__name__} {shown(i)}") from None
        if not 0 <= i < self.vocab_size:
            raise InvalidArgumentError(f"token id {shown(i)} is outside [0, {self.vocab_size})")
        return i

    def token_bytes(self, id) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character)."""
        return self._bytes[self._check_id(id)]

    def decode_bytes(self, ids) -> bytes:
        """Iterable of ids -> the concatenated token bytes."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise InvalidArgumentError(f"expected a sequence of token ids, got {type(ids).__name__}")
        tb, n = self._bytes, self.vocab_size
        return b"".join([tb[i] if type(i) is int and 0 <= i < n else tb[self._check_id(i)] for i in ids])

    def decode(self, ids) -> str:
        """Iterable of ids -> str; invalid UTF-8 becomes U+FFFD as in HF."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
