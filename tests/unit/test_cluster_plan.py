"""``omni-triton cluster``'s plan (omni_triton/serve/cluster.py): ports, model sets, the frontends'
flags, and the report of a piece that died; no server started (tests/e2e/test_scaleout.py runs
the real set-up)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from omni_triton.cli import build_parser
from omni_triton.serve.cluster import Cluster, plan


def _plan(*argv: str):
    return plan(build_parser().parse_args(["cluster", *argv]))


def test_defaults_two_replicas_two_frontends_on_distinct_ports(tmp_path):
    p = _plan("--run-dir", str(tmp_path), "--database-url", "postgresql://u@h:1/db")
    assert [r.models for r in p.replicas] == [["piper"], ["piper"]]
    assert [(r.http_port, r.grpc_port, r.metrics_port) for r in p.replicas] == [(8000, 8001, 8002), (8003, 8004, 8005)]
    assert p.frontend_ports == [9000, 9001]
    assert p.triton_urls == "127.0.0.1:8001,127.0.0.1:8004"
    ports = p.ports()
    assert len(set(ports.values())) == len(ports) == 8  # 2 x 3 Triton + 2 frontends; no PostgreSQL started
    args = p.frontend_command_args(1)
    assert args[:4] == ["--on-demand", "none", "--media-url", f"file://{tmp_path / 'media'}"]
    assert not any("postgresql" in a for a in args)  # the password-bearing URL goes in the env, not argv
    assert str(tmp_path / "frontend-1" / "videos") in args  # each frontend its own scratch folders


def test_replica_models_and_local_postgres_port(tmp_path):
    p = _plan("--replicas", "3", "--replica-models", "piper;wan_t2v;piper,wan_t2v", "--frontends", "1",
              "--port", "9100", "--postgres-port", "55999", "--run-dir", str(tmp_path))
    assert [r.models for r in p.replicas] == [["piper"], ["wan_t2v"], ["piper", "wan_t2v"]]
    assert p.frontend_models == ["piper", "wan_t2v"]
    assert p.ports()["PostgreSQL"] == 55999 and p.frontend_ports == [9100]


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "2", "--replica-models", "piper"], "1 model sets for 2 replicas"),
    (["--replicas", "0"], "at least 1"),
    (["--replica-models", "piper;"], "at least one model"),
])
def test_bad_arguments(argv, message):
    with pytest.raises(ValueError, match=message):
        _plan(*argv)


def test_a_dead_piece_is_reported_once(tmp_path):
    cluster = Cluster(_plan("--run-dir", str(tmp_path), "--database-url", "postgresql://u@h:1/db"),
                      say=lambda line: None)
    cluster.frontends[1].proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    cluster.frontends[1].proc.wait()
    cluster.replicas[0].proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert cluster.dead() == [f"frontend 1 (port 9001, log {tmp_path / 'logs' / 'frontend-1.log'}) "
                                  "exited with code 3"]
        assert cluster.dead() == []
        describe = "\n".join(cluster.describe())
        assert "replica 1: Triton gRPC 127.0.0.1:8004" in describe
        assert "frontend 0: OpenAI API http://127.0.0.1:9000/v1" in describe
    finally:
        cluster.replicas[0].proc.kill()
        cluster.replicas[0].proc.wait()


def test_the_command_refuses_bad_arguments_with_status_2(capsys):
    from omni_triton.cli import main

    assert main(["cluster", "--replicas", "2", "--replica-models", "piper"]) == 2
    assert "1 model sets for 2 replicas" in capsys.readouterr().err
