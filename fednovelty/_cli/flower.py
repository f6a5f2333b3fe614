"""``fednovelty flower new DIR``: a Flower app of your own, from the template in the package.

The template is package data, ``fednovelty/runtime/flower/app_template/`` (``pyproject.toml``,
``server_app.py``, ``client_app.py``, ``README.md``), found by its path beside this package so
that the command imports neither torch nor Flower. ``DIR`` may be missing (it is created, its
parent must exist) or an empty folder; anything else is refused with a one-line error (exit
status 2), so nothing of the user's is ever written over. ``examples/flower`` in the
repository holds the same files (``tests/runtime/test_flower_app_template.py`` checks it).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from fednovelty._cli.files import UsageError

#: The template's folder and its files, in the order they are written.
TEMPLATE = Path(__file__).resolve().parents[1] / "runtime" / "flower" / "app_template"
TEMPLATE_FILES = ("pyproject.toml", "server_app.py", "client_app.py", "README.md")


def check_target(folder: str | Path) -> Path:
    """``folder`` as the app's folder to write: missing (its parent must be a folder) or an
    empty folder.

    Raises:
        UsageError: ``folder`` is a file or a non-empty folder, or its parent is missing.
    """
    path = Path(folder)
    if path.is_dir():
        if any(path.iterdir()):
            raise UsageError(
                f"{folder} is not empty; give a new or empty folder for the app (nothing in "
                "it was changed)."
            )
        return path
    if path.exists() or path.is_symlink():
        raise UsageError(f"{folder} exists and is not a folder; give a new or empty folder.")
    if not path.absolute().parent.is_dir():
        raise UsageError(f"{folder}: its parent folder does not exist; create it first.")
    return path


def new_app(folder: str | Path) -> list[Path]:
    """Write the Flower app template into ``folder`` (:func:`check_target`); the paths
    written, in :data:`TEMPLATE_FILES`' order."""
    path = check_target(folder)
    missing = [name for name in TEMPLATE_FILES if not (TEMPLATE / name).is_file()]
    if missing:  # a broken installation, not the user's mistake
        raise OSError(f"the installed package lacks its Flower app template files {missing}.")
    path.mkdir(exist_ok=True)
    return [Path(shutil.copyfile(TEMPLATE / name, path / name)) for name in TEMPLATE_FILES]


def _new(args: argparse.Namespace) -> int:
    written = new_app(args.folder)
    print(f"wrote a Flower app to {args.folder}: {', '.join(p.name for p in written)}")
    print(
        f"next: cd {args.folder} && flwr run . --stream --federation-config "
        "'num-supernodes=3' --run-config 'data-path=\"/abs/path/rows.npy\"' "
        "(see its README.md)"
    )
    return 0


def add_parser(sub) -> None:
    """Add ``flower`` and its ``new`` subcommand to the subcommands ``sub``."""
    flower = sub.add_parser("flower", help="Flower apps: write one to run with flwr run")
    actions = flower.add_subparsers(dest="flower_command", required=True)
    new = actions.add_parser(
        "new",
        help="write a Flower app (pyproject.toml, server_app.py, client_app.py, README.md) "
        "whose defaults are FedGenGMMDetector's",
        description="Write a Flower app into FOLDER (new or empty), ready for `flwr run`.",
    )
    new.add_argument("folder", help="the app's folder: new (its parent must exist) or empty")
    new.set_defaults(func=_new)
