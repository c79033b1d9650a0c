"""The load behind docs/images/dashboard.png, replayable: a real server, a real Prometheus, the
picture drawn by docs/render_dashboard.py from the dashboard's own queries.

    .venv/bin/python docs/dashboard_scenario.py --repository models --model default \\
        --minutes 3 --output docs/images/dashboard.png

It copies the model's newest version into a scratch repository, starts `textserve serve
--workers 1` on it (127.0.0.1, free ports) and Prometheus (`prometheus` on PATH: `make
system-deps`) scraping its /metrics every 2 s, then over `--minutes`:

- 6 callers the whole time, 1-4 texts a request, one request in 50 with an empty text
  (refused INVALID_ARGUMENT: the errors panels);
- 10 callers more from 1/3 to 1/2 of the run (batches and latency rise);
- version 2 published halfway (a copy of version 1 under the next number: the version panels
  move from 1 to 2, a hot reload under load);
- open-loop arrivals at `--overload` x the rate the server served at the start, for 20 s from
  2/3 of the run (refusals: the admission and backlog panels).

then renders the last `--minutes` of every panel. The figures depend on the machine; the
picture shows what the dashboard shows, not Grafana's styling (see docs/dashboard.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from textserve.artifact import Manifest, newest_version  # noqa: E402
from textserve.bench.loadgen import closed_loop, open_loop  # noqa: E402
from textserve.bench.process import poll, serve_command, spawn  # noqa: E402
from textserve.bench.requests import RequestPool, build_requests, load_texts  # noqa: E402
from textserve.bench.stats import summarize  # noqa: E402
from textserve.client import Client  # noqa: E402
from textserve.results import ClientError  # noqa: E402

SCRAPE = "2s"


def _publish_next(model_dir: Path) -> int:
    """A copy of the newest version under the next number, published atomically."""
    found = newest_version(model_dir, complete=True)
    assert found is not None
    version = found[0] + 1
    staging = model_dir / f".tmp-{version}"
    shutil.copytree(found[1], staging)
    manifest = Manifest.read(staging)
    dataclasses.replace(manifest, version=version).write(staging)
    staging.rename(model_dir / str(version))
    return version


def _caller(address: str, texts: list[str], stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    with Client(address, timeout=10) as client:
        while not stop.is_set():
            batch = rng.sample(texts, rng.randint(1, 4))
            if rng.random() < 0.02:
                batch[0] = ""  # refused: INVALID_ARGUMENT
            with contextlib.suppress(ClientError):  # the empty text's refusal
                client.classify(batch)
            stop.wait(0.01)


def _prometheus(metrics_url: str, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "textserve")
    target = metrics_url.removeprefix("http://").removesuffix("/metrics")
    job["static_configs"] = [{"targets": [target]}]
    config["scrape_configs"] = [job]
    config["global"].update(
        scrape_interval=SCRAPE, scrape_timeout=SCRAPE, evaluation_interval=SCRAPE
    )
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = 19090
    process = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=(folder / "prometheus.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if process.poll() is not None:
            raise SystemExit("Prometheus exited:\n" + (folder / "prometheus.log").read_text())
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    poll(ready, "Prometheus to start")
    return process, url


def run(args: argparse.Namespace) -> int:
    seconds = args.minutes * 60
    texts = load_texts(args.texts or ROOT / "runs" / args.model)
    with tempfile.TemporaryDirectory(prefix="textserve-dashboard-") as scratch:
        folder = Path(scratch)
        found = newest_version(args.repository / args.model, complete=True)
        if found is None:
            raise SystemExit(f"no version of {args.model!r} in {args.repository}")
        model_dir = folder / "models" / args.model
        shutil.copytree(found[1], model_dir / "1")
        dataclasses.replace(Manifest.read(model_dir / "1"), version=1).write(model_dir / "1")
        command = serve_command(folder / "models", args.model, ["--workers", "1"])
        with spawn(command) as server:
            assert server.metrics_url is not None
            prometheus, url = _prometheus(server.metrics_url, folder)
            try:
                _scenario(server.address, texts, seconds, model_dir, args)
                render = [sys.executable, str(ROOT / "docs" / "render_dashboard.py")]
                render += ["--prometheus", url, "--minutes", str(args.minutes)]
                render += ["--rate-interval", "8s", "--output", str(args.output)]
                return subprocess.run(render, check=False).returncode
            finally:
                prometheus.terminate()
                prometheus.wait(timeout=30)


def _scenario(
    address: str, texts: list[str], seconds: float, model_dir: Path, args: argparse.Namespace
) -> None:
    stop, surge = threading.Event(), threading.Event()
    threads = [
        threading.Thread(target=_caller, args=(address, texts, stop, i), daemon=True)
        for i in range(6)
    ]
    extra = [
        threading.Thread(target=_caller, args=(address, texts, surge, 100 + i), daemon=True)
        for i in range(10)
    ]
    started = time.monotonic()

    def at(share: float) -> None:
        time.sleep(max(0.0, started + share * seconds - time.monotonic()))
        print(f"{time.monotonic() - started:6.1f} s", flush=True)

    for thread in threads:
        thread.start()
    at(1 / 3)
    print("10 callers more", flush=True)
    for thread in extra:
        thread.start()
    at(1 / 2)
    surge.set()
    print(f"version {_publish_next(model_dir)} published", flush=True)
    at(2 / 3)
    pool = build_requests(texts, "v1", 1, args.model)
    rate = args.overload * _served_rate(address, pool)
    print(f"open loop at {rate:,.0f} requests/s for 20 s", flush=True)
    asyncio.run(open_loop(address, pool, rate, warmup=0.0, duration=20.0, connections=4))
    at(1.0)
    stop.set()
    for thread in (*threads, *extra):
        thread.join(timeout=30)


def _served_rate(address: str, pool: RequestPool) -> float:
    """Requests per second one text at a time from 32 callers for 3 s: the rate to overload."""
    raw, _ = asyncio.run(closed_loop(address, pool, 32, warmup=0.5, duration=3.0))
    return float(summarize(raw, os.cpu_count() or 1)["throughput_requests_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "models")
    parser.add_argument("--model", default="default")
    parser.add_argument("--texts", type=Path, default=None, help="JSONL (default: runs/<model>)")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--overload", type=float, default=2.0, help="x the served rate")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
