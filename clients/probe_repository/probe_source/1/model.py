"""Triton binding: diagnostic model probe_source (issue 9 crash reproduction, not served by default).
Adapter: omni_triton.adapters.probe.ProbeSource; contract: omni_triton.contracts.probe."""
from omni_triton.adapters.probe import ProbeSource as TritonPythonModel  # noqa: F401
