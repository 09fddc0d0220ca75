#!/usr/bin/env bash
# Install everything (idempotent) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/setup_venv.sh --test
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export QT_QPA_PLATFORM=offscreen
export RAY_TRAIN_ENABLE_PRINT_PATCH=0
# A real sound device for the recording/playback tests (null sink); without
# PulseAudio those tests skip with the reason.
if command -v pulseaudio >/dev/null; then bash packaging/start_pulseaudio.sh || true; fi
exec ./.venv/bin/python -m pytest "$@"
