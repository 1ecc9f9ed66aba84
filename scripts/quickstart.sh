#!/usr/bin/env bash
# The quickstart: install, make a small real-JPEG dataset, train jobs/quickstart.yaml
# on this machine (2 DDP ranks on CPU, no Slurm, no GPU, no downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/hpctrain make-dataset data/quickstart --classes 10 --per-class 120 --image-size 64
exec .venv/bin/hpctrain submit jobs/quickstart.yaml "$@"
