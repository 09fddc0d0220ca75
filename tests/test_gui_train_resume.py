"""Issue 50 on the Train page: Resume continues the run with its own saved settings, its
base model included, whatever the form shows; a resume the engine refuses leaves the
run's curve on screen as it was (not its history drawn twice).

On the session's finished run (`trained_run`, 20 of 20 steps, the tiny model): the
engine refuses its resume in one sentence before any cluster starts, past the point
where it resolves the base model, so nothing here trains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gui.app import MainWindow
from gui.pages.train import TrainPage
from tests.helpers.voices import copy_voice

#: a base model this machine has not downloaded (and may not, offline)
NOT_HERE = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
ROOT = Path(__file__).resolve().parents[1]


def _loss_steps(page: TrainPage) -> list[float]:
    page.redraw()
    return [float(x) for x in page.charts.curves["loss/train"].getData()[0]]


def test_resume_sends_the_runs_own_base_and_a_refusal_keeps_the_curve(
        qtbot, window: MainWindow, workspace: Path, trained_run: dict[str, Any],
        tmp_path: Path) -> None:
    voice = copy_voice(trained_run["voice"], workspace / "joe")
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    qtbot.waitUntil(lambda: page._history is None and page.selected_run() is not None,
                    timeout=30000)
    before = _loss_steps(page)
    assert before and before == sorted(before) and before[-1] == 20.0
    # the form names another base than the run trained from
    page.base.setEditText(NOT_HERE)
    job = page.start(resume=True, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert job is not None, page.state_label.text()  # not refused for the form's base
    assert NOT_HERE not in job.args
    with qtbot.waitSignal(job.finished, timeout=120000):
        pass
    assert job.outcome == "failed"
    # the engine resolved the run's own base and refused for the run's own reason
    assert "already trained all its 20 steps" in job.error[1], job.error
    qtbot.waitUntil(lambda: page._history is None, timeout=10000)
    # the curve as it was: each step once, in order (no line back from step 20 to 1)
    assert _loss_steps(page) == before


def test_the_command_line_resumes_on_the_runs_own_base(
        workspace: Path, trained_run: dict[str, Any], tmp_path: Path) -> None:
    """`train --resume` needs no --base, and one naming another model is not used: both
    get past the base model to the run's own refusal (20 of 20 steps trained)."""
    voice = copy_voice(trained_run["voice"], workspace / "joe")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf")}
    for base in ([], ["--base", NOT_HERE]):
        done = subprocess.run(
            [sys.executable, "-m", "engine.cli.main", "--json", "train", str(voice), *base,
             "--resume", "--run", "r1", "--steps", "20"],
            capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
        events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
        assert done.returncode == 1 and events, done.stderr[-2000:]
        assert "already trained all its 20 steps" in events[-1]["message"], events[-1]
    # a new run still needs one
    done = subprocess.run([sys.executable, "-m", "engine.cli.main", "--json", "train",
                           str(voice), "--steps", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert done.returncode == 1 and events[-1]["message"] == "No base model given."
