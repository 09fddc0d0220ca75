"""Engine rules out of the window (issue 39): the Record page's verdict on clipping is
Prepare's, so a take Record keeps is one Prepare keeps, and one it refuses Prepare refuses."""

from __future__ import annotations

import numpy as np

from engine.prepare.check import check_recording
from gui.pages.record import judge_take

TEXT = "The neighbours painted their fence a bright shade of yellow on Sunday."


def _clipped(speech: np.ndarray, share: float) -> np.ndarray:
    """`speech` with pairs of full-scale samples (a flattened wave) on `share` of it."""
    out = speech.copy()
    pairs = int(share * len(out) / 2)
    starts = np.linspace(0, len(out) - 2, pairs).astype(int)
    out[starts] = out[starts + 1] = 1.0
    return out


def test_record_and_prepare_judge_a_clipped_take_alike(piper_synth) -> None:
    audio, sr = piper_synth(TEXT)
    speech = (0.6 * audio).astype(np.float32)
    # 0.07 %: under Prepare's limit (0.1 %); the page used to refuse above 0.05 %
    for share, refused in ((0.0007, False), (0.003, True)):
        take = _clipped(speech, share)
        prepare = {i["code"] for i in check_recording(take, sr, TEXT)["issues"]}
        record = [w for w in judge_take(take, sr, TEXT).warnings if w.startswith("Clipped")]
        assert ("clipping" in prepare) is refused, (share, prepare)
        assert bool(record) is refused, (share, record)
