"""A fast subset of the loader fuzzing (`make fuzz` runs ≥ 10,000 cases: tools/fuzz.py), plus
hypothesis-generated headers and vocabularies: every case is a typed GPT2AsmError or a valid load."""
from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz
from gpt2asm import GPT2AsmError
from gpt2asm.tokenizer import load_vocab
from gpt2asm.weights import load_weights


def test_fuzz_subset():
    r = fuzz.drive(cases=300, seed=20240601, target="all", timeout=60)
    assert not r["failures"], "\n".join(f"case {f['k']}: {f['log']}\n{f['detail']}" for f in r["failures"][:5])
    assert r["ok"] + r["typed"] + r["skip"] == 300 and r["skip"] == 0
    assert r["ok"] > 20 and r["typed"] > 150                  # both outcomes are exercised
    assert {"CheckpointError", "TokenizerError"} <= set(r["errors"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-corpus")
    return fuzz.make_corpus(root)


def test_corpus_is_valid(corpus):
    from gpt2asm.kernels import Kernels
    r = fuzz.Runner.__new__(fuzz.Runner)
    r.corpus, r.kernels = corpus["hf"].parent, Kernels(None, 1)
    for name, d in corpus.items():
        assert r.check_ckpt(d, "f32").startswith("loaded"), name
        assert r.check_tok(d).startswith("loaded"), name


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.dictionaries(st.sampled_from(["transformer.wte.weight", "transformer.h.0.ln_1.weight",
                                                "h.0.attn.bias", "__metadata__", "lm_head.weight", "x"]),
                               json_values | st.fixed_dictionaries({"dtype": json_values, "shape": json_values,
                                                                    "data_offsets": json_values}), max_size=4),
       tail=st.binary(max_size=64))
def test_hypothesis_safetensors_headers(tmp_path, entries, tail):
    h = json.dumps(entries).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + tail)
    try:
        load_weights(tmp_path / "model.safetensors")
    except GPT2AsmError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(vocab=json_values | st.dictionaries(st.text(max_size=3), json_values, max_size=6), raw=st.booleans(),
       junk=st.binary(max_size=32))
def test_hypothesis_vocab_files(tmp_path, vocab, raw, junk):
    p = tmp_path / "vocab.json"
    p.write_bytes(junk if raw else json.dumps(vocab).encode())
    try:
        load_vocab(p)
    except GPT2AsmError:
        pass
