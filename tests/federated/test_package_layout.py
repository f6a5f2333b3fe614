"""The algorithm layer reads as a map: short module docstrings that say what the code does
(figures and history live in docs/ and the commit log), settings beside their algorithms
instead of one hub, and no method that skips a class of its hierarchy."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import fednovelty

PACKAGE = Path(fednovelty.__file__).parent
FEDERATED = sorted((PACKAGE / "federated").rglob("*.py"))
#: the longest module docstring of the algorithm layer, in lines.
MOST_DOCSTRING_LINES = 25


def module_docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""


@pytest.mark.parametrize("path", FEDERATED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_docstrings_are_short_and_say_what_the_code_does(path: Path) -> None:
    text = module_docstring(path)
    assert len(text.splitlines()) <= MOST_DOCSTRING_LINES, "move detail to docs/"
    assert not re.search(r"\bissues? \d+|#\d{2,}", text), "issue numbers belong in commits"
    assert not re.search(r"\bmeasured\b", text, re.IGNORECASE), "figures belong in docs/"


def test_no_super_call_skips_a_class() -> None:
    """``super(X, self)`` jumps over X's own method; extract the shared part instead."""
    skipping = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "super"
        and node.args
    ]
    assert skipping == []


def test_the_shared_settings_module_is_no_hub() -> None:
    """``config.py`` holds the settings base and shared field groups only; each algorithm's
    config is defined in the algorithm's module."""
    source = (PACKAGE / "federated" / "core" / "config.py").read_text()
    assert len(source.splitlines()) < 300
    classes = [n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    assert not [name for name in classes if name.endswith("Config")]


def test_the_package_docstring_does_not_promise_what_client_apps_do_not_keep() -> None:
    """Flower ClientApps load scikit-learn (the kNN markers' neighbour search): the package
    docstring must not say they avoid it."""
    text = " ".join((fednovelty.__doc__ or "").split())
    assert not re.search(r"ClientApp[^.]*do not (pay for|load)[^.]*scikit-learn", text)
