"""The model repositories as a graph: which models exist, what each one needs, who needs it.

Every function reads the ``config.pbtxt`` files of the repositories (default
:func:`omni_triton.paths.model_repositories`); none talks to a server. ``serve`` uses them to pick
the models to load (:func:`resolve_models`), the models the frontend serves
(:func:`frontend_models`) and what a dead stub takes down with it (:func:`dependents`,
:func:`stream_callees`).
"""
from __future__ import annotations

from pathlib import Path

from omni_triton.paths import model_repositories


def read_config(config_path: Path):
    """A ``config.pbtxt`` parsed into tritonclient's ``ModelConfig`` protobuf message.

    Raises:
        OSError: the file cannot be read.
        google.protobuf.text_format.ParseError: it is not a valid model config.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())


def available_models(repositories: list[Path] | None = None) -> dict[str, Path]:
    """Model name -> model folder for every ``<repo>/<name>/config.pbtxt``."""
    found: dict[str, Path] = {}
    for repo in repositories or model_repositories():
        if not repo.is_dir():
            continue
        for config in sorted(repo.glob("*/config.pbtxt")):
            found[config.parent.name] = config.parent
    return found


def model_parameters(model_path: Path) -> dict[str, str]:
    """The ``parameters`` map of a model's ``config.pbtxt`` as plain strings."""
    config = read_config(model_path / "config.pbtxt")
    return {k: v.string_value for k, v in config.parameters.items()}


def dependencies(model_path: Path) -> list[str]:
    """Models a model needs loaded: ensemble steps, plus a BLS model's ``depends_on`` parameter."""
    config = read_config(model_path / "config.pbtxt")
    deps = [step.model_name for step in config.ensemble_scheduling.step]
    extra = config.parameters["depends_on"].string_value if "depends_on" in config.parameters else ""
    deps += [d.strip() for d in extra.split(",") if d.strip()]
    return deps


def frontend_models(models: list[str], repositories: list[Path] | None = None) -> list[str]:
    """``models`` plus the models their configs name in the ``frontend_companions`` parameter:
    models the OpenAI frontend calls itself although the user did not name them (``qwen3_tts``
    names ``qwen3_tts_voice_prompt``, which computes a clone prompt at voice upload). Without
    them, ``serve --models qwen3_tts`` loaded the companion (a dependency) but the frontend,
    told only the named models, answered voice uploads with ``voice_cloning_unavailable``."""
    paths = available_models(repositories)
    out = list(dict.fromkeys(models))
    for model in list(out):
        if model not in paths:
            continue
        config = read_config(paths[model] / "config.pbtxt")
        companions = config.parameters.get("frontend_companions")
        extra = companions.string_value if companions is not None else ""
        out += [c.strip() for c in extra.split(",") if c.strip() and c.strip() not in out]
    return out


def stream_callees(model: str, loaded: list[str], repositories: list[Path] | None = None) -> list[str]:
    """The loaded decoupled models that BLS model ``model`` calls (its ``depends_on``).

    When ``model``'s stub dies while one of them streams to it, python_backend 2.51 blocks that
    callee's next response forever (the server waits for the dead stub to take it), and with it
    every other request of the callee: ``serve`` restarts these too.
    """
    paths = available_models(repositories)
    if model not in paths:
        return []
    config = read_config(paths[model] / "config.pbtxt")
    if config.backend != "python" or "depends_on" not in config.parameters:
        return []
    callees = [d.strip() for d in config.parameters["depends_on"].string_value.split(",") if d.strip()]
    return [c for c in callees if c in loaded and c in paths
            and read_config(paths[c] / "config.pbtxt").model_transaction_policy.decoupled]


def dependents(model: str, loaded: list[str], repositories: list[Path] | None = None) -> list[str]:
    """``model`` and every model of ``loaded`` that needs it, directly or through others
    (ensembles and BLS models whose requests hang when ``model``'s stub dies)."""
    paths = available_models(repositories)
    needs = {m: set(dependencies(paths[m])) for m in loaded if m in paths}
    hit, changed = {model}, True
    while changed:
        changed = False
        for m, deps in needs.items():
            if m not in hit and deps & hit:
                hit.add(m)
                changed = True
    return [m for m in loaded if m in hit] or [model]


def triton_name(name: str, repositories: list[Path] | None = None) -> str:
    """The Triton model name for ``name``: ``name`` itself when a repository holds a model of
    that name, else the model whose config parameter ``served_model_name`` is ``name`` (the
    OpenAI-facing name: ``tts`` is served by ``csm``), else ``name`` unchanged."""
    models = available_models(repositories)
    if name in models:
        return name
    for model, path in models.items():
        if model_parameters(path).get("served_model_name") == name:
            return model
    return name


def resolve_models(names: list[str], repositories: list[Path] | None = None) -> list[str]:
    """Requested models plus their dependencies, dependencies first. A requested name may also be
    a model's ``served_model_name`` (``--models tts`` serves ``csm``, see :func:`triton_name`).

    Raises:
        KeyError: a name (or a dependency) is not in any model repository.
    """
    models = available_models(repositories)
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name not in models and not chain:
            name = triton_name(name, repositories)
        if name in order:
            return
        if name not in models:
            known = ", ".join(sorted(models))
            raise KeyError(f"unknown model {name!r}" + (f" (needed by {chain[-1]})" if chain else "")
                           + f"; known models: {known}")
        for dep in dependencies(models[name]):
            if dep not in chain:
                visit(dep, chain + (name,))
        order.append(name)

    for name in names:
        visit(name, ())
    return order



def on_demand_pipelines(spec: str, start: list[str], pipelines: list[str],
                        repositories: list[Path] | None = None) -> list[str]:
    """The pipelines ``serve --on-demand`` leaves to the frontend to load on first request.

    Args:
        spec: ``all`` (every name of ``pipelines`` not started), ``none``, or comma separated
            names (Triton or OpenAI names, :func:`triton_name`).
        start: the names ``serve --models`` loads at start (they are never on demand).
        pipelines: what ``all`` means (``omni_triton.cli.PIPELINES``).

    Returns:
        Triton model names, in ``spec``'s (or ``pipelines``') order, without the started ones.

    Raises:
        KeyError: a name (or a model it needs) is in no model repository.
    """
    spec = spec.strip()
    if spec == "none" or not spec:
        return []
    names = pipelines if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    started = {triton_name(n, repositories) for n in start}
    out = [triton_name(n, repositories) for n in names]
    resolve_models(out, repositories)  # every name and what it needs exists
    return [n for n in dict.fromkeys(out) if n not in started]
