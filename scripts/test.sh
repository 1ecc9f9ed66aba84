#!/usr/bin/env bash
# Every test tier: unit, local multi-process (gloo on CPU), and the real multi-node
# Slurm test cluster (needs root; brought up and down by the tests themselves).
# GPU tests run only where CUDA is available.
#
#   bash scripts/test.sh                        # everything, Slurm tier on 22.05
#   bash scripts/test.sh --slurm 24.11 tests/slurm -m slurm_contract
#                                               # the Slurm tier's contract subset on 24.11
# --slurm VERSION sets HPCTRAIN_TEST_SLURM (22.05, 24.11 or 26.05); the rest goes to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--slurm" ]; then
    if [ $# -lt 2 ]; then
        echo "scripts/test.sh: --slurm needs a version: 22.05, 24.11 or 26.05" >&2
        exit 2
    fi
    export HPCTRAIN_TEST_SLURM=$2
    shift 2
fi
bash scripts/install.sh
exec .venv/bin/python -m pytest "$@"
