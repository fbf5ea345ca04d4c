"""The batched-stage skeleton: dynamically batched (non-decoupled) stages over
:func:`~omni_triton.adapters.triton_io.batched_execute` (per-item parse errors answer only that
item; one batched ``run`` for the valid ones)."""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from omni_triton.adapters import bls
from omni_triton.adapters.telemetry import Telemetry
from omni_triton.adapters.triton_io import batched_execute, model_parameters


class BatchedStage:
    """Base ``TritonPythonModel`` of a dynamically batched stage.

    Subclasses implement ``setup(args, params)``, ``parse(request) -> item`` (raise the
    pipeline's input error, or ``ValueError``, for that request only), ``run(items) -> results``
    (one call for the batch) and ``outputs(result) -> {name: array}``. The base reports the
    omni_stage_* metrics (``omni_triton.adapters.telemetry``): batch size, duration and finish
    reason of every request.
    """

    def initialize(self, args):
        self.name = args["model_name"]
        self.params = model_parameters(args)
        self.setup(args, self.params)
        self.telemetry = Telemetry(self.name, args.get("model_instance_name", self.name))
        bls.report_to(self.telemetry)

    def setup(self, args: dict, params: dict[str, str]) -> None:
        """Load the model; ``params`` are the config.pbtxt parameters."""

    def parse(self, request) -> Any:
        raise NotImplementedError

    def run(self, items: list) -> list:
        raise NotImplementedError

    def outputs(self, result) -> Mapping[str, Any]:
        raise NotImplementedError

    def execute(self, requests):
        start = time.monotonic()
        self.telemetry.add("omni_stage_requests_running", len(requests))
        try:
            responses = batched_execute(requests, self.name, self.parse, self.run, self.outputs)
        finally:
            self.telemetry.add("omni_stage_requests_running", -len(requests))
        try:
            self._report(responses, time.monotonic() - start)
        except Exception:  # noqa: BLE001 - metrics never fail a request
            logging.getLogger(self.name).exception("%s metrics", self.name)
        return responses

    def _report(self, responses, seconds: float) -> None:
        t = self.telemetry
        t.observe("omni_stage_batch_size", len(responses))
        reasons: dict[str, int] = {}
        for response in responses:
            reason = "stop"
            if response.has_error():
                code = getattr(response.error(), "code", None)
                invalid = callable(code) and code() == _pb().TritonError.INVALID_ARG
                reason = "invalid" if invalid else "error"
            reasons[reason] = reasons.get(reason, 0) + 1
            t.observe("omni_stage_request_duration_seconds", seconds)
        for reason, n in reasons.items():
            t.count("omni_stage_requests_finished_total", n, reason=reason)

    def finalize(self):
        bls.report_to(None)
        self.telemetry.close()


def set_torch_threads() -> None:
    """One torch thread per stub process (oversubscription made runs 10-25x slower on 2 cores)."""
    import torch

    torch.set_num_threads(1)


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils
