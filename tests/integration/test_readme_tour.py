"""The README's quick tour, run as written on a tiny model: the front door cannot rot.

Every block the README marks for the tour (tests/tour.py says how) runs in order in one fresh
folder holding `reviews.csv`, a small labelled data set in the README's columns (review,
sentiment) with its labels (fresh, rotten), and `my-distilbert/`, a tiny random-weight
DistilBERT with labels negative and positive (tests/foreign.py builds it as `save_pretrained`
writes it). Commands run in bash with the venv's `textserve`
first on PATH. The server the tour starts listens on a free port (TEXTSERVE_LISTEN=127.0.0.1:0,
TEXTSERVE_HTTP_PORT=0), so every `127.0.0.1:50051` and `127.0.0.1:8000` of the blocks
after it is replaced by the address it logged, and client commands that name no server reach
it through TEXTSERVE_SERVER (their default is 127.0.0.1:50051); nothing else of a command is
changed except what a block's `append=` option names in the README itself.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tour import Block, matches, output_lines, parse

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
pytestmark = pytest.mark.slow


def _reviews(path: Path) -> None:
    from textserve.model.synthetic import synthetic_rows

    names = {"positive": "fresh", "negative": "rotten"}
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["review", "sentiment"])
        for row in synthetic_rows(240, seed=0, labels=3):
            if row["label"] in names:
                writer.writerow([row["text"], names[row["label"]]])


class Tour:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "TEXTSERVE_WORKERS": "1",
            "TEXTSERVE_LISTEN": "127.0.0.1:0",
            "TEXTSERVE_HTTP_PORT": "0",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.addresses: dict[str, str] = {}
        self.servers: list[subprocess.Popen[str]] = []
        self.ran: list[str] = []

    def _substitute(self, text: str) -> str:
        for documented, actual in self.addresses.items():
            text = text.replace(documented, actual)
        return text

    def run(self, block: Block) -> None:
        if block.lang == "python":
            script = self._substitute(block.body)
            result = subprocess.run(
                [sys.executable, "-"], input=script, cwd=self.folder, env=self.env,
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert result.returncode == 0, f"{script}\n{result.stdout}{result.stderr}"
            self.ran.append("python")
            return
        assert block.lang == "console", f"a tour block must be console or python: {block.lang}"
        for command in block.commands:
            text = self._substitute(command.text)
            if block.options.get("append"):
                text = f"{text} {block.options['append']}"
            expected = [self._substitute(line) for line in command.expected]
            self.ran.append(text)
            if "background" in block.options:
                self._start(text, expected)
                continue
            deadline = time.monotonic() + (30 if "retry" in block.options else 0)
            while True:
                result = subprocess.run(
                    ["bash", "-c", text], cwd=self.folder, env=self.env,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                )  # fmt: skip
                actual = output_lines(result.stdout)
                if result.returncode == 0 and matches(expected, actual):
                    break
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"$ {text}\nexit status {result.returncode}; expected the shape of:\n"
                        + "\n".join(expected) + "\ngot:\n" + "\n".join(actual)
                    )  # fmt: skip
                time.sleep(1)

    def _start(self, text: str, expected: list[str]) -> None:
        log = self.folder / f"server-{len(self.servers)}.log"
        with log.open("w") as out:
            server = subprocess.Popen(
                ["bash", "-c", f"exec {text}"], cwd=self.folder, env=self.env,
                stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            )  # fmt: skip
        self.servers.append(server)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            logged = log.read_text()
            if "textserve is serving on" in logged:
                break
            time.sleep(0.2)
        logged = log.read_text()
        assert "textserve is serving on" in logged, f"$ {text}\n{logged}"
        grpc = re.search(r"listening on (\S+) \(gRPC\)", logged)
        metrics = re.search(r"metrics on http://(\S+)/metrics", logged)
        assert grpc and metrics, logged
        self.addresses = {"127.0.0.1:50051": grpc.group(1), "127.0.0.1:8000": metrics.group(1)}
        self.env["TEXTSERVE_SERVER"] = grpc.group(1)  # the default of the client commands
        expected = [self._substitute(line) for line in expected]
        assert matches(expected, output_lines(logged)), (
            f"$ {text}\nexpected the shape of:\n" + "\n".join(expected) + "\ngot:\n" + logged
        )

    def stop(self) -> None:
        for server in self.servers:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
        for server in self.servers:
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def _distilbert(folder: Path) -> None:
    """The tour's Hugging Face model: a tiny random DistilBERT, as `save_pretrained` writes it."""
    from tests.foreign import build

    labels = {0: "negative", 1: "positive"}
    build("distilbert", folder, num_labels=2, id2label=labels,
          label2id={v: k for k, v in labels.items()})  # fmt: skip


def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    blocks = parse(README.read_text(encoding="utf-8"))
    _reviews(tmp_path / "reviews.csv")
    _distilbert(tmp_path / "my-distilbert")
    tour = Tour(tmp_path)
    try:
        for block in blocks:
            tour.run(block)
    finally:
        tour.stop()
    ran = "\n".join(tour.ran)
    # The tour's spine stays marked: removing a block's marker cannot make this pass silently.
    for step in ("textserve train", "textserve export", "textserve serve", "textserve classify"):
        assert step in ran, f"no marked tour block runs `{step}`"
    assert "python" in tour.ran
    assert all(server.returncode == 0 for server in tour.servers)
