"""Training: objective, loss, sharding, config; launch, worker, checkpoints, metrics."""
