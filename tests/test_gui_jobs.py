"""The job API: real engine subprocesses, outcomes, cancel, and output parsed in slices.

How long the window stalls is measured by bench/bench_gui.py, never asserted here:
a timed assert on a shared machine is a flaky test.
"""

from __future__ import annotations

from pathlib import Path

from gui.jobs import LINES_PER_SLICE, EngineJob, JobManager
from tests.helpers.processes import flood_program, pid_alive


def test_success_with_the_real_engine(qtbot, tmp_path: Path) -> None:
    job = EngineJob(["voice", "new", str(tmp_path / "v"), "--speaker", "Ada"])
    artifacts: list[tuple[str, str]] = []
    job.artifact.connect(lambda p, r: artifacts.append((p, r)))
    with qtbot.waitSignal(job.succeeded, timeout=30000) as blocker:
        job.start()
    qtbot.waitUntil(lambda: job.outcome is not None)
    result = blocker.args[0]
    assert result["speaker"] == "ada"
    assert "Created voice" in result["summary"]
    assert (tmp_path / "v" / "voice.toml").is_file()
    assert artifacts and artifacts[0][1] == "voice"
    assert job.outcome == "succeeded"
    qtbot.waitUntil(lambda: not job.is_running())


def test_engine_error_is_one_clear_sentence(qtbot, tmp_path: Path) -> None:
    job = EngineJob(["voice", "info", str(tmp_path / "missing")])
    cancelled: list[bool] = []
    job.cancelled.connect(lambda: cancelled.append(True))
    with qtbot.waitSignal(job.failed, timeout=30000) as blocker:
        job.start()
    code, message, hint = blocker.args
    assert code == "workspace"
    assert "There is no voice" in message and "Traceback" not in message
    assert "voice new" in hint
    assert not cancelled


def test_bad_usage_and_missing_engine_fail_cleanly(qtbot, tmp_path: Path) -> None:
    job = EngineJob(["no-such-command"])
    with qtbot.waitSignal(job.failed, timeout=30000) as blocker:
        job.start()
    assert blocker.args[0] == "crashed"
    assert "exit code 2" in blocker.args[1]
    assert "invalid choice" in blocker.args[2]  # argparse's line from stderr

    missing = EngineJob(["voice", "info", "x"], program=[str(tmp_path / "no-engine")])
    with qtbot.waitSignal(missing.failed, timeout=10000) as blocker:
        missing.start()
    assert blocker.args[0] == "engine_missing"


def test_cancel_is_not_an_error_and_reaches_the_whole_group(qtbot) -> None:
    job = EngineJob(["x"], program=flood_program(0, forever=True, child=True),
                    kill_after_s=10)
    grandchild: list[int] = []
    job.log.connect(lambda _l, m: grandchild.append(int(m.split()[1]))
                    if m.startswith("grandchild") else None)
    failed: list[object] = []
    job.failed.connect(lambda *a: failed.append(a))
    job.start()
    qtbot.waitUntil(lambda: bool(grandchild) and job.events_seen > 20, timeout=30000)
    assert pid_alive(grandchild[0])
    with qtbot.waitSignal(job.cancelled, timeout=20000):
        job.cancel()
    qtbot.waitUntil(lambda: not job.is_running(), timeout=10000)
    assert not failed
    assert job.outcome == "cancelled"
    # the grandchild got SIGTERM with the group: nothing is left running
    qtbot.waitUntil(lambda: not pid_alive(grandchild[0]), timeout=10000)


def test_a_flood_of_events_is_parsed_in_bounded_slices(qtbot) -> None:
    count = 20000
    job = EngineJob(["x"], program=flood_program(count))
    metrics: list[dict] = []
    job.metric.connect(metrics.append)
    with qtbot.waitSignal(job.succeeded, timeout=120000) as blocker:
        job.start()
    assert blocker.args[0]["steps"] == count
    assert len(metrics) == count
    assert metrics[-1]["step"] == count - 1 and metrics[-1]["rank"] == 1
    # no turn of the event loop ever parsed more than one slice of lines, and
    # however the pipe delivered them, every line went through some slice
    assert 0 < job.max_slice_lines <= LINES_PER_SLICE
    assert job.slices * LINES_PER_SLICE >= count


def test_manager_shutdown_stops_everything(qtbot) -> None:
    manager = JobManager()
    jobs = [manager.start(["x"], "flood", program=flood_program(0, forever=True))
            for _ in range(2)]
    qtbot.waitUntil(lambda: all(j.events_seen > 5 for j in jobs), timeout=30000)
    pids = [j.pid() for j in jobs]
    manager.shutdown(10000)
    assert not manager.running()
    qtbot.waitUntil(lambda: not any(pid_alive(p) for p in pids), timeout=10000)
    qtbot.waitUntil(lambda: not manager.jobs, timeout=5000)


def test_a_stop_is_never_cut_short_by_a_timer(qtbot) -> None:
    # the engine takes its time to save (as a 1.7B checkpoint does); no window timer kills it
    job = EngineJob(["x"], program=flood_program(0, forever=True, stop_s=3.0))
    states: list[str] = []
    job.state.connect(lambda s, _d: states.append(s))
    job.start()
    qtbot.waitUntil(lambda: job.events_seen > 5, timeout=30000)
    job.cancel()
    assert job.stopping
    qtbot.waitUntil(lambda: "stopping" in states, timeout=30000)
    with qtbot.waitSignal(job.cancelled, timeout=60000):
        pass
    assert job.outcome == "cancelled" and "saved a checkpoint" in job.error[1]


def test_a_stop_whose_save_failed_is_a_failure(qtbot) -> None:
    job = EngineJob(["x"], program=flood_program(0, forever=True, stop_fails=True))
    cancelled: list[bool] = []
    job.cancelled.connect(lambda: cancelled.append(True))
    job.start()
    qtbot.waitUntil(lambda: job.events_seen > 5, timeout=30000)
    with qtbot.waitSignal(job.failed, timeout=60000) as blocker:
        job.cancel()
    assert not cancelled and job.outcome == "failed"
    code, message, hint = blocker.args
    assert code == "training" and "no space left" in message
    assert "checkpoint_step_0000004 is intact" in hint


def test_force_stop_is_a_failure_that_says_what_was_lost(qtbot) -> None:
    job = EngineJob(["x"], program=flood_program(0, forever=True, stop_s=600.0))
    job.start()
    qtbot.waitUntil(lambda: job.events_seen > 5, timeout=30000)
    job.cancel()
    qtbot.waitUntil(lambda: job.stopping, timeout=10000)
    with qtbot.waitSignal(job.failed, timeout=30000) as blocker:
        job.force_stop()
    assert blocker.args[0] == "killed" and "lost" in blocker.args[1]
    qtbot.waitUntil(lambda: not job.is_running(), timeout=10000)


def test_manager_knows_which_jobs_write_into_a_voice(qtbot, tmp_path: Path) -> None:
    manager = JobManager()
    voice = tmp_path / "ada"
    job = manager.start(["x"], "flood", program=flood_program(0, forever=True), voice=voice)
    other = manager.start(["x"], "flood", program=flood_program(0, forever=True))
    qtbot.waitUntil(lambda: job.events_seen > 2 and other.events_seen > 2, timeout=30000)
    assert manager.writing_into(voice) == [job]
    assert manager.writing_into(tmp_path / "bob") == []
    manager.stop_all()  # never blocks: both end through their own stop
    qtbot.waitUntil(lambda: not manager.running(), timeout=30000)
    assert job.outcome == other.outcome == "cancelled"
