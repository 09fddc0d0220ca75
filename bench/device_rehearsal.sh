#!/usr/bin/env bash
# Rehearse the GPU proof's start on a bare machine, here on CPU (not part of the
# suite: it builds an environment, ~1 GiB, and runs the proof for minutes).
#
#   bash bench/device_rehearsal.sh [WORKDIR]      # default /tmp/voxshard-rehearsal
#
# 1. A fresh virtual environment deliberately unlike the project's and like
#    the GPU box (issue 18): CPU torch 2.13.0 from a wheel on local disk
#    ($TORCH_WHEEL), transformers 5.x, huggingface_hub 1.x, tokenizers 0.23,
#    accelerate, numpy, scipy, numba, einops, safetensors, nvidia-ml-py, peft;
#    no Ray, qwen-tts, librosa, soundfile (checked).
# 2. gpu_proof in it without the kit: it must stop with one line naming what
#    is missing (exit 2), no traceback.
# 3. The kit (bench/device_kit.sh for this Python) installed with --target,
#    exactly as printed by the kit script, then `gpu_proof --tiny` through the
#    Ray-free path (Ray is absent, so its row says so) to its table.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-/tmp/voxshard-rehearsal}"
PYTHON="${PYTHON:-python3.11}"
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
TAG="cp${PYVER/./}"
TORCH_WHEEL="${TORCH_WHEEL:-$(ls /opt/wheels/torch-2.13.0+cpu-"$TAG"-*.whl 2>/dev/null | head -1)}"
if [ -z "$TORCH_WHEEL" ] || [ ! -f "$TORCH_WHEEL" ]; then
  echo "rehearsal: no CPU torch 2.13.0 wheel for $TAG on local disk; set TORCH_WHEEL=path" >&2
  exit 2
fi
mkdir -p "$WORK"
VENV="$WORK/venv"
if [ ! -x "$VENV/bin/python" ]; then
  echo "rehearsal: building $VENV (Python $PYVER)"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "$TORCH_WHEEL"
  # the constraint keeps peft and accelerate from pulling another torch
  echo "torch==2.13.0+cpu" > "$WORK/constraints.txt"
  "$VENV/bin/pip" install --quiet -c "$WORK/constraints.txt" transformers==5.17.0 \
    huggingface_hub==1.33.0 tokenizers==0.23.2 accelerate==1.15.0 numpy scipy numba einops \
    safetensors nvidia-ml-py peft psutil
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
echo "rehearsal: the proof without the kit (must name what is missing in one line)"
set +e
"$VENV/bin/python" bench/gpu_proof.py --tiny > "$WORK/bare.out" 2>&1
rc=$?
set -e
cat "$WORK/bare.out"
if [ "$rc" -ne 2 ] || [ "$(wc -l < "$WORK/bare.out")" -ne 1 ] || grep -q Traceback "$WORK/bare.out"; then
  echo "rehearsal: FAILED - expected one line and exit 2 without the kit (rc $rc)" >&2
  exit 1
fi

KIT="$WORK/kit"
PIP="$VENV/bin/python -m pip" bash "$ROOT/bench/device_kit.sh" --python-version "$PYVER" --dest "$KIT"
rm -rf "$KIT/site"
# exactly the command the kit prints
"$VENV/bin/python" -m pip install --quiet --no-index --no-deps --target "$KIT/site" "$KIT"/*.whl
echo "rehearsal: gpu_proof --tiny with the kit on PYTHONPATH"
PYTHONPATH="$KIT/site" OMP_NUM_THREADS=1 timeout 1200 "$VENV/bin/python" bench/gpu_proof.py --tiny \
  --json "$WORK/proof.json" 2>&1 | grep -v '^{"rows"' | tee "$WORK/proof.out"
