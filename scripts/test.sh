#!/usr/bin/env bash
# Every test tier: unit, local multi-process (gloo on CPU), and the real multi-node
# Slurm test cluster (needs root; brought up and down by the tests themselves).
# GPU tests run only where CUDA is available.
#
#   bash scripts/test.sh              # the CI matrix: every tier with the Slurm tier on 24.11,
#                                     # then the Slurm contract subset on 22.05 and on 26.05,
#                                     # then the scale smoke job (16 x 2 ranks) on 24.11
#   bash scripts/test.sh tests/unit   # any pytest arguments: one pytest run (Slurm 22.05 unless
#                                     # HPCTRAIN_TEST_SLURM says otherwise)
#   bash scripts/test.sh --slurm 24.11 tests/slurm -m slurm_contract
#                                     # one pytest run on Slurm 24.11
# --slurm VERSION sets HPCTRAIN_TEST_SLURM (22.05, 24.11 or 26.05); the rest goes to pytest.
# The matrix runs every leg even when one fails, prints each leg's time, and exits
# non-zero if any leg failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--slurm" ]; then
    if [ $# -lt 2 ]; then
        echo "scripts/test.sh: --slurm needs a version: 22.05, 24.11 or 26.05" >&2
        exit 2
    fi
    export HPCTRAIN_TEST_SLURM=$2
    shift 2
    one_run=1
fi
bash scripts/install.sh          # Python packages into .venv
bash scripts/install-testbed.sh  # the test bed's system packages (as root on Debian/Ubuntu; says what)
if [ $# -gt 0 ] || [ -n "${one_run:-}" ]; then
    exec .venv/bin/python -m pytest "$@"
fi

# The matrix (docs/testing.md): which Slurm version runs which tests.
legs=(
    "24.11|every tier|tests"
    "22.05|Slurm contract subset|tests/slurm -m slurm_contract"
    "26.05|Slurm contract subset|tests/slurm -m slurm_contract"
)
summary=()
failed=0
run_leg() { # WHAT VERSION COMMAND...: one leg, timed, its result added to the summary
    local what=$1 version=$2 started result
    shift 2
    echo "===== scripts/test.sh: $what on Slurm $version ($*)"
    started=$(date +%s)
    if HPCTRAIN_TEST_SLURM=$version "$@"; then
        result=passed
    else
        result="FAILED ($?)"
        failed=1
    fi
    summary+=("$(printf '%-24s on Slurm %s: %s in %ss' "$what" "$version" "$result" "$(($(date +%s) - started))")")
}
for leg in "${legs[@]}"; do
    IFS='|' read -r version what args <<<"$leg"
    # shellcheck disable=SC2086  # args is a fixed word list from the table above
    # --durations: where a leg's time goes, so CI's log says what to trim when the hour gets close
    run_leg "$what" "$version" .venv/bin/python -m pytest --durations=25 $args
done
# HAL's scale: 16 nodes x 2 ranks = 32 gloo ranks, ~1.5 min and ~14 GiB of the 24 GiB machine, so
# it runs alone, after the legs (docs/testing.md). 16 x 3 = 48 also completes (~20 GiB) but leaves
# CI too thin a margin; run it by hand. It needs root, as the Slurm tier does.
if [ "$(id -u)" = 0 ]; then
    run_leg "scale smoke, 16 x 2 ranks" 24.11 tests/cluster/scale-smoke 16 2
elif [ -n "${CI:-}" ]; then
    summary+=("scale smoke: FAILED (needs root)")
    failed=1
fi
echo "===== scripts/test.sh: the matrix"
printf '  %s\n' "${summary[@]}"
exit "$failed"
