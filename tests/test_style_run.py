"""A voice trained with style descriptions, from its data to speaking with an instruction.

- One real run of the tiny model on Ray with two CPU workers, LoRA on the talker and the
  code predictor, half of the clips described: it trains, records the styles it trained
  with, and resumes (the fingerprint covers the descriptions, so an edited one refuses).
- Speaking (on runs made in one process, with the run's data recorded as training
  records it): a checkpoint and an export of a voice trained with styles take
  `--instruct` without the "little or no effect" warning; one trained without still warns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.core.errors import InputError
from engine.layout.exports import EXPORT_INFO
from engine.layout.manifest import read_manifest, write_manifest
from engine.layout.run import Run
from engine.serve.voices import ServedVoice
from engine.serve.wyoming import style_for
from engine.train.driver import export, train
from engine.train.rundata import record_data
from tests.helpers.ray_cluster import SharedCluster
from tests.helpers.runs import make_perturbed_run
from tests.helpers.voices import copy_voice

STYLES = ("Whisper, slowly and calmly.", "Fast and excited.")
WARNING = "little or no effect"


def describe(voice: Path) -> None:
    """Every other clip gets one of STYLES (the rest stay plain)."""
    rows = read_manifest(voice, usable_only=False)
    for i, r in enumerate(rows):
        if i % 2 == 0:
            r["style"] = STYLES[(i // 2) % 2]
    write_manifest(voice, rows)


@pytest.fixture(scope="module")
def styled(prepared_voice: Path, tiny_model_dir: Path, shared_cluster: SharedCluster,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    voice = copy_voice(prepared_voice, tmp_path_factory.mktemp("styled") / "joe")
    describe(voice)
    shared_cluster.up()
    options = {"use_gpu": False, "run": "s1", "workers": 2, "checkpoint_every": 1,
               "val_every": 0, "lr": 5e-2, "trainable": "lora", "lora_predictor": True,
               "batch_size": 4}
    first = train(voice, str(tiny_model_dir), steps=2, **options)
    resumed = train(voice, str(tiny_model_dir), steps=3, resume=True, **options)
    return {"voice": voice, "first": first, "resumed": resumed, "options": options}


def _speak(target: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    from engine.cli.main import main

    code = main(["speak", str(target), "Hello there.", "-o", str(out), "--device", "cpu",
                 "--max-frames", "6", "--seed", "1", "--instruct", STYLES[0], *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out + captured.err


@pytest.mark.timeout(1800)  # two Ray starts; on a loaded two-core machine, slow
def test_a_styled_run_trains_on_ray_records_its_styles_and_resumes(
        styled: dict[str, Any], tiny_model_dir: Path) -> None:
    assert styled["first"]["steps"] == 2 and not styled["first"]["stopped"]
    assert styled["resumed"]["steps"] == 3 and not styled["resumed"]["stopped"]
    run = Run(styled["voice"] / "runs" / "s1")
    assert set(run.trained_styles()) == set(STYLES)
    # another description is other data: the run's positions index the old layout
    voice = styled["voice"]
    rows = read_manifest(voice, usable_only=False)
    rows[0]["style"] = "Angry."
    write_manifest(voice, rows)
    try:
        with pytest.raises(InputError, match="changed"):
            train(voice, str(tiny_model_dir), steps=4, resume=True, **styled["options"])
    finally:
        describe(voice)


@pytest.fixture(scope="module")
def described_run(prepared_voice: Path, tiny_model_dir: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Path:
    voice = copy_voice(prepared_voice, tmp_path_factory.mktemp("described") / "joe")
    describe(voice)
    run_dir = make_perturbed_run(voice, tiny_model_dir, steps=(1,), export=None)
    record_data(run_dir, voice)  # what a starting run writes: the styles among its data
    return voice


def test_a_voice_trained_with_styles_takes_an_instruction_without_the_warning(
        described_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    voice = described_run
    assert set(Run(voice / "runs" / "r1").trained_styles()) == set(STYLES)
    said = _speak(voice / "runs" / "r1", tmp_path / "run.wav", capsys)
    assert WARNING not in said
    out = export(voice, tmp_path / "export", run="r1")
    info = json.loads((Path(out["out_dir"]) / EXPORT_INFO).read_text())
    assert set(info["styles"]) == set(STYLES)
    assert WARNING not in _speak(Path(out["out_dir"]), tmp_path / "export.wav", capsys)


def test_a_voice_trained_without_styles_still_warns(prepared_voice: Path, tiny_model_dir: Path,
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    voice = copy_voice(prepared_voice, tmp_path / "joe")
    run_dir = make_perturbed_run(voice, tiny_model_dir, steps=(1,), export=None)
    record_data(run_dir, voice)
    assert WARNING in _speak(voice / "runs" / "r1", tmp_path / "run.wav", capsys)
    out = export(voice, tmp_path / "export", run="r1")
    assert WARNING in _speak(Path(out["out_dir"]), tmp_path / "plain.wav", capsys)


def test_wyoming_lists_a_voices_trained_styles_as_its_speakers(described_run: Path,
                                                              tmp_path: Path) -> None:
    """What Home Assistant sees: the run's and its export's styles as speakers; a request's
    speaker is the instruction its sentences are spoken with."""
    out = export(described_run, tmp_path / "export", run="r1")
    for target, kind in ((described_run / "runs" / "r1", "run"),
                         (Path(out["out_dir"]), "export")):
        served = ServedVoice("joe", target, kind, "english")
        assert set(served.styles) == set(STYLES)
        assert served.to_dict()["styles"] == served.styles
    assert ServedVoice("base", described_run / "nowhere", "export", "english").styles == []
    asked = {"text": "Hi.", "voice": {"name": "joe", "speaker": STYLES[0]}}
    assert style_for(asked) == STYLES[0]
    assert style_for({"text": "Hi.", "voice": {"name": "joe"}}) == ""


def test_style_obedience_renders_each_trained_style_against_the_plain_render(
        described_run: Path) -> None:
    """Mechanics on the tiny model (it speaks noise): every trained style is rendered
    beside the plain render and each word it names is checked; a voice without styles
    has nothing to check."""
    from engine.config.speak import SpeakOptions
    from engine.quality.styles import style_obedience
    from engine.synth.synthesizer import Synthesizer
    from engine.synth.voice import resolve_source

    synth = Synthesizer.load(resolve_source(described_run / "runs" / "r1"), device="cpu")
    found = style_obedience(synth, ["Hello there, how are you?"],
                            options=SpeakOptions(max_frames=12, seed=3))
    assert set(found["styles"]) == set(STYLES) and found["sentences"] == 1
    whisper, fast = found["styles"][STYLES[0]], found["styles"][STYLES[1]]
    assert set(whisper["moves"]) <= {"whisper", "slow"} and set(fast["moves"]) <= {"fast"}
    assert whisper["checked"] == len(whisper["moves"]) and fast["checked"] == len(fast["moves"])
    assert whisper["checked"] + fast["checked"] >= 1
    with pytest.raises(InputError, match="without styles"):
        style_obedience(synth, ["Hi."], styles=[])


@pytest.fixture(scope="module")
def style_evaluated(described_run: Path, tmp_path_factory: pytest.TempPathFactory
                    ) -> dict[str, Any]:
    """A copy of the styled run evaluated for real: one sentence, its checkpoint only."""
    from engine.config.speak import SpeakOptions
    from engine.quality.evaluate import EvaluateRequest, evaluate

    voice = copy_voice(described_run, tmp_path_factory.mktemp("style_eval") / "joe")
    result = evaluate(EvaluateRequest(voice, "r1", checkpoints="all", asr="pocketsphinx",
                                      sentences=["Please call me back this afternoon."],
                                      options=SpeakOptions(max_frames=12, batch_size=8),
                                      device="cpu", export=False, zero_shot=False))
    return {"voice": voice, "result": result}


def test_the_evaluation_reports_each_trained_style_per_checkpoint(
        style_evaluated: dict[str, Any]) -> None:
    """Per checkpoint and style: its checks (obeyed or not, by how much) beside the styled
    renders' similarity and word errors against the plain ones, in the file and report."""
    out = style_evaluated["voice"] / "runs" / "r1" / "evaluation"
    data = json.loads((out / "evaluation.json").read_text(encoding="utf-8"))
    (entry,) = data["entries"]
    styles = entry["styles"]
    assert styles["sentences"] == 1 and set(styles["per_style"]) == set(STYLES)
    assert set(styles["plain"]) >= {"similarity", "wer"}
    for style in STYLES:
        s = styles["per_style"][style]
        assert s["checked"] == len(s["moves"]) and 0 <= s["obeyed"] <= s["checked"]
        assert s["followed"] in (True, False, None)
        assert s["similarity_change"] == pytest.approx(
            s["similarity"] - styles["plain"]["similarity"], abs=2e-3)
        assert isinstance(s["costs_similarity"], bool) and "wer_change" in s
    followed = sum(1 for s in styles["per_style"].values() if s["followed"])
    assert styles["followed"] == followed and styles["measurable"] <= 2
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Styles per checkpoint" in page and all(s in page for s in ("Whisper", "Fast"))
    assert "styles obeyed" in style_evaluated["result"]["summary"]
    # a style that cost similarity is a warning of its own
    costly = [st for st, s in styles["per_style"].items() if s["costs_similarity"]]
    warned = [w for w in data["warnings"] if w["code"] == "style_costs_similarity"]
    assert len(warned) == len(costly)


def test_the_train_page_shows_how_many_styles_each_checkpoint_obeyed(
        qtbot, window: Any, workspace: Path, style_evaluated: dict[str, Any]) -> None:
    from gui.pages.train import TrainPage

    window.ctx.set_voice(copy_voice(style_evaluated["voice"], workspace / "joe"))
    page = window.show_page(TrainPage)
    qtbot.waitUntil(lambda: not page.eval_note.isHidden(), timeout=30000)
    styles = json.loads((style_evaluated["voice"] / "runs" / "r1" / "evaluation"
                         / "evaluation.json").read_text(encoding="utf-8"))["entries"][0]["styles"]
    figure = f"styles obeyed {styles['followed']} of {styles['measurable']}"
    assert figure in page.eval_note.text()
    assert f"step 1: {figure}" in page.eval_note.toolTip()
