"""deploy/kubernetes: every overlay rendered by `kubectl kustomize`, validated against the
Kubernetes schemas (kubernetes-validate --strict) and checkov, held to the Pod Security
"restricted" profile, its settings checked against each other (probes, drain, memory, the
config checksum, secrets, affinity), and the rendered gateway container run as the kubelet
would run it, outside a container, until its probes answer 200."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.preflight import startup_problems
from gateway.settings import load_settings
from tests.support.deploy_tools import kubectl, tool
from tests.support.procs import ROOT

KUSTOMIZE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("fleet", "sidecar", "redis")
# checkov findings that stay, each for a reason (everything else must pass).
CHECKOV_ACCEPTED = {
    # The image is built by whoever deploys it; kustomize `images: [{digest: ...}]` pins it
    # at release. A digest in the repo would name an image nobody has.
    "CKV_K8S_43": "image by digest",
    # The gateway reads its secrets from the environment (pydantic-settings), not from files.
    "CKV_K8S_35": "secrets as files",
    # A versioned tag with IfNotPresent works with side-loaded images (kind, k3d) too.
    "CKV_K8S_15": "imagePullPolicy Always",
}
MIB = 1024 * 1024


def render(path: Path) -> list[dict[str, Any]]:
    done = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    return {name: render(KUSTOMIZE / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="module")
def rendered_files(rendered, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("rendered")
    files = {}
    for name, docs in rendered.items():
        files[name] = out / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump_all(docs))
    return files


def one(docs: list[dict[str, Any]], kind: str, name_part: str = "mcp-gateway") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_part)]
    assert len(found) == 1, (kind, name_part, [d["metadata"]["name"] for d in found])
    return found[0]


def gateway_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", "mcp-gateway")


def container(deployment: dict[str, Any], name: str = "gateway") -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def config_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = gateway_deployment(docs)
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"])
    return yaml.safe_load(configmap["data"]["gateway.yaml"])


# -- validators -------------------------------------------------------------------------------


def test_every_overlay_validates_strictly_against_the_kubernetes_schemas(rendered_files):
    done = subprocess.run([str(tool("kubernetes-validate")), "--strict", "--quiet", *map(str, rendered_files.values())],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # The only resource without a built-in schema is the Prometheus Operator's CRD.
    unknown = {m for m in re.findall(r"Couldn't find schema for kind (\w+)", done.stdout + done.stderr)}
    assert unknown <= {"ServiceMonitor"}, done.stdout


def test_the_service_monitor_scrapes_the_ops_port_of_the_ops_service(rendered):
    for docs in rendered.values():
        monitor = one(docs, "ServiceMonitor")
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        ops_service = one(docs, "Service", "mcp-gateway-ops")
        labels = ops_service["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["ops"]
        assert [p["name"] for p in ops_service["spec"]["ports"]] == ["ops"]


def test_checkov_finds_nothing_but_the_accepted_findings(rendered_files):
    files = [a for f in rendered_files.values() for a in ("-f", str(f))]
    done = subprocess.run([str(tool("checkov")), *files, "--framework", "kubernetes", "--quiet", "--compact",
                           "--skip-download", "-o", "json", "--skip-check", ",".join(CHECKOV_ACCEPTED)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [(f["check_id"], f["check_name"], f["resource"]) for r in reports for f in r["results"]["failed_checks"]]
    assert failed == [], failed
    assert sum(r["summary"]["passed"] for r in reports) > 100  # it did check


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


def test_every_pod_meets_pod_security_restricted(rendered):
    # https://kubernetes.io/docs/concepts/security/pod-security-standards/ "Restricted",
    # rule by rule, on every pod of every overlay (the gateway's, the sidecar's server, Redis).
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
    for docs in rendered.values():
        for name, spec in pod_specs(docs):
            pod_sc = spec.get("securityContext", {})
            assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
            for volume in spec.get("volumes", []):
                assert set(volume) - {"name"} <= allowed_volumes, (name, volume)
            for c in spec["containers"] + spec.get("initContainers", []):
                sc = c.get("securityContext", {})
                where = f"{name}/{c['name']}"
                assert sc.get("allowPrivilegeEscalation") is False, where
                assert not sc.get("privileged"), where
                assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
                assert set(sc.get("capabilities", {}).get("add", [])) <= {"NET_BIND_SERVICE"}, where
                assert (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")) is True, where
                assert (sc.get("runAsUser", pod_sc.get("runAsUser", 1))) != 0, where
                seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
                assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), where
                assert not any(p.get("hostPort") for p in c.get("ports", [])), where
                # Beyond "restricted": the image's numeric user, and a read-only root.
                assert sc.get("readOnlyRootFilesystem") is True, where
                assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"], where


# -- settings that must agree -------------------------------------------------------------------


def test_each_overlay_config_is_accepted_by_check_config(rendered):
    for name, docs in rendered.items():
        settings = load_settings(None, **config_of(docs))
        assert startup_problems(settings) == [], name


def test_probes_are_on_the_ops_port_with_explicit_timeouts(rendered):
    for name, docs in rendered.items():
        config = config_of(docs)
        gateway = container(gateway_deployment(docs))
        ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
        assert ports["ops"] == config["server"]["ops_port"], name
        assert ports["mcp"] == config["server"]["port"], name
        for kind, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"), ("startupProbe", "/healthz")):
            probe = gateway[kind]
            assert probe["httpGet"] == {"path": path, "port": "ops"}, (name, kind)
            assert probe["timeoutSeconds"] >= 1 and "periodSeconds" in probe, (name, kind)


def test_termination_grace_covers_the_drain(rendered):
    for name, docs in rendered.items():
        server = config_of(docs)["server"]
        drain, grace = server["drain_delay_seconds"], server["graceful_shutdown_seconds"]
        spec = gateway_deployment(docs)["spec"]["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] >= drain + grace + 5, name
        assert "lifecycle" not in container(gateway_deployment(docs))  # the gateway drains itself on SIGTERM
        for c in spec["containers"]:
            stop = c.get("lifecycle", {}).get("preStop")
            if stop is not None:  # a sidecar's server outlives the gateway's drain, within the grace period
                seconds = float(stop["exec"]["command"][-1])
                assert drain + grace <= seconds < spec["terminationGracePeriodSeconds"], (name, c["name"])


def test_memory_fits_the_configured_cache(rendered):
    # An entry costs up to ~9x its encoded size in RSS (docs/cache.md "Memory"), plus the
    # runtime's own ~150 MiB.
    units = {"Mi": MIB, "Gi": 1024 * MIB}
    for name, docs in rendered.items():
        cache = config_of(docs).get("cache", {})
        max_bytes = cache.get("max_bytes", 64 * MIB) if cache.get("store", "memory") == "memory" else MIB * 8
        limit = container(gateway_deployment(docs))["resources"]["limits"]["memory"]
        number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", limit).groups()
        assert int(number) * units[unit] >= 9 * max_bytes + 150 * MIB, (name, limit, max_bytes)


def test_a_config_change_rolls_the_pods(tmp_path):
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE, copy)
    before = render(copy / "overlays" / "fleet")
    config = copy / "base" / "gateway.yaml"
    config.write_text(config.read_text().replace("log_level: info", "log_level: debug"))
    after = render(copy / "overlays" / "fleet")
    old, new = gateway_deployment(before)["spec"]["template"], gateway_deployment(after)["spec"]["template"]
    # The ConfigMap's name carries a hash of its content; the pod template names it.
    assert old != new
    assert old["spec"]["volumes"] != new["spec"]["volumes"]


def test_the_secret_example_holds_every_secret_the_manifests_read(rendered):
    example = yaml.safe_load((KUSTOMIZE / "secret" / "secret.example.yaml").read_text())
    assert "example" in str(example["stringData"]).lower()  # a placeholder, never a real secret
    for name, docs in rendered.items():
        refs = {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
                for _, spec in pod_specs(docs) for c in spec["containers"] for e in c.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs, name
        assert refs <= {(example["metadata"]["name"], key) for key in example["stringData"]}, name


def test_session_affinity_only_where_initialize_era_clients_are_served(rendered):
    for name, docs in rendered.items():
        service = one(docs, "Service", "mcp-gateway")
        legacy = config_of(docs).get("server", {}).get("legacy_clients", True)
        assert (service["spec"].get("sessionAffinity") == "ClientIP") == legacy, name


def test_the_sidecar_exposes_only_the_gateway(rendered):
    docs = rendered["sidecar"]
    deployment = gateway_deployment(docs)
    server = container(deployment, "mcp-server")
    assert "ports" not in server and "--host" in server["args"] and "127.0.0.1" in server["args"]
    service = one(docs, "Service", "mcp-gateway")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["mcp"]
    backend = config_of(docs)["backends"][0]["url"]
    assert backend == f"http://127.0.0.1:{server['args'][server['args'].index('--port') + 1]}/mcp"


def test_network_policy_lets_replicas_and_prometheus_in(rendered):
    for name, docs in rendered.items():
        policy = one(docs, "NetworkPolicy", "mcp-gateway")["spec"]
        rules = [(r.get("from"), [p["port"] for p in r["ports"]]) for r in policy["ingress"]]
        selector = gateway_deployment(docs)["spec"]["selector"]["matchLabels"]
        assert any(f and any(s.get("podSelector", {}).get("matchLabels", {}).items() <= selector.items()
                             for s in f) and ports == ["mcp"] for f, ports in rules), name
        assert any(f and any("namespaceSelector" in s for s in f) and ports == ["ops"] for f, ports in rules), name


def test_the_fleet_is_scaled_by_an_hpa_and_guarded_by_a_pdb(rendered):
    docs = rendered["fleet"]
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == gateway_deployment(docs)["metadata"]["name"]
    assert "replicas" not in gateway_deployment(docs)["spec"]  # the HPA owns it
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= \
        gateway_deployment(docs)["spec"]["template"]["metadata"]["labels"].items()
    assert any(d["kind"] == "Deployment" and d["metadata"]["name"] == "mcp-gateway-redis" for d in rendered["redis"])


# -- the rendered container, run -----------------------------------------------------------------


def image_environment() -> dict[str, str]:
    """The ENV of the Dockerfile's final stage: what the container has before the manifest's."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    final = text.split("\nFROM ")[-1]
    env: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            env.update(dict(pair.split("=", 1) for pair in line[4:].split()))
    return env


def container_environment(c: dict[str, Any], secret: dict[str, str]) -> dict[str, str]:
    """The container's env as the kubelet builds it: the image's, then the manifest's entries
    in order, `$(NAME)` expanded from the earlier ones, the downward API's pod IP as loopback."""
    env = image_environment()
    for entry in c.get("env", []):
        if "value" in entry:
            env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), entry["value"])
        elif "secretKeyRef" in entry["valueFrom"]:
            env[entry["name"]] = secret[entry["valueFrom"]["secretKeyRef"]["key"]]
        elif entry["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP":
            env[entry["name"]] = "127.0.0.1"
    return env


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the gateway binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("overlay", ["fleet", "sidecar"])
def test_the_rendered_pod_runs_and_answers_its_probes(rendered, overlay, tmp_path):
    if not Path("/usr/bin/tini").exists():
        pytest.skip("tini is not installed (scripts/test.sh installs the Debian package)")
    docs = rendered[overlay]
    deployment = gateway_deployment(docs)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["containerPort"] for c in containers for p in c.get("ports", [])}
    ports |= {int(c["args"][c["args"].index("--port") + 1]) for c in containers if "--port" in c["args"]}
    busy = [p for p in ports if not port_is_free(p)]
    if busy:
        pytest.skip(f"ports {busy} named by the manifest are in use on this machine")
    secret = yaml.safe_load((KUSTOMIZE / "secret" / "secret.example.yaml").read_text())["stringData"]
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # The server first (the gateway's readiness "all" in the sidecar waits on it anyway).
        for c in sorted(containers, key=lambda c: c["name"] == "gateway"):
            env = container_environment(c, secret)
            # Each mount, at a temporary directory standing in for its mountPath (the path is
            # rewritten wherever the environment names it).
            for mount in c.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                if "configMap" not in volume:
                    continue
                where = tmp_path / c["name"] / mount["name"]
                where.mkdir(parents=True)
                for key, content in configmaps[volume["configMap"]["name"]]["data"].items():
                    (where / key).write_text(content)
                env = {k: v.replace(mount["mountPath"], str(where)) for k, v in env.items()}
            env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # mcp-gateway's venv
            env["HOME"] = str(tmp_path)
            procs.append(subprocess.Popen([*c["command"], *c["args"]], env=env, start_new_session=True,
                                          stdout=open(tmp_path / f"{c['name']}.log", "wb"), stderr=subprocess.STDOUT))
        gateway = container(deployment)
        named = {p["name"]: p["containerPort"] for p in gateway["ports"]}
        deadline = time.monotonic() + 30
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = gateway[kind]["httpGet"]
            url = f"http://127.0.0.1:{named[probe['port']]}{probe['path']}"
            while True:
                try:
                    status = httpx.get(url, timeout=gateway[kind]["timeoutSeconds"], trust_env=False).status_code
                except httpx.HTTPError:
                    status = None
                if status == 200:
                    break
                assert time.monotonic() < deadline, (url, status, [(tmp_path / f"{c['name']}.log").read_text()
                                                                     for c in containers])
                time.sleep(0.2)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)  # tini forwards it: the gateway stops without the drain delay
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    # tini passes the exit status through: each stopped cleanly.
    assert [proc.returncode for proc in procs] == [0] * len(procs)
