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
#    pyyaml, and what Ray needs that the lent machine's image has (click, filelock,
#    packaging, protobuf, requests, pandas, pyarrow, fsspec, aiohttp); no Ray,
#    jsonschema, pydantic, qwen-tts, librosa, soundfile (checked). What differs
#    from the lent machine is printed.
# 2. Both proofs in it without the kit: each must stop with one line naming
#    what is missing (exit 2), no traceback.
# 3. The kit (bench/device_kit.sh for this Python) installed with --target,
#    exactly as printed by the kit script, twice: without the kit's Ray wheel
#    (as on a machine where Ray cannot be had) `gpu_proof --tiny` through the
#    Ray-free path (its Ray row says Ray is missing) and `gpu_speech_proof --tiny`;
#    then the whole kit, and `gpu_proof --tiny --configs plain` again, whose Ray
#    row runs Ray Train from the kit's Ray and must equal the Ray-free losses.
#    Each prints its rows as they finish and leaves them in $WORKDIR/out.
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
    safetensors nvidia-ml-py peft psutil pyyaml click filelock packaging protobuf requests \
    pandas pyarrow fsspec aiohttp
  # a newer typer pulls pydantic in; the lent machine's image has typer without it
  "$VENV/bin/pip" uninstall --quiet -y pydantic pydantic_core annotated-types typing-inspection
fi
"$VENV/bin/python" - <<'EOF'
import importlib.util, sys
import huggingface_hub, tokenizers, torch, transformers
present = [m for m in ("ray", "jsonschema", "pydantic", "qwen_tts", "librosa", "soundfile")
           if importlib.util.find_spec(m) is not None]
assert not present, f"the rehearsal environment must not have {present}"
assert transformers.__version__.startswith("5."), transformers.__version__
assert huggingface_hub.__version__.startswith("1."), huggingface_hub.__version__
print(f"rehearsal: Python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, huggingface_hub {huggingface_hub.__version__}, "
      f"tokenizers {tokenizers.__version__}; no ray, jsonschema, pydantic, qwen_tts, librosa, "
      "soundfile")
EOF

cd "$ROOT"
for proof in gpu_proof gpu_speech_proof; do
  echo "rehearsal: $proof without the kit (must name what is missing in one line)"
  set +e
  "$VENV/bin/python" -m bench.$proof --tiny > "$WORK/bare-$proof.out" 2>&1
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
rm -rf "$KIT/site" "$KIT/site-noray" "$WORK/out"
# the kit without its Ray part first: the Ray-free path where Ray cannot be had
RAY_PART='/(ray|jsonschema|jsonschema_specifications|referencing|rpds_py|pydantic|pydantic_core|annotated_types|typing_inspection)-[0-9]'
mapfile -t RAYLESS < <(ls "$KIT"/*.whl | grep -v -E "$RAY_PART")
"$VENV/bin/python" -m pip install --quiet --no-index --no-deps --target "$KIT/site-noray" \
  "${RAYLESS[@]}"
set -o pipefail
# offline, as on the lent machine (nothing outside it can be reached)
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
echo "rehearsal: gpu_proof --tiny, the kit without Ray on PYTHONPATH (the Ray-free path)"
PYTHONPATH="$KIT/site-noray" timeout 1800 "$VENV/bin/python" -m bench.gpu_proof --tiny \
  --out "$WORK/out/noray" --json "$WORK/proof-noray.json" 2>&1 \
  | grep --line-buffered -v '^{"rows"' | tee "$WORK/proof-noray.out"
echo "rehearsal: gpu_speech_proof --tiny, the kit without Ray on PYTHONPATH"
PYTHONPATH="$KIT/site-noray" timeout 1200 "$VENV/bin/python" -m bench.gpu_speech_proof --tiny \
  --out "$WORK/out" --json "$WORK/speech.json" 2>&1 | tee "$WORK/speech.out"
# then the whole kit, exactly the command the kit prints: Ray Train from the kit's Ray
"$VENV/bin/python" -m pip install --quiet --no-index --no-deps --target "$KIT/site" "$KIT"/*.whl
echo "rehearsal: gpu_proof --tiny --configs plain, the whole kit (its Ray row through Ray Train)"
PYTHONPATH="$KIT/site" timeout 1800 "$VENV/bin/python" -m bench.gpu_proof --tiny --configs plain \
  --no-reinforce --out "$WORK/out/ray" --json "$WORK/proof-ray.json" 2>&1 \
  | grep --line-buffered -v '^{"rows"' | tee "$WORK/proof-ray.out"
"$VENV/bin/python" - "$WORK/proof-noray.json" "$WORK/proof-ray.json" <<'EOF'
import json, sys
noray = {r["config"]: r for r in json.load(open(sys.argv[1]))["rows"]}
ray = {r["config"]: r for r in json.load(open(sys.argv[2]))["rows"]}
assert noray["plain via Ray"].get("error", "").startswith("Ray is not installed"), noray
assert "error" not in noray["plain"], noray["plain"]
via = ray["plain via Ray"]
assert "error" not in via and via.get("ray_equal") is True, via
print("rehearsal: both paths ran: Ray-free where Ray is absent, and Ray Train from the kit, "
      "its losses equal to the Ray-free run's")
EOF
