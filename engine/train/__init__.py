"""Training, torchtitan's split: `driver` (`train()`), `request`, `presets`, `resolve` (data,
devices, config), `run_storage`, `run` (`TrainRun`: run folder, plan, launch, watch), `export`,
`launch` (Ray Train's TorchTrainer), `entry` (what Ray runs in each worker), `trainer`
(one rank's loop: optimiser, accumulation, validation, checkpoints, metrics), `builder`
(the model and data a rank trains), `loader` (its batches), `objective` + `loss`,
`parallelize` (FSDP2), `checkpoint` (DCP), `metrics`, `plan` (memory before starting)."""
