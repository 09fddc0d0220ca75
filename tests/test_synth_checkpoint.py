"""Speaking from a run's checkpoints and from an export, and the A/B comparison folder.

The run is made with the training area's real pieces (objective, base weights,
AdamW, the DCP `Checkpointer`) in one process; its "training" is a fixed
perturbation of the trainable weights, so two checkpoints really differ.
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
from engine.synth.compare import compare
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from tests.fixtures_audio import copy_voice
from tests.parity import assert_same_codes, record_choices

# numeric parity: a run folder against its export and the official loader.
# packaging/run_tests.sh runs these again under other CPU kernel dispatches.
pytestmark = pytest.mark.parity

GREEDY = SpeakOptions(do_sample=False, subtalker_do_sample=False, max_frames=20,
                      loudness_lufs=None, seed=0)
TEXT = "Please remember to water the plants while I am away."


def _perturb(objective: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in objective.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.05 * (p.std() + 1e-3))


@pytest.fixture(scope="module")
def trained(prepared_voice: Path, tiny_model_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from engine.config.train import ModelConfig, TrainConfig
    from engine.data.codes import extract_codes
    from engine.model.export import export_custom_voice
    from engine.train.checkpoint import Checkpointer
    from engine.train.objective import build_objective, load_base_weights, trainable_parameters

    root = tmp_path_factory.mktemp("synth_ckpt")
    voice = copy_voice(prepared_voice, root / "joe")
    index = extract_codes(voice, tiny_model_dir)
    run = voice / "runs" / "r1"
    run.mkdir(parents=True)
    cfg = TrainConfig(model=ModelConfig(base=str(tiny_model_dir), speaker_name="joe"))
    (run / "config.json").write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
    objective = build_objective(tiny_model_dir, cfg.model, device="cpu")
    load_base_weights(objective, tiny_model_dir, "cpu")
    optimizer = torch.optim.AdamW(trainable_parameters(objective), lr=1e-4)
    ckpt = Checkpointer(run, rank=0, world_size=1)
    _perturb(objective, 1)
    ckpt.save(10, objective, optimizer, None, {"epoch": 0, "position": 10})
    _perturb(objective, 2)
    ckpt.save(20, objective, optimizer, None, {"epoch": 0, "position": 20})
    trained = {n: p.detach().clone() for n, p in objective.named_parameters()
               if p.requires_grad}
    export = export_custom_voice(tiny_model_dir, trained, "joe", index.x_vector(),
                                 voice / "exports" / "joe-step20")
    return {"voice": voice, "run": run, "export": export}


@pytest.fixture(scope="module")
def run_synth(trained: dict[str, Any]) -> Synthesizer:
    return Synthesizer.load(resolve_source(trained["run"]), device="cpu")


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
    result = compare(trained["voice"], out, sentences,
                     options=SpeakOptions(max_frames=12, seed=4), device="cpu")
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
        compare(empty, tmp_path / "out", ["Hi."])


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
