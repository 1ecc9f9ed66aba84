#!/usr/bin/env bash
# Create .venv (if missing) and install hpctrain with its test extras into it.
# Idempotent: a second run only checks. torch/torchvision are pinned exactly by
# constraints.txt (setup.cfg only asks for a compatible range, for site installs).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c "import hpctrain, torch, torchvision, submitit, pytest" 2>/dev/null \
   || [ setup.cfg -nt .venv/.hpctrain-installed ] || [ constraints.txt -nt .venv/.hpctrain-installed ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip wheel setuptools 2>&1 | grep -v "is ignored" || true
  # setup.cfg's package_dir (=.) makes the editable install a plain .pth path entry
  # instead of setuptools' import hook, which costs every hpctrain command ~20-50 ms
  # at start-up (benchmarks/cli_latency.py), without the deprecated compat mode
  .venv/bin/python -m pip install --quiet -c constraints.txt -e '.[test]' 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import hpctrain, torch, torchvision, submitit, pytest"
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
fi
# The report test opens report.html in headless Chromium (tests/unit/test_observe_report_render_browser.py), and
# the decode tests run the turbojpeg decoder over libturbojpeg (ppc64le's fast path; PyTurboJPEG is
# in the test extra). As root on Debian/Ubuntu (CI), install both; elsewhere those tests skip without them.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if [ ! -x /usr/bin/chromium ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
      >/dev/null 2>&1 || echo "install.sh: could not install chromium; the report browser test skips (fails under CI)" >&2
  fi
  if ! ldconfig -p 2>/dev/null | grep -q 'libturbojpeg\.so'; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libturbojpeg0; } \
      >/dev/null 2>&1 || echo "install.sh: could not install libturbojpeg0; the turbojpeg decode tests skip (fail under CI)" >&2
  fi
fi
# The packed-dataset tests pack, mount and unmount SquashFS images (tests/unit/test_dataset_pack.py,
# tests/local/test_packed_data.py). As root on Debian/Ubuntu (CI), install the tools; elsewhere
# those tests skip without them.
if ! command -v mksquashfs >/dev/null || ! command -v squashfuse >/dev/null || ! command -v fusermount3 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        squashfs-tools squashfuse fuse3; } >/dev/null 2>&1 \
      || echo "install.sh: could not install squashfs-tools/squashfuse; the packed-dataset tests skip (fail under CI)" >&2
  fi
fi
# The shared-filesystem Slurm test (tests/slurm/test_shared_fs_e2e.py, `slurm-cluster up --shared`) serves
# a folder over sshfs from an sshd the cluster starts itself. As root on Debian/Ubuntu (CI), install both;
# policy-rc.d keeps the package from starting a system sshd. Elsewhere that test skips without them.
if ! command -v sshfs >/dev/null || [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/lib/openssh/sftp-server ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    policy=/usr/sbin/policy-rc.d
    added_policy=
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added_policy=1; fi
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        sshfs openssh-server; } >/dev/null 2>&1 \
      || echo "install.sh: could not install sshfs/openssh-server; the shared-filesystem test skips (fails under CI)" >&2
    if [ -n "$added_policy" ]; then rm -f "$policy"; fi
  fi
fi
