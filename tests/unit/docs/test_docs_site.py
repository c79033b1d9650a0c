"""The documentation site builds with `mkdocs build --strict`: a broken link or anchor, a page
the nav names that does not exist, or a generated part that cannot be made fails here.

The build runs in a child process (MkDocs as `make docs` runs it) into a temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "Serve transformer text classifiers over gRPC" in home
    # the generated parts were made: the manifest's fields, the dashboard's queries, the bench
    manifest = (tmp_path / "site" / "reference" / "manifest" / "index.html").read_text("utf-8")
    assert "source_checkpoint_sha256" in manifest and "generated:" not in manifest
    dashboard = (tmp_path / "site" / "dashboard" / "index.html").read_text("utf-8")
    assert "textserve_requests_total" in dashboard
    metrics = (tmp_path / "site" / "metrics" / "index.html").read_text("utf-8")
    assert "textserve_inflight_texts" in metrics and "textserve_worker_restarts_total" in metrics
    assert (tmp_path / "site" / "assets" / "bench" / "textserve_bench.png").is_file()


def _pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _pages(value)]
    if isinstance(nav, list):
        return [page for item in nav for page in _pages(item)]
    return []


def test_every_page_is_in_the_nav_once() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text("utf-8"))
    pages = _pages(config["nav"])
    assert len(pages) == len(set(pages)), sorted(p for p in pages if pages.count(p) > 1)
    written = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    missing = sorted(written - set(pages))  # MkDocs itself only mentions them
    assert not missing, (
        f"pages nobody reaches from the site's menu: add them to mkdocs.yml's nav: {missing}"
    )


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    # The same site with one link broken: --strict must refuse it (the check can fail).
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(docs)], check=True)
    page = docs / "getting-started.md"
    page.write_text(page.read_text("utf-8") + "\nSee [nothing](no-such-page.md).\n", "utf-8")
    config = tmp_path / "mkdocs.yml"
    text = (ROOT / "mkdocs.yml").read_text("utf-8")
    text = text.replace("docs_dir: docs", f"docs_dir: {docs}")
    text = text.replace("  - docs/hooks.py", f"  - {ROOT / 'docs' / 'hooks.py'}")
    config.write_text(text, "utf-8")
    result = _build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr
