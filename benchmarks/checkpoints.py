"""Results a long benchmark has finished, kept on disk so that a later run resumes from them.

A paper-scale run can outlast a working session (FedGMM's synthetic Table 2 at 300 clients and
200 rounds is hours per fit on two cores). :class:`Checkpoints` keeps each finished unit of
work (a seed of an experiment, or one method's fit inside it) as one pickle in a folder; a
later run with the same settings reads it back instead of computing it again. A unit is
recomputed when the settings it was computed under differ from this run's (the pickle records
them), never silently reused. Each pickle also records the commit, date and seconds of the
run that computed it, which a report lists (:meth:`Checkpoints.provenance`).

Not an installed module: ``benchmarks`` is the repository's package of scripts.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pickle
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
_KEY = re.compile(r"^[A-Za-z0-9_.=+-]+$")


def git_commit(repo: Path = REPO) -> str:
    """The short commit of ``repo``'s HEAD, with ``+`` when its tree has uncommitted changes;
    ``"unknown"`` outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def settings_signature(settings: Any) -> str:
    """A canonical JSON text of ``settings`` (a dataclass, a mapping or a value): what a
    checkpointed unit was computed under. Paths, tuples and other values are written with
    ``str``; keys are sorted, so the same settings give the same text."""
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        settings = {
            f.name: getattr(settings, f.name)
            for f in dataclasses.fields(settings)
            if f.name not in {"checkpoints", "out", "quick"}
        }
    return json.dumps(settings, sort_keys=True, default=str)


@dataclasses.dataclass
class Checkpoints:
    """Finished units of a run in ``folder``, each valid under ``signature``.

    Attributes:
        folder: where the pickles live (created on the first write); ``None`` keeps nothing
            (every unit is computed, as without checkpoints).
        signature: the settings the units depend on (:func:`settings_signature`).
        resumed: keys read back in this run; ``computed``: keys computed in this run.
    """

    folder: Path | None
    signature: str
    resumed: list[str] = dataclasses.field(default_factory=list)
    computed: list[str] = dataclasses.field(default_factory=list)

    def path(self, key: str) -> Path:
        """The pickle of ``key`` (letters, digits and ``_.=+-`` only).

        Raises:
            ValueError: ``key`` has other characters, or no folder is set.
        """
        if not _KEY.match(key):
            raise ValueError(f"checkpoint key {key!r}: use letters, digits and _.=+- only.")
        if self.folder is None:
            raise ValueError("this Checkpoints keeps nothing (folder=None): no path.")
        return Path(self.folder) / f"{key}.pkl"

    def load(self, key: str) -> dict | None:
        """The record of ``key`` when it exists and was computed under this signature
        (``{"value", "signature", "commit", "date", "seconds"}``), else ``None``."""
        if self.folder is None:
            return None
        path = self.path(key)
        if not path.exists():
            return None
        try:
            with path.open("rb") as fh:
                record = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            print(f"checkpoint {path} unreadable ({exc}); computing it again")
            return None
        if record.get("signature") != self.signature:
            print(f"checkpoint {path} was computed under other settings; computing it again")
            return None
        return record

    def load_any(self, key: str) -> dict | None:
        """The record of ``key`` whatever settings it was computed under (``None`` when there
        is none): for reports that read a run's folder after it ran."""
        if self.folder is None or not self.path(key).exists():
            return None
        with self.path(key).open("rb") as fh:
            return pickle.load(fh)

    def get(self, key: str, compute: Callable[[], T]) -> T:
        """``key``'s value read back when it was checkpointed under this signature, else
        ``compute()``, written to its pickle (atomically: a torn write leaves no file)."""
        record = self.load(key)
        if record is not None:
            self.resumed.append(key)
            print(f"resumed {key} (computed at {record['commit']} on {record['date']})")
            return record["value"]
        started = time.perf_counter()
        value = compute()
        self.computed.append(key)
        if self.folder is not None:
            record = {
                "value": value,
                "signature": self.signature,
                "commit": git_commit(),
                "date": datetime.date.today().isoformat(),
                "seconds": time.perf_counter() - started,
            }
            path = self.path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".pkl.partial")
            with partial.open("wb") as fh:
                pickle.dump(record, fh)
            os.replace(partial, path)
        return value

    def provenance(self) -> str:
        """One line: how many units were read back and computed, and the commits and dates
        they were computed at (``""`` without a folder)."""
        if self.folder is None:
            return ""
        seen = []
        for key in [*self.resumed, *self.computed]:
            record = self.load(key)
            if record is not None:
                seen.append(f"{record['commit']} ({record['date']})")
        commits = ", ".join(sorted(set(seen))) or "none"
        return (
            f"checkpoints: {self.folder} ({len(self.resumed)} units read back, "
            f"{len(self.computed)} computed; computed at {commits})"
        )


def cached(settings: Any, key: str, compute: Callable[[], T]) -> T:
    """``settings.checkpoints.get(key, compute)`` where ``settings`` carries checkpoints,
    else ``compute()``: how an experiment's seed function checkpoints a finer unit (one
    method's fit) inside its seed."""
    checkpoints = getattr(settings, "checkpoints", None)
    return compute() if checkpoints is None else checkpoints.get(key, compute)
