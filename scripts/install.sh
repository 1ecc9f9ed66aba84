#!/usr/bin/env bash
# Create .venv (if missing) and install hpctrain with its test extras into it.
# Idempotent: a second run only checks. torch/torchvision are pinned in setup.cfg.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c "import hpctrain, torch, torchvision, submitit, pytest" 2>/dev/null \
   || [ setup.cfg -nt .venv/.hpctrain-installed ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip wheel setuptools 2>&1 | grep -v "is ignored" || true
  # compat mode: a plain path entry instead of setuptools' import hook, which
  # costs every hpctrain command ~20-50 ms at start-up (benchmarks/cli_latency.py)
  .venv/bin/python -m pip install --quiet -e '.[test]' --config-settings editable_mode=compat 2>&1 \
    | grep -v "is ignored" || true
  .venv/bin/python -c "import hpctrain, torch, torchvision, submitit, pytest"
  touch .venv/.hpctrain-installed
fi
