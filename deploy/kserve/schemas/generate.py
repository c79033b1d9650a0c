"""Derive JSON schemas of KServe's ClusterServingRuntime and InferenceService from the models
that the `kserve` wheel generates from its CRDs (kserve/models/*.py: openapi_types,
attribute_map, and the setters that refuse None for required fields).

    pip download --no-deps kserve==0.21.0 && unzip kserve-0.21.0-*.whl 'kserve/models/*'
    python deploy/kserve/schemas/generate.py kserve/models deploy/kserve/schemas

KServe-owned objects get `additionalProperties: false` (a misspelt field is an error, as the
API server's structural schema prunes it silently); Kubernetes core types (V1Container,
V1ObjectMeta, ...) are left open here: the tests validate those parts against the Kubernetes
schemas of kubernetes-validate instead.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOTS = {
    "clusterservingruntime": "V1alpha1ClusterServingRuntime",
    "inferenceservice": "V1beta1InferenceService",
}


_FILES: dict[str, Path] = {}


def load_known(models: Path, cls: str) -> bool:
    """Whether the wheel ships `cls` (0.21.0 names a few classes it lacks: left open)."""
    try:
        load(models, cls)
    except KeyError:
        return False
    return True


def load(models: Path, cls: str) -> tuple[dict[str, str], dict[str, str], set[str]]:
    if not _FILES:
        for path in models.glob("*.py"):
            for name in re.findall(r"^class (\w+)\(", path.read_text(), re.M):
                _FILES[name] = path
    if cls not in _FILES:  # 0.21.0 names V1alpha1WorkerSpec, a class it ships as V1beta1
        cls = cls.replace("V1alpha1", "V1beta1")
    source = _FILES[cls].read_text()
    tree = ast.parse(source)
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(tree):
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("openapi_types", "attribute_map"):
            found[target.id] = ast.literal_eval(node.value)  # type: ignore[attr-defined]
    required = set(re.findall(r"Invalid value for `(\w+)`, must not be `None`", source))
    return found["openapi_types"], found["attribute_map"], required


def schema_of(models: Path, kind: str, defs: dict[str, dict]) -> dict:
    if kind in ("str", "datetime"):
        return {"type": "string"}
    if kind == "int":
        return {"type": "integer"}
    if kind == "float":
        return {"type": "number"}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "object":
        return {}
    if m := re.fullmatch(r"list\[(.+)\]", kind):
        return {"type": "array", "items": schema_of(models, m.group(1), defs)}
    if m := re.fullmatch(r"dict\(str, (.+)\)", kind):
        return {"type": "object", "additionalProperties": schema_of(models, m.group(1), defs)}
    if re.fullmatch(r"V1(alpha1|beta1)\w+", kind) and load_known(models, kind):
        if kind not in defs:
            defs[kind] = {}  # placeholder: recursive types
            types, names, required = load(models, kind)
            defs[kind] = {
                "type": "object",
                "additionalProperties": False,
                "properties": {names[f]: schema_of(models, t, defs) for f, t in types.items()},
                **({"required": sorted(names[f] for f in required)} if required else {}),
            }
        return {"$ref": f"#/$defs/{kind}"}
    if kind == "ResourceQuantity":  # a Kubernetes quantity
        return {"type": ["string", "integer", "number"]}
    # Kubernetes and Knative types (V1Container, K8sIoApi..., Knative...): open here
    return {"type": "object", "description": kind}


def main(models: Path, out: Path) -> None:
    for name, root in ROOTS.items():
        defs: dict[str, dict] = {}
        ref = schema_of(models, root, defs)
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"{root} (from kserve 0.21.0 kserve/models)",
            **ref,
            "$defs": dict(sorted(defs.items())),
        }
        (out / f"{name}.json").write_text(json.dumps(schema, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
