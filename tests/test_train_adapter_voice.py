"""Training with LoRA ends with an adapter voice ready to speak (issue 30): when a LoRA run
finishes, its checkpoint is written as `export --adapter` writes it into the voice's
exports/, the run's result and its events say so, and `speak VOICE`, the catalog, the
server's list and the Voices page see it at once.

An evaluation that picks another best checkpoint later writes the adapter voice again from
it (atomically: a failed write leaves the old voice speaking), and says so.

The run is the session's real LoRA run (`lora_run`: one CPU worker, two steps, trained
through `engine.train.driver.train`, the path of the CLI's `train` and the window's run).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import soundfile as sf

from engine.catalog import list_tiers
from engine.config.speak import SpeakOptions
from engine.core.errors import InputError
from engine.core.events import Event
from engine.core.kinds import Tier
from engine.layout.checkpoints import checkpoint_name
from engine.layout.tiers import ADAPTER_WEIGHTS, read_adapter_info, run_adapter_dir
from engine.model.adapter import weights_fingerprint
from engine.quality.evaluate import HELD_OUT_SENTENCES, EvaluateRequest, evaluate
from engine.serve.pool import voice_stamp
from engine.serve.voices import discover
from engine.synth.voice import resolve_source
from engine.train.export import export
from gui.pages.voices import VoicesPage
from tests.helpers.runs import LORA_ALPHA, LORA_RANK, LORA_STEPS
from tests.helpers.voices import copy_voice, file_states


def test_a_finished_lora_run_has_written_its_adapter_voice_and_says_so(
        lora_run: dict[str, Any], tiny_model_dir: Path) -> None:
    voice, result = lora_run["voice"], lora_run["result"]
    folder = run_adapter_dir(voice, "lora")
    assert folder == voice / "exports" / "lora-adapter"
    assert (folder / ADAPTER_WEIGHTS).is_file()
    info = read_adapter_info(folder)
    # the run's last checkpoint (no evaluation chose a best), on the base it trained from
    assert info["checkpoint"] == checkpoint_name(LORA_STEPS) and info["run"] == "lora"
    assert (info["rank"], info["alpha"]) == (LORA_RANK, LORA_ALPHA)
    assert info["base_fingerprint"] == weights_fingerprint(tiny_model_dir)
    # the result (the CLI's JSON, the window's summary) and the event stream say so
    made = result["adapter_voice"]
    assert made["tier"] == Tier.ADAPTER and Path(made["out_dir"]) == folder
    assert "adapter voice lora-adapter ready to speak" in result["summary"]
    adapters = [e.data["path"] for e in lora_run["events"]
                if e.kind == "artifact" and e.data.get("role") == "adapter"]
    assert adapters == [str(folder)]
    # it is the voice's adapter tier at once, and what `speak VOICE` and `serve` take
    assert [(t["tier"], t["name"]) for t in list_tiers(voice)] == [(Tier.ADAPTER,
                                                                    "lora-adapter")]
    source = resolve_source(voice)
    assert source.kind == "adapter" and source.label == "lora-adapter"
    served = discover([], voice.parent)
    assert served["joe/lora-adapter"].tier == Tier.ADAPTER
    assert served["joe"].tier == Tier.ADAPTER


def test_a_run_that_trains_no_adapters_writes_no_adapter_voice(
        trained_run: dict[str, Any]) -> None:
    assert "adapter_voice" not in trained_run["result"]
    assert not run_adapter_dir(trained_run["voice"], "r1").exists()


def test_speak_voice_speaks_the_runs_adapter_voice(lora_run: dict[str, Any], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.main import main

    voice = copy_voice(lora_run["voice"], tmp_path / "joe")
    out = tmp_path / "hello.wav"
    code = main(["speak", str(voice), "Hello from the adapter voice.", "-o", str(out),
                 "--device", "cpu", "--max-frames", "8", "--seed", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "voice lora-adapter)" in captured.out + captured.err
    assert sf.read(out)[1] == 24000


def test_a_resumed_run_replaces_its_own_adapter_voice_and_nothing_else(
        lora_run: dict[str, Any], tmp_path: Path) -> None:
    voice = copy_voice(lora_run["voice"], tmp_path / "joe")
    own = run_adapter_dir(voice, "lora")
    # what the end of a resumed run does: the run's own folder is replaced, not refused
    out = export(voice, own, run="lora", step=1, adapter=True)
    assert Path(out["out_dir"]) == own
    assert read_adapter_info(own)["checkpoint"] == checkpoint_name(1)
    # any other folder that exists is still refused
    other = voice / "exports" / "mine"
    other.mkdir()
    with pytest.raises(InputError, match="already exists"):
        export(voice, other, run="lora", adapter=True)


def test_voices_page_shows_the_runs_adapter_voice(qtbot, ctx, workspace: Path,
                                                  lora_run: dict[str, Any]) -> None:
    voice = copy_voice(lora_run["voice"], workspace / "joe")
    page = VoicesPage(ctx)
    qtbot.addWidget(page)
    page.select(voice)
    page.refresh()
    qtbot.waitUntil(lambda: "adapter lora-adapter:" in page.tiers.text(), timeout=10000)
    # its tier, its size on disk and the base it speaks on
    assert re.search(r"adapter lora-adapter: \d+\.\d MB, on tiny-base", page.tiers.text())


def test_an_evaluation_that_picks_another_best_writes_the_adapter_voice_again(
        lora_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    voice = copy_voice(lora_run["voice"], tmp_path / "ws" / "joe")
    own = run_adapter_dir(voice, "lora")
    export(voice, own, run="lora", step=1, adapter=True)  # it speaks step 1 now
    served = discover([], voice.parent)
    names = ("joe", "joe/lora-adapter")
    stamps = {n: voice_stamp(served[n]) for n in names}
    events: list[Event] = []
    # the evaluation measures the last step alone: it is the best
    request = EvaluateRequest(voice, "lora", checkpoints=[str(LORA_STEPS)], export=False,
                              sentences=HELD_OUT_SENTENCES[:1], asr="pocketsphinx",
                              options=SpeakOptions(max_frames=10), device="cpu")
    result = evaluate(request, events.append)
    assert result["best"]["step"] == LORA_STEPS
    assert read_adapter_info(own)["checkpoint"] == checkpoint_name(LORA_STEPS)
    made = result["adapter_voice"]
    assert made["rewritten"] and made["was"] == checkpoint_name(1)
    assert Path(made["out_dir"]) == own
    assert "Adapter voice lora-adapter written again from the new best" in result["summary"]
    assert [e.data["path"] for e in events
            if e.kind == "artifact" and e.data.get("role") == "adapter"] == [str(own)]
    # a server serving it (by its own name, or the voice's) sees the folder change
    assert all(voice_stamp(served[n]) != stamps[n] for n in names)

    # once more from step 1, and this time the write fails half-way (the disk is full)
    export(voice, own, run="lora", step=1, adapter=True)
    kept = file_states(own)

    def full_disk(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"\0" * 64)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    events.clear()
    result = evaluate(request, events.append)  # its measurements are reused
    assert result["best"]["step"] == LORA_STEPS
    assert file_states(own) == kept  # the old voice, whole
    assert read_adapter_info(own)["checkpoint"] == checkpoint_name(1)
    assert not [p for p in own.parent.iterdir() if p.name.startswith(".")]  # no leftovers
    assert result["adapter_voice"]["rewritten"] is False
    assert "still speaks" in result["summary"]
    warned = [e.data["message"] for e in events
              if e.kind == "log" and e.data.get("level") == "warning"]
    assert any("was not written again" in m and "still speaks" in m for m in warned), warned
