"""Every ``TritonPythonModel`` of the repository (stub-only imports: ``triton_python_backend_utils``).

``stream.DecoupledStage`` / ``batched.BatchedStage``: the two stage skeletons; ``bls``: call a
stage, stream a stage with cancel + drain; ``triton_io``: the one place every stub -> server
call goes through (the call lock of the 2.51 crash fix); ``speech``, ``qwen3_omni``, ``chat``,
``diffusion``: the per-family classes the ``model_repository/*/1/model.py`` bindings name.
"""
