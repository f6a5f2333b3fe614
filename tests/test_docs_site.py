"""The documentation site builds with ``mkdocs build --strict``: a broken link or anchor, a page
left out of the nav, a missing snippet or an API reference griffe cannot read fails the build.
The API reference reads as a reader expects: no Sphinx role left as text, each estimator's
methods on its own page, public bases, parameter types, signatures that fit the page."""

import html
import importlib.util
import os
import re
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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, str]:
    """The site built once for this module: its folder and the build's log (stderr)."""
    folder = tmp_path_factory.mktemp("docs") / "site"
    done = build(ROOT / "mkdocs.yml", folder, ROOT)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0, "mkdocs build --strict:\n" + "\n".join(warnings or [done.stderr])
    return folder, done.stderr


def api_pages(folder: Path) -> dict[str, str]:
    """The API reference's pages by name (``detectors``), as HTML."""
    pages = sorted((folder / "api").glob("**/index.html"))
    return {page.parent.name: page.read_text() for page in pages}


def text(fragment: str) -> str:
    """An HTML fragment's text."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_the_site_builds_strict(site):
    folder, _ = site
    for page in ("index.html", "papers/fedgmm/index.html", "api/detectors/index.html"):
        assert (folder / page).exists(), page
    assert "FedGMMDetector" in (folder / "api" / "detectors" / "index.html").read_text()


#: a Sphinx role as a page shows it once Markdown has read it (``:class:<code>...``).
SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):(?:<code>|`)")


def test_the_api_reference_shows_no_sphinx_role_and_links_the_documented_objects(site):
    """The docstrings' Sphinx roles become cross-references (docs/_griffe_fednovelty.py): none
    is left as text, and a role naming a documented object is a link to it."""
    pages = api_pages(site[0])
    left = {name: len(SPHINX_ROLE.findall(page)) for name, page in pages.items()}
    assert sum(left.values()) == 0, left
    detectors = pages["detectors"]
    # fednovelty/detectors/options.py's module docstring: ":class:`Privacy` (``privacy=``)".
    assert re.search(
        r'<a class="autorefs autorefs-internal"[^>]*href="#fednovelty\.detectors\.'
        r'Privacy"[^>]*><code>Privacy</code></a>',
        detectors,
    ), "no link to Privacy"


def _extension():
    spec = importlib.util.spec_from_file_location(
        "_griffe_fednovelty", ROOT / "docs" / "_griffe_fednovelty.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_role_conversion_resolves_names_where_python_would():
    """Absolute, ``~``-shortened, relative and explicit-title roles; a name that resolves to
    nothing keeps its text as inline code (an optional cross-reference)."""
    pytest.importorskip("griffe")
    convert = _extension().convert_roles
    owner = "fednovelty.detectors.fedgmm.FedGMMDetector.fit"
    assert convert(":class:`~fednovelty.Privacy`", owner) == (
        '<autoref identifier="fednovelty.detectors.options.Privacy" optional>`Privacy`</autoref>'
    )
    assert convert(":meth:`fit`", owner).startswith('<autoref identifier="fednovelty.detectors.')
    assert ">`fit`<" in convert(":meth:`fit`", owner)
    assert convert(":mod:`the detectors <fednovelty.detectors>`", owner) == (
        '<autoref identifier="fednovelty.detectors" optional>`the detectors`</autoref>'
    )
    assert convert(":attr:`weights_`", owner) == (
        '<autoref identifier="weights_" optional>`weights_`</autoref>'
    )
    assert convert("no role: ``a``", owner) == "no role: ``a``"


def _section(page: str, anchor: str) -> str:
    """The HTML of one object's section: from its heading to the next heading of its level."""
    start = page.index(f'id="{anchor}"')
    level = page[page.rindex("<h", 0, start) + 2]
    end = page.find(f"<h{level} ", start)
    return page[start : end if end > 0 else len(page)]


def test_each_estimator_lists_the_methods_a_user_calls_and_public_bases(site):
    """FedGMMDetector's section holds fit, predict, save, ... (defined on its bases), and no
    class on any API page names a private base (``_em_detector.EMDetector``)."""
    pages = api_pages(site[0])
    section = _section(pages["detectors"], "fednovelty.detectors.FedGMMDetector")
    methods = set(re.findall(r'id="fednovelty\.detectors\.FedGMMDetector\.(\w+)"', section))
    expected = {"fit", "predict", "predict_proba", "decision_function", "score_samples", "save"}
    assert expected <= methods, sorted(expected - methods)
    bases = re.search(r'class="doc doc-class-bases">(.*?)</p>', section, re.S)
    assert bases and "fednovelty.detectors.base.MixtureDetector" in text(bases[1])
    for name, page in pages.items():
        for found in re.findall(r'class="doc doc-class-bases">(.*?)</p>', page, re.S):
            private = [path for path in text(found).split(",") if "._" in path.strip()]
            assert not private, (name, private)


def test_signatures_show_types_and_fit_the_page(site):
    """Parameter types in the signatures and the tables (the estimators' from their
    scikit-learn constraints), and every callable's signature formatted within the configured
    line length (Ruff or Black found: no 'Formatting signatures requires' in the log)."""
    folder, log = site
    assert "Formatting signatures requires" not in log
    pages = api_pages(folder)
    section = _section(pages["detectors"], "fednovelty.detectors.FedGMMDetector")
    signature = text(
        re.search(r'class="doc-signature highlight"><pre>(.*?)</pre>', section, re.S)[1]
    )
    assert "n_components: int = 8" in signature and "privacy: Privacy | None = None" in signature
    table = re.search(r"<th>Type</th>(.*?)</table>", section, re.S)[1]
    row = re.search(r"<code>n_components</code>\s*</td>\s*<td>(.*?)</td>", table, re.S)
    assert row and text(row[1]).strip() == "int"
    options = yaml.safe_load(
        (ROOT / "mkdocs.yml").read_text().split("\nnav:")[0].split("plugins:")[1]
    )
    limit = options[1]["mkdocstrings"]["handlers"]["python"]["options"]["line_length"]
    wide = []
    for name, page in pages.items():
        for block in re.findall(r'class="doc-signature highlight"><pre>(.*?)</pre>', page, re.S):
            lines = text(block).splitlines()
            if re.match(r"\w+\(", lines[0]) and max(map(len, lines)) > limit:
                wide.append((name, lines[0][:60]))
    assert not wide, wide


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
