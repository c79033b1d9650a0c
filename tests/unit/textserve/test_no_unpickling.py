"""No code path unpickles a file: the packages are scanned (AST, not grep) for pickle-family
loaders, torch.load without weights_only=True, numpy.load with allow_pickle=True, and yaml.load
without a safe loader. Weights travel as safetensors, models as ONNX, metadata as JSON."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("model", "export", "service", "textserve", "bench")
UNSAFE_MODULES = {
    *("pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"),
}


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def findings(source: str, where: str) -> list[str]:
    """Unsafe deserialization in one module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for imported in names:
            if imported.split(".")[0] in UNSAFE_MODULES:
                found.append(f"{where}:{node.lineno}: imports {imported}")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        line = f"{where}:{node.lineno}: {name}"
        if name.endswith("torch.load") and not _is_true(_keyword(node, "weights_only")):
            found.append(f"{line} without weights_only=True")
        if name in {"np.load", "numpy.load"} and _is_true(_keyword(node, "allow_pickle")):
            found.append(f"{line} with allow_pickle=True")
        if name in {"yaml.load", "yaml.load_all", "yaml.unsafe_load", "yaml.full_load"}:
            loader = _dotted(_keyword(node, "Loader") or ast.Constant(None))
            if name != "yaml.load" or not loader.endswith("SafeLoader"):
                found.append(f"{line} can build arbitrary objects")
    return found


def test_the_scanner_catches_what_it_looks_for() -> None:
    bad = (
        "import pickle\nfrom joblib import load\nimport torch\nimport numpy as np\nimport yaml\n"
        "torch.load('x')\ntorch.load('x', weights_only=False)\nnp.load('x', allow_pickle=True)\n"
        "yaml.load(open('x'))\nyaml.unsafe_load('x')\n"
    )
    assert len(findings(bad, "bad.py")) == 7
    good = (
        "import torch\nimport numpy as np\nimport yaml\ntorch.load('x', weights_only=True)\n"
        "np.load('x')\nyaml.safe_load('x')\nyaml.load('x', Loader=yaml.SafeLoader)\n"
    )
    assert findings(good, "good.py") == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_unpickles(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources under {package}/"
    problems = [
        problem
        for path in files
        for problem in findings(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert problems == []
