# gpt2asm — see README.md.  Everything runs with the python3 on PATH (override: make PYTHON=...).
PYTHON  ?= python3
PROMPT  ?= Alan Turing theorized that computers would one day become
MODEL   ?= $(if $(wildcard model.safetensors),.,models/random-124M)
PYTEST  ?= $(PYTHON) -m pytest

.PHONY: all build setup models run test test-deps verify bench kernels-bench clean

all: build

build:                       ## assemble asm/<arch>/*.S into gpt2asm/libgpt2asm.so
	$(PYTHON) build.py

setup:                       ## install the package (editable) and its run-time dependencies
	$(PYTHON) -m pip install -q -e .

models: setup                ## the real tokenizer files, and a random-init 124M checkpoint if no real one
	$(PYTHON) tools/fetch_tokenizer.py --out models/tokenizer
	@if [ "$(MODEL)" = models/random-124M ] && [ ! -f models/random-124M/model.safetensors ]; then \
	  $(PYTHON) tools/make_checkpoint.py --out models/random-124M --size 124M --seed 0 --tokenizer models/tokenizer; fi

run: models                  ## the main job: 60 tokens after the prompt, seeded sampling
	$(PYTHON) -m gpt2asm --model $(MODEL) -n 60 --seed 1 "$(PROMPT)"

test-deps: setup
	$(PYTHON) -m pip install -q pytest hypothesis transformers torch==2.13.0 -r tests/requirements-emu.txt

test: test-deps              ## the whole test suite (kernels, tokenizer, model, parity, CLI)
	$(PYTEST) -q tests

verify: models               ## greedy parity with transformers (tools/verify.py)
	$(PYTHON) tools/verify.py --model $(MODEL)

bench: models                ## decode speed per ISA, dtype, -j, with PyTorch and the bandwidth bound
	$(PYTHON) tools/bench.py --model $(MODEL)

clean:
	rm -f gpt2asm/libgpt2asm.so gpt2asm/libgpt2asm.dylib
	rm -rf build dist .pytest_cache
