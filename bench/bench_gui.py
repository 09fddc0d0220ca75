"""How long the window stalls while engine events stream in: printed, never asserted.

    QT_QPA_PLATFORM=offscreen python bench/bench_gui.py [--events 8000] [--rate 1000]

A fast QTimer ticks every 5 ms on the GUI thread; the longest gap between two
ticks is the stall a user would feel (wall clock, which on a loaded machine
includes time the OS gave other processes), and the same gap in GUI-thread
CPU time is the work the window itself did. Measured for:

- the job API alone: a flood of metric events as fast as a process can write;
- the Train page with 2 and 8 simulated workers streaming metrics at `--rate`
  events per second (charts, stats, memory lines per worker);
- reading a voice of 13,000 clips through the workspace reader (`--clips`).

The tests count what is deterministic (lines parsed per slice, redraws per
timer turn); the timings live here because a timed assert on a shared
machine is a flaky test.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_NUM_THREADS", "1")
if not __package__:  # run as a file, not `python -m bench.<name>`: bench/_root.py
    import _root  # noqa: F401

from PySide6.QtCore import QEventLoop, QObject, QSettings, QTimer
from PySide6.QtWidgets import QApplication


class StallProbe(QObject):
    """Ticks every `interval_ms`; records the worst wall and GUI-thread CPU gap."""

    def __init__(self, interval_ms: int = 5) -> None:
        super().__init__()
        self.timer = QTimer(self)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)
        self.last = 0.0
        self.last_cpu = 0.0
        self.worst_gap_ms = 0.0
        self.worst_busy_ms = 0.0
        self.ticks = 0

    def start(self) -> None:
        # as gui.app.main does after start-up: long-lived objects leave the collector
        gc.collect()
        gc.freeze()
        self.last, self.last_cpu = time.perf_counter(), time.thread_time()
        self.timer.start()

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        if self.ticks:
            self.worst_gap_ms = max(self.worst_gap_ms, (now - self.last) * 1000.0)
            self.worst_busy_ms = max(self.worst_busy_ms, (cpu - self.last_cpu) * 1000.0)
        self.last, self.last_cpu = now, cpu
        self.ticks += 1

    def stop(self) -> None:
        self.timer.stop()
        gc.unfreeze()


def run_until(done: object, timeout_s: float) -> bool:
    """Spin the event loop until `done()` is true (or the timeout)."""
    loop = QEventLoop()
    deadline = time.monotonic() + timeout_s
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        loop.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
    return True


def row(what: str, probe: StallProbe, extra: str = "") -> str:
    return (f"| {what:<44} | {probe.worst_gap_ms:8.1f} | {probe.worst_busy_ms:8.1f} "
            f"| {probe.ticks:6d} | {extra}")


def bench_job(events: int) -> str:
    from gui.jobs import EngineJob
    from tests.helpers.processes import flood_program

    job = EngineJob(["x"], program=flood_program(events))
    probe = StallProbe()
    probe.start()
    job.start()
    run_until(lambda: job.outcome is not None, 300)
    probe.stop()
    return row(f"job API, {events} events, unpaced", probe,
               f"{job.slices} slices, <= {job.max_slice_lines} lines each")


def bench_train_page(window: object, voice: Path, workers: int, events: int,
                     rate: float) -> str:
    from gui.pages.train import TrainPage
    from tests.helpers.processes import flood_program

    window.ctx.set_voice(voice)  # type: ignore[attr-defined]
    page = window.show_page(TrainPage)  # type: ignore[attr-defined]
    page.steps.setValue(events)
    probe = StallProbe()
    probe.start()
    job = page.start(program=flood_program(events, rate=rate, ranks=workers))
    run_until(lambda: job.outcome is not None and not page.redraw_timer.isActive(), 600)
    probe.stop()
    return row(f"Train page, {workers} workers, {events} events at {rate:.0f}/s", probe,
               f"{page.redraws} redraws over {page.redraw_ticks} timer turns")


def bench_resume_history(window: object, voice: Path, steps: int, workers: int) -> str:
    """Resume of a long run: its metrics.jsonl is read in slices on the GUI thread (live
    metrics wait for it, so the curve keeps its order); how long the window stalls."""
    import json

    from engine.config.train import TrainConfig
    from engine.layout.run import Run, runs_dir
    from gui.pages.train import TrainPage

    run = Run(runs_dir(voice) / f"long-{steps}")
    run.path.mkdir(parents=True)
    run.write_config(TrainConfig().to_dict())
    with run.metrics_file.open("w") as fh:
        for s in range(1, steps + 1):
            for r in range(workers):
                fh.write(json.dumps({"kind": "train", "step": s, "rank": r,
                                     "loss/train": 9 - s * 1e-4, "lr": 2e-6,
                                     "perf/tokens_per_s": 1000.0,
                                     "memory/device_used_gib": 20.0 + r}) + "\n")
    window.ctx.set_voice(voice)  # type: ignore[attr-defined]
    page = window.show_page(TrainPage)  # type: ignore[attr-defined]
    probe = StallProbe()
    probe.start()
    got: dict[str, float] = {}

    page.run.history_loaded.connect(lambda: got.setdefault("wall", time.perf_counter()))

    def resume() -> None:  # inside the event loop, between the probe's ticks
        got["t0"] = time.perf_counter()
        page.run.show_run(run.name, run.metrics_file, steps)

    QTimer.singleShot(50, resume)
    run_until(lambda: "wall" in got and probe.ticks > 20, 120)
    probe.stop()
    wall = got["wall"] - got["t0"]
    n = page.store.series["loss/train"].count if "loss/train" in page.store.series else 0
    return row(f"resume: read {steps} steps x {workers} workers (slices)", probe,
               f"{n} loss points in {wall:.2f} s")


def bench_big_voice(workspace: Path, clips: int) -> str:
    """A voice of `clips` takes: creating it is not timed; reading it is."""
    import json

    from engine.layout.voice import create_voice

    voice = create_voice(workspace / "big", "Big")
    takes = voice.path / "takes"
    for i in range(clips):
        (takes / f"{i:06d}.wav").write_bytes(b"")  # a placeholder: nothing is decoded
        (takes / f"{i:06d}.json").write_text(json.dumps(
            {"id": f"{i:06d}", "text": f"Sentence number {i}.", "audio": f"{i:06d}.wav",
             "duration_s": 3.0, "sample_rate": 24000, "source": "import"}))
    try:
        from gui.workspace_reader import WorkspaceReader
    except ImportError:
        return f"| voice of {clips} clips: no background reader in this version |"
    reader = WorkspaceReader()
    got: list[object] = []
    reader.voice_loaded.connect(lambda path, data: got.append(data))
    probe = StallProbe()
    probe.start()
    t0 = time.perf_counter()
    reader.load_voice(voice.path)
    run_until(lambda: bool(got), 300)
    wall = time.perf_counter() - t0
    probe.stop()
    reader.shutdown()
    takes_read = len(getattr(got[0], "takes", ())) if got else 0
    return row(f"read a voice of {clips} clips (background)", probe,
               f"{takes_read} takes in {wall:.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=8000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--flood", type=int, default=20000)
    ap.add_argument("--clips", type=int, default=13000)
    ap.add_argument("--resume-steps", type=int, default=20000)
    args = ap.parse_args()

    app = QApplication.instance() or QApplication(sys.argv)
    from gui.app import MainWindow
    from gui.context import AppContext
    from tests.helpers.voices import make_voice

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "workspace"
        ws.mkdir()
        settings = QSettings(str(Path(tmp) / "voxshard.ini"), QSettings.Format.IniFormat)
        settings.setValue("workspace", str(ws))
        ctx = AppContext(settings)
        window = MainWindow(ctx)
        window.resize(1400, 900)
        window.show()
        voice = make_voice(ws)
        rows.append(bench_job(args.flood))
        for workers in (2, 8):
            rows.append(bench_train_page(window, voice, workers, args.events, args.rate))
        rows.append(bench_resume_history(window, voice, args.resume_steps, 2))
        rows.append(bench_big_voice(ws, args.clips))
        window.shutdown()
        app.processEvents()
    load = os.getloadavg()[0]
    print(f"GUI stalls (5 ms probe timer; load average {load:.1f} on {os.cpu_count()} cores)")
    print(f"| {'what':<44} | gap ms   | CPU ms   | ticks  | notes")
    print(f"|{'-' * 46}|{'-' * 10}|{'-' * 10}|{'-' * 8}|{'-' * 30}")
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
