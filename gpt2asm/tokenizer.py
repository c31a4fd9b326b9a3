"""GPT-2 byte-level BPE tokenizer (vocab.json + merges.txt), matching Hugging Face's GPT2TokenizerFast.

encode: text -> split on the literal "<|endoftext|>" (kept as one id, 50256) -> GPT-2 regex
pre-tokenizer -> each piece's UTF-8 bytes mapped to printable chars (bytes_to_unicode) -> BPE
merges by rank -> ids.  decode: ids -> bytes of each token -> UTF-8 (invalid bytes -> U+FFFD).
Only the stdlib and `regex` (for \\p{L} / \\p{N}) are needed.
"""
from __future__ import annotations

import heapq
import json
import operator
import os
from pathlib import Path

import regex

from .errors import InvalidArgumentError, TokenizerError

EOT = "<|endoftext|>"

# The GPT-2 pre-tokenizer: contractions, optional space + letters / digits / other symbols, spaces.
PAT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

CACHE_MAX = 1 << 16  # words kept in the encode cache before it is emptied


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


def _read_text(path: Path, what: str) -> str:
    try:
        if path.exists() and not path.is_file():     # a directory, FIFO (would block) or device
            raise TokenizerError(f"{what} {path} is not a regular file")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TokenizerError(f"{what} not found: {path}") from None
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{what} is not valid UTF-8: {path}: {e}") from None
    except OSError as e:
        raise TokenizerError(f"cannot read {what} {path}: {e}") from None


def _short(v, limit: int = 80) -> str:
    """repr of a value cut short: a damaged file may hold anything, of any size."""
    r = v if isinstance(v, str) and limit > 80 else repr(v)
    return r if len(r) <= limit else r[:limit] + "..."


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {_short(k)}")
        d[k] = v
    return d


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """vocab.json: a JSON object token -> id, the ids being exactly 0..N-1 (each once)."""
    path = Path(path)
    try:
        vocab = json.loads(_read_text(path, "vocab file"), object_pairs_hook=_no_duplicate_keys)
    except (ValueError, RecursionError) as e:        # JSONDecodeError, duplicate keys, deep nesting
        raise TokenizerError(f"vocab file {path} is not valid JSON: {_short(str(e), 200)}") from None
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"vocab file {path} must hold a non-empty JSON object token -> id")
    seen: dict[int, str] = {}
    for tok, i in vocab.items():
        if type(i) is not int:
            raise TokenizerError(f"vocab file {path}: id of {_short(tok)} is {_short(i)}, not an integer")
        if i in seen:
            raise TokenizerError(f"vocab file {path}: id {i} is used by both {_short(seen[i])} and {_short(tok)}")
        if not 0 <= i < len(vocab):
            raise TokenizerError(f"vocab file {path}: id {_short(i)} of {_short(tok)} is outside 0..{len(vocab) - 1}")
        if not tok or any(c not in BYTE_DECODER for c in tok):
            raise TokenizerError(f"vocab file {path}: token {_short(tok)} is not a byte-level BPE token")
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
    lines = _read_text(path, "merges file").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    merges = []
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if lineno == 1 and line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise TokenizerError(f"merges file {path}, line {lineno}: expected 'left right', got {_short(line)}")
        for tok in (parts[0], parts[1], parts[0] + parts[1]):
            if tok not in vocab:
                raise TokenizerError(f"merges file {path}, line {lineno}: {_short(tok)} is not in the vocab")
        merges.append((parts[0], parts[1]))
    return merges


class Tokenizer:
    """GPT-2 byte-level BPE. ids are ints in [0, vocab_size)."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]):
        self.encoder = vocab                                        # str token -> id
        self.vocab_size = len(vocab)
        self.eot_id = vocab[EOT]                                    # 50256 for GPT-2
        self.ranks = {pair: r for r, pair in enumerate(merges)}    # (str, str) -> rank (lower merges first)
        self._bytes = [b""] * self.vocab_size                       # id -> bytes of the token
        for tok, i in vocab.items():
            self._bytes[i] = bytes(BYTE_DECODER[c] for c in tok)
        self._cache: dict[str, list[int]] = {}                     # pre-token text -> ids

    @classmethod
    def from_files(cls, vocab_path: str | os.PathLike, merges_path: str | os.PathLike) -> "Tokenizer":
        vocab = load_vocab(vocab_path)
        return cls(vocab, load_merges(merges_path, vocab))

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "Tokenizer":
        path = Path(path)
        if not path.is_dir():
            raise TokenizerError(f"tokenizer directory not found: {path}")
        return cls.from_files(path / "vocab.json", path / "merges.txt")

    # --- encode ---

    def _bpe(self, word: str) -> list[int]:
        """word: a pre-token already mapped through bytes_to_unicode -> ids.

        Merges the lowest-ranked adjacent pair (leftmost on ties) until no pair merges, exactly as
        HF's tokenizers does. A heap of (rank, position) and a linked list keep long words O(n log n).
        """
        ranks = self.ranks
        parts: list = list(word)                 # parts[i]: str, or None once merged into a left neighbour
        n = len(parts)
        nxt = list(range(1, n + 1))              # index of the next live part (n: none)
        prv = list(range(-1, n - 1))             # index of the previous live part (-1: none)
        heap = [(r, i) for i in range(n - 1) if (r := ranks.get((parts[i], parts[i + 1]))) is not None]
        heapq.heapify(heap)
        while heap:
            r, i = heapq.heappop(heap)
            j = nxt[i]
            if parts[i] is None or j == n or ranks.get((parts[i], parts[j])) != r:
                continue                         # stale: that pair is gone
            parts[i] += parts[j]                 # merge j into i
            parts[j] = None
            nxt[i] = k = nxt[j]
            if k < n:
                prv[k] = i
                if (r2 := ranks.get((parts[i], parts[k]))) is not None:
                    heapq.heappush(heap, (r2, i))
            p = prv[i]
            if p >= 0 and (r2 := ranks.get((parts[p], parts[i]))) is not None:
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
                except UnicodeEncodeError as e:  # lone surrogates
                    raise TokenizerError(f"text cannot be encoded as UTF-8: {e}") from None
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
                raise InvalidArgumentError(f"token id must be an integer, got {i!r}")
            try:
                i = operator.index(i)  # numpy integers etc.
            except TypeError:
                raise InvalidArgumentError(f"token id must be an integer, got {type(i).__name__} {i!r}") from None
        if not 0 <= i < self.vocab_size:
            raise InvalidArgumentError(f"token id {i} is outside [0, {self.vocab_size})")
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
