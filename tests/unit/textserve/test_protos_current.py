"""The committed generated gRPC code is what `make protos` produces from protos/ today."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_is_current(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc")
    protos = sorted(str(p.relative_to(ROOT / "protos")) for p in (ROOT / "protos").rglob("*.proto"))
    assert protos, "no .proto files under protos/"
    status = protoc.main(
        ["protoc", f"-I{ROOT / 'protos'}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", *(str(ROOT / "protos" / p) for p in protos)]
    )  # fmt: skip
    assert status == 0
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    stale = [str(p) for p in generated if not filecmp.cmp(tmp_path / p, ROOT / p, shallow=False)]
    assert not stale, f"run `make protos`: {stale} differ from protos/"
