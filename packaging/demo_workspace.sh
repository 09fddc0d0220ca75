#!/usr/bin/env bash
# Build a real demo workspace, offline, with the engine CLI: what the README's
# screenshots are made from (gui/screenshots.py).
#
#   bash packaging/demo_workspace.sh WS_DIR
#   QT_QPA_PLATFORM=offscreen .venv/bin/python -m gui.screenshots \
#       --workspace WS_DIR --voice ada --out docs/screenshots
#
# WS_DIR must not exist or be empty. It ends up holding:
#   WS_DIR/models/tiny-base   the tiny random Qwen3-TTS Base model (make-tiny-model,
#                             seed 0: the tests' model; it speaks noise)
#   WS_DIR/ada                the voice "ada" (speaker Ada, english):
#     takes/                  12 English sentences spoken by piper's bundled 'joe'
#                             voice (the test suite's speech, tests/helpers/speech.py),
#                             each with its transcript, imported
#     prepared/               prepare's clips and quality report
#     runs/<run>/             a 24-step run on 2 CPU workers (Ray, FSDP over gloo),
#                             a checkpoint every 6 steps (the last 2 kept), a
#                             validation loss every 6, and its evaluation
#                             (evaluation/report.html; pocketsphinx and resemblyzer,
#                             both offline)
#     exports/ada             the export of the evaluation's best checkpoint
#     renders/                one sentence spoken by the export, and an A/B
#                             comparison of the run's checkpoints (compare-*)
#
# Nothing is downloaded (HF_HUB_OFFLINE=1). Every step prints its time; the
# whole build takes some minutes on 2 CPU cores. Needs the test extras
# (piper-tts and its voice: `bash packaging/setup_venv.sh --test`).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: bash packaging/demo_workspace.sh WS_DIR" >&2
  exit 2
fi
ws=$1
if [ -e "$ws" ] && [ -n "$(ls -A "$ws" 2>/dev/null)" ]; then
  echo "demo_workspace: $ws exists and is not empty; give a new folder" >&2
  exit 2
fi
mkdir -p "$ws"
ws=$(cd "$ws" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export TOKENIZERS_PARALLELISM=false RAY_TRAIN_ENABLE_PRINT_PATCH=0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
py=$repo/.venv/bin/python
E=$repo/.venv/bin/voxshard-engine
voice=$ws/ada
base=$ws/models/tiny-base
speech=$(mktemp -d)
trap 'rm -rf "$speech"' EXIT

t_all=$SECONDS
step() {  # step NAME COMMAND...: run it, say how long it took
  local name=$1 t=$SECONDS
  shift
  echo "== $name" >&2
  "$@"
  echo "== $name: $((SECONDS - t)) s" >&2
}

# The tiny random model the tests use (tests/helpers/model.py: make_tiny_model, seed 0).
step "tiny model" "$E" make-tiny-model "$base" --seed 0

# The test suite's speech, through its own fixtures' code (tests/helpers/speech.py):
# 12 sentences, piper without sampling noise, at 0.7 of full scale, 22.05 kHz WAVs
# with same-named .txt transcripts.
make_speech() {
  "$py" - "$speech" <<'EOF'
import sys
from pathlib import Path

from tests.helpers import speech

folder = Path(sys.argv[1])


class Folders:  # the one method of pytest's tmp_path_factory the fixture uses
    def mktemp(self, name: str) -> Path:
        path = folder / name
        path.mkdir()
        return path


synth = speech.piper_synth.__wrapped__()
for s in speech.piper_sentences.__wrapped__(Folders(), synth):
    print(f"{s['path'].name}  {s['duration_s']:.1f} s  {s['text']}")
EOF
}
step "speech (piper)" make_speech

step "voice new" "$E" voice new "$voice" --speaker Ada --language english
step "import" "$E" import "$voice" "$speech/piper_speech"
step "prepare" "$E" prepare "$voice"
# A short run on the tiny model: 24 steps, 2 CPU workers, a checkpoint every 6 steps.
# lr 1e-3: the tiny random model's loss visibly falls in 24 steps (the 1.7B default,
# 2e-6, would draw a flat line).
step "train" "$E" train "$voice" --base "$base" --cpu --workers 2 --steps 24 \
  --lr 1e-3 --checkpoint-every 6 --val-every 6
# Offline recogniser (pocketsphinx's bundled English model); resemblyzer ships its
# weights. The tiny model never ends a sentence by itself: --max-frames caps each render.
step "evaluate" "$E" evaluate "$voice" --asr pocketsphinx --device cpu --max-frames 60 --seed 0
step "export" "$E" export "$voice" "$voice/exports/ada"

# One sentence from the export into renders/, as the Listen page saves it: a
# timestamped WAV and the small JSON beside it (what said it, what was said), which
# the CLI's own `speak` does not write.
text="Hello, this is Ada speaking through her exported model."
render=$voice/renders/$(date +%Y%m%d-%H%M%S).wav
mkdir -p "$voice/renders"
step "speak" "$E" speak "$voice/exports/ada" "$text" -o "$render" --seed 0 --max-frames 60 \
  --device cpu
"$py" - "$render" "$text" "$voice/exports/ada" <<'EOF'
import sys
import time
from pathlib import Path

import soundfile as sf

from engine.core.atomic import write_json

render, text, export = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
write_json(render.with_suffix(".json"), {
    "text": text, "model": "Exported: ada", "source": {"kind": "export", "path": export},
    "duration_s": round(sf.info(str(render)).duration, 2),
    "created": time.strftime("%Y-%m-%d %H:%M:%S")})
EOF

# The A/B comparison the Listen page makes: every checkpoint of the run and the
# zero-shot clone, the same sentences, into renders/compare-* (its second tab).
step "compare" "$E" compare "$voice" "$voice/renders/compare-$(date +%Y%m%d-%H%M%S)" \
  --sentences "Good morning, the coffee is ready on the kitchen table." \
  "We will meet by the old stone bridge at noon." \
  --seed 0 --max-frames 60 --device cpu

step "status" "$E" status "$voice"
echo "demo workspace ready in $ws ($((SECONDS - t_all)) s)" >&2
