"""A book's export in memory that does not grow with it: peak memory per program length.

    python bench/bench_read_export.py [--minutes 10 60 300] [--formats wav m4b] [--json out]

Each length is a synthetic program (speech-like noise bursts in takes of 20 s, a pause
after each, 40 distinct take files used in turn) exported by `engine.read.export.
write_program`, the `read` command's own path (two passes over the takes, the file
measured as written, a lossy one corrected once), in a fresh process whose peak
resident memory (ru_maxrss) is printed with the export's time and measured level, and
the slope of peak memory per hour of program.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401

TAKE_S = 20.0
PAUSE_S = 0.9
DISTINCT = 40


def _takes(folder: Path) -> list[Path]:
    import numpy as np
    import soundfile as sf
    from scipy.signal import lfilter

    from engine.audio.timebase import SAMPLE_RATE

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    t = np.arange(int(TAKE_S * SAMPLE_RATE)) / SAMPLE_RATE
    for i in range(DISTINCT):
        path = folder / f"take-{i:02d}.wav"
        if not path.exists():
            # syllable-rate bursts of coloured noise, its crest factor near speech's
            envelope = 0.2 + 0.8 * np.abs(np.sin(np.pi * (2.5 + i / 20) * t))
            noise = lfilter([1], [1, -0.9], np.clip(rng.standard_normal(len(t)), -3, 3))
            noise = noise * envelope
            sf.write(path, (noise * 0.02).astype("float32"), SAMPLE_RATE, subtype="PCM_16")
        paths.append(path)
    return paths


def child(minutes: float, fmt: str, work: Path) -> dict[str, float]:
    """One export in this process; its figures."""
    from engine.audio.timebase import SAMPLE_RATE
    from engine.read.export import Placed, Program, write_program

    takes = _takes(work / "takes")
    program = Program()
    at, n, take = 0, round(TAKE_S * SAMPLE_RATE), 0
    pause = round(PAUSE_S * SAMPLE_RATE)
    while at < minutes * 60 * SAMPLE_RATE:
        if take % 90 == 0:
            program.chapters.append((f"Chapter {len(program.chapters) + 1}", at))
        program.lines.append(Placed(take + 1, len(program.chapters) - 1, "ada", "...", at,
                                    at + n))
        program.parts += [(takes[take % DISTINCT], n), (None, pause)]
        at += n + pause
        take += 1
    started = time.perf_counter()
    written = write_program(program, work / f"book-{minutes:g}.{fmt}", -18.0, "bench")
    took = time.perf_counter() - started
    (work / f"book-{minutes:g}.{fmt}").unlink()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"minutes": minutes, "format": fmt, "export_s": round(took, 1),
            "peak_mib": round(peak, 1), "lufs": written["loudness_lufs"],
            "true_peak_dbtp": written["true_peak_dbtp"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, nargs="+", default=[10, 60, 300])
    ap.add_argument("--formats", nargs="+", default=["wav", "m4b"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        minutes, fmt, work = args.child
        print(json.dumps(child(float(minutes), fmt, Path(work))))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-read-export-"))
    rows = []
    print(f"{'format':6} {'minutes':>8} {'export s':>9} {'peak MiB':>9} {'LUFS':>7} "
          f"{'dBTP':>6}")
    for fmt in args.formats:
        for minutes in args.minutes:
            out = subprocess.run([sys.executable, __file__, "--child", str(minutes), fmt,
                                  str(work)], capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{fmt:6} {minutes:8g} {row['export_s']:9.1f} {row['peak_mib']:9.1f} "
                  f"{row['lufs']:7.2f} {row['true_peak_dbtp']:6.2f}", flush=True)
        mine = [r for r in rows if r["format"] == fmt]
        if len(mine) > 1:
            first, last = mine[0], mine[-1]
            slope = (last["peak_mib"] - first["peak_mib"]) / (
                (last["minutes"] - first["minutes"]) / 60)
            print(f"{fmt}: peak memory slope {slope:+.1f} MiB per hour of program "
                  f"({last['peak_mib'] / first['peak_mib'] - 1:+.1%} from "
                  f"{first['minutes']:g} to {last['minutes']:g} min)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
