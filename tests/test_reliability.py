"""Issue 19's list: ways a hostile (or unlucky) user could crash, hang or silently mislead gpt2asm, each
pinned by a test: files changed under a running model, non-regular and oversized files, snapshots from
other weights, tiny temperatures, one session used twice at once, tracebacks instead of the one-line
error, killed cache writers' leftovers; and the first run (`make run`'s model, the dependencies)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from gpt2asm import GPT2, CheckpointError, GPT2AsmError, InvalidArgumentError, ModelNotFoundError
import gpt2asm.tilecache as tc

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, env=None, cwd=ROOT, timeout=120, **kw):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GPT2ASM_", "HF_"))}
    e.update(HF_HUB_OFFLINE="1", HF_HOME=str(ROOT / ".cache" / "no-hf-home"), PYTHONPATH=str(ROOT),
             GPT2ASM_CACHE="off")
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpt2asm", *args], capture_output=True, text=True, env=e,
                          cwd=cwd, timeout=timeout, **kw)


def one_line_error(r, pattern: str = "") -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith(("[gpt2asm] note", "  "))]
    assert len(lines) == 1 and lines[0].startswith("gpt2asm: error: "), r.stderr
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


@pytest.fixture
def model_copy(ckpt_tiny, tmp_path) -> Path:
    d = tmp_path / "model"
    shutil.copytree(ckpt_tiny, d)
    return d


def align_wte(d: Path) -> None:
    """Pad the safetensors header (with spaces, as the format allows) so that wte's data starts on a
    64-byte boundary of the file: the case where a loader may use it in place, straight from the mapping."""
    p = d / "model.safetensors"
    raw = p.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    header, data = raw[8:8 + n].rstrip(b" "), raw[8 + n:]
    begin = json.loads(header)["transformer.wte.weight"]["data_offsets"][0]
    pad = (-(8 + len(header) + begin)) % 64
    p.write_bytes(struct.pack("<Q", len(header) + pad) + header + b" " * pad + data)


# -- 1. a checkpoint rewritten under a running model ----------------------------------------------------

RUN_THEN_TRUNCATE = r"""
import os, sys, time
from gpt2asm import GPT2
d = sys.argv[1]
m = GPT2.load(d, threads=2)
a = m.generate("x", max_new_tokens=4, temperature=0)
if m.model.resident is not None:
    m.model.resident.wait(60)
m.generate("x", max_new_tokens=2, temperature=0)          # adopts the packed copies
os.truncate(os.path.join(d, "model.safetensors"), 4096)   # what `cp new.safetensors model.safetensors` does first
b = m.generate("x", max_new_tokens=4, temperature=0)
s = m.session(); s.generate("y", max_new_tokens=2, seed=1); m.session(s.snapshot())
print(a == b)
"""


@pytest.mark.parametrize("cache,resident", [("off", "1"), ("cold-then-warm", "1"), ("off", "0")])
def test_checkpoint_truncated_under_a_running_model(model_copy, tmp_path, cache, resident):
    """Nothing the loaded model reads is a view of model.safetensors: truncating it (SIGBUS before) does not
    kill the model, nor change its text.  With a warm tile cache the matrices come from the cache file
    (packed into RAM in the background; with GPT2ASM_RESIDENT=0 they stay mapped: README)."""
    align_wte(model_copy)
    env = dict(PYTHONPATH=str(ROOT), GPT2ASM_RESIDENT=resident, HF_HUB_OFFLINE="1",
               GPT2ASM_CACHE="off" if cache == "off" else str(tmp_path / "tiles"))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("GPT2ASM_", "HF_"))}, **env}
    if cache != "off":                                     # write the tile cache first; the run is warm
        os.utime(model_copy / "model.safetensors", (time.time() - 10,) * 2)
        subprocess.run([sys.executable, "-c", "import sys; from gpt2asm import GPT2; GPT2.load(sys.argv[1])",
                        str(model_copy)], env=env, check=True, timeout=120)
    r = subprocess.run([sys.executable, "-c", RUN_THEN_TRUNCATE, str(model_copy)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "True"


# -- 2. only regular files of bounded size are read -------------------------------------------------------

def test_config_json_fifo_does_not_hang(model_copy):
    (model_copy / "config.json").unlink()
    os.mkfifo(model_copy / "config.json")
    r = cli("--model", str(model_copy), "-n", "1", "hi", timeout=60)
    one_line_error(r, "config.json.* not a regular file")


def test_config_json_link_to_dev_zero_is_refused(model_copy):
    (model_copy / "config.json").unlink()
    os.symlink("/dev/zero", model_copy / "config.json")
    r = cli("--model", str(model_copy), "-n", "1", "hi", timeout=60,
            preexec_fn=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_AS, (4 << 30,) * 2))
    one_line_error(r, "config.json.* not a regular file")


def test_oversized_config_json_is_refused(model_copy):
    c = json.loads((model_copy / "config.json").read_text())
    c["padding"] = "x" * (17 << 20)                        # valid JSON, absurd size
    (model_copy / "config.json").write_text(json.dumps(c))
    with pytest.raises(CheckpointError, match="limit"):
        GPT2.load(model_copy)


def test_non_regular_files_are_refused_by_the_readers(tmp_path):
    from gpt2asm import safefs
    os.mkfifo(tmp_path / "fifo")
    for p, why in ((tmp_path / "fifo", "not a regular file"), (Path("/dev/zero"), "not a regular file"),
                   (tmp_path, "not a regular file"), (tmp_path / "nope", "not found")):
        with pytest.raises(CheckpointError, match=why):
            safefs.read_bytes(p, 1 << 20, CheckpointError, "test file")
    (tmp_path / "big").write_bytes(b"x" * 100)
    with pytest.raises(CheckpointError, match="limit"):
        safefs.read_bytes(tmp_path / "big", 99, CheckpointError, "test file")
    assert safefs.read_bytes(tmp_path / "big", 100, CheckpointError, "test file") == b"x" * 100


# -- 3. snapshots only into the very same weights ---------------------------------------------------------

def _scale_tensor(d: Path, name: str, factor: float) -> None:
    p = d / "model.safetensors"
    raw = p.read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    h = json.loads(raw[8:8 + n])
    b, e = h[name]["data_offsets"]
    data = bytearray(raw[8 + n:])
    data[b:e] = (np.frombuffer(bytes(data[b:e]), np.float32) * np.float32(factor)).astype(np.float32).tobytes()
    p.write_bytes(raw[:8 + n] + bytes(data))


def test_snapshot_from_other_weights_is_refused(ckpt_tiny, model_copy):
    _scale_tensor(model_copy, "transformer.h.0.attn.c_attn.weight", 1.5)
    with GPT2.load(ckpt_tiny) as a, GPT2.load(model_copy) as b:
        s = a.session()
        s.generate("Hello there", max_new_tokens=3, seed=1)
        blob = s.snapshot()
        assert a.session(blob).tokens == s.tokens               # its own model takes it
        with pytest.raises(InvalidArgumentError, match="another model"):
            b.session(blob)


def test_fingerprint_is_remembered_per_checkpoint(ckpt_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2ASM_CACHE", str(tmp_path / "tiles"))
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    with GPT2.load(ckpt_tiny) as a:
        fp = a.fingerprint()
    calls = []
    real = tc._arrays_digest
    monkeypatch.setattr(tc, "_arrays_digest", lambda *x: calls.append(1) or real(*x))
    with GPT2.load(ckpt_tiny) as b:                            # warm: the digest is read back, not recomputed
        assert b.fingerprint() == fp and not calls
    with GPT2.load(ckpt_tiny, kv="f16") as c:                  # another KV dtype: another fingerprint
        assert c.fingerprint() != fp and calls


# -- 4. tiny temperatures and repetition penalties --------------------------------------------------------

def test_tiny_temperature_is_greedy_everywhere(ckpt_tiny):
    with GPT2.load(ckpt_tiny) as m:
        ids = m.encode("Hi")
        greedy = list(m.generate_ids(ids, 3, temperature=0))
        for t in (1e-300, 1e-39, 5e-5):
            assert list(m.generate_ids(ids, 3, temperature=t, seed=1)) == greedy, t
            assert m.generate("Hi", 3, temperature=t, seed=1) == m.generate("Hi", 3, temperature=0)
        with pytest.raises(InvalidArgumentError, match="repetition_penalty"):
            m.generate("Hi", 3, repetition_penalty=1e-40)
    r0 = cli("--model", str(ckpt_tiny), "-t", "0", "-n", "3", "--seed", "1", "-i", "Hi")
    r1 = cli("--model", str(ckpt_tiny), "-t", "1e-39", "-n", "3", "--seed", "1", "-i", "Hi")
    assert r0.returncode == r1.returncode == 0 and r1.stdout == r0.stdout and "Warning" not in r1.stderr
    one_line_error(cli("--model", str(ckpt_tiny), "--repetition-penalty", "1e-40", "-n", "3", "Hi"),
                   "repetition_penalty")


def test_one_rule_for_the_sampler_too():
    from gpt2asm.sampler import Sampler, tiny_value_rule
    assert tiny_value_rule(1e-39, 1.0) == (0.0, 1.0) and tiny_value_rule(0.5, 1.1) == (0.5, 1.1)
    s = Sampler(lambda z: z, temperature=1e-39, seed=1)
    z = np.array([1.0, 3.0, 2.0], np.float32)
    assert s.temperature == 0.0 and s(z) == 1
    with pytest.raises(InvalidArgumentError):
        Sampler(lambda z: z, repetition_penalty=1e-40)


# -- 5. one session, one user at a time ----------------------------------------------------------------

def test_two_live_generators_on_one_session(ckpt_tiny):
    from gpt2asm import SessionBusyError
    with GPT2.load(ckpt_tiny) as m:
        want = list(m.generate_ids(m.encode("One two"), 5, temperature=0))
        s = m.session()
        g1 = s.generate_ids(m.encode("One two"), 5, temperature=0)
        first = next(g1)
        g2 = s.generate_ids(m.encode("Three"), 5, temperature=0)
        with pytest.raises(SessionBusyError):
            next(g2)
        with pytest.raises(SessionBusyError):
            s.snapshot()
        assert [first, *g1] == want                          # the first user's text is untouched
        assert list(s.generate_ids(m.encode("One two"), 5, temperature=0)) == want   # free again


def test_two_threads_on_one_session_never_give_wrong_text(ckpt_tiny):
    from gpt2asm import SessionBusyError
    with GPT2.load(ckpt_tiny) as m:
        prompts = ["The cat sat on", "A B C D E F"]
        want = {p: m.generate(p, max_new_tokens=12, temperature=0) for p in prompts}
        s = m.session()
        for _ in range(10):
            got, barrier = {}, threading.Barrier(2)

            def run(p):
                barrier.wait()
                try:
                    got[p] = s.generate(p, max_new_tokens=12, temperature=0)
                except SessionBusyError:
                    got[p] = None
            ts = [threading.Thread(target=run, args=(p,)) for p in prompts]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            assert any(v is not None for v in got.values())
            for p, v in got.items():
                assert v is None or v == want[p], (p, v, want[p])



def test_two_threads_batching_on_one_model_keep_their_rows(ckpt_tiny, monkeypatch):
    """GPT2.generate of a list from two threads on one model: both step through the model's one batched
    plan, whose row table is shared.  The other thread's whole step_batch is let in between this one's
    set_batch and its run (or, as it must, made to wait): each still gets its own rows' logits."""
    with GPT2.load(ckpt_tiny) as m:
        M = m.model
        if not M.k.has_batch:
            pytest.skip(f"{M.k.family}: no batched decode executor")
        if M.resident is not None:          # adopting the resident copy (once) rebuilds the plans: before
            M.resident.wait(60)             # the plan below is built, not between its steps

        def states(*prompts):
            out = [M.new_state() for _ in prompts]
            for st, ids in zip(out, prompts):
                M.prefill(st, ids)
            return out

        def alone(prompts, toks):
            return [M.step(st, t)[0].copy() for st, t in zip(states(*prompts), toks)]
        mine, theirs = ([1, 2, 3], [7]), ([9], [5, 6])
        want_mine, want_theirs = alone(mine, [4, 8]), alone(theirs, [10, 11])
        M.step_batch(states([1], [2]), [3, 4])                      # builds the batched plan
        plan, other = M.batch_plan, {}
        run = plan.run

        def run_after_the_other(*a):
            if not other:                                           # this thread's run: let the other in
                other["t"] = threading.Thread(
                    target=lambda: other.update(out=[x.copy() for x in M.step_batch(states(*theirs), [10, 11])[0]]))
                other["t"].start()
                other["t"].join(1.0)                                # it waits for the lock (or finishes)
            return run(*a)
        monkeypatch.setattr(plan, "run", run_after_the_other)
        got = [x.copy() for x in M.step_batch(states(*mine), [4, 8])[0]]
        other["t"].join(60)
        assert all(np.array_equal(g, w) for g, w in zip(got, want_mine))
        assert all(np.array_equal(g, w) for g, w in zip(other["out"], want_theirs))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_forked_child_runs_the_model(ckpt_tiny, threads):
    """fork() copies only the calling thread: the -j workers are gone in the child (a child of a -j 2 model
    used to hang in its first step).  The child gets a fresh pool (kernels.py) and computes what the
    parent does: the same greedy text, the same scores, alone and batched."""
    sys.path.insert(0, str(ROOT / "tests"))
    from forked import run_forked
    with GPT2.load(ckpt_tiny, threads=threads) as m:
        prompts = ["The cat sat on", "A B C"]

        def results():
            return ([m.generate(p, max_new_tokens=8, temperature=0) for p in prompts],
                    m.generate(prompts, max_new_tokens=8, temperature=0),
                    [a.tobytes() for a in m.logprobs(prompts)])
        want = results()

        def check():                                         # workers start with the child's first plan
            return (m.model.k.pool_stats()["workers"] == 0 and results() == want
                    and m.model.k.pool_stats()["workers"] == threads - 1)
        run_forked(check, timeout=120)
        assert results() == want                             # and the parent's pool is untouched


class _RefusedThread(threading.Thread):
    """A thread the system refuses (as under a tight RLIMIT_AS or thread limit) when it is the -j pool's
    worker `refuse` or later (kernels.py names them gpt2asm-worker-<tid>; pool.py gpt2asm-<i>)."""
    refuse = 3

    def start(self):
        tid = self.name.rsplit("-", 1)[-1]
        if self.name.startswith("gpt2asm-") and tid.isdigit() and int(tid) >= self.refuse:
            raise RuntimeError("can't start new thread")
        super().start()


def test_a_refused_worker_thread_is_a_typed_error(ckpt_tiny, monkeypatch):
    """-j N whose workers the system will not start: ResourceError naming -j, the workers that did start
    stopped and joined (none left parked), and the same model loads once threads can be had."""
    from gpt2asm import ResourceError
    from gpt2asm.kernels import Kernels
    monkeypatch.setattr(threading, "Thread", _RefusedThread)

    def workers():
        return [t for t in threading.enumerate() if t.name.startswith("gpt2asm-")]
    before = workers()
    for make in (lambda: Kernels(threads=5), lambda: GPT2.load(ckpt_tiny, threads=5)):
        with pytest.raises(ResourceError, match="-j 5"):
            make()
        assert workers() == before
    monkeypatch.undo()
    with GPT2.load(ckpt_tiny, threads=5) as m:
        assert m.generate("Hi", max_new_tokens=4, temperature=0) == GPT2.load(ckpt_tiny).generate(
            "Hi", max_new_tokens=4, temperature=0)


def test_cli_threads_beyond_the_address_space(ckpt_tiny):
    """-j 256 under a 1 GiB address-space limit (255 thread stacks do not fit): one line, status 2."""
    resource = pytest.importorskip("resource")

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    r = cli("--model", str(ckpt_tiny), "-n", "3", "-j", "2", "Hello", preexec_fn=limit)
    if r.returncode != 0:
        pytest.skip(f"-j 2 does not run in 1 GiB of address space here: {r.stderr[-300:]}")
    one_line_error(cli("--model", str(ckpt_tiny), "-n", "3", "-j", "256", "Hello", preexec_fn=limit),
                   r"cannot start the 255 worker thread\(s\) of -j 256: .*use a smaller -j")


_EDGE_OF_THE_ADDRESS_SPACE = r"""
import resource, threading, sys
from gpt2asm.pool import _stack_bytes, start_thread
def mapped():
    return next(int(ln.split()[1]) << 10 for ln in open("/proc/self/status") if ln.startswith("VmSize"))
# Room for the new thread's stack and one page: CPython maps the stack, then its first frame fails with
# MemoryError inside the new thread, and a plain Thread.start() waits for ever.
resource.setrlimit(resource.RLIMIT_AS, (mapped() + _stack_bytes() + 4096, resource.RLIM_INFINITY))
try:
    start_thread(threading.Thread(target=lambda: None, daemon=True))
except RuntimeError as e:
    print("refused:", e)
"""


def test_a_thread_at_the_edge_of_the_address_space_is_refused_not_waited_for():
    """Where RLIMIT_AS leaves room for a thread's stack and no more, starting it is refused up front
    (pool.start_thread): the -j pools' workers once hung the CLI there (a fresh-clone CI run)."""
    pytest.importorskip("resource")
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to place the limit")
    r = subprocess.run([sys.executable, "-c", _EDGE_OF_THE_ADDRESS_SPACE], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0 and "Exception ignored" not in r.stderr, (r.stdout, r.stderr)
    assert r.stdout.startswith("refused: no address space left for another thread"), r.stdout


def test_a_forked_child_refused_its_workers_gets_a_typed_error(ckpt_tiny, monkeypatch):
    """In a fork()ed child the workers start with its first plan: refused there, that plan raises
    ResourceError (not a hang in the fork handler), and the next one tries again."""
    from gpt2asm import ResourceError
    sys.path.insert(0, str(ROOT / "tests"))
    from forked import run_forked
    with GPT2.load(ckpt_tiny, threads=5) as m:
        want = m.generate("Hi", max_new_tokens=4, temperature=0)

        def check():
            monkeypatch.setattr(threading, "Thread", _RefusedThread)
            try:
                m.generate("Hi", max_new_tokens=4, temperature=0)
                return False
            except ResourceError:
                pass
            monkeypatch.undo()
            return (m.generate("Hi", max_new_tokens=4, temperature=0) == want
                    and m.model.k.pool_stats()["workers"] == 4)
        run_forked(check, timeout=120)


def test_a_kv_cache_the_memory_refuses_fails_its_sequence_alone(ckpt_tiny, monkeypatch):
    """Memory refused for a new sequence's KV cache (RLIMIT_AS, a full machine) ends that sequence with a
    ResourceError; the sequences already running go on to their own text (one failed allocation in the
    scheduler's step ended every running sequence, of every request, with 'internal error (MemoryError)').
    A batched GPT2.generate raises the ResourceError, and the model works once memory is back."""
    import gpt2asm.state as st
    from gpt2asm import ResourceError
    from gpt2asm.scheduler import Scheduler, SeqSpec
    with GPT2.load(ckpt_tiny) as m:
        alone = m.generate("Hello", max_new_tokens=12, temperature=0)
        sched = Scheduler(m, max_batch=16, max_queue=4)
        ev1, ev2 = [], []
        sched.submit([SeqSpec(m.encode("Hello"), 12, dict(temperature=0))], callback=ev1.append)
        sched.step()
        sched.step()                                   # running, its cache in hand

        def refused(*a, **k):
            raise MemoryError("Unable to allocate 2.0 MiB for an array")
        monkeypatch.setattr(st, "aligned_zeros", refused)
        sched.submit([SeqSpec(m.encode("Hi"), 5, dict(temperature=0, seed=k)) for k in range(8)],
                     callback=ev2.append)
        sched.run()
        assert [e.finish_reason for e in ev1 if e.finish_reason] == ["length"]
        assert "".join(e.text for e in ev1) == alone
        errs = [e for e in ev2 if e.finish_reason == "error"]
        assert len([e for e in ev2 if e.finish_reason]) == 8 and errs
        assert all(isinstance(e.exception, ResourceError) and "out of memory" in e.error for e in errs)
        with pytest.raises(ResourceError, match="out of memory"):
            m.generate(["a", "b", "c", "d", "e", "f", "g", "h"] * 4, max_new_tokens=3, temperature=0)
        monkeypatch.undo()
        assert m.generate("Hello", max_new_tokens=12, temperature=0) == alone
        assert m.generate(["Hello"] * 3, max_new_tokens=12, temperature=0) == [alone] * 3


# -- 6. the one-line error, never a traceback ---------------------------------------------------------------

def test_cache_max_gb_inf(ckpt_tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    monkeypatch.setenv("GPT2ASM_CACHE_MAX_GB", "inf")
    w, info = tc.load_weights_info(ckpt_tiny, "f32", tmp_path / "tiles")
    assert info.status == "built"
    for v, want in (("inf", 1 << 62), ("nan", tc.MAX_BYTES_DEFAULT), ("-1", tc.MAX_BYTES_DEFAULT),
                    ("1e300", 1 << 62), ("2", 2 << 30), ("x", tc.MAX_BYTES_DEFAULT)):
        monkeypatch.setenv("GPT2ASM_CACHE_MAX_GB", v)
        assert tc._max_bytes() == want, v


@pytest.mark.parametrize("where", ["--model", "GPT2ASM_MODEL", "GPT2ASM_CACHE"])
def test_unknown_user_in_a_path(ckpt_tiny, where):
    bad = "~nouser-gpt2asm-test/x"
    if where == "--model":
        r = cli("--model", bad, "-n", "1", "hi")
    elif where == "GPT2ASM_MODEL":
        r = cli("-n", "1", "hi", env={"GPT2ASM_MODEL": bad})
    else:
        r = cli("--model", str(ckpt_tiny), "-n", "1", "hi", env={"GPT2ASM_CACHE": bad})
    one_line_error(r, "nouser-gpt2asm-test")


def test_very_long_model_path():
    one_line_error(cli("--model", "a" * 5000, "-n", "1", "hi"), "too long")
    with pytest.raises(ModelNotFoundError):
        GPT2.load("b" * 5000)
    with pytest.raises(ModelNotFoundError):
        GPT2.load("/" + "c/" * 3000)


@pytest.mark.parametrize("path", ["gpt2\0x", "models/x\0.gguf", "~\0", "/tmp/\0/model.safetensors"])
def test_nul_in_a_model_path(path):
    """os.stat raises ValueError on a NUL (no file has one): the API says so as for any bad path."""
    with pytest.raises(InvalidArgumentError, match="NUL"):
        GPT2.load(path, download=False)


def test_unreadable_model_directory(model_copy, monkeypatch):
    """Root reads everything, so the refusal is simulated where the system would give it: every stat or
    open under the directory fails with EACCES."""
    import pathlib
    root = str(model_copy)

    def deny(real):
        def f(self, *a, **k):
            if str(self).startswith(root + "/"):
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *a, **k)
        return f
    for name in ("stat", "is_file", "is_dir", "exists"):
        monkeypatch.setattr(pathlib.Path, name, deny(getattr(pathlib.Path, name)))
    with pytest.raises(GPT2AsmError, match="Permission denied"):
        GPT2.load(model_copy)


def test_stdout_full_or_closed(ckpt_tiny):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GPT2ASM_", "HF_"))}
    e.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", GPT2ASM_CACHE="off")
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "gpt2asm", "--model", str(ckpt_tiny), "-n", "3", "-t", "0", "hi"],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=e, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("gpt2asm: error: cannot write to standard output"), r.stderr
    r = subprocess.run(f'"{sys.executable}" -m gpt2asm --model "{ckpt_tiny}" -n 3 -t 0 hi >&-', shell=True,
                       capture_output=True, text=True, env=e, timeout=120)
    one_line_error(r, "standard output is closed")


def test_stderr_closed_or_full(ckpt_tiny):
    """stderr closed at start (`2>&-`) or full: the notes (random weights) and the stats line are lost,
    never the text on stdout or the exit status."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GPT2ASM_", "HF_"))}
    e.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", GPT2ASM_CACHE="off")
    outs = set()
    for redirect in ("2>&-", "2>/dev/full"):
        r = subprocess.run(f'"{sys.executable}" -m gpt2asm --model "{ckpt_tiny}" -n 3 -t 0 hi {redirect}',
                           shell=True, capture_output=True, text=True, env=e, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("hi") and r.stdout.endswith("\n"), (redirect, r)
        outs.add(r.stdout)
    assert len(outs) == 1


def test_ctrl_c_during_start_up(ckpt_tiny):
    """Ctrl-C at any moment of the start-up: never a traceback through gpt2asm's code (its imports of
    numpy and the library, argument parsing, loading).  Before the interpreter reaches gpt2asm at all --
    its own site import, runpy compiling __main__ -- a Ctrl-C is Python's to report, not ours."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GPT2ASM_", "HF_"))}
    e.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", GPT2ASM_CACHE="off")
    ours = re.compile(r'File "[^"]*[/\\]gpt2asm[/\\][^"]*"')
    for delay in (0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.12, 0.14, 0.16, 0.2, 0.25, 0.3, 0.4):
        p = subprocess.Popen([sys.executable, "-m", "gpt2asm", "--model", str(ckpt_tiny), "-n", "200", "hi"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
        assert not ours.search(err), (delay, err)
        if "Traceback" not in err:
            assert p.returncode in (130, -signal.SIGINT, 0), (delay, p.returncode, err)


# -- 7. killed cache writers -----------------------------------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", os.uname().nodename)[:64] or "host"


def test_dead_writers_temp_files_are_removed_and_live_ones_counted(ckpt_tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(tc, "RACY_SECONDS", 0.0)
    cdir = tmp_path / "tiles"
    cdir.mkdir()
    dead = cdir / f".gpt2-0123.f32.L1F1.tiles.w-{_host()}-{_dead_pid()}.abc123xy.tmp"
    dead.write_bytes(b"\0" * (1 << 20))                     # fresh: the age rule alone would keep it an hour
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = cdir / f".gpt2-4567.f32.L1F1.tiles.w-{_host()}-{sleeper.pid}.zz99yy88.tmp"
        assert tc.load_weights_info(ckpt_tiny, "f32", cdir)[1].status == "built"
        assert not dead.exists()
        first = next(cdir.glob("*.tiles"))
        os.utime(first, (time.time() - 100,) * 2)
        size = first.stat().st_size
        live.write_bytes(b"\0" * size)                      # a live writer's file, as big as a cache
        monkeypatch.setenv("GPT2ASM_CACHE_MAX_GB", str(2.5 * size / (1 << 30)))
        other = tmp_path / "other"
        shutil.copytree(ckpt_tiny, other)
        os.utime(other / "model.safetensors", (time.time() - 100,) * 2)
        assert tc.load_weights_info(other, "f32", cdir)[1].status == "built"
        assert live.exists()                                # its writer lives: kept ...
        assert not first.exists()                           # ... and counted: 3 x size > 2.5 x size
    finally:
        sleeper.kill()
        sleeper.wait()


def test_cache_writers_name_themselves(tmp_path):
    p = tmp_path / "x.f32.L1F1.tiles"
    name = tc.temp_prefix(p) + "abcdefgh.tmp"
    assert name.startswith(".x.f32.L1F1.tiles.") and f"-{os.getpid()}." in name
    assert not tc._writer_gone(name)                        # this process: alive


# -- the first run -----------------------------------------------------------------------------------------

def test_huggingface_hub_is_a_dependency():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"huggingface[_-]hub\b", d) for d in deps), deps


def test_make_run_picks_the_random_checkpoint_only_without_gpt2(tmp_path, tokenizer_dir):
    """tools/pick_model.py (make run): with no gpt2 anywhere and no hub (a closed local port), the random
    checkpoint, quickly and with a note; with gpt2 in the Hugging Face cache, that one."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GPT2ASM_", "HF_"))}
    e.update(PYTHONPATH=str(ROOT), HF_HOME=str(tmp_path / "hf"), GPT2ASM_CACHE=str(tmp_path / "own"),
             HF_ENDPOINT="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost")
    fb = tmp_path / "random"
    shutil.copytree(tokenizer_dir, fb)
    from make_checkpoint import make_checkpoint
    make_checkpoint(fb, size="tiny", seed=0, tokenizer_dir=tokenizer_dir)
    pick = [sys.executable, str(ROOT / "tools" / "pick_model.py")]
    r = subprocess.run(pick + ["auto", "--fallback", str(fb)], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(fb) and "randomly initialised" in r.stderr
    assert "Retrying" not in r.stderr                      # no half-minute of retries against a dead hub
    assert subprocess.run(pick + ["some/dir"], capture_output=True, text=True, env=e).stdout.strip() == "some/dir"
    from gpt2asm import hub
    snap = tmp_path / "hf" / "hub" / "models--openai-community--gpt2" / "snapshots" / hub.PINS["openai-community/gpt2"].revision
    shutil.copytree(fb, snap)
    pins = tmp_path / "pins.json"
    import hashlib
    pins.write_text(json.dumps({"openai-community/gpt2": {"revision": snap.name, "files": {
        f: {"sha256": hashlib.sha256((snap / f).read_bytes()).hexdigest(), "size": (snap / f).stat().st_size}
        for f in hub.FILES}}}))
    r = subprocess.run(pick + ["auto", "--fallback", str(fb)], capture_output=True, text=True,
                       env={**e, "GPT2ASM_HUB_PINS": str(pins)}, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == str(snap), r.stderr


def test_unreachable_hub_is_found_out_quickly(tmp_path, monkeypatch):
    from gpt2asm import hub
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
              "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("GPT2ASM_CACHE", str(tmp_path / "own"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")       # nothing listens there
    import huggingface_hub
    calls = []

    def no_call(*a, **k):                                          # it would retry for half a minute
        calls.append(a)
        raise AssertionError("huggingface_hub was asked although the hub cannot be reached")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_call)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", no_call)
    with pytest.raises(ModelNotFoundError, match="cannot reach the hub"):
        hub.download("openai-community/gpt2", progress=False)
    assert not calls


def test_hub_cache_fifo_is_not_hashed(ckpt_tiny, tmp_path):
    """A cached snapshot whose config.json links to a FIFO named as a content hash: refused, not waited on."""
    snap = tmp_path / "hf" / "hub" / "models--openai-community--gpt2" / "snapshots" / ("a" * 40)
    blobs = tmp_path / "hf" / "hub" / "models--openai-community--gpt2" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in ("model.safetensors", "vocab.json", "merges.txt"):
        shutil.copy(ckpt_tiny / f, snap / f)
    os.mkfifo(blobs / ("0" * 64))
    os.symlink(blobs / ("0" * 64), snap / "config.json")
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GPT2ASM_", "HF_"))}
    e.update(PYTHONPATH=str(ROOT), HF_HOME=str(tmp_path / "hf"), GPT2ASM_CACHE=str(tmp_path / "own"))
    r = subprocess.run([sys.executable, "-c", "from gpt2asm import hub; d, looked = "
                        "hub.find_cached('openai-community/gpt2'); print(d); print(*looked, sep='\\n')"],
                       capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "None", r
    assert "not a regular file" in r.stdout
