"""docs/contributing.md, walked: its blocks added to a copy of the repository make a working
algorithm and detector, and change no file outside the four places.

The page's blocks carry their destination in their fence title (the page states the
convention): a path alone is a new file; ``<path>: <table> row`` a row of a table of an
existing file (a Python literal assigned to ``<table>``, a ``mkdocs.yml`` list under the key
``<table>``, the table of a Markdown section headed ``<table>``); ``<path>: imports`` an
import line, put among the file's imports in sorted order. ``test_the_walk`` copies the
repository's files (``git ls-files``: tracked and untracked but not ignored, read from the
working tree), applies every block, compares the copy with the tree, and then, with the copy
first on ``PYTHONPATH``: fits the detector on four small clients against NumPy/SciPy on the
pooled rows, finds the algorithm and the method in their registries and the CLI, saves the
detector and loads it in a fresh process, has the server gate drop a forged ``gaussian`` reply
by its own check, runs the private form, and runs the page's new tests and the tests that
read the registries (every one passes: nothing else had to change). The probes show each check
can fail.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "contributing.md"
#: a fenced block with a title: its fence (three or more backticks), language, title, body.
TITLED = re.compile(
    r'^(?P<fence>`{3,})(?P<lang>\w+) title="(?P<title>[^"]+)"[ \t]*\n'
    r"(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.M | re.S,
)
#: where each place's files may lie (the page's ``## N.`` sections, in order).
PLACES = {
    1: ("fednovelty/federated/",),
    2: ("fednovelty/detectors/", "fednovelty/methods.py"),
    3: ("tests/",),
    4: ("docs/", "mkdocs.yml", "README.md"),
}
#: the tests that check the registries' known entries (in order, a new one may stand between):
#: a new entry must leave them passing.
REGISTRY_CHECKS = [
    "tests/test_methods.py::test_names_by_task_kind_and_variant",
    "tests/test_methods.py::test_unknown_names_and_parameters_are_refused_with_the_closest",
    "tests/evaluation/test_benchmark.py::test_methods_come_from_the_registry",
    "tests/federated/core/test_config.py::test_the_registry_names_what_it_cannot_build",
]
#: the tests that read the registries (besides the page's own) run in the copy.
REGISTRY_TESTS = [
    *REGISTRY_CHECKS,
    "tests/federated/test_registry.py",
    "tests/federated/trust/test_liar_property.py::test_every_registered_algorithm_has_a_case",
    "tests/federated/trust/test_liar_property.py::"
    "test_a_liar_never_crashes_a_fit_with_an_unnamed_error[FederatedGaussian]",
    "tests/federated/trust/test_client_gate_property.py::"
    "test_every_registered_algorithm_and_every_kind_it_answers_is_covered",
    "tests/federated/trust/test_client_gate_property.py::"
    "test_a_hostile_broadcast_obtains_nothing_below_the_floor[gaussian-gaussian]",
    "tests/detectors/test_cuda_lane.py::test_the_lane_covers_every_method_with_a_device",
    *(
        f"tests/detectors/{test}[FedGaussian]"
        for test in (
            "test_atomic_fit.py::test_a_failed_refit_keeps_the_previous_model_exactly",
            "test_atomic_fit.py::test_a_failed_first_fit_leaves_the_estimator_unfitted",
            "test_finite_inputs.py::test_fit_refuses_a_value_whose_square_overflows",
            "test_finite_inputs.py::test_scoring_refuses_a_value_whose_square_overflows",
            "test_finite_inputs.py::"
            "test_rows_near_the_limit_are_refused_by_name_or_scored_without_nan",
        )
    ),
    "tests/test_docs.py::test_benchmarks_page_lists_the_registry",
    "tests/test_readme.py::test_the_which_detector_table_names_every_public_estimator",
]


@dataclass(frozen=True)
class Block:
    """One titled block of the page: the place (``## N.`` section) it is in, its file, the
    table it is a row of (``None``: a new file; ``"imports"``: an import line) and its text."""

    place: int
    path: str
    table: str | None
    text: str


def page_blocks(text: str) -> list[Block]:
    """The titled blocks of ``text`` in order, each with the number of its section."""
    starts = [(m.start(), int(m.group(1))) for m in re.finditer(r"^## (\d+)\. ", text, re.M)]
    others = [m.start() for m in re.finditer(r"^## (?!\d+\. )", text, re.M)]
    blocks = []
    for match in TITLED.finditer(text):
        before = [(at, n) for at, n in starts if at < match.start()]
        later = [at for at in others if before and before[-1][0] < at < match.start()]
        place = before[-1][1] if before and not later else 0
        path, _, rest = match.group("title").partition(": ")
        table = None
        if rest:
            table = "imports" if rest == "imports" else rest.removesuffix(" row")
            if table != "imports" and not rest.endswith(" row"):
                raise ValueError(f"block title {match.group('title')!r}: '<table> row' expected")
        blocks.append(Block(place, path, table, match.group("body")))
    return blocks


# ----------------------------------------------------------------------------- applying rows
def _python_row(lines: list[str], table: str, row: list[str]) -> list[str]:
    """``row`` before the closing bracket (at the line's start) of the literal that top-level
    name ``table`` is assigned."""
    head = re.compile(rf"^{re.escape(table)}\b[^=\n]*=\s*[(\[{{]\s*$")
    start = next((i for i, line in enumerate(lines) if head.match(line)), None)
    if start is None:
        raise ValueError(f"no table {table!r} (a literal assigned at the top level)")
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"^[)\]}]", lines[i]))
    return lines[:end] + row + lines[end:]


def _import_row(lines: list[str], row: list[str]) -> list[str]:
    """Each import line of ``row`` among the top-level ``from`` imports of its package, in
    sorted order of the module."""
    for line in row:
        module = line.split()[1]
        package = module.split(".")[0]
        entries = [
            i for i, x in enumerate(lines) if x.startswith(f"from {package}") and " import " in x
        ]
        if not entries:
            raise ValueError(f"no import from {package!r} to put {line!r} among")
        after = [i for i in entries if lines[i].split()[1] > module]
        if after:
            at = after[0]
        else:  # after the last entry's statement (its closing parenthesis)
            at = entries[-1]
            if lines[at].rstrip().endswith("("):
                at = next(i for i in range(at, len(lines)) if lines[i].startswith(")"))
            at += 1
        lines = [*lines[:at], line, *lines[at:]]
    return lines


def _yaml_row(lines: list[str], table: str, row: list[str]) -> list[str]:
    """``row`` after the last line of the block under the key ``table``."""
    head = re.compile(rf"^(\s*)(?:- )?{re.escape(table)}:\s*$")
    start = next((i for i, line in enumerate(lines) if head.match(line)), None)
    if start is None:
        raise ValueError(f"no key {table!r}")
    indent = len(head.match(lines[start]).group(1))
    end = start
    for i in range(start + 1, len(lines)):
        if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent:
            break
        if lines[i].strip():
            end = i
    return lines[: end + 1] + row + lines[end + 1 :]


def _markdown_row(lines: list[str], table: str, row: list[str]) -> list[str]:
    """``row`` after the last row of the first table in the section headed ``table``."""
    start = next(
        (i for i, x in enumerate(lines) if re.match(rf"^#+ {re.escape(table)}\s*$", x)), None
    )
    if start is None:
        raise ValueError(f"no section headed {table!r}")
    first = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("|"))
    end = first
    while end + 1 < len(lines) and lines[end + 1].startswith("|"):
        end += 1
    return lines[: end + 1] + row + lines[end + 1 :]


def apply(block: Block, tree: Path) -> None:
    """Write ``block`` into the repository copy ``tree``.

    Raises:
        ValueError: a new file that exists, a row for a file or table that does not.
    """
    target = tree / block.path
    if block.table is None:
        if target.exists():
            raise ValueError(f"{block.path} exists; a block titled by a path alone is a new file")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text)
        return
    if not target.is_file():
        raise ValueError(f"{block.path}: no such file for a {block.table!r} row")
    lines = target.read_text().splitlines()
    row = block.text.rstrip("\n").splitlines()
    if block.table == "imports":
        lines = _import_row(lines, row)
    elif target.suffix == ".py":
        lines = _python_row(lines, block.table, row)
    elif target.suffix in (".yml", ".yaml"):
        lines = _yaml_row(lines, block.table, row)
    elif target.suffix == ".md":
        lines = _markdown_row(lines, block.table, row)
    else:
        raise ValueError(f"{block.path}: no rows in a {target.suffix} file")
    target.write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- the copy
def repository_files() -> list[str]:
    """The repository's files (tracked, and untracked but not ignored) that exist."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({p for p in listed.split("\0") if p and (ROOT / p).is_file()})


def copy_repository(tree: Path, files: list[str]) -> dict[str, str]:
    """Copy ``files`` into ``tree``; the digest of each file as copied (the tree may change
    while the walk runs: other edits are not the walk's)."""
    digests = {}
    for name in files:
        data = (ROOT / name).read_bytes()
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests


def changed_files(tree: Path, copied: dict[str, str]) -> set[str]:
    """The files of ``tree`` that differ from those copied into it, or that it lacks."""
    changed = set()
    for path in tree.rglob("*"):
        if path.is_file():
            name = path.relative_to(tree).as_posix()
            if copied.get(name) != hashlib.sha256(path.read_bytes()).hexdigest():
                changed.add(name)
    return changed | {name for name in copied if not (tree / name).is_file()}


def places_problems(blocks: list[Block], changed: set[str]) -> list[str]:
    """What breaks the rule of four places: a block outside a place's section, a file outside
    its place's folders, a changed file no block names (or a named one unchanged)."""
    problems = [f"{b.path}: not in one of the four places" for b in blocks if b.place not in PLACES]
    problems += [
        f"{b.path}: in place {b.place}, outside {PLACES[b.place]}"
        for b in blocks
        if b.place in PLACES and not b.path.startswith(PLACES[b.place])
    ]
    named = {b.path for b in blocks}
    problems += [f"{name}: changed, but no block names it" for name in sorted(changed - named)]
    problems += [f"{name}: named, but unchanged" for name in sorted(named - changed)]
    return problems


def run_python(tree: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python *args`` in ``tree`` with ``tree`` first on ``PYTHONPATH``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: run in the copy: the detector against the pooled rows, both registries and the CLI, a
#: save, the server gate's own check, the private form.
CHECKS = """
import sys
import numpy as np
import torch
from scipy.stats import norm

import fednovelty
from fednovelty.cli import build_parser, fit_methods
from fednovelty.federated import Message
from fednovelty.federated.registry import ALGORITHMS, algorithm_settings, build_algorithm
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.methods import METHODS
from fednovelty.runtime import run_simulation

assert fednovelty.__file__.startswith(sys.argv[1]), fednovelty.__file__
assert "FederatedGaussian" in ALGORITHMS, "the algorithm is not in the algorithm registry"
cls = ALGORITHMS["FederatedGaussian"]
assert cls.__module__ == "fednovelty.federated.mixtures.gaussian"
build_algorithm("FederatedGaussian", algorithm_settings(cls(reg_covar=1e-3)))
assert "FedGaussian" in METHODS and "FedGaussian" in fit_methods(), "not in the method table"
build_parser().parse_args(["fit", "x.csv", "--method", "FedGaussian", "--out", "m"])

rng = np.random.default_rng(3)
X = rng.normal([1.0, -2.0, 4.0], [0.5, 2.0, 1.0], size=(160, 3))
groups = np.repeat(np.arange(4), 40)
detector = METHODS["FedGaussian"].build(random_state=0).fit(X, groups=groups)
expected = norm.logpdf(X, X.mean(0), np.sqrt(X.var(0) + 1e-6)).sum(1)
np.testing.assert_allclose(detector.score_samples(X), expected, rtol=1e-10)
detector.save("walk.safetensors")
np.save("walk_rows.npy", X)
np.save("walk_expected.npy", expected)

forged = Message("gaussian", {"n_samples": torch.tensor(2.5, dtype=torch.float64),
                              "mean": torch.zeros(3, dtype=torch.float64),
                              "m2": torch.ones(3, dtype=torch.float64)})
valid, dropped = ReplyValidator(3, specs=cls().reply_spec).accept(Message("gaussian"), {0: forged})
assert valid == {} and "not a whole count" in dropped[0], dropped

clients = [torch.as_tensor(X[groups == c] / 20) for c in range(4)]
policy = PrivacyPolicy(dp=DPPolicy(1.0, 1.0, "local", 4, insecure_seed=0))
private = cls(dp_mode="local", dp_noise_multiplier=1.0, dp_clip=1.0)
state = run_simulation(private, clients, random_state=0, privacy=policy).state
exact = torch.as_tensor(X / 20).mean(0)
assert not torch.allclose(state.mean, exact) and torch.allclose(state.mean, exact, atol=0.2)
print("checks passed")
"""

#: run in a fresh process: a saved detector loads without importing its module by hand.
LOAD = """
import numpy as np
import fednovelty
loaded = fednovelty.load("walk.safetensors")
np.testing.assert_allclose(
    loaded.score_samples(np.load("walk_rows.npy")), np.load("walk_expected.npy"), rtol=1e-10
)
print(type(loaded).__name__)
"""


def walked(tmp_path: Path, skip: str = "") -> tuple[Path, list[Block], set[str]]:
    """A copy of the repository with the page's blocks applied (but those whose title
    contains ``skip``), and the files that differ from the repository's."""
    blocks = page_blocks(PAGE.read_text())
    tree = tmp_path / "repository"
    copied = copy_repository(tree, repository_files())
    applied = [b for b in blocks if not (skip and skip in f"{b.path}: {b.table} row")]
    for block in applied:
        apply(block, tree)
    return tree, applied, changed_files(tree, copied)


def failed_tests(output: str) -> set[str]:
    return set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.M))


@pytest.mark.slow
def test_the_walk(tmp_path):
    tree, blocks, changed = walked(tmp_path)
    assert {b.place for b in blocks} == set(PLACES)
    assert places_problems(blocks, changed) == []

    checks = run_python(tree, "-c", CHECKS, str(tree))
    assert checks.returncode == 0, checks.stderr[-3000:]
    load = run_python(tree, "-c", LOAD)
    assert load.stdout.split() == ["FedGaussianDetector"], load.stderr[-3000:]

    new_tests = [b.path for b in blocks if b.table is None and b.path.startswith("tests/")]
    assert len(new_tests) == 2
    args = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *new_tests, *REGISTRY_TESTS)
    tests = run_python(tree, *args, timeout=600)
    failed = failed_tests(tests.stdout)
    assert failed == set(), tests.stdout[-4000:]
    assert re.search(r"\b(\d+) passed", tests.stdout), tests.stdout[-2000:]


def test_every_python_block_of_the_page_says_where_it_goes():
    """``tests/test_docs.py`` runs untitled python blocks in the tree; this page has none:
    every one is applied by the walk."""
    text = PAGE.read_text()
    titled = re.findall(r"^`{3,}python title=", text, flags=re.M)
    assert len(re.findall(r"^`{3,}python\b", text, flags=re.M)) == len(titled) >= 4


def test_a_walk_without_the_registry_row_fails_the_registry_check(tmp_path):
    tree, _, changed = walked(tmp_path, skip="BUILTIN_ALGORITHMS")
    assert "fednovelty/federated/registry.py" not in changed
    probe = "from fednovelty.federated.registry import ALGORITHMS\n" + textwrap.dedent(
        """
        assert "FederatedGaussian" in ALGORITHMS, "the algorithm is not in the algorithm registry"
        """
    )
    done = run_python(tree, "-c", probe)
    assert done.returncode != 0 and "not in the algorithm registry" in done.stderr


def test_a_block_outside_the_places_fails_the_places_check():
    blocks = page_blocks(PAGE.read_text())
    named = {b.path for b in blocks}
    stray = Block(2, "fednovelty/cli.py", "COMMANDS", "")
    problems = places_problems([*blocks, stray], named | {"fednovelty/cli.py"})
    assert problems == ["fednovelty/cli.py: in place 2, outside " + str(PLACES[2])]
    assert places_problems(blocks, named | {"fednovelty/cli.py"}) == [
        "fednovelty/cli.py: changed, but no block names it"
    ]


def test_rows_go_into_their_tables_and_a_wrong_title_is_refused(tmp_path):
    (tmp_path / "a.py").write_text(
        "import os\n\nfrom pkg.b import B\nfrom pkg.d import D\n\nTABLE = {\n    1: 2,\n}\n"
    )
    apply(Block(1, "a.py", "TABLE", "    3: 4,\n"), tmp_path)
    apply(Block(1, "a.py", "imports", "from pkg.c import C\n"), tmp_path)
    assert (tmp_path / "a.py").read_text() == (
        "import os\n\nfrom pkg.b import B\nfrom pkg.c import C\nfrom pkg.d import D\n\n"
        "TABLE = {\n    1: 2,\n    3: 4,\n}\n"
    )
    (tmp_path / "m.yml").write_text("nav:\n  - A: a.md\n  - T:\n      - B: b.md\n  - C: c.md\n")
    apply(Block(4, "m.yml", "T", "      - D: d.md\n"), tmp_path)
    assert (tmp_path / "m.yml").read_text().splitlines()[4] == "      - D: d.md"
    (tmp_path / "p.md").write_text("# P\n\n## Rows\n\n| a |\n|---|\n| 1 |\n\ntext\n")
    apply(Block(4, "p.md", "Rows", "| 2 |\n"), tmp_path)
    assert "| 1 |\n| 2 |\n\ntext" in (tmp_path / "p.md").read_text()
    with pytest.raises(ValueError, match="exists"):
        apply(Block(1, "a.py", None, "x = 1\n"), tmp_path)
    with pytest.raises(ValueError, match="no table 'OTHER'"):
        apply(Block(1, "a.py", "OTHER", "    5: 6,\n"), tmp_path)
    with pytest.raises(ValueError, match="'<table> row' expected"):
        page_blocks('## 1. X\n\n```python title="a.py: TABLE"\nx\n```\n')
