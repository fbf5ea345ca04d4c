"""Launcher and prepare: model selection, backend assembly, port checks, failure reports.

The last test starts the real tritonserver on a throw-away repository with a model whose
``initialize`` fails, and checks that the launcher names that model and its error instead of
hanging.
"""
from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from omni_triton.paths import cache_dir
from omni_triton.serve import install as serve_install
from omni_triton.serve.process import ServerStartError, check_ports_free, free_port
from omni_triton.serve.repository import dependencies, resolve_models
from omni_triton.serve.server import TritonServer


def _model(repo: Path, name: str, extra: str = "", body: str | None = None) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        {extra}
        """))
    (folder / "1" / "model.py").write_text(body or textwrap.dedent("""\
        class TritonPythonModel:
            def execute(self, requests):
                return []
        """))
    return folder


def test_resolve_models_adds_dependencies_first(tmp_path):
    _model(tmp_path, "a")
    _model(tmp_path, "b", 'parameters { key: "depends_on" value { string_value: "a" } }')
    ens = tmp_path / "ens"
    (ens / "1").mkdir(parents=True)
    (ens / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "ens"
        platform: "ensemble"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
        ensemble_scheduling { step [ { model_name: "b" model_version: -1
          input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
        """))
    assert dependencies(ens) == ["b"]
    assert resolve_models(["ens"], [tmp_path]) == ["a", "b", "ens"]
    assert resolve_models(["a", "b"], [tmp_path]) == ["a", "b"]


def test_resolve_models_unknown_names_the_chain(tmp_path):
    _model(tmp_path, "b", 'parameters { key: "depends_on" value { string_value: "missing" } }')
    with pytest.raises(KeyError, match="missing.*needed by b"):
        resolve_models(["b"], [tmp_path])
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        resolve_models(["nope"], [tmp_path])


def test_repository_models_resolve():
    assert resolve_models(["csm"]) == ["csm_talker", "csm_code2wav", "csm"]
    assert resolve_models(["piper"]) == ["piper"]


def test_check_ports_free_names_the_busy_port():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(ServerStartError, match=f"Triton gRPC port {busy}"):
            check_ports_free({"Triton HTTP": free_port(), "Triton gRPC": busy})


def test_assemble_backend_dir_links_stub_for_this_python(tmp_path):
    install = serve_install.find_tritonserver()
    stub = install.backend_dir / "python" / "triton_python_backend_stub"
    assert stub.exists() and (install.backend_dir / "python" / "libtriton_python.so").exists()
    wheel = serve_install._pytriton_root() / "tritonserver"
    out = serve_install.assemble_backend_dir(wheel, tmp_path)
    again = serve_install.assemble_backend_dir(wheel, tmp_path)  # idempotent
    assert out == again and len(list((out / "python").iterdir())) == 3


def test_server_env_uses_this_venv():
    env = serve_install.server_env(serve_install.find_tritonserver(), base={"PATH": "/usr/bin"})
    import sys
    import sysconfig

    assert env["VIRTUAL_ENV"] == sys.prefix
    assert env["LD_LIBRARY_PATH"].split(":")[0] == sysconfig.get_config_var("LIBDIR")
    assert env["OMP_NUM_THREADS"] == "1"


def test_prepare_is_idempotent(tmp_path, monkeypatch):
    from omni_triton.prepare import assets_for, prepare

    monkeypatch.setenv("OMNI_TRITON_CACHE", str(tmp_path))
    assert assets_for(["piper", "csm"]) == ["piper-voices", "csm-tiny"]
    lines: list[str] = []
    prepare(["piper"], log=lines.append)
    voice = tmp_path / "models" / "piper-voices" / "joe" / "en_US-joe-medium.onnx"
    assert voice.exists() and any("linked" in ln for ln in lines)
    lines.clear()
    prepare(["piper"], log=lines.append)
    assert not any("linked" in ln for ln in lines)  # nothing redone


def test_failing_model_is_named_with_its_error(tmp_path):
    _model(tmp_path, "good")
    _model(tmp_path, "broken", body=textwrap.dedent("""\
        class TritonPythonModel:
            def initialize(self, args):
                raise RuntimeError("weights folder /nowhere is missing")
            def execute(self, requests):
                return []
        """))
    server = TritonServer(["good", "broken"], http_port=free_port(), grpc_port=free_port(),
                          metrics_port=free_port(), log_path=tmp_path / "server.log",
                          repositories=[tmp_path])
    server.start()
    try:
        with pytest.raises(ServerStartError) as info:
            server.wait_ready(timeout=120)
    finally:
        server.stop()
    message = str(info.value)
    assert "broken" in message and "weights folder /nowhere is missing" in message
    assert server.proc.poll() is not None


def test_serve_restarts_a_crashed_tritonserver(tmp_path):
    """tritonserver 2.51 can die with SIGSEGV in its Python backend (docs/chat_contracts.md):
    ``omni-triton serve`` brings it back on the same ports, keeps the crashed server's log, and
    still leaves nothing behind on SIGINT."""
    import signal
    import subprocess
    import sys
    import time

    import httpx
    import psutil

    from omni_triton.serve.process import free_port

    http, grpc_port, metrics = free_port(), free_port(), free_port()
    for stale in Path(cache_dir(), "logs").glob(f"tritonserver-{http}.log.crash-*"):
        stale.unlink()  # left by an old run that got the same free port (this run's would be crash-<n+1>)
    started_at = time.time()
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_triton", "serve", "--models", "piper", "--no-frontend",
         "--triton-http-port", str(http), "--triton-grpc-port", str(grpc_port),
         "--triton-metrics-port", str(metrics)], stdout=log, stderr=subprocess.STDOUT)
    ready = f"http://127.0.0.1:{http}/v2/models/piper/ready"

    def wait_for(text: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while text not in (tmp_path / "serve.log").read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.5)

    try:
        wait_for("serving; Ctrl-C to stop")
        first = [p for p in psutil.Process(proc.pid).children() if p.name() == "tritonserver"][0]
        first.send_signal(signal.SIGSEGV)
        wait_for("Triton READY again")
        assert httpx.get(ready, timeout=5).status_code == 200
        second = [p for p in psutil.Process(proc.pid).children() if p.name() == "tritonserver"][0]
        assert second.pid != first.pid
        # the crashed server's own log, kept by this run (any old *.crash-1 in the shared folder
        # would not do): named after this server's HTTP port, written after this test started,
        # named in serve's output, and the log of the first server (its pid, its gRPC port)
        crash_log = Path(cache_dir(), "logs", f"tritonserver-{http}.log.crash-1")
        assert crash_log.is_file(), sorted(p.name for p in crash_log.parent.iterdir())
        assert crash_log.stat().st_mtime >= started_at
        assert str(crash_log) in (tmp_path / "serve.log").read_text()
        kept = crash_log.read_text(errors="replace")
        assert f"Started GRPCInferenceService at 127.0.0.1:{grpc_port}" in kept
        assert f" {first.pid} " in kept and f" {second.pid} " not in kept
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        log.close()
    assert not [p for p in psutil.process_iter(["cmdline"])
                if f"--http-port={http}" in " ".join(p.info["cmdline"] or [])]


def test_the_frontend_is_told_about_the_models_it_calls_itself():
    """``serve --models piper,qwen3_tts``: the frontend also gets qwen3_tts_voice_prompt (voice
    uploads call it), which Triton loads as a dependency; nothing else of qwen3_tts's stages."""
    from omni_triton.serve.repository import frontend_models

    assert frontend_models(["piper", "qwen3_tts"]) == ["piper", "qwen3_tts", "qwen3_tts_voice_prompt"]
    assert frontend_models(["piper"]) == ["piper"]
