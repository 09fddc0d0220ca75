"""A `--trainable lora` run is usable before it is exported (issue 28, section 0): every
path that loads a run's checkpoint (speak, evaluate, compare, serve, the window's Listen)
merges its adapters with the run's own rank and alpha, exactly as export does, so a
checkpoint speaks like the export of the same step.

The run is the session's real LoRA run (`lora_run`, tests/helpers/runs.py: one CPU worker,
checkpoints at steps 1 and 2, rank 4 and alpha 16, step 2 exported beside the voice),
copied without its export and the adapter voice the run wrote at its end (a voice with an
export would speak the export).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf
import torch
from safetensors import safe_open

from engine.config.speak import SpeakOptions
from engine.layout.tiers import run_adapter_dir
from engine.model.files import weight_files
from engine.quality.compare import CompareRequest, compare
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from engine.train.lora import target_modules
from tests.helpers.runs import LORA_STEPS
from tests.helpers.voices import copy_voice

GREEDY = SpeakOptions(do_sample=False, subtalker_do_sample=False, max_frames=20,
                      loudness_lufs=None, seed=0)
SHORT = SpeakOptions(max_frames=8, seed=1)
TEXT = "Please remember to water the plants while I am away."


@pytest.fixture(scope="module")
def lora(lora_run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A private copy of the run's voice (evaluation writes into the run), no export in it."""
    voice = copy_voice(lora_run["voice"], tmp_path_factory.mktemp("lora") / "joe")
    shutil.rmtree(run_adapter_dir(voice, "lora"))  # the adapter voice the run wrote at its end
    return {"voice": voice, "run": voice / "runs" / "lora", "export": lora_run["export"]}


def _adapted(synth: Synthesizer) -> dict[str, torch.Tensor]:
    """The weights of every projection that has an adapter, by official name."""
    return {f"talker.{name}.weight": mod.weight.detach().clone()
            for name, mod in target_modules(synth.model.talker)}


def _base(model_dir: Path, names: set[str]) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}
    for f in weight_files(model_dir):
        with safe_open(str(f), framework="pt") as fh:
            found.update({k: fh.get_tensor(k) for k in names & set(fh.keys())})
    return found


@pytest.mark.parity
def test_a_lora_checkpoint_speaks_like_the_merged_export_of_its_step(
        lora: dict[str, Any], tiny_model_dir: Path) -> None:
    synth = Synthesizer.load(resolve_source(lora["run"]), device="cpu", dtype="float32")
    assert synth.source.kind == "checkpoint" and synth.source.label == f"step {LORA_STEPS}"
    exported = Synthesizer.load(resolve_source(lora["export"]), device="cpu", dtype="float32")
    ours, theirs = _adapted(synth), _adapted(exported)
    base = _base(tiny_model_dir, set(ours))
    assert len(ours) == 14 and set(base) == set(ours)  # 2 layers x 7 projections
    # W + (alpha / rank) B A, merged in fp32 from the same base by the same function; the
    # export was merged when it was written, maybe under other kernels (the parity passes
    # load the main pass's export), so B A's sums may round apart: to fp32 rounding
    for name, weight in ours.items():
        torch.testing.assert_close(weight, theirs[name], rtol=1e-6, atol=1e-7, msg=name)
    # the adapters moved every weight they sit on (B started at zero)
    assert all(not torch.equal(w, base[n].float()) for n, w in ours.items())
    # so the speech is the export's: greedy codes equal
    from_run, from_export = synth.speak(TEXT, GREEDY), exported.speak(TEXT, GREEDY)
    assert len(from_run.codes[0]) >= 5
    assert torch.equal(from_run.codes[0], from_export.codes[0])
    # switching checkpoints merges into the base again, never on top of the last merge: the
    # same bits as this process's first merge (the export's were merged under the main
    # pass's kernels, equal only to fp32 rounding, as above)
    synth.use_source(resolve_source(lora["run"], checkpoint="1"))
    assert any(not torch.equal(w, ours[n]) for n, w in _adapted(synth).items())
    synth.use_source(resolve_source(lora["run"], checkpoint=str(LORA_STEPS)))
    for name, weight in _adapted(synth).items():
        torch.testing.assert_close(weight, ours[name], rtol=0, atol=0, msg=name)


def test_speak_voice_from_the_command_line(lora: dict[str, Any], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.main import main

    out = tmp_path / "hello.wav"
    code = main(["speak", str(lora["voice"]), "Hello from the adapters.", "-o", str(out),
                 "--device", "cpu", "--max-frames", "8", "--seed", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    audio, rate = sf.read(out)
    assert rate == 24000 and len(audio) > 0


def test_evaluate_measures_every_lora_checkpoint(lora: dict[str, Any]) -> None:
    from engine import api

    result = api.evaluate(lora["voice"], run="lora", checkpoints="all", asr="pocketsphinx",
                          sentences=["The river curved gently."], options=SHORT, export=False,
                          device="cpu")
    labels = [e["label"] for e in result["entries"]]
    assert labels == ["zero-shot", "step 1", f"step {LORA_STEPS}"]
    saved = json.loads((lora["run"] / "evaluation" / "evaluation.json").read_text())
    assert [e.get("step") for e in saved["entries"]][1:] == [1, LORA_STEPS]


def test_compare_renders_every_lora_checkpoint(lora: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "ab"
    result = compare(CompareRequest(lora["run"], out, ["The river curved gently."],
                                    options=SHORT, device="cpu"))
    assert result["voices"] == ["zero-shot", "step 1", f"step {LORA_STEPS}"]
    index = json.loads((out / "index.json").read_text())
    assert all((out / f["path"]).is_file() for e in index["entries"] for f in e["files"])


def test_serve_workspace_speaks_the_lora_run(lora: dict[str, Any]) -> None:
    """The app `serve --workspace` runs, in this process: the voice and its run are listed
    and one request to the run is answered."""
    from starlette.testclient import TestClient

    from engine.serve.app import ServeConfig, create_app
    from engine.serve.pool import Pool
    from engine.serve.voices import discover

    pool = Pool(discover([], lora["voice"].parent), device="cpu", dtype="float32", rows=2,
                max_queue=4)
    # a loopback address: without a key the server answers this computer's programs only
    with TestClient(create_app(pool, ServeConfig(timeout_s=300)),
                    base_url="http://127.0.0.1") as http:
        listed = [v["id"] for v in http.get("/v1/audio/voices").json()["data"]]
        assert listed == ["joe", "joe/lora"]
        r = http.post("/v1/audio/speech", json={
            "model": "tts-1", "voice": "joe/lora", "input": "From the adapters.",
            "response_format": "wav", "max_frames": 8, "seed": 1})
        assert r.status_code == 200, r.text
        assert sf.read(io.BytesIO(r.content))[1] == 24000
    assert not pool.renders_dir.exists()


def test_listen_speaks_from_a_lora_checkpoint(qtbot, ctx, workspace: Path,
                                              lora: dict[str, Any]) -> None:
    from gui.pages.listen import ListenPage

    voice = copy_voice(lora["voice"], workspace / "joe")
    listen = ListenPage(ctx)
    qtbot.addWidget(listen)
    listen.show()
    ctx.set_voice(voice)
    listen.refresh()
    # the run's last checkpoint, wherever the list puts it (an adapter voice is listed first)
    def checkpoint_row() -> int:
        return next((i for i in range(listen.source.count())
                     if (listen.source.itemData(i) or {}).get("kind") == "checkpoint"
                     and f"lora · step {LORA_STEPS}" in listen.source.itemText(i)), -1)

    qtbot.waitUntil(lambda: checkpoint_row() >= 0, timeout=10000)
    listen.source.setCurrentIndex(checkpoint_row())
    failures: list[tuple[Any, ...]] = []
    listen.speech.failed.connect(lambda *a: failures.append(a))
    assert listen.speak("Hello from the adapters.") is not None
    qtbot.waitUntil(lambda: listen.request is None, timeout=180000)
    assert not failures
    assert listen.last_render is not None
    audio, rate = sf.read(listen.last_render)
    assert rate == 24000 and len(audio) > 0
    listen.speech.unload()
