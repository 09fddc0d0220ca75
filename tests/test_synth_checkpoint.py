"""Speaking from a run's checkpoints and from an export, and the A/B comparison folder.

The run is the session's real training run (`trained_run`, tests/helpers/runs.py: 2 CPU
workers, checkpoints at steps 10 and 20, step 20 exported), copied with its export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.config.speak import SpeakOptions
from engine.core.errors import InputError, WorkspaceError
from engine.core.events import Event
from engine.quality.compare import CompareRequest, compare
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from tests.helpers.parity import assert_same_codes, record_choices
from tests.helpers.voices import copy_voice

# numeric parity (marked one by one: only the tests that compare two computations): a run
# folder against its export and the official loader; packaging/run_tests.sh runs them
# again under other CPU kernel dispatches, the folders and messages here once.

GREEDY = SpeakOptions(do_sample=False, subtalker_do_sample=False, max_frames=20,
                      loudness_lufs=None, seed=0)
TEXT = "Please remember to water the plants while I am away."


@pytest.fixture(scope="module")
def trained(trained_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, Any]:
    # the voice with the run's export in its exports/, as a user who exported has it
    voice = copy_voice(trained_run["voice"], tmp_path_factory.mktemp("synth_ckpt") / "joe")
    export = copy_voice(trained_run["export"], voice / "exports" / "joe-step20")
    return {"voice": voice, "run": voice / "runs" / "r1", "export": export}


@pytest.fixture(scope="module")
def run_synth(trained: dict[str, Any]) -> Synthesizer:
    return Synthesizer.load(resolve_source(trained["run"]), device="cpu")


@pytest.mark.parity
def test_run_folder_speaks_its_latest_checkpoint_like_the_export(
        trained: dict[str, Any], run_synth: Synthesizer) -> None:
    source = run_synth.source
    assert source.kind == "checkpoint" and source.label == "step 20"
    from_run = run_synth.speak(TEXT, GREEDY)
    exported = Synthesizer.load(resolve_source(trained["export"]), device="cpu")
    assert exported.source.kind == "custom_voice" and exported.source.speaker == "joe"
    from_export = exported.speak(TEXT, GREEDY)
    assert len(from_run.codes[0]) >= 5
    assert torch.equal(from_run.codes[0], from_export.codes[0])
    # a voice folder with an export speaks the export
    assert resolve_source(trained["voice"]).kind == "custom_voice"


@pytest.mark.parity
def test_export_decodes_exactly_like_official_generate_custom_voice(
        trained: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    synth = Synthesizer.load(resolve_source(trained["export"]), device="cpu")
    with record_choices(monkeypatch) as log:
        ours = synth.speak(TEXT, GREEDY)
    # the official call decodes its own codes: note them on the way (the real decode runs)
    tokenizer = synth.model.speech_tokenizer
    seen: list[torch.Tensor] = []
    decode = tokenizer.decode
    monkeypatch.setattr(tokenizer, "decode", lambda items, *a, **k: (
        seen.extend(i["audio_codes"] for i in items), decode(items, *a, **k))[1])
    wavs, sr = synth.wrapper.generate_custom_voice(
        TEXT, speaker="joe", do_sample=False, subtalker_dosample=False,
        max_new_tokens=len(ours.codes[0]) + 1)
    assert sr == 24000
    # our loop against the official generate: equal codes up to a rounding near-tie
    assert_same_codes(ours.codes[0], seen[0].cpu(), log, synth.fast.eos)
    if torch.equal(ours.codes[0], seen[0].cpu()):
        # the same decoder on the same codes: exact by construction
        mine, _ = decode([{"audio_codes": ours.codes[0]}])
        np.testing.assert_array_equal(wavs[0], mine[0])


@pytest.mark.parity
def test_checkpoints_differ_and_switching_back_to_zero_shot_restores_the_base(
        trained: dict[str, Any], run_synth: Synthesizer, piper_sentences: list[dict[str, Any]],
        tiny_model_dir: Path) -> None:
    ref = Path(piper_sentences[1]["path"])
    step10 = resolve_source(trained["run"], checkpoint="10")
    run_synth.use_source(step10)
    early = run_synth.speak(TEXT, GREEDY)
    run_synth.use_source(resolve_source(trained["run"], checkpoint="latest"))
    late = run_synth.speak(TEXT, GREEDY)
    assert not torch.equal(early.codes[0], late.codes[0])
    run_synth.use_source(resolve_source(tiny_model_dir, reference=ref))
    after = run_synth.speak(TEXT, GREEDY)
    fresh = Synthesizer.load(resolve_source(tiny_model_dir, reference=ref), device="cpu")
    assert torch.equal(after.codes[0], fresh.speak(TEXT, GREEDY).codes[0])


def test_compare_folder_has_every_voice_and_an_index(trained: dict[str, Any],
                                                     tmp_path: Path) -> None:
    out = tmp_path / "ab"
    sentences = ["The river curved gently.", "Could you move the blue chair?"]
    events: list[Event] = []
    result = compare(CompareRequest(trained["voice"], out, sentences,
                                    options=SpeakOptions(max_frames=12, seed=4), device="cpu"),
                     on_event=events.append)
    # one model load: each checkpoint swaps its tensors into the zero-shot clone's base
    assert sum(e.kind == "state" and e.data.get("state") == "loading_model"
               for e in events) == 1
    index = json.loads((out / "index.json").read_text())
    assert [e["label"] for e in index["entries"]] == ["zero-shot", "step 10", "step 20"]
    assert index["seed"] == 4 and index["sentences"] == sentences
    for entry in index["entries"]:
        assert len(entry["files"]) == 2
        for f in entry["files"]:
            assert (out / f["path"]).is_file() and f["duration_s"] > 0
    page = (out / "index.html").read_text()
    assert page.count("<audio") == 6 and "step 20" in page
    assert result["voices"] == ["zero-shot", "step 10", "step 20"]
    # the zero-shot column uses the voice's own reference clip (the x-vector training used)
    assert index["entries"][0]["reference"].startswith(str(trained["voice"]))
    # the voice holds that clip's transcript: the preview clones in context
    assert index["entries"][0]["mode"] == "in_context"
    assert [e["mode"] for e in index["entries"][1:]] == [None, None]


def test_checkpoint_errors_are_clear(trained: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no checkpoint '99'") as info:
        resolve_source(trained["run"], checkpoint="99")
    assert "10, 20" in (info.value.hint or "")
    empty = tmp_path / "v"
    (empty / "runs").mkdir(parents=True)
    (empty / "voice.toml").write_text("[voice]\nspeaker = 'x'\n")
    with pytest.raises(WorkspaceError, match="no trained model yet"):
        resolve_source(empty)
    with pytest.raises(WorkspaceError, match="not a training run"):
        compare(CompareRequest(empty, tmp_path / "out", ["Hi."]))


def test_cli_compare_picks_checkpoints_by_step(trained: dict[str, Any], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.main import main

    sentences = tmp_path / "s.txt"
    sentences.write_text("One sentence here.\n\nAnother one.\n", encoding="utf-8")
    code = main(["compare", str(trained["run"]), str(tmp_path / "ab"), "--checkpoints", "20",
                 "--sentences-file", str(sentences), "--no-zero-shot", "--max-frames", "8",
                 "--seed", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Compared 1 voice(s) on 2 sentence(s)" in captured.out
    index = json.loads((tmp_path / "ab" / "index.json").read_text())
    assert [e["step"] for e in index["entries"]] == [20] and index["seed"] == 2


def test_available_sources_lists_exports_and_checkpoints(trained: dict[str, Any]) -> None:
    from engine.synth.voice import available_sources

    found = available_sources(trained["voice"])
    assert [f["kind"] for f in found] == ["custom_voice", "checkpoint", "checkpoint"]
    assert [f.get("step") for f in found[1:]] == [20, 10]
    # every listed path resolves to a speakable source
    assert [resolve_source(f["path"]).kind for f in found] == [f["kind"] for f in found]


def test_damaged_checkpoint_fails_clearly_and_leaves_the_voice_usable(
        trained: dict[str, Any], run_synth: Synthesizer, tmp_path: Path) -> None:
    import shutil

    from engine.core.errors import ModelError

    run = tmp_path / "joe" / "runs" / "r1"
    shutil.copytree(trained["run"], run)
    broken = run / "checkpoint_step_0000030"
    shutil.copytree(run / "checkpoint_step_0000020", broken)
    (broken / ".metadata").write_bytes(b"not a checkpoint")
    before = run_synth.speak(TEXT, GREEDY).codes[0]
    with pytest.raises(ModelError, match="cannot be read") as info:
        run_synth.use_source(resolve_source(run, checkpoint="30"))
    assert info.value.hint
    assert torch.equal(run_synth.speak(TEXT, GREEDY).codes[0], before)
