"""``omni-triton serve``: start a real ``tritonserver`` (plus the OpenAI frontend) and keep it up.

One concern per module, lower layers first (each imports only the ones above it):

- :mod:`~omni_triton.serve.install`: find tritonserver, assemble the Python backend folder for
  this interpreter, the environment its stubs need.
- :mod:`~omni_triton.serve.repository`: the model repositories as a graph (available models,
  dependencies, what a model needs loaded, who depends on it, the decoupled models a BLS reads).
- :mod:`~omni_triton.serve.process`: process groups, port checks, /dev/shm files of a process,
  and :class:`~omni_triton.serve.process.ServerStartError`.
- :mod:`~omni_triton.serve.server`: :class:`~omni_triton.serve.server.TritonServer` and the
  :class:`~omni_triton.serve.server.Frontend` child.
- :mod:`~omni_triton.serve.supervisor`: the ``serve`` command itself and its supervision loop
  (restarts with backoff, stub reloads, the status file the frontend reads).

Import from the modules; this package file re-exports nothing, so importing the model graph (as
``omni_triton.prepare`` does) pulls in neither httpx nor the process code.
"""
