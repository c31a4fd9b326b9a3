"""The Python API: load a model, encode/decode, logits, generate (whole or streamed).

    from gpt2asm import GPT2
    m = GPT2.load("models/gpt2", dtype="f32", isa=None, threads=2)
    print(m.generate("Alan Turing theorized that", max_new_tokens=40, temperature=0))
    for piece in m.stream("Hello", max_new_tokens=20, seed=1):
        print(piece, end="", flush=True)
"""
from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import ContextOverflowError, InvalidArgumentError
from .files import find_model_dir, is_random_init
from .kernels import Kernels
from .model import Transformer
from .sampler import Sampler
from .tokenizer import Tokenizer
from .weights import load_weights

DTYPES = {"f32": "f32", "fp32": "f32", "float32": "f32", "f16": "f16", "fp16": "f16", "float16": "f16"}


class GPT2:
    def __init__(self, transformer: Transformer, tokenizer: Tokenizer, model_dir: Path | None = None):
        self.model, self.tokenizer, self.model_dir = transformer, tokenizer, model_dir
        self.config = transformer.cfg
        self.random_init = bool(model_dir and is_random_init(model_dir))
        if tokenizer.vocab_size > self.config.vocab_size:
            raise InvalidArgumentError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model "
                                       f"only {self.config.vocab_size}")

    @classmethod
    def load(cls, path: str | os.PathLike | None = None, dtype: str = "f32", isa: str | int | None = None,
             threads: int = 1) -> "GPT2":
        """Load model.safetensors (+ config.json) and the tokenizer from a directory.

        dtype 'f32' or 'f16' (weight matrices stored as fp16); isa a kernel family name or index
        (None = best available, or $GPT2ASM_ISA); threads share each matrix product (same output)."""
        if dtype not in DTYPES:
            raise InvalidArgumentError(f"dtype must be one of f32, f16, got {dtype!r}")
        kernels = Kernels(isa, threads)                 # probe first: fail fast on an unusable CPU
        d = find_model_dir(path)
        weights = load_weights(d, DTYPES[dtype])
        return cls(Transformer(weights, kernels), Tokenizer.from_dir(d), d)

    @property
    def isa(self) -> str:
        return self.model.k.family

    @property
    def threads(self) -> int:
        return self.model.k.threads

    @property
    def dtype(self) -> str:
        return self.model.w.dtype

    def close(self) -> None:
        self.model.k.close()

    # -- tokens ------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    def check_ids(self, ids) -> list[int]:
        ids = [int(i) for i in ids]
        V = self.config.vocab_size
        bad = [i for i in ids if not 0 <= i < V]
        if bad:
            raise InvalidArgumentError(f"token ids out of range 0..{V - 1}: {bad[:5]}")
        return ids

    def logits(self, ids) -> np.ndarray:
        """Logits [len(ids)][vocab] for every position of the token list (full-prefix forward)."""
        ids = self.check_ids(ids)
        if not ids:
            raise InvalidArgumentError("logits() needs at least one token")
        return self.model.forward(ids)

    # -- generation --------------------------------------------------------------------------------

    def generate_ids(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.8, top_k: int = 0,
                     top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int = 0,
                     stats: dict | None = None) -> Iterator[int]:
        """Yield new token ids.  An empty prompt starts from <|endoftext|>, as transformers does."""
        import time
        ids = self.check_ids(prompt_ids) or [self.tokenizer.eot_id]
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 0):
            raise InvalidArgumentError(f"max_new_tokens must be an integer ≥ 0, got {max_new_tokens!r}")
        n_ctx = self.config.n_ctx
        if len(ids) + max_new_tokens > n_ctx:
            raise ContextOverflowError(len(ids) + max_new_tokens, n_ctx)
        sampler = Sampler(self.model.k.softmax, temperature, top_k, top_p, repetition_penalty, seed)
        state = self.model.new_state()
        t0 = time.perf_counter()
        for t in ids:
            logits = self.model.step(state, t)
        t1 = time.perf_counter()
        if stats is not None:
            stats.update(prompt=len(ids), generated=0, prefill_s=t1 - t0, decode_s=0.0)
        history = list(ids)
        for n in range(max_new_tokens):
            tok = sampler(logits, history)
            history.append(tok)
            if stats is not None:
                stats["generated"] = n + 1
            yield tok
            if n + 1 < max_new_tokens:
                logits = self.model.step(state, tok)
            if stats is not None:
                stats["decode_s"] = time.perf_counter() - t1

    def stream(self, prompt: str, max_new_tokens: int = 64, stop: list[str] | None = None,
               **kw) -> Iterator[str]:
        """Yield text pieces as tokens are generated; UTF-8 sequences split across tokens come whole."""
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = ""
        stop = [s for s in (stop or []) if s]
        emitted = 0
        for tok in self.generate_ids(self.encode(prompt), max_new_tokens, **kw):
            text += dec.decode(self.tokenizer.token_bytes(tok))
            if stop:
                hit = min((text.find(s) for s in stop if s in text), default=-1)
                if hit >= 0:
                    if hit > emitted:
                        yield text[emitted:hit]
                    return
                hold = max(len(s) for s in stop) - 1      # a stop string may still be forming
                safe = max(emitted, len(text) - hold)
            else:
                safe = len(text)
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
        text += dec.decode(b"", final=True)
        if len(text) > emitted:
            yield text[emitted:]

    def generate(self, prompt: str, max_new_tokens: int = 64, **kw) -> str:
        return "".join(self.stream(prompt, max_new_tokens, **kw))
