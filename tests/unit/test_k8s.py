"""deploy/k8s/ as far as a machine without a cluster can check it: every manifest passes
kubernetes-validate --strict (scripts/lint_k8s.sh; skipped with the reason when the validator
cannot be installed, e.g. offline); the containers' arguments parse with the real argument
parsers (omni-triton serve, python -m openai_frontend) and name the ports the containers, probes
and Services use; the probe paths are the endpoints Triton and the frontend serve; selectors,
volumes, ConfigMaps and Secrets refer to objects that exist; the HPAs' metrics are served by the
adapter rules and exported by Triton, the stages or the frontend; the served models exist in the
repository; scale-out (issue 25): the frontend balances over the headless Service's replicas, its
replicas share one ReadWriteMany media claim and one PostgreSQL whose URL comes from a Secret, and
only frontend pods reach PostgreSQL;
docs/scaling.md quotes the measured perf_analyzer figures (docs/notes/perf-analyzer-2026-12.md,
moved from the README)."""
import os
import re
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import yaml

from omni_triton.cli import build_parser
from openai_frontend.__main__ import parse_args as _frontend_parse
from openai_frontend.__main__ import shared_database_url
from openai_frontend.metrics import FrontendMetrics

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCS = [yaml.safe_load_all(p.read_text()) for p in sorted(K8S.glob("*.yaml"))]
OBJECTS = [o for doc in DOCS for o in doc if o]
NAMESPACE = "omni-triton"
TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
ADMIN_SECRET = "omni-triton-admin-key"
DATABASE_SECRET = "omni-triton-database"
DATABASE_ENV = "OMNI_TRITON_DATABASE_URL"
REQUIRED_SECRETS = {ADMIN_SECRET, DATABASE_SECRET}
SCALING_DOC = (ROOT / "docs" / "scaling.md").read_text()


STAND_IN_URL = "postgresql://omni:pw@omni-postgres:5432/omni"


def frontend_args(argv: list[str]):
    """The frontend's parser on ``argv``."""
    return _frontend_parse(argv)


def frontend_database_url(argv: list[str], env_url: str = STAND_IN_URL) -> str | None:
    """The database URL the frontend started with ``argv`` uses when the pod's environment has
    OMNI_TRITON_DATABASE_URL = ``env_url`` (the Secret's value; a stand-in here): the frontend's
    own resolution (``shared_database_url``: the flag, else the env; SystemExit without a
    --media-url or with a negative lease)."""
    with mock.patch.dict(os.environ, {DATABASE_ENV: env_url}):
        return shared_database_url(_frontend_parse(argv))


def _find(kind: str, name: str) -> dict:
    found = [o for o in OBJECTS if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _container(deployment: str, kind: str = "Deployment") -> dict:
    (container,) = _find(kind, deployment)["spec"]["template"]["spec"]["containers"]
    return container


def _triton_service(url: str) -> tuple[dict, int]:
    """The Service and port a frontend ``--triton-url`` (``host:port[,...]`` or ``dns:///NAME:PORT``)
    names; a fully qualified NAME must be this namespace's (``NAME.omni-triton.svc[.cluster.local]``)."""
    target = url.removeprefix("dns:///")
    assert "," not in target, f"{url}: a fixed list of pod addresses does not follow the replicas"
    host, port = target.rsplit(":", 1)
    name = host.split(".")[0]
    assert host in (name, f"{name}.{NAMESPACE}.svc", f"{name}.{NAMESPACE}.svc.cluster.local"), host
    return _find("Service", name), int(port)


def _expand(container: dict) -> list[str]:
    """The container's args with $(VAR) replaced as the kubelet does (values from env/ConfigMaps;
    a downward-API field becomes ``<field.path>``)."""
    values = {}
    for env in container.get("env", []):
        if "value" in env:
            values[env["name"]] = env["value"]
        elif "fieldRef" in env.get("valueFrom", {}):
            values[env["name"]] = f"<{env['valueFrom']['fieldRef']['fieldPath']}>"
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


def test_frontend_args_parse_and_reach_every_triton_replica_through_the_headless_service():
    """Issue 25: the frontend balances over the replicas itself, so its --triton-url must resolve to
    every ready replica (dns:/// on the headless Service), not to the ClusterIP Service's one
    virtual IP (one HTTP/2 connection = one replica for the pod's life)."""
    container = _container("omni-frontend")
    assert container["command"] == ["python3", "-m", "openai_frontend"]
    args = frontend_args(_expand(container))
    assert args.triton_url.startswith("dns:///"), args.triton_url
    service, port = _triton_service(args.triton_url)
    assert service["metadata"]["name"] == "omni-triton-headless"
    assert service["spec"]["clusterIP"] == "None"  # one A record per pod
    assert not service["spec"].get("publishNotReadyAddresses", False)  # a loading replica is not resolved
    grpc = {p["name"]: p for p in service["spec"]["ports"]}["grpc"]
    assert port == grpc["port"] and grpc["targetPort"] == "grpc"
    assert service["spec"]["selector"] == _find("Deployment", "omni-triton")["spec"]["selector"]["matchLabels"]
    # on-demand loading is refused with more than one replica (each replica's --models decides)
    assert args.on_demand in ("", "none"), args.on_demand
    assert _ports(container) == {"http": args.port}
    front = _find("Service", "omni-frontend")["spec"]["ports"][0]
    assert front["targetPort"] == "http"
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "http"}
    routes = (ROOT / "openai_frontend" / "routers" / "observability.py").read_text()
    assert '@router.get("/health"' in routes and '@router.get("/metrics")' in routes
    # both stay open when an API key is set (probes send none)
    assert frontend_args([]).auth_exempt_paths.split(",") == ["/health", "/metrics"]


def _claim_of(pod: dict, container: dict, path: str) -> dict | None:
    """The PersistentVolumeClaim behind the innermost mount holding ``path`` (None: not on a PVC)."""
    mounts = [m for m in container.get("volumeMounts", [])
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{path} is on no volume (the container's own filesystem, lost at every restart)"
    volume = {v["name"]: v for v in pod["volumes"]}[max(mounts, key=lambda m: len(m["mountPath"]))["name"]]
    if "persistentVolumeClaim" not in volume:
        return None
    return _find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])


def test_frontend_replicas_share_one_readwritemany_media_claim_and_roll():
    """Every frontend pod of the Deployment mounts the SAME ReadWriteMany claim at the path of
    --media-url (an MP4 written by one pod is served by the other; a claim per pod or a
    ReadWriteOnce one would split the media or pin the pods to one node), no ReadWriteOnce claim
    at all, and the Deployment rolls (2+ replicas, RollingUpdate, a PDB that lets a node drain)."""
    deployment = _find("Deployment", "omni-frontend")
    pod = deployment["spec"]["template"]["spec"]
    container = _container("omni-frontend")
    args = frontend_args(_expand(container))
    media = args.media_url
    assert media and "://" not in media.removeprefix("file://"), media  # a shared path (s3:// needs no volume)
    claim = _claim_of(pod, container, media.removeprefix("file://"))
    assert claim is not None, f"--media-url {media} is not on a PersistentVolumeClaim"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], claim["spec"]["accessModes"]
    # one Deployment = one pod template = the same claim in every replica; any other claim too is RWX
    for volume in pod["volumes"]:
        if "persistentVolumeClaim" in volume:
            other = _find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            assert other["spec"]["accessModes"] == ["ReadWriteMany"], volume
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (pdb,) = [o for o in OBJECTS if o["kind"] == "PodDisruptionBudget"
              and o["spec"]["selector"]["matchLabels"].items() <= _labels("omni-frontend").items()]
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]  # a drain can proceed
    # the video/voice stores are the database's (the SQLite folders' lock would stop a 2nd pod)
    assert frontend_database_url(_expand(container)) == STAND_IN_URL
    assert not any(a.endswith("-storage-dir") for a in container["args"]), container["args"]
    # each pod names itself in the leases it takes (the pod name: unique)
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"] == {"fieldPath": "metadata.name"}
    assert args.frontend_id == "<metadata.name>"
    assert args.video_lease_s > 0


def test_database_url_comes_from_a_secret_shared_with_postgres():
    """The frontend's PostgreSQL URL (it holds the password) is read from the Secret into
    OMNI_TRITON_DATABASE_URL, the --database-url default, never from an argument or a plain
    value; the PostgreSQL pod reads its password from the same Secret, and the URL the operator is
    told to store names the PostgreSQL Service's port and the user and database it creates."""
    container = _container("omni-frontend")
    assert not any(a.startswith("--database-url") for a in container["args"])  # argv shows in ps
    env = {e["name"]: e for e in container["env"]}
    assert "value" not in env[DATABASE_ENV]
    ref = env[DATABASE_ENV]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": DATABASE_SECRET, "key": DATABASE_ENV}  # required: no optional
    url = "postgresql://omni:s3cret@omni-postgres:5432/omni"
    assert frontend_database_url(_expand(container), url) == url
    pg = _container("omni-postgres", "StatefulSet")
    pg_env = {e["name"]: e for e in pg["env"]}
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": DATABASE_SECRET,
                                                                         "key": "POSTGRES_PASSWORD"}
    manifest = (K8S / "25-postgres.yaml").read_text()
    documented = re.search(rf'{DATABASE_ENV}="(postgresql://[^"]+)"', manifest).group(1)
    m = re.fullmatch(r"postgresql://(\w+):\$PW@([\w-]+):(\d+)/(\w+)", documented)
    assert m, documented
    user, host, port, db = m.groups()
    assert (user, db) == (pg_env["POSTGRES_USER"]["value"], pg_env["POSTGRES_DB"]["value"])
    service = _find("Service", host)
    (sport,) = service["spec"]["ports"]
    assert int(port) == sport["port"] and _ports(pg)[sport["targetPort"]] == 5432
    sts = _find("StatefulSet", "omni-postgres")
    assert service["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert sts["spec"]["serviceName"] == host
    for key in ("POSTGRES_PASSWORD", DATABASE_ENV):  # one create command gives both keys
        assert f"--from-literal={key}=" in manifest and f"--from-literal={key}=" in SCALING_DOC, key
    # the data survive the pod: a claim of its own, PGDATA below the mount's root (lost+found)
    (template,) = sts["spec"]["volumeClaimTemplates"]
    mount = {m["name"]: m["mountPath"] for m in pg["volumeMounts"]}[template["metadata"]["name"]]
    assert pg_env["PGDATA"]["value"].startswith(mount.rstrip("/") + "/")


def _ingress_peers(policy: dict, ports: dict[str, int]) -> dict[int, list[tuple[dict, bool]]]:
    """{container port: [(podSelector labels, has namespaceSelector)]} admitted by an Ingress
    policy; every rule must name both peers and ports (a rule without either admits everyone)."""
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted: dict[int, list[tuple[dict, bool]]] = {}
    for rule in policy["spec"]["ingress"]:
        assert rule.get("from") and rule.get("ports"), rule
        for peer in rule["from"]:
            assert "ipBlock" not in peer, peer
            selector = peer["podSelector"]["matchLabels"]
            for port in rule["ports"]:
                assert port["protocol"] == "TCP" and port["port"] in ports, port
                admitted.setdefault(ports[port["port"]], []).append((selector, "namespaceSelector" in peer))
    return admitted


def _policy_for(labels: dict) -> dict:
    (policy,) = [p for p in OBJECTS if p["kind"] == "NetworkPolicy"
                 and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
    return policy


def test_only_frontend_pods_reach_postgres():
    """PostgreSQL holds every job, voice and consent: only the frontend pods of this namespace may
    open its port, and the frontend pods are not PostgreSQL's (a selector matching both would
    admit any pod the frontend policy admits)."""
    pg_labels = _find("StatefulSet", "omni-postgres")["spec"]["template"]["metadata"]["labels"]
    policy = _policy_for(pg_labels)
    assert not policy["spec"]["podSelector"]["matchLabels"].items() <= _labels("omni-frontend").items()
    admitted = _ingress_peers(policy, _ports(_container("omni-postgres", "StatefulSet")))
    assert set(admitted) == {5432}, admitted
    for selector, anywhere in admitted[5432]:
        assert selector and selector.items() <= _labels("omni-frontend").items(), selector
        assert not anywhere, "a namespaceSelector admits pods of other namespaces"
        assert not selector.items() <= _labels("omni-triton").items()  # Triton pods are not admitted


def test_frontend_pods_accept_only_their_api_port():
    container = _container("omni-frontend")
    policy = _policy_for(_labels("omni-frontend"))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule.get("ports", [])] == ["http"], rule  # no ports = every port
    assert _ports(container)["http"] == frontend_args(_expand(container)).port == 9000


def _labels(deployment: str) -> dict:
    return _find("Deployment", deployment)["spec"]["template"]["metadata"]["labels"]


def test_only_frontend_pods_reach_triton_and_only_prometheus_its_metrics():
    """Issue 23: any pod could reach Triton's ports (model load/unload for anyone in the cluster)."""
    policy = _policy_for(_labels("omni-triton"))
    assert not policy["spec"]["podSelector"]["matchLabels"].items() <= _labels("omni-frontend").items()
    ports = _ports(_container("omni-triton"))
    admitted = _ingress_peers(policy, ports)
    assert set(admitted) == {TRITON_PORTS["grpc"], TRITON_PORTS["metrics"]}
    (frontend, anywhere), = admitted[TRITON_PORTS["grpc"]]
    assert frontend.items() <= _labels("omni-frontend").items() and not anywhere  # this namespace only
    (prometheus, _), = admitted[TRITON_PORTS["metrics"]]
    assert prometheus == {"app.kubernetes.io/name": "prometheus"}
    # the frontend reaches Triton on the port the policy admits
    service, port = _triton_service(frontend_args(_expand(_container("omni-frontend"))).triton_url)
    service_ports = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert ports[service_ports[port]] == TRITON_PORTS["grpc"]


def test_triton_and_the_frontend_share_the_admin_key_secret():
    refs = {}
    for deployment in ("omni-triton", "omni-frontend"):
        env = {e["name"]: e for e in _container(deployment)["env"]}
        refs[deployment] = env["OMNI_TRITON_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
    assert refs["omni-triton"] == refs["omni-frontend"] == {"name": ADMIN_SECRET, "key": "OMNI_TRITON_ADMIN_KEY"}
    assert f"kubectl create secret generic {ADMIN_SECRET} " in (K8S / "20-triton.yaml").read_text()


def test_selectors_claims_and_config_refer_to_existing_objects():
    for o in OBJECTS:
        if o["kind"] in ("Deployment", "Job", "StatefulSet"):
            pod = o["spec"]["template"]
            if o["kind"] in ("Deployment", "StatefulSet"):
                labels = pod["metadata"]["labels"]
                assert o["spec"]["selector"]["matchLabels"].items() <= labels.items(), o["metadata"]["name"]
            for volume in pod["spec"].get("volumes", []):
                if "persistentVolumeClaim" in volume:
                    _find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            for c in pod["spec"]["containers"]:
                if o["kind"] != "StatefulSet":  # PostgreSQL runs its official image
                    assert c["image"] in ("omni-triton:gpu", "omni-triton:cpu")  # docker/compose.yaml's tags
                mounted = {v["name"] for v in pod["spec"].get("volumes", [])}
                mounted |= {t["metadata"]["name"] for t in o["spec"].get("volumeClaimTemplates", [])}
                assert {m["name"] for m in c.get("volumeMounts", [])} <= mounted
                for env in c.get("env", []):
                    ref = env.get("valueFrom", {})
                    if "configMapKeyRef" in ref:
                        assert ref["configMapKeyRef"]["key"] in _find("ConfigMap",
                                                                      ref["configMapKeyRef"]["name"])["data"]
                    if "secretKeyRef" in ref:  # created by the operator (docs/scaling.md)
                        name = ref["secretKeyRef"]["name"]
                        assert f"kubectl create secret generic {name} " in SCALING_DOC, name
                        # only the Triton admin key (the frontend cannot read model configs without
                        # it) and the database's are required (a pod that does not start says why)
                        assert ref["secretKeyRef"].get("optional", False) is (name not in REQUIRED_SECRETS), name
        if o["kind"] in ("Service", "PodDisruptionBudget"):
            selector = o["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            assert any(selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
                       for d in OBJECTS if d["kind"] in ("Deployment", "StatefulSet")), o["metadata"]["name"]
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
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
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


def _exported_frontend_metrics() -> set[str]:
    """The series names the frontend's registry exports, as Prometheus scrapes them (a counter's
    ``_total``, a histogram's ``_bucket``/``_sum``/``_count``; labelled families have no samples
    before their first use, so the names come from the family type)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {family.name + suffix for family in FrontendMetrics().registry.collect()
            for suffix in suffixes.get(family.type, ("",))}


def test_hpas_scale_on_the_frontends_own_metrics():
    """The frontend HPA scales its Deployment on a per-pod metric, and Triton's HPA on the
    frontends' p90 time to first audio; each metric is served by an adapter rule whose series the
    frontend really exports (a renamed metric would leave the HPA without data: no scaling, only
    an event), and docs/metrics.md documents it."""
    adapter = yaml.safe_load(_find("ConfigMap", "omni-prometheus-adapter-rules")["data"]["config.yaml"])
    exported = _exported_frontend_metrics()
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    hpa = _find("HorizontalPodAutoscaler", "omni-frontend")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "omni-frontend"
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    pods_rules = {r["name"]["as"]: r for r in adapter["rules"]}
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    series = re.match(r"(\w+)\{", pods_rules[name]["seriesQuery"]).group(1)
    assert series in exported, f"{series} is not exported by openai_frontend/metrics.py"
    assert {"namespace", "pod"} <= set(pods_rules[name]["resources"]["overrides"])
    assert series in metrics_doc, series
    # the in-flight target stays below the admission limit it is a share of
    limit = frontend_args(_expand(_container("omni-frontend"))).max_inflight
    assert 0 < float(metric["pods"]["target"]["averageValue"]) < limit
    external = {r["name"]["as"]: r for r in adapter["externalRules"]}
    (ttfp,) = [m for m in _find("HorizontalPodAutoscaler", "omni-triton")["spec"]["metrics"]
               if m["type"] == "External"]
    rule = external[ttfp["external"]["metric"]["name"]]
    series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
    assert series in exported and series.endswith("_bucket"), series
    assert "histogram_quantile(0.9," in rule["metricsQuery"] and "by (le)" in rule["metricsQuery"]
    assert series.removesuffix("_bucket") in metrics_doc


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
