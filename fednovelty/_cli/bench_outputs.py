"""The files ``fednovelty bench`` owns in its ``--out`` folder, and how it writes them.

``bench`` writes into a folder that may hold other files, so it writes only files it wrote
itself. Its record of them is a manifest, ``.fednovelty-bench.json`` in the folder
(``{"written_by": "fednovelty bench", "files": [names]}``), rewritten (atomically) after each
file it writes. A file is the bench's if:

- it is named in the manifest, or
- it is ``results.csv`` and holds a bench results table (its header names ``dataset`` and
  ``method``; :func:`~fednovelty.evaluation.results.check_results_file`): the table is its own
  marker, which is what lets a grid run resume from it, or
- the folder has no manifest (written by a version of ``bench`` before the manifest), its
  ``results.csv`` is a bench results table, and the file is recognisably the bench's output:
  ``summary.md`` starting with the summary's heading, a figure name holding a PNG image.

Before any long work, :meth:`BenchOutputs.check` looks at every entry of the folder with a name
the bench writes (``OUTPUTS``: ``results.csv``, ``summary.md``, the figures' name patterns) and
refuses, by name, one that is not the bench's or not a regular file (``os.lstat``: a symbolic
link, a FIFO, a device or a folder is never replaced); the message says to remove it or choose
another ``--out``. A name matching a figure pattern that this run would not write is refused
too: simpler than predicting the figures, and such a name in the folder is almost surely a
figure of an earlier run (then it is the bench's and accepted) or a mistake worth naming. Each
write checks again just before its rename (:func:`~fednovelty._cli.files.write_atomically`),
so a file that appears during the run is kept as well.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fednovelty._cli.files import REMOVE_IT, UsageError, check_replaceable, write_atomically
from fednovelty.evaluation.results import METRICS, check_results_file

MANIFEST = ".fednovelty-bench.json"
WRITTEN_BY = "fednovelty bench"
#: Names (``fnmatch`` patterns) of the files ``bench`` writes: the results table, the summary,
#: the grid's bar charts and sweep figures, the stream's figures.
OUTPUTS = (
    "results.csv",
    "summary.md",
    *(f"{metric}_by_dataset_*.png" for metric in METRICS),
    "aupr_out_vs_*.png",
    "auroc_by_window_*.png",
)
#: First line of a summary each kind of run writes (recognises the summary of an older bench).
SUMMARY_HEADINGS = ("# Benchmark summary: ", "# Novelty under drift: ")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _foreign(path: Path, why: str) -> UsageError:
    return UsageError(
        f"{path} {why}; fednovelty bench writes only files it wrote itself (listed in "
        f"{path.parent / MANIFEST}). {REMOVE_IT}"
    )


def _starts_with(path: Path, prefixes: tuple[bytes, ...]) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(max(len(p) for p in prefixes))
    return head.startswith(prefixes)


def read_manifest(folder: Path) -> set[str] | None:
    """The names listed in ``folder``'s manifest, or None if it has none; a ``UsageError``
    naming it if it is not a regular file or not a bench manifest."""
    path = folder / MANIFEST
    if not check_replaceable(path, str(path), REMOVE_IT):
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        record = None
    files = record.get("files") if isinstance(record, dict) else None
    if record is None or record.get("written_by") != WRITTEN_BY or not isinstance(files, list):
        raise _foreign(path, "is not a fednovelty bench manifest")
    return {name for name in files if isinstance(name, str)}


def _legacy_owned(folder: Path, names: list[str]) -> set[str]:
    """Of ``names`` (entries of a folder without a manifest), those an older bench wrote: the
    folder's ``results.csv`` is a bench results table and the file reads as the bench's."""
    results = folder / "results.csv"
    if not check_replaceable(results, str(results), REMOVE_IT) or results.stat().st_size == 0:
        return set()
    try:
        check_results_file(results)
    except ValueError:  # another table: nothing here is the bench's
        return set()
    owned = {"results.csv"}
    for name in names:
        path = folder / name
        if not check_replaceable(path, str(path), REMOVE_IT):
            continue
        if name == "summary.md":
            prefixes = tuple(h.encode() for h in SUMMARY_HEADINGS)
        elif name.endswith(".png"):
            prefixes = (PNG_SIGNATURE,)
        else:
            continue
        if _starts_with(path, prefixes):
            owned.add(name)
    return owned


@dataclass
class BenchOutputs:
    """The ``--out`` folder of a bench run and the names in it that are the bench's.

    Attributes:
        folder: the ``--out`` folder (it may not exist yet).
        owned: names of the files in ``folder`` the bench may replace.
    """

    folder: Path
    owned: set[str] = field(default_factory=set)

    @classmethod
    def check(cls, folder: Path) -> BenchOutputs:
        """Check ``folder`` before a run (module doc): every entry named like a bench output
        is a regular file the bench wrote. A ``UsageError`` naming the first that is not."""
        if not folder.is_dir():
            return cls(folder)
        names = sorted(
            entry.name
            for entry in os.scandir(folder)
            if any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in OUTPUTS)
        )
        listed = read_manifest(folder)
        owned = _legacy_owned(folder, names) if listed is None else listed
        for name in names:
            path = folder / name
            check_replaceable(path, str(path), REMOVE_IT)
            if name == "results.csv":
                try:  # the table is its own marker (what resuming reads)
                    check_results_file(path)
                except ValueError as error:
                    raise UsageError(str(error)) from None
                owned.add(name)
            elif name not in owned:
                raise _foreign(path, "exists and was not written by fednovelty bench")
        return cls(folder, owned)

    def write(self, name: str, write: Callable[[str], None]) -> Path:
        """Write the file ``name`` in the folder through ``write(temporary_path)`` and a rename
        (replacing only a regular file the bench owns), then list it in the manifest."""
        path = self.folder / name
        write_atomically(
            path,
            write,
            overwrite=name in self.owned,
            name=str(path),
            remedy=f"fednovelty bench writes only files it wrote itself. {REMOVE_IT}",
        )
        self.record(name)
        return path

    def record(self, name: str) -> None:
        """List ``name`` (a file the bench wrote, e.g. the appended ``results.csv``) in the
        manifest, rewritten atomically."""
        self.owned.add(name)
        text = json.dumps({"written_by": WRITTEN_BY, "files": sorted(self.owned)}, indent=1)
        write_atomically(
            self.folder / MANIFEST,
            lambda path: Path(path).write_text(text + "\n", encoding="utf-8"),
            overwrite=True,
            name=str(self.folder / MANIFEST),
        )
