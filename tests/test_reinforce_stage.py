"""The reinforce stage as a command of a run (issue 33): the real reward (speaker similarity
with the independent encoder, the recogniser's word errors, length-cap hits, speaking
rate), checkpoints of training's format in the run, metrics per iteration, Stop saves
and --resume continues, and a reinforced checkpoint speaks through `speak`."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine import api
from engine.audio.io import read_mono
from engine.config import VoxshardConfig
from engine.config.reinforce import ReinforceConfig
from engine.core.errors import InputError, WorkspaceError
from engine.core.events import Event
from engine.data.layout import LayoutIds
from engine.layout.checkpoints import REINFORCE_STAGE, checkpoint_name, checkpoint_stage, step_of
from engine.layout.manifest import read_manifest
from engine.layout.run import Run
from engine.layout.tiers import read_adapter_info, run_adapter_dir
from engine.layout.voice import open_voice
from engine.model.checkpoint_weights import checkpoint_tensors
from engine.model.loading import load_model
from engine.reinforce.models import StageModels, load_stage_models
from engine.reinforce.reward import TERMS, Scorer, rate_off, reward
from engine.reinforce.rollout import Roller
from engine.reinforce.session import held_out_texts
from engine.reinforce.stage import roll_out
from engine.synth.runaway import LOOP, SILENCE
from engine.text import comparison_key
from engine.train.grpo import code_logprobs
from engine.train.lora import is_lora_name
from engine.train.objective import VoiceObjective
from tests.helpers.runs import STEPS
from tests.helpers.voices import DRONE, copy_voice, forced_export


def test_the_reward_weighs_each_term_as_voice_toml_says(tmp_path: Path) -> None:
    assert rate_off(1.0, 0.8, 1.25) == 0.0 and rate_off(None, 0.8, 1.25) == 0.0
    assert rate_off(2.5, 0.8, 1.25) == pytest.approx(math.log(2.0))
    assert rate_off(0.4, 0.8, 1.25) == pytest.approx(math.log(2.0))
    cfg = ReinforceConfig(similarity_weight=2.0, wer_weight=0.5, capped_weight=3.0,
                          rate_weight=4.0)
    terms = {"similarity": 0.6, "wer": 1.5, "capped": 1.0, "rate_off": 0.1}
    # the WER counts at most 1 (a recogniser hearing many words in noise is not worse)
    assert reward(terms, cfg) == pytest.approx(2.0 * 0.6 - 0.5 * 1.0 - 3.0 - 0.4)
    # the section round-trips in the one config tree, and a typo is refused
    assert VoxshardConfig.from_dict(VoxshardConfig().to_dict()).reinforce == ReinforceConfig()
    with pytest.raises(ValueError, match="reinforce: unknown"):
        ReinforceConfig.from_dict({"group_size": 4})
    with pytest.raises(ValueError, match=r"reinforce\.group"):
        ReinforceConfig(group=1)


def test_voice_toml_reinforce_section_is_read(trained_run: dict[str, Any],
                                              tmp_path: Path) -> None:
    voice = open_voice(copy_voice(trained_run["voice"], tmp_path / "joe"))
    text = voice.voice_file.read_text(encoding="utf-8")
    voice.voice_file.write_text(text + "\n[reinforce]\ngroup = 6\nwer_weight = 0.5\n",
                                encoding="utf-8")
    cfg = open_voice(voice.path).reinforce_config
    assert (cfg.group, cfg.wer_weight, cfg.iterations) == (6, 0.5, ReinforceConfig().iterations)
    voice.voice_file.write_text(text + "\n[reinforce]\ngroup = 1\n", encoding="utf-8")
    with pytest.raises(WorkspaceError, match=r"\[reinforce\]"):
        _ = open_voice(voice.path).reinforce_config


def test_prompts_are_sentences_the_voice_never_said(trained_run: dict[str, Any]) -> None:
    voice = open_voice(trained_run["voice"])
    texts = held_out_texts(voice)
    said = {comparison_key(c["text"]) for c in read_manifest(voice.path, usable_only=False)}
    said |= {comparison_key(t.text) for t in voice.list_takes()}
    assert texts and said and not said & {comparison_key(t) for t in texts}


def test_the_real_reward_prefers_the_speaker_saying_the_words(
        trained_run: dict[str, Any]) -> None:
    voice = open_voice(trained_run["voice"])
    run = Run(trained_run["run"])
    scorer = Scorer.load(voice, run.path, ReinforceConfig(), asr="pocketsphinx")
    clip = read_manifest(voice.path)[0]
    audio = read_mono(voice.path / clip["path"], 24000)
    real = scorer.score(audio, 24000, clip["text"], capped=False)
    noise = np.random.default_rng(0).normal(0, 0.1, audio.shape).astype(np.float32)
    other = scorer.score(noise, 24000, clip["text"], capped=True)
    assert set(real) == {"reward", *TERMS}
    assert real["similarity"] > other["similarity"] + 0.2
    assert real["wer"] < other["wer"] or other["wer"] == 1.0
    assert other["capped"] == 1.0 and real["capped"] == 0.0
    assert real["reward"] > other["reward"] + 1.0


def test_the_stage_runs_stops_resumes_and_its_checkpoint_speaks(
        trained_run: dict[str, Any], tmp_path: Path) -> None:
    voice = copy_voice(trained_run["voice"], tmp_path / "joe")
    run = Run(voice / "runs" / trained_run["run"].name)
    trained = [step_of(c) for c in run.checkpoints()]
    cfg = ReinforceConfig(iterations=3, prompts=1, group=2, max_frames=16, checkpoint_every=2,
                          lr=1e-3)
    stop = threading.Event()
    events: list[Event] = []

    def on_event(ev: Event) -> None:
        events.append(ev)
        if ev.kind == "metric" and ev.data.get("values", {}).get("iteration") == 1:
            stop.set()  # what SIGTERM does in the CLI

    first = api.reinforce(voice, run.name, on_event=on_event, cancel=stop, config=cfg,
                          asr="pocketsphinx")
    base = max(trained)
    # stopped after iteration 1, which was saved although it is not a checkpoint_every one
    assert first["stopped"] and first["iterations"] == 1 and first["step"] == base + 1
    assert first["from_step"] == base  # no evaluation yet: the newest training checkpoint
    with pytest.raises(InputError, match="--resume"):
        api.reinforce(voice, run.name, config=cfg, asr="pocketsphinx")

    second = api.reinforce(voice, run.name, config=cfg, resume=True, asr="pocketsphinx")
    assert not second["stopped"] and second["iterations"] == 3
    assert [h["iteration"] for h in second["history"]] == [1, 2, 3]
    steps = [step_of(c) for c in run.checkpoints()]
    # training's checkpoints untouched; the stage keeps its own newest two
    assert steps == [*trained, base + 2, base + 3]
    assert [checkpoint_stage(c) for c in run.checkpoints()][-2:] == [REINFORCE_STAGE] * 2
    rows = [r for r in run.metrics() if r.get("kind") == "reinforce"]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("reward", *TERMS, "kl", "reward_spread", "clipped"):
            assert math.isfinite(r[f"reinforce/{key}"]), key
    assert all(r["reinforce/capped"] == 1.0 for r in rows)  # the tiny model never ends
    report = json.loads(run.reinforce_report.read_text(encoding="utf-8"))
    assert report["iterations"] == 3 and report["step"] == base + 3

    # the policy moved, and the reinforced checkpoint is the format training writes
    start = checkpoint_tensors(run.checkpoint(base))
    after = checkpoint_tensors(run.checkpoint(base + 3))
    assert set(start) == set(after)
    assert any(not np.array_equal(start[k].numpy(), after[k].numpy()) for k in start)
    out = api.speak(voice, "A reinforced voice still speaks.", tmp_path / "out.wav",
                    checkpoint=str(base + 3), seed=0, max_frames=24)
    assert out["voice"]["checkpoint"].endswith(run.checkpoint(base + 3).name)
    assert read_mono(out["path"], 24000).size > 0


def test_the_command_streams_json_and_sigterm_saves_the_iteration(
        trained_run: dict[str, Any], tmp_path: Path) -> None:
    voice = copy_voice(trained_run["voice"], tmp_path / "joe")
    run = Run(voice / "runs" / trained_run["run"].name)
    base = max(step_of(c) for c in run.checkpoints())
    cmd = [sys.executable, "-m", "engine.cli.main", "--json", "reinforce", str(voice),
           "--run", run.name, "--iterations", "50", "--prompts", "1", "--group", "2",
           "--max-frames", "12", "--checkpoint-every", "25", "--asr", "pocketsphinx"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    events: list[dict[str, Any]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        events.append(json.loads(line))
        if events[-1]["event"] == "metric" and events[-1].get("split") == "reinforce":
            proc.send_signal(signal.SIGTERM)  # the window's Stop
            break
    events += [json.loads(line) for line in proc.stdout]
    assert proc.wait() == 130
    assert events[-1]["event"] == "error" and events[-1]["code"] == "cancelled"
    assert "--resume" in events[-1]["hint"]
    metrics = [e["values"] for e in events if e["event"] == "metric"]
    done = metrics[-1]["iteration"]
    assert [m["iteration"] for m in metrics] == list(range(1, done + 1))
    assert {"reinforce/reward", "reinforce/similarity", "reinforce/kl"} <= set(metrics[-1])
    # the iteration under way when the signal came was finished and saved (not a
    # checkpoint_every one)
    saved = [c for c in run.checkpoints() if checkpoint_stage(c) == REINFORCE_STAGE]
    assert [step_of(c) for c in saved] == [base + done]
    state = json.loads((saved[0] / "trainer.json").read_text(encoding="utf-8"))
    assert state["iteration"] == done and state["from_step"] == base



def test_a_training_resume_after_the_stage_is_refused_in_one_sentence(
        trained_run: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    # the stage's checkpoints are numbered after training's highest step: training that
    # went on in the run would take the stage's checkpoint for its own, or write its steps
    voice = copy_voice(trained_run["voice"], tmp_path / "joe")
    run = Run(voice / "runs" / trained_run["run"].name)
    cfg = ReinforceConfig(iterations=1, prompts=1, group=2, max_frames=8)
    api.reinforce(voice, run.name, config=cfg, asr="pocketsphinx")
    before = [c.name for c in run.checkpoints()]
    with pytest.raises(InputError, match="reinforce stage") as err:
        # more steps than it trained: without the stage this resume would train on
        api.train(voice, str(tiny_model_dir), run=run.name, resume=True, steps=STEPS + 10)
    assert "new run" in err.value.hint and "reinforce --resume" in err.value.hint
    assert [c.name for c in run.checkpoints()] == before


def test_a_lora_runs_stage_trains_only_its_adapters_and_exports_as_an_adapter_voice(
        lora_run: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    voice = copy_voice(lora_run["voice"], tmp_path / "joe")
    run = Run(voice / "runs" / "lora")
    base = max(run.steps())
    cfg = ReinforceConfig(iterations=2, prompts=1, group=2, max_frames=12, lr=5e-2,
                          checkpoint_every=2)
    with pytest.raises(InputError, match="not on Ray workers"):
        api.reinforce(voice, run.name, config=cfg, asr="pocketsphinx", workers=2)
    out = api.reinforce(voice, run.name, config=cfg, asr="pocketsphinx")
    assert out["step"] == base + 2 and out["iterations"] == 2
    rows = [r for r in run.metrics() if r.get("kind") == "reinforce"]
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["reinforce/kl"] >= 0 for r in rows)
    # the stage's checkpoint is the LoRA run's format: its adapters alone, moved
    start = checkpoint_tensors(run.checkpoint(base))
    after = checkpoint_tensors(run.checkpoint(base + 2))
    assert set(start) == set(after) and all(is_lora_name(k) for k in after)
    assert any(not np.array_equal(start[k].numpy(), after[k].numpy()) for k in start)
    # the run's adapter voice is now the stage's checkpoint, as a finished LoRA run writes
    # it, and `speak VOICE` speaks it
    made = out["adapter_voice"]
    assert Path(made["out_dir"]) == run_adapter_dir(voice, "lora")
    assert read_adapter_info(Path(made["out_dir"]))["checkpoint"] == checkpoint_name(base + 2)
    assert "Adapter voice lora-adapter ready" in out["summary"]
    spoken = api.speak(voice, "A reinforced adapter voice.", tmp_path / "a.wav", seed=0,
                       max_frames=12)
    assert (spoken["voice"]["kind"], spoken["voice"]["label"]) == ("adapter", "lora-adapter")
    # and the checkpoint itself speaks (its adapters merged, as export merges them)
    merged = api.speak(voice, "A reinforced adapter voice.", tmp_path / "m.wav", seed=0,
                       max_frames=12, checkpoint=str(base + 2))
    assert merged["voice"]["checkpoint"].endswith(checkpoint_name(base + 2))
    assert read_mono(merged["path"], 24000).size > 0


def _forced_roller(model_dir: Path) -> Roller:
    wrapper = load_model(model_dir, device="cpu", dtype=torch.float32)
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    hidden = int(cfg["talker_config"]["hidden_size"])
    speaker = torch.randn(hidden, generator=torch.Generator().manual_seed(1)) * 0.1
    return Roller(wrapper.model, wrapper.processor, wrapper.processor.tokenizer, speaker,
                  LayoutIds.from_config(cfg))


def test_the_stages_rollouts_end_a_loop_and_a_silence_early_and_pay_for_them(
        trained_run: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    # the tiny model forced into a drone and into silence by its own weights (as in
    # tests/test_synth_runaway.py); the guard's limits are every render's (4 s, 5 s)
    voice = open_voice(trained_run["voice"])
    cfg = ReinforceConfig(prompts=1, group=2, max_frames=160)
    scorer = Scorer.load(voice, Path(trained_run["run"]), cfg, asr="pocketsphinx")
    drone = _forced_roller(forced_export(tiny_model_dir, tmp_path / "drone", DRONE))
    assert drone.settings.guard is not None
    quiet = drone.settings.guard.silence_codes[0]  # what the tiny codec gives silence
    hush = _forced_roller(forced_export(tiny_model_dir, tmp_path / "hush", quiet))
    text = "The kettle started to whistle just as the phone rang in the hall."
    for roller, reason in ((drone, LOOP), (hush, SILENCE)):
        models = StageModels(roller.model, VoiceObjective(roller.model.talker),
                             VoiceObjective(roller.model.talker), roller)
        rollout = roll_out(roller, lambda rs, ts, m=models: m.score(scorer, rs, ts), cfg, 0,
                           [text])
        assert [r.runaway for r in rollout.renders] == [reason, reason]
        assert all(not r.capped and len(r.codes) < cfg.max_frames for r in rollout.renders)
        # it never chose to end: no end of speech is scored after its last frame
        with torch.no_grad():
            lp = code_logprobs(models.policy, roller.batch([text], rollout.renders, "cpu"))
        assert [int((lp.render == i).sum()) for i in range(2)] == [
            16 * len(r.codes) for r in rollout.renders]
        # penalised as a length-cap hit, and counted in the iteration's figures
        assert all(s["capped"] == 1.0 and s["rate_off"] == 0.0 for s in rollout.scored)
        assert all(s["reward"] == pytest.approx(reward({k: s[k] for k in TERMS}, cfg))
                   for s in rollout.scored)
        figures = rollout.figures(cfg.group)
        assert figures["runaway"] == 1.0 and figures["capped"] == 1.0


def test_a_lora_policys_rollouts_render_its_adapters_as_they_are_now(
        lora_run: dict[str, Any]) -> None:
    voice = open_voice(lora_run["voice"])
    run = Run(lora_run["run"])
    models = load_stage_models(voice, run, run.checkpoint(max(run.steps())), "lora", "cpu", 0)
    trained = [n for n, p in models.policy.named_parameters() if p.requires_grad]
    assert trained and all(is_lora_name(n) for n in trained)  # the base stays frozen
    text = ["The kettle started to whistle."]
    adapted = models.roller.sample(text, 2, 12, seed=0)
    with torch.no_grad():  # what the update would do: the adapters change in place
        for name, p in models.policy.named_parameters():
            if name.endswith("lora_B"):
                p.zero_()
    bare = models.roller.sample(text, 2, 12, seed=0)
    # B = 0 adds nothing: the base's own renders, exactly
    base = load_stage_models(voice, run, run.checkpoint(max(run.steps())), "lora", "cpu", 0)
    with torch.no_grad():
        for name, p in base.model.named_parameters():
            if is_lora_name(name):
                p.zero_()
    base.roller.lora_scaling = None  # no adapter rows at all
    alone = base.roller.sample(text, 2, 12, seed=0)
    assert all(np.array_equal(a.codes, b.codes) for a, b in zip(bare, alone, strict=True))
    assert any(not np.array_equal(a.codes, b.codes) for a, b in zip(adapted, bare, strict=True))
