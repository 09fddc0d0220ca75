"""Trained runs of the tiny model for the tests that read one (a fixture plugin,
registered in tests/conftest.py).

- `trained_run` (session): one real training run, made once: the prepared voice `joe`,
  2 CPU workers on the session's Ray cluster, 20 steps, checkpoints at steps 10 and 20
  in `runs/r1`, and step 20 exported to a folder beside the voice (not in it: a voice
  with an export speaks the export, and some tests want the run itself). A dict:
  {"voice", "run", "export", "result", "events"}. Read-only: a test that writes copies the voice
  (`copy_voice`) first, and copies the export into its copy's exports/ if it wants one.
- `lora_run` (session): a real `--trainable lora` run of the same voice, one CPU worker,
  `LORA_STEPS` steps with a checkpoint at each in `runs/lora` (rank and alpha not the
  defaults, so a reader that ignores the run's config gets another scale), and its last
  step exported beside the voice (the export merges the adapters). The same dict, read-only;
  the voice holds the adapter voice the finished run wrote (`exports/lora-adapter`): a test
  that wants the run alone removes it from its copy.
- `lora_predictor_run` (session): as `lora_run`, with `--lora-predictor` (adapters on the
  code predictor's layers too), two CPU workers (each decoder layer's FSDP unit sharded,
  its adapters with it), `LORA_STEPS` steps with one checkpoint at the last, in
  `runs/lorap`, its options `LORAP_OPTIONS`; its adapter voice is `exports/lorap-adapter`
  of its voice. Every other clip of its voice is described with one of `STYLES`
  (`describe`), so it is also the styled run that test_style_run resumes (in a copy).
  All three dicts also hold the run's "result" (what `train` returned) and its "events".
- `make_perturbed_run(voice, model_dir)` (bench/bench_quality.py): what a real run
  leaves behind without Ray, in one process: the resolved config, DCP checkpoints saved
  by the training area's `Checkpointer` from the real objective and optimizer, and an
  export of the last step. Its "training" is a fixed perturbation of the trainable
  weights per step, so the checkpoints really differ (the tiny model speaks noise
  either way).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.config.train import ModelConfig, TrainConfig
from engine.core.events import Event
from engine.data.codes import extract_codes
from engine.layout.manifest import read_manifest, write_manifest
from engine.model.export import export_custom_voice
from engine.train.checkpoint import Checkpointer
from engine.train.driver import train
from engine.train.export import export
from tests.helpers.kept import kept
from tests.helpers.ray_cluster import SharedCluster
from tests.helpers.voices import copy_voice

#: the shared run's checkpoints (run.checkpoint_every) and last step
CHECKPOINT_EVERY, STEPS = 10, 20
#: the LoRA run: its steps (a checkpoint at each), adapter rank and alpha (scale 4, not 2)
LORA_STEPS, LORA_RANK, LORA_ALPHA = 2, 4, 16.0
#: `lora_predictor_run`'s training options (a resume of its run passes them again)
LORAP_OPTIONS: dict[str, Any] = {
    "use_gpu": False, "run": "lorap", "workers": 2, "checkpoint_every": LORA_STEPS,
    "val_every": 0, "lr": 5e-2, "trainable": "lora", "lora_rank": LORA_RANK,
    "lora_alpha": LORA_ALPHA, "lora_predictor": True, "batch_size": 4}
#: the style descriptions `describe` gives every other clip
STYLES = ("Whisper, slowly and calmly.", "Fast and excited.")


def describe(voice: Path) -> None:
    """Every other clip of `voice` gets one of STYLES (the rest stay plain)."""
    rows = read_manifest(voice, usable_only=False)
    for i, r in enumerate(rows):
        if i % 2 == 0:
            r["style"] = STYLES[(i // 2) % 2]
    write_manifest(voice, rows)


def _train_and_export(root: Path, voice: Path, model_dir: Path, cluster: SharedCluster,
                      run: str, steps: int, described: bool = False,
                      **options: Any) -> dict[str, Any]:
    """A real run `run` of a copy of `voice` under `root` (`described`: its clips described
    first), its last step exported beside it."""
    voice = copy_voice(voice, root / "joe")
    if described:
        describe(voice)
    cluster.up()
    events: list[Event] = []
    result = train(voice, str(model_dir), steps=steps, use_gpu=False, run=run,
                   on_event=events.append, **options)
    assert result["steps"] == steps and not result["stopped"], result
    out = export(voice, root / "exports" / f"joe-step{steps}", run=run, step=steps)
    return {"voice": voice, "run": voice / "runs" / run, "export": Path(out["out_dir"]),
            "result": result, "events": events}


@pytest.fixture(scope="session")
def trained_run(prepared_voice: Path, tiny_model_dir: Path, shared_cluster: SharedCluster,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # a high learning rate: the two checkpoints speak differently even after 10 steps
    return kept("trained_run", lambda: _train_and_export(
        tmp_path_factory.mktemp("trained_run"), prepared_voice, tiny_model_dir,
        shared_cluster, "r1", STEPS, workers=2, checkpoint_every=CHECKPOINT_EVERY,
        val_every=CHECKPOINT_EVERY, lr=2e-3))


@pytest.fixture(scope="session")
def lora_run(prepared_voice: Path, tiny_model_dir: Path, shared_cluster: SharedCluster,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # a high learning rate: two warm-up steps move the adapters (B starts at zero) enough
    # that the merged weights speak differently from the base
    return kept("lora_run", lambda: _train_and_export(
        tmp_path_factory.mktemp("lora_run"), prepared_voice, tiny_model_dir, shared_cluster,
        "lora", LORA_STEPS, workers=1, checkpoint_every=1, val_every=0, lr=5e-2,
        trainable="lora", lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA))


@pytest.fixture(scope="session")
def lora_predictor_run(prepared_voice: Path, tiny_model_dir: Path,
                       shared_cluster: SharedCluster,
                       tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    options = {k: v for k, v in LORAP_OPTIONS.items() if k not in ("run", "use_gpu")}
    return kept("lora_predictor_run", lambda: _train_and_export(
        tmp_path_factory.mktemp("lora_predictor_run"), prepared_voice, tiny_model_dir,
        shared_cluster, "lorap", LORA_STEPS, described=True, **options))


def make_perturbed_run(voice: Path, model_dir: Path, run: str = "r1",
                       steps: tuple[int, ...] = (10, 20), export: str | None = "joe-step20",
                       scale: float = 0.05) -> Path:
    """Checkpoints `steps` in `<voice>/runs/<run>` (and an export); returns the run folder."""
    # start-up cost: torch, for every pytest run that loads this plugin
    import torch

    from engine.train.objective import build_objective, load_base_weights, trainable_parameters

    index = extract_codes(voice, model_dir)
    run_dir = voice / "runs" / run
    run_dir.mkdir(parents=True)
    cfg = TrainConfig(model=ModelConfig(base=str(model_dir), speaker_name="joe"))
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
    objective = build_objective(model_dir, cfg.model, device="cpu")
    load_base_weights(objective, model_dir, "cpu")
    optimizer = torch.optim.AdamW(trainable_parameters(objective), lr=1e-4)
    ckpt = Checkpointer(run_dir, rank=0, world_size=1)
    g = torch.Generator().manual_seed(0)
    for step in steps:
        with torch.no_grad():
            for p in trainable_parameters(objective):
                p.add_(torch.randn(p.shape, generator=g) * scale * (p.std() + 1e-3))
        ckpt.save(step, objective, optimizer, None, {"epoch": 0, "position": step})
    if export:
        trained = {n: p.detach().clone() for n, p in objective.named_parameters()
                   if p.requires_grad}
        export_custom_voice(model_dir, trained, "joe", index.x_vector(),
                            voice / "exports" / export)
    return run_dir
