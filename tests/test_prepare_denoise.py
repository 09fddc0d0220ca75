"""prepare --denoise: a noisy slice is denoised only where SNR, speaker similarity
and recognised words all hold or improve, and the report gives both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from engine.layout.voice import create_voice
from engine.prepare.importer import import_files
from engine.prepare.pipeline import prepare
from tests.helpers.mixtures import pink_noise


def test_denoise_only_where_nothing_gets_worse(piper_sentences: list[dict[str, Any]],
                                               tmp_path: Path) -> None:
    speech, sr = sf.read(piper_sentences[10]["path"], dtype="float32")
    enrol, _ = sf.read(piper_sentences[11]["path"], dtype="float32")
    rng = np.random.default_rng(1)
    pad = np.zeros(sr // 2, np.float32)
    x = np.concatenate([pad, speech, pad])
    power = float(np.mean(speech[np.abs(speech) > 0.01] ** 2))
    judged = []
    for name, noise in (("white10", rng.standard_normal(len(x))),
                        ("pink5", pink_noise(len(x), rng))):
        snr = float(name[-2:] if name[-2].isdigit() else name[-1])
        noise = noise / noise.std() * np.sqrt(power / 10 ** (snr / 10))
        src = tmp_path / name / "take.wav"
        src.parent.mkdir()
        sf.write(src, (x + noise).astype(np.float32), sr)
        src.with_suffix(".txt").write_text(piper_sentences[10]["text"])
        voice = create_voice(tmp_path / name / "voice", "Joe", "english")
        import_files(voice, [src])
        voice.add_take(enrol, piper_sentences[11]["text"], sample_rate=sr)  # the enrolment
        report = prepare(voice, denoise=True)
        clip = next(c for c in report["clips"] if c.get("denoise"))
        judged.append(clip)
    for clip in judged:
        d = clip["denoise"]
        snr, sim, wer = d["snr_db"], d["similarity"], d["wer"]
        assert None not in sim and None not in wer  # enrolled, and the clip has its text
        holds = snr[1] >= snr[0] and sim[1] >= sim[0] and wer[1] <= wer[0]
        assert d["applied"] == holds, d
        codes = [i["code"] for i in clip["issues"]]
        assert ("denoised" in codes) == holds
        if holds:
            assert clip["snr_db"] == snr[1]
    # white noise at 10 dB: spectral gating lifts the SNR by ~17 dB (measured 7.8 -> 24.6)
    white = judged[0]["denoise"]
    assert white["applied"] and white["snr_db"][1] > white["snr_db"][0] + 10
