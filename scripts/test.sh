#!/usr/bin/env bash
# Every test tier: unit, local multi-process (gloo on CPU), and the real multi-node
# Slurm test cluster (needs root; brought up and down by the tests themselves).
# GPU tests run only where CUDA is available.
#
#   bash scripts/test.sh              # the CI matrix: the unit and local tiers in the background
#                                     # while, in the foreground, the Slurm test bed is made ready
#                                     # (slurm-cluster prepare: root filesystems, cached), the Slurm
#                                     # tier runs on 24.11, then the Slurm contract subset on 22.05
#                                     # and on 26.05; then the scale smoke job
#                                     # (16 x 2 ranks) on 24.11, alone
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

# The matrix (docs/testing.md): two streams at once, because they need different things. The tiers
# without a cluster (unit, local: CPU-bound, ~2 + ~15 min) run in the background while the Slurm legs
# (one test cluster at a time, mostly waiting on Slurm's scheduling, requeues and signals) run in the
# foreground, one Slurm version after another. Each Slurm leg has two halves on the same cluster: the
# tests marked slurm_shared two at a time (pytest-xdist: -n 2, a file's tests on one worker), then the
# others alone (they restart, resize, slow or kill the cluster, preempt, read the whole queue or time
# things). The contract tests that must run alone run on the oldest and the newest version (22.05,
# 26.05), not again on 24.11, which runs every other test. The scale smoke job (~14 GiB) runs alone at
# the end. Each half prints its 25 slowest tests (--durations), so CI's log says what to trim.
slurm_legs=( # version | what | the shared half's tests | the alone half's tests (pytest -m)
    "24.11|the Slurm tier|slurm_shared|not slurm_shared and not slurm_contract"
    "22.05|Slurm contract subset|slurm_contract and slurm_shared|slurm_contract and not slurm_shared"
    "26.05|Slurm contract subset|slurm_contract and slurm_shared|slurm_contract and not slurm_shared"
)
summary=()
failed=0
matrix_started=$(date +%s)
leg_line() { # WHAT VERSION RESULT SECONDS: one line of the closing summary (VERSION - for no cluster)
    local where="on Slurm $2"
    [ "$2" = - ] && where="without a cluster"
    printf '%-44s %-17s: %s in %ss' "$1" "$where" "$3" "$4"
}
run_leg() { # WHAT VERSION COMMAND...: one leg, timed, its result added to the summary
    local what=$1 version=$2 started result rc
    shift 2
    echo "===== scripts/test.sh: $what on Slurm $version ($*)"
    started=$(date +%s)
    rc=0
    HPCTRAIN_TEST_SLURM=$version "$@" || rc=$?
    case $rc in
        0) result=passed ;;
        5) result="passed (no test selected)" ;; # pytest's exit status when -m selects nothing
        *)
            result="FAILED ($rc)"
            failed=1
            ;;
    esac
    summary+=("$(leg_line "$what" "$version" "$result" "$(($(date +%s) - started))")")
}

# The background stream: unit and local tiers in one pytest session (no cluster; the Slurm
# version only names the leg). Its output goes to a log that is printed whole when it ends.
cpu_log=$(mktemp -t hpctrain-cpu-tiers.XXXXXX)
cpu_result=$(mktemp -t hpctrain-cpu-result.XXXXXX)
echo "===== scripts/test.sh: unit and local tiers, in the background (log printed when they end)"
(
    started=$(date +%s)
    # no cache provider: the foreground sessions write .pytest_cache at the same time
    # nice: the Slurm legs are the critical path and their jobs' timing is under test (burn-in, eviction,
    # hang detection), so the background stream takes the CPU they leave
    if nice -n 10 .venv/bin/python -m pytest --durations=25 -p no:cacheprovider tests/unit tests/local >"$cpu_log" 2>&1; then
        result=passed
    else
        result="FAILED ($?)"
    fi
    leg_line "unit and local tiers" "-" "$result" "$(($(date +%s) - started))" >"$cpu_result"
) &
cpu_pid=$!
# A stop of the script (Ctrl-C, CI's limit) ends the background stream too.
trap 'pkill -TERM -P "$cpu_pid" 2>/dev/null; kill "$cpu_pid" 2>/dev/null || true' EXIT

# The Slurm test bed's one-time downloads and builds (the host's Slurm packages, mmdebstrap, the root
# filesystems of 24.11, 26.05 and Apptainer's, the SIF image): made before the first leg rather than inside its first
# test. .ci/run starts the same `prepare` in the background before pip installs: this one then waits
# for the builds in progress (a lock in the cache) and finds them made. Only as root, as the legs.
if [ "$(id -u)" = 0 ]; then
    echo "===== scripts/test.sh: the Slurm test bed (slurm-cluster prepare; waits for a build in progress)"
    started=$(date +%s)
    rc=0
    python3 tests/cluster/slurm-cluster prepare --slurm 24.11 22.05 26.05 --apptainer || rc=$?
    result=passed
    if [ "$rc" = 4 ] && [ -z "${CI:-}" ]; then
        result="unavailable (exit 4, above): the Slurm tests that need it skip"
    elif [ "$rc" != 0 ]; then
        result="FAILED ($rc, above)"
        failed=1
    fi
    summary+=("$(leg_line "Slurm test bed (slurm-cluster prepare)" - "$result" "$(($(date +%s) - started))")")
fi

for leg in "${slurm_legs[@]}"; do
    IFS='|' read -r version what shared alone <<<"$leg"
    run_leg "$what, two at a time" "$version" \
        .venv/bin/python -m pytest --durations=25 -p no:cacheprovider -n 2 --dist loadfile -m "$shared" tests/slurm
    run_leg "$what, alone" "$version" .venv/bin/python -m pytest --durations=25 -m "$alone" tests/slurm
    python3 tests/cluster/slurm-cluster down >/dev/null || true # the xdist half leaves it up; the next leg starts clean
done

wait "$cpu_pid" || true
trap - EXIT
echo "===== scripts/test.sh: unit and local tiers (the background stream's log)"
cat "$cpu_log"
summary+=("$(cat "$cpu_result")")
case "$(cat "$cpu_result")" in *passed*) ;; *) failed=1 ;; esac
rm -f "$cpu_log" "$cpu_result"

# HAL's scale: 16 nodes x 2 ranks = 32 gloo ranks, ~1.5 min and ~14 GiB of the 24 GiB machine, so
# it runs alone, after the legs (docs/testing.md). 16 x 3 = 48 also completes (~20 GiB) but leaves
# CI too thin a margin; run it by hand. It needs root, as the Slurm tier does.
if [ "$(id -u)" = 0 ]; then
    run_leg "scale smoke, 16 x 2 ranks" 24.11 tests/cluster/scale-smoke 16 2
elif [ -n "${CI:-}" ]; then
    summary+=("scale smoke: FAILED (needs root)")
    failed=1
fi
echo "===== scripts/test.sh: the matrix ($(($(date +%s) - matrix_started))s in all)"
printf '  %s\n' "${summary[@]}"
exit "$failed"
