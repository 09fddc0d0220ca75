#!/usr/bin/env bash
# Both GPU proofs in one command on a lent GPU machine (issue 29): the kit, then
# speech 0.6B, training 0.6B, speech 1.7B and training 1.7B while the time lasts,
# every row in $OUT as it finishes (a command killed at its limit keeps them).
#
# Here, first (where the package registry is reachable):
#   bash bench/device_kit.sh              # build/device-kit: wheels for Python 3.12
# Then, as one device command (the kit travels as a carried path):
#   run(command="bash bench/device_proofs.sh", carry=["build/device-kit"], timeout_s=600)
#
#   bash bench/device_proofs.sh [SECONDS]   # default 540: ends inside a 10-minute command
#
# $OUT gets: gpu.txt (nvidia-smi), proofs.log (everything printed), and one folder per
# stage with its rows (speech-0.6b/, train-0.6b/, speech-1.7b/, train-1.7b/): within the
# device tool's 8 files, 2 folders down. Nothing here reaches the network: the models are
# random weights written on the machine, and the hub client is told so (HF_HUB_OFFLINE).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TOTAL="${1:-540}"
OUT="${OUT:-$ROOT/build/proof-out}"
KIT="${KIT:-build/device-kit}"
PY="${PYTHON:-python3}"
START=$(date +%s)
mkdir -p "$OUT"
exec > >(tee "$OUT/proofs.log") 2>&1

left() { echo $((TOTAL - ($(date +%s) - START))); }

if ! ls "$KIT"/*.whl > /dev/null 2>&1; then
  echo "device_proofs: no kit in $KIT; build it where the registry is reachable (bash bench/device_kit.sh) and carry $KIT."
  exit 2
fi
SITE=/tmp/voxshard-kit-site
rm -rf "$SITE"
if ! "$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "$KIT"/*.whl; then
  echo "device_proofs: the kit did not install for $("$PY" -V 2>&1); build it for that Python (bash bench/device_kit.sh --python-version X.Y)."
  exit 2
fi
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader \
  | tee "$OUT/gpu.txt"
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"

# stage NAME SECONDS-AT-MOST SCRIPT ARGS...: runs while time is left, within its share
stage() {
  local name="$1" cap="$2"; shift 2
  local budget; budget=$(left)
  [ "$budget" -gt "$cap" ] && budget="$cap"
  if [ "$budget" -lt 30 ]; then
    echo "device_proofs: $name not started: its share of the $(left) s left is under 30 s"
    return 0
  fi
  echo "device_proofs: $name, up to $budget s"
  "$PY" "$@" --budget-s "$budget" --out "$OUT/$name" || echo "device_proofs: $name exited $?"
}

# the shares keep a later stage's first figure in reach; each proof stops itself at its budget
stage speech-0.6b 150 -m bench.gpu_speech_proof --sizes 0.6b
# --ray: the kit carries Ray, so the plain configuration runs through Ray Train there too
stage train-0.6b $(( $(left) - 150 )) -m bench.gpu_proof --sizes 0.6b --ray
stage speech-1.7b 120 -m bench.gpu_speech_proof --sizes 1.7b
stage train-1.7b "$(left)" -m bench.gpu_proof --sizes 1.7b
echo "device_proofs: done in $(( $(date +%s) - START )) s"
