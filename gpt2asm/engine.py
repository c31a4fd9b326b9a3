"""The Python API: load a model, encode/decode, logits, generate (whole or streamed), sessions.

    from gpt2asm import GPT2
    m = GPT2.load("gpt2", dtype="f32", isa=None, threads=2)      # a directory or a hub name
    print(m.generate("Alan Turing theorized that", max_new_tokens=40, temperature=0))
    for piece in m.stream("Hello", max_new_tokens=20, seed=1):
        print(piece, end="", flush=True)

    s = m.session()                     # keeps its KV cache between calls
    chat = "Q: What is a CPU?\\nA:"
    chat += s.generate(chat, max_new_tokens=30, stop=["\\n"])
    chat += "\\nQ: And a GPU?\\nA:"
    chat += s.generate(chat, max_new_tokens=30, stop=["\\n"])   # prefills only the new suffix
    blob = s.snapshot()                 # bytes; s.restore(blob) or Session.from_bytes(m, blob) later

Every argument is checked here before anything reaches the kernels; mistakes are GPT2AsmError subclasses
(InvalidArgumentError, ContextOverflowError, ...), and the model stays usable after any of them.
"""
from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import struct
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from . import ggufload
from .args import integer, not_retired, token_ids
from .errors import (CheckpointError, ContextOverflowError, InvalidArgumentError, KernelUnavailableError,
                     NotCopyableError, SessionBusyError, shown)
from .files import find_model_dir, is_random_init
from .kernels import Kernels
from .model import Transformer
from .safefs import os_error_text
from .sampler import Sampler
from .state import common_prefix
from .tokenizer import Tokenizer, check_fits
from .tilecache import load_weights_cached as load_weights   # warm start: tiles mapped from disk
from .weights import MATRIX_DTYPES, Q0_DTYPES

DTYPES = {"f32": "f32", "fp32": "f32", "float32": "f32", "f16": "f16", "fp16": "f16", "float16": "f16",
          "q8_0": "q8_0", "q4_0": "q4_0"}
DTYPE_NAMES = tuple(MATRIX_DTYPES)             # the canonical names (Weights.dtype, GPT2.dtype)


# ----------------------------------------------------------------------------------------------------
# argument checks

def _check_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidArgumentError(f"stop must be a string or a list of strings, got {shown(stop)}")
    return [s for s in stop if s]


class _TextStream:
    """Token bytes -> text pieces: UTF-8 characters split across tokens come out whole, and text that may
    be the start of a stop string is held back until it is known not to be one."""

    def __init__(self, stop: list[str]):
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop, self.text, self.emitted, self.stopped = stop, "", 0, False
        self.hold = max((len(s) for s in stop), default=1) - 1

    def push(self, b: bytes) -> str:
        self.text += self.dec.decode(b)
        if self.stop:
            hits = [i for i in (self.text.find(s, max(0, self.emitted - self.hold)) for s in self.stop) if i >= 0]
            if hits:
                self.stopped = True
                cut = min(hits)
                out = self.text[self.emitted:cut] if cut > self.emitted else ""
                self.emitted = max(self.emitted, cut)
                return out
            safe = max(self.emitted, len(self.text) - self.hold)
        else:
            safe = len(self.text)
        out = self.text[self.emitted:safe]
        self.emitted = safe
        return out

    def finish(self) -> str:
        if self.stopped:
            return ""
        self.text += self.dec.decode(b"", final=True)
        if self.stop:
            hits = [i for i in (self.text.find(s, max(0, self.emitted - self.hold)) for s in self.stop) if i >= 0]
            if hits:
                cut = min(hits)
                out = self.text[self.emitted:cut] if cut > self.emitted else ""
                self.emitted = len(self.text)
                return out
        out = self.text[self.emitted:]
        self.emitted = len(self.text)
        return out


# ----------------------------------------------------------------------------------------------------

def _check_kernels_for(dtype: str, kernels) -> None:
    """q8_0 / q4_0 need the integer kernels and their plan jobs (docs/kernels.md, "q8_0 / q4_0"): a family
    without them (Kernels.has_q8_0 / has_q4_0 False: kernels.Q0_PLAN_FAMILIES) says so -- never another dtype."""
    if dtype in Q0_DTYPES and not getattr(kernels, f"has_{dtype}", False):
        raise KernelUnavailableError(
            f"dtype {shown(dtype)} needs the integer kernels gpt2asm_quantize_q8_0 / gpt2asm_matvec_{dtype} / "
            f"gpt2asm_matmul_{dtype} and their plan jobs (docs/kernels.md), which this build does not have "
            f"yet for the kernel family {kernels.family!r}; run dtype 'f32' or 'f16' (the weights "
            f"themselves load: gpt2asm.tilecache.load_weights_cached(path, {shown(dtype)}))")


class GPT2:
    def __init__(self, transformer: Transformer, tokenizer: Tokenizer, model_dir: Path | None = None):
        self.model, self.tokenizer, self.model_dir = transformer, tokenizer, model_dir
        self.config = transformer.cfg
        self.random_init = bool(model_dir and is_random_init(model_dir))
        check_fits(tokenizer.vocab_size, tokenizer.eot_id, self.config.vocab_size)
        # Only ids the tokenizer can print are sampled (a checkpoint may pad its vocabulary).
        self.n_sample = tokenizer.vocab_size

    @classmethod
    def load(cls, path_or_name: str | os.PathLike | None = None, dtype: str | None = None,
             isa: str | int | None = None,
             threads: int = 1, *, download: bool = True, progress: bool = True, kv: str | None = None) -> "GPT2":
        """Load a model: a directory with model.safetensors, vocab.json, merges.txt (+ config.json), a
        .safetensors file, or a hub name (gpt2, distilgpt2, gpt2-medium, gpt2-large, gpt2-xl; taken from
        the Hugging Face cache or downloaded, unless download=False). None: $GPT2ASM_MODEL, the current
        directory, then 'gpt2'.

        A .gguf file (llama.cpp's GPT-2 GGUF: F32/F16/BF16/Q8_0/Q4_0 tensors, a Q6_K output / token_embd)
        is read with its tokenizer from its metadata (gpt2asm.ggufload).

        dtype 'f32', 'f16' (weight matrices stored as fp16), 'q8_0' or 'q4_0' (llama.cpp's blocks of 32
        with integer dot products; KernelUnavailableError on a kernel family whose plan executor does not
        run them; the old int8 dtype is retired: InvalidArgumentError naming q8_0); None = f32, or a GGUF's own type; isa a
        kernel family name or index (None = best available, or $GPT2ASM_ISA); threads share each matrix
        product (same output); kv the KV cache's dtype, 'f32' or 'f16' (None: f32 with f32 weights, f16
        with the others -- half the bytes attention reads; logits close to an f32 cache's, not the same)."""
        not_retired(dtype)
        if dtype is not None and (not isinstance(dtype, str) or dtype.strip().lower() not in DTYPES):
            raise InvalidArgumentError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {shown(dtype)}")
        dtype = DTYPES[dtype.strip().lower()] if dtype is not None else None
        threads = integer("threads", threads, 1, 256)
        gguf_file = ggufload.resolve(path_or_name)
        kernels = Kernels(isa, threads)                 # probe first: fail fast on an unusable CPU
        try:
            if gguf_file is not None:                   # GGUF: weights and tokenizer from the one file
                if dtype is not None:
                    _check_kernels_for(dtype, kernels)
                weights, tok, _ = ggufload.load_gguf(gguf_file, dtype)      # dtype None: the file's own
                dtype = weights.dtype
            dtype = dtype or "f32"
            _check_kernels_for(dtype, kernels)
            if gguf_file is not None:
                model = Transformer(weights, kernels, kv)
                model.start_resident()
                return cls(model, tok, gguf_file)
            d = find_model_dir(path_or_name, download=download, progress=progress)
            weights = load_weights(d, dtype)
            tok = Tokenizer.from_dir(d)
            model = Transformer(weights, kernels, kv)
            model.start_resident()        # the matrices packed into one buffer of RAM in the background
            return cls(model, tok, d)
        except OSError as e:              # a file the system refuses to show (permissions, name too long...)
            kernels.close()
            where = f" ({str(e.filename)[:200]})" if e.filename else ""
            raise CheckpointError(f"cannot read the model files: {os_error_text(e)}{where}") from None
        except BaseException:
            kernels.close()
            raise

    @property
    def isa(self) -> str:
        return self.model.k.family

    @property
    def threads(self) -> int:
        return self.model.k.threads

    @property
    def dtype(self) -> str:
        return self.model.w.dtype

    @property
    def kv(self) -> str:
        """The KV cache's dtype: 'f32' or 'f16'."""
        return self.model.kv

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx

    def close(self) -> None:
        self.model.drop_idle_states()
        self.model.k.close()

    def __enter__(self) -> "GPT2":
        return self

    # A copy would share the -j worker pool (closing one would stop the other's) and the weights: refused.
    # One GPT2 may be shared by threads; another process loads its own (or inherits it through fork()).
    def __copy__(self):
        raise NotCopyableError("a GPT2 model cannot be copied (it owns the -j worker threads and the "
                               "weights' memory): share the one object between threads (each call has its "
                               "own KV cache), or GPT2.load the model again")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        raise NotCopyableError("a GPT2 model cannot be pickled (it owns native threads and memory): send "
                               "the model's path and GPT2.load it in the other process (the tile cache "
                               "makes that fast), or fork() after loading")

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT2({str(self.model_dir)!r}, n_layer={c.n_layer}, n_embd={c.n_embd}, n_head={c.n_head}, "
                f"n_ctx={c.n_ctx}, vocab={c.vocab_size}, dtype={self.dtype!r}, isa={self.isa!r}, "
                f"threads={self.threads})")

    # -- tokens ------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(self.check_ids(ids))

    def check_ids(self, ids) -> list[int]:
        """A list of ints in 0..vocab-1 (the ids both the model and the tokenizer know), or
        InvalidArgumentError (no str, float, bool or numpy floats): args.token_ids."""
        return token_ids(ids, min(self.config.vocab_size, self.tokenizer.vocab_size))

    def logits(self, ids) -> np.ndarray:
        """Logits [len(ids)][vocab] float32 for every position of the token list (full-prefix forward)."""
        ids = self.check_ids(ids)
        if not ids:
            raise InvalidArgumentError("logits() needs at least one token")
        if len(ids) > self.config.n_ctx:
            raise ContextOverflowError(len(ids), self.config.n_ctx)
        return self.model.forward(ids)

    # -- generation --------------------------------------------------------------------------------

    def _prepare(self, prompt_ids, max_new_tokens, sampling: dict) -> tuple[list[int], int, Sampler]:
        ids = self.check_ids(prompt_ids) or [self.tokenizer.eot_id]    # empty prompt: <|endoftext|>
        n = integer("max_new_tokens", max_new_tokens, 0)
        unknown = set(sampling) - {"temperature", "top_k", "top_p", "repetition_penalty", "seed"}
        if unknown:
            raise InvalidArgumentError(f"unknown argument(s) {', '.join(sorted(unknown))}; sampling takes "
                                       "temperature, top_k, top_p, repetition_penalty, seed")
        sampler = Sampler(self.model.k.softmax, **{"seed": None, **sampling}, argmax=self.model.k.argmax)
        if len(ids) + n > self.config.n_ctx:
            raise ContextOverflowError(len(ids) + n, self.config.n_ctx)
        return ids, n, sampler

    def _decode_loop(self, state, out, history: list[int], n: int, sampler: Sampler, stats: dict | None,
                     t1: float, fed: list[int] | None = None) -> Iterator[int]:
        """Sample n tokens starting from a step's (logits, argmax) `out`, feeding each but the last into
        `state`; fed tracks the tokens the cache holds (sessions).  Greedy sampling takes the argmax the
        step's LM head job found while the logits were in cache, when every logit may be sampled."""
        fused = self.n_sample == self.config.vocab_size
        src = view = None
        for k in range(n):
            logits, argmax = out
            if logits is not src:                               # a step returns the same view each time
                src, view = logits, logits[:self.n_sample]
            tok = sampler(view, history, argmax) if fused else sampler(view, history)
            history.append(tok)
            if stats is not None:
                stats["generated"] = k + 1
                stats["decode_s"] = time.perf_counter() - t1
            yield tok
            if k + 1 < n:
                out = self.model.step(state, tok)
                if fed is not None:
                    fed.append(tok)
            if stats is not None:
                stats["decode_s"] = time.perf_counter() - t1

    def generate_ids(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.8, top_k: int = 0,
                     top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int | None = None,
                     stats: dict | None = None, *, n: int | None = None) -> Iterator[int]:
        """Yield new token ids (a fresh KV cache per call). An empty prompt starts from <|endoftext|>, as
        transformers does. seed None = random; the same seed gives the same tokens.  Given a list of
        token id lists, or n: (choice index, token id) pairs of every sample of every prompt (batch.py)."""
        if n is not None or _batch().is_batch_ids(prompt_ids):
            return _batch().generate_ids(self, prompt_ids, max_new_tokens, n=n, temperature=temperature,
                                         top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                                         seed=seed)
        ids, n, sampler = self._prepare(prompt_ids, max_new_tokens, dict(
            temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty, seed=seed))
        return self._generate_ids(ids, n, sampler, stats)

    def _generate_ids(self, ids, n, sampler, stats) -> Iterator[int]:
        if stats is not None:
            stats.update(prompt=len(ids), generated=0, prefill_s=0.0, decode_s=0.0)
        if n == 0:
            return
        t0 = time.perf_counter()
        state = self.model.lease_state(ids)           # an idle cache, past the prefix it holds of ids
        reused = state.n
        held = ids[:reused]                           # the tokens the cache holds
        try:
            out = self.model.prefill(state, ids[reused:])     # batched: the bits of one step per token
            held = list(ids)
            t1 = time.perf_counter()
            if stats is not None:
                stats.update(prefill_s=t1 - t0, reused=reused)
            yield from self._decode_loop(state, out, list(ids), n, sampler, stats, t1, fed=held)
        finally:
            self.model.release_state(state, held)

    def _text(self, tokens: Iterator[int], stop) -> Iterator[str]:
        ts = _TextStream(_check_stop(stop))
        for tok in tokens:
            piece = ts.push(self.tokenizer.token_bytes(tok))
            if piece:
                yield piece
            if ts.stopped:
                tokens.close()
                return
        piece = ts.finish()
        if piece:
            yield piece

    def stream(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | str | None = None,
               **sampling) -> Iterator[str]:
        """Yield text pieces as tokens are generated; UTF-8 sequences split across tokens come whole, and
        generation ends before the first stop string (which is not yielded). The arguments are checked
        before the first piece is asked for.  Given a list of prompts, or n: (choice index, text piece)
        pairs of every sample of every prompt (batch.py)."""
        if _batch_form(prompt, sampling):
            return _batch().stream(self, prompt, max_new_tokens, stop, **sampling)
        stop = _check_stop(stop)
        ids, n, sampler = self._prepare(self.encode(prompt), max_new_tokens, sampling)
        return self._text(self._generate_ids(ids, n, sampler, None), stop)

    def generate(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | str | None = None,
                 **sampling) -> str:
        """The generated text (without the prompt). Sampling: temperature (0 = greedy), top_k, top_p,
        repetition_penalty, seed (None = random).  Given a list of prompts, or n: the list of every
        sample of every prompt, in order (batch.py: per-prompt arguments, derived seeds)."""
        if _batch_form(prompt, sampling):
            return _batch().generate(self, prompt, max_new_tokens, stop, **sampling)
        return "".join(self.stream(prompt, max_new_tokens, stop=stop, **sampling))

    def logprobs(self, texts, stride: int | None = None) -> list[np.ndarray]:
        """Per-token log-probabilities of each text (a str or a token id list): a float64 array per
        text, entry t = log p(token t | tokens < t) for t >= 1, entry 0 NaN; texts past n_ctx in
        transformers' sliding windows (scoring.py; stride default min(512, n_ctx // 2))."""
        from .scoring import token_logprobs_many
        return token_logprobs_many(self, texts, stride)

    def session(self, snapshot: bytes | None = None) -> "Session":
        """A Session: a KV cache kept between calls, reusing the longest shared token prefix; started
        from a Session.snapshot() when given one."""
        s = Session(self)
        if snapshot is not None:
            s.restore(snapshot)
        return s

    # -- identity of the weights (for KV snapshots) -------------------------------------------------

    def fingerprint(self) -> str:
        """A hash of the configuration, the weight and KV dtypes and every byte of every weight array the
        model computes with (tilecache.weights_digest): KV snapshots are only restored into the model they
        came from.  Computed once per model, on first use (a snapshot or a restore), and remembered in the
        tile cache directory under the checkpoint's cache key, so the next process reads it back."""
        if getattr(self, "_fingerprint", None):
            return self._fingerprint
        from .tilecache import weights_digest
        self._fingerprint = weights_digest(self.model.w, self.model.kv)[:32]
        return self._fingerprint


def _batch():
    from . import batch
    return batch


def _batch_form(prompt, sampling: dict) -> bool:
    """Whether generate / stream take the batch form (batch.py): a list of prompts, or n given; n=None is
    not given (as in generate_ids) and is dropped from sampling."""
    if sampling.get("n", 0) is None:
        del sampling["n"]
    return isinstance(prompt, (list, tuple)) or "n" in sampling


# ----------------------------------------------------------------------------------------------------

SNAP_MAGIC = b"GPT2ASM-KV\x00\x01"
_SNAP_HEAD = struct.Struct("<12sQ")          # magic, header length
_DIGEST = 32


class Session:
    """One conversation's KV cache, kept between calls.

    Each call takes the whole text (or token list) so far; the longest token prefix it shares with what
    the cache holds is reused and only the rest is prefilled. The output is exactly what a fresh model
    gives for the same arguments: cached positions hold bit-identical keys and values. After any error
    (ContextOverflowError, a bad argument, Ctrl-C) the session stays consistent and usable.

    s.tokens: the tokens whose keys/values the cache holds; s.reused / s.prefilled: what the last call
    took from the cache and what it computed; snapshot() -> bytes and restore(bytes)."""

    def __init__(self, model: GPT2):
        if not isinstance(model, GPT2):
            raise InvalidArgumentError(f"Session needs a GPT2 model, got {type(model).__name__}")
        self.gpt2 = model
        self._busy = threading.Lock()       # held by the one call (or live generator) using the cache
        self._state = model.model.new_state()
        self.tokens: list[int] = []
        self.reused = 0
        self.prefilled = 0

    @property
    def n(self) -> int:
        return len(self.tokens)

    @contextmanager
    def _use(self):
        """One user of the cache at a time: a second (another thread, or a new call while a generator of
        this session is alive) gets SessionBusyError at once and changes nothing."""
        if not self._busy.acquire(blocking=False):
            raise SessionBusyError("this session is busy: another generation on it is running or its generator "
                                   "is still open (finish or close() it first; one session per conversation)")
        try:
            yield
        finally:
            self._busy.release()

    def reset(self) -> None:
        with self._use():
            self.tokens = []
            self._state.n = 0

    def _sync(self) -> None:
        """Make tokens and the cache agree after an interruption (keep what both have)."""
        n = min(self._state.n, len(self.tokens))
        del self.tokens[n:]
        self._state.n = n

    def _prefill(self, ids: list[int]):
        """Feed ids, reusing the cached prefix; model.prefill's (logits, argmax) after the last one."""
        p = min(common_prefix(self.tokens, ids), len(ids) - 1)    # the last token is always fed (its logits)
        del self.tokens[p:]
        self._state.n = p                             # positions ≥ p are overwritten as they are fed
        self.reused, self.prefilled = p, len(ids) - p
        out = self.gpt2.model.prefill(self._state, ids[p:])       # the bits of one step per token
        self.tokens.extend(ids[p:])
        return out

    def generate_ids(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.8, top_k: int = 0,
                     top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int | None = None,
                     stats: dict | None = None) -> Iterator[int]:
        """As GPT2.generate_ids, on this session's cache (the generated tokens stay in it)."""
        ids, n, sampler = self.gpt2._prepare(prompt_ids, max_new_tokens, dict(
            temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty, seed=seed))
        return self._run(ids, n, sampler, stats)

    def _run(self, ids, n, sampler, stats) -> Iterator[int]:
        with self._use():                   # from the first token until the generator ends or is closed
            if stats is not None:
                stats.update(prompt=len(ids), generated=0, prefill_s=0.0, decode_s=0.0)
            try:
                t0 = time.perf_counter()
                out = self._prefill(ids)
                t1 = time.perf_counter()
                if stats is not None:
                    stats.update(prefill_s=t1 - t0, reused=self.reused)
                yield from self.gpt2._decode_loop(self._state, out, list(ids), n, sampler, stats, t1,
                                                  fed=self.tokens)
            finally:
                self._sync()

    def stream(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | str | None = None,
               **sampling) -> Iterator[str]:
        stop = _check_stop(stop)
        ids, n, sampler = self.gpt2._prepare(self.gpt2.encode(prompt), max_new_tokens, sampling)
        return self.gpt2._text(self._run(ids, n, sampler, None), stop)

    def generate(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | str | None = None,
                 **sampling) -> str:
        """As GPT2.generate (same result), reusing the cached prefix of `prompt`."""
        return "".join(self.stream(prompt, max_new_tokens, stop=stop, **sampling))

    def logits(self, ids) -> np.ndarray:
        """Logits [vocab] after the token list (a copy), reusing the cached prefix; the tokens stay cached."""
        ids = self.gpt2.check_ids(ids)
        if not ids:
            raise InvalidArgumentError("logits() needs at least one token")
        if len(ids) > self.gpt2.config.n_ctx:
            raise ContextOverflowError(len(ids), self.gpt2.config.n_ctx)
        with self._use():
            try:
                return np.array(self._prefill(ids)[0], dtype=np.float32, copy=True)
            finally:
                self._sync()

    # -- snapshots ----------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The cache and its tokens as bytes: magic, header length, JSON header, arrays, SHA-256."""
        with self._use():
            self._sync()
            snap, tokens = self._state.snapshot(), list(self.tokens)
        items, blobs, off = [], [], 0
        for x in snap:
            if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
                items.append({"int": int(x)})
            else:
                a = np.ascontiguousarray(x)
                items.append({"dtype": a.dtype.str, "shape": list(a.shape), "offset": off, "nbytes": a.nbytes})
                blobs.append(a.tobytes())
                off += a.nbytes
        header = json.dumps({"model": self.gpt2.fingerprint(), "tokens": tokens, "items": items},
                            separators=(",", ":")).encode()
        body = _SNAP_HEAD.pack(SNAP_MAGIC, len(header)) + header + b"".join(blobs)
        return body + hashlib.sha256(body).digest()

    def restore(self, data: bytes) -> None:
        """Replace this session's cache by a snapshot's; InvalidArgumentError (nothing changed) if the bytes
        are damaged, of another format, or from another model."""
        snap, tokens = self._parse(data)
        with self._use():
            self._state.restore(snap)
            self.tokens = tokens
            self._sync()

    @classmethod
    def from_bytes(cls, model: GPT2, data: bytes) -> "Session":
        s = cls(model)
        s.restore(data)
        return s

    def copy(self) -> "Session":
        """A branch of this conversation: the same model, its own copy of the cache and tokens (copy.copy
        and copy.deepcopy do this too; a shallow copy sharing the cache would mix two texts in it)."""
        with self._use():
            self._sync()
            snap, tokens = self._state.snapshot(), list(self.tokens)
        s = Session(self.gpt2)
        s._state.restore(snap)
        s.tokens = tokens
        return s

    __copy__ = copy

    def __deepcopy__(self, memo) -> "Session":
        return self.copy()

    def __reduce_ex__(self, protocol):
        raise NotCopyableError("a Session cannot be pickled (its model cannot): send s.snapshot() and "
                               "Session.from_bytes(model, data) it where the model is loaded")

    def _parse(self, data) -> tuple[tuple, list[int]]:
        bad = lambda why: InvalidArgumentError(f"not a usable KV snapshot: {why}")  # noqa: E731
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise bad(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < _SNAP_HEAD.size + _DIGEST:
            raise bad("too short")
        magic, hlen = _SNAP_HEAD.unpack_from(data)
        if magic != SNAP_MAGIC:
            raise bad("wrong magic (not a gpt2asm snapshot, or another version)")
        body, digest = data[:-_DIGEST], data[-_DIGEST:]
        if hashlib.sha256(body).digest() != digest:
            raise bad("checksum mismatch (damaged or truncated)")
        if _SNAP_HEAD.size + hlen > len(body):
            raise bad("header length beyond the data")
        try:
            h = json.loads(body[_SNAP_HEAD.size:_SNAP_HEAD.size + hlen])
        except (ValueError, RecursionError) as e:
            raise bad(f"header is not JSON: {e}") from None
        if not isinstance(h, dict) or not isinstance(h.get("items"), list) or not isinstance(h.get("tokens"), list):
            raise bad("header lacks items/tokens")
        if h.get("model") != self.gpt2.fingerprint():
            raise bad("it was taken with another model (configuration, weights or dtype differ)")
        try:
            tokens = self.gpt2.check_ids(h["tokens"])
        except InvalidArgumentError as e:
            raise bad(str(e)) from None
        cfg, data_start = self.gpt2.config, _SNAP_HEAD.size + hlen
        n = len(tokens)
        if n > cfg.n_ctx:
            raise bad(f"{n} tokens, more than the context ({cfg.n_ctx})")
        expect, kvt = _kv_layout(cfg, n), self._state.k.dtype
        items = h["items"]
        if len(items) != len(expect):
            raise bad(f"{len(items)} items, expected {len(expect)}")
        out, end = [], data_start
        for it, want in zip(items, expect):
            if not isinstance(it, dict):
                raise bad("malformed item")
            if want == "n":
                if it.get("int") != n or isinstance(it.get("int"), bool):
                    raise bad(f"position count {shown(it.get('int'))} does not match {n} tokens")
                out.append(n)
                continue
            dt, shape, off, nb = it.get("dtype"), it.get("shape"), it.get("offset"), it.get("nbytes")
            if dt != kvt.str or shape != list(want):
                raise bad(f"array {shown(dt)} {shown(shape)}, expected {kvt} {list(want)}")
            if type(off) is not int or type(nb) is not int or nb != math.prod(want) * kvt.itemsize \
                    or off != end - data_start:
                raise bad("array offsets do not add up")
            if end + nb > len(body):
                raise bad("array data beyond the end")
            out.append(np.frombuffer(body, kvt, count=nb // kvt.itemsize, offset=end).reshape(want))
            end += nb
        if end != len(body):
            raise bad("trailing bytes")
        return tuple(out), tokens


def _kv_layout(cfg, n: int) -> list:
    """What State.snapshot() holds for n positions: the count, then keys and values [layer][head][n][64]."""
    kv = (cfg.n_layer, cfg.n_head, n, cfg.head_dim)
    return ["n", kv, kv]
