"""Evaluation of a tiny-model run: every figure present and finite, the report written,
re-evaluation reuses what was measured, and the failures say what to do.

The tiny model speaks noise, so these tests prove the plumbing only (render, recognise,
embed, aggregate, report); that the figures discriminate is proved on real voices in
test_quality_asr.py and test_quality_similarity.py.

The run is a copy of the session's real training run (`trained_run`,
tests/helpers/runs.py: 2 CPU workers, checkpoints at steps 10 and 20) with the export of
its last step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine.config.evaluate import EvaluateConfig
from engine.config.speak import SpeakOptions
from engine.core.errors import InputError, ModelError, WorkspaceError
from engine.core.events import Event
from tests.helpers.voices import copy_voice

FAST = SpeakOptions(max_frames=10, batch_size=8)
#: three of the eight held-out sentences keep the test short (each render is recognised)
SENTENCES = 3


@pytest.fixture(scope="module")
def trained_run(trained_run: dict[str, Any],
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A private copy of the session's run (evaluation writes into it), its export in the
    voice's exports/."""
    voice = copy_voice(trained_run["voice"], tmp_path_factory.mktemp("quality_eval") / "joe")
    copy_voice(trained_run["export"], voice / "exports" / "joe-step20")
    return {"voice": voice, "run": voice / "runs" / "r1"}


@pytest.fixture(scope="module")
def evaluated(trained_run: dict[str, Any]) -> dict[str, Any]:
    from engine import api

    events: list[Event] = []
    from engine.quality.evaluate import HELD_OUT_SENTENCES

    result = api.evaluate(trained_run["voice"], checkpoints="all", asr="pocketsphinx",
                          sentences=HELD_OUT_SENTENCES[:SENTENCES], options=FAST, device="cpu",
                          on_event=events.append)
    return {"result": result, "events": events}


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def test_evaluation_has_every_voice_and_every_figure_finite(
        trained_run: dict[str, Any], evaluated: dict[str, Any]) -> None:
    result = evaluated["result"]
    out = trained_run["run"] / "evaluation"
    data = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    labels = [e["label"] for e in data["entries"]]
    assert labels == ["zero-shot", "step 10", "step 20", "joe-step20"]
    assert [e["kind"] for e in data["entries"]] == ["zero_shot", "checkpoint", "checkpoint",
                                                    "custom_voice"]
    assert data["baseline"]["mode"] in ("x_vector", "in_context")
    assert len(data["sentences"]) == SENTENCES and data["seed"] == 0
    assert data["asr"]["backend"] == "pocketsphinx"
    # the held-out clips are the run's validation clips (never trained on)
    assert data["reference"]["held_out"] and len(data["reference"]["clips"]) >= 1
    assert _finite(data["reference"]["words_per_s"])
    for entry in data["entries"]:
        assert len(entry["renders"]) == SENTENCES
        for r in entry["renders"]:
            assert (out / r["path"]).is_file()
            for key in ("similarity", "similarity_model", "wer", "words_per_s", "rate_ratio",
                        "loudness_lufs", "peak_dbfs", "clipped_fraction", "duration_s"):
                assert _finite(r[key]), (entry["label"], key, r[key])
            assert -1.0 <= r["similarity"] <= 1.0 and r["wer"] >= 0
        for key in ("similarity", "similarity_model", "wer", "rate_ratio", "loudness_lufs"):
            assert _finite(entry["mean"][key]), (entry["label"], key)
        assert _finite(entry["render_s"]) and _finite(entry["measure_s"])
        assert "styles" not in entry  # a run trained without styles: nothing more
    assert data["best"]["label"] in ("step 10", "step 20")
    assert result["html"].endswith("report.html")
    assert "best checkpoint: step" in result["summary"]


def test_report_has_players_table_and_plots(trained_run: dict[str, Any],
                                            evaluated: dict[str, Any]) -> None:
    page = (trained_run["run"] / "evaluation" / "report.html").read_text(encoding="utf-8")
    assert page.count("<svg") == 3 and "Speaker similarity per checkpoint" in page
    # every sentence in every voice, plus the reference clips
    assert page.count("<audio") >= SENTENCES * 4 + 1
    assert "step 20" in page and "zero-shot" in page and "WER" in page
    assert "nan" not in page.lower().replace("nant", "")


def test_events_carry_per_checkpoint_metrics(evaluated: dict[str, Any]) -> None:
    events = evaluated["events"]
    metrics = [e.data for e in events if e.kind == "metric" and e.data.get("split") == "eval"]
    assert [m["label"] for m in metrics] == ["zero-shot", "step 10", "step 20", "joe-step20"]
    assert [m["values"].get("step") for m in metrics] == [None, 10, 20, None]
    for m in metrics:
        assert _finite(m["values"]["eval/similarity"]) and _finite(m["values"]["eval/wer"])
    roles = {e.data["role"] for e in events if e.kind == "artifact"}
    assert {"evaluation", "evaluation_report"} <= roles
    progress = [e.data for e in events if e.kind == "progress" and e.data["stage"] == "evaluate"]
    assert progress[-1]["done"] == progress[-1]["total"] == SENTENCES * 4
    # two model loads: the base (zero-shot clone, then each checkpoint in place), the export
    loads = [e.data["detail"] for e in events
             if e.kind == "state" and e.data.get("state") == "loading_model"]
    assert len(loads) == 2 and loads[0] != loads[1]


def test_second_evaluation_reuses_measured_renders(trained_run: dict[str, Any],
                                                   evaluated: dict[str, Any]) -> None:
    from engine.quality.evaluate import EvaluateRequest, evaluate

    events: list[Event] = []
    again = evaluate(EvaluateRequest(trained_run["voice"], checkpoints="best",
                                     asr="pocketsphinx",
                                     sentences=evaluated["result"]["sentences"], options=FAST,
                                     device="cpu"), on_event=events.append)
    best = evaluated["result"]["best"]["label"]
    assert again["evaluated"] == ["zero-shot", best, "joe-step20"]
    # the report keeps every voice measured with these settings
    assert [e["label"] for e in again["entries"]] == ["zero-shot", "step 10", "step 20",
                                                      "joe-step20"]
    reused = [e for e in events if e.kind == "log" and "reused" in e.data["message"]]
    assert len(reused) == 3
    assert not any(e.kind == "state" and e.data.get("state") == "loading_model" for e in events)


def test_cli_evaluate_json_latest(trained_run: dict[str, Any], evaluated: dict[str, Any],
                                  tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "--json", "evaluate", str(trained_run["voice"]),
         "--run", "r1", "--checkpoints", "latest", "--asr", "pocketsphinx", "--max-frames",
         "10", "--no-export", "--out", str(tmp_path / "ev"), "--sentences", "Hello there.",
         "--device", "cpu"], capture_output=True, text=True, cwd=root, timeout=300)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = lines[-1]
    assert result["event"] == "result"
    assert [e["label"] for e in result["entries"]] == ["zero-shot", "step 20"]
    metrics = [x for x in lines if x["event"] == "metric" and x.get("split") == "eval"]
    assert [m["values"].get("step") for m in metrics] == [None, 20]
    assert (tmp_path / "ev" / "report.html").is_file()


def test_run_without_checkpoint_and_voice_without_run_are_clear(
        trained_run: dict[str, Any], tmp_path: Path) -> None:
    from engine.quality.evaluate import EvaluateRequest, evaluate

    voice = copy_voice(trained_run["voice"], tmp_path / "v")
    import shutil

    shutil.rmtree(voice / "runs")
    with pytest.raises(WorkspaceError, match="no training run yet"):
        evaluate(EvaluateRequest(voice, asr="pocketsphinx"))
    (voice / "runs" / "empty").mkdir(parents=True)
    with pytest.raises(WorkspaceError, match="no complete checkpoint yet") as info:
        evaluate(EvaluateRequest(voice, run="empty", asr="pocketsphinx"))
    assert info.value.hint
    with pytest.raises(InputError, match="no run 'nope'"):
        evaluate(EvaluateRequest(voice, run="nope", asr="pocketsphinx"))


def test_missing_asr_model_is_one_clear_sentence(trained_run: dict[str, Any]) -> None:
    from engine.quality.evaluate import EvaluateRequest, evaluate

    with pytest.raises(ModelError, match="not on this machine") as info:
        evaluate(EvaluateRequest(trained_run["voice"], checkpoints="latest",
                                 asr="Systran/faster-whisper-nonexistent", options=FAST))
    assert "hf download Systran/faster-whisper-nonexistent" in (info.value.hint or "")


def test_watch_evaluates_new_checkpoints_and_suggests_an_early_stop(
        trained_run: dict[str, Any], evaluated: dict[str, Any]) -> None:
    """Runs last: it adds checkpoints 30 and 40 (copies of 20) to the shared run."""
    import shutil

    from engine.quality.evaluate import EvaluateRequest
    from engine.quality.watch import watch

    run = trained_run["run"]
    shutil.copytree(run / "checkpoint_step_0000020", run / "checkpoint_step_0000030")
    events: list[Event] = []

    def on_event(ev: Event) -> None:
        events.append(ev)
        if ev.kind == "state" and ev.data.get("state") == "evaluation_updated" \
                and not (run / "checkpoint_step_0000040").exists():
            # training writes another checkpoint while the watcher runs
            shutil.copytree(run / "checkpoint_step_0000020", run / "checkpoint_step_0000040")

    request = EvaluateRequest(trained_run["voice"], "r1", asr="pocketsphinx",
                              sentences=evaluated["result"]["sentences"], options=FAST,
                              device="cpu", config=EvaluateConfig(patience=1))
    result = watch(request, interval_s=0.01, idle_s=0.5, on_event=on_event)
    steps = [e["step"] for e in result["entries"] if e["kind"] == "checkpoint"]
    assert steps == [10, 20, 30, 40]
    updates = [e.data for e in events if e.kind == "state"
               and e.data.get("state") == "evaluation_updated"]
    # one checkpoint per pass, the newest first (30, then 40 as it appears, then 20, 10)
    assert [u["checkpoints"] for u in updates] == [1, 2, 3, 4]
    assert any(e.kind == "state" and e.data.get("state") == "early_stop_suggested"
               for e in events)
    # step 30 and 40 are new renders; everything else was measured before
    rendered = [e.data["detail"] for e in events if e.kind == "state"
                and e.data.get("state") == "evaluating" and "index" in e.data]
    assert rendered == ["step 30", "step 40"]


class _RacingTraining:
    """Training that moves on each time the watcher starts measuring: a checkpoint every
    step (copies of `source`), recorded as the driver records them and pruned to the
    newest two by training's own Checkpointer. It writes 1 once the baseline is in the
    report, 2-4 as the watcher starts on 1, and 5 as it starts on 4."""

    def __init__(self, source: Path, run: Path) -> None:
        from engine.train.checkpoint import Checkpointer

        self.source, self.run = source, run
        self.trainer = Checkpointer(run, rank=0, world_size=1, keep=2)
        self.written: list[int] = []
        self.events: list[Event] = []
        self.baseline_entries: list[list[str]] = []
        self.gone_while_measured: list[bool] = []

    def train_to(self, step: int) -> None:
        import shutil

        from engine.layout.checkpoints import checkpoint_name
        from engine.layout.run import Run

        while (self.written[-1] if self.written else 0) < step:
            n = (self.written[-1] if self.written else 0) + 1
            shutil.copytree(self.source, self.run / checkpoint_name(n))
            Run(self.run).record_written(checkpoint_name(n))  # what the driver records
            self.written.append(n)
            self.trainer.prune()

    def on_event(self, ev: Event) -> None:
        from engine.layout.checkpoints import checkpoint_name

        self.events.append(ev)
        if ev.kind != "state":
            return
        if ev.data.get("state") == "evaluation_updated" and ev.data.get("detail") == "baseline":
            data = json.loads((self.run / "evaluation" / "evaluation.json").read_text())
            self.baseline_entries.append([e["label"] for e in data["entries"]])
            self.train_to(1)
        elif ev.data.get("state") == "evaluating" and ev.data.get("detail") == "step 1":
            self.train_to(4)  # step 1 is deleted as the watcher starts on it
            self.gone_while_measured.append(not (self.run / checkpoint_name(1)).exists())
        elif ev.data.get("state") == "evaluating" and ev.data.get("detail") == "step 4":
            self.train_to(5)


def test_watch_never_loses_a_race_with_pruning(trained_run: dict[str, Any],
                                               evaluated: dict[str, Any]) -> None:
    """Training writes a checkpoint every step and keeps only the newest two; the watcher
    is slower than training (each time it starts measuring, training moves on). It
    measures the baseline before any checkpoint exists, never fails, measures the
    checkpoint it started on even when training deletes it meanwhile (it holds a copy:
    issue 28 §3), holds the ones written while it measures, and names every one training
    wrote: measured, or skipped with why (issue 45: one written and pruned between two
    looks included, from training's record of what it wrote).

    The "training" is the training area's own Checkpointer pruning (keep=2, its minimum)
    over checkpoint folders copied from the fixture's real DCP checkpoint: a Ray run
    writing every step costs minutes on 2 cores; the deletion is the same rmtree."""
    import shutil

    from engine.layout.checkpoints import checkpoint_name, list_checkpoints
    from engine.quality.evaluate import EvaluateRequest
    from engine.quality.watch import watch

    run = trained_run["voice"] / "runs" / "r-race"
    run.mkdir()
    shutil.copy(trained_run["run"] / "config.json", run / "config.json")
    training = _RacingTraining(trained_run["run"] / "checkpoint_step_0000020", run)
    events = training.events
    request = EvaluateRequest(trained_run["voice"], "r-race", asr="pocketsphinx",
                              sentences=evaluated["result"]["sentences"][:1], options=FAST,
                              device="cpu", export=False)
    result = watch(request, interval_s=0.01, idle_s=0.3, on_event=training.on_event)
    # the zero-shot baseline was in the report before the first checkpoint existed
    assert training.baseline_entries == [["zero-shot"]]
    kept = [c.name for c in list_checkpoints(run)]
    assert kept == [checkpoint_name(4), checkpoint_name(5)]
    data = json.loads((run / "evaluation" / "evaluation.json").read_text())
    # 1 was deleted by training while it was measured, and measured all the same
    assert training.gone_while_measured == [True]
    measured = [e["step"] for e in data["entries"] if e["kind"] == "checkpoint"]
    assert {1, 4, 5} <= set(measured)
    # 2 came and went within one look (written and pruned at once, while 1 was being
    # measured): training's record names it, so it is skipped with why, unless the
    # holding thread caught it; 3 was held while 1 was measured, or skipped the same way
    skipped = {n["step"]: n["reason"] for n in data["skipped"]}
    assert set(measured) | set(skipped) == {1, 2, 3, 4, 5} and not set(measured) & set(skipped)
    assert all("deleted" in why for why in skipped.values())
    assert [n["step"] for n in result["skipped"]] == sorted(skipped)
    assert data["count"] == {"measured": len(measured), "written": 5,
                             "skipped": len(skipped)}
    if skipped:
        assert f"not measured: step {', '.join(map(str, sorted(skipped)))}." \
            in result["summary"]
    page = (run / "evaluation" / "report.html").read_text(encoding="utf-8")
    assert f"{len(measured)} of 5 checkpoints measured" in result["summary"]
    assert f"{len(measured)} of 5 checkpoints" in page
    assert not skipped or "training deleted it" in page
    assert not any(e.kind == "error" for e in events)
    assert not any("does not exist" in str(e.data.get("message", "")) for e in events)
    assert not (run / "held").exists() or not any((run / "held").iterdir())  # let go


def test_two_evaluations_at_once_both_land_in_the_file(trained_run: dict[str, Any],
                                                        evaluated: dict[str, Any]) -> None:
    """Issue 28 §3: the window's Evaluate now while the watcher measures (two writers of
    one evaluation.json). The second evaluation starts, measures step 20 and writes while
    the first is rendering step 10 (it read the file before); the first one's write keeps
    step 20, and each voice is in the file before its metric event says it was measured."""
    import shutil
    from dataclasses import replace

    from engine.quality.evaluate import EvaluateRequest, evaluate

    voice = copy_voice(trained_run["voice"], trained_run["voice"].parent / "joe-two")
    out = voice / "runs" / "r1" / "evaluation"
    shutil.rmtree(out, ignore_errors=True)
    request = EvaluateRequest(voice, "r1", asr="pocketsphinx", device="cpu", export=False,
                              zero_shot=False, sentences=evaluated["result"]["sentences"][:1],
                              options=FAST)
    on_disk_at_metric: list[list[int]] = []

    def steps_in_file() -> list[int]:
        data = json.loads((out / "evaluation.json").read_text())
        return [e["step"] for e in data["entries"] if e["kind"] == "checkpoint"]

    def second(ev: Event) -> None:
        if ev.kind == "metric" and ev.data.get("split") == "eval":
            on_disk_at_metric.append(steps_in_file())

    def first(ev: Event) -> None:
        second(ev)
        if ev.kind == "state" and ev.data.get("state") == "evaluating" \
                and ev.data.get("detail") == "step 10" and not on_disk_at_metric:
            evaluate(replace(request, checkpoints="20"), on_event=second)

    result = evaluate(replace(request, checkpoints="10"), on_event=first)
    assert steps_in_file() == [10, 20]
    assert [e["step"] for e in result["entries"]] == [10, 20]
    assert result["best"]["step"] in (10, 20)
    # step 20 was on disk when its metric came; step 10 with 20 beside it
    assert on_disk_at_metric == [[20], [10, 20]]


def _entry(label: str, kind: str, step: int | None, **mean: Any) -> dict[str, Any]:
    base = {"similarity": 0.5, "wer": 0.2, "rate_ratio": 1.0, "clipped_fraction": 0.0,
            "capped": 0, "rate_from_capped": False}
    return {"label": label, "kind": kind, "step": step, "checkpoint": f"c{step}",
            "mean": {**base, **mean}}


def test_best_checkpoint_is_the_most_similar_that_still_says_the_words() -> None:
    from engine.quality.evaluate import choose_best

    entries = [_entry("zero-shot", "zero_shot", None, similarity=0.9),
               _entry("step 10", "checkpoint", 10, similarity=0.60, wer=0.10),
               _entry("step 20", "checkpoint", 20, similarity=0.80, wer=0.15),
               _entry("step 30", "checkpoint", 30, similarity=0.95, wer=0.60),  # mumbles
               _entry("export", "custom_voice", None, similarity=0.99)]
    assert choose_best(entries)["step"] == 20
    # a tie goes to the earlier checkpoint
    entries[1]["mean"]["similarity"] = 0.80
    assert choose_best(entries)["step"] == 10
    assert choose_best(entries[:1]) is None


def test_style_obedience_weighs_in_the_best_rule_only_when_asked() -> None:
    from engine.quality.evaluate import choose_best

    # step 20 is a little less like the speaker but obeys its styles; step 30 mumbles
    entries = [_entry("step 10", "checkpoint", 10, similarity=0.80),
               _entry("step 20", "checkpoint", 20, similarity=0.78),
               _entry("step 30", "checkpoint", 30, similarity=0.70, wer=0.9)]
    for e, share in zip(entries, (0.0, 1.0, 1.0), strict=True):
        e["styles"] = {"share": share}
    assert choose_best(entries)["step"] == 10  # the default weight 0: similarity alone
    assert choose_best(entries, style_weight=0.01)["step"] == 10  # 0.80 > 0.78 + 0.01
    best = choose_best(entries, style_weight=0.5)
    assert best["step"] == 20 and best["style_share"] == 1.0  # never the one that mumbles
    # a checkpoint without style figures (measured before, or none to check) scores 0
    del entries[1]["styles"]
    assert choose_best(entries, style_weight=0.5)["step"] == 10
    assert EvaluateConfig().style_weight == 0
    with pytest.raises(ValueError, match=r"evaluate\.style_weight"):
        EvaluateConfig(style_weight=1.5)
    with pytest.raises(ValueError, match=r"evaluate\.style_sentences"):
        EvaluateConfig(style_sentences=-1)


def test_a_checkpoint_that_does_not_end_its_sentences_is_not_best() -> None:
    from engine.quality.evaluate import choose_best

    # step 25 (say, the reinforce stage's) is the most similar but ran on past the cap once
    entries = [_entry("step 20", "checkpoint", 20, similarity=0.70),
               _entry("step 25", "checkpoint", 25, similarity=0.90, capped=1),
               _entry("step 30", "checkpoint", 30, similarity=0.60, capped=2)]
    assert choose_best(entries)["step"] == 20
    entries[0]["mean"]["capped"] = 1  # every checkpoint capped one: similarity decides
    assert choose_best(entries)["step"] == 25


def test_a_checkpoint_whose_sentences_ran_away_is_not_best() -> None:
    from engine.quality.evaluate import _warnings, choose_best
    from engine.quality.measure import Reference, means_of

    # a sentence the runaway guard cut (a loop, silence) counts as one not ended, like a
    # length-cap hit; entries written before the guard existed have no count: none
    entries = [_entry("step 20", "checkpoint", 20, similarity=0.70),
               _entry("step 25", "checkpoint", 25, similarity=0.90, runaway=1),
               _entry("step 30", "checkpoint", 30, similarity=0.95, capped=1, runaway=1)]
    assert choose_best(entries)["step"] == 20
    entries[0]["mean"]["capped"] = 1  # one unended sentence each but step 30's two
    assert choose_best(entries)["step"] == 25
    # the evaluation's count per checkpoint, from each sentence's reason
    renders = [{"capped": False, "runaway": "loop", "rate_ratio": 4.0},
               {"capped": False, "runaway": "silence", "rate_ratio": 0.1},
               {"capped": True, "runaway": None, "rate_ratio": 2.0},
               {"capped": False, "runaway": None, "rate_ratio": 1.0}]
    m = means_of(renders)
    assert (m["runaway"], m["capped"], m["rate_ratio"]) == (2, 1, 1.0)
    ref = Reference(clips=[], held_out=True, words_per_s=3.0, centroid={},
                    self_similarity={})
    assert {(w["label"], w["code"]) for w in _warnings(entries, ref)} >= {
        ("step 25", "runaway"), ("step 30", "runaway"), ("step 30", "no_end")}


def test_warnings_name_what_went_wrong_against_the_zero_shot_clone() -> None:
    from engine.quality.evaluate import _warnings
    from engine.quality.measure import Reference

    ref = Reference(clips=[], held_out=True, words_per_s=3.0, centroid={},
                    self_similarity={})
    entries = [_entry("zero-shot", "zero_shot", None, similarity=0.80, wer=0.10),
               _entry("step 10", "checkpoint", 10, similarity=0.70, wer=0.50, rate_ratio=1.4),
               _entry("step 20", "checkpoint", 20, similarity=0.81, rate_ratio=2.0,
                      rate_from_capped=True, capped=2, clipped_fraction=0.01)]
    codes = {(w["label"], w["code"]) for w in _warnings(entries, ref)}
    assert codes == {("step 10", "below_zero_shot"), ("step 10", "wer_rose"),
                     ("step 10", "rate_drift"), ("step 20", "no_end"),
                     ("step 20", "clipping")}  # no rate drift from cut-off sentences


def test_means_take_the_rate_from_sentences_that_ended() -> None:
    from engine.quality.measure import means_of

    renders = [{"capped": True, "words_per_s": 9.0, "rate_ratio": 3.0, "similarity": 0.4},
               {"capped": False, "words_per_s": 3.0, "rate_ratio": 1.0, "similarity": 0.6}]
    m = means_of(renders)
    assert m["rate_ratio"] == 1.0 and not m["rate_from_capped"] and m["capped"] == 1
    assert m["similarity"] == 0.5
    m = means_of(renders[:1])
    assert m["rate_ratio"] == 3.0 and m["rate_from_capped"]


def test_report_plots_have_round_ticks_and_the_legend_below_the_plot() -> None:
    import re

    from engine.quality.report import line_plot

    svg = line_plot("similarity", [{"name": "resemblyzer", "points": [(10, 0.41), (20, 0.56)]},
                                   {"name": "model's own encoder", "points": [(10, 0.47)]}],
                    [{"name": "zero-shot", "y": 0.53}, {"name": "export", "y": 0.535}],
                    height=230)
    ticks = re.findall(r'text-anchor="end" font-size="10">([^<]+)</text>', svg)
    assert ticks == ["0.40", "0.45", "0.50", "0.55", "0.60"]
    legend = re.findall(r'<text class="legend" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]+)<', svg)
    assert [name for _x, _y, name in legend] == ["resemblyzer", "model&#x27;s own encoder",
                                                 "zero-shot", "export"]
    plot_bottom = 230 - 40
    assert all(float(y) > plot_bottom + 20 for _x, y, _n in legend)  # under the step labels
    # two per row: no two names start at the same place
    assert len({(x, y) for x, y, _n in legend}) == len(legend)
