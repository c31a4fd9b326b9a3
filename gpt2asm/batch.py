"""Many prompts and samples in one call: GPT2.generate / generate_ids / stream given a list, or n > 1.

    m.generate(["Hello", "The sky"], max_new_tokens=20, temperature=0)        # -> [str, str]
    m.generate("Once upon a time", n=4, seed=7)                               # -> 4 samples
    for i, piece in m.stream(["a", "b"], n=2, max_new_tokens=[10, 30]):       # (index, text) pieces
        ...

Results are in order: choice j = i * n + k is sample k of prompt i (as OpenAI's completions number
their choices).  Every argument (max_new_tokens, stop, temperature, top_k, top_p, repetition_penalty,
seed) is either one value for every prompt or a list with one value per prompt; for stop, a per-prompt
list is a list whose items are lists of strings (or None).

Seeds: prompt i has seed s_i (seed given as a list), or s + i * n (one seed s for the call; None: a
random s); its sample k samples with seed (s_i + k) mod 2**64.  So choice j of a call with one seed s
is GPT2.generate(prompt_i, seed=(s + j) mod 2**64, ...) alone, token for token (scheduler.sample_seed).

The sequences run through a Scheduler driven from the calling thread: continuous batching, each
sequence with its own KV cache, the same bits as alone.
"""
from __future__ import annotations

import collections
import os
from typing import Iterator

from .args import integer
from .errors import InvalidArgumentError
from .scheduler import MAX_SEED, Scheduler, SeqSpec, sample_seed

SAMPLING = ("temperature", "top_k", "top_p", "repetition_penalty", "seed")
API_BATCH = 32                               # sequences stepped together by the API's scheduler
MAX_SEQUENCES = 1 << 16                      # prompts x n per call: each waiting one holds its spec and
                                             # result (~2 KB); more is several calls, not one error at OOM


def is_batch_ids(prompt_ids) -> bool:
    """A list of token id lists (not one token id list)."""
    return isinstance(prompt_ids, (list, tuple)) and len(prompt_ids) > 0 and \
        not isinstance(prompt_ids[0], (str, bytes)) and hasattr(prompt_ids[0], "__len__")


def _per_prompt(name: str, v, P: int, is_list=lambda v: isinstance(v, (list, tuple))) -> list:
    if is_list(v):
        if len(v) != P:
            raise InvalidArgumentError(f"{name}: {len(v)} values for {P} prompts")
        return list(v)
    return [v] * P


def _stop_is_list(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(x is None or isinstance(x, (list, tuple)) for x in v)


def specs(id_lists: list[list[int]], n, max_new_tokens, stop, sampling: dict, logprobs=None) -> list[SeqSpec]:
    """SeqSpecs for every sample of every prompt, in choice order (j = i * n + k)."""
    unknown = set(sampling) - set(SAMPLING)
    if unknown:
        raise InvalidArgumentError(f"unknown argument(s) {', '.join(sorted(unknown))}; sampling takes "
                                   f"{', '.join(SAMPLING)}")
    P = len(id_lists)
    if P == 0:
        raise InvalidArgumentError("no prompts")
    n = integer("n", 1 if n is None else n, 1, 4096)
    if P * n > MAX_SEQUENCES:
        raise InvalidArgumentError(f"{P} prompts x n={n} is {P * n:,} sequences, more than {MAX_SEQUENCES:,} "
                                   "in one call: split the prompts over several calls")
    mx = _per_prompt("max_new_tokens", max_new_tokens, P)
    st = _per_prompt("stop", stop, P, _stop_is_list)
    per = {k: _per_prompt(k, v, P) for k, v in sampling.items()}
    seeds = per.pop("seed", [None] * P)
    if isinstance(sampling.get("seed"), (list, tuple)):
        base = [s if s is None else integer("seed", s, 0, MAX_SEED) for s in seeds]
        base = [int.from_bytes(os.urandom(8), "little") if s is None else s for s in base]
    else:
        s = sampling.get("seed")
        s = int.from_bytes(os.urandom(8), "little") if s is None else integer("seed", s, 0, MAX_SEED)
        base = [sample_seed(s, i * n) for i in range(P)]
    out = []
    for i, ids in enumerate(id_lists):
        args = {k: v[i] for k, v in per.items()}
        for k in range(n):
            out.append(SeqSpec(ids, mx[i], dict(args, seed=sample_seed(base[i], k)), st[i], logprobs))
    return out


def run(gpt2, seq_specs: list[SeqSpec]) -> Iterator:
    """Events of the sequences, stepped by a Scheduler from this thread; an error of any sequence is
    raised (as GPT2.generate would raise it); closing the iterator cancels what is left."""
    sched = Scheduler(gpt2, max_batch=min(len(seq_specs), API_BATCH), max_queue=1)
    buf: collections.deque = collections.deque()
    req = sched.submit(seq_specs, callback=buf.append)         # checks every spec first
    try:
        while buf or not req.done:
            while buf:
                ev = buf.popleft()
                if ev.finish_reason == "error":
                    raise ev.exception
                yield ev
            if not req.done:
                sched.step()
        sched.recycle()                                         # every sequence ended: its caches reusable
    finally:
        req.cancel()
        buf.clear()
        sched.release()


def _id_lists(gpt2, prompts) -> list[list[int]]:
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
        raise InvalidArgumentError("prompts must be a string or a list of strings")
    return [gpt2.encode(p) for p in prompts]


def stream(gpt2, prompts, max_new_tokens=64, stop=None, n=None, **sampling) -> Iterator[tuple[int, str]]:
    """(choice index, text piece) as the tokens come (checked before the first piece is asked for)."""
    sp = specs(_id_lists(gpt2, prompts), n, max_new_tokens, stop, sampling)
    for s in sp:                                   # every argument checked now, not at the first next()
        Scheduler.resolve_spec(gpt2, s)
    return ((ev.index, ev.text) for ev in run(gpt2, sp) if ev.text)


def generate(gpt2, prompts, max_new_tokens=64, stop=None, n=None, **sampling) -> list[str]:
    sp = specs(_id_lists(gpt2, prompts), n, max_new_tokens, stop, sampling)
    out = [""] * len(sp)
    for ev in run(gpt2, sp):
        out[ev.index] += ev.text
    return out


def generate_ids(gpt2, prompts_ids, max_new_tokens=64, n=None, **sampling) -> Iterator[tuple[int, int]]:
    """(choice index, token id) as the tokens come."""
    if not isinstance(prompts_ids, (list, tuple)):
        raise InvalidArgumentError("prompt_ids must be a list of token ids or a list of such lists")
    lists = list(prompts_ids) if is_batch_ids(prompts_ids) else [prompts_ids]
    sp = specs([gpt2.check_ids(p) for p in lists], n, max_new_tokens, None, sampling)
    for s in sp:
        Scheduler.resolve_spec(gpt2, s)
    return ((ev.index, ev.token) for ev in run(gpt2, sp) if ev.token is not None)
