#!/usr/bin/env bash
# Install the stack if needed (see tools/install.sh), then run the test suite.
# As root on Debian/Ubuntu it also installs Slurm (slurm-wlm, munge) for the launcher tests,
# which start a private one-host cluster of their own (temporary SLURM_CONF, munged and ports, so a
# cluster already running is left alone); elsewhere they are skipped with the reason (under
# CI=true on such a root machine, they fail instead).
# Without arguments: three stages, each timed: the main suite; then the slow tests (marker "slow": the
# detection demo's learning floors, the whole tiny GPU check, most launched multi-process runs) with the
# cluster tests (marker "cluster") beside them in a second pytest. Tests marked "long" (the
# segmentation demo's learning floors, half an hour on a slow day) are left out of all three:
# `bash tools/run_tests.sh -m long` runs them.
# `quick`: the unit tests that need no launched run (marker "quick"), a few minutes, for users.
# Other arguments go to one pytest run instead, e.g. bash tools/run_tests.sh -k backbone
# Each stage's time is printed against its budget on the developers' machine (2 CPU cores; see
# docs/testing.md, "Budgets"): a stage over it says so, without failing the run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/install.sh"
if ! command -v slurmctld >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[tests] installing slurm-wlm and munge for the Slurm launcher tests"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; } \
    || echo "[tests] could not install Slurm: the Slurm tests will be skipped (fail under CI=true)"
fi
VENV="${XCIT_VENV:-$ROOT/.venv}"
cd "$ROOT"
pytest_run() { "$VENV/bin/python" -m pytest tests -q -p no:cacheprovider -rs "$@"; }
# the main stage, the quick check and the slow stage in two pytest-xdist workers, each test file in one
# of them (its module fixtures built once) and the files in their collection order (the detection demo,
# the longest, among the first): most main-stage tests are a single process's Python, which one core
# runs; the slow stage's launched runs leave a core idle while their processes start and import
TWO_WORKERS=(-n 2 --dist loadfile --no-loadscope-reorder)
# seconds: the quick check, the three stages, and all of a run without arguments, the install included;
# the cluster stage runs beside the slow stage, within the 1,600 s of the two
declare -A BUDGET=([quick]=180 ["not cluster and not slow and not long"]=600 ["slow and not long"]=1600 \
  [cluster]=1600 ["slow and cluster"]=1600 [all]=2400)
took() {  # WHAT SECONDS BUDGET: the line that gives a time against its budget
  local over=""
  [ "$2" -le "$3" ] || over=", over it by $(($2 - $3)) s"
  echo "[tests] $1 took $2 s (budget $3 s$over)"
}
if [ "${1:-}" = quick ]; then
  shift
  start=$SECONDS
  pytest_run -m quick "${TWO_WORKERS[@]}" --durations=10 "$@" && status=0 || status=$?
  took "quick check" $((SECONDS - start)) "${BUDGET[quick]}"
  exit $status
fi
if [ $# -gt 0 ]; then
  pytest_run "$@"
  exit
fi
# the checks marked long (pytest.ini) are left out: `bash tools/run_tests.sh -m long` runs them
# In the stages, one OpenMP thread a launched process, as torchrun gives each of several processes (the
# launcher tests that check a user's default unset it): beside another worker and the cluster stage, a
# second thread mostly waits for the first, its barriers spinning on a core the others need (a tiny
# one-process training run beside two busy workers, two runs each: 31-33 CPU seconds with one thread,
# 37-39 with two; 50-54 s against 61-65 s of wall time).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
MAIN="not cluster and not slow and not long"
stage() {  # MARKERS [PYTEST ARGS...]: one stage, its twenty slowest tests and its time against its budget
  local start=$SECONDS rc=0
  pytest_run -m "$1" "${@:2}" --durations=20 || rc=$?
  took "stage -m \"$1\"" $((SECONDS - start)) "${BUDGET[$1]}"
  return $rc
}
status=0
echo "[tests] stage: -m \"$MAIN\""
stage "$MAIN" "${TWO_WORKERS[@]}" || status=$?
# The cluster stage runs beside the slow stage: its Slurm daemons and namespaced nodes spend most of
# their time waiting (scheduling, requeues, rendezvous, timeouts), so the two share the cores well.
# Its output is printed when both have ended. Job control gives it a process group of its own, which
# this script stops with SIGTERM if it ends first (a time limit, Ctrl-C): tests/conftest.py turns that
# into a KeyboardInterrupt, so its fixtures still stop their clusters (SIGINT may be ignored there).
echo "[tests] stages: -m \"slow and not long\", with -m \"cluster\" beside it (its output follows)"
start=$SECONDS
cluster_out="$(mktemp)"
set -m
stage cluster >"$cluster_out" 2>&1 &
cluster_pid=$!
set +m
trap 'kill -TERM -- "-$cluster_pid" 2>/dev/null || true; rm -f "$cluster_out"' EXIT
stage "slow and not long" "${TWO_WORKERS[@]}" || status=$?
wait "$cluster_pid" || status=$?
cat "$cluster_out"
took "the slow and cluster stages, side by side," $((SECONDS - start)) "${BUDGET[slow and cluster]}"
took "install and all stages" "$SECONDS" "${BUDGET[all]}"
exit $status
