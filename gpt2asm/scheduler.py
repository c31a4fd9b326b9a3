"""Continuous batching: many sequences stepped together, each the same bits as decoding it alone.

    sched = Scheduler(gpt2, max_batch=32, max_queue=256)
    sched.start()                                   # one background thread drives the model
    req = sched.submit([SeqSpec(ids, max_tokens=20, sampling=dict(temperature=0, seed=1))])
    for ev in req:                                  # Event(index, token, text, ..., finish_reason)
        print(ev.text, end="")
    sched.close()

The unit of work is a sequence (one sample of one prompt); a Request is the sequences submitted together
(every sample of every prompt of one API call or HTTP request), queued all or none.  Each step of the
driver (Scheduler.step):

  1. cancelled requests free their slots (a cancelled or disconnected request ends at the next step);
  2. waiting sequences take free slots of the bounded KV pool (max_batch States, reused), first come
     first served;
  3. one chunk of prompt (at most prefill_chunk tokens, over the sequences still prefilling, oldest first)
     is prefilled, so a long prompt never stalls the running sequences for more than one chunk; a
     sequence whose prompt is complete samples its first token (the other samples of the same prompt in
     its request, if in slots by then, take a copy of its cache instead of prefilling it again);
  4. every running sequence with a token to feed is stepped by ONE engine call,
     Transformer.step_batch(states, tokens) -> (logits [B][V], argmax [B]) -- one library call that
     reads each weight tile once for all B rows -- and samples its next token.

Every sequence has its own State (KV cache) and Sampler, so its logits and tokens are those of
GPT2.generate run alone with the same arguments (the prefill gives the bits of one step per token in any
chunking; step_batch the bits of Transformer.step).  The model's kernels are not re-entrant: only the
driver (the background thread of start(), or whoever calls step()/run()) touches the model; call() runs
other model work (scoring) on it between steps, one call a step (so the running sequences keep decoding
while a long list of texts is scored; a call whose Future was cancelled before it started is skipped).

Seeds: sample k of a prompt whose seed is s samples with seed (s + k) mod 2**64 (sample_seed), so it can
be reproduced alone with GPT2.generate(prompt, seed=sample_seed(s, k)).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import queue
import threading
import time
from typing import Callable, Iterator

import numpy as np

from .args import MAX_SEED, integer
from .errors import GPT2AsmError, InvalidArgumentError, ResourceError
from .pool import start_thread
from .sampler import UNKNOWN
from .scoring import log_softmax
from .state import best_reuse, reuse



class QueueFullError(GPT2AsmError):
    """The scheduler's waiting queue is full (the server answers 429)."""


class RequestTooLargeError(InvalidArgumentError):
    """The request can never be admitted, whatever else runs (the server answers 400, not 429)."""


class SchedulerClosedError(GPT2AsmError):
    """The scheduler is draining or closed and takes no new requests (the server answers 503)."""


def sample_seed(seed: int, k: int) -> int:
    """The seed of sample k of a prompt with seed `seed`: (seed + k) mod 2**64."""
    return (seed + k) & MAX_SEED


@dataclasses.dataclass
class SeqSpec:
    """One sequence to generate: prompt token ids (checked; [] = <|endoftext|>), max_tokens, sampling
    arguments as GPT2.generate takes them (temperature, top_k, top_p, repetition_penalty, seed: the
    sample's own seed, see sample_seed), stop strings, and logprobs (None, or k: each token's
    log-probability and the k most likely alternatives)."""
    prompt_ids: list
    max_tokens: int = 16
    sampling: dict = dataclasses.field(default_factory=dict)
    stop: list | str | None = None
    logprobs: int | None = None


@dataclasses.dataclass
class Event:
    """Output of sequence `index` of a request: a token (token None on the final event) and the text it
    completes (UTF-8 characters whole, stop strings held back and cut); on the last event of a sequence,
    finish_reason 'length' (max_tokens reached), 'stop' (a stop string), 'cancelled' (by the client),
    'shutdown' (the server stopped before it finished) or 'error' (error holds the message)."""
    index: int
    token: int | None
    text: str
    t: float                                       # time.monotonic() when it was produced
    logprob: float | None = None                   # log p(token) under the model (logprobs asked for)
    top: dict | None = None                        # {token id: log p} of the k most likely
    finish_reason: str | None = None
    error: str | None = None
    exception: BaseException | None = dataclasses.field(default=None, repr=False)
    cached: int = 0                                # final event: prompt tokens found in a slot's cache (a
    #                                                prompt's first sample only: usage counts a prompt once)


class Request:
    """Sequences submitted together; their events arrive on a queue (iterate the request) or through the
    callback given to submit (called on the driver thread: it must not block)."""

    _ids = itertools.count()

    def __init__(self, n_seqs: int, callback: Callable[[Event], None] | None):
        self.id = next(Request._ids)
        self.n = n_seqs
        self.t_submit = time.monotonic()
        self.cancelled = False
        self.finished = 0
        self._callback = callback
        self._q: queue.Queue | None = None if callback else queue.Queue()

    def cancel(self) -> None:
        """Stop generating: every unfinished sequence ends with finish_reason 'cancelled' at the next step."""
        self.cancelled = True

    @property
    def done(self) -> bool:
        return self.finished >= self.n

    def _emit(self, ev: Event) -> None:
        if self._callback is not None:
            self._callback(ev)
        else:
            self._q.put(ev)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events until every sequence has finished (queue mode)."""
        if self._q is None:
            raise InvalidArgumentError("this request delivers its events to a callback")
        finished = 0
        while finished < self.n:
            ev = self._q.get(timeout=timeout)
            if ev.finish_reason is not None:
                finished += 1
            yield ev

    __iter__ = events


class _Seq:
    """A sequence in flight: its spec resolved (ids, sampler), its slot's State, what it has produced."""

    def __init__(self, req: Request, index: int, ids: list[int], n: int, sampler, stop: list[str],
                 logprobs: int | None, text_stream):
        self.req, self.index, self.ids, self.n, self.sampler = req, index, ids, n, sampler
        self.logprobs, self.ts, self.stop = logprobs, text_stream, stop
        self.state = None
        self.leader: _Seq | None = None             # the first sample of the same prompt in the request:
        self.twins: list[_Seq] = []                 # (its followers) prefills once for all of them
        self.fed = 0                                # prompt tokens prefilled
        self.cached = 0                             # of them, found in its slot's cache (first samples)
        self.history = list(ids)
        self.generated = 0
        self.pending: int | None = None             # the last sampled token, to be fed next step
        self.finished = False


class Scheduler:
    def __init__(self, gpt2, max_batch: int = 32, max_queue: int = 256, prefill_chunk: int = 64):
        self.m = gpt2
        self.model = gpt2.model
        self.max_batch = integer("max_batch", max_batch, 1, 4096)
        self.max_queue = integer("max_queue", max_queue, 0, 1 << 20)
        self.prefill_chunk = integer("prefill_chunk", prefill_chunk, 1, 1 << 20)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting: collections.deque[list[_Seq]] = collections.deque()   # requests, all or none
        self._running: list[_Seq] = []                                       # in slots, oldest first
        self._free: list = []                                                # States not in use
        self._n_states = 0
        self._calls: collections.deque = collections.deque()                 # (fn, future) for the driver
        self._requests: set[Request] = set()
        self._draining = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.steps = 0                       # driver iterations that did model work
        self.tokens = 0                      # tokens sampled
        self.reused = 0                      # prompt tokens a cache held already (not prefilled again)

    # -- submitting ---------------------------------------------------------------------------------

    @staticmethod
    def resolve_spec(gpt2, spec: SeqSpec):
        """A SeqSpec checked as GPT2.generate checks its arguments: (ids, n, Sampler, stop, logprobs)."""
        from .engine import _check_stop
        if not isinstance(spec.sampling, dict):
            raise InvalidArgumentError("sampling must be a dict")
        ids, n, sampler = gpt2._prepare(spec.prompt_ids, spec.max_tokens, dict(spec.sampling))
        stop = _check_stop(spec.stop)
        lp = None if spec.logprobs is None else integer("logprobs", spec.logprobs, 0, 20)
        return ids, n, sampler, stop, lp

    def submit(self, specs: list[SeqSpec], callback: Callable[[Event], None] | None = None) -> Request:
        """Queue the sequences (event index = position in specs), all or none: InvalidArgumentError /
        ContextOverflowError for a bad spec, QueueFullError when max_queue requests are waiting,
        SchedulerClosedError while draining or closed."""
        from .engine import _TextStream
        if not isinstance(specs, (list, tuple)) or not specs or not all(isinstance(s, SeqSpec) for s in specs):
            raise InvalidArgumentError("submit() takes a non-empty list of SeqSpec")
        self.check_admissible(len(specs))
        resolved = [self.resolve_spec(self.m, s) for s in specs]
        req = Request(len(specs), callback)
        seqs = [_Seq(req, i, ids, n, sampler, stop, lp, _TextStream(stop))
                for i, (ids, n, sampler, stop, lp) in enumerate(resolved)]
        leaders: dict = {}
        for q in seqs:                                # samples of one prompt share its prefill
            lead = leaders.setdefault(tuple(q.ids), q)
            if lead is not q:
                q.leader = lead
                lead.twins.append(q)
        with self._lock:
            if self._closed or self._draining:
                raise SchedulerClosedError("the server is shutting down and takes no new requests")
            if self._queued_beyond_slots(len(seqs)) > self.max_queue:
                raise QueueFullError(f"the queue is full ({self.max_queue} requests waiting); retry later")
            self._waiting.append(seqs)
            self._requests.add(req)
            self._wake.notify()
        return req

    def check_admissible(self, n: int) -> None:
        """RequestTooLargeError if a request of n sequences could never start.  A request takes the free
        slots and waits in the queue for the rest, so any size is admitted once the queue has room --
        except with max_queue 0, where nothing may wait: then more than max_batch sequences never fit (429
        "queue full" would have the client retry for ever)."""
        if self.max_queue == 0 and n > self.max_batch:
            raise RequestTooLargeError(f"this request has {n} sequences (prompts x n) but the server decodes "
                                       f"at most {self.max_batch} at once and queues none (--max-queue 0), so "
                                       f"it could never start: send at most {self.max_batch}")

    def _queued_beyond_slots(self, n: int) -> int:
        """Requests (with one of n sequences appended) that would wait for a slot at the next step: the
        queue depth that max_queue bounds (a burst that fits the free slots is never refused)."""
        free, beyond = self.max_batch - len(self._running), 0
        for size in [len(w) for w in self._waiting] + [n]:
            if size > free:
                beyond += 1
            free -= size
        return beyond

    def call(self, fn: Callable[[], object], first: bool = False) -> concurrent.futures.Future:
        """Run fn() on the driver between steps (other model work, e.g. scoring; one call a step, in order, or
        before the others with first); its Future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise SchedulerClosedError("the scheduler is closed")
            if first:
                self._calls.appendleft((fn, fut))
            else:
                self._calls.append((fn, fut))
            self._wake.notify()
        return fut

    # -- state --------------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Sequences in slots (batch occupancy)."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests in the queue (not all started)."""
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        return not (self._running or self._waiting or self._calls)

    @property
    def draining(self) -> bool:
        return self._draining

    # -- driving ------------------------------------------------------------------------------------

    def start(self) -> "Scheduler":
        """Drive the model from one background thread until close()."""
        if self._thread is None:
            t = threading.Thread(target=self._loop, name="gpt2asm-scheduler", daemon=True)
            try:
                start_thread(t)
            except RuntimeError as e:               # a thread or address-space limit
                raise ResourceError(f"cannot start the scheduler's thread: {e}") from None
            self._thread = t
        return self

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not (self._running or self._waiting or self._calls):
                    self._wake.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as e:                    # noqa: BLE001 -- a bug: fail what runs, keep serving
                with self._lock:
                    for q in self._running:
                        self._finish(q, "error", e)
                    self._reap()

    def run(self) -> None:
        """Drive the model from this thread until nothing is queued or running (no start() needed)."""
        while not self.idle:
            self.step()

    def step(self) -> None:
        """One driver iteration: cancellations, admissions, one call(), a prefill chunk, one batched decode
        step."""
        with self._lock:
            calls = []                                # one call an iteration (decoding goes on between them);
            while self._calls and not calls:          # those cancelled before they ran are dropped
                fn, fut = self._calls.popleft()
                if not fut.cancelled():
                    calls.append((fn, fut))
            for s in self._running:
                if s.req.cancelled and not s.finished:
                    self._finish(s, "cancelled")
            free = self.max_batch - len(self._running)
            while self._waiting:                      # first come, first served, a sequence a slot
                head = self._waiting[0]
                if head[0].req.cancelled:
                    for s in head:
                        self._finish(s, "cancelled")
                    self._waiting.popleft()
                    continue
                if free <= 0:
                    break
                take = head[:free]
                del head[:free]
                self._running.extend(take)
                free -= len(take)
                if not head:
                    self._waiting.popleft()
            self._reap()
        for fn, fut in calls:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:      # noqa: BLE001 -- handed to the caller
                    fut.set_exception(e)
        active = []
        for s in self._running:
            if s.finished:
                continue
            try:
                self._state_for(s)                    # a slot's cache (from the pool) from admission on
            except MemoryError as e:                  # this sequence fails alone; those running go on
                self._finish(s, "error", e)
                continue
            active.append(s)
        self._prefill_chunk([s for s in active if s.fed < len(s.ids)])
        self._decode([s for s in active if s.pending is not None and not s.finished])
        with self._lock:
            self._reap()

    def _state_for(self, s: _Seq):
        """s's slot's State: a free one (the one caching the longest prefix of s's prompt, which s
        then does not prefill: state.reuse), else the model's (idle ones first).  A sample admitted
        while its prompt's first sample prefills takes a copy of that prefill instead."""
        if s.state is None:
            lead = s.leader
            waits = lead is not None and not lead.finished and lead.fed < len(lead.ids)
            ids = None if waits else s.ids
            if self._free:
                st = self._free.pop(best_reuse(self._free, ids))
                reuse(st, ids)
            else:
                st = self.model.lease_state(ids)
                self._n_states += 1
            s.state, s.fed = st, st.n
            self.reused += st.n
            if s.leader is None:
                s.cached = st.n
        return s.state

    def _prefill_chunk(self, seqs: list[_Seq]) -> None:
        budget = self.prefill_chunk
        for s in seqs:
            if budget <= 0:
                break
            if s.req.cancelled or s.finished or s.fed >= len(s.ids):    # (a twin adopted its prefill)
                continue
            lead = s.leader
            if lead is not None and not lead.finished and lead.state is not None and lead.fed < len(lead.ids):
                self._state_for(s)                    # the leader's prefill will be copied in
                continue
            try:
                st = self._state_for(s)
                if s.n == 0:                          # nothing to generate: done without model work
                    self._finish(s, "length")
                    continue
                c = min(budget, len(s.ids) - s.fed)
                logits, am = self.model.prefill(st, s.ids[s.fed:s.fed + c])
                s.fed += c
                budget -= c
                if s.fed == len(s.ids):
                    self._sample(s, logits, am)
                    for f in self._twins(s):          # the other samples of this prompt: its cache copied
                        self._adopt_prefill(f, st, logits, am)
            except Exception as e:                    # noqa: BLE001 -- this sequence ends, the rest go on
                self._finish(s, "error", e)
        self.steps += 1

    def _twins(self, s: _Seq) -> list[_Seq]:
        """Sequences of s's request with s's prompt, in slots, waiting for s's prefill."""
        return [f for f in s.twins if f.state is not None and f.fed == 0 and not f.finished and not f.req.cancelled]

    def _adopt_prefill(self, f: _Seq, src, logits: np.ndarray, argmax) -> None:
        """Give f the prompt's cache (the same bits as prefilling it: a copy) and sample its first token
        from the same logits (a sample of no new tokens ends there, as its own prefill would)."""
        if f.n == 0:
            self._finish(f, "length")
            return
        try:
            n, st = len(f.ids), f.state
            st.k[:, :, :n] = src.k[:, :, :n]
            st.v[:, :, :n] = src.v[:, :, :n]
            st.n, f.fed = n, n
            self._sample(f, logits, argmax)
        except Exception as e:                        # noqa: BLE001
            self._finish(f, "error", e)

    def _decode(self, seqs: list[_Seq]) -> None:
        if not seqs:
            return
        before = [s.state.n for s in seqs]
        try:
            logits, argmax = self.model.step_batch([s.state for s in seqs], [s.pending for s in seqs])
        except Exception:                             # noqa: BLE001 -- find the sequence at fault alone
            logits, argmax = [], []
            for s, n in zip(seqs, before):
                if s.state.n > n:                     # fed by a run before the failed one (BATCH_ROWS a run):
                    logits.append(s.state.logits_view)    # not again (its cache, and tokens, one step ahead)
                    argmax.append(UNKNOWN)
                    continue
                try:
                    lg, am = self.model.step_batch([s.state], [s.pending])
                    logits.append(lg[0])
                    argmax.append(am[0])
                except Exception as e:                # noqa: BLE001
                    self._finish(s, "error", e)
                    logits.append(None)
                    argmax.append(None)
        for s, lg, am in zip(seqs, logits, argmax):
            if lg is not None and not s.finished:
                try:
                    self._sample(s, lg, am)
                except Exception as e:                # noqa: BLE001
                    self._finish(s, "error", e)

    def _sample(self, s: _Seq, logits: np.ndarray, argmax) -> None:
        """Sample the next token of s from the logits after its last fed token (as GPT2._decode_loop)."""
        m = self.m
        fused = m.n_sample == m.config.vocab_size
        view = logits[:m.n_sample]
        tok = s.sampler(view, s.history, argmax) if fused else s.sampler(view, s.history)
        s.history.append(tok)
        s.generated += 1
        self.tokens += 1
        lp = top = None
        if s.logprobs is not None:
            lp, top = token_logprobs(logits, tok, s.logprobs, m.n_sample)
        text = s.ts.push(m.tokenizer.token_bytes(tok))
        s.req._emit(Event(s.index, tok, text, time.monotonic(), lp, top))
        if s.ts.stopped:
            self._finish(s, "stop")
        elif s.generated >= s.n:
            self._finish(s, "length")
        else:
            s.pending = tok

    def _finish(self, s: _Seq, reason: str, err: BaseException | None = None) -> None:
        if s.finished:
            return
        s.finished, s.pending = True, None
        text = s.ts.finish() if reason in ("length", "cancelled", "shutdown") else ""
        msg = None
        if isinstance(err, MemoryError):              # a KV cache, row buffers: the system's refusal, not a bug
            err = ResourceError(f"out of memory for this sequence ({err or 'MemoryError'}); retry when "
                                "fewer sequences run")
        if err is not None:
            msg = str(err) if isinstance(err, GPT2AsmError) else f"internal error ({type(err).__name__})"
        s.req.finished += 1
        s.req._emit(Event(s.index, None, text, time.monotonic(), finish_reason=reason, error=msg, exception=err,
                          cached=s.cached))
        if s.req.done:
            self._requests.discard(s.req)

    def _reap(self) -> None:
        """Finished sequences leave their slots; their States go back to the pool."""
        keep = []
        for s in self._running:
            if s.finished:
                if s.state is not None:
                    s.state.tokens = s.history[:s.state.n]     # position i holds history[i]
                    self._free.append(s.state)
                    s.state = None
            else:
                keep.append(s)
        self._running = keep

    # -- stopping -----------------------------------------------------------------------------------

    def drain(self) -> None:
        """Take no new requests (SchedulerClosedError); those queued or running go on."""
        with self._lock:
            self._draining = True

    def cancel_all(self, reason: str = "shutdown") -> None:
        """End every queued or running sequence now, with finish_reason `reason` (between steps)."""
        def end():
            with self._lock:
                for seqs in self._waiting:
                    for s in seqs:
                        self._finish(s, reason)
                self._waiting.clear()
                for s in self._running:
                    self._finish(s, reason)
                self._reap()
        if self._thread is not None and self._thread.is_alive() and threading.current_thread() is not self._thread:
            try:
                self.call(end, first=True).result()
                return
            except SchedulerClosedError:
                pass
        end()

    def release(self) -> None:
        """Forget every sequence and KV cache, at once: for a driver that stops stepping mid-way (an error
        raised to the caller).  A sequence and its prompt's other samples reference each other (leader,
        twins), so without this their caches would live until the garbage collector ran, and a MemoryError
        would make the next call fail too."""
        with self._lock:
            for seqs in (*self._waiting, self._running):
                for s in seqs:
                    s.state, s.leader, s.twins = None, None, []
            self._waiting.clear()
            self._running = []
            self._free.clear()
            self._requests.clear()

    def recycle(self) -> None:
        """Hand the States no sequence uses back to the model (Transformer.release_state), for its next
        caller: a driver that ran every sequence to its end (batch.run)."""
        with self._lock:
            free, self._free = self._free, []
        for st in free:
            self.model.release_state(st, st.tokens)

    def close(self, reason: str = "shutdown") -> None:
        """Cancel what is left (finish_reason `reason`), stop the driver thread."""
        self.drain()
        self.cancel_all(reason)
        with self._lock:
            self._closed = True
            calls = list(self._calls)
            self._calls.clear()
            self._wake.notify_all()
        for _, fut in calls:
            fut.cancel()
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join()


def token_logprobs(logits: np.ndarray, tok: int, k: int, n_ids: int | None = None) -> tuple[float, dict]:
    """log p(tok) under the logits (the model's whole vocabulary, as GPT2.logprobs), and the k most
    likely tokens' {id: log p} (most likely first) among ids < n_ids (default all): those the tokenizer
    can print, where a checkpoint pads its vocabulary beyond the tokenizer's (GPT2.n_sample)."""
    lsm = log_softmax(logits)
    top = {}
    cand = lsm[:lsm.size if n_ids is None else n_ids]
    if k > 0 and cand.size:
        idx = np.argpartition(-cand, min(k, cand.size) - 1)[:k]
        idx = idx[np.lexsort((idx, -cand[idx]))]
        top = {int(i): float(cand[i]) for i in idx}
    return float(lsm[tok]), top
