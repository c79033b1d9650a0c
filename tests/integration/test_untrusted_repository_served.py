"""A served repository takes whatever lands in it (issue #20), property-based: hypothesis
drops version folders with hostile names, manifests and file layouts beside a good version of a
real server under traffic. No request to the good version fails, nothing outside the repository
is opened, and every bad folder that is a version is FAILED with a reason and counted (one that
is not a version is not listed at all).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from tests.untrusted import OPENED, WATCHED
from textserve import artifact
from textserve.artifact import MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE, parse_version
from textserve.service.repository.core import State
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

# Small caps for the test, so that "too big" is a sparse file just over them.
CAPS = {MANIFEST_FILE: 1 << 20, MODEL_FILE: 64 << 10, TOKENIZER_FILE: 64 << 10}

BAD_NAMES = st.one_of(
    st.sampled_from(["²", "³", "٣", "１", "0", "007", "+5", "-5", "5 ", "1e3", "0x10", "9" * 23]),
    st.integers(2**63, 10**40).map(str),
    st.text(alphabet="0123456789²٣ ", min_size=1, max_size=25),
).filter(lambda name: parse_version(name) is None)
VERSIONS = st.one_of(st.integers(2, 2**63 - 1), st.sampled_from([2, 3, 2**63 - 1]))

# Values each field must not take (the schema's, the loader's and the folder's rules).
WRONG: dict[str, st.SearchStrategy[Any]] = {
    "labels": st.one_of(
        st.sampled_from(
            [[0, 1], [{}, {"a": 1}], [], ["a", "a"], ["a", ""], "ab", [None], ["\ud800"]]
        ),
        st.lists(st.integers(), min_size=1, max_size=3),
    ),
    "sha256": st.sampled_from(
        [
            [MODEL_FILE, TOKENIZER_FILE],
            {MODEL_FILE: 1, TOKENIZER_FILE: 2},
            "0" * 64,
            {},
            {MODEL_FILE: "A" * 64, TOKENIZER_FILE: "0" * 64},
        ]
    ),
    "version": st.one_of(
        st.integers(max_value=0), st.integers(min_value=2**63), st.sampled_from([1.5, "2", True])
    ),
    "max_length": st.one_of(
        st.integers(max_value=0), st.integers(2**20 + 1, 2**70), st.sampled_from(["8", 8.0])
    ),
    "pad_token_id": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)),
    "precision": st.text(max_size=5).filter(lambda p: p not in artifact.PRECISIONS),
    "name": st.sampled_from(["", 1, "someone-else"]),
    # (null is a format 2 manifest's "no test split", a legal value)
    "test_accuracy": st.one_of(st.floats(1.01, 1e300), st.sampled_from(["high", -0.5])),
    "parity": st.sampled_from([[1], {"x": "y"}, 3]),
    "opset": st.one_of(st.integers(max_value=0), st.just("18")),
    "extra": st.sampled_from([[], "x", 1]),
    "surprise": st.integers(),  # a key the schema does not know
    # format 2's fields
    "source": st.sampled_from(
        [None, "hf", {"kind": "hub", "architecture": "X", "model_type": None}]
    ),
    "inputs": st.sampled_from(
        [["input_ids"], ["input_ids", "attention_mask", "position_ids"], "x"]
    ),
    "activation": st.sampled_from(["tanh", None, "none"]),  # none: regression, 1 label only
    "threshold": st.sampled_from([0, 1, 1.5, -0.1, "0.5"]),
    "unk_token_id": st.sampled_from([-1, 2**32, 1.0, "1"]),
    "truncation_side": st.sampled_from(["middle", None, ""]),
    "format_version": st.sampled_from([0, 3, "2", 2.0, None]),
}
# Defects that are not one field's value: (kind, parameter).
SPECIAL = st.one_of(
    st.tuples(st.just("deep"), st.integers(33, 100_000)),  # nesting, in extra
    st.tuples(st.just("path_key"), st.sampled_from(["relative", "absolute"])),  # hash the sentinel
    st.tuples(st.just("missing_field"), st.sampled_from(["labels", "sha256", "version"])),
    st.tuples(st.just("other_version"), st.just(0)),  # a fine number, not the folder's
    st.tuples(
        st.just("file"),
        st.sampled_from(
            [
                "model_link_out",
                "tokenizer_link_out",
                "manifest_link_out",
                "model_fifo",
                "model_big",
                "tokenizer_big",
                "manifest_big",
                "model_missing",
                "folder_link_out",
                "model_dir",
            ]
        ),
    ),
)


@dataclass
class Case:
    model: str  # "good" (beside the served version) or "other" (a model of its own)
    folder: str
    fields: dict[str, Any]
    specials: list[tuple[str, Any]]

    @property
    def version(self) -> int | None:
        return parse_version(self.folder)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    is_version = draw(st.booleans())
    folder = str(draw(VERSIONS)) if is_version else draw(BAD_NAMES)
    keys = draw(st.lists(st.sampled_from(sorted(WRONG)), max_size=3, unique=True))
    fields = {key: draw(WRONG[key]) for key in keys}
    specials = draw(st.lists(SPECIAL, min_size=0 if fields else 1, max_size=2))
    return Case(draw(st.sampled_from(["good", "other"])), folder, fields, specials)


class Traffic:
    """Classify on the good version (pinned: version 1), ListModels and GetModel, in a loop on
    a thread until stopped; every failure is kept."""

    def __init__(self, srv: RunningServer) -> None:
        self.channel = srv.channel()
        self.stub = pb_grpc.ClassifierStub(self.channel)
        self.errors: list[str] = []
        self.calls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.channel.close()

    def check(self) -> None:
        request = pb.ClassifyRequest(texts=["a good film", "awful plot"], model="good", version=1)
        try:
            response = self.stub.Classify(request, timeout=30)
            assert response.model_version == 1 and len(response.results) == 2
            self.stub.ListModels(pb.ListModelsRequest(), timeout=30)
            assert self.stub.GetModel(pb.GetModelRequest(name="good"), timeout=30).version >= 1
        except grpc.RpcError as exc:
            self.errors.append(f"{exc.code().name}: {exc.details()}")
        self.calls += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.check()


def write_case(case: Case, repository: Path, template: Path, outside: Path, secret: Path) -> Path:
    """The case's folder in the repository; every link it makes points into `outside`."""
    target = repository / case.model / case.folder
    target.parent.mkdir(exist_ok=True)
    number = case.version or 2
    data = json.loads((template / MANIFEST_FILE).read_text())
    data.update(name=case.model, version=number)
    data.update(case.fields)
    raw_extra = ""
    links: dict[str, Path] = {}
    kinds = [kind for kind, _ in case.specials]
    for kind, arg in case.specials:
        if kind == "deep":
            raw_extra = "[" * arg + "]" * arg
        elif kind == "path_key" and isinstance(data.get("sha256"), dict):
            key = str(secret) if arg == "absolute" else "../../../outside/secret"
            data["sha256"][key] = artifact.hashlib.sha256(secret.read_bytes()).hexdigest()
        elif kind == "path_key":
            data["sha256"] = {str(secret): "0" * 64}
        elif kind == "missing_field":
            data.pop(arg, None)
        elif kind == "other_version":
            data["version"] = number + 1 if number < 2**63 - 1 else 1
        elif kind == "file" and arg.endswith("_link_out"):
            links[arg.removesuffix("_link_out")] = outside
    source = target  # where the manifest goes: the folder, or what a linked folder points at
    if "folder" in links:
        source = outside / f"version-{len(list(outside.iterdir()))}"
        shutil.copytree(template, source)
        target.symlink_to(source, target_is_directory=True)
    else:
        target.mkdir()
        for fname in (MODEL_FILE, TOKENIZER_FILE):
            shutil.copy(template / fname, target / fname)
    text = json.dumps(data)
    if raw_extra:
        text = text[:-1] + f', "deep": {{"x": {raw_extra}}}}}'
    (source / MANIFEST_FILE).write_text(text)
    if "folder" in links:
        return target
    for kind, arg in case.specials:
        if kind != "file":
            continue
        file = {"model": MODEL_FILE, "tokenizer": TOKENIZER_FILE, "manifest": MANIFEST_FILE}[
            arg.split("_")[0]
        ]
        if arg.endswith("_link_out") and arg != "folder_link_out":
            copy = outside / f"{file}-{len(list(outside.iterdir()))}"
            shutil.copy(target / file, copy)  # the same bytes: only the link is wrong
            (target / file).unlink()
            (target / file).symlink_to(copy)
        elif arg.endswith("_fifo"):
            (target / file).unlink()
            os.mkfifo(target / file)
        elif arg.endswith("_big"):
            with open(target / file, "r+b") as fh:
                fh.truncate(CAPS[file] + 1)
        elif arg.endswith("_missing"):
            (target / file).unlink()
        elif arg.endswith("_dir"):
            (target / file).unlink()
            (target / file).mkdir()
    assert kinds or case.fields
    return target


def remove(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def load_failures(srv: RunningServer, model: str) -> float:
    return sum(
        srv.metrics.registry.get_sample_value(
            "textserve_model_load_failures_total", {"model": model, "reason": reason}
        )
        or 0
        for reason in ("invalid_manifest", "checksum_mismatch", "session_error",
                       "contract_mismatch", "tokenizer_error", "warmup_error", "unsafe_file",
                       "other")
    )  # fmt: skip


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    for fname, cap in CAPS.items():
        monkeypatch.setitem(artifact.MAX_FILE_BYTES, fname, cap)
    repository = tmp_path / "models"
    make_version(repository, "good", 1)
    template = make_version(tmp_path / "template", "good", 2, seed=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_bytes(b"the server must never open this\n")
    yield {"repository": repository, "template": template, "outside": outside, "secret": secret}
    WATCHED.clear()


def test_hostile_versions_under_traffic_refuse_themselves_only(sandbox: dict[str, Path]) -> None:
    repository, outside = sandbox["repository"], sandbox["outside"]
    with running_server(repository, poll_interval=0) as srv, Traffic(srv) as traffic:
        repo = srv.server.repository
        seen: list[Case] = []

        @settings(
            max_examples=40,  # ~2 s: most refusals come before a session is built
            deadline=None,
            derandomize=True,  # the same examples on every run: a CI failure replays here
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(case=cases())
        def check(case: Case) -> None:
            seen.append(case)
            before = load_failures(srv, case.model)
            target = write_case(case, repository, sandbox["template"], outside, sandbox["secret"])
            WATCHED.clear()
            WATCHED.update(os.path.realpath(p) for p in outside.rglob("*"))
            OPENED.clear()
            try:
                srv.run(repo.reconcile())
                traffic.check()  # at least one call per example, after the change
                record = repo.models.get(case.model)
                entry = None if record is None else record.versions.get(case.version or 0)
                if case.version is None:
                    assert entry is None or entry.path != target, "not a version, yet listed"
                else:
                    assert entry is not None and entry.state is State.FAILED, case
                    assert entry.reason, case
                    assert load_failures(srv, case.model) == before + 1, entry.reason
                assert repo.get("good", 1).version == 1
                assert not OPENED, f"opened outside the repository: {OPENED}"
            finally:
                WATCHED.clear()
                remove(target)
                srv.run(repo.reconcile())

        check()
        assert repo.get("good").version == 1
    assert {c.version is None for c in seen} == {True, False}  # versions and not
    assert traffic.calls > 0
    assert not traffic.errors, traffic.errors[:5]
