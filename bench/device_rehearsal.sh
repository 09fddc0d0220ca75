#!/usr/bin/env bash
# Rehearse both GPU proofs' start on a bare machine, here on CPU (not part of the
# suite: it builds an environment, ~1 GiB, and runs the proofs for minutes).
#
#   bash bench/device_rehearsal.sh [WORKDIR]      # default /tmp/voxshard-rehearsal
#
# 1. A fresh virtual environment deliberately unlike the project's and like
#    the lent H200 (the device tool's notes: Python 3.12, torch 2.11, transformers
#    5.17, accelerate 1.15, huggingface_hub 1.33, tokenizers 0.23): $PYTHON
#    (python3.12 where there is one) and a CPU torch from a wheel on local disk
#    ($TORCH_WHEEL: 2.11 where there is one), those exact library versions,
#    numpy, scipy, numba, einops, safetensors, nvidia-ml-py, peft, psutil,
#    pyyaml; no Ray, qwen-tts, librosa, soundfile (checked). What differs from
#    the lent machine is printed.
# 2. Both proofs in it without the kit: each must stop with one line naming
#    what is missing (exit 2), no traceback.
# 3. The kit (bench/device_kit.sh for this Python) installed with --target,
#    exactly as printed by the kit script, then `gpu_proof --tiny` through the
#    Ray-free path (Ray is absent, so its row says so) and
#    `gpu_speech_proof --tiny`, each printing its rows as they finish and
#    leaving them in $WORKDIR/out.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-/tmp/voxshard-rehearsal}"
# Python 3.12 where it runs and a CPU torch wheel for it is on disk, else 3.11
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3.11
  if python3.12 -V > /dev/null 2>&1; then
    if ls /opt/wheels/torch-*+cpu-cp312-*.whl > /dev/null 2>&1; then PYTHON=python3.12
    else echo "rehearsal: python3.12 is here, but no CPU torch wheel for it: Python 3.11"; fi
  fi
fi
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
TAG="cp${PYVER/./}"
# a CPU build only: the registry's plain torch wheels pull CUDA
TORCH_WHEEL="${TORCH_WHEEL:-$(ls /opt/wheels/torch-2.11.*+cpu-"$TAG"-*.whl \
  /opt/wheels/torch-*+cpu-"$TAG"-*.whl 2>/dev/null | head -1 || true)}"
if [ -z "$TORCH_WHEEL" ] || [ ! -f "$TORCH_WHEEL" ]; then
  echo "rehearsal: no CPU torch wheel for $TAG on local disk; set TORCH_WHEEL=path" >&2
  exit 2
fi
TORCH_VERSION="$(basename "$TORCH_WHEEL" | cut -d- -f2)"
[ "$PYVER" = 3.12 ] || echo "rehearsal: Python $PYVER; the lent machine runs 3.12"
case "$TORCH_VERSION" in 2.11.*) ;; *)
  echo "rehearsal: torch $TORCH_VERSION here; the lent machine runs 2.11 (no CPU wheel of it here)" ;;
esac
mkdir -p "$WORK"
VENV="$WORK/venv"
if [ ! -x "$VENV/bin/python" ]; then
  echo "rehearsal: building $VENV (Python $PYVER)"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "$TORCH_WHEEL"
  # the constraint keeps peft and accelerate from pulling another torch
  echo "torch==$TORCH_VERSION" > "$WORK/constraints.txt"
  "$VENV/bin/pip" install --quiet -c "$WORK/constraints.txt" transformers==5.17.0 \
    huggingface_hub==1.33.0 tokenizers==0.23.2 accelerate==1.15.0 numpy scipy numba einops \
    safetensors nvidia-ml-py peft psutil pyyaml
fi
"$VENV/bin/python" - <<'EOF'
import importlib.util, sys
import huggingface_hub, tokenizers, torch, transformers
present = [m for m in ("ray", "qwen_tts", "librosa", "soundfile")
           if importlib.util.find_spec(m) is not None]
assert not present, f"the rehearsal environment must not have {present}"
assert transformers.__version__.startswith("5."), transformers.__version__
assert huggingface_hub.__version__.startswith("1."), huggingface_hub.__version__
print(f"rehearsal: Python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, huggingface_hub {huggingface_hub.__version__}, "
      f"tokenizers {tokenizers.__version__}; no ray, qwen_tts, librosa, soundfile")
EOF

cd "$ROOT"
for proof in gpu_proof gpu_speech_proof; do
  echo "rehearsal: $proof without the kit (must name what is missing in one line)"
  set +e
  "$VENV/bin/python" bench/$proof.py --tiny > "$WORK/bare-$proof.out" 2>&1
  rc=$?
  set -e
  cat "$WORK/bare-$proof.out"
  if [ "$rc" -ne 2 ] || [ "$(wc -l < "$WORK/bare-$proof.out")" -ne 1 ] \
      || grep -q Traceback "$WORK/bare-$proof.out"; then
    echo "rehearsal: FAILED - expected one line and exit 2 from $proof without the kit (rc $rc)" >&2
    exit 1
  fi
done

KIT="$WORK/kit"
PIP="$VENV/bin/python -m pip" bash "$ROOT/bench/device_kit.sh" --python-version "$PYVER" --dest "$KIT"
rm -rf "$KIT/site" "$WORK/out"
# exactly the command the kit prints
"$VENV/bin/python" -m pip install --quiet --no-index --no-deps --target "$KIT/site" "$KIT"/*.whl
echo "rehearsal: gpu_proof --tiny with the kit on PYTHONPATH"
set -o pipefail
# offline, as on the lent machine (nothing outside it can be reached)
export PYTHONPATH="$KIT/site" OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
timeout 1800 "$VENV/bin/python" bench/gpu_proof.py --tiny --out "$WORK/out" \
  --json "$WORK/proof.json" 2>&1 | grep --line-buffered -v '^{"rows"' | tee "$WORK/proof.out"
echo "rehearsal: gpu_speech_proof --tiny with the kit on PYTHONPATH"
timeout 1200 "$VENV/bin/python" bench/gpu_speech_proof.py --tiny --out "$WORK/out" \
  --json "$WORK/speech.json" 2>&1 | tee "$WORK/speech.out"
