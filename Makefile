# gpt2asm — see README.md.  Everything runs with the python3 on PATH (override: make PYTHON=...).
PYTHON  ?= python3
PROMPT  ?= Alan Turing theorized that computers would one day become
MODEL   ?= $(if $(wildcard model.safetensors),.,models/random-124M)
PYTEST  ?= $(PYTHON) -m pytest

.PHONY: all build setup models run serve test test-deps verify bench kernels-bench clean

all: build

build:                       ## assemble asm/<arch>/*.S into gpt2asm/libgpt2asm.so
	$(PYTHON) build.py

setup:                       ## install the package (editable) and its run-time dependencies
	$(PYTHON) -m pip install -q -e .

models: setup                ## the real tokenizer files, and a random-init 124M checkpoint if no real one
	$(PYTHON) tools/fetch_tokenizer.py --out models/tokenizer
	@if [ "$(MODEL)" = models/random-124M ] && [ ! -f models/random-124M/model.safetensors ]; then \
	  $(PYTHON) tools/make_checkpoint.py --out models/random-124M --size 124M --seed 0 --tokenizer models/tokenizer; fi

# `make run` without MODEL=: ./model.safetensors if there, else gpt2 from the caches or the hub, else the random
# checkpoint (tools/pick_model.py writes it when needed and says so).
RUN_MODEL = $(if $(filter file,$(origin MODEL)),$(if $(wildcard model.safetensors),.,auto),$(MODEL))

run: setup                   ## the main job: 60 tokens after the prompt, seeded sampling
	@model="$$($(PYTHON) tools/pick_model.py '$(RUN_MODEL)')" && \
	  echo "$(PYTHON) -m gpt2asm --model $$model -n 60 --seed 1 \"$(PROMPT)\"" && \
	  $(PYTHON) -m gpt2asm --model "$$model" -n 60 --seed 1 "$(PROMPT)"

serve: models                ## the OpenAI-compatible server on 127.0.0.1:8000 (README "Serving"; SERVE_ARGS=...)
	$(PYTHON) -m pip install -q starlette uvicorn prometheus_client
	$(PYTHON) -m gpt2asm serve --model $(MODEL) $(SERVE_ARGS)

test-deps: setup
	$(PYTHON) -m pip install -q pytest hypothesis transformers torch==2.13.0 huggingface_hub gguf -r tests/requirements-emu.txt \
	  starlette uvicorn prometheus_client openai

test: test-deps              ## the whole test suite (kernels, tokenizer, model, parity, CLI)
	$(PYTEST) -q tests

.PHONY: fuzz
fuzz: setup                  ## fuzz the checkpoint and tokenizer loaders: FUZZ_CASES (10000) mutated files, FUZZ_SEED
	$(PYTHON) tools/fuzz.py --cases $(or $(FUZZ_CASES),10000) --seed $(or $(FUZZ_SEED),0)

verify: models               ## greedy parity with transformers (tools/verify.py)
	$(PYTHON) tools/verify.py --model $(MODEL)

bench: models                ## one table: ours per ISA x dtype x -j beside the bandwidth bound, PyTorch, llama.cpp (BENCH_ARGS=--quick)
	$(PYTHON) tools/bench.py --model $(MODEL) $(BENCH_ARGS)

.PHONY: llamacpp
llamacpp: models             ## build llama.cpp's llama-bench, llama-quantize, llama-batched-bench from the llama-cpp-python sdist into .cache/llamacpp; GGUFs (F32/F16/Q8_0/Q4_0) of $(MODEL)
	$(PYTHON) tools/llamacpp.py all --model $(MODEL)

clean:
	rm -f gpt2asm/libgpt2asm.so gpt2asm/libgpt2asm.dylib
	rm -rf build dist .pytest_cache

# ---- Arm (AArch64) on x86-64 Linux: cross-build with clang-19/lld, test under qemu-user (tools/arm64/) ----
# ARM64_TESTS run under every ARM64_CPUS configuration; ARM64_TESTS_ONCE only under the first (the
# SVL-independent ones: NEON kernels, forward pass, CLI; the q8_0 / q4_0 and batched decode plans, whose
# sme2 kernels test_kernels_q0_sme2 / test_prefill / test_fingerprint check at every SVL).  ARM64_CPUS: names of tools/arm64/run_tests.py's
# CPUS or NAME:QEMU-CPU; ARM64_JOBS configurations run in parallel.
ARM64_TESTS      ?= tests/test_arm_smoke.py tests/test_plan_abi.py tests/test_kernels_sme2.py tests/test_kernels_q0_sme2.py tests/test_fingerprint.py tests/test_prefill.py
ARM64_TESTS_ONCE ?= tests/test_kernels_neon.py tests/test_plan.py tests/test_kernels_q0_arm.py tests/test_kernels_q6k_arm.py \
                    tests/test_q0_model.py tests/test_batch_plan.py tests/test_batch.py
ARM64_CPUS       ?= sme512 sme256 sme128 nosme
ARM64_JOBS       ?= 2
.PHONY: arm64-lib macos-lib test-arm64

arm64-lib:                   ## cross-build build/aarch64-linux-gnu/libgpt2asm.so (clang-19, lld) + export check
	bash tools/arm64/setup.sh toolchain
	$(PYTHON) build.py --target aarch64-linux-gnu -q

macos-lib:                   ## cross-link build/arm64-apple-macos14/libgpt2asm.dylib (ld64.lld-19, no SDK) + checks
	bash tools/arm64/setup.sh toolchain
	$(PYTHON) build.py --target arm64-apple-macos14 -q
	$(PYTHON) tools/arm64/check_macho.py build/arm64-apple-macos14/libgpt2asm.dylib

test-arm64: macos-lib        ## the Arm tests under qemu-aarch64: SME2 at SVL 512/256/128 (FA64 off), and no SME
	bash tools/arm64/setup.sh toolchain qemu sysroot
	$(PYTHON) tools/arm64/run_tests.py --cpus "$(ARM64_CPUS)" -j $(ARM64_JOBS) $(ARM64_TESTS) \
	  $(if $(strip $(ARM64_TESTS_ONCE)),--once $(ARM64_TESTS_ONCE))
