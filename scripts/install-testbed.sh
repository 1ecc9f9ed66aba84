#!/usr/bin/env bash
# The test bed's system packages, for scripts/test.sh (which runs this after scripts/install.sh): only as
# root on Debian/Ubuntu (CI), each named before it is installed. Elsewhere it installs nothing and says
# which tests will skip without what. The quickstart never runs this.
#
#   chromium                          the report test opens report.html in headless Chromium
#                                     (tests/unit/test_observe_report_render_browser.py)
#   libturbojpeg0                     the decode tests run the turbojpeg decoder (ppc64le's fast path;
#                                     PyTurboJPEG is in the test extra)
#   squashfs-tools squashfuse fuse3   the packed-dataset tests pack, mount and unmount SquashFS images
#                                     (tests/unit/test_dataset_pack.py, tests/local/test_packed_data.py)
#   sshfs openssh-server              the shared-filesystem Slurm test serves a folder over sshfs from an
#                                     sshd the cluster starts itself (tests/slurm/test_shared_fs_e2e.py);
#                                     policy-rc.d keeps the package from starting a system sshd
# Idempotent: what is there already is not installed again. Under CI a test whose tool is missing fails.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "install-testbed.sh: $*"; }
missing=()
[ -x /usr/bin/chromium ] || missing+=("chromium|the report browser test")
ldconfig -p 2>/dev/null | grep -q 'libturbojpeg\.so' || missing+=("libturbojpeg0|the turbojpeg decode tests")
if ! command -v mksquashfs >/dev/null || ! command -v squashfuse >/dev/null || ! command -v fusermount3 >/dev/null; then
  missing+=("squashfs-tools squashfuse fuse3|the packed-dataset tests")
fi
if ! command -v sshfs >/dev/null || [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/lib/openssh/sftp-server ]; then
  missing+=("sshfs openssh-server|the shared-filesystem Slurm test")
fi
[ ${#missing[@]} -gt 0 ] || exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  for entry in "${missing[@]}"; do
    say "${entry#*|} skip(s) without ${entry%%|*} (installed only as root with apt-get)"
  done
  exit 0
fi
# One apt-get at a time with tests/cluster/slurm-cluster (`prepare`, which CI starts in the background,
# installs mmdebstrap and the host's Slurm): apt-get update fails on another's lock instead of waiting.
exec 9>>/run/lock/hpctrain-apt.lock
if ! flock -n 9; then
  say "waiting for another apt-get (slurm-cluster prepare, pid $(cat /run/lock/hpctrain-apt.lock 2>/dev/null || echo ?))"
  flock 9
fi
echo $$ >/run/lock/hpctrain-apt.lock # who holds it, for a waiting slurm-cluster to name
log=$(mktemp "${TMPDIR:-/tmp}/install-testbed.XXXXXX")
updated=
for entry in "${missing[@]}"; do
  packages=${entry%%|*} needed_by=${entry#*|}
  say "apt-get install $packages (for $needed_by)"
  policy=/usr/sbin/policy-rc.d added_policy=
  if [[ $packages == *openssh-server* ]] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added_policy=1
  fi
  # shellcheck disable=SC2086  # packages is a word list from the table above
  if { [ -n "$updated" ] || apt-get update -qq >>"$log" 2>&1; } && updated=1 \
     && DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends $packages >>"$log" 2>&1; then
    :
  else
    say "could not install $packages: $needed_by skip(s) (fail under CI); apt-get's output is in $log"
    keep_log=1
  fi
  if [ -n "$added_policy" ]; then rm -f "$policy"; fi
done
[ -n "${keep_log:-}" ] || rm -f "$log"
