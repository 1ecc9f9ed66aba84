#!/usr/bin/env bash
# Every test tier: unit, local multi-process (gloo on CPU), and the real multi-node
# Slurm test cluster (needs root; brought up and down by the tests themselves).
# GPU tests run only where CUDA is available.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest "$@"
