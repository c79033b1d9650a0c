"""The request prologue is written once (service/dataplane/): no codec picks a model version
from the repository, observes a request or runs the engine itself; they call the data plane."""

from __future__ import annotations

import re
from pathlib import Path

import textserve.service

# through the package, not this file's place in the checkout: the same folder from any test
# layout, and in the wheel-shaped staging of `make mutate` (no top-level service/ there)
SERVICE = Path(textserve.service.__file__).resolve().parent


def _offenders(pattern: str, allowed: set[str]) -> list[str]:
    fronts = [
        *SERVICE.glob("servicers/*.py"),
        *SERVICE.glob("http/*.py"),
        *SERVICE.glob("dataplane/*.py"),
    ]
    assert len(fronts) > 20
    return [
        str(path.relative_to(SERVICE))
        for path in fronts
        if str(path.relative_to(SERVICE)) not in allowed and re.search(pattern, _code(path))
    ]


def _code(path: Path) -> str:
    """A module's text without docstrings and comments (which may name these functions)."""
    text = re.sub(r'"""[\s\S]*?"""', "", path.read_text())
    return re.sub(r"#.*", "", text)


def test_only_the_prologue_asks_the_repository_for_a_handle() -> None:
    assert _offenders(r"repository\.get\(", {"dataplane/prologue.py"}) == []


def test_only_the_data_plane_observes_requests_and_runs_the_engine() -> None:
    # the stream runs the data plane's prologue and observation per message itself: its
    # answers come in callbacks (servicers/stream.py)
    allowed = {"dataplane/classify.py", "dataplane/oip.py", "dataplane/observe.py"}
    allowed |= {"dataplane/tag.py"}  # a token classifier's Tag: the same observation
    assert _offenders(r"\bobserved\(|\bObservation\(", allowed | {"servicers/stream.py"}) == []
    # long texts: the data plane's windows run the engine on a classify's windows
    engine_callers = allowed | {"servicers/stream.py", "dataplane/windows.py"}
    assert _offenders(r"handle\.classify(_nowait)?\(", engine_callers) == []
    assert _offenders(r"handle\.tag\(", allowed | {"servicers/stream.py"}) == []
    # (GetModel, textserve.v1's own model description, resolves through the prologue too)
    resolvers = {"dataplane/prologue.py", "dataplane/classify.py", "dataplane/oip.py"}
    resolvers |= {"dataplane/tag.py"}
    assert _offenders(r"\bresolve\(", resolvers | {"servicers/classifier.py"}) == []
