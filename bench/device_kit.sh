#!/usr/bin/env bash
# The device kit: the wheels both GPU proofs (bench/gpu_proof.py, bench/gpu_speech_proof.py;
# run together by bench/device_proofs.sh) need on a bare GPU machine,
# downloaded here (where the package registry is reachable) for THAT machine's
# Python and platform, into an ignored folder small enough to travel with the
# checkout (the kit and the checkout within one device call's 64 MiB).
#
#   bash bench/device_kit.sh                       # Python 3.12, x86-64 manylinux
#   bash bench/device_kit.sh --python-version 3.11 --dest build/device-kit
#
# The bare machine is assumed to have torch, numpy, scipy, numba, einops,
# safetensors, accelerate, psutil, pyyaml, regex, a transformers 5.x with
# huggingface_hub 1.x and tokenizers 0.23, and none of the rest. The official
# model code (qwen-tts 0.1.1) is written against transformers 4.57.3, so the
# kit brings that transformers with the tokenizers and huggingface_hub it
# accepts (and requests, which huggingface_hub 0.x needs and 1.x dropped);
# installed with --target and put first on PYTHONPATH, they shadow the
# machine's own copies for this process only. librosa, soundfile and cffi are
# imported by the official code's inference modules; librosa's own needs that
# such a machine lacks come along (scikit-learn is not among them: librosa
# imports it lazily, and nothing the proof runs reaches it). pyloudnorm is the
# speech path's loudness meter (bench/gpu_speech_proof.py; numpy and scipy it
# finds there).
#
# Ray (the proof's Ray row: a local cluster and Ray Train, as the product runs) comes
# too, with what Ray needs that such a machine lacks (jsonschema and its parts,
# pydantic). Ray's own wheel is 79 MB, more than a device call carries, so the kit
# keeps it without what the Ray row never loads (the Java worker's jar, the
# dashboard's web client, RLlib, Ray's LLM library) and with its native programs'
# symbol tables stripped (bench/trim_wheel.py): about 34 MiB.
#
# Everything is downloaded with --no-deps --only-binary=:all:, so the lists
# below are the whole kit; the script checks that the kit and the checkout together
# fit one device call (64 MiB) and prints the one command that installs it on the
# GPU machine.
set -euo pipefail

PYVER=3.12
DEST=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) PYVER="$2"; shift 2 ;;
    --dest) DEST="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "device_kit: unknown argument $1 (use --python-version X.Y --dest DIR)" >&2; exit 2 ;;
  esac
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${DEST:-$ROOT/build/device-kit}"   # build/ is ignored by git
PIP="${PIP:-python3 -m pip}"

# pinned: the versions the project's own environment runs (pyproject.toml)
WHEELS=(
  qwen-tts==0.1.1
  transformers==4.57.3
  tokenizers==0.22.2
  huggingface_hub==0.36.2
  requests==2.34.2
  urllib3==2.8.0
  idna==3.20
  certifi==2026.10.19.post1
  charset_normalizer==3.5.3
  librosa==0.11.0
  audioread==3.1.0
  soxr==1.1.0
  lazy_loader==0.6
  pooch==1.9.0
  platformdirs==4.14.9
  joblib==1.6.0
  cloudpickle==3.1.3
  decorator==5.3.1
  msgpack==1.2.4
  soundfile==0.14.0
  cffi==2.1.1
  pycparser==3.12
  pyloudnorm==0.2.0
  ray==2.60.0
  jsonschema==4.26.0
  jsonschema-specifications==2025.9.1
  referencing==0.37.0
  rpds-py==2026.9.1
  pydantic==2.14.4
  pydantic_core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
)
#: what the Ray row never loads (the size of the wheel, not of Ray's features)
RAY_DROP=(ray/jars/ ray/rllib/ ray/dashboard/client/build/ ray/llm/)

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
# several manylinux tags: each wheel is published under one of them
$PIP download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  --dest "$DEST" "${WHEELS[@]}"

drops=()
for d in "${RAY_DROP[@]}"; do drops+=(--drop "$d"); done
PY="${PIP% -m pip}"; [ "$PY" != "$PIP" ] || PY=python3
$PY "$ROOT/bench/trim_wheel.py" "$DEST"/ray-*.whl "${drops[@]}"

count=$(ls "$DEST"/*.whl | wc -l)
bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
mib=$((bytes / 1048576))
echo "device_kit: ${count} wheels, ${mib} MiB in $DEST (Python $PYVER)"
if [ "$count" -ne "${#WHEELS[@]}" ]; then
  echo "device_kit: expected ${#WHEELS[@]} wheels, got $count" >&2; exit 1
fi
# the checkout travels with it, in the same 64 MiB; 2 MiB kept for what a session adds
tree=$(cd "$ROOT" && git ls-files -z 2>/dev/null | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
tree=${tree:-0}
if [ $((bytes + tree)) -gt $((62 * 1048576)) ]; then
  echo "device_kit: the kit ($mib MiB) and the checkout ($((tree / 1048576)) MiB) are over" \
       "the 62 MiB one device call can carry with room to spare" >&2; exit 1
fi
if [ "${DEST#"$ROOT"/}" != "$DEST" ]; then
  KIT="${DEST#"$ROOT"/}"; SITE="\$PWD/$KIT/site"   # inside the checkout: it travels with it
else
  KIT="$DEST"; SITE="$DEST/site"
fi
echo "On the GPU machine (from the checkout's root; $KIT must travel with the checkout):"
echo "  python -m pip install --quiet --no-index --no-deps --target $KIT/site $KIT/*.whl && PYTHONPATH=$SITE python -m bench.gpu_proof"
