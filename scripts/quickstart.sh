#!/usr/bin/env bash
# The quickstart: install hpctrain into .venv, make a small real-JPEG dataset, train jobs/quickstart.yaml
# on this machine (2 DDP ranks on CPU, no Slurm, no GPU). The first time: the download of torch (several
# GB), then ~5 min on 2 cores (docs/testing.md#a-newcomers-first-run-on-a-fresh-clone). It installs
# Python packages into .venv and nothing else: no system packages (those are the test bed's,
# scripts/install-testbed.sh, which scripts/test.sh runs).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
step() { echo "== quickstart: $* ($(($(date +%s) - started)) s so far)"; }
step "1/3 install hpctrain and its Python dependencies into $PWD/.venv (pip; no system packages)"
bash scripts/install.sh --no-test
step "2/3 make a 10-class JPEG dataset in data/quickstart (1,200 images, ~10 s)"
.venv/bin/hpctrain make-dataset data/quickstart --classes 10 --per-class 120 --image-size 64
step "3/3 train jobs/quickstart.yaml: ResNet-18, 2 DDP ranks on this CPU, 6 epochs (~2-3 min on 2 cores)"
code=0
.venv/bin/hpctrain submit jobs/quickstart.yaml "$@" || code=$?
echo "== quickstart: done in $(($(date +%s) - started)) s (exit $code)"
cat <<'TXT'
hpctrain is installed in .venv, not on your PATH. Either activate it once per shell:
    source .venv/bin/activate      # then: hpctrain status, hpctrain report runs/quickstart/..., ...
or call it by its path:
    .venv/bin/hpctrain status
The run directory is under runs/quickstart/; `hpctrain report RUN` draws its curves (README: "A tour").
TXT
exit "$code"
