#!/usr/bin/env bash
# A llama-cpp-python server venv (a second peer for draftwise serve; the engine serves the GGUF
# itself, not the float32 folder). Optional: draftwise does not depend on it and CI never runs
# this. pip compiles llama.cpp from source: about 8 minutes on 2 cores (killed after
# LLAMACPP_BUILD_TIMEOUT seconds, default 900). Usage:
#     bash benchmarks/peers/setup_llamacpp.sh        # or: make peers
# Idempotent: a stamp file in the venv records a finished install; delete the venv to redo it.
#
# It also writes $LLAMACPP_VENV/bin/llama-cpp-serve, `python -m llama_cpp.server` with llama.cpp's
# extra buffer types off (use_extra_bufts=false, llama-server's --no-repack): on an AMX CPU the
# build's AMX weight repacking segfaults in the first llama_decode, and llama_cpp.server has no
# option for it.
set -euo pipefail

PYTHON=${PYTHON:-python3}
LLAMACPP_VENV=${LLAMACPP_VENV:-.venv-llamacpp}
LLAMACPP_VERSION=${LLAMACPP_VERSION:-0.3.36}
LLAMACPP_BUILD_TIMEOUT=${LLAMACPP_BUILD_TIMEOUT:-900}
STAMP="$LLAMACPP_VENV/.llama-cpp-python-$LLAMACPP_VERSION-installed"

if [ -f "$STAMP" ]; then
    echo "llama-cpp-python $LLAMACPP_VERSION already installed in $LLAMACPP_VENV ($STAMP)"
    exit 0
fi

test -x "$LLAMACPP_VENV/bin/python" || "$PYTHON" -m venv "$LLAMACPP_VENV"
PIP=("$LLAMACPP_VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
start=$(date +%s)
timeout "$LLAMACPP_BUILD_TIMEOUT" "${PIP[@]}" install "llama-cpp-python[server]==$LLAMACPP_VERSION"
echo "llama-cpp-python installed in $(( $(date +%s) - start )) s"

cat > "$LLAMACPP_VENV/bin/llama-cpp-serve" <<PY
#!$(cd "$LLAMACPP_VENV" && pwd)/bin/python
"""python -m llama_cpp.server (same options) with llama.cpp's extra buffer types (AMX/CPU weight
repacking) off: use_extra_bufts=false, as llama-server --no-repack."""
import sys

import llama_cpp.llama as _llama

_default_params = _llama.llama_cpp.llama_model_default_params


def _no_extra_buffer_types():
    params = _default_params()
    params.use_extra_bufts = False
    return params


_llama.llama_cpp.llama_model_default_params = _no_extra_buffer_types

from llama_cpp.server.__main__ import main  # noqa: E402

sys.argv[0] = "llama-cpp-serve"
main()
PY
chmod +x "$LLAMACPP_VENV/bin/llama-cpp-serve"

"$LLAMACPP_VENV/bin/python" - <<'PY'
import importlib.metadata as md
import llama_cpp  # noqa: F401  (the check: the import must work)
import llama_cpp.server.app  # noqa: F401
for dist in ("llama_cpp_python", "fastapi", "uvicorn"):
    print(f"{dist}=={md.version(dist)}")
PY
touch "$STAMP"
