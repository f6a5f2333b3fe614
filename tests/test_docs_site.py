"""The documentation site builds with ``mkdocs build --strict``: a broken link or anchor, a page
left out of the nav, a missing snippet or an API reference griffe cannot read fails the build."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra")

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def build(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)]
    return subprocess.run(
        [*command, "-d", str(site)], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300
    )


def test_the_site_builds_strict(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site", ROOT)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0, "mkdocs build --strict:\n" + "\n".join(warnings or [done.stderr])
    site = tmp_path / "site"
    for page in ("index.html", "papers/fedgmm/index.html", "api/detectors/index.html"):
        assert (site / page).exists(), page
    assert "FedGMMDetector" in (site / "api" / "detectors" / "index.html").read_text()


def test_the_site_settings_turn_a_broken_link_into_a_failure(tmp_path):
    """The validation settings of mkdocs.yml, on a one-page site with a link to a missing
    page: the strict build fails and names the link."""
    settings = yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nmarkdown_extensions:")[0])
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the scoreboard](scoreboard.md).\n")
    config = {
        "site_name": "t",
        "docs_dir": str(docs),
        "validation": settings["validation"],
        "nav": [{"Home": "index.md"}],
    }
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site", tmp_path)
    assert done.returncode != 0 and "scoreboard.md" in done.stderr
