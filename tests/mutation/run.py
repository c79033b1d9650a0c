"""`make mutate`: mutmut over the core modules, one group at a time against the narrowest tests.

Each group is staged in build/mutation/<group>/ as the wheel lays it out (textserve/ with real
service/, export/ folders, not the checkout's symlinks: mutmut copies what it mutates into
mutants/ and the tests must import that copy), then `mutmut run`; the report,
build/mutation/report.md, gives the kill rate per module and the diff of every survivor.
Equivalent survivors are listed, with why, in tests/mutation/README.md.

    python tests/mutation/run.py                 # every group
    python tests/mutation/run.py batcher status  # some of them
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "mutation"

U = "tests/unit/service/"
R = U + "repository/"
S = U + "servicers/"
D = U + "dataplane/"
# group -> (modules under textserve/, the tests that cover them: unit tests, fast and forkable)
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "batcher": (
        ["service/engine/batcher.py", "service/engine/queue.py"],
        [
            *(
                U + f"engine/test_batcher_{part}.py"
                for part in ("batching", "deadlines", "overload", "lifecycle", "observation")
            ),
            U + "engine/test_queue.py",
        ],
    ),
    "oip_codec": (["service/dataplane/oip_codec.py"], [D + "test_oip_codec.py"]),
    "status": (
        [
            "service/servicers/status.py",
            "service/dataplane/codes.py",
            "service/dataplane/observe.py",
            "service/dataplane/prologue.py",
        ],
        [
            U + "test_serving_edges.py",
            D + "test_request_text.py",
            S + "test_status_table.py",
            D + "test_request_report.py",
        ],
    ),
    "publish": (
        ["export/publish.py"],
        ["tests/unit/export/test_export_repository.py", "tests/unit/export/test_publish.py"],
    ),
    "interceptors": (
        ["service/servicers/interceptors.py"],
        [S + "test_auth_interceptor.py", S + "test_decode_guard.py"],
    ),
    "repository": (
        [f"service/repository/{m}.py" for m in ("core", "records", "loader", "scan")],
        [
            R + "test_repository.py",
            R + "test_repository_records.py",
            R + "test_reload.py",
            R + "test_untrusted_repository.py",
            R + "test_version_policy.py",
            R + "test_cache_settings.py",  # the cache each serving version is given
            # written against this group's survivors (kept beside the behaviour tests above)
            R + "test_repository_loading.py",
            R + "test_repository_scanning.py",
            R + "test_repository_retiring.py",
            R + "test_repository_files.py",
        ],
    ),
}
SKIP = ("__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache", ".pytest_cache")
# group -> seconds a test may take under a mutant (pytest-timeout), for groups whose tests are
# fakes of milliseconds: a mutant that leaves a future unanswered hangs its test, which then
# fails at this limit instead of running into mutmut's, 5x (the tests' time + 1 s) per mutant
GROUP_TEST_TIMEOUT = {"batcher": 2}


def stage(group: str, work: Path | None = None) -> Path:
    """A copy of the package, the tests and pyproject.toml with this group's [tool.mutmut]."""
    modules, tests = GROUPS[group]
    pytest_args = ["-p", "no:cacheprovider"]
    if group in GROUP_TEST_TIMEOUT:
        pytest_args += ["--timeout", str(GROUP_TEST_TIMEOUT[group])]
    # a test file moved or renamed must not silently shrink a group (mutants would survive)
    missing = [t for t in tests if not (ROOT / t).is_file()]
    if missing:
        raise SystemExit(f"mutation group {group!r} names missing test files: {missing}")
    work = work or OUT / group
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # symlinks=False: the symlink textserve/service (to service/) becomes a real folder, as in
    # the wheel
    shutil.copytree(ROOT / "textserve", work / "textserve", ignore=shutil.ignore_patterns(*SKIP))
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns(*SKIP))

    def quoted(items: Iterable[str]) -> str:
        return ", ".join(f'"{item}"' for item in items)

    config = (ROOT / "pyproject.toml").read_text(encoding="utf-8") + (
        "\n[tool.mutmut]\n"
        f"source_paths = [{quoted('textserve/' + m for m in modules)}]\n"
        'also_copy = ["textserve"]\n'
        f"pytest_add_cli_args_test_selection = [{quoted(tests)}]\n"
        f"pytest_add_cli_args = [{quoted(pytest_args)}]\n"
        # a hung mutant (a loop that never ends) is a kill: waited for 5x the tests' time, not 15x
        "timeout_multiplier = 5.0\n"
    )
    (work / "pyproject.toml").write_text(config, encoding="utf-8")
    return work


MUTMUT = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())"]
ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def _mutate(work: Path, log: Path, args: list[str]) -> None:
    """`mutmut run ARGS` in the staged folder `work`, its output in `log`."""
    with log.open("w") as out:
        cmd = [*MUTMUT, "run", *args]
        subprocess.run(cmd, cwd=work, env=ENV, stdout=out, stderr=subprocess.STDOUT, check=False)


def _statuses(work: Path) -> dict[str, str]:
    """mutant name -> status (killed, survived, timeout, ...) of the runs made in `work`."""
    listing = subprocess.run(
        [*MUTMUT, "results", "--all", "true"], cwd=work, env=ENV, capture_output=True, text=True
    ).stdout
    return dict(re.findall(r"^\s+(\S+): (.+)$", listing, flags=re.M))


def run(group: str, children: int, *, execute: bool = True) -> dict[str, Any]:
    """Mutate one group (execute=False: only collect a finished run's results); its statuses
    and survivors' diffs, also kept in <group>.json."""
    work = OUT / group
    if execute:
        stage(group)
        _mutate(work, OUT / f"{group}.log", ["--max-children", str(children)])
    statuses = _statuses(work)
    left = [n for n, status in statuses.items() if status not in DETECTED]
    # (nearly) every mutant left: the run itself failed (its log says why), no diffs for them
    failed_run = len(left) > 0.9 * len(statuses)
    diffs = {} if failed_run else _diffs(work, left)
    result = {"statuses": statuses, "diffs": diffs}
    (OUT / f"{group}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


_DIFFS = """
import json, sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant
names = json.load(sys.stdin)
print(json.dumps({n: get_diff_for_mutant(n, path=find_mutant(n).path) for n in names}))
"""


def _diffs(work: Path, names: list[str]) -> dict[str, str]:
    """`mutmut show` of each mutant, in one process (a process each takes minutes)."""
    if not names:
        return {}
    done = subprocess.run(
        [sys.executable, "-c", _DIFFS],
        cwd=work, env=ENV, input=json.dumps(names), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {name: diff.strip() for name, diff in json.loads(done.stdout).items()}


# killed: a test failed; timeout: the tests hung (a loop that never ends), a detection too
DETECTED = ("killed", "timeout", "caught by type check")


def rerun(group: str, patterns: list[str], children: int, workdir: str) -> int:
    """Stage the group afresh in build/mutation/<workdir>/ and run only the mutants matching
    the patterns (mutmut's fnmatch names, e.g. '*core.xǁModelRepositoryǁ_drain__mutmut_*');
    print each one's status. The group's full results and the report are left as they were."""
    work = stage(group, OUT / workdir)
    _mutate(work, OUT / f"{workdir}.log", ["--max-children", str(children), *patterns])
    statuses = _statuses(work)
    chosen = {n: st for n, st in statuses.items() if any(fnmatch(n, p) for p in patterns)}
    for name, status in sorted(chosen.items()):
        print(f"{status:12} {name}")
    left = sorted(n for n, status in chosen.items() if status not in DETECTED)
    print(f"{len(chosen) - len(left)} of {len(chosen)} detected; log: {OUT / workdir}.log")
    return 0 if chosen else 1


def report(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: the kill rate per module, then every mutant not detected with its diff."""
    lines = [
        "# Mutation report (`make mutate`, mutmut)",
        "",
        "Kill rate = (killed + timeout) / mutants. Equivalent survivors, with why: "
        "tests/mutation/README.md.",
        "",
        "| module | mutants | killed | timeout | survived | other | kill rate |",
        "|---|---|---|---|---|---|---|",
    ]
    survivors: list[tuple[str, str, str]] = []
    for result in results.values():
        per_module: dict[str, Counter[str]] = {}
        for name, status in result["statuses"].items():
            module = re.sub(r"\.x[ǁ_].*$", "", name)
            per_module.setdefault(module, Counter())[status] += 1
        for module, counts in sorted(per_module.items()):
            total = sum(counts.values())
            killed, timeout, survived = counts["killed"], counts["timeout"], counts["survived"]
            other = total - killed - timeout - survived
            rate = 100 * (killed + timeout) / total
            row = (module, total, killed, timeout, survived, other, f"{rate:.1f}%")
            lines.append("| " + " | ".join(map(str, row)) + " |")
        survivors += [(n, result["statuses"][n], d) for n, d in result["diffs"].items()]
    lines += ["", "## Not detected (survived, no tests, suspicious)", ""]
    for name, status, diff in survivors:
        lines += [f"### {name} ({status})", "", "```diff", diff, "```", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("groups", nargs="*", metavar="GROUP", help=f"of {', '.join(GROUPS)}")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--only",
        action="append",
        metavar="PATTERN",
        help="rerun only the mutants matching these names (fnmatch) of one group, in a "
        "separate staging folder (--workdir); the group's results are left as they were",
    )
    parser.add_argument(
        "--workdir", help="with --only: build/mutation/<WORKDIR> (default: <group>-only)"
    )
    parser.add_argument(
        "--collect", action="store_true", help="only read the results of runs already made"
    )
    args = parser.parse_args()
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        parser.error(f"unknown group(s) {sorted(unknown)}; expected some of {', '.join(GROUPS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    if args.only:
        if len(args.groups) != 1:
            parser.error("--only reruns mutants of exactly one group")
        group = args.groups[0]
        return rerun(group, args.only, args.max_children, args.workdir or f"{group}-only")
    for group in args.groups or list(GROUPS):
        run(group, args.max_children, execute=not args.collect)
    # the report covers every group run so far (one at a time, or all at once)
    results = {
        group: json.loads((OUT / f"{group}.json").read_text(encoding="utf-8"))
        for group in GROUPS
        if (OUT / f"{group}.json").exists()
    }
    text = report(results)
    (OUT / "report.md").write_text(text, encoding="utf-8")
    print(text.split("\n## ")[0])
    print(f"full report: {OUT / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
