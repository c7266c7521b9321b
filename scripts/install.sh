#!/usr/bin/env bash
# Install everything dacflnode needs on a fresh Debian machine into ./.venv:
# system packages (Fashion-MNIST, iproute2 for the multi-host tests), PyTorch, the package and
# its development tools. Safe to run again; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  need=()
  [ -d /usr/share/datasets/fashion-mnist ] || need+=(dataset-fashion-mnist)
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c 'import torch, torchvision' >/dev/null 2>&1; then
  .venv/bin/pip install -q torch==2.14.1 torchvision==0.29.1
fi
.venv/bin/pip install -q -e '.[dev]'
.venv/bin/python -c 'import torch, torchvision, grpc, dacflnode'
