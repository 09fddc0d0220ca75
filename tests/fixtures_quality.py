"""A tiny-model training run for the quality tests and bench (no Ray: one process).

`make_perturbed_run(voice, model_dir)` writes what a real run leaves behind: the
resolved config, DCP checkpoints saved by the training area's `Checkpointer`
from the real objective and optimizer, and an export of the last step. Its
"training" is a fixed perturbation of the trainable weights per step, so the
checkpoints really differ (the tiny model speaks noise either way).
"""

from __future__ import annotations

import json
from pathlib import Path


def make_perturbed_run(voice: Path, model_dir: Path, run: str = "r1",
                       steps: tuple[int, ...] = (10, 20), export: str | None = "joe-step20",
                       scale: float = 0.05) -> Path:
    """Checkpoints `steps` in `<voice>/runs/<run>` (and an export); returns the run folder."""
    import torch

    from engine.config.train import ModelConfig, TrainConfig
    from engine.data.codes import extract_codes
    from engine.model.export import export_custom_voice
    from engine.train.checkpoint import Checkpointer
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
