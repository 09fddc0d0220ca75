"""Ray Train's failure policy for a run: retry a dead worker, never a fatal failure."""

from __future__ import annotations

import socket
from typing import Any

from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision

from engine.train.failures import fatal_of, host_out_of_memory, kernel_oom_kills


def no_retry_policy_class() -> type:
    """Ray's default failure policy, except that a FatalTrainingError is raised at once."""
    class NoRetryOnFatal(DefaultFailurePolicy):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # read where the run starts (the policy then travels to the controller, which
            # compares on the same machine only)
            self.kernel_kills = kernel_oom_kills()
            self.host = socket.gethostname()

        def make_decision(self, training_failed_error: Any) -> Any:
            # a host out-of-memory meets the same wall again after a restart, each one
            # loading the model first
            before = self.kernel_kills if socket.gethostname() == self.host else None
            if fatal_of(training_failed_error) is not None or host_out_of_memory(
                    training_failed_error, before) is not None:
                return FailureDecision.RAISE
            return super().make_decision(training_failed_error)

    return NoRetryOnFatal
