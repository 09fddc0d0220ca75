"""The word check's cost per take: what `read` spends transcribing each finished take and
scoring it against its line (`engine.quality.said.WordCheck`, the recogniser `auto` finds).

    python bench/bench_read_words.py [--asr pocketsphinx] [--takes 12] [--json out]

Takes of real speech (piper's 'joe' saying the test sentences, at a take's level), each
scored against its own line and against another line, and takes of noise as an untrained
model makes (the tiny model's): seconds per take, per second of audio, and the word error
rates of right and wrong lines, so the threshold (`ReadRequest.wer_max`) can be read off.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from statistics import mean

os.environ.setdefault("OMP_NUM_THREADS", "1")
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--asr", default="auto", help="the recogniser (as read --asr)")
    parser.add_argument("--takes", type=int, default=12, help="takes of speech (at most 12)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)

    import numpy as np

    from engine.audio.resample import resample
    from engine.config.read import ReadRequest
    from engine.quality.said import WordCheck
    from tests.helpers.speech import SENTENCES, make_synth

    synth = make_synth()
    check = WordCheck(args.asr)
    sentences = SENTENCES[:max(1, min(args.takes, len(SENTENCES)))]
    takes = [0.5 * resample(*synth(text), 24000) for text in sentences]
    started = time.perf_counter()
    check.score(takes[0], 24000, sentences[0], "english")  # the recogniser's load
    load_s = time.perf_counter() - started
    rows = []
    for i, (text, audio) in enumerate(zip(sentences, takes, strict=True)):
        started = time.perf_counter()
        said = check.score(audio, 24000, text, "english")
        spent = time.perf_counter() - started
        wrong = check.score(audio, 24000, sentences[(i + 1) % len(sentences)], "english")
        assert said is not None and wrong is not None, check.why_not("english")
        rows.append({"audio_s": len(audio) / 24000, "check_s": spent, "wer": said.wer,
                     "wrong_wer": wrong.wer})
    rng = np.random.default_rng(0)
    noise = []
    for _ in range(4):  # two seconds of an untrained model's hiss, as the tiny model's takes
        audio = (0.05 * rng.standard_normal(48000)).astype(np.float32)
        started = time.perf_counter()
        check.score(audio, 24000, sentences[0], "english")
        noise.append(time.perf_counter() - started)
    figures = {
        "recogniser": check.name,
        "load_s": round(load_s, 3), "takes": len(rows),
        "speech_check_s_per_take": round(mean(r["check_s"] for r in rows), 3),
        "speech_take_s": round(mean(r["audio_s"] for r in rows), 2),
        "check_s_per_audio_s": round(sum(r["check_s"] for r in rows)
                                     / sum(r["audio_s"] for r in rows), 3),
        "noise_check_s_per_2s_take": round(mean(noise), 3),
        "right_line_wer": {"mean": round(mean(r["wer"] for r in rows), 3),
                           "max": round(max(r["wer"] for r in rows), 3)},
        "wrong_line_wer": {"mean": round(mean(r["wrong_wer"] for r in rows), 3),
                           "min": round(min(r["wrong_wer"] for r in rows), 3)},
        "wer_max_default": ReadRequest(script="x.txt").wer_max,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
