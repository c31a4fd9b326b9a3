"""The OpenAI-compatible server (gpt2asm/server.py) on 127.0.0.1, an ephemeral port, a tiny checkpoint.

Contract: the real `openai` client gets, streaming or not, the text GPT2.generate gives alone (choice j of
a call with seed s: seed s + j); echo + logprobs return GPT2.logprobs's numbers; under a bounded load
(64 requests from 32 clients, mixed lengths, greedy and seeded, some cancelled mid-stream) every
completion is the request alone and nothing is lost; every error is its status and an OpenAI JSON error
(never a traceback); a disconnected stream frees its slot; SIGTERM lets the in-flight stream end with a
finish_reason and the process exit 0.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import ROOT
from gpt2asm import GPT2

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from gpt2asm.server import App, create_app, make_server, uvicorn_config  # noqa: E402


class Running:
    """A server in a thread of this process: its App state, base URL, and stop()."""

    def __init__(self, ckpt, loader=None, request_timeout: float = 30.0, **kw):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = App(loader or (lambda: GPT2.load(ckpt)), "tiny", **kw)
        self.server = make_server(uvicorn_config(create_app(self.state), request_timeout, log_level="warning",
                                                 lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs=dict(sockets=[self.sock]), daemon=True)
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            assert time.monotonic() - t0 < 60, "the server did not start"
            time.sleep(0.02)

    def wait_loaded(self):
        assert self.state.loaded.wait(60)
        return self

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive()


def http(url, body=None, method=None, headers=None, raw: bytes | None = None):
    """(status, parsed JSON or text) of one request (urllib: no client-side checks)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    assert "Traceback" not in text
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@pytest.fixture(scope="module")
def ref(ckpt_tiny):
    with GPT2.load(ckpt_tiny) as m:
        yield m


@pytest.fixture(scope="module")
def srv(ckpt_tiny):
    s = Running(ckpt_tiny, max_batch=8, max_queue=64).wait_loaded()
    yield s
    s.stop()


def test_openai_client(srv, ref):
    c = srv.client()
    r = c.completions.create(model="tiny", prompt="Alan Turing theorized that", max_tokens=12, temperature=0)
    assert r.choices[0].text == ref.generate("Alan Turing theorized that", 12, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.object == "text_completion"
    n_prompt = len(ref.encode("Alan Turing theorized that"))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n_prompt, 12, n_prompt + 12)

    prompts = ["Hello there", "The quick brown fox"]
    r = c.completions.create(model="tiny", prompt=prompts, max_tokens=6, n=2, seed=41, temperature=0.9, top_p=0.95,
                             extra_body={"top_k": 50})
    want = [ref.generate(prompts[j // 2], 6, seed=41 + j, temperature=0.9, top_p=0.95, top_k=50) for j in range(4)]
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3] and [ch.text for ch in r.choices] == want

    got: dict = {}
    fins: dict = {}
    for chunk in c.completions.create(model="tiny", prompt=prompts, max_tokens=9, seed=5, stream=True,
                                      stream_options={"include_usage": True}):
        for ch in chunk.choices:
            got[ch.index] = got.get(ch.index, "") + ch.text
            if ch.finish_reason:
                fins[ch.index] = ch.finish_reason
        if chunk.usage:
            assert chunk.usage.completion_tokens == 18
    assert [got.get(i, "") for i in range(2)] == [ref.generate(p, 9, seed=5 + i, temperature=1.0)
                                                       for i, p in enumerate(prompts)]
    assert fins == {0: "length", 1: "length"}

    r = c.completions.create(model="tiny", prompt="x y z", max_tokens=20, temperature=0, stop=[" the", "\n"])
    assert r.choices[0].text == ref.generate("x y z", 20, temperature=0, stop=[" the", "\n"])
    ids = ref.encode("Token ids in, text out")
    r = c.completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0)
    assert r.choices[0].text == ref.generate("Token ids in, text out", 4, temperature=0)
    assert [mm.id for mm in c.models.list().data] == ["tiny"]


def test_echo_logprobs_are_scoring_numbers(srv, ref):
    text = "Scoring text is what GPT-2 is most used for today."
    r = srv.client().completions.create(model="tiny", prompt=text, max_tokens=0, echo=True, logprobs=3)
    ch = r.choices[0]
    assert ch.text == text
    want = ref.logprobs([text])[0]
    lp = ch.logprobs.token_logprobs
    assert lp[0] is None and np.array_equal(np.array(lp[1:]), want[1:])
    assert len(ch.logprobs.tokens) == len(want) and all(len(t) <= 3 for t in ch.logprobs.top_logprobs[1:])
    r = srv.client().completions.create(model="tiny", prompt=text, max_tokens=3, echo=True, logprobs=1,
                                        temperature=0)
    lp = r.choices[0].logprobs
    gen = ref.generate(text, 3, temperature=0)
    assert r.choices[0].text == text + gen and len(lp.tokens) == len(want) + 3
    for t, v, top in zip(lp.tokens[len(want):], lp.token_logprobs[len(want):], lp.top_logprobs[len(want):]):
        assert v <= 0 and max(top.values()) == pytest.approx(v)        # greedy: the most likely token


def test_logprobs_name_every_token_apart(srv, ref):
    """Tokens that are pieces of a multi-byte character are named as OpenAI does ("bytes:\\xe6\\x97"), so
    every token of the vocabulary has its own name and top_logprobs never merges two alternatives under one
    U+FFFD (logprobs = 20 gave 19 entries at some positions)."""
    from gpt2asm.server import token_name
    names = [token_name(ref.tokenizer.token_bytes(t)) for t in range(ref.n_sample)]
    assert len(set(names)) == len(names) and not any("\ufffd" in n for n in names if n.startswith("bytes:"))
    assert token_name("日".encode()[:2]) == "bytes:\\xe6\\x97" and token_name(b" the") == " the"
    r = srv.client().completions.create(model="tiny", prompt="日本の天気", max_tokens=0, echo=True, logprobs=20)
    lp = r.choices[0].logprobs
    ids = ref.encode("日本の天気")
    assert lp.tokens == [token_name(ref.tokenizer.token_bytes(t)) for t in ids]
    assert any(t.startswith("bytes:") for t in lp.tokens)
    assert all(len(top) == 20 for top in lp.top_logprobs[1:])


def test_echo_offsets_and_empty_prompt(srv, ref):
    """text_offset: where each token's text starts in `text` -- the characters complete before it (a byte
    token inside a multi-byte character points at that character), the same streamed or not; an empty
    prompt echoes the <|endoftext|> it starts from, as its logprobs and usage count it."""
    c = srv.client()
    for prompt in ("日本の天気", "a 🙂 b"):
        ids = ref.encode(prompt)
        kw = dict(model="tiny", prompt=prompt, max_tokens=4, echo=True, logprobs=0, temperature=0)
        r = c.completions.create(**kw).choices[0]
        offs, tokens = r.logprobs.text_offset, r.logprobs.tokens
        assert r.text == prompt + ref.generate(prompt, 4, temperature=0) and len(offs) == len(ids) + 4
        dec = [len(ref.decode(ids[:i])) for i in range(len(ids))]
        assert offs[0] == 0 and all(a <= b <= len(r.text) for a, b in zip(offs, offs[1:]))
        assert offs[len(ids)] == len(prompt) and len(tokens) == len(offs)
        assert all(o <= d for o, d in zip(offs, dec))     # decode() of a cut prefix may add a U+FFFD
        streamed = [o for ch in c.completions.create(**kw, stream=True) for o in
                    (ch.choices[0].logprobs.text_offset if ch.choices and ch.choices[0].logprobs else [])]
        assert streamed == offs
    r = c.completions.create(model="tiny", prompt="", max_tokens=2, echo=True, logprobs=0, temperature=0)
    ch = r.choices[0]
    assert ch.text == "<|endoftext|>" + ref.generate("", 2, temperature=0) and r.usage.prompt_tokens == 1
    assert ch.logprobs.tokens[0] == "<|endoftext|>" and ch.logprobs.text_offset[:2] == [0, 13]


def test_a_shared_prompt_prefix_is_cached(srv, ref):
    """A request whose prompt begins with what a slot's KV cache holds (a shared system prompt) prefills only
    the rest: usage.prompt_tokens_details.cached_tokens and gpt2asm_prompt_tokens_cached count what it took;
    the text is GPT2.generate's alone."""
    from gpt2asm.state import common_prefix
    c = srv.client()
    system = "You are a careful assistant who answers in one short sentence about the history of printing."
    r = c.completions.create(model="tiny", prompt=system, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens < len(ref.encode(system))
    before = srv.state.metrics.cached_tokens._value.get()
    q = system + " Question: who was Gutenberg?"
    r = c.completions.create(model="tiny", prompt=q, max_tokens=6, temperature=0)
    assert r.choices[0].text == ref.generate(q, 6, temperature=0)
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert common_prefix(ref.encode(system), ref.encode(q)) <= cached < len(ref.encode(q)), cached
    assert srv.state.metrics.cached_tokens._value.get() == before + cached
    st, text = http(srv.url + "/metrics")
    assert st == 200 and "gpt2asm_prompt_tokens_cached_total" in text


def test_side_endpoints(srv, ref):
    assert http(srv.url + "/health") == (200, {"status": "ok"})
    st, body = http(srv.url + "/tokenize", {"prompt": "Hello world"})
    assert st == 200 and body["tokens"] == ref.encode("Hello world") and body["max_model_len"] == ref.n_ctx
    assert http(srv.url + "/detokenize", {"tokens": body["tokens"]}) == (200, {"prompt": "Hello world"})
    st, text = http(srv.url + "/metrics")
    assert st == 200
    for name in ("gpt2asm_requests_total", "gpt2asm_generation_tokens_total", "gpt2asm_batch_occupancy",
                 "gpt2asm_queue_depth", "gpt2asm_time_to_first_token_seconds_bucket",
                 "gpt2asm_inter_token_latency_seconds_bucket", "gpt2asm_prompt_tokens_total"):
        assert name in text


def test_disconnect_frees_slots(srv):
    """A non-streaming request whose client goes away ends at the next step (its slots freed)."""
    before = srv.state.metrics.finished.labels("cancelled")._value.get()
    post_and_hang_up(srv, {"prompt": "Hello", "max_tokens": 1000, "temperature": 0, "n": 2},
                     lambda: srv.state.sched.running >= 2)
    wait_for(lambda: not srv.state.sched.running, "a disconnected request kept its slots")
    assert srv.state.metrics.finished.labels("cancelled")._value.get() == before + 2


def wait_for(cond, what: str, timeout: float = 30) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, what
        time.sleep(0.02)


def post_and_hang_up(srv, body: dict, started) -> None:
    """POST body to /v1/completions on a raw connection, and close it once started() is true."""
    raw = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", srv.port)) as c:
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
        wait_for(started, "the request did not start")


def err(status_body, status, param=None, code=None):
    st, body = status_body
    assert st == status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param
    if code is not None:
        assert body["error"]["code"] == code


def test_errors(srv, ref):
    u = srv.url + "/v1/completions"
    for bad, param in ((dict(temperature=-1), "temperature"), (dict(temperature="hot"), "temperature"),
                       (dict(top_p=0), "top_p"), (dict(top_k=1.5), "top_k"), (dict(top_k=-1.0), "top_k"),
                       (dict(top_k=40.0), "top_k"), (dict(n=0), "n"), (dict(n=True), "n"),
                       (dict(max_tokens=-1), "max_tokens"), (dict(seed=-5), "seed"), (dict(stop=[1]), "stop"),
                       (dict(stream="yes"), "stream"), (dict(echo=1), "echo"), (dict(logprobs=99), "logprobs"),
                       (dict(prompt=[[1], "a"]), "prompt"), (dict(prompt=[10 ** 9]), "prompt"),
                       (dict(prompt=[]), "prompt"),
                       (dict(prompt={"a": 1}), "prompt"), (dict(frequency_penalty=1), "frequency_penalty"),
                       (dict(bogus=1), "bogus"), (dict(best_of=3), "best_of"), (dict(suffix="x"), "suffix"),
                       (dict(temperature=10 ** 400), "temperature"), (dict(top_p=10 ** 400), "top_p"),
                       (dict(repetition_penalty=10 ** 400), "repetition_penalty")):
        err(http(u, {"prompt": "Hi", **bad}), 400, param)
    for name, digits in (("max_tokens", b"9" * 5000), ("seed", b"-" + b"9" * 5000)):   # past int()'s limit
        err(http(u, raw=b'{"prompt": "Hi", "%s": %s}' % (name.encode(), digits)), 400, name)
    err(http(u, {"prompt": "Hi", "max_tokens": ref.n_ctx}), 400, "max_tokens", "context_length_exceeded")
    err(http(u, {"prompt": [0] * (ref.n_ctx + 1), "max_tokens": 0}), 400, code="context_length_exceeded")
    err(http(u, raw=b'{"\\ud800": 1, "prompt": "a"}'), 400, "\ud800")      # a lone surrogate as a name
    err(http(u, raw=b"{not json"), 400)
    err(http(u, raw=b"[1, 2]"), 400)
    err(http(u, {"prompt": "Hi", "model": "gpt-4"}), 404, "model", "model_not_found")
    err(http(srv.url + "/v1/nothing"), 404)
    err(http(srv.url + "/v1/completions", method="GET"), 405)
    err(http(srv.url + "/tokenize", {"prompt": 5}), 400)
    err(http(srv.url + "/detokenize", {"tokens": [-1]}), 400)
    with pytest.raises(openai.BadRequestError):
        srv.client().completions.create(model="tiny", prompt="Hi", temperature=7000)
    assert http(u, {"prompt": "Hi", "max_tokens": 1, "suffix": ""})[0] == 200         # as some clients send it


def test_echo_logprobs_work_is_bounded_and_cancelled(srv, monkeypatch):
    """echo + logprobs returns at most MAX_SCORED prompt tokens a request, each choice its prompt's (prompt
    tokens x n; 400 past it: the response would grow n-fold); the scoring runs one
    prompt a driver step, and a client that goes away has the prompts not yet scored skipped."""
    import gpt2asm.server as server
    u = srv.url + "/v1/completions"
    monkeypatch.setattr(server, "MAX_SCORED", 10)
    err(http(u, {"prompt": [[1] * 6, [2] * 5], "echo": True, "logprobs": 1, "max_tokens": 0}), 400, "prompt")
    assert http(u, {"prompt": [[1] * 6, [2] * 5], "echo": True, "max_tokens": 0})[0] == 200      # no logprobs
    assert http(u, {"prompt": [[1] * 5], "echo": True, "logprobs": 1, "max_tokens": 0})[0] == 200
    err(http(u, {"prompt": [[1] * 5], "echo": True, "logprobs": 1, "max_tokens": 0, "n": 3}), 400, "prompt")
    monkeypatch.setattr(server, "MAX_SCORED", 1 << 20)
    scored, real = [], server.prompt_logprobs

    def slow(m, ids, k):
        scored.append(len(ids))
        time.sleep(0.05)
        return real(m, ids, k)
    monkeypatch.setattr(server, "prompt_logprobs", slow)
    post_and_hang_up(srv, {"prompt": [[5, 6, 7]] * 200, "echo": True, "logprobs": 2, "max_tokens": 0},
                     lambda: scored)
    wait_for(lambda: not srv.state.sched._calls, "the scoring of a disconnected request went on")
    assert len(scored) < 100, len(scored)


def test_errors_quote_bad_values_briefly(srv):
    """A multi-megabyte bad value (within MAX_BODY) is quoted in the JSON error by its first 100 characters,
    '...' and its size; top_k -1 (an integer) is still vLLM's "off"."""
    u = srv.url + "/v1/completions"
    huge = "x" * (3 << 20)
    for bad, param, status in ((dict(stop=["a"] * 500_000 + [1]), "stop", 400), (dict(top_k=huge), "top_k", 400),
                               (dict(temperature=huge), "temperature", 400), (dict(echo=huge), "echo", 400),
                               (dict(model=huge), "model", 404), (dict(prompt=[huge, 1]), "prompt", 400)):
        st, body = http(u, {"prompt": "Hi", "max_tokens": 1, **bad})
        err((st, body), status, param)
        assert len(json.dumps(body)) < 600, json.dumps(body)[:600]
    st, body = http(u, {"prompt": "Hi", "max_tokens": 1, huge: 1})
    err((st, body), 400)
    assert len(json.dumps(body)) < 600 and body["error"]["param"] == huge[:100]
    assert "... (500001 items)" in http(u, {"prompt": "Hi", "stop": ["a"] * 500_000 + [1]})[1]["error"]["message"]
    st, body = http(u, {"prompt": "Hi", "max_tokens": 2, "top_k": -1, "temperature": 0})
    assert st == 200 and body["choices"][0]["finish_reason"] in ("length", "stop"), body


def test_echo_logprobs_of_non_finite_logits(ckpt_tiny):
    """Weights that overflow float32 in the forward pass (finite, so they load): echo + logprobs has no number to
    give, and JSON has no NaN -- a 500 naming the problem (as sampling's), never a generic error or NaN in a
    stream chunk."""
    def overflowing():
        m = GPT2.load(ckpt_tiny)
        m.model.w.ln_f_g[:] = 3e38                     # ln_f's gain: every logit of every position overflows
        return m
    s = Running(ckpt_tiny, loader=overflowing).wait_loaded()
    try:
        for stream in (False, True):
            body = {"prompt": "Hello there you", "max_tokens": 0, "echo": True, "logprobs": 2, "stream": stream}
            err(http(s.url + "/v1/completions", body), 500, code="generation_failed")
        status, body = http(s.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 0, "echo": True, "logprobs": 2})
        assert status == 200 and body["choices"][0]["text"] == "Hi"     # one token: nothing to score
    finally:
        s.stop()


def test_slow_tokenizing_does_not_stall_the_server(srv, monkeypatch):
    """Tokenizing a big body takes seconds (8 MB of one unbroken word: ~30 s): it runs off the event loop,
    so /health and the other clients are answered meanwhile.  Here encode() blocks until /health answered."""
    gate, encode = threading.Event(), srv.state.m.encode

    def slow_encode(text):
        if text == "slow":
            gate.wait(20)
        return encode(text)
    monkeypatch.setattr(srv.state.m, "encode", slow_encode)
    for path, body in (("/tokenize", {"prompt": "slow"}), ("/v1/completions", {"prompt": "slow", "max_tokens": 1})):
        gate.clear()
        t = threading.Thread(target=lambda: http(srv.url + path, body), daemon=True)
        t.start()
        time.sleep(0.2)                                           # the request is in encode() now
        try:
            req = urllib.request.Request(srv.url + "/health")
            with urllib.request.urlopen(req, timeout=5) as r:
                assert r.status == 200, path
        finally:
            gate.set()
            t.join(60)


def test_api_key_loading_queue_and_shutdown(ckpt_tiny):
    gate = threading.Event()

    def slow_loader():
        gate.wait(60)
        return GPT2.load(ckpt_tiny)
    s = Running(ckpt_tiny, loader=slow_loader, api_key="s3cret", max_batch=1, max_queue=0)
    try:
        err(http(s.url + "/v1/completions", {"prompt": "Hi"}, headers={"Authorization": "Bearer s3cret"}), 503,
            code="loading")
        assert http(s.url + "/health")[0] == 503
        gate.set()
        s.wait_loaded()
        assert http(s.url + "/health") == (200, {"status": "ok"})            # no key needed
        err(http(s.url + "/v1/completions", {"prompt": "Hi"}), 401, code="invalid_api_key")
        err(http(s.url + "/v1/models", headers={"Authorization": "Bearer s3cre"}), 401)
        err(http(s.url + "/metrics", headers={"Authorization": "Bearer s3cret-"}), 401)
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").completions.create(model="tiny", prompt="Hi", max_tokens=1)
        good = s.client("s3cret")
        # one slot, no queue: a second request while one runs is 429
        stream = good.completions.create(model="tiny", prompt="Hi", max_tokens=900, temperature=0, stream=True)
        it = iter(stream)
        next(it)
        err(http(s.url + "/v1/completions", {"prompt": "Hi"}, headers={"Authorization": "Bearer s3cret"}), 429,
            code="queue_full")
        # more sequences than the one slot, and no queue: it could never start, a 400 (was 429 for ever)
        for body in ({"prompt": "Hi", "n": 2}, {"prompt": ["Hi", "Ho"]}):
            err(http(s.url + "/v1/completions", body, headers={"Authorization": "Bearer s3cret"}), 400, "n",
                "too_many_sequences")
        with pytest.raises(openai.RateLimitError):
            good.completions.create(model="tiny", prompt="Hi", max_tokens=1)
        stream.close()                                                          # disconnect: slot freed
        t0 = time.monotonic()
        while s.state.sched.running:
            assert time.monotonic() - t0 < 30, "a disconnected stream kept its slot"
            time.sleep(0.02)
        assert good.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices[0].finish_reason == "length"
        st, text = http(s.url + "/metrics", headers={"Authorization": "Bearer s3cret"})
        assert 'gpt2asm_sequences_finished_total{finish_reason="cancelled"} 1.0' in text
        s.state.begin_shutdown()
        err(http(s.url + "/v1/completions", {"prompt": "Hi"}, headers={"Authorization": "Bearer s3cret"}), 503,
            code="shutting_down")
        assert http(s.url + "/health")[0] == 503
    finally:
        gate.set()
        s.stop()


def test_load_every_completion_as_alone(ckpt_tiny, ref):
    """64 requests from 32 concurrent clients (mixed lengths, greedy and seeded, 8 cancelled mid-stream)
    into 8 slots: every finished completion is the request alone, every cancelled one a prefix of it."""
    s = Running(ckpt_tiny, max_batch=8, max_queue=64).wait_loaded()
    rng = random.Random(0)
    words = "the of and to in is was for on that with as by at from his it an were are which".split()
    jobs = []
    for i in range(64):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
        samp = dict(temperature=0) if i % 2 else dict(temperature=0.9, seed=rng.randint(0, 1 << 40))
        jobs.append(dict(prompt=prompt, max_tokens=rng.randint(1, 12), stream=i % 3 == 0, cancel=i % 8 == 3, **samp))
    client = s.client()

    def run(job):
        args = {k: v for k, v in job.items() if k not in ("cancel",)}
        if not job["stream"] and not job["cancel"]:
            r = client.completions.create(model="tiny", **args)
            return r.choices[0].text, r.choices[0].finish_reason
        args["stream"] = True
        text, fin = "", None
        st = client.completions.create(model="tiny", **args)
        for chunk in st:
            for ch in chunk.choices:
                text += ch.text
                fin = ch.finish_reason or fin
            if job["cancel"] and chunk.choices and chunk.choices[0].text:
                st.close()
                return text, "client-cancelled"
        return text, fin

    try:
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(32) as ex:
            results = list(ex.map(run, jobs, timeout=600))
        assert time.monotonic() - t0 < 600
        while s.state.sched.running or s.state.sched.waiting:
            assert time.monotonic() - t0 < 600
            time.sleep(0.05)
    finally:
        s.stop()
    for job, (text, fin) in zip(jobs, results):
        samp = {k: job[k] for k in ("temperature", "seed") if k in job}
        want = ref.generate(job["prompt"], job["max_tokens"], **samp)
        if fin == "client-cancelled":
            assert want.startswith(text)
        else:
            assert fin == "length" and text == want, job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, p=None, timeout: float = 120, why: str = "the server did not come up") -> None:
    """Until GET url/health answers 200 (p: the server's process, which must stay alive)."""
    t0 = time.monotonic()
    while True:
        try:
            if http(url + "/health")[0] == 200:
                return
        except OSError:
            pass
        assert (p is None or p.poll() is None) and time.monotonic() - t0 < timeout, why
        time.sleep(0.1)


def serve_process(ckpt, *flags, **popen) -> tuple[subprocess.Popen, str]:
    """`python -m gpt2asm serve --model ckpt` on a free port with flags, stdout and stderr together in
    p.stdout: (process, base URL) once it answers /health."""
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "gpt2asm", "serve", "--model", str(ckpt), "--port", str(port),
                          "--log-level", "warning", *flags], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, p)
    except BaseException:
        p.kill()
        p.wait()
        raise
    return p, url


def test_sigterm_mid_stream(ckpt_tiny):
    p, url = serve_process(ckpt_tiny, "--drain-timeout", "0.3")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        stream = client.completions.create(model=ckpt_tiny.name, prompt="Hello", max_tokens=1000, temperature=0, stream=True)
        text, fin, n = "", None, 0
        for chunk in stream:
            for ch in chunk.choices:
                text += ch.text
                fin = ch.finish_reason or fin
            n += 1
            if n == 3:
                p.send_signal(signal.SIGTERM)
        assert fin == "shutdown" and len(text) > 0
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out = p.stdout.read()
    assert "Traceback" not in out, out


def test_serve_command_errors(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "gpt2asm", "serve", "--model", str(tmp_path / "none"), "--port", "0",
                        "--log-level", "critical"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "gpt2asm serve: error:" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "gpt2asm", "serve", "--max-batch", "0"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--max-batch" in r.stderr and "Traceback" not in r.stderr
    with socket.socket() as taken:                                     # the port is taken: before the model loads
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for where in (["--port", str(taken.getsockname()[1])], ["--host", "256.1.1.1"]):
            r = subprocess.run([sys.executable, "-m", "gpt2asm", "serve", "--model", str(tmp_path / "none"), *where],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 2 and r.stderr.startswith("gpt2asm serve: error: cannot listen on"), r.stderr
            assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    if True:                                                           # empty: not silently no key
        r = subprocess.run([sys.executable, "-m", "gpt2asm", "serve", "--port", "0"], cwd=ROOT,
                           env=dict(env, GPT2ASM_API_KEY=""), capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "API key" in r.stderr and "empty" in r.stderr, r.stderr
    for key in (b"k\xff", b"two words", "k\u00e4".encode()):                # not what a header carries
        r = subprocess.run([sys.executable.encode(), b"-m", b"gpt2asm", b"serve", b"--api-key", key, b"--port", b"0"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "API key" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_max_batch_beyond_memory(ckpt_tiny, monkeypatch):
    """A --max-batch whose KV caches cannot fit in the memory left once the model is loaded is lowered to what
    fits (the other sequences wait in the queue); not even one sequence fitting is a load error."""
    import gpt2asm.server as server
    from gpt2asm import InvalidArgumentError
    with GPT2.load(ckpt_tiny) as m:
        cfg = m.model.cfg
        per = 2 * cfg.n_layer * cfg.n_ctx * cfg.n_embd * 4
        monkeypatch.setattr(server, "available_memory", lambda: 10 * per + 5)
        assert server.kv_batch_limit(m, 8) == 8 and server.kv_batch_limit(m, 4096) == 10
        monkeypatch.setattr(server, "available_memory", lambda: per - 1)
        with pytest.raises(InvalidArgumentError, match="one sequence's KV cache needs"):
            server.kv_batch_limit(m, 1)
    monkeypatch.setattr(server, "available_memory", lambda: 3 * per)
    s = Running(ckpt_tiny, max_batch=4096).wait_loaded()
    try:
        assert s.state.load_error is None and s.state.sched.max_batch == 3
        st, body = http(s.url + "/v1/completions", {"prompt": "Hi", "n": 5, "max_tokens": 3, "temperature": 0})
        assert st == 200 and len(body["choices"]) == 5
    finally:
        s.stop()


def test_max_batch_within_the_address_space(ckpt_tiny, monkeypatch):
    """Under an address-space limit (RLIMIT_AS) the KV caches that fit are those the limit leaves room for
    (less server.AS_RESERVE), however much memory the machine has: --max-batch counted only MemAvailable,
    so the caches past the limit were refused at admission, and that failed every running request."""
    import gpt2asm.resident as resident
    import gpt2asm.server as server
    from gpt2asm import InvalidArgumentError
    with GPT2.load(ckpt_tiny) as m:
        cfg = m.model.cfg
        per = 2 * cfg.n_layer * cfg.n_ctx * cfg.n_embd * 4
        monkeypatch.setattr(resident, "mem_available", lambda: 1 << 50)
        monkeypatch.setattr(server, "address_space_left", lambda: server.AS_RESERVE + 3 * per + 5)
        assert server.kv_batch_limit(m, 8) == 3
        monkeypatch.setattr(server, "address_space_left", lambda: server.AS_RESERVE + per - 1)
        with pytest.raises(InvalidArgumentError, match="address-space limit"):
            server.kv_batch_limit(m, 1)
        monkeypatch.setattr(server, "address_space_left", lambda: None)
        assert server.kv_batch_limit(m, 8) == 8
    code = ("import resource; from gpt2asm.server import address_space_left as left; print(left()); "
            "resource.setrlimit(resource.RLIMIT_AS, (16 << 30, resource.RLIM_INFINITY)); print(left())")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    before, after = r.stdout.split()
    assert r.returncode == 0 and before == "None" and 0 < int(after) < 16 << 30, r


def test_serve_defaults_follow_the_model(ckpt_tiny, tmp_path, monkeypatch):
    """serve's --dtype defaults as the CLI's (None: f32, or a GGUF's own type) and --name to the model's
    last path part, however it was named: --model, $GPT2ASM_MODEL or the current directory."""
    from gpt2asm.files import model_label
    from gpt2asm.server import parser
    assert parser().parse_args([]).dtype is None
    monkeypatch.delenv("GPT2ASM_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)                                     # holds no model
    assert model_label(None) == "gpt2"
    assert model_label(str(ckpt_tiny) + "/") == ckpt_tiny.name
    assert model_label("openai-community/gpt2-medium") == "gpt2-medium"
    assert model_label(tmp_path / "m.gguf") == "m.gguf"
    monkeypatch.setenv("GPT2ASM_MODEL", str(ckpt_tiny))
    assert model_label(None) == ckpt_tiny.name
    monkeypatch.delenv("GPT2ASM_MODEL")
    monkeypatch.chdir(ckpt_tiny)
    assert model_label(None) == ckpt_tiny.name


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12345678901234567890123456\r\n\r\n{}",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
    b"GET /health HTTP/9.9 extra\r\n\r\n",
], ids=["bad-chunk", "negative-length", "26-digit-length", "200k-header", "bad-request-line"])
def test_malformed_http_gets_a_json_400(srv, request_bytes):
    """A request uvicorn's HTTP parser refuses gets OpenAI's JSON error too (server.http_protocol), not
    uvicorn's plain text; the server goes on serving.  (A server that closes with request bytes still
    unread makes the kernel reset the connection, which can drop the answer before the client reads it:
    that is TCP's doing, so such an exchange is tried again.)"""
    for attempt in range(5):
        got = b""
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as c:
            try:
                c.sendall(request_bytes)
                while chunk := c.recv(65536):
                    got += chunk
            except (BrokenPipeError, ConnectionResetError):
                if b"\r\n\r\n" not in got:
                    continue
        break
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), got[:200]
    assert b"content-type: application/json" in head.lower(), head
    err((400, json.loads(body)), 400)
    assert http(srv.url + "/health")[0] == 200


def test_an_idle_connection_is_closed(srv):
    """A connection that never sends a request is closed after uvicorn's keep-alive timeout (5 s), as one
    that went idle after a response is; uvicorn alone would hold its file descriptor for ever."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as c:
        t0 = time.monotonic()
        assert c.recv(1) == b""
        assert 3 < time.monotonic() - t0 < 20
    assert http(srv.url + "/health")[0] == 200


def test_out_of_file_descriptors(ckpt_tiny):
    """A server at its open-files limit (soft = hard = 64, so serve cannot raise it) with more idle
    connections than it can accept: one warning line, no storm of tracebacks (asyncio would log one per
    pending connection and second), and it serves again once they close."""
    resource = pytest.importorskip("resource")
    p, url = serve_process(ckpt_tiny, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    port = int(url.rsplit(":", 1)[1])
    conns = []
    try:
        for _ in range(120):
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        time.sleep(3)
        for c in conns:
            c.close()
        conns.clear()
        wait_healthy(url, timeout=30, why="the server did not recover")
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    finally:
        for c in conns:
            c.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    out = p.stdout.read()
    assert "Traceback" not in out and "cannot accept a connection: Too many open files" in out, out[-3000:]
    assert len(out.splitlines()) <= 5, out[-3000:]


def test_listener_stops_an_accept_round_at_the_first_emfile():
    """server.Listener: out of descriptors, accept() raises EMFILE once, then "would block" (so asyncio's
    accept loop ends its round rather than scheduling a retry per pending connection), then tries again."""
    code = """if 1:
        import errno, os, resource, socket
        from gpt2asm.server import listener
        srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(8)
        srv = listener(srv)
        clients = [socket.create_connection(srv.getsockname()) for _ in range(3)]
        used = len(os.listdir("/proc/self/fd")) - 1
        resource.setrlimit(resource.RLIMIT_NOFILE, (used, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        got = []
        for _ in range(4):
            try:
                srv.accept()
                got.append("ok")
            except BlockingIOError:
                got.append("block")
            except OSError as e:
                got.append(errno.errorcode[e.errno])
        print(" ".join(got))
    """
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["EMFILE", "block", "EMFILE", "block"], r.stdout


def test_a_failure_mid_stream_ends_the_stream_in_json(srv, monkeypatch):
    """A bug that raises while a stream is being written (here: Choice.add on its third event) ends that
    stream with an OpenAI JSON error event and [DONE], not a cut connection; the server goes on."""
    import gpt2asm.server as server
    add, calls = server.Choice.add, []

    def failing(self, ev):
        calls.append(ev)
        if len(calls) == 3:
            raise RuntimeError("a bug")
        return add(self, ev)
    monkeypatch.setattr(server.Choice, "add", failing)
    status, text = http(srv.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 8, "stream": True,
                                                     "temperature": 0})
    monkeypatch.undo()
    assert status == 200
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 4, events
    assert json.loads(events[-2])["error"]["type"] == "server_error"
    assert "a bug" not in text and "Traceback" not in text
    assert http(srv.url + "/health")[0] == 200


# -- hostile round 8: slow and odd clients --------------------------------------------------------------

def exchange(port: int, data: bytes, limit: float = 30, trickle: bytes = b"") -> tuple[bytes, float]:
    """(what the server sent until it closed, seconds it took) for a connection that sends data, then
    nothing (or `trickle`, a byte every 0.5 s)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=0.5 if trickle else limit) as c:
        c.sendall(data)
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            try:
                chunk = c.recv(65536)
            except socket.timeout:
                c.sendall(trickle[:1])
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        return got, time.monotonic() - t0


@pytest.fixture(scope="module")
def slow_srv(ckpt_tiny):
    s = Running(ckpt_tiny, request_timeout=1.5).wait_loaded()
    yield s
    s.stop()


@pytest.mark.parametrize("data, trickle, answer", [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"", b"408"),                       # headers, then silence
    (b"GET /health HTTP/1.1\r\nHost: x\r\n", b"X", b"408"),                                # headers trickled
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", b"", b""),  # a body, silence
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", b" ", b""),  # trickled
    (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"", b""),  # no chunks
])
def test_a_request_must_arrive_within_the_request_timeout(slow_srv, data, trickle, answer):
    """Slowloris: a request that stalls or trickles was held for ever (one byte per connection locked the
    server out at its descriptor limit).  Now it has --request-timeout from its first byte: headers not
    whole -> a JSON 408; a body not whole -> the connection is dropped (the endpoint sees it gone)."""
    got, took = exchange(slow_srv.port, data, trickle=trickle)
    assert 1.0 < took < 10, took
    if answer:
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), got[:200]
        err((408, json.loads(body)), 408)
    else:
        assert got == b"", got[:200]
    assert http(slow_srv.url + "/health")[0] == 200
    assert http(slow_srv.url + "/v1/completions", {"prompt": "a", "max_tokens": 2})[0] == 200


def test_a_whole_request_is_not_timed(slow_srv):
    """The deadline is for a request's arrival only: a generation longer than it streams on."""
    c = slow_srv.client()
    text = "".join(ch.choices[0].text for ch in c.completions.create(model="tiny", prompt="a", max_tokens=200,
                                                                      temperature=0, stream=True))
    assert len(text) > 0


def test_sigterm_drops_requests_still_arriving(ckpt_tiny):
    """SIGTERM with connections whose bodies are still arriving: they are dropped at once (nothing has
    started), so the server exits promptly, status 0, without waiting for them or logging tracebacks."""
    p, url = serve_process(ckpt_tiny, "--drain-timeout", "2")
    socks = []
    try:
        port = int(url.rsplit(":", 1)[1])
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
            socks.append(s)
        time.sleep(0.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
        assert time.monotonic() - t0 < 5
    finally:
        for s in socks:
            s.close()
        if p.poll() is None:
            p.kill()
            p.wait()
    out = p.stdout.read()
    assert "Traceback" not in out and "Exception in ASGI" not in out, out


def raw_exchange(port: int, data: bytes) -> tuple[int, dict | str]:
    got, _ = exchange(port, data)
    head, _, body = got.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def test_odd_requests_round_8(srv):
    u = srv.url
    # an integer of thousands of digits: out of range, said so (was "must be an integer, got float inf")
    for name, digits in (("max_tokens", b"9" * 5000), ("seed", b"-" + b"9" * 5000), ("temperature", b"9" * 4500)):
        status, body = http(u + "/v1/completions", raw=b'{"prompt": "a", "%s": %s}' % (name.encode(), digits))
        err((status, body), 400, name)
        assert f"{len(digits.lstrip(b'-'))} digits" in body["error"]["message"], body
    # /tokenize and /detokenize check "model" as /v1/completions does
    err(http(u + "/tokenize", {"prompt": "a", "model": "x"}), 404, "model", "model_not_found")
    err(http(u + "/detokenize", {"tokens": [1], "model": "x"}), 404, "model", "model_not_found")
    assert http(u + "/tokenize", {"prompt": "a", "model": "tiny"})[0] == 200
    # a lone surrogate in /tokenize names the prompt (as /v1/completions does)
    err(http(u + "/tokenize", raw=b'{"prompt": "a\\ud800"}'), 400, "prompt")
    # a trailing slash is an unknown route (was a 307 redirect)
    assert http(u + "/v1/completions/", {"prompt": "a"})[0] == 404
    # an absolute-form target (RFC 9112: a server must accept it) is its path
    status, body = raw_exchange(srv.port, b"GET http://elsewhere/health HTTP/1.1\r\nHost: x\r\n"
                                          b"Connection: close\r\n\r\n")
    assert status == 200 and body == {"status": "ok"}
    # a chunked body past the limit gets the 413 (was a connection reset)
    big = b"".join(b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20)) for _ in range(9)) + b"0\r\n\r\n"
    status, body = raw_exchange(srv.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                          b"Connection: close\r\n\r\n" + big)
    err((status, body), 413)


# -- hostile round 9 ------------------------------------------------------------------------------------

def test_tokenizer_endpoints_cannot_starve_completions(srv, monkeypatch):
    """/tokenize and /detokenize run on a thread of their own with a bounded backlog (429 past it), and a
    completion whose prompts are long parses apart from short ones: tokenizer work or a big prompt held in
    encode() never delays a small completion (8 x 1 MB /tokenize bodies had one wait 17 s).  A /tokenize
    prompt (or /detokenize list) past MAX_TOKENIZE is a 413."""
    import gpt2asm.server as server
    gate, encode = threading.Event(), srv.state.m.encode

    def slow_encode(text):
        if text.startswith("slow"):
            gate.wait(30)
        return encode(text)
    monkeypatch.setattr(srv.state.m, "encode", slow_encode)
    monkeypatch.setattr(srv.state.tokenizer_workers, "backlog", 3)
    monkeypatch.setattr(server, "LIGHT_PROMPT", 100)
    results: list = []
    slow = [("/tokenize", {"prompt": "slow"})] * 3 + [("/v1/completions", {"prompt": "slow" + "x" * 200,
                                                                            "max_tokens": 1})]
    threads = [threading.Thread(target=lambda a=a: results.append(http(srv.url + a[0], a[1])), daemon=True)
               for a in slow]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: srv.state.tokenizer_workers.pending == 3 and srv.state.long_parse_workers.pending == 1,
                 "the slow requests did not start")
        err(http(srv.url + "/tokenize", {"prompt": "a"}), 429, code="server_busy")
        err(http(srv.url + "/detokenize", {"tokens": [1]}), 429, code="server_busy")
        t0 = time.monotonic()
        st, body = http(srv.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 5})
        assert st == 200 and body["usage"]["completion_tokens"] == 5
        assert time.monotonic() - t0 < 5, "a small completion waited behind tokenizer work"
    finally:
        gate.set()
        for t in threads:
            t.join(60)
    assert sorted(st for st, _ in results) == [200] * 4
    wait_for(lambda: srv.state.tokenizer_workers.pending == 0, "the tokenizer backlog did not empty")
    monkeypatch.setattr(server, "MAX_TOKENIZE", 10)
    err(http(srv.url + "/tokenize", {"prompt": "a" * 11}), 413, "prompt", "prompt_too_long")
    err(http(srv.url + "/detokenize", {"tokens": [1] * 11}), 413, "tokens", "prompt_too_long")
    assert http(srv.url + "/tokenize", {"prompt": "a" * 10})[1]["count"] > 0


def test_a_prompt_past_the_context_is_refused_before_tokenizing(srv, ref, monkeypatch):
    """A completion prompt of more characters than n_ctx tokens can hold is a context_length_exceeded 400
    without being tokenized (it was tokenized whole first: seconds for megabytes); a list of more prompts
    than MAX_CHOICES is refused before any is tokenized."""
    import gpt2asm.server as server
    calls = []
    encode = srv.state.m.encode
    monkeypatch.setattr(srv.state.m, "encode", lambda text: calls.append(len(text)) or encode(text))
    most = server.max_token_chars(ref.tokenizer)
    assert most == max(len(ref.tokenizer.token_bytes(i)) for i in range(ref.tokenizer.vocab_size))
    u = srv.url + "/v1/completions"
    err(http(u, {"prompt": "x" * (ref.n_ctx * most + 1), "max_tokens": 1}), 400, "prompt", "context_length_exceeded")
    err(http(u, {"prompt": ["a"] * (server.MAX_CHOICES + 1), "max_tokens": 1}), 400, "n")
    assert calls == []
    err(http(u, {"prompt": ["a b " * ref.n_ctx, "a"], "max_tokens": 1}), 400, "prompt", "context_length_exceeded")
    assert calls == [4 * ref.n_ctx]                                # the first one over: the second not tokenized


def test_stop_string_logprobs_cover_the_text(srv):
    """With a stop string, logprobs and usage.completion_tokens report the tokens whose text is at least
    partly in the returned text (the token that completed the stop string, wholly inside it, was reported
    too): "".join(tokens) starts with the text, text_offset is each token's place in it, streamed or not."""
    c = srv.client()
    kw = dict(model="tiny", prompt="Once upon a time", max_tokens=24, temperature=0, logprobs=0)
    full = c.completions.create(**kw).choices[0]
    toks, offs = full.logprobs.tokens, full.logprobs.text_offset
    assert "".join(toks) == full.text and offs == [len("".join(toks[:i])) for i in range(len(toks))]
    k = next(i for i in range(2, len(toks) - 1) if len(toks[i]) > 1 and toks[i].isascii() and toks[i + 1].isascii()
             and full.text.find(toks[i][1:]) > 0)
    stops = [toks[k] + toks[k + 1][:1],                             # a whole token, and a piece of the next
             toks[k][1:]]                                           # inside a token: it is partly in the text
    for stop in stops:
        cut = full.text.find(stop)
        assert cut > 0
        keep = sum(o < cut for o in offs)
        r = c.completions.create(**kw, stop=[stop])
        ch = r.choices[0]
        assert ch.text == full.text[:cut] and ch.finish_reason == "stop"
        assert ch.logprobs.tokens == toks[:keep] and ch.logprobs.text_offset == offs[:keep]
        assert "".join(ch.logprobs.tokens).startswith(ch.text) and len("".join(toks[:keep - 1])) < len(ch.text)
        assert r.usage.completion_tokens == keep == len(ch.logprobs.token_logprobs)
        got_toks, got_offs, text = [], [], ""
        for chunk in c.completions.create(**kw, stop=[stop], stream=True, stream_options={"include_usage": True}):
            for x in chunk.choices:
                text += x.text
                if x.logprobs:
                    got_toks += x.logprobs.tokens
                    got_offs += x.logprobs.text_offset
            if chunk.usage:
                assert chunk.usage.completion_tokens == keep
        assert (text, got_toks, got_offs) == (ch.text, toks[:keep], offs[:keep])


@pytest.mark.parametrize("first", ["SIGINT", "SIGTERM"])
def test_a_second_signal_ends_the_drain_cleanly(ckpt_tiny, first):
    """A second SIGINT (or SIGTERM then SIGINT) during the drain ends it at once: what is still generating
    finishes with "shutdown" and the stream with [DONE], no traceback, exit 0 (uvicorn's force-quit cut
    the stream without a finish_reason and logged a CancelledError traceback)."""
    import http.client
    p, url = serve_process(ckpt_tiny, "--drain-timeout", "120", "--max-batch", "8")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 1000, "n": 64,
                                                            "stream": True, "temperature": 0}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        lines = [resp.readline()]                                   # generating now
        p.send_signal(getattr(signal, first))
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        lines += resp.read().splitlines()
        assert p.wait(30) == 0 and time.monotonic() - t0 < 20
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out = p.stdout.read()
    assert "Traceback" not in out and "CancelledError" not in out, out
    events = [ln[6:] for ln in lines if ln.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    fins = {}
    for e in events[:-1]:
        for ch in json.loads(e)["choices"]:
            if ch["finish_reason"]:
                fins[ch["index"]] = ch["finish_reason"]
    assert len(fins) == 64 and "shutdown" in fins.values() and set(fins.values()) <= {"shutdown", "length"}
