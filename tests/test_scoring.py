"""Scoring (gpt2asm/scoring.py, GPT2.logprobs, python -m gpt2asm.perplexity).

Contract: per-token log-probabilities match transformers' (torch fp32) log-softmax of the same window;
the perplexity of a text longer than n_ctx matches transformers' documented sliding-window perplexity
(window n_ctx, stride S, only the new tokens of each window scored) to 1e-4 relative; the tool prints it.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, checkpoint
from gpt2asm import GPT2, InvalidArgumentError
from gpt2asm.scoring import perplexity, token_logprobs_many, windows

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

N_CTX = 64
TEXT = ("The history of computing is longer than the history of computing hardware and modern computing "
        "technology and includes the history of methods intended for pen and paper or for chalk and slate, "
        "with or without the aid of tables. Digital computing is intimately tied to the representation of "
        "numbers. But long before abstractions like the number arose, there were mathematical concepts to "
        "serve the purposes of civilization. Ünïcödé 🙂 and a few more words at the end.") * 2


@pytest.fixture(scope="module")
def ckpt_ctx(tokenizer_dir):
    """tiny, with a 64-token context: texts past n_ctx stay fast."""
    return checkpoint("tiny-ctx64", tokenizer_dir, size="tiny", n_ctx=N_CTX, seed=4, layout="hf")


def hf_sliding_ppl(path, ids: list[int], stride: int) -> tuple[float, np.ndarray]:
    """transformers' documented loop (labels -100 on the already-scored part of each window), and the
    per-token log-probs of the windows that score each token."""
    torch.set_num_threads(2)
    ref = transformers.GPT2LMHeadModel.from_pretrained(str(path), dtype=torch.float32).eval()
    x = torch.tensor([ids])
    nll_sum, n_tokens, prev_end = 0.0, 0, 0
    lp = np.full(len(ids), np.nan)
    for begin in range(0, len(ids), stride):
        end = min(begin + N_CTX, len(ids))
        trg_len = end - prev_end
        inp = x[:, begin:end]
        tgt = inp.clone()
        tgt[:, :-trg_len] = -100
        with torch.no_grad():
            out = ref(inp, labels=tgt)
        n_valid = int((tgt[:, 1:] != -100).sum())    # the targets the loss averages (after its shift;
        nll_sum += float(out.loss) * n_valid          # the docs' "- batch_size" is one too few past window 1)
        n_tokens += n_valid
        lsm = torch.log_softmax(out.logits[0].double(), -1).numpy()
        for t in range(max(prev_end, begin + 1), end):
            lp[t] = lsm[t - 1 - begin, ids[t]]
        prev_end = end
        if end == len(ids):
            break
    return math.exp(nll_sum / n_tokens), lp


def test_windows():
    assert windows(10, 64, 32) == [(0, 10, 1)]
    assert windows(100, 64, 32) == [(0, 64, 1), (32, 96, 64), (64, 100, 96)]
    spans = windows(1000, 64, 17)
    scored = [t for b, e, f in spans for t in range(f, e)]
    assert scored == list(range(1, 1000))                     # every token once, in order


@pytest.mark.parametrize("stride", [16, 32, 64])
def test_perplexity_matches_transformers(ckpt_ctx, stride):
    with GPT2.load(ckpt_ctx) as m:
        ids = m.encode(TEXT)
        assert len(ids) > 2 * N_CTX
        got = m.logprobs([TEXT], stride=stride)[0]
        want_ppl, want_lp = hf_sliding_ppl(ckpt_ctx, ids, stride)
        assert np.array_equal(np.isnan(got), np.isnan(want_lp))
        ok = ~np.isnan(got)
        assert np.abs(got[ok] - want_lp[ok]).max() < 1e-3
        assert abs(perplexity(got) / want_ppl - 1) < 1e-4, (perplexity(got), want_ppl)


def test_logprobs_forms(ckpt_ctx):
    with GPT2.load(ckpt_ctx) as m:
        ids = m.encode("Hello world, this is a test.")
        a, b, c = m.logprobs(["Hello world, this is a test.", ids, [5]])
        assert np.array_equal(a, b, equal_nan=True) and len(a) == len(ids) and np.isnan(a[0]) and (a[1:] < 0).all()
        assert len(c) == 1 and np.isnan(c[0])
        full = m.logits(ids).astype(np.float64)                       # within n_ctx: one window
        lse = np.log(np.exp(full - full.max(1, keepdims=True)).sum(1)) + full.max(1)
        assert np.allclose(a[1:], full[np.arange(len(ids) - 1), ids[1:]] - lse[:-1], atol=1e-9)
        assert token_logprobs_many(m, [ids], stride=N_CTX)[0].shape == (len(ids),)
        for bad in ("text", [1.5], [[-1]], None):
            with pytest.raises(InvalidArgumentError):
                m.logprobs(bad)
        with pytest.raises(InvalidArgumentError):
            m.logprobs([ids], stride=0)


def test_perplexity_tool(ckpt_ctx, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(TEXT, encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "gpt2asm.perplexity", "--model", str(ckpt_ctx), "--stride", "32",
                        str(f)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    with GPT2.load(ckpt_ctx) as m:
        want = perplexity(m.logprobs([TEXT], stride=32))
    assert f"perplexity {want:.4f}" in r.stdout and "tokens/s" in r.stdout
    assert "tokens" in r.stderr                                         # the progress bar
    r = subprocess.run([sys.executable, "-m", "gpt2asm.perplexity", "--model", str(ckpt_ctx),
                        str(tmp_path / "missing.txt")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    with open("/dev/full", "w") as full:                                 # a full stdout: one line, status 2
        r = subprocess.run([sys.executable, "-m", "gpt2asm.perplexity", "--model", str(ckpt_ctx), "-q", str(f)],
                           stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("gpt2asm.perplexity: error: cannot write to standard output")


def test_perplexity_tool_closed_streams(ckpt_ctx, tmp_path):
    """Descriptors closed at start (`<&-`, `>&-`, `2>&-`) or stderr full: stdin / stdout closed is one line
    and status 2; a closed or full stderr loses the progress bar and the messages, never the result."""
    f = tmp_path / "t.txt"
    f.write_text(TEXT, encoding="utf-8")
    cmd = f'"{sys.executable}" -m gpt2asm.perplexity --model "{ckpt_ctx}" --stride 32'

    def sh(line: str) -> subprocess.CompletedProcess:
        return subprocess.run(line, shell=True, capture_output=True, text=True, cwd=ROOT, timeout=300)
    for line, what in ((f"{cmd} -q - <&-", "cannot read stdin: it is closed"),
                       (f'{cmd} -q "{f}" >&-', "standard output is closed")):
        r = sh(line)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (line, r.stderr)
        assert r.stderr.strip().splitlines() == [f"gpt2asm.perplexity: error: {what}"
                                                 + ("; nowhere to write the result" if ">&-" in line else "")]
    for line in (f'{cmd} "{f}" 2>&-', f'{cmd} "{f}" 2>/dev/full'):         # the progress bar on
        r = sh(line)
        assert r.returncode == 0 and r.stdout.startswith("perplexity ") and "tokens/s" in r.stdout, (line, r)


def test_perplexity_tool_reads_a_fifo(ckpt_ctx, tmp_path):
    """A FIFO is read as a pipe is, but open() waits for its writer: the tool says it is waiting (it used to
    sit silent), then scores what the writer sends."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs")
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-m", "gpt2asm.perplexity", "--model", str(ckpt_ctx), "--stride", "32",
                          str(fifo)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        first = p.stderr.readline()                                       # before any writer exists
        assert "is a FIFO: waiting for a writer" in first, first
        with open(fifo, "w", encoding="utf-8") as w:
            w.write(TEXT)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and out.startswith("perplexity "), err


def test_picked_log_softmax_is_log_softmax_bit_for_bit():
    """The scorer takes only the picked entries of the float64 log-softmax (scoring.picked_log_softmax):
    the same bits as indexing log_softmax's whole array, over shapes, scales and extremes."""
    from gpt2asm.scoring import log_softmax, picked_log_softmax
    rng = np.random.default_rng(5)
    for shape in [(1, 1), (1, 7), (11, 50257), (300, 1000)]:
        for scale in (1.0, 30.0, 1e3, 1e30):
            rows = (rng.standard_normal(shape) * scale).astype(np.float32)
            picks = rng.integers(0, shape[1], shape[0])
            want = log_softmax(rows)[np.arange(shape[0]), picks]
            assert picked_log_softmax(rows, picks).tobytes() == want.tobytes(), (shape, scale)
