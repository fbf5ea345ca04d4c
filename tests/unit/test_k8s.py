"""deploy/k8s/ as far as a machine without a cluster can check it: every manifest passes
kubernetes-validate --strict (scripts/lint_k8s.sh; skipped with the reason when the validator
cannot be installed, e.g. offline); the containers' arguments parse with the real argument
parsers (omni-triton serve, python -m openai_frontend) and name the ports the containers, probes
and Services use; the probe paths are the endpoints Triton and the frontend serve; selectors,
volumes, ConfigMaps and Secrets refer to objects that exist; the HPA's metrics are served by the
adapter rules and exported by Triton or the stages; the served models exist in the repository;
docs/scaling.md quotes the measured perf_analyzer figures (docs/notes/perf-analyzer-2026-12.md,
moved from the README)."""
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from omni_triton.cli import build_parser
from openai_frontend.__main__ import parse_args as frontend_args

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCS = [yaml.safe_load_all(p.read_text()) for p in sorted(K8S.glob("*.yaml"))]
OBJECTS = [o for doc in DOCS for o in doc if o]
NAMESPACE = "omni-triton"
TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
ADMIN_SECRET = "omni-triton-admin-key"
SCALING_DOC = (ROOT / "docs" / "scaling.md").read_text()


def _find(kind: str, name: str) -> dict:
    found = [o for o in OBJECTS if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _container(deployment: str) -> dict:
    (container,) = _find("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return container


def _expand(container: dict) -> list[str]:
    """The container's args with $(VAR) replaced as the kubelet does (values from env/ConfigMaps)."""
    values = {}
    for env in container.get("env", []):
        if "value" in env:
            values[env["name"]] = env["value"]
        elif "configMapKeyRef" in env.get("valueFrom", {}):
            ref = env["valueFrom"]["configMapKeyRef"]
            values[env["name"]] = _find("ConfigMap", ref["name"])["data"][ref["key"]]
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in container["args"]]


def _ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_every_object_is_namespaced_and_names_are_unique():
    assert OBJECTS and len({(o["kind"], o["metadata"]["name"]) for o in OBJECTS}) == len(OBJECTS)
    for o in OBJECTS:
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == NAMESPACE, o["metadata"]["name"]
    _find("Namespace", NAMESPACE)


def test_triton_args_parse_and_match_the_ports_and_probes():
    container = _container("omni-triton")
    # the image's ENTRYPOINT (docker/entrypoint.sh) execs `omni-triton serve --host .. "$@"`
    entry = (ROOT / "docker" / "entrypoint.sh").read_text()
    assert 'exec omni-triton serve --host 0.0.0.0 --triton-metrics-host 0.0.0.0 "$@"' in entry
    assert "command" not in container
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0", "--triton-metrics-host", "0.0.0.0",
                                      *_expand(container)])
    assert args.no_frontend and args.max_restarts == 0  # Kubernetes restarts the pod, not serve
    assert args.triton_host == "0.0.0.0"  # the frontend is in other pods; the NetworkPolicy guards it
    assert (args.triton_http_port, args.triton_grpc_port, args.triton_metrics_port) == (8000, 8001, 8002)
    assert _ports(container) == TRITON_PORTS
    for probe, path in [("startupProbe", "/v2/health/live"), ("livenessProbe", "/v2/health/live"),
                        ("readinessProbe", "/v2/health/ready")]:
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    # the launcher waits on the same readiness endpoint; /v2/health/live is its KServe v2 twin
    assert "/v2/health/ready" in (ROOT / "omni_triton" / "serve" / "server.py").read_text()
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    annotations = _find("Deployment", "omni-triton")["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == TRITON_PORTS["metrics"]


def test_frontend_args_parse_and_reach_triton_through_its_service():
    container = _container("omni-frontend")
    assert container["command"] == ["python3", "-m", "openai_frontend"]
    args = frontend_args(_expand(container))
    host, port = args.triton_url.split(":")
    service = _find("Service", host)
    grpc = {p["name"]: p for p in service["spec"]["ports"]}["grpc"]
    assert int(port) == grpc["port"] and grpc["targetPort"] == "grpc"
    assert service["spec"]["selector"] == _find("Deployment", "omni-triton")["spec"]["selector"]["matchLabels"]
    assert _ports(container) == {"http": args.port}
    front = _find("Service", "omni-frontend")["spec"]["ports"][0]
    assert front["targetPort"] == "http"
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "http"}
    routes = (ROOT / "openai_frontend" / "routers" / "observability.py").read_text()
    assert '@router.get("/health"' in routes and '@router.get("/metrics")' in routes
    # both stay open when an API key is set (probes send none)
    assert frontend_args([]).auth_exempt_paths.split(",") == ["/health", "/metrics"]
    # the video store (SQLite + MP4s) is on the RWO claim; one replica, Recreate
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[args.video_storage_dir] == "videos"
    deployment = _find("Deployment", "omni-frontend")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    claim = _find("PersistentVolumeClaim", volumes["videos"]["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_every_frontend_store_folder_is_on_a_persistent_volume():
    """Every ``--*-storage-dir`` of the frontend (video jobs, voices, any store added later) is
    given, and lies on a mount backed by a PersistentVolumeClaim: a store left at its default
    (under the cache, an emptyDir) or on an emptyDir is lost at every restart."""
    container = _container("omni-frontend")
    args = vars(frontend_args(_expand(container)))
    stores = {k: v for k, v in args.items() if k.endswith("_storage_dir")}
    assert {"video_storage_dir", "voice_storage_dir"} <= stores.keys()
    pod = _find("Deployment", "omni-frontend")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for option, folder in stores.items():
        assert folder, f"--{option.replace('_', '-')} is not set: the store would live in the cache (emptyDir)"
        mounts = [m for m in container["volumeMounts"]
                  if folder == m["mountPath"] or folder.startswith(m["mountPath"].rstrip("/") + "/")]
        assert mounts, f"{folder} ({option}) is on no volume"
        volume = volumes[max(mounts, key=lambda m: len(m["mountPath"]))["name"]]  # the innermost mount
        assert "persistentVolumeClaim" in volume, f"{folder} ({option}) is on {volume}, not a PVC"
        _find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])


def _labels(deployment: str) -> dict:
    return _find("Deployment", deployment)["spec"]["template"]["metadata"]["labels"]


def test_only_frontend_pods_reach_triton_and_only_prometheus_its_metrics():
    """Issue 23: any pod could reach Triton's ports (model load/unload for anyone in the cluster)."""
    policies = [o for o in OBJECTS if o["kind"] == "NetworkPolicy"]
    (policy,) = [p for p in policies
                 if p["spec"]["podSelector"]["matchLabels"].items() <= _labels("omni-triton").items()]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert not spec["podSelector"]["matchLabels"].items() <= _labels("omni-frontend").items()
    ports = _ports(_container("omni-triton"))
    admitted = {}
    for rule in spec["ingress"]:
        assert rule.get("from") and rule.get("ports"), rule  # a rule without either admits everyone
        for peer in rule["from"]:
            assert "ipBlock" not in peer, peer
            selector = peer["podSelector"]["matchLabels"]
            for port in rule["ports"]:
                assert port["protocol"] == "TCP" and port["port"] in ports, port
                admitted.setdefault(ports[port["port"]], []).append((selector, "namespaceSelector" in peer))
    assert set(admitted) == {TRITON_PORTS["grpc"], TRITON_PORTS["metrics"]}
    (frontend, anywhere), = admitted[TRITON_PORTS["grpc"]]
    assert frontend.items() <= _labels("omni-frontend").items() and not anywhere  # this namespace only
    (prometheus, _), = admitted[TRITON_PORTS["metrics"]]
    assert prometheus == {"app.kubernetes.io/name": "prometheus"}
    # the frontend reaches Triton on the port the policy admits
    host, port = frontend_args(_expand(_container("omni-frontend"))).triton_url.split(":")
    service_ports = {p["port"]: p["targetPort"] for p in _find("Service", host)["spec"]["ports"]}
    assert ports[service_ports[int(port)]] == TRITON_PORTS["grpc"]


def test_triton_and_the_frontend_share_the_admin_key_secret():
    refs = {}
    for deployment in ("omni-triton", "omni-frontend"):
        env = {e["name"]: e for e in _container(deployment)["env"]}
        refs[deployment] = env["OMNI_TRITON_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
    assert refs["omni-triton"] == refs["omni-frontend"] == {"name": ADMIN_SECRET, "key": "OMNI_TRITON_ADMIN_KEY"}
    assert f"kubectl create secret generic {ADMIN_SECRET} " in (K8S / "20-triton.yaml").read_text()


def test_selectors_claims_and_config_refer_to_existing_objects():
    for o in OBJECTS:
        if o["kind"] in ("Deployment", "Job"):
            pod = o["spec"]["template"]
            if o["kind"] == "Deployment":
                labels = pod["metadata"]["labels"]
                assert o["spec"]["selector"]["matchLabels"].items() <= labels.items(), o["metadata"]["name"]
            for volume in pod["spec"]["volumes"]:
                if "persistentVolumeClaim" in volume:
                    _find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            for c in pod["spec"]["containers"]:
                assert c["image"] in ("omni-triton:gpu", "omni-triton:cpu")  # docker/compose.yaml's tags
                mounted = {v["name"] for v in pod["spec"]["volumes"]}
                assert {m["name"] for m in c.get("volumeMounts", [])} <= mounted
                for env in c.get("env", []):
                    ref = env.get("valueFrom", {})
                    if "configMapKeyRef" in ref:
                        assert ref["configMapKeyRef"]["key"] in _find("ConfigMap",
                                                                      ref["configMapKeyRef"]["name"])["data"]
                    if "secretKeyRef" in ref:  # created by the operator (docs/scaling.md)
                        name = ref["secretKeyRef"]["name"]
                        assert f"kubectl create secret generic {name} " in SCALING_DOC, name
                        # only the Triton admin key is required: without it the frontend cannot
                        # read model configs (a pod that does not start says why)
                        assert ref["secretKeyRef"].get("optional", False) is (name != ADMIN_SECRET), name
        if o["kind"] in ("Service", "PodDisruptionBudget"):
            selector = o["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            assert any(selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
                       for d in OBJECTS if d["kind"] == "Deployment"), o["metadata"]["name"]
    compose = (ROOT / "docker" / "compose.yaml").read_text()
    assert "image: omni-triton:gpu" in compose and "image: omni-triton:cpu" in compose


def test_served_models_exist_in_the_repository():
    models = _find("ConfigMap", "omni-config")["data"]["OMNI_MODELS"].split(",")
    for model in models:
        assert (ROOT / "model_repository" / model).is_dir() or (ROOT / "ensembles" / model).is_dir(), model


def test_model_cache_job_downloads_only():
    job = _find("Job", "omni-models-download")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["download"]
    entry = (ROOT / "docker" / "entrypoint.sh").read_text()
    assert 'if [ "${1:-}" = download ]; then exit 0; fi' in entry
    assert entry.index("= download ]") < entry.index("exec omni-triton serve")
    triton = _container("omni-triton")
    mount = {m["name"]: m["mountPath"] for m in triton["volumeMounts"]}["models"]
    assert mount == {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["models"] == "/cache/models"
    assert _find("PersistentVolumeClaim", "omni-models")["spec"]["accessModes"] == ["ReadWriteMany"]


def test_hpa_scales_triton_on_queue_metrics_the_adapter_serves_and_the_code_exports():
    hpa = _find("HorizontalPodAutoscaler", "omni-triton")
    target = hpa["spec"]["scaleTargetRef"]
    _find(target["kind"], target["name"])
    assert target["name"] == "omni-triton" and hpa["spec"]["minReplicas"] >= 1
    rules = yaml.safe_load(_find("ConfigMap", "omni-prometheus-adapter-rules")["data"]["config.yaml"])["rules"]
    served = {r["name"]["as"]: r for r in rules}
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert names == ["nv_inference_pending_request_count", "omni_stage_requests_waiting"]
    source = "".join(p.read_text() for p in (ROOT / "omni_triton").glob("**/*.py"))
    for name in names:
        rule = served[name]
        assert rule["seriesQuery"].startswith(name + "{") and {"namespace",
                                                               "pod"} <= set(rule["resources"]["overrides"])
        assert name.startswith("nv_") or f'"{name}"' in source, name  # nv_*: Triton's own
        assert name in (ROOT / "docs" / "metrics.md").read_text(), name
    # the scrape config gives the series the namespace and pod labels the rules map
    scrape = yaml.safe_load(_find("ConfigMap", "omni-prometheus-config")["data"]["prometheus.yml"])
    targets = {r.get("target_label") for r in scrape["scrape_configs"][0]["relabel_configs"]}
    assert {"namespace", "pod", "__address__", "__metrics_path__"} <= targets


PERF_FIGURES = ROOT / "docs" / "notes" / "perf-analyzer-2026-12.md"


def _measured_rps() -> dict[str, str]:
    rows = re.findall(r"^\| (\w+) \| [^|]+ \| ([\d.]+) \|", PERF_FIGURES.read_text(), re.M)
    return dict(rows)


def test_scaling_plan_is_linked_and_quotes_the_measured_figures():
    assert "docs/scaling.md" in (ROOT / "README.md").read_text()
    plan = (ROOT / "docs" / "scaling.md").read_text()
    measured = _measured_rps()
    quoted = re.findall(r"^\| `(\w+)` \| ([\d.]+) \|", plan, re.M)
    assert {m for m, _ in quoted} >= {"piper_tts", "llm", "llm_tts", "qwen_image"}
    for model, rps in quoted:
        assert measured[model] == rps, (model, rps, measured.get(model))


def test_manifests_pass_kubernetes_validate():
    lint = ROOT / "scripts" / "lint_k8s.sh"
    install = subprocess.run(["bash", str(lint), "--install"], capture_output=True, text=True, timeout=600)
    if install.returncode != 0:
        pytest.skip("kubernetes-validate could not be installed from PyPI (offline?): "
                    + (install.stderr.strip().splitlines() or ["no output"])[-1])
    out = subprocess.run(["bash", str(lint)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
