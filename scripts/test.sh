#!/usr/bin/env bash
# Every test tier: unit, local multi-process (gloo on CPU), and the real multi-node
# Slurm test cluster (needs root; brought up and down by the tests themselves).
# GPU tests run only where CUDA is available.
#
#   bash scripts/test.sh              # the CI matrix: the unit and local tiers in the background,
#                                     # then there the scale smoke job (16 x 2 ranks, 24.11, a third
#                                     # test cluster, at idle priority), while, in the foreground,
#                                     # the Slurm test bed is made ready (slurm-cluster prepare: root
#                                     # filesystems, cached), the Slurm tier runs on 24.11, and beside
#                                     # its second half the Slurm contract subset on 22.05 and on
#                                     # 26.05 (a second test cluster)
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
# The checkout's bytecode, once (a second run only checks): every process of the tests (each CLI call, each
# task of each Slurm job, the helpers) imports hpctrain and the test helpers from the checkout, and where
# PYTHONDONTWRITEBYTECODE is set (as on CI's machines) Python never writes that bytecode itself, so each
# process compiled every module it imported anew (docs/testing.md, "Where CI's CPU goes").
.venv/bin/python -m compileall -q hpctrain tests benchmarks >/dev/null ||
    echo "scripts/test.sh: some file did not compile to bytecode (python -m compileall hpctrain tests benchmarks says which); going on"
if [ $# -gt 0 ] || [ -n "${one_run:-}" ]; then
    exec .venv/bin/python -m pytest "$@"
fi

# The matrix (docs/testing.md): three streams at once, because they need different things. The tiers
# without a cluster (unit, local: CPU-bound, ~2 + ~15 min) run in the background for the whole matrix. In
# the foreground, Slurm 24.11's legs (its whole tier: mostly waiting on Slurm's scheduling, requeues and
# signals) run on the test cluster's instance 0. Once 24.11's CPU-heavy two-at-a-time half is done, the
# contract subsets of the side releases (22.05, then 26.05) run on a second cluster, instance 1 (nodes
# m1.., its own bridge, ports and job ids: tests/cluster/slurm-cluster), beside 24.11's alone half, which
# leaves most of the machine idle while it waits on Slurm. Each Slurm leg has two halves on the same
# cluster: the tests marked slurm_shared two at a time (pytest-xdist: -n 2, a file's tests on one worker),
# then the others alone on their cluster (they restart, resize, slow or kill it, preempt, read the whole
# queue or time things). The contract tests run on the oldest and the newest release, not again on 24.11,
# which runs every other test but those marked slurm_side (alone tests with nothing release-specific:
# 26.05's alone half runs them, off 24.11's critical path). Priorities: 24.11 (the longest stream) first, the side
# releases at nice 5 (their daemons and jobs inherit it), the tiers without a cluster at nice 10. The
# scale smoke job (~14 GiB) follows the unit and local tiers in the background stream, on a cluster of its
# own (instance 2), at SCHED_IDLE: beside the Slurm legs' last tests, which wait on Slurm and leave a third
# of the CPU idle. Each half prints its 25 slowest tests (--durations), so CI's log says what to trim.
main_legs=( # version | what | the shared half's tests | the alone half's tests (pytest -m)
    "24.11|the Slurm tier|slurm_shared and not slurm_contract|not slurm_shared and not slurm_contract and not slurm_side"
)
side_legs=( # slurm_side: alone tests with nothing release-specific, moved off 24.11's critical path
    "22.05|Slurm contract subset|slurm_contract and slurm_shared|slurm_contract and not slurm_shared"
    "26.05|Slurm contract subset + slurm_side|slurm_contract and slurm_shared|(slurm_contract or slurm_side) and not slurm_shared"
)
SIDE_INSTANCE=1
SCALE_INSTANCE=2
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
slurm_half() { # VERSION WHAT SHARED|ALONE MARKERS: one half of a Slurm leg on this stream's cluster instance
    if [ "$3" = shared ]; then
        run_leg "$2, two at a time" "$1" \
            .venv/bin/python -m pytest --durations=25 -p no:cacheprovider -n 2 --dist loadfile -m "$4" tests/slurm
    else
        run_leg "$2, alone" "$1" .venv/bin/python -m pytest --durations=25 -p no:cacheprovider -m "$4" tests/slurm
    fi
}
leg_down() { # the xdist half leaves the cluster up; the next leg starts clean
    python3 tests/cluster/slurm-cluster down >/dev/null || true
}

# HAL's scale: 16 nodes x 2 ranks = 32 gloo ranks, ~1.5 min and ~14 GiB of the 24 GiB machine, so it waits
# for the unit and local tiers (two workers' tests): it follows them in the background stream, on cluster
# instance 2 (nodes l1..), beside the two Slurm streams' last tests (one small job each at a time). It runs at
# SCHED_IDLE (its cluster's daemons and ranks inherit it): it takes only the CPU they leave, which is a
# third of it there (they wait on Slurm: requeues, signals' grace, KillWait; CPU sampled in rehearsal 33).
# At nice 0, its 32 ranks' imports starved a side test's 4 ranks through their cancel's KillWait
# (rehearsal 21; docs/testing.md). 16 x 3 = 48 also completes (~20 GiB) but leaves CI too thin a margin;
# run it by hand. It needs root, as the Slurm tier does.
idle=(nice -n 19)
if chrt --idle 0 true 2>/dev/null; then
    idle=(chrt --idle 0 nice -n 19)
fi

# The background stream: unit and local tiers in one pytest session (no cluster; the Slurm
# version only names the leg), then the scale smoke job. Their output goes to logs that are printed
# whole when the stream ends.
cpu_log=$(mktemp -t hpctrain-cpu-tiers.XXXXXX)
cpu_result=$(mktemp -t hpctrain-cpu-result.XXXXXX)
scale_log=$(mktemp -t hpctrain-scale-smoke.XXXXXX)
scale_result=$(mktemp -t hpctrain-scale-result.XXXXXX)
side_log=$(mktemp -t hpctrain-side-legs.XXXXXX)
side_result=$(mktemp -t hpctrain-side-result.XXXXXX)
echo "===== scripts/test.sh: unit and local tiers, in the background (log printed when they end)"
(
    started=$(date +%s)
    # no cache provider: the foreground sessions write .pytest_cache at the same time. Two workers, a
    # file each (its module fixtures stay shared): at nice 10 they take only what the Slurm legs leave,
    # and one process could use one core at most while those legs wait on Slurm (docs/testing.md)
    if nice -n 10 .venv/bin/python -m pytest --durations=25 -p no:cacheprovider -n 2 --dist loadfile \
        tests/unit tests/local >"$cpu_log" 2>&1; then
        result=passed
    else
        result="FAILED ($?)"
    fi
    leg_line "unit and local tiers" "-" "$result" "$(($(date +%s) - started))" >"$cpu_result"
    if [ "$(id -u)" = 0 ]; then
        started=$(date +%s)
        if HPCTRAIN_SLURM_INSTANCE=$SCALE_INSTANCE HPCTRAIN_TEST_SLURM=24.11 "${idle[@]}" \
            tests/cluster/scale-smoke 16 2 >"$scale_log" 2>&1; then
            result=passed
        else
            result="FAILED ($?)"
        fi
        leg_line "scale smoke, 16 x 2 ranks" 24.11 "$result" "$(($(date +%s) - started))" >"$scale_result"
    fi
) &
cpu_pid=$!
side_pid=
# A stop of the script (Ctrl-C, CI's limit) ends the background streams too.
stop_streams() {
    for pid in $cpu_pid $side_pid; do
        pkill -TERM -P "$pid" 2>/dev/null
        kill "$pid" 2>/dev/null || true
    done
}
trap stop_streams EXIT

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

IFS='|' read -r version what shared alone <<<"${main_legs[0]}"
slurm_half "$version" "$what" shared "$shared"
echo "===== scripts/test.sh: the side releases' contract subsets, beside this, on cluster instance $SIDE_INSTANCE (log printed when they end)"
(
    renice -n 5 -p "$BASHPID" >/dev/null # before anything starts: pytest, the cluster's daemons and jobs inherit it
    export HPCTRAIN_SLURM_INSTANCE=$SIDE_INSTANCE
    summary=()
    failed=0
    for leg in "${side_legs[@]}"; do
        IFS='|' read -r version what shared alone <<<"$leg"
        slurm_half "$version" "$what" shared "$shared"
        slurm_half "$version" "$what" alone "$alone"
        leg_down
    done
    printf '%s\n' "${summary[@]}" >"$side_result"
    exit "$failed"
) >"$side_log" 2>&1 &
side_pid=$!
slurm_half "$version" "$what" alone "$alone"
leg_down

wait "$cpu_pid" || true
echo "===== scripts/test.sh: unit and local tiers (the background stream's log)"
cat "$cpu_log"
summary+=("$(cat "$cpu_result")")
case "$(cat "$cpu_result")" in *passed*) ;; *) failed=1 ;; esac
if [ "$(id -u)" = 0 ]; then
    echo "===== scripts/test.sh: scale smoke, 16 x 2 ranks on Slurm 24.11, cluster instance $SCALE_INSTANCE (the background stream's log)"
    cat "$scale_log"
    if [ -s "$scale_result" ]; then
        summary+=("$(cat "$scale_result")")
        case "$(cat "$scale_result")" in *passed*) ;; *) failed=1 ;; esac
    else
        summary+=("scale smoke: FAILED (ended without a result)")
        failed=1
    fi
elif [ -n "${CI:-}" ]; then
    summary+=("scale smoke: FAILED (needs root)")
    failed=1
fi

wait "$side_pid" || true
trap - EXIT
echo "===== scripts/test.sh: the side releases' contract subsets (their log)"
cat "$side_log"
if [ -s "$side_result" ]; then
    mapfile -t side_lines <"$side_result"
    summary+=("${side_lines[@]}")
    case "$(cat "$side_result")" in *FAILED*) failed=1 ;; esac
else
    summary+=("the side releases' contract subsets: FAILED (ended without a result)")
    failed=1
fi
rm -f "$cpu_log" "$cpu_result" "$scale_log" "$scale_result" "$side_log" "$side_result"
echo "===== scripts/test.sh: the matrix ($(($(date +%s) - matrix_started))s in all)"
printf '  %s\n' "${summary[@]}"
exit "$failed"
