"""The one /metrics of `textserve serve --workers N`: the supervisor's registry over every
worker's prometheus-client multiprocess files, the whole server's CPU and memory, and the
supervisor's own series.

    directory = create_metrics_dir()        # the supervisor; stale ones of dead servers go
    use_multiprocess_files(directory)       # in a worker, before any metric exists
    registry = server_registry(directory, live_pids)  # in the supervisor
    metrics = SupervisorMetrics(registry)   # textserve_worker_restarts_total, textserve_workers
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.multiprocess import MultiProcessCollector

from textserve import procfs

# Why a worker was restarted: the label `reason` of textserve_worker_restarts_total.
RESTART_REASONS = (
    "exited",  # it died: a crash, the OOM killer, a kill by someone else
    "unresponsive",  # no answer to the heartbeat within --worker-timeout: killed, restarted
)


logger = logging.getLogger(__name__)

METRICS_DIR_PREFIX = "textserve-metrics-"
OWNER_FILE = "owner"  # "PID STARTTIME" of the supervisor that made the folder (not *.db: unread)


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22): with the
    pid, it names one process even after the pid is reused. None when there is no such
    process."""
    stat = procfs.process_stat(pid)
    return None if stat is None else stat.start


def create_metrics_dir(parent: str | None = None) -> str:
    """A fresh PROMETHEUS_MULTIPROC_DIR for this supervisor in the temporary directory, after
    removing the folders of supervisors that are gone (a SIGKILLed one cannot remove its own);
    the supervisor removes its folder itself on every exit it sees."""
    parent = parent or tempfile.gettempdir()
    remove_stale_metrics_dirs(parent)
    directory = tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-", dir=parent)
    Path(directory, OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
    return directory


def remove_stale_metrics_dirs(parent: str) -> list[Path]:
    """Remove the metrics folders in `parent` whose owner process is gone; never one of a live
    server, nor one without an owner file (not ours to judge), nor another user's. The removed
    folders."""
    removed = []
    for folder in Path(parent).glob(f"{METRICS_DIR_PREFIX}*"):
        with contextlib.suppress(OSError, ValueError):
            if not folder.is_dir() or folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
            pid, started = (folder / OWNER_FILE).read_text().split()
            if _start_time(int(pid)) == started:
                continue  # its supervisor still runs
            shutil.rmtree(folder)
            removed.append(folder)
            logger.info("removed %s: its server (pid %s) is gone", folder, pid)
    return removed


def use_multiprocess_files(directory: str) -> None:
    """Make every metric this process creates from now on write to `directory`'s files
    (PROMETHEUS_MULTIPROC_DIR), which the supervisor's /metrics reads."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    from prometheus_client import values

    values.ValueClass = values.get_value_class()


def mark_dead(pid: int, directory: str) -> None:
    """A worker exited: its live gauges (queue depth, in-flight: livesum) go with it."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, directory)


class _ServedOnly:
    """prometheus-client's MultiProcessCollector (every worker's files, each metric aggregated
    as its type or `multiprocess_mode` says), less the textserve_model_info samples at 0: a
    version a worker retired (the files cannot forget a series)."""

    def __init__(self, path: str) -> None:
        self._collector = MultiProcessCollector(None, path)

    def collect(self) -> Any:
        for family in self._collector.collect():
            if family.name == "textserve_model_info":
                family.samples = [s for s in family.samples if s.value != 0]
            yield family


class _ServerProcesses:
    """process_cpu_seconds_total and process_resident_memory_bytes of the whole server: this
    process (the supervisor), its live workers (from /proc) and, for CPU, the workers that
    already exited (os.times' children). prometheus-client's process metrics cover one
    process only and have no multiprocess mode; dashboards and `textserve bench` read these."""

    def __init__(self, workers: Any) -> None:
        self._workers = workers  # () -> the pids of the live workers

    def _stat(self, pid: int | str) -> tuple[float, float]:
        stat = procfs.process_stat(pid)
        return (0.0, 0.0) if stat is None else (stat.cpu_seconds, float(stat.rss_bytes))

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        times = os.times()
        cpu = times.user + times.system + times.children_user + times.children_system
        _, rss = self._stat("self")
        for pid in self._workers():
            worker_cpu, worker_rss = self._stat(pid)
            cpu += worker_cpu
            rss += worker_rss
        yield CounterMetricFamily(
            "process_cpu_seconds", "CPU seconds of the server: supervisor and workers", cpu
        )
        yield GaugeMetricFamily(
            "process_resident_memory_bytes",
            "Resident memory of the server: supervisor and live workers",
            rss,
        )


class SupervisorMetrics:
    """The series of the supervisor of `--workers N` itself, on its /metrics registry (an
    ordinary, in-memory one: the supervisor writes no multiprocess files)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.worker_restarts = Counter(
            "textserve_worker_restarts",
            "Worker processes the supervisor restarted, by why: it exited (crashed, killed), "
            "or it stopped answering the supervisor's heartbeat (unresponsive)",
            ["reason"],
            registry=registry,
        )
        for reason in RESTART_REASONS:
            self.worker_restarts.labels(reason)
        self.workers = Gauge(
            "textserve_workers", "Worker processes running (any state)", registry=registry
        )


def server_registry(path: str, workers: Any) -> CollectorRegistry:
    """The registry of the supervisor's /metrics (`--workers N`): every worker's metrics from
    the multiprocess files in `path`, and the server's CPU and memory (`workers()`: the pids of
    the live workers)."""
    registry = CollectorRegistry()
    registry.register(_ServedOnly(path))
    registry.register(_ServerProcesses(workers))
    return registry
