"""Triton binding: diagnostic model probe_bls (issue 9 crash reproduction, not served by default).
Adapter: omni_triton.adapters.probe.ProbeBls; contract: omni_triton.contracts.probe."""
from omni_triton.adapters.probe import ProbeBls as TritonPythonModel  # noqa: F401
