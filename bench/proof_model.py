"""The GPU proof's model folders and the builder its loop runs: random weights at the real
0.6B and 1.7B widths (qwen3-tts-facts.md), written once to a cache folder from the CPU (no
download), and the product's objective and `parallelize` on synthetic batches in the real
sequence layout. Ray's workers import the builder by name (`PROOF_BUILDER`).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

from engine.audio.timebase import FRAME_RATE

#: the loop's builder, as a Ray worker or a proof process imports it
PROOF_BUILDER = "bench.proof_model:proof_builder"
#: real talker / code-predictor widths (qwen3-tts-facts.md)
SIZES: dict[str, dict[str, Any]] = {
    "0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28},
    "1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28},
}
COMMON = {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
          "text_hidden_size": 2048, "text_vocab_size": 151936}
CODE_PREDICTOR = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
                  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}


# -- model folders ------------------------------------------------------------------------

def make_model_dir(out: Path, size: str | None) -> Path:
    """A model folder: the tiny model (size None) or random weights at real widths."""
    from engine.model.tiny import make_tiny_model

    if size is None:
        return out if (out / "config.json").exists() else make_tiny_model(out, seed=0)
    if (out / "model.safetensors").exists():
        return out
    import torch
    from safetensors.torch import save_file

    from engine.train.objective import build_talker

    tiny = make_model_dir(out.parent / "tiny-template", None)
    cfg = json.loads((tiny / "config.json").read_text())
    talker = cfg["talker_config"]
    talker.update(COMMON, **SIZES[size])
    talker.setdefault("rope_scaling", {})["mrope_section"] = [24, 20, 20]
    talker["code_predictor_config"].update(CODE_PREDICTOR)
    for sub in (talker, talker["code_predictor_config"]):
        if "layer_types" in sub:
            sub["layer_types"] = ["full_attention"] * int(sub["num_hidden_layers"])
    cfg["speaker_encoder_config"]["enc_dim"] = talker["hidden_size"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    torch.manual_seed(0)
    # on CPU: the parent must not hold the GPU while the children measure it
    model = build_talker(out, "cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    sd = {f"talker.{k}": v.to(torch.bfloat16).contiguous()
          for k, v in model.state_dict().items()}
    del model
    save_file(sd, str(out / "model.safetensors"))
    del sd
    gc.collect()
    return out


# -- the builder the loop runs (product objective + parallelize, synthetic batches) ----

def _global_batch(model_dir: Path, clips: int, seconds: float, key: tuple[int, ...]) -> list[Any]:
    import numpy as np

    from engine.data.layout import LayoutIds, build_sequence

    cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(cfg)
    rng = np.random.default_rng(list(key))
    frames = max(2, int(seconds * FRAME_RATE))
    vocab = int(cfg["talker_config"]["text_vocab_size"])
    return [build_sequence(ids, [1, 2, 3], rng.integers(10, min(vocab, 1000),
                                                        size=max(2, int(seconds * 3))).tolist(),
                           rng.integers(0, 2048, size=(frames, 16))) for _ in range(clips)]


def proof_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """Builder for `run_worker`: the product's pieces, synthetic deterministic data.

    Each micro-step draws one global batch from (epoch, position, micro) and
    every rank takes its slice, with the step's global token counts as the
    loss normalisers: any world size computes the same full-batch gradient.
    """
    import numpy as np

    from engine.data.frames import PredictorSample, rank_picks
    from engine.data.layout import LayoutIds, collate, count_tokens
    from engine.train.builder import TrainParts, sharded_objective
    from engine.train.loss import normalisers
    from engine.train.objective import batch_to_device, trainable_groups
    from engine.train.parallelize import set_gradient_sync, set_keep_gathered

    model_dir = Path(loop_config["model_dir"])
    objective, device, precision, detail = sharded_objective(cfg, loop_config, model_dir)
    model_cfg = json.loads((model_dir / "config.json").read_text())
    ids = LayoutIds.from_config(model_cfg)
    hidden = int(model_cfg["talker_config"]["hidden_size"])
    clips, seconds = cfg.data.batch_size, float(loop_config["seconds"])
    accum = cfg.data.grad_accum

    def step_batches(epoch: int, position: int) -> list[Any]:
        seqs = [_global_batch(model_dir, clips, seconds, (epoch, position, m))
                for m in range(accum)]
        t = s = 0
        for micro in seqs:
            a, b = count_tokens(micro)
            t, s = t + a, s + b
        norm = normalisers(t, s, world)
        sample = PredictorSample(cfg.model.predictor_frames, cfg.run.seed)
        if sample.active:  # every rank's frames of every micro-batch: the shared split
            blocks = np.array([[sum(int(q.frame_mask.sum()) for q in micro[r::world])
                                for r in range(world)] for micro in seqs])
            picks, sampled = rank_picks(blocks, sample, position, rank)
            norm = (norm[0], sampled * 15 / world)
        out = []
        for m, micro in enumerate(seqs):
            mine = micro[rank::world]
            b = collate(mine, ids)
            rng = np.random.default_rng([epoch, position, m, 99])
            b["x_vector"] = (rng.standard_normal((clips, hidden)).astype("float32")
                             * 0.02)[rank::world]
            b["talker_norm"], b["subtalker_norm"] = norm
            if sample.active:
                b["predictor_pick"] = picks[m]
            out.append(b)
        return out

    def forward(model: Any, batch: Any) -> dict[str, Any]:
        return model(batch_to_device(batch, device))

    return TrainParts(model=objective, device=device, steps_per_epoch=1 << 30,
                      step_batches=step_batches, forward=forward,
                      set_grad_sync=lambda on: set_gradient_sync(objective, on),
                      set_keep_gathered=lambda keep, last: set_keep_gathered(objective, keep,
                                                                             last),
                      precision=precision, info={"precision_detail": detail},
                      prepare=lambda b: batch_to_device(b, device, pin=True),
                      groups=lambda: trainable_groups(objective))
