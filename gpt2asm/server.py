"""python -m gpt2asm serve — an OpenAI-compatible completions server with continuous batching.

    python -m gpt2asm serve --model gpt2 [--dtype f32|f16|q8_0|q4_0] [-j N] [--host 127.0.0.1] [--port 8000]
                            [--max-batch 32] [--max-queue 256] [--api-key KEY]

Built on Starlette (routing, JSON, Server-Sent Events through StreamingResponse) served by uvicorn; the
model is driven by one scheduler.Scheduler thread (continuous batching: each request's tokens are the bits
of GPT2.generate run alone).  Endpoints:

    POST /v1/completions   prompt (string, list of strings, token ids or lists of them), max_tokens (16),
                           temperature (1), top_p (1), top_k (0 = off; -1 too, not -1.0), n (1), stop, seed,
                           stream (SSE, ends with `data: [DONE]`), logprobs (0..20), echo, repetition_penalty;
                           usage.  Choice j = i * n + k is sample k of prompt i; with seed s it samples with
                           seed s + j (batch.py), so GPT2.generate(prompt_i, seed=s + j) reproduces it.
    GET  /v1/models        the one model served
    GET  /health           200 {"status": "ok"}, 503 while loading or shutting down
    POST /tokenize         {"prompt": str} -> {"tokens", "count", "max_model_len"} (MAX_TOKENIZE characters)
    POST /detokenize       {"tokens": [int]} -> {"prompt": str} (MAX_TOKENIZE ids)
    GET  /metrics          Prometheus text: requests, tokens, batch occupancy, queue depth, TTFT and
                           inter-token latency histograms

Errors are OpenAI's JSON ({"error": {"message", "type", "param", "code"}}): 400 bad argument, context
overflow or a request uvicorn's HTTP parser refuses (http_protocol), 401 bad API key (compared with hmac.compare_digest), 404 unknown model or route, 413 a body over MAX_BODY
or a /tokenize prompt over MAX_TOKENIZE, 429 queue full or tokenizer backlog full (Workers), 503 loading or
shutting down, 500 with no detail (never a traceback); a request that could never start (more sequences
than --max-batch with --max-queue 0) is a 400.  Tokenizing never runs on the event loop, and tokenizer
requests, long prompts and short ones each have threads of their own (MAX_TOKENIZE).  With a stop string,
logprobs and usage count the tokens whose text is at least partly in the text returned (Choice).  A client
that disconnects frees its slots at the next step.  SIGTERM / SIGINT: new requests get 503, those in flight
finish (until --drain-timeout, then they end with finish_reason "shutdown"), exit status 0; a second signal
ends the drain at once the same way (not uvicorn's force-quit).  Connections: the open-files
soft limit is raised to the hard one, a connection that sends nothing closes after the keep-alive timeout,
and out of descriptors the server pauses accepting with one log line (Listener, loop_exception_handler).
"""
from __future__ import annotations

import argparse
import asyncio
import codecs
import concurrent.futures
import contextlib
import errno
import hmac
import json
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
import weakref

from .args import integer, sampling as check_sampling
from .errors import (ContextOverflowError, GPT2AsmError, InvalidArgumentError, NonFiniteLogitsError,
                     SHOWN_LIMIT, say, shown)
from .validate import KV_DTYPES, is_int

log = logging.getLogger("gpt2asm.server")

MAX_BODY = 8 << 20                     # bytes of a request body
MAX_N = 128                            # samples per prompt
MAX_CHOICES = 1024                     # prompts x n per request
MAX_LOGPROBS = 20
MAX_SCORED = 65536                     # prompt tokens an echo + logprobs request returns, each choice its
                                       # prompt's (prompt tokens x n; its response: ~45 MB)
REQUEST_TIMEOUT = 30.0                 # seconds for a request to arrive whole from its first byte (--request-timeout)
# Request work that is CPU-heavy and holds the GIL (BPE in Python: ~2 s for 1 M characters of one unbroken
# word, 0.1 s of prose) runs on worker threads of its own kind, so no kind can take the threads another
# needs (Workers): /tokenize and /detokenize on one thread (more would only share the GIL) with at most
# TOKENIZER_BACKLOG requests in progress or waiting (429 past it); a completion's parsing on PARSE_THREADS
# threads, one whose prompts exceed LIGHT_PROMPT characters or ids on a thread of its own, so a small
# completion never waits behind big prompts.
MAX_TOKENIZE = 1 << 20                 # characters of a /tokenize prompt, ids of a /detokenize list (413 past it)
TOKENIZER_BACKLOG = 16                 # /tokenize + /detokenize requests in progress or waiting
PARSE_THREADS = 2
LIGHT_PROMPT = 1 << 16                 # prompt characters (or token ids) of a request parsed with the light ones
ACCEPTED_NOOPS = {"user", "stream_options", "suffix", "presence_penalty", "frequency_penalty", "best_of",
                  "logit_bias"}
FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed", "stream",
          "logprobs", "echo", "repetition_penalty"} | ACCEPTED_NOOPS


class APIError(Exception):
    """An HTTP error answered as OpenAI's JSON error object."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def error_body(status: int, message: str, type_: str, param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def http_protocol(request_timeout: float = REQUEST_TIMEOUT):
    """uvicorn's h11 protocol class, except that
    - a request it cannot parse (a bad chunked body, a Content-Length of -5, a header past h11's limit) gets
      the OpenAI JSON error of every other 400 rather than uvicorn's plain text;
    - a request must arrive whole (headers and body) within request_timeout seconds of its first byte: a
      client that sends part of one and stalls, or trickles it (slowloris), gets 408 (headers incomplete)
      or is disconnected (body incomplete: the endpoint sees the client gone), instead of holding its
      connection and descriptor for ever;
    - on shutdown a request still arriving is dropped at once (it has not started), so the drain waits
      only for requests the server is working on.
    "h11" (uvicorn's own) where that class or the methods overridden are not there."""
    try:
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol
    except ImportError:
        return "h11"
    if not callable(getattr(H11Protocol, "send_400_response", None)):
        return "h11"

    class JSONErrorH11Protocol(H11Protocol):
        request_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            # uvicorn arms its keep-alive timer only after a response: a connection that never sends a
            # request would hold its file descriptor for ever.  Arm it now; the first bytes cancel it.
            if self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)

        def _arriving(self) -> bool:
            """A request has begun to arrive and is not whole yet: part of its headers, or its body."""
            their = self.conn.their_state
            return their is h11.SEND_BODY or (their is h11.IDLE and bool(self.conn.trailing_data[0]))

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._arriving():
                if self.request_deadline is None:               # the request's first bytes: its clock starts
                    self.request_deadline = self.loop.call_later(request_timeout, self.request_too_slow)
            elif self.request_deadline is not None:
                self.request_deadline.cancel()                  # whole (or none pending)
                self.request_deadline = None

        def request_too_slow(self) -> None:
            self.request_deadline = None
            if self.transport.is_closing() or not self._arriving():
                return
            if self.conn.their_state is h11.IDLE:               # still in its headers: say so, then close
                self.send_error_response(408, f"the request did not arrive within {request_timeout:g} s")
            else:                                               # in its body: the endpoint sees a disconnect
                self._drop_cycle()

        def _drop_cycle(self) -> None:
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            self.transport.close()

        def connection_lost(self, exc) -> None:
            if self.request_deadline is not None:
                self.request_deadline.cancel()
                self.request_deadline = None
            super().connection_lost(exc)

        def shutdown(self) -> None:
            if self.conn.their_state is h11.SEND_BODY:          # a body still arriving: nothing started yet
                self._drop_cycle()
            else:
                super().shutdown()

        def send_error_response(self, status: int, message: str) -> None:
            body = json.dumps(error_body(status, message, "invalid_request_error")).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                       (b"connection", b"close")]
            reason = {400: b"Bad Request", 408: b"Request Timeout"}[status]
            try:
                for event in (h11.Response(status_code=status, headers=headers, reason=reason),
                              h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:                     # (our side cannot answer now: just close)
                pass
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            self.send_error_response(400, f"malformed HTTP request: {msg}")
    for name in ("shutdown", "connection_lost", "data_received", "timeout_keep_alive_handler"):
        if not callable(getattr(H11Protocol, name, None)):
            return "h11"
    return JSONErrorH11Protocol


def uvicorn_config(app, request_timeout: float = REQUEST_TIMEOUT, **kw):
    """The uvicorn.Config gpt2asm serves with (main, and the tests' in-process servers)."""
    import uvicorn
    return uvicorn.Config(absolute_form(app), http=http_protocol(request_timeout), **kw)


def _origin_form(target):
    """The path of an absolute-form request target (str or bytes: "http://host:80/a?b" -> "/a?b", "http://host"
    -> "/"), or None when target is not one."""
    sep = "://" if isinstance(target, str) else b"://"
    scheme, found, rest = target.partition(sep)
    if not found or scheme.lower() not in (("http", "https") if isinstance(target, str) else (b"http", b"https")):
        return None
    cut = rest.find(sep[-1:])                   # the first "/" after the authority
    return rest[cut:] if cut >= 0 else sep[-1:]


def absolute_form(app):
    """app, answering a request whose target is in absolute form (`GET http://host/health HTTP/1.1`, which
    RFC 9112 says a server must accept) as the same request for its path."""
    async def wrapped(scope, receive, send):
        if scope.get("type") == "http":
            path = _origin_form(scope.get("path", ""))
            if path is not None:
                scope = dict(scope, path=path, raw_path=_origin_form(scope.get("raw_path") or b"") or path.encode())
        await app(scope, receive, send)
    return wrapped


OUT_OF_RESOURCE = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Listener(socket.socket):
    """A listening socket whose accept() raises one out-of-resource error (no file descriptor left) per
    accept round, then "would block".  asyncio's accept loop (CPython 3.11) keeps calling accept() after
    EMFILE and schedules a retry for every failure: up to `backlog` (2048) timers and logged tracebacks
    a second, a storm that grows while the descriptors stay taken.  One error stops the round; asyncio
    pauses the socket and tries again a second later."""

    _refused = False

    def accept(self):
        if self._refused:
            self._refused = False
            raise BlockingIOError(errno.EAGAIN, "paused: out of file descriptors")
        try:
            return super().accept()
        except OSError as e:
            if e.errno in OUT_OF_RESOURCE:
                self._refused = True
            raise


def listener(sock: socket.socket) -> Listener:
    """sock (bound, maybe listening) as a Listener; sock itself is detached."""
    return sock if isinstance(sock, Listener) else Listener(fileno=sock.detach())


def open_files_limit() -> int | None:
    try:
        import resource
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None


def raise_open_files_limit() -> None:
    """The soft limit of open files up to the hard one (a server holds one per connection; many systems
    start programs at 1024 below a far higher hard limit).  Left alone where it cannot be raised."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return
    for want in (hard, 1 << 20, 10240):
        if want == resource.RLIM_INFINITY or (soft != resource.RLIM_INFINITY and want <= soft):
            continue
        if hard != resource.RLIM_INFINITY and want > hard:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return
        except (OSError, ValueError):
            continue


def loop_exception_handler(loop, ctx: dict) -> None:
    """asyncio's handler, except that running out of file descriptors while accepting is one line every
    10 s (not a traceback a second): what happened, the limit, and what to do."""
    exc = ctx.get("exception")
    if isinstance(exc, OSError) and exc.errno in OUT_OF_RESOURCE and "accept" in str(ctx.get("message", "")):
        now = time.monotonic()
        last = getattr(loop, "_gpt2asm_emfile_logged", None)
        if last is None or now - last >= 10:
            loop._gpt2asm_emfile_logged = now
            log.warning("gpt2asm: cannot accept a connection: %s (open files limit %s); new connections wait "
                        "until some close (idle ones close after the keep-alive timeout); raise `ulimit -n` "
                        "for more", exc.strerror or exc, open_files_limit())
        return
    loop.default_exception_handler(ctx)


def make_server(config, state: "App | None" = None):
    """A uvicorn.Server for config that listens through Listener sockets, logs running out of file
    descriptors as one line (loop_exception_handler), and on SIGTERM / SIGINT first tells state to stop
    taking requests."""
    import uvicorn

    class Server(uvicorn.Server):
        async def serve(self, sockets=None):
            asyncio.get_running_loop().set_exception_handler(loop_exception_handler)
            await super().serve(sockets=None if sockets is None else [listener(s) for s in sockets])

        def handle_exit(self, sig, frame):
            if self.should_exit:
                # A later signal during the drain.  uvicorn's own answer to a second SIGINT is force_exit:
                # open streams cut without a finish_reason and a CancelledError traceback per task.  Here
                # it ends the drain early instead: the streams finish with 'shutdown' and [DONE], exit 0.
                if state is not None:
                    state.end_now()
                return
            if state is not None:
                state.begin_shutdown()
            super().handle_exit(sig, frame)

    return Server(config)


class _HugeInt(int):
    """A JSON integer of 4000 digits or more (Python refuses to parse past 4300): a value of its sign beyond
    every field's range, shown by its size, so the field's check refuses it by name ("max_tokens must be in
    1..1024, got <an integer of 5000 digits>"; it was "must be an integer, got float inf")."""
    digits = 0

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _json_int(s: str):
    if len(s) < 4000:
        return int(s)
    v = _HugeInt(-(1 << 16384) if s.startswith("-") else 1 << 16384)
    v.digits = len(s.lstrip("-"))
    return v


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# ----------------------------------------------------------------------------------------------------
# argument parsing (the engine's validators: one rule per argument for the CLI, the API and the server)

def _arg(body: dict, name: str, default, check):
    v = body.get(name, default)
    if v is None:
        v = default
    try:
        return check(v)
    except GPT2AsmError as e:
        raise APIError(400, str(e), param=name) from None


def _bool(name):
    def check(v):
        if not isinstance(v, bool):
            raise InvalidArgumentError(f"{name} must be true or false, got {shown(v)}")
        return v
    return check


def encode_prompt(m, p) -> list[int]:
    """One prompt (a string or token ids) as checked token ids.  A prompt longer than the context is refused
    as soon as that is known -- a string of more than n_ctx tokens' worth of characters untokenized -- so a
    request's parsing does at most about one context's worth of tokenizing it cannot use."""
    n_ctx, most = m.n_ctx, max_token_chars(m.tokenizer)
    if isinstance(p, str) and len(p) > n_ctx * most:
        _overflow(m, f"a prompt of {len(p)} characters is at least {-(-len(p) // most)} tokens")
    if not isinstance(p, str) and len(p) > n_ctx:
        _overflow(m, f"a prompt has {len(p)} tokens")
    try:
        ids = m.encode(p) if isinstance(p, str) else m.check_ids(p)
    except GPT2AsmError as e:
        raise APIError(400, str(e), param="prompt") from None
    if len(ids) > n_ctx:
        _overflow(m, f"a prompt has {len(ids)} tokens")
    return ids


def _overflow(m, what: str):
    raise APIError(400, f"This model's maximum context length is {m.n_ctx} tokens; {what}", param="prompt",
                   code="context_length_exceeded")


def check_model(body, model_id: str) -> None:
    """A body naming another model than the one served: 404 model_not_found (every endpoint that takes one)."""
    if isinstance(body, dict) and body.get("model") not in (None, model_id):
        raise APIError(404, f"the model {shown(body['model'])} does not exist; this server serves {model_id!r}",
                       param="model", code="model_not_found")


def parse_completion(m, body: dict, model_id: str) -> dict:
    """The request body checked: prompts as token id lists, every sample's SeqSpec, flags."""
    from .batch import specs
    from .engine import _check_stop
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise APIError(400, f"unsupported parameter(s): {shown(', '.join(unknown))}",
                       param=unknown[0][:SHOWN_LIMIT])
    check_model(body, model_id)
    for name, neutral in (("presence_penalty", 0), ("frequency_penalty", 0), ("suffix", "")):
        if body.get(name) not in (None, neutral):
            raise APIError(400, f"{name} is not supported (only {neutral!r} or null)", param=name)
    if body.get("logit_bias") not in (None, {}):
        raise APIError(400, "logit_bias is not supported", param="logit_bias")
    prompt = body.get("prompt", "")
    texts: list[str | None]
    if isinstance(prompt, list) and not prompt:           # no prompts, or no tokens? (OpenAI refuses it too)
        raise APIError(400, "prompt is an empty list: give a string (\"\" for none), token ids, or a list of "
                            "prompts", param="prompt")
    if isinstance(prompt, str):
        id_lists, texts = [prompt], [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        id_lists, texts = list(prompt), list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        id_lists, texts = prompt, [None] * len(prompt)
    elif isinstance(prompt, list) and all(not isinstance(p, (list, str)) for p in prompt):
        id_lists, texts = [prompt], [None]
    else:
        raise APIError(400, "prompt must be a string, a list of strings, a list of token ids or a list of "
                            "token id lists", param="prompt")
    max_tokens = _arg(body, "max_tokens", 16, lambda v: integer("max_tokens", v, 0, 1 << 30))
    n = _arg(body, "n", 1, lambda v: integer("n", v, 1, MAX_N))
    if body.get("best_of") not in (None, n):
        raise APIError(400, "best_of must equal n (or be omitted)", param="best_of")
    if len(id_lists) * n > MAX_CHOICES:                   # (before tokenizing any of them)
        raise APIError(400, f"{len(id_lists)} prompts x n={n} is more than {MAX_CHOICES} choices", param="n")
    id_lists = [encode_prompt(m, p) for p in id_lists]
    top_k = body.get("top_k")
    sampling = {}
    for name, default in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0), ("repetition_penalty", 1.0),
                          ("seed", None)):
        v = body.get(name, default)
        if v is None:
            v = default
        if name == "top_k" and is_int(top_k) and top_k == -1:
            v = 0                                                  # vLLM's "off" (an integer: -1.0 is refused)
        try:
            check_sampling(**{name: v})
        except GPT2AsmError as e:
            raise APIError(400, str(e), param=name) from None
        sampling[name] = v
    stop = _arg(body, "stop", None, _check_stop)
    if len(stop) > 16:
        raise APIError(400, "at most 16 stop strings", param="stop")
    stream = _arg(body, "stream", False, _bool("stream"))
    echo = _arg(body, "echo", False, _bool("echo"))
    logprobs = _arg(body, "logprobs", None, lambda v: v if v is None else integer("logprobs", v, 0, MAX_LOGPROBS))
    so = body.get("stream_options")
    if so is not None and not (isinstance(so, dict) and set(so) <= {"include_usage"}
                               and isinstance(so.get("include_usage", False), bool)):
        raise APIError(400, "stream_options must be {\"include_usage\": bool}", param="stream_options")
    try:
        seqs = specs(id_lists, n, max_tokens, stop, sampling, logprobs)
        from .scheduler import Scheduler
        for s in seqs[::n]:                                       # one check per prompt (the n share it)
            Scheduler.resolve_spec(m, s)
    except ContextOverflowError as e:
        raise APIError(400, f"This model's maximum context length is {m.n_ctx} tokens; the prompt plus "
                            f"max_tokens need {e.needed}", param="max_tokens", code="context_length_exceeded") from None
    except GPT2AsmError as e:
        raise APIError(400, str(e)) from None
    prompt_ids = [ids or [m.tokenizer.eot_id] for ids in id_lists]
    if echo and logprobs is not None and sum(map(len, prompt_ids)) * n > MAX_SCORED:
        raise APIError(400, f"echo with logprobs returns at most {MAX_SCORED} prompt tokens a request (each choice "
                            f"its prompt's), got {sum(map(len, prompt_ids))} x n={n}: split the prompts over several "
                            "requests", param="prompt")
    return dict(specs=seqs, n=n, prompt_ids=prompt_ids, texts=texts, stream=stream, echo=echo,
                logprobs=logprobs, include_usage=bool(so and so.get("include_usage")))


# ----------------------------------------------------------------------------------------------------

def token_name(b: bytes) -> str:
    """A token as `logprobs` names it: its text, or for bytes that are not whole UTF-8 (a piece of a
    multi-byte character) OpenAI's spelling "bytes:\\xe6\\x97": distinct tokens keep distinct names, so
    top_logprobs never merges two alternatives under one U+FFFD."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{c:02x}" for c in b)


def prompt_logprobs(m, ids: list[int], k: int) -> tuple[list, list]:
    """Echo's logprobs of the prompt tokens (None for the first): the numbers GPT2.logprobs gives, and the
    k most likely at each position (one full-prefix forward; the prompt fits the context)."""
    import numpy as np
    from .sampler import non_finite_error
    from .scheduler import token_logprobs
    lps, tops = [None], [None]
    if len(ids) > 1:
        logits = m.logits(ids)
        if not np.isfinite(logits[:-1]).all():     # no logprob to give (and JSON has no NaN): as sampling
            raise non_finite_error(logits[:-1], "score", " over the prompt")
        for t in range(1, len(ids)):
            lp, top = token_logprobs(logits[t - 1], ids[t], k, m.n_sample)
            lps.append(lp)
            tops.append(top)
    return lps, tops


class Workers:
    """Threads of their own for one kind of CPU-heavy request work (tokenizing), off the event loop: a
    kind that floods its threads or its queue delays only itself.  backlog: jobs in progress or waiting
    beyond which run() refuses a new one (429) instead of queueing it behind seconds of work."""

    def __init__(self, name: str, threads: int, backlog: int | None = None, what: str = ""):
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=name)
        self.backlog, self.what = backlog, what or name
        self.pending = 0                   # jobs submitted and not finished (counted until the thread is done)
        self._lock = threading.Lock()

    def _done(self, _fut) -> None:
        with self._lock:
            self.pending -= 1

    async def run(self, fn, *args):
        with self._lock:
            if self.backlog is not None and self.pending >= self.backlog:
                raise APIError(429, f"the {self.what} is busy ({self.pending} requests in progress or "
                                    f"waiting); retry later", "rate_limit_exceeded", code="server_busy")
            self.pending += 1
        try:
            fut = self.pool.submit(fn, *args)
        except RuntimeError:               # shut down (the server is stopping)
            self._done(None)
            raise APIError(503, "the server is shutting down", "service_unavailable",
                           code="shutting_down") from None
        fut.add_done_callback(self._done)
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        """Drop the jobs still waiting; one in progress finishes on its thread."""
        self.pool.shutdown(wait=False, cancel_futures=True)


_MAX_TOKEN_CHARS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def max_token_chars(tokenizer) -> int:
    """The most bytes one token of the tokenizer holds (GPT-2: 128): a text of more than n_ctx times that many
    characters (each at least one byte) is more than n_ctx tokens, known without tokenizing it."""
    n = _MAX_TOKEN_CHARS.get(tokenizer)
    if n is None:
        n = _MAX_TOKEN_CHARS[tokenizer] = max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))
    return n


def prompt_size(body) -> int:
    """Characters plus token ids of a completion body's prompts (whatever their shape): how much tokenizing
    and checking parsing it means, counted without doing it (a list's first MAX_CHOICES + 1 items: more is
    refused before any is tokenized)."""
    prompt = body.get("prompt") if isinstance(body, dict) else None
    if isinstance(prompt, str):
        return len(prompt)
    if not isinstance(prompt, list):
        return 0
    if prompt and not isinstance(prompt[0], (str, list)):
        return len(prompt)                                  # one prompt of token ids
    return sum(len(p) if isinstance(p, (str, list)) else 1 for p in prompt[:MAX_CHOICES + 1])


class Metrics:
    """Prometheus metrics of one server (their own registry)."""

    def __init__(self, sched_ref):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        r = self.registry = CollectorRegistry()
        self.requests = Counter("gpt2asm_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("gpt2asm_prompt_tokens", "prompt tokens of accepted completions", registry=r)
        self.cached_tokens = Counter("gpt2asm_prompt_tokens_cached", "prompt tokens a slot's KV cache held "
                                     "already (not prefilled again)", registry=r)
        self.generated = Counter("gpt2asm_generation_tokens", "tokens generated", registry=r)
        self.finished = Counter("gpt2asm_sequences_finished", "sequences finished", ["finish_reason"], registry=r)
        occ = Gauge("gpt2asm_batch_occupancy", "sequences in the batch (KV slots in use)", registry=r)
        occ.set_function(lambda: sched_ref().running if sched_ref() else 0)
        slots = Gauge("gpt2asm_batch_slots", "KV slots (--max-batch)", registry=r)
        slots.set_function(lambda: sched_ref().max_batch if sched_ref() else 0)
        q = Gauge("gpt2asm_queue_depth", "requests waiting for a slot", registry=r)
        q.set_function(lambda: sched_ref().waiting if sched_ref() else 0)
        self.ttft = Histogram("gpt2asm_time_to_first_token_seconds", "request arrival to its first token",
                              buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60), registry=r)
        self.itl = Histogram("gpt2asm_inter_token_latency_seconds", "time between two tokens of a sequence",
                             buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5), registry=r)

    def text(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.registry)


AS_RESERVE = 256 << 20                   # address space kept for all but the KV caches (row buffers, threads)


def available_memory() -> int | None:
    """Bytes of memory the system can still give (Linux: MemAvailable, resident.mem_available; elsewhere the
    physical total), or None -- at most what the address-space limit (RLIMIT_AS) leaves this process,
    less AS_RESERVE: a cache the limit refuses fails its sequence, however much memory the machine has."""
    from .resident import mem_available
    have = mem_available()
    if have is None:
        try:
            have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            have = None
    left = address_space_left()
    if left is not None:
        have = max(0, left - AS_RESERVE) if have is None else min(have, max(0, left - AS_RESERVE))
    return have


def address_space_left() -> int | None:
    """Bytes the soft RLIMIT_AS still lets this process map (the limit less its VmSize), or None: no limit,
    or no way to tell (no resource module, no /proc)."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(0, soft - int(line.split()[1]) * 1024)
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return None


def kv_batch_limit(m, max_batch: int) -> int:
    """The sequences whose KV caches (each of the whole context, as State holds them) fit in the memory the
    system has left after loading the model, at most max_batch (with a warning when fewer): the server
    decodes at most that many at once (the rest wait in the queue) rather than run out of memory under
    load.  InvalidArgumentError if not even one fits."""
    cfg = m.model.cfg
    per = 2 * cfg.n_layer * cfg.n_head * cfg.n_ctx * cfg.head_dim * KV_DTYPES[m.kv].itemsize
    resident = getattr(m.model, "resident", None)
    if resident is not None and address_space_left() is not None:
        resident.wait(60)               # its copy of the weights counted before the caches, not after
    have = available_memory()
    if have is None or max_batch * per <= have:
        return max_batch
    if have < per:
        raise InvalidArgumentError(f"one sequence's KV cache needs {per / 2**20:.0f} MiB (--kv {m.kv}); this "
                                   f"process can get {have / 2**20:.0f} MiB (the memory available, within its "
                                   "address-space limit)")
    fit = int(have // per)
    log.warning("gpt2asm: --max-batch %d: the KV caches of only %d sequences fit in the memory left (%.1f GiB); "
                "decoding at most %d at once%s", max_batch, fit, have / 2**30, fit,
                " (--kv f16 halves them)" if m.kv == "f32" else "")
    return fit


class App:
    """The server's state: the model (loaded in the background), the scheduler, flags, metrics."""

    def __init__(self, loader, model_id: str, api_key: str | None = None, max_batch: int = 32,
                 max_queue: int = 256, prefill_chunk: int = 64, drain_timeout: float = 30.0):
        self.loader, self.model_id, self.api_key = loader, model_id, api_key
        self.max_batch, self.max_queue, self.prefill_chunk = max_batch, max_queue, prefill_chunk
        self.drain_timeout = drain_timeout
        self.m = None
        self.sched = None
        self.load_error: BaseException | None = None
        self.loaded = threading.Event()
        self.shutting_down = False
        self.created = int(time.time())
        self.metrics = Metrics(lambda: self.sched)
        self.on_load_error = None
        self._closed = threading.Event()
        self._ending = False
        # CPU-heavy request work off the event loop, each kind on threads of its own (see MAX_TOKENIZE)
        self.tokenizer_workers = Workers("gpt2asm-tokenize", 1, TOKENIZER_BACKLOG, "tokenizer")
        self.parse_workers = Workers("gpt2asm-parse", PARSE_THREADS)
        self.long_parse_workers = Workers("gpt2asm-parse-long", 1)

    # -- life ---------------------------------------------------------------------------------------

    def load(self) -> None:
        from .scheduler import Scheduler
        try:
            m = self.loader()
            self.max_batch = kv_batch_limit(m, self.max_batch)
            self.sched = Scheduler(m, self.max_batch, self.max_queue, self.prefill_chunk).start()
            self.m = m
            log.info("gpt2asm: serving %s (%s, %s, -j %d)", self.model_id, m.isa, m.dtype, m.threads)
        except BaseException as e:      # noqa: BLE001 -- reported, the server exits
            self.load_error = e
            log.debug("gpt2asm: cannot load the model: %s", e)
            if self.on_load_error:
                self.on_load_error()
        finally:
            self.loaded.set()

    def begin_shutdown(self) -> None:
        """New requests get 503; in-flight ones finish, or end with 'shutdown' after drain_timeout."""
        if self.shutting_down:
            return
        self.shutting_down = True
        if self.sched is not None:
            self.sched.drain()

            def cancel_late():
                if not self._closed.wait(self.drain_timeout):
                    self._end_all()
            threading.Thread(target=cancel_late, name="gpt2asm-drain", daemon=True).start()

    def _end_all(self) -> None:
        """Every queued or running sequence ends with 'shutdown' (on a thread of its own: it waits for the
        driver's step)."""
        try:
            self.sched.cancel_all("shutdown")
        except concurrent.futures.CancelledError:     # close() came first and ended them itself
            pass

    def end_now(self) -> None:
        """A second SIGTERM / SIGINT: the drain ends at once -- what is still generating finishes with
        'shutdown' (its stream with [DONE]), as at the drain timeout.  Never blocks (a signal handler on the
        event loop calls it)."""
        self.begin_shutdown()
        if self._ending or self.sched is None:
            return
        self._ending = True
        threading.Thread(target=self._end_all, name="gpt2asm-end", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        for w in (self.tokenizer_workers, self.parse_workers, self.long_parse_workers):
            w.close()
        if self.sched is not None:
            self.sched.close("shutdown")
        if self.m is not None:
            self.m.close()

    # -- checks -------------------------------------------------------------------------------------

    def ready(self) -> None:
        if self.shutting_down:
            raise APIError(503, "the server is shutting down", "service_unavailable", code="shutting_down")
        if self.m is None:
            raise APIError(503, "the model is loading" if self.load_error is None else "the model failed to load",
                           "service_unavailable", code="loading")

    def authorize(self, request) -> None:
        if self.api_key is None:
            return
        h = request.headers.get("authorization", "")
        given = h[7:] if h[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.api_key.encode()):
            raise APIError(401, "invalid or missing API key (Authorization: Bearer KEY)", "invalid_request_error",
                           code="invalid_api_key")


# ----------------------------------------------------------------------------------------------------
# the ASGI application

def create_app(state: App):
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    class JSON(JSONResponse):
        def render(self, content) -> bytes:
            try:
                return super().render(content)                  # UTF-8, as OpenAI's API answers
            except UnicodeEncodeError:                          # a lone surrogate from the request (a field
                return json.dumps(content, ensure_ascii=True, allow_nan=False,    # name in `param`): escaped
                                  separators=(",", ":")).encode("ascii")

    def error(e: APIError, endpoint: str) -> JSONResponse:
        state.metrics.requests.labels(endpoint, str(e.status)).inc()
        return JSON(error_body(e.status, e.message, e.type, e.param, e.code), status_code=e.status)

    def ok(body, endpoint: str, status: int = 200) -> JSONResponse:
        state.metrics.requests.labels(endpoint, str(status)).inc()
        return JSON(body, status_code=status)

    async def read_json(request: Request):
        n = request.headers.get("content-length")
        if n is not None and (not n.isdigit() or len(n) > 18 or int(n) > MAX_BODY):
            raise APIError(413, f"the request body is larger than {MAX_BODY} bytes")
        raw, size = bytearray(), 0                # (bytes += chunk would copy the body once per chunk)
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:                   # (chunked: no length said so first) drop the rest as it comes,
                if size > 8 * MAX_BODY:           # so the client reads the 413 instead of a reset; it has
                    break                         # the request deadline to finish sending
                raw = bytearray()
                continue
            raw += chunk
        if size > MAX_BODY:
            raise APIError(413, f"the request body is larger than {MAX_BODY} bytes")
        try:
            return json.loads(raw, parse_int=_json_int)
        except (ValueError, RecursionError):
            raise APIError(400, "the request body is not valid JSON") from None

    def ok_rendered(body: bytes, endpoint: str) -> Response:
        """A JSON answer rendered by the worker that computed it (a million token ids take 0.1 s to render:
        not on the event loop)."""
        state.metrics.requests.labels(endpoint, "200").inc()
        return Response(body, media_type="application/json")

    def endpoint(name: str, auth: bool = True, needs_model: bool = True):
        def wrap(fn):
            async def handler(request: Request):
                try:
                    if auth:
                        state.authorize(request)
                    if needs_model:
                        state.ready()
                    return await fn(request)
                except APIError as e:
                    return error(e, name)
                except ClientDisconnect:
                    return Response(status_code=499)
                except GPT2AsmError as e:
                    return error(APIError(400, str(e)), name)
            return handler
        return wrap

    @endpoint("health", auth=False, needs_model=False)
    async def health(request):
        if state.shutting_down:
            return ok({"status": "shutting_down"}, "health", 503)
        if state.m is None:
            return ok({"status": "loading" if state.load_error is None else "failed"}, "health", 503)
        return ok({"status": "ok"}, "health")

    @endpoint("models", needs_model=False)
    async def models(request):
        return ok({"object": "list", "data": [{"id": state.model_id, "object": "model", "created": state.created,
                                              "owned_by": "gpt2asm"}]}, "models")

    @endpoint("metrics", needs_model=False)
    async def metrics(request):
        state.metrics.requests.labels("metrics", "200").inc()
        return Response(state.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def render(content) -> bytes:
        return JSON(content).body

    @endpoint("tokenize")
    async def tokenize(request):
        body = await read_json(request)
        check_model(body, state.model_id)
        p = body.get("prompt", body.get("text")) if isinstance(body, dict) else None
        if not isinstance(p, str):
            raise APIError(400, "tokenize takes {\"prompt\": string}", param="prompt")
        if len(p) > MAX_TOKENIZE:
            raise APIError(413, f"tokenize takes a prompt of at most {MAX_TOKENIZE} characters, got {len(p)}",
                           param="prompt", code="prompt_too_long")
        m = state.m

        def work() -> bytes:
            ids = m.encode(p)
            return render({"tokens": ids, "count": len(ids), "max_model_len": m.n_ctx})
        try:
            return ok_rendered(await state.tokenizer_workers.run(work), "tokenize")
        except GPT2AsmError as e:
            raise APIError(400, str(e), param="prompt") from None

    @endpoint("detokenize")
    async def detokenize(request):
        body = await read_json(request)
        check_model(body, state.model_id)
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            raise APIError(400, "detokenize takes {\"tokens\": [token ids]}", param="tokens")
        if len(ids) > MAX_TOKENIZE:
            raise APIError(413, f"detokenize takes at most {MAX_TOKENIZE} token ids, got {len(ids)}",
                           param="tokens", code="prompt_too_long")
        m = state.m
        try:
            return ok_rendered(await state.tokenizer_workers.run(lambda: render({"prompt": m.decode(ids)})),
                               "detokenize")
        except GPT2AsmError as e:
            raise APIError(400, str(e), param="tokens") from None

    @endpoint("completions")
    async def completions(request):
        from .scheduler import QueueFullError, RequestTooLargeError, SchedulerClosedError
        body = await read_json(request)
        parse = state.parse_workers if prompt_size(body) <= LIGHT_PROMPT else state.long_parse_workers
        p = await parse.run(parse_completion, state.m, body, state.model_id)
        m, sched = state.m, state.sched
        try:
            sched.check_admissible(len(p["specs"]))              # (before any scoring work for it)
        except RequestTooLargeError as e:
            raise APIError(400, str(e), param="n", code="too_many_sequences") from None
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        prompt_lp = None
        if p["echo"] and p["logprobs"] is not None:              # model work: on the driver thread
            k = p["logprobs"]
            futs = [sched.call(lambda ids=ids: prompt_logprobs(m, ids, k)) for ids in p["prompt_ids"]]
            try:
                waits = [asyncio.wrap_future(f) for f in futs]
                while not all(w.done() for w in waits):         # the client still there? (4 times a second)
                    await asyncio.wait(waits, timeout=0.25, return_when=asyncio.ALL_COMPLETED)
                    if not all(w.done() for w in waits) and await request.is_disconnected():
                        return Response(status_code=499)         # the finally cancels the rest
                prompt_lp = [w.result() for w in waits]
            except NonFiniteLogitsError as e:                    # the model's fault, not the request's
                raise APIError(500, f"scoring the prompt failed: {e}", "server_error",
                               code="generation_failed") from None
            finally:
                for f in futs:
                    f.cancel()                                   # a no-op for those run or running
        last: dict = {}
        t_submit = time.monotonic()
        mt = state.metrics

        def on_event(ev):                                         # on the driver thread: must not block
            if ev.token is not None:
                mt.generated.inc()
                prev = last.get(ev.index)
                if prev is None:
                    mt.ttft.observe(ev.t - t_submit)
                else:
                    mt.itl.observe(ev.t - prev)
                last[ev.index] = ev.t
            else:
                mt.finished.labels(ev.finish_reason).inc()
                mt.cached_tokens.inc(ev.cached)
            try:
                loop.call_soon_threadsafe(q.put_nowait, ev)
            except RuntimeError:                                 # the event loop is gone (shutdown)
                pass
        try:
            req = sched.submit(p["specs"], callback=on_event)
        except QueueFullError as e:
            raise APIError(429, str(e), "rate_limit_exceeded", code="queue_full") from None
        except SchedulerClosedError as e:
            raise APIError(503, str(e), "service_unavailable", code="shutting_down") from None
        mt.prompt_tokens.inc(sum(map(len, p["prompt_ids"])))
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        choices = [Choice(m, i, p, prompt_lp) for i in range(len(p["specs"]))]
        usage = lambda: {"prompt_tokens": sum(map(len, p["prompt_ids"])),    # noqa: E731
                         "completion_tokens": sum(c.n_tokens for c in choices),
                         "total_tokens": sum(map(len, p["prompt_ids"])) + sum(c.n_tokens for c in choices),
                         "prompt_tokens_details": {"cached_tokens": sum(c.cached for c in choices)}}

        if not p["stream"]:
            try:
                done, check = 0, time.monotonic() + 0.25
                while done < len(choices):
                    try:
                        ev = await asyncio.wait_for(q.get(), timeout=0.25)
                    except asyncio.TimeoutError:
                        ev = None
                    if time.monotonic() >= check:             # the client still there? (4 times a second)
                        check = time.monotonic() + 0.25
                        if await request.is_disconnected():
                            req.cancel()
                            return Response(status_code=499)
                    if ev is not None:
                        choices[ev.index].add(ev)
                        done += ev.finish_reason is not None
            finally:
                req.cancel()                                      # a no-op once everything finished
            errs = [c.error for c in choices if c.error]
            if errs:
                raise APIError(500, f"generation failed: {errs[0]}", "server_error", code="generation_failed")
            return ok({"id": cid, "object": "text_completion", "created": created, "model": state.model_id,
                       "choices": [c.final() for c in choices], "usage": usage()}, "completions")

        def chunk(cs: list) -> str:
            return "data: " + json.dumps({"id": cid, "object": "text_completion", "created": created,
                                          "model": state.model_id, "choices": cs}) + "\n\n"

        async def events():
            try:
                if p["echo"]:
                    yield chunk([c.echo_piece() for c in choices])
                done = 0
                while done < len(choices):
                    ev = await q.get()
                    c = choices[ev.index]
                    piece = c.add(ev)
                    if piece is not None:
                        yield chunk([piece])
                    done += ev.finish_reason is not None
                if p["include_usage"]:
                    yield "data: " + json.dumps({"id": cid, "object": "text_completion", "created": created,
                                                 "model": state.model_id, "choices": [], "usage": usage()}) + "\n\n"
                yield "data: [DONE]\n\n"
            except Exception:                                     # a bug: the stream still ends in JSON
                log.exception("internal error while streaming %s", cid)
                yield "data: " + json.dumps(error_body(500, "internal server error", "server_error")) + "\n\n"
                yield "data: [DONE]\n\n"
            finally:
                req.cancel()                                      # disconnected: slots free at the next step
        state.metrics.requests.labels("completions", "200").inc()
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        msg = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        return error(APIError(status, msg.get(status, "bad request"), "invalid_request_error" if status != 404
                              else "not_found_error"), "other")

    async def internal(request, exc):
        log.exception("internal error on %s", request.url.path)
        return error(APIError(500, "internal server error", "server_error"), "other")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if state.m is None and not state.loaded.is_set():
            threading.Thread(target=state.load, name="gpt2asm-load", daemon=True).start()
        yield
        state.close()

    routes = [Route("/health", health, methods=["GET"]), Route("/v1/models", models, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]), Route("/tokenize", tokenize, methods=["POST"]),
              Route("/detokenize", detokenize, methods=["POST"]),
              Route("/v1/completions", completions, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: not_found, Exception: internal})
    app.router.redirect_slashes = False          # /v1/completions/ is a 404 like any other unknown route
    return app


class Choice:
    """One choice of a completion as its events arrive: text, tokens, logprobs, finish_reason.

    The tokens it reports (logprobs, usage.completion_tokens) are those whose text is at least partly in
    the text returned: a token is held until its first character is released (the scheduler holds back
    text that may begin a stop string, and a piece of a multi-byte character), and those still held when
    the choice ends -- wholly inside the stop string that ended it -- are dropped.  So "".join(tokens)
    starts with the text, and text_offset is each token's true place in it."""

    def __init__(self, m, index: int, p: dict, prompt_lp):
        self.m, self.index, self.p = m, index, p
        self.prompt = index // p["n"]
        self.text, self.tokens, self.lps, self.tops, self.offs = "", [], [], [], []
        self.finish_reason = self.error = None
        self.cached = 0                       # prompt tokens its slot's cache held (usage.prompt_tokens_details)
        self.prompt_lp = None if prompt_lp is None else prompt_lp[self.prompt]
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")   # as the scheduler's text
        self._chars = 0                       # characters of the generated tokens complete so far
        self._held: list[tuple] = []          # (token, logprob, top, start): text not released yet
        self._base = len(self._echo_text()) if p["echo"] else 0

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def _tok(self, t: int) -> str:
        return token_name(self.m.tokenizer.token_bytes(t))

    def _logprobs(self, toks, lps, tops, offs: list[int]) -> dict | None:
        if self.p["logprobs"] is None:
            return None
        return {"tokens": [self._tok(t) for t in toks], "token_logprobs": [_json_safe(x) for x in lps],
                "top_logprobs": [None if tp is None else {self._tok(t): v for t, v in tp.items()} for tp in tops],
                "text_offset": list(offs)}

    def _prompt_offsets(self) -> list[int]:
        """text_offset of the prompt's tokens in the echoed text: the characters complete before each token
        (a token that starts inside a multi-byte character points at that character), as the generated
        tokens' offsets do."""
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        offs, n = [], 0
        for t in self.p["prompt_ids"][self.prompt]:
            offs.append(n)
            n += len(dec.decode(self.m.tokenizer.token_bytes(t)))
        return offs

    def _echo_text(self) -> str:
        """The prompt as echoed: its text, or its ids decoded -- an empty prompt's <|endoftext|> too, the
        token the model started from (usage and logprobs count it)."""
        t = self.p["texts"][self.prompt]
        return t if t else self.m.decode(self.p["prompt_ids"][self.prompt])

    def echo_piece(self) -> dict:
        ids = self.p["prompt_ids"][self.prompt]
        lp = None
        if self.prompt_lp is not None:
            lp = self._logprobs(ids, self.prompt_lp[0], self.prompt_lp[1], self._prompt_offsets())
        elif self.p["logprobs"] is not None:
            lp = self._logprobs(ids, [None] * len(ids), [None] * len(ids), self._prompt_offsets())
        return {"index": self.index, "text": self._echo_text(), "logprobs": lp, "finish_reason": None}

    def add(self, ev) -> dict | None:
        """Take an event; the stream chunk of this choice for it (None if nothing to send)."""
        self.text += ev.text
        if ev.token is not None:
            self._held.append((ev.token, ev.logprob, ev.top, self._chars))
            self._chars += len(self._dec.decode(self.m.tokenizer.token_bytes(ev.token)))
        n = 0
        while n < len(self._held) and self._held[n][3] < len(self.text):    # its first character is out
            n += 1
        out, self._held = self._held[:n], self._held[n:]
        for tok, lp_, top, start in out:
            self.tokens.append(tok)
            self.lps.append(lp_)
            self.tops.append(top)
            self.offs.append(self._base + start)
        if ev.finish_reason is not None:
            self.cached = ev.cached
            self.finish_reason = ev.finish_reason
            self.error = ev.error if ev.finish_reason == "error" else None
            self._held = []                   # all in the stop string (or never shown): not reported
        lp = None
        if out:
            lp = self._logprobs([o[0] for o in out], [o[1] for o in out], [o[2] for o in out], self.offs[-n:])
        if not ev.text and lp is None and ev.finish_reason is None:
            return None
        return {"index": self.index, "text": ev.text, "logprobs": lp, "finish_reason": ev.finish_reason}

    def final(self) -> dict:
        text, lp = self.text, None
        if self.p["logprobs"] is not None:
            toks, lps, tops, offs = list(self.tokens), list(self.lps), list(self.tops), list(self.offs)
            if self.p["echo"]:
                ids = self.p["prompt_ids"][self.prompt]
                plp = self.prompt_lp or ([None] * len(ids), [None] * len(ids))
                toks, lps, tops = list(ids) + toks, list(plp[0]) + lps, list(plp[1]) + tops
                offs = self._prompt_offsets() + offs
            lp = self._logprobs(toks, lps, tops, offs)
        if self.p["echo"]:
            text = self._echo_text() + text
        return {"index": self.index, "text": text, "logprobs": lp, "finish_reason": self.finish_reason}


# ----------------------------------------------------------------------------------------------------
# the command

def parser() -> argparse.ArgumentParser:
    from .__main__ import DTYPE_LABELS, dtype_arg, positive_int
    ap = argparse.ArgumentParser(prog="python -m gpt2asm serve",
                                 description="An OpenAI-compatible completions server (continuous batching).")
    ap.add_argument("--model", metavar="DIR|FILE|NAME", default=None, help="as python -m gpt2asm --model")
    ap.add_argument("--dtype", type=dtype_arg, choices=DTYPE_LABELS, default=None,
                    help="weight matrices (default f32; a GGUF's own type for a .gguf)")
    ap.add_argument("--kv", choices=("f32", "f16"), default=None, help="KV cache dtype (default: as the CLI)")
    ap.add_argument("-j", type=positive_int(1, 256), default=1, metavar="N", help="threads per matrix product")
    ap.add_argument("-s", dest="isa", metavar="ISA", default=None, help="kernel family (default: best)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=positive_int(0, 65535), default=8000, help="TCP port (default 8000; 0 = any)")
    ap.add_argument("--max-batch", type=positive_int(1, 4096), default=32, metavar="B",
                    help="sequences decoded together (KV caches held; default 32)")
    ap.add_argument("--max-queue", type=positive_int(0, 1 << 20), default=256, metavar="Q",
                    help="requests waiting for a slot before new ones get 429 (default 256)")
    ap.add_argument("--prefill-chunk", type=positive_int(1, 1 << 20), default=64, metavar="T",
                    help="prompt tokens prefilled between two decode steps (default 64)")
    ap.add_argument("--api-key", default=os.environ.get("GPT2ASM_API_KEY"), metavar="KEY",
                    help="require Authorization: Bearer KEY (default: $GPT2ASM_API_KEY, else none)")
    ap.add_argument("--name", default=None, help="the model id the API reports (default: the model's name)")
    ap.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                    help="on SIGTERM, seconds in-flight requests may finish before they are ended (default 30)")
    ap.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT, metavar="S",
                    help=f"seconds a request may take to arrive whole, headers and body, from its first byte "
                         f"(default {REQUEST_TIMEOUT:g}): slower ones get 408 or are dropped")
    ap.add_argument("--offline", action="store_true", help="never download the model")
    ap.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return ap


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) (an IPv4 or IPv6 address or a host name), for uvicorn to listen on."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def main(argv: list[str] | None = None, sock: socket.socket | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        say(f"gpt2asm serve: error: {e.name} is not installed: pip install 'gpt2asm[serve]' "
            "(starlette, uvicorn, prometheus_client)")
        return 2
    if args.drain_timeout < 0 or not math.isfinite(args.drain_timeout):
        say(f"gpt2asm serve: error: --drain-timeout must be a finite number of seconds >= 0, got "
            f"{args.drain_timeout}")
        return 2
    if not (args.request_timeout > 0 and math.isfinite(args.request_timeout)):
        say(f"gpt2asm serve: error: --request-timeout must be a finite number of seconds > 0, got "
            f"{args.request_timeout}")
        return 2
    if args.api_key == "":                               # an empty key would be no key: say so, not serve open
        say("gpt2asm serve: error: the API key (--api-key or $GPT2ASM_API_KEY) is empty: give a key, or unset "
            "GPT2ASM_API_KEY to serve without one")
        return 2
    if args.api_key is not None and not all("!" <= c <= "~" for c in args.api_key):
        say("gpt2asm serve: error: the API key (--api-key or $GPT2ASM_API_KEY) must be visible ASCII "
            "characters (what an Authorization header carries): no spaces, controls or other letters")
        return 2
    if sock is None:                                      # bind first: a taken port or a bad host is an
        try:                                              # error before the model loads
            sock = bind(args.host, args.port)
        except OSError as e:
            say(f"gpt2asm serve: error: cannot listen on {args.host} port {args.port}: "
                f"{e.strerror or e}")
            return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    raise_open_files_limit()
    from .files import model_label
    name = args.name or model_label(args.model)

    def loader():
        from .engine import GPT2
        return GPT2.load(args.model, dtype=args.dtype, isa=args.isa, threads=args.j, download=not args.offline,
                         progress=False, kv=args.kv)

    state = App(loader, name, args.api_key, args.max_batch, args.max_queue, args.prefill_chunk, args.drain_timeout)
    app = create_app(state)
    config = uvicorn_config(app, args.request_timeout, host=args.host, port=args.port, log_level=args.log_level,
                            lifespan="on",
                            timeout_graceful_shutdown=args.drain_timeout + 5, access_log=False)

    server = make_server(config, state)

    def failed():
        server.should_exit = True
    state.on_load_error = failed
    for sig in (signal.SIGTERM, signal.SIGINT):           # uvicorn re-raises the signal it caught once it
        signal.signal(sig, lambda *a: None)                # has shut down: a no-op then, so the exit is 0
    host, port = sock.getsockname()[:2]
    log.info("gpt2asm: listening on http://%s:%d", f"[{host}]" if ":" in host else host, port)
    server.run(sockets=[sock])
    if state.load_error is not None:
        e = state.load_error
        say(f"gpt2asm serve: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return 2
    return 0
