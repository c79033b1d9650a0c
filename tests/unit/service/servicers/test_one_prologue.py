"""The request prologue is written once (service/servicers/resolve.py): no front end picks a
model version from the repository or spells the truncate default itself."""

from __future__ import annotations

import re
from pathlib import Path

import textserve.service

# through the package, not this file's place in the checkout: the same folder from any test
# layout, and in the wheel-shaped staging of `make mutate` (no top-level service/ there)
SERVICE = Path(textserve.service.__file__).resolve().parent


def test_only_resolve_asks_the_repository_for_a_handle() -> None:
    fronts = [*SERVICE.glob("servicers/*.py"), *SERVICE.glob("http/*.py")]
    assert fronts
    offenders = [
        str(path.relative_to(SERVICE))
        for path in fronts
        if path.name != "resolve.py" and re.search(r"repository\.get\(", path.read_text())
    ]
    assert offenders == []
