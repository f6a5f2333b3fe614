"""The README is a front door: short, its quickstart runs, its links and its table hold."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: history wording that belongs in commit messages, not in product text.
HISTORY = re.compile(r"(?<!upstream )(?<!its )\bissue[\s-]*#?\d+|\bthis session\b|\(issue\b", re.I)
#: product text: the pages, every module's docstrings, comments and printed text, and the
#: reports the benchmarks wrote (read under benchmarks/, not again through docs/figures, the
#: site's link to them).
PRODUCT_TEXT = [
    README,
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "figures" not in p.relative_to(ROOT).parts),
    *sorted(
        path
        for folder in ("fednovelty", "app", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
    ),
    *sorted(path for ext in ("md", "txt") for path in (ROOT / "benchmarks").rglob(f"*.{ext}")),
]


def test_quickstart_runs(tmp_path, monkeypatch, capsys):
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python code block"
    quickstart = blocks[0]
    assert len([line for line in quickstart.splitlines() if line.strip()]) <= 12
    monkeypatch.chdir(tmp_path)
    exec(compile(quickstart, "README quickstart", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[") and "True" in out[0]
    assert (tmp_path / "model.safetensors").exists()


def test_the_readme_is_short_and_has_one_quickstart():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert len(re.findall(r"```python\n", text)) == 1


def test_the_two_setup_commands_are_the_makefile_targets():
    setup = README.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    (commands,) = re.findall(r"```bash\n(.*?)```", setup, flags=re.S)
    assert [line.split("#")[0].strip() for line in commands.strip().splitlines()] == [
        "make demo",
        "make test",
    ]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, flags=re.M) and re.search(r"^test:", makefile, flags=re.M)


@pytest.mark.parametrize("page", PRODUCT_TEXT, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_or_history_in_product_text(page):
    found = [m.group(0) for m in HISTORY.finditer(page.read_text())]
    assert not found, f"{page.relative_to(ROOT)} says {found}: say what the code does instead"


def test_the_which_detector_table_names_every_public_estimator():
    """Every estimator class the package exports (its option objects are no estimators),
    base classes of the others aside."""
    import inspect

    import fednovelty

    section = README.read_text().split("## Which detector", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)`", section, flags=re.M))
    classes = [getattr(fednovelty, name) for name in fednovelty.__all__]
    classes = [c for c in classes if inspect.isclass(c) and hasattr(c, "fit")]
    bases = {c for c in classes if any(c is not d and issubclass(d, c) for d in classes)}
    assert listed == {c.__name__ for c in classes if c not in bases}


def test_the_readme_links_point_at_files():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links no page"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing


def test_the_benchmarks_readme_links_every_script_to_a_page():
    """One line per script under benchmarks/, each with links that point at files."""
    folder = ROOT / "benchmarks"
    text = (folder / "README.md").read_text()
    lines = {m.group(1): m.group(0) for m in re.finditer(r"^- `(\w+\.py)`.*$", text, flags=re.M)}
    listed = {name for line in lines.values() for name in re.findall(r"`(\w+\.py)`", line)}
    assert listed == {p.name for p in folder.glob("*.py")}
    for line in lines.values():
        targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", line)
        assert all((folder / target).exists() for target in targets), line
