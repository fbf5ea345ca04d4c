"""The batched-stage skeleton: dynamically batched (non-decoupled) stages over
:func:`~omni_triton.adapters.triton_io.batched_execute` (per-item parse errors answer only that
item; one batched ``run`` for the valid ones)."""
from __future__ import annotations

from typing import Any, Mapping

from omni_triton.adapters.triton_io import batched_execute, model_parameters


class BatchedStage:
    """Base ``TritonPythonModel`` of a dynamically batched stage.

    Subclasses implement ``setup(args, params)``, ``parse(request) -> item`` (raise the
    pipeline's input error, or ``ValueError``, for that request only), ``run(items) -> results``
    (one call for the batch) and ``outputs(result) -> {name: array}``.
    """

    def initialize(self, args):
        self.name = args["model_name"]
        self.params = model_parameters(args)
        self.setup(args, self.params)

    def setup(self, args: dict, params: dict[str, str]) -> None:
        """Load the model; ``params`` are the config.pbtxt parameters."""

    def parse(self, request) -> Any:
        raise NotImplementedError

    def run(self, items: list) -> list:
        raise NotImplementedError

    def outputs(self, result) -> Mapping[str, Any]:
        raise NotImplementedError

    def execute(self, requests):
        return batched_execute(requests, self.name, self.parse, self.run, self.outputs)


def set_torch_threads() -> None:
    """One torch thread per stub process (oversubscription made runs 10-25x slower on 2 cores)."""
    import torch

    torch.set_num_threads(1)
