"""python -m gpt2asm: output, repeatability, flags, errors."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2asm import GPT2

ROOT = Path(__file__).resolve().parent.parent
STATS = re.compile(r"^\[gpt2asm\] (\d+) prompt \+ (\d+) generated tokens, [\d.]+ tok/s \((\w+), (fp32|fp16|q8_0|q4_0), -j (\d+)")


def cli(*args, env=None, cwd=ROOT):
    e = dict(os.environ)
    e.pop("GPT2ASM_MODEL", None)
    # never the network, never a model from this machine's caches (tests/test_hub.py covers those)
    e.update(HF_HUB_OFFLINE="1", HF_HOME=str(ROOT / ".cache" / "no-hf-home"),
             GPT2ASM_CACHE=str(ROOT / ".cache" / "no-gpt2asm-cache"))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpt2asm", *args], capture_output=True, text=True,
                          env=e, cwd=cwd, timeout=300)


def test_greedy_run(ckpt_tiny):
    prompt = "Alan Turing theorized that computers would one day become"
    r = cli("--model", str(ckpt_tiny), "-n", "20", "-t", "0", prompt)
    assert r.returncode == 0, r.stderr
    want = GPT2.load(ckpt_tiny).generate(prompt, max_new_tokens=20, temperature=0)
    assert r.stdout == prompt + want + "\n"
    m = STATS.match(r.stderr.strip().splitlines()[-1])
    assert m and m.group(1) == "10" and m.group(2) == "20" and m.group(4) == "fp32" and m.group(5) == "1"
    assert "random" in r.stderr                          # says plainly that the weights are random
    assert cli("--model", str(ckpt_tiny), "-n", "20", "-t", "0", prompt).stdout == r.stdout


def test_seeded_sampling_repeatable(ckpt_tiny):
    args = ("--model", str(ckpt_tiny), "-n", "25", "-t", "0.9", "--top-k", "40", "--top-p", "0.95",
            "--repetition-penalty", "1.1", "--seed", "1234", "Once upon a time")
    a, b = cli(*args), cli(*args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    want = GPT2.load(ckpt_tiny).generate("Once upon a time", max_new_tokens=25, temperature=0.9, top_k=40,
                                         top_p=0.95, repetition_penalty=1.1, seed=1234)
    assert a.stdout == "Once upon a time" + want + "\n"


def test_ids_mode_fp16_threads(ckpt_tiny):
    r = cli("--model", str(ckpt_tiny), "-i", "-h", "-j", "2", "-n", "8", "-t", "0", "Hello world")
    assert r.returncode == 0, r.stderr
    l1, l2 = r.stdout.splitlines()
    m = GPT2.load(ckpt_tiny, dtype="f16")
    assert [int(x) for x in l1.split()] == m.encode("Hello world")
    assert [int(x) for x in l2.split()] == list(m.generate_ids(m.encode("Hello world"), 8, temperature=0))
    assert STATS.match(r.stderr.strip().splitlines()[-1]).group(4, 5) == ("fp16", "2")
    d = cli("--model", str(ckpt_tiny), "-i", "--dtype", "f16", "-j", "2", "-n", "8", "-t", "0", "Hello world")
    assert d.returncode == 0 and d.stdout == r.stdout            # --dtype f16 is -h
    assert STATS.match(d.stderr.strip().splitlines()[-1]).group(4) == "fp16"


def test_kv_cache_flag(ckpt_tiny):
    """--kv f32 | f16: the generation of GPT2.load(kv=...); anything else is a usage error."""
    for kv, dtype in (("f16", "f32"), ("f32", "f16")):
        r = cli("--model", str(ckpt_tiny), "-i", "--dtype", dtype, "--kv", kv, "-n", "6", "-t", "0", "Hello world")
        assert r.returncode == 0, r.stderr
        m = GPT2.load(ckpt_tiny, dtype=dtype, kv=kv)
        assert [int(x) for x in r.stdout.splitlines()[1].split()] == \
            list(m.generate_ids(m.encode("Hello world"), 6, temperature=0))
        m.close()
    r = cli("--model", str(ckpt_tiny), "-n", "2", "--kv", "f64", "Hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--kv" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [("-h", "--dtype", "q8_0"), ("-h", "--dtype", "f32"), ("--dtype", "q4"),
                                  ("--dtype",)])
def test_dtype_usage_errors(ckpt_tiny, args):
    r = cli("--model", str(ckpt_tiny), "-n", "2", *args, "Hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--dtype" in r.stderr, r.stderr


@pytest.mark.parametrize("dtype", ["q8", "Q8", "int8"])
def test_retired_dtype_names_its_successor(ckpt_tiny, dtype):
    """The old int8 dtype (one fp32 scale per output row) was retired (docs/notes.md): --dtype q8 is a
    usage error that names q8_0, in the CLI and in the server's options."""
    for args in ((), ("serve",)):
        r = cli(*args, "--model", str(ckpt_tiny), "--dtype", dtype, *(() if args else ("Hi",)))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"dtype '{dtype}' was retired: use 'q8_0'" in r.stderr, r.stderr


def test_model_from_env_and_cwd(ckpt_tiny):
    r = cli("-n", "3", "-t", "0", "Hi", env={"GPT2ASM_MODEL": str(ckpt_tiny)})
    assert r.returncode == 0, r.stderr
    r2 = cli("-n", "3", "-t", "0", "Hi", cwd=ckpt_tiny, env={"PYTHONPATH": str(ROOT)})
    assert r2.returncode == 0, r2.stderr
    assert r.stdout == r2.stdout


@pytest.mark.parametrize("flags", [["-n", "-1"], ["-n", "abc"], ["-t", "-0.5"], ["-t", "nan"],
                                   ["--top-p", "0"], ["--top-p", "1.5"], ["--top-k", "-3"], ["-j", "0"],
                                   ["-j", "1000"], ["--seed", "-1"], ["--repetition-penalty", "0"],
                                   ["-s", "7"], ["-s", "bogus"], ["--no-such-flag"]])
def test_bad_flags_exit_2(ckpt_tiny, flags):
    r = cli("--model", str(ckpt_tiny), *flags, "Hi")
    assert r.returncode == 2, (flags, r.stdout, r.stderr)
    assert "error" in r.stderr and "Traceback" not in r.stderr


def test_missing_model_explains(tmp_path):
    r = cli("--model", str(tmp_path / "nope"), "Hi")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "model.safetensors" in r.stderr and "make_checkpoint" in r.stderr
    r = cli("Hi", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "current directory" in r.stderr


def test_current_directory_deleted(tmp_path, ckpt_tiny):
    """No --model, and the current directory was deleted under us: it is one place looked in (gone), then
    gpt2 from the caches, as from any directory without a model; --model still works there."""
    gone = tmp_path / "gone"
    e = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(ROOT / ".cache" / "no-hf-home"),
             GPT2ASM_CACHE=str(ROOT / ".cache" / "no-gpt2asm-cache"), PYTHONPATH=str(ROOT))
    e.pop("GPT2ASM_MODEL", None)
    for args, status in ((["-n", "2", "Hi"], 2), (["--model", str(ckpt_tiny), "-n", "2", "Hi"], 0)):
        gone.mkdir()
        r = subprocess.run([sys.executable, "-m", "gpt2asm", *args], capture_output=True, text=True, env=e,
                           cwd=gone, preexec_fn=gone.rmdir, timeout=300)
        assert r.returncode == status and "Traceback" not in r.stderr, r.stderr
        if status:
            assert "current directory (no --model, no $GPT2ASM_MODEL): No such file or directory (it was " \
                   "deleted)" in r.stderr and "'gpt2'" in r.stderr, r.stderr


def test_prompt_under_a_c_locale(ckpt_tiny):
    """LC_ALL=C with Python's locale coercion and UTF-8 mode off: argv arrives surrogate-escaped, and a
    UTF-8 prompt is still that text (the same token ids as under a UTF-8 locale)."""
    args = ("--model", str(ckpt_tiny), "-n", "2", "--seed", "1", "-i", "h\u00e9llo w\u00f6rld \u2192 \U0001F600")
    want = cli(*args)
    got = cli(*args, env={"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"})
    assert want.returncode == 0 and got.returncode == 0, got.stderr
    assert got.stdout == want.stdout


def test_context_overflow_one_line(ckpt_tiny):
    r = cli("--model", str(ckpt_tiny), "-n", "2000", "Hi")
    assert r.returncode == 2 and "context overflow" in r.stderr and "Traceback" not in r.stderr


def test_help():
    r = cli("--help")
    assert r.returncode == 0 and "-h" in r.stdout and "fp16" in r.stdout
    assert "--dtype {f32,f16,q8_0,q4_0}" in r.stdout and "integer dot products" in r.stdout
