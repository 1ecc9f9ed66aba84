#!/usr/bin/env bash
# Create .venv (if missing) and install hpctrain into it: Python packages only, never system packages
# (the test bed's are scripts/install-testbed.sh's, which scripts/test.sh runs).
#
#   bash scripts/install.sh             # hpctrain with its test extras (pytest, ruff, ...): developers, CI
#   bash scripts/install.sh --no-test   # hpctrain alone (the quickstart)
#
# Idempotent: a second run only checks. torch/torchvision are pinned exactly by constraints.txt (setup.cfg
# only asks for a compatible range, for site installs). pip's progress is shown, a line per package.
set -euo pipefail
cd "$(dirname "$0")/.."
target='.[test]'
probe="import hpctrain, torch, torchvision, submitit, pytest, xdist"
if [ "${1:-}" = "--no-test" ]; then
  target='.'
  probe="import hpctrain, torch, torchvision, submitit"
elif [ $# -gt 0 ]; then
  echo "scripts/install.sh: unknown argument '$1' (--no-test, or none)" >&2
  exit 2
fi
python=${PYTHON:-python3}
say() { echo "install.sh: $*"; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$python" --version 2>&1) ($python)"
  "$python" -m venv .venv
fi
# pip's own lines, less the noise: which package it fetches (with its size, or the local wheel it takes)
# and what it installed; its longest step, unpacking, prints nothing, so say so before it
progress() {
  grep --line-buffered -E '^(Collecting|  Downloading|Processing|  Using cached|Installing collected|Successfully installed|ERROR)' \
    | sed -u -e 's/^ */  pip: /' -e '/Installing collected/a\  pip: (unpacking them: the longest step, 1-2 min on 2 cores, and silent)' || true
}
if ! .venv/bin/python -c "$probe" 2>/dev/null \
   || [ setup.cfg -nt .venv/.hpctrain-installed ] || [ constraints.txt -nt .venv/.hpctrain-installed ]; then
  torch_pin=$(grep -E '^torch==' constraints.txt | cut -d= -f3)
  say "installing hpctrain ($target) with torch $torch_pin (CPU and CUDA wheels) and its dependencies into .venv:"
  say "the first time: the download (several GB: torch with its CUDA libraries), then ~2 min to unpack 5.7 GB"
  started=$(date +%s)
  .venv/bin/python -m pip install --quiet --upgrade pip wheel setuptools 2>&1 | grep -v "is ignored" || true
  # setup.cfg's package_dir (=.) makes the editable install a plain .pth path entry
  # instead of setuptools' import hook, which costs every hpctrain command ~20-50 ms
  # at start-up (benchmarks/cli_latency.py), without the deprecated compat mode
  .venv/bin/python -m pip install --progress-bar off -c constraints.txt -e "$target" 2>&1 | progress
  .venv/bin/python -c "$probe"
  # exactly the pinned versions (a local label such as +cu130 aside), or fail here rather than in a test
  .venv/bin/python -c "
import sys
from importlib.metadata import version
for line in open('constraints.txt'):
    name, _, want = line.split('#')[0].strip().partition('==')
    if name and version(name).split('+')[0] != want:
        sys.exit(f'{name} {version(name)} is installed, but constraints.txt pins {want}')
"
  touch .venv/.hpctrain-installed
  say "installed in $(($(date +%s) - started)) s"
fi
