"""docker/ as far as a machine without a Docker engine can check it: the compose file, Prometheus
config and Grafana files parse; every path they and the Dockerfiles name exists; the ports
Prometheus scrapes are the ones the images expose and compose publishes; every metric the
dashboard queries is one Triton or this project exports (the omni_* names found in the source);
the Dockerfiles pass hadolint and the compose file `docker-compose config` (scripts/lint_docker.sh)."""
import json
import re
import shlex
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text())
PROMETHEUS = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
DASHBOARD = json.loads((DOCKER / "grafana" / "dashboards" / "omni-triton.json").read_text())
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))
#: Triton 2.51's own metric families (docs: user_guide/metrics.md) that the dashboard may use.
TRITON_METRICS = {"nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                  "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                  "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                  "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
                  "nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes",
                  "nv_gpu_power_usage", "nv_cpu_utilization", "nv_cpu_memory_used_bytes"}


def _source_metric_names() -> set[str]:
    names = set()
    for path in [*ROOT.glob("omni_triton/**/*.py"), *ROOT.glob("openai_frontend/**/*.py")]:
        names |= set(re.findall(r'"(omni_[a-z0-9_]+)"', path.read_text()))
    return names


def _exprs():
    return [t["expr"] for p in DASHBOARD["panels"] for t in p["targets"]]


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [tuple(line.split(None, 1)) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#") and len(line.split(None, 1)) == 2]


def test_compose_services_build_existing_dockerfiles_and_mount_existing_files():
    services = COMPOSE["services"]
    assert {"omni-gpu", "omni-cpu", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        if "build" in service:
            context = (DOCKER / service["build"]["context"]).resolve()
            assert context == ROOT and (context / service["build"]["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), (name, source)
            else:
                assert source in COMPOSE["volumes"], (name, source)
    assert services["omni-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_prometheus_scrapes_the_ports_the_images_expose_on_the_internal_network():
    targets = {t for job in PROMETHEUS["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert targets == {"omni:8002", "omni:9000"}
    networks = COMPOSE["networks"]
    assert networks["triton"] == {"internal": True}
    assert "triton" in COMPOSE["services"]["prometheus"]["networks"]
    for service in ("omni-gpu", "omni-cpu"):
        assert COMPOSE["services"][service]["networks"]["triton"]["aliases"] == ["omni"]
        # "omni" (Triton's metrics port) resolves on the internal network only
        assert not (COMPOSE["services"][service]["networks"]["default"] or {}).get("aliases")
    for path in DOCKERFILES:
        exposed = {w for k, v in _dockerfile_instructions(path) if k == "EXPOSE" for w in v.split()}
        assert {t.split(":")[1] for t in targets} <= exposed, path.name
    datasource = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    prometheus_port = COMPOSE["services"]["prometheus"]["ports"][0].split(":")[-1]
    assert datasource["datasources"][0]["url"].endswith(":" + prometheus_port)


def _published(service: dict) -> list[tuple[str, str]]:
    """(host address or '' for every interface, host port) of each published port."""
    out = []
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        out.append((parts[0] if len(parts) == 3 else "", parts[-2] if len(parts) > 1 else parts[0]))
    return out


def test_only_the_frontend_port_is_published_and_triton_stays_private():
    """Issue 23: compose published Triton's HTTP and gRPC ports (load/unload for anyone). Now only
    the frontend's 9000 is; Prometheus and Grafana (admin/admin) listen on the host's loopback;
    Triton's HTTP/gRPC listen on the container's loopback (no --triton-host 0.0.0.0 in the images'
    entrypoints) and only its read-only metrics port opens to the container's networks."""
    services = COMPOSE["services"]
    for name in ("omni-gpu", "omni-cpu"):
        assert _published(services[name]) == [("", "9000")], name
        env = services[name]["environment"]
        assert "OMNI_TRITON_ADMIN_KEY" in env and "OMNI_TRITON_API_KEY" in env, name
    for name, service in services.items():
        for host, port in _published(service):
            assert port not in {"8000", "8001", "8002"}, (name, port)
            assert name.startswith("omni-") or host == "127.0.0.1", (name, host, port)
    entrypoints = [(DOCKER / "entrypoint.sh").read_text(), (DOCKER / "Dockerfile.cpu").read_text()]
    for text in entrypoints:
        serve = [ln for ln in text.splitlines() if "serve" in ln and "--host" in ln]
        assert serve and all("--triton-host" not in ln for ln in serve), serve
        assert all("--triton-metrics-host" in ln for ln in serve), serve


def test_dashboard_queries_only_exported_metrics():
    known = _source_metric_names()
    exprs = _exprs()
    assert exprs and len({p["id"] for p in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])
    used = {m for e in exprs for m in re.findall(r"\b((?:nv|omni)_[a-z0-9_]+)\b", e)}
    for metric in used:
        base = re.sub(r"_(bucket|sum|count)$", "", metric) if metric.startswith("omni_frontend") else metric
        candidates = {base, re.sub(r"_total$", "", base)}
        assert metric in TRITON_METRICS or candidates & known, metric
    assert any(m.startswith("nv_") for m in used) and any(m.startswith("omni_") for m in used)


def test_dockerfiles_name_existing_paths_and_commands():
    for path in DOCKERFILES:
        instructions = _dockerfile_instructions(path)
        assert instructions[0][0] == "FROM", path.name
        for key, value in instructions:
            if key == "COPY":
                *sources, _dest = shlex.split(value)
                for source in sources:
                    assert (ROOT / source).exists(), (path.name, source)
            if key in ("ENTRYPOINT", "CMD") and value.startswith("["):
                argv = json.loads(value)
                if argv[0].startswith(("docker/", ".venv/")):
                    assert (ROOT / argv[0].split("/")[0]).exists(), (path.name, argv[0])
                    if argv[0].startswith("docker/"):
                        assert (ROOT / argv[0]).stat().st_mode & 0o111, argv[0]
    gpu = (DOCKER / "Dockerfile.gpu").read_text()
    assert gpu.startswith("#") and "FROM nvcr.io/nvidia/tritonserver:24.10-py3" in gpu
    assert "omni_triton.deploy gpu-repository" in gpu
    entry = (DOCKER / "entrypoint.sh").read_text()
    assert "omni_triton.deploy checkpoints" in entry
    out = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "omni_triton.deploy", "checkpoints"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert all(len(line.split()) == 2 and "/" in line.split()[1] for line in out.splitlines()) and out


def test_hadolint_passes():
    out = subprocess.run(["bash", str(ROOT / "scripts" / "lint_docker.sh")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
