"""The memory plan, term by term, against what torch really keeps (issue 18: never optimistic).

The activation term is compared with the bytes `saved_tensors_hooks` records
for one official decoder layer at the real 0.6B and 1.7B widths in bf16 (on
CPU); every other term with the arithmetic FSDP2 and AdamW imply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

WIDTHS = {"0.6b": (1024, 3072), "1.7b": (2048, 6144)}


def _one_layer_bytes(tiny_model_dir: Path, size: str, clips: int, seq: int) -> tuple[int, dict]:
    """Bytes autograd keeps for backward inside one official talker layer (bf16, CPU)."""
    import torch

    from engine.model.official import configuration, modeling

    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    talker = cfg["talker_config"]
    h, inter = WIDTHS[size]
    talker.update(hidden_size=h, intermediate_size=inter, num_hidden_layers=1,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128)
    talker.setdefault("rope_scaling", {})["mrope_section"] = [24, 20, 20]
    if "layer_types" in talker:
        talker["layer_types"] = ["full_attention"]
    tcfg = configuration().Qwen3TTSConfig(**cfg).talker_config
    tcfg._attn_implementation = "sdpa"  # as build_talker sets it
    torch.manual_seed(0)
    model = modeling().Qwen3TTSTalkerModel(tcfg).to(torch.bfloat16)
    layer = model.layers[0]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    given: set[int] = set()
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        # weights are model state, not activations; the layer's inputs (hidden
        # states, the shared rotary tables) belong to whoever made them
        if ptr not in params and ptr not in given:
            kept[ptr] = max(kept.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def enter(_mod: Any, args: tuple, kwargs: dict) -> None:
        for a in [*args, *kwargs.values()]:
            for t in (a if isinstance(a, tuple) else (a,)):
                if isinstance(t, torch.Tensor):
                    given.add(t.untyped_storage().data_ptr())
        hooks.__enter__()

    layer.register_forward_pre_hook(enter, with_kwargs=True)
    layer.register_forward_hook(lambda *_: hooks.__exit__(None, None, None))
    x = torch.randn(clips, seq, h, dtype=torch.bfloat16, requires_grad=True)
    model(inputs_embeds=x, use_cache=False)
    return sum(kept.values()), talker


@pytest.mark.parametrize("size", ["0.6b", "1.7b"])
def test_layer_activation_bytes_match_saved_tensors(tiny_model_dir: Path, size: str) -> None:
    from engine.train.plan import layer_activation_bytes

    clips, seq = 2, 80
    measured, talker = _one_layer_bytes(tiny_model_dir, size, clips, seq)
    predicted = clips * seq * layer_activation_bytes(talker, 2, seq, checkpointing=False)
    # 5 %: the CPU kernels may keep a different mask or statistics tensor than another
    # build's; the fp32 norm copies (about a fifth of the total) must be counted
    assert abs(predicted - measured) <= 0.05 * measured, (predicted, measured)
    assert predicted >= measured * 0.99, "the plan must not be optimistic"


def _cfg(**parallel: Any) -> Any:
    from engine.config.train import TrainConfig

    return TrainConfig().replace(parallel={"workers": 2, **parallel},
                                 data={"batch_size": 2, "grad_accum": 4})


def _plan(model_dir: Path, cfg: Any, device: str = "cuda") -> Any:
    from engine.train.plan import make_plan

    return make_plan(model_dir, cfg, device=device, free=[1 << 40] * 2, seq_len=100,
                     frames=60, capability=(9, 0), choices=False)


def test_offload_with_accumulation_keeps_whole_gradients_on_the_gpu(
        tiny_model_dir: Path) -> None:
    from engine.train.plan import count_units

    cfg = _cfg(cpu_offload=True, accum_reduce="last")
    units = count_units(tiny_model_dir, cfg.model, 2)
    full = sum(u.trainable_full for u in units)
    local = sum(u.trainable_local for u in units)
    last = _plan(tiny_model_dir, cfg)
    # FSDP2 offloads reduced shards only: the unreduced fp32 gradients stay on the GPU
    assert last.grads == 4 * full
    assert last.params == last.optimizer == 0
    every = _plan(tiny_model_dir, cfg.replace(parallel={"accum_reduce": "every"}))
    assert every.grads == 0  # reduce-scattered each micro-step, then offloaded
    assert every.total < last.total
    # the host holds params, sharded gradients, both moments and the fused CPU step's
    # temporary (its largest shard, as the fused GPU step's)
    on_gpu = _plan(tiny_model_dir, _cfg(accum_reduce="every"))
    assert every.host_bytes == 2 * (on_gpu.params + 4 * local + on_gpu.optimizer
                                    + on_gpu.step_temp)


def test_optimizer_step_temporary_fused_on_gpu_and_cpu(tiny_model_dir: Path) -> None:
    import torch

    from engine.train.plan import _local_numel, _param_table
    from engine.train.trainer import make_optimizer

    cfg = _cfg()
    table = _param_table(str(tiny_model_dir), "talker", cfg.model.lora_rank, True)
    shards = [_local_numel(shape, 2) for _, shape, trains in table if trains]
    gpu, cpu = _plan(tiny_model_dir, cfg), _plan(tiny_model_dir, cfg, "cpu")
    assert gpu.step_temp == 4 * max(shards)  # fused: in place, one tensor at a time
    assert cpu.step_temp == 4 * max(shards)  # the fused CPU kernel too (issue 32)
    # the step runs after backward: the larger of activations and the step counts
    for p in (gpu, cpu):
        assert p.total == (p.model_state + p.gather_buffer + max(p.activations, p.step_temp)
                           + p.runtime)
    # and the worker builds what the plan counted
    w = torch.nn.Parameter(torch.zeros(3))
    assert make_optimizer([w], cfg, torch.device("cuda")).defaults["fused"] is True
    assert make_optimizer([w], cfg, torch.device("cpu")).defaults["fused"] is True
    off = cfg.replace(parallel={"cpu_offload": True})
    assert make_optimizer([w], off, torch.device("cuda")).defaults["fused"] is True  # host


def test_gpu_runtime_is_context_plus_a_proportional_margin(tiny_model_dir: Path) -> None:
    from engine.train.plan import GPU_CONTEXT_BYTES, GPU_MARGIN

    small = _plan(tiny_model_dir, _cfg())
    big = _plan(tiny_model_dir, _cfg().replace(data={"batch_size": 16}))
    for p in (small, big):
        held = p.model_state + p.gather_buffer + max(p.activations, p.step_temp)
        assert p.runtime == GPU_CONTEXT_BYTES + int(GPU_MARGIN * held)
    assert big.runtime > small.runtime  # grows with what the GPU holds


def test_an_existing_cluster_is_planned_against_its_own_gpus(tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    """--address: the preflight reads each node's free GPU memory (NVML); the plan must
    fit the smallest GPU a worker may land on, or the start stops with the advice."""
    from engine.core.errors import InputError
    from engine.core.events import Emitter
    from engine.train.preflight import NodeReport, PreflightReport, node_facts
    from engine.train.run import cluster_gpu_plan

    assert "gpu_free" in node_facts()  # [] here: no GPU, but the fact is always there
    gib = 1 << 30

    def report(*frees: list[int]) -> PreflightReport:
        nodes = [NodeReport(f"n{i}", f"host{i}", "10.0.0.1",
                            facts={"gpu_free": f, "gpu_capability": [[9, 0]] * len(f)})
                 for i, f in enumerate(frees)]
        return PreflightReport(nodes, "/shared", "model", 0.1)

    roomy = report([80 * gib, 80 * gib], [80 * gib])
    assert roomy.gpu_free() == [80 * gib] * 3 and roomy.gpu_capability() == (9, 0)
    cfg = _cfg()
    plan = cluster_gpu_plan(roomy, tiny_model_dir, cfg, tmp_path, Emitter())
    assert plan.fits and plan.device == "cuda"
    tight = report([80 * gib], [gib // 2])
    assert tight.gpu_free()[0] == gib // 2
    with pytest.raises(InputError) as err:
        cluster_gpu_plan(tight, tiny_model_dir, cfg, tmp_path, Emitter())
    assert err.value.message.startswith("Training will not fit the cluster's GPUs")
    assert cluster_gpu_plan(report([], []), tiny_model_dir, cfg, tmp_path, Emitter()) is None


def test_parameters_stay_gathered_between_micro_steps_only_when_that_fits(
        tiny_model_dir: Path) -> None:
    """keep_gathered "auto": kept when the plan fits with every unit whole, re-gathered
    when only that fits, never without "last" reduction; the driver writes the choice
    into the run's config; a forced "on" that does not fit is advised away."""
    from engine.train.run import resolved

    cfg = _cfg(accum_reduce="auto")
    kept = _plan(tiny_model_dir, cfg)
    assert kept.keep_gathered and kept.accum_reduce == "last"
    assert "parameters stay gathered" in kept.table()
    off = _plan(tiny_model_dir, cfg.replace(parallel={"keep_gathered": "off"}))
    assert not off.keep_gathered and off.total < kept.total
    assert resolved(cfg, kept).parallel.keep_gathered == "on"
    assert resolved(cfg, off).parallel.keep_gathered == "off"
    assert resolved(cfg, kept).parallel.accum_reduce == "last"
    # room for re-gathering but not for keeping: "auto" gives keeping up, not "last"
    from engine.train.plan import make_plan

    def fit(c: Any, free: int) -> Any:
        return make_plan(tiny_model_dir, c, device="cuda", free=[free] * 2, seq_len=100,
                         frames=60, capability=(9, 0), choices=False)

    between = fit(cfg, off.total)
    assert between.fits and not between.keep_gathered and between.accum_reduce == "last"
    forced = fit(cfg.replace(parallel={"keep_gathered": "on"}), off.total)
    assert not forced.fits and forced.keep_gathered
    assert [(c.path, c.value) for c in forced.changes][:1] == [("parallel.keep_gathered",
                                                                 "off")]
    assert any(a.endswith("(--keep-gathered off).") for a in forced.advice)
    # no accumulation, or reduction after every micro-step: nothing to keep
    assert not _plan(tiny_model_dir, cfg.replace(data={"grad_accum": 1})).keep_gathered
    assert not _plan(tiny_model_dir, cfg.replace(parallel={"accum_reduce": "every"})
                     ).keep_gathered
    with pytest.raises(ValueError, match="keep_gathered"):
        cfg.replace(parallel={"accum_reduce": "every", "keep_gathered": "on"})


@pytest.mark.parity
def test_compiled_layers_only_on_a_gpu(tiny_model_dir: Path) -> None:
    """--compile compiles each decoder layer's forward on a GPU and nothing on CPU; the
    wiring itself (module tree, state-dict keys, loss and gradients) checked on CPU with
    dynamo's eager backend (capture only, no code generation)."""
    import torch

    from engine.config.train import ParallelConfig
    from engine.train.objective import build_objective, load_base_weights
    from engine.train.parallelize import compile_layers, decoder_layers, parallelize
    from tests.helpers.batches import two_clip_batch

    def built(compile_on_cpu: bool) -> Any:
        obj = build_objective(tiny_model_dir, None, device="meta")
        parallelize(obj, None, ParallelConfig(compile_layers=True), "cpu")
        load_base_weights(obj, tiny_model_dir, "cpu")
        if compile_on_cpu:
            assert compile_layers(obj, "cpu", backend="eager") == len(decoder_layers(obj))
        return obj

    eager = built(False)
    assert eager._voxshard_compiled == 0  # asked for, but this is a CPU
    assert all("forward" not in vars(layer) for layer in decoder_layers(eager))
    meta = build_objective(tiny_model_dir, None, device="meta")
    assert compile_layers(meta, torch.device("cuda")) == len(decoder_layers(meta))
    assert all("forward" in vars(layer) for layer in decoder_layers(meta))
    compiled = built(True)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    from engine.train.objective import batch_to_device

    batch = batch_to_device(two_clip_batch(tiny_model_dir), "cpu")
    losses, grads = [], []
    for obj in (eager, compiled):
        out = obj(batch)
        out["loss"].backward()
        losses.append(out["loss"].detach())
        grads.append({n: p.grad for n, p in obj.named_parameters() if p.grad is not None})
    torch.testing.assert_close(losses[1], losses[0])
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, msg=name)


def test_the_plan_counts_the_runs_other_processes_on_the_host(tiny_model_dir: Path) -> None:
    """Issue 45: CPU workers share the machine with the driver, Ray Train's controller and
    Ray's own processes; the plan names each, adds them to the whole run's figure, and its
    fit check (and advice) uses that figure, not the workers' alone."""
    from engine.train.plan import (
        DRIVER,
        DRIVER_BYTES,
        RAY_FIXED_PROCESSES,
        RAY_PROCESS_BYTES,
        RAY_PROCESSES,
        TRAIN_CONTROLLER,
        TRAIN_CONTROLLER_BYTES,
        local_cpus,
        make_plan,
    )

    cfg = _cfg().replace(data={"grad_accum": 1})  # no "auto" choice to trade for room

    def plan(free: int, c: Any = cfg) -> Any:
        return make_plan(tiny_model_dir, c, device="cpu", free=[free], seq_len=100,
                         frames=60, choices=False)

    roomy = plan(1 << 40)
    assert roomy.host_terms == {
        DRIVER: DRIVER_BYTES, TRAIN_CONTROLLER: TRAIN_CONTROLLER_BYTES,
        RAY_PROCESSES: (RAY_FIXED_PROCESSES + local_cpus(cfg)) * RAY_PROCESS_BYTES}
    assert roomy.ray_processes == RAY_FIXED_PROCESSES + local_cpus(cfg)
    others = sum(roomy.host_terms.values())
    assert others > 2 << 30  # about 2-2.4 GiB on a 2-core machine: a third of a real worker
    assert roomy.host_total == 2 * roomy.total + others
    assert roomy.to_dict()["host_total"] == roomy.host_total
    table = roomy.table()
    for name in (DRIVER, TRAIN_CONTROLLER, f"{RAY_PROCESSES} ({roomy.ray_processes})",
                 "the whole run"):
        assert name in table, table
    # room for the workers but not for the rest: does not fit, short by the rest
    workers_only = plan(2 * roomy.total)
    assert not workers_only.fits and "DOES NOT FIT" in workers_only.table()
    assert workers_only.advice[0] == f"Short by {others / (1 << 30):.1f} GiB per machine."
    assert plan(roomy.host_total).fits and not plan(roomy.host_total - 1).fits
    # where one worker fits with the rest and two do not, the advice says fewer workers,
    # with the whole run's figure
    one = plan(1 << 40, cfg.replace(parallel={"workers": 1}))
    short = plan(one.host_total)
    assert not short.fits
    fewer = [c for c in short.changes if c.path == "parallel.workers"]
    assert [c.value for c in fewer] == [1], short.changes
    assert fewer[0].why.startswith("Use fewer workers: about "
                                   f"{one.host_total / (1 << 30):.1f} GiB for the whole run")
    assert any(a.endswith("(--workers 1).") for a in short.advice), short.advice
    # an existing cluster runs Ray on its own nodes: nothing of that is planned here
    remote = plan(1 << 40, cfg.replace(parallel={"address": "10.0.0.2:6379"}))
    assert remote.host_terms == {} and remote.host_total == 2 * remote.total


def test_a_dry_run_refuses_a_machine_with_room_for_the_workers_only(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's check is the plan's whole-run figure: with memory for the workers'
    total but not for the driver and Ray beside them, `train` refuses before any cluster
    starts."""
    from engine.core.errors import InputError
    from engine.train import driver, plan
    from tests.helpers.voices import voice_with_clips

    voice = voice_with_clips(tmp_path, 8, 4.0)
    dry = driver.train(voice, str(tiny_model_dir), workers=2, use_gpu=False, dry_run=True)
    workers = dry["plan"]["total"] * 2
    assert dry["plan"]["host_total"] > workers
    monkeypatch.setattr(plan, "host_available_memory", lambda: workers + (64 << 20))
    with pytest.raises(InputError) as err:
        driver.train(voice, str(tiny_model_dir), workers=2, use_gpu=False)
    assert err.value.message.startswith("Training will not fit")
