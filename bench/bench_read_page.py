"""What the Read page costs per finished take on a long book: printed, never asserted.

    QT_QPA_PLATFORM=offscreen python -m bench.bench_read_page [--lines 1000] [--events 20]

Builds a workspace of one instant voice of the tiny random test model and a script of
`--lines` lines (each of one to three sentences: one part each at the default chunk
length), plans it once (`make_plan`: the script, the voices, their model's fingerprint,
every take on disk), writes a short take of every part of every line as a render would,
then times:

- one `make_plan` of the whole book, takes on disk;
- the page's whole refresh (a plan and every row filled: a script opened or edited);
- the page's update for one finished take: a render's progress event handed to the
  page's own handler (`ReadPage._event`), as a job delivers it, for `--events` lines
  spread over the book (median and worst).

Before a finished take re-read only its line, each event re-planned the whole book, so
a render's page work grew with the square of the book's length.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_NUM_THREADS", "1")
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401



def _script(path: Path, lines: int) -> None:
    from bench.bench_read import SENTENCES

    rows = [" ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(1 + i % 3))
            for i in range(lines)]
    path.write_text("# Bench\n\n" + "\n\n".join(rows) + "\n", encoding="utf-8")


def _takes(request: object) -> float:
    """A short take of every part of every line, written as a render writes one; returns
    the seconds `make_plan` took."""
    import numpy as np
    import soundfile as sf

    from engine.core.atomic import write_json
    from engine.layout import reading
    from engine.read.project import make_plan

    started = time.perf_counter()
    plan = make_plan(request)  # type: ignore[arg-type]
    took = time.perf_counter() - started
    audio = np.zeros(2400, dtype=np.float32)
    for planned in plan.lines:
        for part in planned.parts:
            folder = reading.takes_dir(plan.project, part.key)
            folder.mkdir(parents=True, exist_ok=True)
            sf.write(reading.take_audio(plan.project, part.key, 1), audio, 24000)
            write_json(reading.take_record(plan.project, part.key, 1),
                       {"identity": part.identity, "line": planned.number,
                        "part": part.index + 1, "text": planned.line.text,
                        "spoken": part.text, "seed": 1, "problems": []})
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--events", type=int, default=20)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-read-page-"))
    try:
        return _bench(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _bench(args: argparse.Namespace, root: Path) -> int:
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from engine.config.read import ReadRequest
    from engine.model.tiny import make_tiny_model
    from engine.read.project import make_plan
    from gui.context import AppContext
    from gui.pages.read import ReadPage
    from tests.helpers.reading import instant_voice

    app = QApplication.instance() or QApplication(sys.argv)
    model = make_tiny_model(root / "tiny", seed=0)
    ws = root / "ws"
    ws.mkdir()
    instant_voice(ws, "Ada", model, 180.0)
    script = root / "book.txt"
    _script(script, args.lines)
    request = ReadRequest(script=str(script), workspace=str(ws), voice="ada",
                          word_check=False)
    _takes(request)
    started = time.perf_counter()
    plan = make_plan(request)
    plan_s = time.perf_counter() - started
    takes = sum(len(p.parts) for p in plan.lines)

    settings = QSettings(str(root / "voxshard.ini"), QSettings.Format.IniFormat)
    settings.setValue("workspace", str(ws))
    ctx = AppContext(settings)
    page = ReadPage(ctx)
    page.resize(1100, 760)
    page.show()
    page.narrator.setCurrentIndex(page.narrator.findData("ada"))
    page.script.setText(str(script))
    started = time.perf_counter()
    page.refresh()
    app.processEvents()
    refresh_s = time.perf_counter() - started
    step = max(1, args.lines // args.events)
    times = []
    for done, number in enumerate(range(1, args.lines + 1, step), 1):
        started = time.perf_counter()
        page._event({"event": "progress", "stage": "render", "done": done, "total": takes,
                     "line": number, "part": 1, "eta_s": 10.0})
        app.processEvents()
        times.append(time.perf_counter() - started)
    ctx.player.stop()
    ctx.jobs.shutdown(10000)
    ctx.reader.shutdown()
    load = os.getloadavg()[0]
    print(f"Read page, {args.lines} lines ({takes} takes); load average {load:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"  make_plan of the book        {plan_s * 1000:9.1f} ms")
    print(f"  the page's whole refresh     {refresh_s * 1000:9.1f} ms")
    print(f"  page update per finished take {statistics.median(times) * 1000:8.1f} ms median,"
          f" {max(times) * 1000:.1f} ms worst ({len(times)} events)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
