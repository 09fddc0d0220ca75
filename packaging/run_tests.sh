#!/usr/bin/env bash
# Install everything (idempotent) and run the whole test suite.
#
#   bash packaging/run_tests.sh            # the suite, then the numeric-parity
#                                          # tests again under other CPU kernels
#   bash packaging/run_tests.sh ARGS...    # pytest ARGS only (no second pass)
#
# The suite runs in two pytest processes side by side: the modules whose tests start
# their own Ray cluster (`--part own`: the journey, failover, S3, two nodes...) and all
# the others (`--part shared`, on the session's one shared cluster). An own-cluster test
# spends much of its time waiting on processes that start, so the two overlap well on
# two cores. VOXSHARD_TEST_SPLIT=0 runs them in one process, one after the other.
#
# The second pass reruns the tests marked `parity` (two different computations
# compared to a tolerance) with ATen forced to its plain kernels
# (ATEN_CPU_CAPABILITY=default), and to AVX2 when this CPU offers more, so a test
# that only holds for one processor's vector width fails on every machine.
# VOXSHARD_DISPATCH_PASS=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/setup_venv.sh --test
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export QT_QPA_PLATFORM=offscreen
export RAY_TRAIN_ENABLE_PRINT_PATCH=0
# A real sound device for the recording/playback tests (null sink); without
# PulseAudio those tests skip with the reason.
if command -v pulseaudio >/dev/null; then bash packaging/start_pulseaudio.sh || true; fi
py=./.venv/bin/python
if [ $# -gt 0 ] || [ "${VOXSHARD_DISPATCH_PASS:-1}" = "0" ]; then
  exec "$py" -m pytest "$@"
fi
status=0
# every pass's temp folders (trained runs, models, renders: some GB a run) go at the end;
# VOXSHARD_TEST_KEEP_TEMP=1 leaves them to look into a failure
temps=()
cleanup() { [ "${VOXSHARD_TEST_KEEP_TEMP:-0}" = "1" ] || rm -rf "${temps[@]}"; }
trap cleanup EXIT
# the main pass keeps its tiny model, prepared voice and trained runs here, and the
# parity passes load them instead of training again (tests/helpers/kept.py)
keep=$(mktemp -d "${TMPDIR:-/tmp}/voxshard-kept.XXXXXX")
# its own basetemp: pytest prunes all but the newest three numbered ones, so another
# pytest on this machine could delete what the parity passes still load
main_base=$(mktemp -d "${TMPDIR:-/tmp}/voxshard-main.XXXXXX")
temps+=("$keep" "$main_base")
if [ "${VOXSHARD_TEST_SPLIT:-1}" = "0" ]; then
  VOXSHARD_TEST_KEEP=$keep "$py" -m pytest --basetemp "$main_base/t" || status=$?
else
  own_base=$(mktemp -d "${TMPDIR:-/tmp}/voxshard-own.XXXXXX")
  temps+=("$own_base")
  ( unset VOXSHARD_TEST_KEEP
    "$py" -m pytest --part own -p no:cacheprovider --basetemp "$own_base/t" 2>&1 \
      | sed -u "s/^/[own cluster] /"
    exit "${PIPESTATUS[0]}" ) &
  own=$!
  VOXSHARD_TEST_KEEP=$keep "$py" -m pytest --part shared --basetemp "$main_base/t" \
    || status=$?
  wait "$own" || status=$?
fi
cap=$("$py" -c "import torch; print(torch.backends.cpu.get_cpu_capability())")
dispatches="default"
case "$cap" in AVX512*) dispatches="default avx2" ;; esac
# the passes are single-threaded: run them side by side, each in its own temp folder
pids=()
for d in $dispatches; do
  base=$(mktemp -d "${TMPDIR:-/tmp}/voxshard-parity-$d.XXXXXX")
  temps+=("$base")
  ( echo "== numeric-parity tests again with ATEN_CPU_CAPABILITY=$d (this CPU: $cap)"
    if [ "$d" = avx2 ]; then  # MKL's and oneDNN's kernels too, as on an AVX2-only CPU
      export MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
    fi
    ATEN_CPU_CAPABILITY=$d VOXSHARD_TEST_KEEP=$keep "$py" -m pytest -m parity -q -p no:cacheprovider \
      --basetemp "$base/t" --durations=5 2>&1 | sed "s/^/[$d] /"
    exit "${PIPESTATUS[0]}" ) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
