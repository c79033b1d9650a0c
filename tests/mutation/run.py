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
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "mutation"

U = "tests/unit/service/"
# group -> (modules under textserve/, the tests that cover them: unit tests, fast and forkable)
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "batcher": (["service/engine/batcher.py"], [U + "test_batcher.py"]),
    "oip_codec": (["service/servicers/oip_codec.py"], [U + "test_oip_codec.py"]),
    "status": (
        ["service/servicers/status.py"],
        [U + "test_serving_edges.py", U + "test_request_text.py", U + "test_status_table.py"],
    ),
    "publish": (
        ["export/publish.py"],
        ["tests/unit/export/test_export_repository.py", "tests/unit/export/test_publish.py"],
    ),
    "interceptors": (["service/servicers/interceptors.py"], [U + "test_security.py"]),
    "repository": (
        ["service/repository/core.py", "service/repository/loader.py", "service/repository/scan.py"],
        [
            U + "test_repository.py",
            U + "test_reload.py",
            U + "test_untrusted_repository.py",
            U + "test_version_policy.py",
        ],
    ),
}
SKIP = ("__pycache__", "*.pyc", ".mypy_cache", ".ruff_cache", ".pytest_cache")


def stage(group: str) -> Path:
    """A copy of the package, the tests and pyproject.toml with this group's [tool.mutmut]."""
    modules, tests = GROUPS[group]
    work = OUT / group
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # symlinks=False: textserve/service -> ../service becomes a real folder, as in the wheel
    shutil.copytree(ROOT / "textserve", work / "textserve", ignore=shutil.ignore_patterns(*SKIP))
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns(*SKIP))
    tests = [t for t in tests if (ROOT / t).exists()]
    quoted = lambda xs: ", ".join(f'"{x}"' for x in xs)  # noqa: E731
    config = (ROOT / "pyproject.toml").read_text(encoding="utf-8") + (
        "\n[tool.mutmut]\n"
        f"source_paths = [{quoted('textserve/' + m for m in modules)}]\n"
        'also_copy = ["textserve"]\n'
        f"pytest_add_cli_args_test_selection = [{quoted(tests)}]\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        # a hung mutant (a loop that never ends) is a kill: waited for 5x the tests' time, not 15x
        "timeout_multiplier = 5.0\n"
    )
    (work / "pyproject.toml").write_text(config, encoding="utf-8")
    return work


def run(group: str, children: int) -> dict[str, object]:
    work = stage(group)
    mutmut = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    log = OUT / f"{group}.log"
    with log.open("w") as out:
        cmd = [*mutmut, "run", "--max-children", str(children)]
        subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    listing = subprocess.run(
        [*mutmut, "results", "--all", "true"], cwd=work, env=env, capture_output=True, text=True
    ).stdout
    statuses = dict(re.findall(r"^\s+(\S+): (.+)$", listing, flags=re.M))
    per_module: dict[str, dict[str, int]] = {}
    for name, status in statuses.items():
        module = name.split(".x")[0].split(".x_")[0]
        module = re.sub(r"\.x[ǁ_].*$", "", name)
        per_module.setdefault(module, {}).setdefault(status, 0)
        per_module[module][status] += 1
    survivors = {n: s for n, s in statuses.items() if s not in ("killed", "caught by type check")}
    if len(survivors) > 200:  # the run failed (its log says why): no diffs for hundreds of mutants
        return {"per_module": per_module, "survivors": survivors, "diffs": {}}
    diffs = {
        n: subprocess.run(
            [*mutmut, "show", n], cwd=work, env=env, capture_output=True, text=True
        ).stdout
        for n in survivors
    }
    return {"per_module": per_module, "survivors": survivors, "diffs": diffs}


def report(results: dict[str, dict[str, object]]) -> str:
    lines = ["# Mutation report (`make mutate`, mutmut)", "", "| module | mutants | killed | "
             "survived | other | kill rate |", "|---|---|---|---|---|---|"]  # fmt: skip
    for result in results.values():
        for module, counts in sorted(result["per_module"].items()):  # type: ignore[attr-defined]
            total = sum(counts.values())
            killed = counts.get("killed", 0)
            survived = counts.get("survived", 0)
            rate = f"{100 * killed / total:.1f}%" if total else "-"
            lines.append(
                f"| {module} | {total} | {killed} | {survived} | {total - killed - survived} | {rate} |"
            )
    lines += ["", "## Survivors (and mutants not killed: timeout, no tests, suspicious)", ""]
    for result in results.values():
        for name, diff in result["diffs"].items():  # type: ignore[attr-defined]
            lines += [f"### {name} ({result['survivors'][name]})", "", "```diff", diff.strip(), "```", ""]  # type: ignore[index]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", choices=[[], *GROUPS], default=list(GROUPS))
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    groups = args.groups or list(GROUPS)
    OUT.mkdir(parents=True, exist_ok=True)
    results = {g: run(g, args.max_children) for g in groups}
    text = report(results)
    (OUT / "report.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
