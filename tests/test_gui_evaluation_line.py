"""The Train page's evaluation line and run note tell the truth about the run on screen,
and Listen offers the evaluation's best checkpoint (issue 45).

The run is a copy of the session's real run of the tiny model (`trained_run`: checkpoints
at steps 10 and 20), evaluated for real at step 20 only, so 1 of its 2 checkpoints is
measured. A new run's training is a stand-in engine process that names its folder and
logs a few steps (the page under test only reads its events and folders).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.config.speak import SpeakOptions
from engine.layout.checkpoints import checkpoint_name
from engine.quality.evaluate import EvaluateRequest, evaluate
from gui.app import MainWindow
from gui.pages.listen import ListenPage, best_label
from gui.pages.train import TrainPage
from tests.helpers.voices import copy_voice

#: a new run: it names its folder, logs four steps over two seconds and ends
NEW_RUN = r'''
import sys, time
from pathlib import Path
from engine.cli.output import JsonOutput
from engine.core.events import Emitter
run = Path(sys.argv[1])
run.mkdir(parents=True)
out = JsonOutput(sys.stdout)
em = Emitter(out.handle)
em.state("training", run=str(run), total_steps=4)
for step in range(1, 5):
    em.metric({"step": step, "loss/train": 1.0 / step}, rank=0, split="train")
    time.sleep(0.5)
out.result({"steps": 4, "summary": "Finished at step 4."})
'''


@pytest.fixture(scope="module")
def evaluated_voice(trained_run: dict[str, Any],
                    tmp_path_factory: pytest.TempPathFactory) -> Path:
    voice = copy_voice(trained_run["voice"],
                       tmp_path_factory.mktemp("evaluation_line") / "joe")
    evaluate(EvaluateRequest(voice, "r1", checkpoints="20", asr="pocketsphinx",
                             sentences=["Please call me back this afternoon."],
                             options=SpeakOptions(max_frames=10, batch_size=8),
                             device="cpu", export=False, zero_shot=False))
    return voice


def _train_page(qtbot, window: MainWindow, voice: Path) -> TrainPage:
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    qtbot.waitUntil(lambda: not page.eval_note.isHidden(), timeout=30000)
    return page


def test_the_page_says_how_many_checkpoints_were_measured_of_how_many(
        qtbot, window: MainWindow, workspace: Path, evaluated_voice: Path) -> None:
    page = _train_page(qtbot, window, copy_voice(evaluated_voice, workspace / "joe"))
    assert "1 of 2 checkpoints measured" in page.eval_note.text()
    assert page.report_btn.isEnabled()


def test_a_new_run_clears_the_previous_runs_evaluation_line(
        qtbot, window: MainWindow, workspace: Path, evaluated_voice: Path) -> None:
    voice = copy_voice(evaluated_voice, workspace / "joe")
    page = _train_page(qtbot, window, voice)
    page.settings.evaluate.setChecked(False)
    new_run = voice / "runs" / "r-new"
    job = page.start(program=[sys.executable, "-c", NEW_RUN, str(new_run)])
    assert job is not None
    seen: list[tuple[bool, bool]] = []  # (line shown, Open report enabled) while it ran
    job.metric.connect(lambda _v: seen.append((not page.eval_note.isHidden(),
                                               page.report_btn.isEnabled())))
    with qtbot.waitSignal(job.finished, timeout=120000):
        pass
    assert job.outcome == "succeeded", job.error
    assert seen and not any(shown or report for shown, report in seen), seen
    assert page.eval_note.isHidden()  # the new run has no evaluation of its own


def test_the_finished_note_says_the_runs_own_steps(
        qtbot, window: MainWindow, workspace: Path, evaluated_voice: Path) -> None:
    page = _train_page(qtbot, window, copy_voice(evaluated_voice, workspace / "joe"))
    page.steps.setValue(5)  # the form's Steps below the run's 20
    note = page.settings.run_note.text()
    assert "has trained all its 20 steps" in note, note


def test_listen_offers_the_best_checkpoint_kept_only_under_best(
        qtbot, ctx, workspace: Path, evaluated_voice: Path) -> None:
    voice = copy_voice(evaluated_voice, workspace / "joe")
    run = voice / "runs" / "r1"
    assert (run / "best" / checkpoint_name(20)).is_dir()
    listen = ListenPage(ctx)
    qtbot.addWidget(listen)
    listen.show()
    ctx.set_voice(voice)
    listen.refresh()
    best = best_label("r1", 20)
    qtbot.waitUntil(lambda: listen.source.findText(best) >= 0, timeout=20000)
    assert listen.source.findText("Checkpoint: r1 · step 20") < 0  # named once, as the best
    # training pruned it since: the kept copy under best/ is offered, named the same
    shutil.rmtree(run / checkpoint_name(20))
    ctx.notify_changed()
    listen.refresh()
    qtbot.waitUntil(lambda: listen.source.findText("Checkpoint: r1 · step 10") >= 0
                    and listen.source.findText(best) >= 0
                    and listen.source.itemData(listen.source.findText(best))["path"]
                    == str(run / "best" / checkpoint_name(20)), timeout=20000)
    listen.source.setCurrentIndex(listen.source.findText(best))
    assert listen.voice_spec() == {"voice": str(run / "best" / checkpoint_name(20))}
    assert listen.source.currentData()["kind"] == "checkpoint"
