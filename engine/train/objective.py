"""The training objective: one nn.Module whose forward computes the WHOLE loss.

CONTRACT (train-core -> train-ray, synth). Stable; changes are announced here.
-------------------------------------------------------------------------------
Before training (driver, once; cached, cheap to re-run):
    engine.data.codes.extract_codes(voice_dir, model_dir)          # in-process, or
    engine.data.codes.extract_codes_ray(voice_dir, model_dir)      # Ray tasks (cluster up)

Per worker (rank r of world w, process group already initialised by Ray Train):

    setup = setup_worker(model_dir, voice_dir, cfg, device)   # cfg: TrainConfig
    # == build_objective(model_dir, cfg.model, "meta")        (no memory yet)
    #    parallelize(objective, make_mesh(device), cfg.parallel, device)
    #    load_base_weights(objective, model_dir, device)      (local shards only)
    #    VoiceData.open(voice_dir, model_dir, cfg.data); data.check(w)
    objective, data = setup.objective, setup.data
    optimizer = AdamW(trainable_parameters(objective), ...)   # never the frozen ones
    micro = data.rank_batches(epoch, rank=r, world=w)  # Sequence; len ==
                                                       # data.micro_batches_per_epoch()
    # resume: index micro[k] directly (k = micro-batches done in this epoch)
    for k in range(len(micro)):
        set_gradient_sync(objective, last_micro_of_step)      # parallelize.py
        out = objective(batch_to_device(micro[k], device))
        (out["loss"] / cfg.data.grad_accum).backward()
    optimizer.step() every grad_accum micro-batches; steps/epoch = data.steps_per_epoch()

`out` (dict of tensors): "loss" (to backpropagate; micro-batches carry the
normalisers of their whole optimizer step, so with `/ grad_accum` and FSDP's
averaging over ranks the gradient is exactly the full-batch one); "total",
"talker", "subtalker" (this micro-batch's local means, for display);
"talker_sum", "subtalker_sum" (summed CE, detached) and "talker_tokens",
"subtalker_tokens" (local counts). Exact global means: all-reduce the four
sums/counts and take talker_sum / talker_tokens + subtalker_weight *
subtalker_sum / subtalker_tokens.
Validation: `data.val_batches(rank=r, world=w)` (same length on every rank,
may be empty), the same forward under torch.no_grad().

Export (collective): `sd = full_state_dict(objective)` on every rank; rank 0
gets {official key: CPU fp32 tensor} ("talker.model.layers.0...."), others {}.
Then rank 0 (or the driver, from a checkpoint):
`engine.model.export.export_custom_voice(model_dir, sd, speaker_name,
data.x_vector, out_dir)`. `sd` may hold only the trained tensors (e.g. loaded
straight from a DCP checkpoint of the trainable parameters): the rest come
from the base files, so export needs no model build. Use the x-vector the
run trained with (`data.x_vector` = `load_codes_index(voice).x_vector()` at
training time; re-preparing the voice may pick another reference clip, so
keep a copy in the run folder).
Checkpoints (train-ray): `torch.distributed.checkpoint` over
`get_model_state_dict(objective)` / `get_optimizer_state_dict(objective, opt)`;
keys are the official ones (prefix "talker."), never FSDP-specific.
-------------------------------------------------------------------------------

The loss (facts file, "The correct loss"), with the four upstream bugs fixed:
1. text embeddings go through `talker.text_projection` (as at inference);
2. talker: logits at position q against the codebook-0 token at q+1, shifted
   once (no second shift inside a library loss);
3. sub-talker input for a frame at position p is the talker hidden state at
   p-1, the one that predicted its codebook 0 (as generation does);
4. sub-talker head i (1..15) is scored against codebook i, not i+1.
Total = talker CE + subtalker_weight (0.3) x sub-talker CE, each a mean over
its target tokens of the whole global batch (see `loss` normalisers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from engine.config.train import ModelConfig
from engine.core.errors import ModelError
from engine.data.dataset import VoiceData
from engine.data.layout import NO_CODE, NO_CODEC, NUM_CODEBOOKS, SPEAKER_POS
from engine.model.files import weight_files
from engine.model.official import configuration, modeling
from engine.train import loss
from engine.train.lora import add_lora, initial_value, is_lora_name
from engine.train.parallelize import make_mesh, parallelize

TALKER_PREFIX = "talker."


class VoiceObjective(nn.Module):
    """Root module for FSDP: wraps the official talker (incl. code predictor).

    The speaker encoder and the codec are not part of it: they are frozen
    and only used before training (x-vector, codes), so they are never
    sharded, never in the optimizer, never in training memory.
    """

    def __init__(self, talker: nn.Module, subtalker_weight: float = 0.3) -> None:
        super().__init__()
        self.talker = talker
        self.subtalker_weight = float(subtalker_weight)

    # -- pieces, public so tests and the reference can check each one ---------

    def embed(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Talker input embeddings (B, L, D): text channel + codec channel + sub-codes."""
        talker = self.talker
        text_ids = batch["text_ids"]
        codec_ids = batch["codec_ids"]
        sub_codes = batch["sub_codes"]
        # Bug 1 fixed: the projection maps text_hidden -> talker hidden, always.
        x = talker.text_projection(talker.model.text_embedding(text_ids))
        has_codec = (codec_ids != NO_CODEC).unsqueeze(-1)
        codec = talker.model.codec_embedding(codec_ids.clamp(min=0))
        x = x + codec * has_codec.to(codec.dtype)
        cp_emb = talker.code_predictor.model.codec_embedding
        is_frame = (sub_codes[..., 0] != NO_CODE).unsqueeze(-1)
        sub = sub_codes.clamp(min=0)
        extra = cp_emb[0](sub[..., 0])
        for i in range(1, NUM_CODEBOOKS - 1):
            extra = extra + cp_emb[i](sub[..., i])
        x = x + extra * is_frame.to(extra.dtype)
        # The speaker slot holds the x-vector itself (no codec row at training time);
        # a row with an instruction in front has it that many positions later.
        speaker = batch["x_vector"].to(x.dtype)
        slot = torch.zeros_like(x)
        pos = batch.get("speaker_pos")
        if pos is None:
            slot[:, SPEAKER_POS] = speaker
        else:
            slot[torch.arange(x.shape[0], device=x.device), pos.to(x.device)] = speaker
        return x + slot

    def talker_hidden(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        # Right padding + causal attention: real positions never see padding, so
        # no attention mask is needed (and sdpa keeps its causal fast path).
        out = self.talker.model(inputs_embeds=inputs_embeds, use_cache=False)
        return out.last_hidden_state

    def subtalker_logits(self, prev_hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Teacher-forced code-predictor logits (F, 15, V) for F frames.

        prev_hidden: (F, D) talker hidden state at the position BEFORE each frame
        (bug 3 fixed); codes: (F, 16) the frame's codebooks. Input sequence:
        [hidden, emb0(code0), emb_cp[0](code1), ..., emb_cp[13](code14)];
        position i (1..15) has seen codes 0..i-1 and head i-1 predicts code i
        (bug 4 fixed: no extra shift).
        """
        talker = self.talker
        cp = talker.code_predictor
        parts = [prev_hidden.unsqueeze(1), talker.model.codec_embedding(codes[:, :1])]
        for i in range(1, NUM_CODEBOOKS - 1):
            parts.append(cp.model.codec_embedding[i - 1](codes[:, i:i + 1]))
        seq = cp.small_to_mtp_projection(torch.cat(parts, dim=1))
        h = cp.model(inputs_embeds=seq, use_cache=False).last_hidden_state
        return torch.stack([cp.lm_head[i - 1](h[:, i]) for i in range(1, NUM_CODEBOOKS)], dim=1)

    # -- the loss ------------------------------------------------------------------

    def forward(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hidden = self.talker_hidden(self.embed(batch))
        codec_ids = batch["codec_ids"]
        # host-built gather rows and counts (batch_to_device): no device-to-host read
        talker_sum, n_talker = loss.talker_ce(hidden, self.talker.codec_head, codec_ids,
                                              batch["target_mask"], batch.get("talker_rows"),
                                              batch.get("talker_count"))
        prev, codes = loss.frame_inputs(hidden, codec_ids, batch["sub_codes"],
                                        batch["frame_mask"], batch.get("frame_rows"))
        sub_sum, n_sub = loss.subtalker_ce(self.subtalker_logits(prev, codes), codes,
                                           batch.get("subtalker_count"))
        if "subtalker_live" in batch:
            # a sampled micro-batch that drew no frame: its stand-in frame counts zero times
            sub_sum = sub_sum * batch["subtalker_live"]
        # Normalisers from the data side (whole optimizer step, see loss.normalisers);
        # without them: the local mean.
        norm_t = batch.get("talker_norm", n_talker)
        norm_s = batch.get("subtalker_norm", n_sub)
        total = loss.combine(talker_sum, norm_t.to(torch.float32), sub_sum,
                             norm_s.to(torch.float32), self.subtalker_weight)
        return {
            "loss": total,
            "talker_sum": talker_sum.detach(),
            "subtalker_sum": sub_sum.detach(),
            "talker_tokens": n_talker,
            "subtalker_tokens": n_sub,
            "talker": (talker_sum / n_talker.clamp(min=1)).detach(),
            "subtalker": (sub_sum / n_sub.clamp(min=1)).detach(),
            "total": (talker_sum / n_talker.clamp(min=1)
                      + self.subtalker_weight * sub_sum / n_sub.clamp(min=1)).detach(),
        }


# -- building, loading, parameters, export ----------------------------------------

def build_talker(model_dir: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The official talker module (randomly initialised; `load_base_weights` fills it).

    device="meta" builds it without memory (for FSDP: shard, then materialise).
    """
    cfg = configuration().Qwen3TTSConfig.from_pretrained(str(model_dir))
    # sdpa everywhere: flash-attn is optional and eager is slow.
    cfg.talker_config._attn_implementation = "sdpa"
    cfg.talker_config.code_predictor_config._attn_implementation = "sdpa"
    with torch.device(device):
        talker = modeling().Qwen3TTSTalkerForConditionalGeneration(cfg.talker_config)
    return talker


def build_objective(model_dir: str | Path, model_cfg: ModelConfig | None = None,
                    device: str | torch.device = "cpu") -> VoiceObjective:
    """Objective around a fresh talker; sets requires_grad per `model_cfg.trainable`."""
    model_cfg = model_cfg or ModelConfig()
    objective = VoiceObjective(build_talker(model_dir, device), model_cfg.subtalker_weight)
    if model_cfg.trainable == "lora":
        add_lora(objective.talker, model_cfg.lora_rank, model_cfg.lora_alpha,
                 model_cfg.lora_predictor, model_cfg.lora_dropout)
    set_trainable(objective, model_cfg.trainable)
    return objective


def set_trainable(objective: VoiceObjective, trainable: str) -> None:
    """Freeze / unfreeze parameters per the config choice (see config.Trainable)."""
    talker = objective.talker
    for p in objective.parameters():
        p.requires_grad_(False)
    if trainable in ("talker", "talker+text"):
        for p in talker.parameters():
            p.requires_grad_(True)
        if trainable == "talker":
            talker.model.text_embedding.weight.requires_grad_(False)
    elif trainable == "code_predictor":
        for p in talker.code_predictor.parameters():
            p.requires_grad_(True)
    elif trainable == "talker_layers":
        for mod in (talker.model.layers, talker.model.norm, talker.codec_head):
            for p in mod.parameters():
                p.requires_grad_(True)
    elif trainable == "lora":
        adapters = [p for n, p in talker.named_parameters() if is_lora_name(n)]
        if not adapters:
            raise ValueError("trainable 'lora' needs adapters: build with build_objective")
        for p in adapters:
            p.requires_grad_(True)
    else:
        raise ValueError(f"unknown trainable choice {trainable!r}")


def trainable_parameters(objective: nn.Module) -> list[nn.Parameter]:
    """Exactly the parameters the optimizer gets (frozen ones never)."""
    return [p for p in objective.parameters() if p.requires_grad]


class TalkerWeights(Mapping[str, torch.Tensor]):
    """Read-only view of a model folder's `talker.*` tensors, read one at a time.

    Reading all of them at once would hold the whole talker in host memory on
    every rank (about 3.8 GB for 1.7B in bf16, per worker); this reads each
    tensor from its file only when asked.
    """

    def __init__(self, model_dir: str | Path) -> None:
        self._files: dict[str, str] = {}
        for f in weight_files(model_dir):
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():
                    if key.startswith(TALKER_PREFIX):
                        self._files[key] = str(f)

    def __getitem__(self, key: str) -> torch.Tensor:
        with safe_open(self._files[key], framework="pt") as fh:
            return fh.get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def read_talker_weights(model_dir: str | Path) -> Mapping[str, torch.Tensor]:
    """{official key: tensor} of every `talker.*` tensor of a model folder (lazy)."""
    return TalkerWeights(model_dir)


def _reset_rotary(module: nn.Module, device: torch.device) -> None:
    # inv_freq is a non-persistent buffer: not in the checkpoint, garbage after
    # to_empty() from meta. Recompute it exactly as the module's __init__ does.
    for m in module.modules():
        if hasattr(m, "inv_freq") and hasattr(m, "rope_init_fn"):
            inv_freq, scaling = m.rope_init_fn(m.config, device)
            m.inv_freq = inv_freq
            m.original_inv_freq = inv_freq
            m.attention_scaling = scaling


@torch.no_grad()
def load_base_weights(objective: VoiceObjective, model_dir: str | Path,
                      device: str | torch.device = "cpu",
                      weights: Mapping[str, torch.Tensor] | None = None) -> None:
    """Materialise (if on meta) and fill the objective with the base model's weights.

    Works before or after `parallelize`: sharded parameters (DTensors) take
    only their local shard from the full tensor, with no communication (every
    rank reads the same files, one tensor at a time). fp32 master weights
    whatever the file's dtype.
    """
    device = torch.device(device)
    # With CPU offload (parallelize sets this) the shards live in host memory.
    param_device = torch.device(getattr(objective, "_voxshard_param_device", None) or device)
    if any(p.is_meta for p in objective.parameters()) or any(
            b.is_meta for b in objective.buffers()):
        objective.to_empty(device=param_device)
    _reset_rotary(objective, device)

    src = weights if weights is not None else read_talker_weights(model_dir)
    own = dict(objective.named_parameters())
    missing = [k for k in own if k not in src and not is_lora_name(k)]
    if missing:
        raise ModelError(f"{model_dir} lacks {len(missing)} talker tensors (e.g. {missing[0]}).",
                         "The folder is not a complete Qwen3-TTS model.")
    for name, param in own.items():
        # LoRA adapters are not in the base model: their starting value, same on every rank
        full = (initial_value(name, tuple(param.shape)) if is_lora_name(name) and name not in src
                else src[name]).to(device=param_device, dtype=torch.float32)
        if tuple(full.shape) != tuple(param.shape):
            raise ModelError(f"{name} is {tuple(full.shape)} in {model_dir}, expected "
                             f"{tuple(param.shape)}: config and weights disagree.")
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements,
                                      src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)


def full_state_dict(objective: nn.Module) -> dict[str, torch.Tensor]:
    """Gather the full, unsharded state dict to rank 0 (CPU, fp32, official keys).

    A collective when the objective is sharded: every rank must call it.
    Non-zero ranks get {}.
    """
    sd = get_model_state_dict(objective, options=StateDictOptions(full_state_dict=True,
                                                                  cpu_offload=True))
    return {k: v.detach().to("cpu", torch.float32) for k, v in sd.items()}


def batch_to_device(batch: Mapping[str, Any], device: str | torch.device,
                    pin: bool = False) -> dict[str, torch.Tensor]:
    """numpy / python values -> tensors on `device` (ids int64, masks bool, floats fp32).

    Also adds the loss's gather rows and counts (`loss.host_rows`), built here on
    the host from the masks so the step never reads a size back from the device.
    pin: copy through page-locked memory (a GPU copies it without the host waiting).
    """
    batch = {**batch, **_gather_rows(batch)}
    out: dict[str, torch.Tensor] = {}
    for k, v in batch.items():
        if k == "predictor_pick":
            continue  # already applied to the frame rows, on the host
        if isinstance(v, torch.Tensor):
            t = v
        elif isinstance(v, np.ndarray):
            t = torch.from_numpy(v)
        elif isinstance(v, int | float):
            t = torch.tensor(float(v))
        else:
            continue  # metadata (clip ids) stays on the host
        if t.is_floating_point():
            t = t.to(torch.float32)
        if pin and t.device.type == "cpu" and torch.device(device).type == "cuda":
            t = t.pin_memory()
        out[k] = t.to(device, non_blocking=True)
    return out


def _gather_rows(batch: Mapping[str, Any]) -> dict[str, Any]:
    """talker_rows, frame_rows and their counts from host masks ({} if already there, or
    if the masks are on a device, where building them would read back a size)."""
    if "talker_rows" in batch or "target_mask" not in batch or "frame_mask" not in batch:
        return {}
    masks = []
    for key in ("target_mask", "frame_mask"):
        m = batch[key]
        if isinstance(m, torch.Tensor):
            if m.device.type != "cpu":
                return {}
            m = m.numpy()
        masks.append(np.asarray(m, dtype=bool))
    talker, frames = loss.host_rows(masks[0]), loss.host_rows(masks[1])
    out = {"talker_rows": talker, "frame_rows": frames,
           "talker_count": np.array(talker.size, dtype=np.float32),
           "subtalker_count": np.array(frames.size * (NUM_CODEBOOKS - 1), dtype=np.float32)}
    if "predictor_pick" in batch:
        # the code predictor's sample of these frames (engine.data.frames); none drawn:
        # it still runs on one frame (FSDP needs every rank through every unit), whose
        # loss then counts zero times
        pick = np.asarray(batch["predictor_pick"], dtype=np.int64)
        out["frame_rows"] = frames[pick] if pick.size else frames[:1]
        out["subtalker_count"] = np.array(pick.size * (NUM_CODEBOOKS - 1), dtype=np.float32)
        out["subtalker_live"] = np.array(1.0 if pick.size else 0.0, dtype=np.float32)
    return out


def named_trainable(objective: nn.Module) -> Iterable[tuple[str, nn.Parameter]]:
    return ((n, p) for n, p in objective.named_parameters() if p.requires_grad)


def trainable_groups(objective: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The trainable parameters of the code predictor, and of the rest of the talker.

    The code predictor's codebook embeddings count with the talker: they also build the
    talker's input (`embed`), so they get gradients even when nothing trains the
    predictor itself (a sub-talker loss weight of 0), which the first-step check must see.
    """
    groups: dict[str, list[nn.Parameter]] = {"talker": [], "code_predictor": []}
    for name, p in named_trainable(objective):
        own = (".code_predictor." in f".{name}"
               and ".code_predictor.model.codec_embedding." not in f".{name}")
        groups["code_predictor" if own else "talker"].append(p)
    return groups


@dataclass
class WorkerSetup:
    """Everything a training worker needs from train-core."""

    objective: VoiceObjective
    data: Any  # engine.data.dataset.VoiceData
    device: torch.device
    mesh: Any
    rank: int
    world: int

    def parameters(self) -> list[nn.Parameter]:
        return trainable_parameters(self.objective)


def setup_worker(model_dir: str | Path, voice_dir: str | Path, cfg: Any,
                 device: str | torch.device) -> WorkerSetup:
    """Build, shard and load the objective, open the data; `cfg` is a TrainConfig.

    Call inside the worker after the process group exists (Ray Train does it);
    without one it builds an unsharded objective (single process).
    """
    device = torch.device(device)
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    data = VoiceData.open(voice_dir, model_dir, cfg.data)
    data.check(world)
    torch.manual_seed(cfg.run.seed)
    objective = build_objective(model_dir, cfg.model, device="meta")
    mesh = make_mesh(device)
    parallelize(objective, mesh, cfg.parallel, device)
    load_base_weights(objective, model_dir, device)
    return WorkerSetup(objective, data, device, mesh, rank, world)
