"""The GPU paths, proved on CPU where the CPU can prove them.

No GPU here: what is checked is every decision the GPU path takes from
inputs a CPU test can give it for real (a compute capability, a
CUDA_VISIBLE_DEVICES value, nvidia-smi output, a torch.OutOfMemoryError
raised inside the worker loop, a stop-flag answer that times out, a disk
that is too small), plus LoRA, the fp16 loss scaler and the run's data
fingerprint, which run the same on CPU.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.cli.main import cli_words
from engine.core.errors import InputError

# numeric parity (marked one by one: only the tests that compare two computations): LoRA
# against the plain computation; packaging/run_tests.sh runs them again under other CPU
# kernel dispatches, the decisions and messages here once.

# -- precision ---------------------------------------------------------------------------------


def test_precision_follows_the_compute_capability() -> None:
    from engine.train.precision import PrecisionError, describe, resolve_precision

    assert resolve_precision("auto", "cuda", (9, 0)) == "bf16"  # H100/H200
    assert resolve_precision("auto", "cuda", (8, 0)) == "bf16"  # A100
    assert resolve_precision("auto", "cuda", (7, 5)) == "fp16"  # T4, RTX 20xx
    assert resolve_precision("auto", "cuda", (7, 0)) == "fp16"  # V100
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("fp32", "cuda", (7, 5)) == "fp32"
    assert resolve_precision("fp16", "cuda", (9, 0)) == "fp16"
    with pytest.raises(PrecisionError) as err:
        resolve_precision("bf16", "cuda", (7, 5))
    assert str(err.value) == ("bf16 needs a GPU of compute capability 8.0 or newer; this one "
                              "is 7.5.")
    assert "bf16 needs 8.0+" in describe("fp16", "cuda", (7, 5))


def test_plan_precision_and_bf16_refusal_reach_the_api(tmp_path: Path, tiny_model_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.train import driver, gpus
    from tests.helpers.voices import voice_with_clips

    voice = voice_with_clips(tmp_path, 8, 4.0)
    t4 = gpus.GpuInfo(0, "GPU-t4", "Tesla T4", 16 << 30, 15 << 30, (7, 5))
    monkeypatch.setattr(gpus, "all_gpus", lambda: [t4])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = driver.train(voice, str(tiny_model_dir), use_gpu=True, dry_run=True)
    assert out["plan"]["precision"] == "fp16" and out["plan"]["workers"] == 1
    with pytest.raises(InputError) as err:
        driver.train(voice, str(tiny_model_dir), use_gpu=True, precision="bf16", dry_run=True)
    assert err.value.message.startswith("bf16 needs a GPU of compute capability 8.0")
    assert "--precision to fp16" in (err.value.worded(cli_words)[1] or "")


def test_loss_scaler_skips_overflowing_steps_on_every_rank() -> None:
    from engine.train.precision import LossScaler

    scaler = LossScaler(init_scale=1024.0, growth_interval=2)
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1024.0, 2048.0, 512.0])
    assert scaler.unscale_([p])
    assert torch.equal(p.grad, torch.tensor([1.0, 2.0, 0.5]))
    scaler.update(True)
    scaler.update(True)
    assert scaler.scale == 2048.0  # grows after growth_interval good steps
    p.grad = torch.tensor([float("inf"), 1.0, 1.0])
    assert not scaler.unscale_([p])
    scaler.update(False)
    assert scaler.scale == 1024.0 and scaler.skipped == 1
    restored = LossScaler()
    restored.load_state_dict(json.loads(json.dumps(scaler.state_dict())))
    assert restored.state_dict() == scaler.state_dict()


# -- process group backend ---------------------------------------------------------------------


def test_gpu_process_group_has_a_cpu_backend_beside_nccl(tmp_path: Path) -> None:
    import torch.distributed as dist
    from ray.train.torch.config import _is_backend_nccl

    from engine.train.parallelize import process_group_backend

    assert process_group_backend(True) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(False) == "gloo"
    # Ray Train recognises the string as NCCL (it sets NCCL's env up) ...
    assert _is_backend_nccl(process_group_backend(True))
    # ... and torch dispatches CPU tensors of a per-device backend string to gloo
    # (what clipping offloaded gradients needs); the CUDA half needs a GPU build
    dist.init_process_group("cpu:gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


# -- the stop flag -----------------------------------------------------------------------------


class _Flag:
    def __init__(self) -> None:
        self.asked = 0
        self.is_set = self

    def remote(self) -> str:
        self.asked += 1
        return f"ref{self.asked}"


def test_a_slow_stop_poll_is_not_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray
    from ray.exceptions import ActorDiedError, GetTimeoutError

    from engine.train.stop import StopPoller

    answers: list[Any] = [GetTimeoutError("slow"), GetTimeoutError("slow"), False, True]
    got: list[str] = []

    def fake_get(ref: str, timeout: float) -> Any:
        got.append(ref)
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    monkeypatch.setattr(ray, "get", fake_get)
    flag = _Flag()
    poll = StopPoller(flag, timeout_s=0.01)
    assert poll() is False and poll() is False  # timeouts: not a stop
    assert poll() is False  # the late answer of the same request: not set
    assert got[:3] == ["ref1", "ref1", "ref1"]  # one request, read when it came
    assert poll() is True  # a real stop
    assert got[3] == "ref2"
    # the flag actor is gone (the driver died): stop, nobody can use the run
    monkeypatch.setattr(ray, "get", lambda ref, timeout: (_ for _ in ()).throw(
        ActorDiedError()))
    assert StopPoller(_Flag())() is True
    assert StopPoller(None)() is False


# -- out of memory -----------------------------------------------------------------------------


class _Sender:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def send(self, kind: str, values: dict[str, Any]) -> None:
        self.records.append((kind, values))

    def log(self, message: str, level: str = "info") -> None:
        self.send("log", {"message": message})


def test_out_of_memory_in_a_worker_is_fatal_with_the_plans_advice(tmp_path: Path) -> None:
    from ray.train import FailureConfig
    from ray.train.v2._internal.execution.failure_handling import FailureDecision
    from ray.train.v2.api.exceptions import WorkerGroupError

    from engine.config.change import Change
    from engine.config.train import TrainConfig
    from engine.train.failures import FatalTrainingError, fatal_of, is_out_of_memory
    from engine.train.retry_policy import no_retry_policy_class
    from engine.train.trainer import WorkerEnv, run_worker

    lora = Change("model.trainable", "lora", "Train LoRA adapters only")
    loop_config = {"config": TrainConfig().to_dict(), "run_dir": str(tmp_path / "run"),
                   "total_steps": 3, "builder": "tests.helpers.builders:oom_builder",
                   "oom_advice": [lora]}
    with pytest.raises(FatalTrainingError) as err:
        run_worker(loop_config, WorkerEnv(rank=0, world=1, sender=_Sender()))
    fatal = err.value
    assert fatal.kind == "out_of_memory"
    assert fatal.message == "Training ran out of GPU memory on rank 0 at step 1."
    assert fatal.changes == (lora,) and fatal.hint is None
    assert isinstance(fatal.__cause__, torch.OutOfMemoryError)
    assert is_out_of_memory(fatal) and is_out_of_memory(fatal.__cause__)
    assert not is_out_of_memory(RuntimeError("connection reset by peer"))

    # Ray's failure policy: a worker group that failed with it is not retried
    policy = no_retry_policy_class()(FailureConfig(max_failures=2))
    oom = WorkerGroupError("rank 0 failed", {0: fatal, 1: RuntimeError("gloo: peer gone")})
    assert fatal_of(oom) is fatal
    assert policy.make_decision(oom) == FailureDecision.RAISE
    killed = WorkerGroupError("rank 1 died", {1: RuntimeError("worker died")})
    assert policy.make_decision(killed) == FailureDecision.RETRY

    # the driver turns it into one sentence with the advice as the hint
    from engine.core.errors import TrainingError
    from engine.train.launch import _as_training_error

    err2 = _as_training_error(oom)
    assert isinstance(err2, TrainingError) and err2.message == fatal.message
    assert err2.changes == (lora,) and err2.hint == "Train LoRA adapters only (trainable='lora')."


# -- GPU discovery -----------------------------------------------------------------------------


def _gpus() -> list[Any]:
    from engine.train.gpus import GpuInfo

    return [GpuInfo(i, f"GPU-{i}aaa-{i}", "NVIDIA L4", 24 << 30, (20 + i) << 30, (8, 9))
            for i in range(4)]


def test_cuda_visible_devices_is_honoured() -> None:
    from engine.train.gpus import filter_visible, min_capability, parse_smi

    devs = _gpus()
    idx = [lambda s: [d.index for d in filter_visible(devs, s)]][0]
    assert idx(None) == [0, 1, 2, 3]
    assert idx("") == []
    assert idx("2") == [2]
    assert idx("3,1") == [3, 1]
    assert idx(" 1 , 0 ") == [1, 0]
    assert idx("0,7,1") == [0]  # the list ends at the first entry naming no device
    assert idx("-1") == []
    assert idx("1,1") == [1]  # a repeat ends it too
    assert idx("GPU-2aaa") == [2]  # UUID prefix
    assert idx("GPU-") == []  # ambiguous prefix names nothing
    assert idx("MIG-abc") == []
    text = ("0, GPU-aa11, NVIDIA GeForce RTX 4090, 24564, 23000, 8.9\n"
            "1, GPU-bb22, Tesla T4, 15360, 15000, 7.5\n"
            "garbage line\n")
    parsed = parse_smi(text)
    assert [(g.index, g.uuid, g.total, g.free, g.capability) for g in parsed] == [
        (0, "GPU-aa11", 24564 << 20, 23000 << 20, (8, 9)),
        (1, "GPU-bb22", 15360 << 20, 15000 << 20, (7, 5))]
    assert min_capability(parsed) == (7, 5)
    old_driver = parse_smi("0, GPU-aa11, Tesla V100, 16384, 16000\n")
    assert old_driver[0].capability is None


def test_never_more_workers_than_visible_gpus(tmp_path: Path, tiny_model_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.train import driver, gpus
    from tests.helpers.voices import voice_with_clips

    voice = voice_with_clips(tmp_path, 8, 4.0)
    monkeypatch.setattr(gpus, "all_gpus", _gpus)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    out = driver.train(voice, str(tiny_model_dir), dry_run=True)
    # every visible GPU, one worker each, planned against their free memory
    assert out["config"]["parallel"]["workers"] == 2
    assert out["config"]["parallel"]["use_gpu"] is True
    assert out["plan"]["free"] == [22 << 30, 23 << 30]
    assert out["plan"]["precision"] == "bf16"
    with pytest.raises(InputError) as err:
        driver.train(voice, str(tiny_model_dir), workers=3, dry_run=True)
    assert err.value.message == "You asked for 3 workers but this machine has 2 GPUs."


# -- LoRA --------------------------------------------------------------------------------------


def _batch(model_dir: Path) -> dict[str, torch.Tensor]:
    from tests.helpers.batches import layout_batch, layout_sequences

    seqs, ids, xv = layout_sequences(model_dir)
    return layout_batch(seqs, ids, xv, [0, 1, 2, 3], 1)


@pytest.mark.parity
def test_lora_trains_adapters_only_and_export_merges_them(tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    from engine.config.train import ModelConfig
    from engine.model.checkpoint_weights import merge_lora
    from engine.model.export import export_custom_voice
    from engine.train.lora import TARGETS
    from engine.train.objective import (
        build_objective,
        full_state_dict,
        load_base_weights,
        read_talker_weights,
        trainable_parameters,
    )

    cfg = ModelConfig(trainable="lora", lora_rank=4, lora_alpha=8.0)
    lora = build_objective(tiny_model_dir, cfg, device="meta")
    load_base_weights(lora, tiny_model_dir, "cpu")
    plain = build_objective(tiny_model_dir, ModelConfig(), device="meta")
    load_base_weights(plain, tiny_model_dir, "cpu")
    trained = {n for n, p in lora.named_parameters() if p.requires_grad}
    layers = len(lora.talker.model.layers)
    assert len(trained) == 2 * len(TARGETS) * layers
    assert all(n.startswith("talker.model.layers.") and n.endswith((".lora_A", ".lora_B"))
               for n in trained)
    # base weights keep their official names; adapters start as a no-op (B = 0)
    base = read_talker_weights(tiny_model_dir)
    assert all(torch.equal(p, base[n]) for n, p in lora.named_parameters() if n in base)
    batch = _batch(tiny_model_dir)
    assert torch.equal(lora(batch)["loss"], plain(batch)["loss"])

    opt = torch.optim.AdamW(trainable_parameters(lora), lr=1e-2)
    for _ in range(2):
        lora(batch)["loss"].backward()
        opt.step()
        opt.zero_grad()
    assert all(p.grad is None for p in plain.parameters())
    moved_loss = lora(batch)["loss"]
    assert not torch.equal(moved_loss, plain(batch)["loss"])

    # merged into plain weights, the official module tree computes the same loss
    merged = merge_lora(full_state_dict(lora), cfg.lora_alpha / cfg.lora_rank)
    assert not any(k.endswith((".lora_A", ".lora_B")) for k in merged)
    assert set(merged) == set(base)
    plain.load_state_dict(merged)
    torch.testing.assert_close(plain(batch)["loss"], moved_loss, rtol=1e-5, atol=1e-6)
    # and the exported folder is a plain official one
    out = export_custom_voice(tiny_model_dir, merged, "Lora", torch.zeros(
        lora.talker.config.hidden_size).numpy(), tmp_path / "exp", keep_dtype=False)
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as fh:
        keys = list(fh.keys())
    assert not any("lora" in k for k in keys)


# -- disk space --------------------------------------------------------------------------------


def _tiny_state() -> tuple[Any, Any, Any]:
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 64)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched


def test_checkpoint_refuses_a_full_disk_and_keeps_the_previous_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from engine.layout.checkpoints import checkpoint_name, latest_checkpoint, list_checkpoints
    from engine.train import checkpoint as ck
    from engine.train.failures import FatalTrainingError

    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    model, opt, sched = _tiny_state()
    c = ck.Checkpointer(tmp_path / "run", 0, 1, keep=2)
    first = c.save(1, model, opt, sched, {"epoch": 0, "position": 1})
    need = ck.state_bytes(c._state_dicts(model, opt))
    # weights and AdamW's two moments in fp32, plus its step counter per parameter
    assert need == 3 * 4 * (64 * 64 + 64) + 2 * 4

    monkeypatch.setattr(ck, "free_bytes", lambda path: need // 2)
    with pytest.raises(FatalTrainingError) as err:
        c.save(2, model, opt, sched, {"epoch": 0, "position": 2})
    assert err.value.kind == "disk_full"
    assert "the checkpoint of step 1 is intact" in err.value.message
    assert not (tmp_path / "run" / checkpoint_name(2)).exists()
    assert latest_checkpoint(tmp_path / "run") == first

    # the disk fills up during the save: the torn folder goes, the previous stays
    monkeypatch.setattr(ck, "free_bytes", lambda path: 1 << 40)
    import torch.distributed.checkpoint as dcp

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp, "save", full)
    with pytest.raises(FatalTrainingError) as err:
        c.save(3, model, opt, sched, {"epoch": 0, "position": 3})
    assert "filled up while saving step 3" in err.value.message
    assert not (tmp_path / "run" / checkpoint_name(3)).exists()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == [first.name]


# -- a run is tied to its data -----------------------------------------------------------------


def test_resume_refuses_changed_data_and_says_what_changed_settings_do(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    import numpy as np

    from engine.train import driver
    from engine.train.rundata import (
        data_fingerprint,
        record_data,
        resume_changes,
        run_x_vector,
    )
    from tests.helpers.voices import voice_with_clips

    voice = voice_with_clips(tmp_path, 8, 4.0)
    first = driver.train(voice, str(tiny_model_dir), workers=2, steps=200, dry_run=True)
    run_dir = voice / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(first["config"]))
    record_data(run_dir, voice, x_vector=np.arange(4, dtype=np.float32))
    assert run_x_vector(run_dir).tolist() == [0.0, 1.0, 2.0, 3.0]

    events: list[Any] = []
    out = driver.train(voice, str(tiny_model_dir), workers=2, steps=30, resume=True, run="r1",
                    dry_run=True, on_event=events.append)
    assert out["config"]["run"]["steps"] == 30
    warnings_ = [e.data["message"] for e in events if e.kind == "log"
                 and e.data.get("level") == "warning" and "Resuming" in e.data["message"]]
    assert warnings_ == ["Resuming with steps 30 instead of 200: the learning-rate schedule is "
                         "recomputed for the new length, so the rate jumps to where the new "
                         "curve is at this step."]
    changes = resume_changes(first["config"], {**first["config"], "parallel": {
        **first["config"]["parallel"], "workers": 1}})
    assert [c["field"] for c in changes] == ["parallel.workers"]

    # the data changes (a transcript edited): resume refuses in one sentence
    manifest = voice / "prepared" / "manifest.jsonl"
    manifest.write_text(manifest.read_text().replace("hello there", "hello there!", 1))
    assert data_fingerprint(voice)["clips"] == 8
    with pytest.raises(InputError) as err:
        driver.train(voice, str(tiny_model_dir), workers=2, resume=True, run="r1", dry_run=True)
    assert err.value.message == ("The prepared data of this voice changed since run r1 started "
                                 "(the same number of clips, but different audio or "
                                 "transcripts), so it cannot be resumed.")


@pytest.mark.parity
def test_export_of_a_lora_run_merges_its_checkpoint_and_uses_the_runs_x_vector(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    """api.export from a real DCP checkpoint of a LoRA run: a plain folder, the run's speaker."""
    import warnings

    import numpy as np
    from safetensors import safe_open

    from engine.config.train import TrainConfig
    from engine.train.checkpoint import Checkpointer
    from engine.train.export import export
    from engine.train.objective import build_objective, load_base_weights
    from engine.train.rundata import record_data
    from tests.helpers.voices import voice_with_clips

    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    voice = voice_with_clips(tmp_path, 8, 4.0)  # no codes: export must not need them
    cfg = TrainConfig().replace(model={"base": str(tiny_model_dir), "trainable": "lora",
                                       "lora_rank": 2, "lora_alpha": 6.0})
    run_dir = voice / "runs" / "lora"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    obj = build_objective(tiny_model_dir, cfg.model, device="meta")
    load_base_weights(obj, tiny_model_dir, "cpu")
    hidden = obj.talker.config.hidden_size
    xv = np.linspace(-1, 1, hidden).astype(np.float32)
    record_data(run_dir, voice, x_vector=xv)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in obj.named_parameters():
            if n.endswith(".lora_B"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    opt = torch.optim.AdamW([p for p in obj.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    Checkpointer(run_dir, 0, 1).save(4, obj, opt, sched, {"epoch": 0, "position": 4})
    out = export(voice, tmp_path / "exported", run="lora")
    key = "talker.model.layers.0.mlp.down_proj"
    lin = obj.talker.get_submodule(key[len("talker."):])
    want = lin.weight + 3.0 * (lin.lora_B @ lin.lora_A)  # alpha / rank = 3
    with safe_open(str(Path(out["out_dir"]) / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
        got = fh.get_tensor(key + ".weight")
        row = fh.get_tensor("talker.model.codec_embedding.weight")[3000]
    assert not any("lora" in k for k in keys)
    # merged in fp32, stored in the base file's dtype, exactly
    torch.testing.assert_close(got, want.detach().to(got.dtype), rtol=0, atol=0)
    assert not torch.equal(got, lin.weight.detach().to(got.dtype))
    # the speaker row is the run's own x-vector (the voice has no codes to take one from)
    torch.testing.assert_close(row, torch.from_numpy(xv).to(row.dtype), rtol=0, atol=0)


def _sync_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """A tiny linear model whose gradient-sync switch records every call."""
    from engine.train.builder import TrainParts

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    calls = loop_config["_calls"]

    def forward(m: Any, batch: Any) -> dict[str, Any]:
        z = torch.zeros(())
        return {"loss": m(batch).pow(2).mean(), "talker_sum": z, "talker_tokens": z,
                "subtalker_sum": z, "subtalker_tokens": z}

    return TrainParts(model=model, device=torch.device("cpu"), steps_per_epoch=100,
                      step_batches=lambda e, p: [torch.ones(1, 2) * (p + k) for k in range(
                          cfg.data.grad_accum)],
                      forward=forward, set_grad_sync=calls.append)


@pytest.mark.parametrize("mode,expected", [("last", [False, False, True] * 2), ("every", [])])
def test_trainer_reduces_every_micro_step_when_the_plan_says_so(
        tmp_path: Path, mode: str, expected: list[bool]) -> None:
    """"last" switches reduction off until the last micro-step; "every" never switches it
    off, so FSDP reduce-scatters after each micro-step and gradients stay sharded."""
    from engine.config.train import TrainConfig
    from engine.train.trainer import WorkerEnv, run_worker

    calls: list[bool] = []
    cfg = TrainConfig().replace(data={"grad_accum": 3}, parallel={"accum_reduce": mode},
                                run={"val_every": 0})
    loop_config = {"config": cfg.to_dict(), "run_dir": str(tmp_path / "run"), "total_steps": 2,
                   "builder": "tests.test_gpu_paths:_sync_builder", "_calls": calls,
                   "save_final": False}
    out = run_worker(loop_config, WorkerEnv(rank=0, world=1, sender=_Sender()))
    assert out["step"] == 2
    assert calls == expected


def test_plan_counts_offloaded_state_in_host_memory(tiny_model_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.config.train import TrainConfig
    from engine.train import plan as planning

    cfg = TrainConfig().replace(parallel={"workers": 2}, data={"batch_size": 2})
    on_gpu = planning.make_plan(tiny_model_dir, cfg, device="cuda", free=[8 << 30] * 2,
                                seq_len=100, frames=60, capability=(9, 0), choices=False)
    off = planning.make_plan(tiny_model_dir, cfg.replace(parallel={"cpu_offload": True}),
                             device="cuda", free=[8 << 30] * 2, seq_len=100, frames=60,
                             capability=(9, 0), choices=False)
    # the sharded state moves from every GPU to the host, all workers' shards together
    assert off.params == off.grads == off.optimizer == 0
    # plus the fused CPU AdamW's temporary (its largest shard): the host runs the step
    assert off.host_bytes == 2 * (on_gpu.model_state + on_gpu.step_temp)
    assert off.fits and "offloaded to host memory" in off.table()
    monkeypatch.setattr(planning, "host_available_memory", lambda: off.host_bytes - 1)
    short = planning.make_plan(tiny_model_dir, cfg.replace(parallel={"cpu_offload": True}),
                               device="cuda", free=[8 << 30] * 2, seq_len=100, frames=60,
                               capability=(9, 0), choices=False)
    assert not short.fits


def _keep_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """`_sync_builder`, whose switches both record into one list, in call order."""
    parts = _sync_builder(cfg, loop_config, rank, world)
    calls = loop_config["_calls"]
    parts.set_grad_sync = lambda on: calls.append(("sync", on))
    parts.set_keep_gathered = lambda keep, last: calls.append(("keep", keep, last))
    return parts


@pytest.mark.parametrize("keep,accum", [("on", 3), ("off", 3), ("on", 1)])
def test_trainer_keeps_parameters_gathered_between_micro_steps(tmp_path: Path, keep: str,
                                                               accum: int) -> None:
    """keep_gathered "on": before each micro-step the units stay gathered, released only
    after the last backward; after the micro-steps FSDP's defaults come back (validation
    and checkpoints see sharded units). "off", or one micro-step: never switched."""
    from engine.config.train import TrainConfig
    from engine.train.trainer import ListSender, WorkerEnv, run_worker

    calls: list[tuple[Any, ...]] = []
    cfg = TrainConfig().replace(data={"grad_accum": accum},
                                parallel={"accum_reduce": "last", "keep_gathered": keep},
                                run={"val_every": 0})
    loop_config = {"config": cfg.to_dict(), "run_dir": str(tmp_path / "run"), "total_steps": 2,
                   "builder": "tests.test_gpu_paths:_keep_builder", "_calls": calls,
                   "save_final": False}
    sender = ListSender()
    run_worker(loop_config, WorkerEnv(rank=0, world=1, sender=sender))
    syncs = [("sync", False)] * (accum - 1) + [("sync", True)]
    if keep == "on" and accum > 1:
        one = []
        for i, s in enumerate(syncs):
            one += [s, ("keep", True, i == accum - 1)]
        assert calls == [*one, ("keep", False, True)] * 2
        assert any("stay gathered" in r["message"] for r in sender.of("log"))
    else:
        assert calls == syncs * 2
