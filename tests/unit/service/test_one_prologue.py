"""The request prologue is written once (service/servicers/resolve.py): no front end picks a
model version from the repository or spells the truncate default itself."""

from __future__ import annotations

import re
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[3] / "service"


def test_only_resolve_asks_the_repository_for_a_handle() -> None:
    fronts = [*SERVICE.glob("servicers/*.py"), *SERVICE.glob("http/*.py")]
    assert fronts
    offenders = [
        str(path.relative_to(SERVICE))
        for path in fronts
        if path.name != "resolve.py" and re.search(r"repository\.get\(", path.read_text())
    ]
    assert offenders == []
