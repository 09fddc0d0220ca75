#!/usr/bin/env bash
# Create or update the virtual environment at .venv in the checkout. Idempotent:
# a second run with unchanged requirements only checks a stamp.
#
#   bash packaging/setup_venv.sh                 # the app and engine
#   bash packaging/setup_venv.sh --test          # plus the test tools
#   bash packaging/setup_venv.sh --check         # only check the system libraries
#   sudo bash packaging/setup_venv.sh --system-deps --check   # as root: install the missing ones
#
# The system libraries pip cannot install (PortAudio, Qt's runtime and xcb libraries) are
# checked first, every run: the missing ones are printed with the one line that installs
# them for this machine's package manager (engine/core/syslibs.py, which the app asks too).
#
# TORCH_SPEC overrides the torch requirement (default torch==2.13.0, a CPU
# build; GPU users may set e.g. TORCH_SPEC="torch==2.13.0 --index-url ...").
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
system_deps=0
check_only=0
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    --system-deps) system_deps=1 ;;
    --check) check_only=1 ;;
    *) echo "setup_venv.sh: unknown option $arg (use --test, --system-deps or --check)" >&2
       exit 2 ;;
  esac
done
python=${PYTHON:-python3}

# the system Python runs the check: the venv may not exist yet (standard library only)
syscheck=("$python" -m engine.core.syslibs)
[ "$system_deps" = 1 ] && syscheck+=(--install)
if ! "${syscheck[@]}"; then
  # a missing library stops only --system-deps and --check; the venv can still be made
  if [ "$system_deps" = 1 ] || [ "$check_only" = 1 ]; then exit 1; fi
fi
[ "$check_only" = 1 ] && exit 0
torch_spec=${TORCH_SPEC:-torch==2.13.0}
qwen_spec="qwen-tts==0.1.1"

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.voxshard-stamp
want=$(cat pyproject.toml packaging/setup_venv.sh | sha256sum | cut -c1-16)"$extras $torch_spec"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip="./.venv/bin/python -m pip"
# torch first and pinned, so nothing later pulls a multi-GB CUDA build.
$pip install -q $torch_spec
# The official model code without its demo/25 Hz-tokenizer dependencies
# (gradio, torchaudio, sox, onnxruntime); see pyproject.toml.
$pip install -q --no-deps "$qwen_spec"
# Speaker similarity (engine.quality) without its webrtcvad source build: the prebuilt
# webrtcvad-wheels (same module) and its other needs come from pyproject.toml.
$pip install -q --no-deps "resemblyzer==0.1.4"
$pip install -q -e ".$extras"
echo "$want" > "$stamp"
