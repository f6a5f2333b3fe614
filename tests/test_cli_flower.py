"""``fednovelty flower new DIR``: writes the package's Flower app template into a new or empty
folder, and refuses anything else with one line (exit status 2) and nothing written."""

from __future__ import annotations

import pytest

from fednovelty._cli.flower import TEMPLATE, TEMPLATE_FILES
from fednovelty.cli import main


def test_new_writes_the_template_into_a_new_folder(tmp_path, capsys):
    folder = tmp_path / "my-app"
    assert main(["flower", "new", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(TEMPLATE_FILES)
    for name in TEMPLATE_FILES:
        assert (folder / name).read_bytes() == (TEMPLATE / name).read_bytes(), name
    out = capsys.readouterr().out
    assert f"wrote a Flower app to {folder}" in out and "flwr run ." in out


def test_new_fills_an_empty_folder(tmp_path):
    assert main(["flower", "new", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(TEMPLATE_FILES)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: (p.mkdir(), (p / "mine.txt").write_text("keep")), "is not empty"),
        (lambda p: p.write_text("keep"), "exists and is not a folder"),
        (lambda p: None, "its parent folder does not exist"),
    ],
    ids=["non-empty folder", "a file", "no parent"],
)
def test_new_refuses_what_it_would_write_over(tmp_path, capsys, make, message):
    target = tmp_path / "app"
    make(target)
    if message.startswith("its parent"):
        target = tmp_path / "missing" / "app"
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert main(["flower", "new", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fednovelty: error: {target}") and message in err
    assert err.count("\n") == 1  # one line, no traceback
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    if (tmp_path / "app" / "mine.txt").exists():
        assert (tmp_path / "app" / "mine.txt").read_text() == "keep"


def test_flower_needs_a_subcommand(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["flower"])
    assert stop.value.code == 2
    assert "new" in capsys.readouterr().err
