"""A voice trained with style descriptions, from its data to speaking with an instruction.

- One real run of the tiny model on Ray with two CPU workers, LoRA on the talker and the
  code predictor, half of the clips described (the session's `lora_predictor_run`): it
  trains, records the styles it trained with, and resumes in a copy (the fingerprint
  covers the descriptions, so an edited one refuses).
- Speaking (on runs made in one process, with the run's data recorded as training
  records it): a checkpoint and an export of a voice trained with styles take
  `--instruct` without the "little or no effect" warning; one trained without still warns.
- The reinforce stage of a run trained with styles (its style weight above 0): a share of
  its prompts carry a trained style, sampled and laid out with the official instruction
  tokens, and the reward's style term is 1 for a render that moved the way its style says
  against the speaker's plain delivery and 0 for one that moved the other way (real audio).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.audio.io import read_mono
from engine.config.reinforce import ReinforceConfig
from engine.core.errors import InputError
from engine.core.kinds import ServedKind
from engine.data.layout import LayoutIds
from engine.layout.exports import EXPORT_INFO
from engine.layout.manifest import read_manifest, write_manifest
from engine.layout.run import Run
from engine.layout.voice import open_voice
from engine.model.loading import load_model
from engine.reinforce.reward import StyleTerm, reward
from engine.reinforce.rollout import Roller
from engine.reinforce.stage import iteration_styles
from engine.serve.voices import ServedVoice
from engine.serve.wyoming import style_for
from engine.synth.prompt import build_prefill
from engine.train.driver import train
from engine.train.export import export
from engine.train.grpo import code_logprobs
from engine.train.objective import VoiceObjective
from engine.train.rundata import record_data
from tests.helpers.ray_cluster import SharedCluster
from tests.helpers.runs import LORA_STEPS, LORAP_OPTIONS, STYLES, describe, make_perturbed_run
from tests.helpers.voices import copy_voice

WARNING = "little or no effect"


@pytest.fixture(scope="module")
def styled(lora_predictor_run: dict[str, Any], tiny_model_dir: Path,
           shared_cluster: SharedCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, Any]:
    """The session's described run (`lora_predictor_run`: LoRA on the talker and the code
    predictor, two workers), resumed for one more step in a copy of its voice."""
    voice = copy_voice(lora_predictor_run["voice"], tmp_path_factory.mktemp("styled") / "joe")
    shared_cluster.up()
    resumed = train(voice, str(tiny_model_dir), steps=LORA_STEPS + 1, resume=True,
                    **LORAP_OPTIONS)
    return {"voice": voice, "first": lora_predictor_run["result"], "resumed": resumed,
            "options": LORAP_OPTIONS}


def _speak(target: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    from engine.cli.main import main

    code = main(["speak", str(target), "Hello there.", "-o", str(out), "--device", "cpu",
                 "--max-frames", "6", "--seed", "1", "--instruct", STYLES[0], *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out + captured.err


@pytest.mark.timeout(1800)  # Ray starts (the session run's, a resume); a loaded machine: slow
def test_a_styled_run_trains_on_ray_records_its_styles_and_resumes(
        styled: dict[str, Any], tiny_model_dir: Path) -> None:
    assert styled["first"]["steps"] == LORA_STEPS and not styled["first"]["stopped"]
    assert styled["resumed"]["steps"] == LORA_STEPS + 1 and not styled["resumed"]["stopped"]
    run = Run(styled["voice"] / "runs" / "lorap")
    assert set(run.trained_styles()) == set(STYLES)
    # another description is other data: the run's positions index the old layout
    voice = styled["voice"]
    rows = read_manifest(voice, usable_only=False)
    rows[0]["style"] = "Angry."
    write_manifest(voice, rows)
    try:
        with pytest.raises(InputError, match="changed"):
            train(voice, str(tiny_model_dir), steps=LORA_STEPS + 2, resume=True,
                  **styled["options"])
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
    for target, kind in ((described_run / "runs" / "r1", ServedKind.RUN),
                         (Path(out["out_dir"]), ServedKind.EXPORT)):
        served = ServedVoice("joe", target, kind, "english")
        assert set(served.styles) == set(STYLES)
        assert served.to_dict()["styles"] == served.styles
    assert ServedVoice("base", described_run / "nowhere", ServedKind.EXPORT, "english").styles == []
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


def _played_at(audio: np.ndarray, speed: float) -> np.ndarray:
    """`audio` played `speed` times as fast (fewer samples at the same rate)."""
    n = int(len(audio) / speed)
    return np.interp(np.linspace(0, len(audio) - 1, n), np.arange(len(audio)),
                     audio).astype(np.float32)


def test_the_reinforce_style_term_rewards_a_render_that_moved_the_way_its_style_says(
        described_run: Path, tmp_path: Path) -> None:
    """Real speech (a plain clip of the voice) played faster and slower: "fast" is obeyed
    by the one and not the other against the speaker's plain delivery, "slowly" the other
    way round; the reward adds the weight times the term."""
    voice, run_dir = open_voice(described_run), described_run / "runs" / "r1"
    assert StyleTerm.load(voice, run_dir, ReinforceConfig()) is None  # off by default
    assert StyleTerm.load(voice, tmp_path, ReinforceConfig(style_weight=0.5)) is None  # no styles
    term = StyleTerm.load(voice, run_dir, ReinforceConfig(style_weight=0.5))
    assert term is not None and term.plain.rate is not None
    clip = next(r for r in read_manifest(described_run) if not r.get("style"))
    audio = read_mono(described_run / clip["path"], 24000)
    fast, slow = _played_at(audio, 1.4), _played_at(audio, 1 / 1.4)
    whisper_slowly, quick = STYLES
    assert term(quick, fast, 24000, clip["text"], False) == 1.0
    assert term(quick, slow, 24000, clip["text"], False) == 0.0
    assert (term(whisper_slowly, slow, 24000, clip["text"], False)
            > term(whisper_slowly, fast, 24000, clip["text"], False))
    # a plain render, and one that never ended, are not judged
    assert term(None, fast, 24000, clip["text"], False) == 0.0
    assert term(quick, fast, 24000, clip["text"], True) == 0.0
    terms = {"similarity": 0.5, "wer": 0.2, "capped": 0.0, "rate_off": 0.0}
    cfg = ReinforceConfig(style_weight=0.5)
    assert reward({**terms, "style": 1.0}, cfg) - reward({**terms, "style": 0.0}, cfg) == \
        pytest.approx(0.5)
    assert reward({**terms, "style": 1.0}, ReinforceConfig()) == reward(terms, ReinforceConfig())
    with pytest.raises(ValueError, match="style_weight"):
        ReinforceConfig(style_weight=-1.0)


def test_reinforce_rollouts_carry_a_trained_style_with_the_official_instruction_tokens(
        described_run: Path, tiny_model_dir: Path) -> None:
    """A share of the prompts carry the run's styles in turn; their renders are sampled
    after the official instruction tokens (the official prompt builder's) and laid out
    with them as context only, and a plain prompt renders as it did without styles."""
    styles = Run(described_run / "runs" / "r1").trained_styles()
    assert [iteration_styles(styles, ReinforceConfig(prompts=2), it) for it in (0, 1)] == \
        [[None, None], [None, None]]  # off by default
    cfg = ReinforceConfig(prompts=2, style_weight=0.5, style_share=0.5)
    asked = [iteration_styles(styles, cfg, it) for it in (0, 1)]
    assert asked == [[None, styles[0]], [None, styles[1]]]
    assert iteration_styles(styles, cfg.replace(style_share=1.0), 1) == [styles[0], styles[1]]

    torch.manual_seed(0)
    wrapper = load_model(tiny_model_dir, device="cpu", dtype=torch.float32)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    speaker = torch.randn(int(config["talker_config"]["hidden_size"]),
                          generator=torch.Generator().manual_seed(1)) * 0.1
    roller = Roller(wrapper.model, wrapper.processor, wrapper.processor.tokenizer, speaker,
                    LayoutIds.from_config(config), styles=styles)
    texts = ["A short sentence to say.", "Another one, a little longer."]
    styled = roller.sample(texts, group=2, max_frames=6, seed=0, styles=asked[0])
    plain = roller.sample(texts, group=2, max_frames=6, seed=0)
    assert [r.style for r in styled] == [None, None, styles[0], styles[0]]
    assert all(np.array_equal(a.codes, b.codes) for a, b in zip(styled[:2], plain[:2],
                                                                 strict=True))
    assert any(not np.array_equal(a.codes, b.codes) for a, b in zip(styled[2:], plain[2:],
                                                                     strict=True))
    official = wrapper._tokenize_texts([wrapper._build_instruct_text(styles[0])])[0]
    # the styled renders are what the decoder samples after the official tokens
    prefill = build_prefill(wrapper.model, wrapper.processor, [texts[1]] * 2, speaker, None,
                            non_streaming=True, instruct=official.reshape(1, -1))
    again = roller.fast.generate(prefill, [6, 6], roller.settings, seeds=[2, 3])
    assert all(np.array_equal(r.codes, c.cpu().numpy()) for r, c in zip(styled[2:], again,
                                                                        strict=True))
    # laid out for the update with the same tokens in front, never a target
    batch = roller.batch(texts, styled, "cpu")
    want = official.reshape(-1).tolist()
    k = len(want)
    for i in (2, 3):
        assert batch["text_ids"][i, :k].tolist() == want
        assert not batch["target_mask"][i, :k].any()
    with torch.no_grad():
        lp = code_logprobs(VoiceObjective(wrapper.model.talker), batch)
    for i, r in enumerate(styled):
        assert int((lp.render == i).sum()) == 16 * len(r.codes) + (0 if r.unended else 1)
