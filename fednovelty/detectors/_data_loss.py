"""What a fit could not use, said as :class:`~fednovelty.exceptions.DataLossWarning`.

:class:`Releases` tallies, per client, the rounds in which it released statistics and those
in which it replied ``skipped`` (and why), over every run of one fit
(``SimulatedFitMixin._simulate`` adds each run's round records). At the end of ``fit``,
:func:`warn_data_loss` turns the tally and the fitted weights into at most four warnings,
each once per fit:

- clients that released nothing in some or all rounds (below their privacy floor, or too few
  rows for what a round asks), named with their row counts and the reasons they gave;
- a federation of several clients reduced to one (every other client released nothing);
- a mixture fitted with fewer components than ``n_components`` asked (federated EM's K is
  an upper bound where the clients' privacy floors leave fewer k-means centroids than K):
  a :class:`~fednovelty.exceptions.FewerComponentsWarning`, given first;
- mixture components emptied in fit: ``weights_`` entries backed by less than one training
  row. ``n_components_`` counts the fitted components, :func:`kept_components` those that
  kept weight (the detectors' ``effective_n_components_``). Variational mixtures, which
  prune components by design (their own ``effective_n_components_``), are left out.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fednovelty.exceptions import DataLossWarning, FewerComponentsWarning

#: clients named in a warning; more are counted.
MAX_NAMED = 10


@dataclass
class Releases:
    """Per client index (``client_ids_`` order): rounds in which it released statistics
    (``released``), rounds in which it replied ``skipped`` (``skipped``) and the reasons it
    gave, first seen first (``reasons``)."""

    released: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    reasons: dict[int, list[str]] = field(default_factory=dict)

    def add(self, history: Iterable) -> None:
        """Tally a run's ``RoundRecord`` s: a valid reply (not ``dropped``) is a release or a
        skip; a dropped one is neither."""
        for record in history:
            dropped = {c for c, _ in record.dropped}
            skips = dict(reversed(record.skipped))  # a client's first reason in the round
            for c in set(record.replied) | set(skips):
                if c in dropped:
                    continue
                if c not in skips:
                    self.released[c] += 1
                    continue
                self.skipped[c] += 1
                reasons = self.reasons.setdefault(c, [])
                if skips[c] not in reasons:
                    reasons.append(skips[c])


def warn_data_loss(
    estimator,
    releases: Releases,
    row_counts: Sequence[int],
    stacklevel: int = 2,
    method: str = "fit",
    n_taking_part: int | None = None,
) -> None:
    """The end-of-fit warnings (module docstring) of a fitted ``estimator`` (its
    ``client_ids_``, ``weights_``) trained on clients of ``row_counts`` rows
    (``client_ids_`` order; 0 for a client not in a ``partial_fit`` window) whose rounds
    ``releases`` tallied; ``method`` names the call, ``n_taking_part`` the clients that held
    rows in it (default: all of ``client_ids_``)."""
    name = f"{type(estimator).__name__}.{method}"
    ids = np.asarray(estimator.client_ids_).tolist()
    taking_part = len(ids) if n_taking_part is None else n_taking_part
    n_rows = int(sum(row_counts))
    for message, category in (
        # the model's size first: the benchmark's warning column keeps a line's start
        (fewer_components_message(estimator, name, n_rows, taking_part), FewerComponentsWarning),
        (skipped_message(name, ids, row_counts, releases, taking_part), DataLossWarning),
        (one_client_message(name, ids, releases, taking_part), DataLossWarning),
        (empty_components_message(estimator, n_rows, name), DataLossWarning),
    ):
        if message:
            warnings.warn(message, category, stacklevel=stacklevel + 1)


def skipped_message(
    name: str, ids: list, row_counts: Sequence[int], releases: Releases, taking_part: int
) -> str | None:
    """The warning naming every client that replied ``skipped`` in at least one round of
    the fit (its id, rows, rounds and reasons); None when none did."""
    clients = sorted(releases.skipped)
    if not clients:
        return None
    left_out = sum(1 for c in clients if not releases.released[c])
    lines = []
    for c in clients[:MAX_NAMED]:
        skipped, total = releases.skipped[c], releases.skipped[c] + releases.released[c]
        rounds = f"{skipped} of {total} round{'' if total == 1 else 's'}"
        rows = f"{row_counts[c]} row{'' if row_counts[c] == 1 else 's'}"
        lines.append(f"client {ids[c]!r} ({rows}; {rounds}): {'; '.join(releases.reasons[c])}")
    more = f"; and {len(clients) - MAX_NAMED} more" if len(clients) > MAX_NAMED else ""
    return (
        f"{name}: {len(clients)} of {taking_part} clients released nothing in some or all "
        f"rounds ({left_out} in every round: their rows are not in the model at all): "
        + "; ".join(lines)
        + more
        + ". Give those clients more rows or merge them with others, or lower the setting "
        "the reason names (Privacy(min_rows=...) only where their privacy allows it; "
        "docs/privacy.md)."
    )


def one_client_message(name: str, ids: list, releases: Releases, taking_part: int) -> str | None:
    """The warning for a federation of several clients in which exactly one released
    statistics; None otherwise."""
    released = [c for c, n in releases.released.items() if n]
    if taking_part < 2 or len(released) != 1:
        return None
    return (
        f"{name}: the federation of {taking_part} clients was reduced to one: only client "
        f"{ids[released[0]]!r} released statistics, so the "
        f"{'model' if name.endswith('.fit') else 'update'} is that client's alone "
        "(the others released nothing: see the warning naming them)."
    )


def kept_components(weights, n_rows: int) -> int:
    """How many of ``weights`` (n_components,) are backed by at least one of ``n_rows``
    training rows (``weight * n_rows >= 1``); all of them when ``n_rows`` < 1."""
    weights = np.asarray(weights, dtype=np.float64)
    return int(weights.size if n_rows < 1 else np.count_nonzero(weights * n_rows >= 1.0))


def fewer_components_message(
    estimator, name: str, n_rows: int | None = None, n_clients: int | None = None
) -> str | None:
    """The :class:`~fednovelty.exceptions.FewerComponentsWarning` for a mixture fitted with
    fewer components (``n_components_``) than its ``n_components`` parameter asked; None
    otherwise (with random starts, ``member_components_``, the smallest member's), or where
    ``n_components`` is an upper bound by design (variational mixtures:
    ``effective_n_components_`` set in fit). It says how many were fitted, why (the k-means
    centroids the clients sent, :func:`k_fed_record`, of ``n_rows`` rows over ``n_clients``
    clients where given) and what to do."""
    asked = estimator.get_params(deep=False).get("n_components")
    fitted = getattr(estimator, "n_components_", None)
    members = list(getattr(estimator, "member_components_", None) or [])
    attribute = f"n_components_ = {fitted}"
    if len(members) > 1:  # random starts (n_members): the smallest member
        fitted, attribute = min(members), f"member_components_ = {members}"
    if not isinstance(asked, int | np.integer) or fitted is None or fitted >= asked:
        return None
    if getattr(estimator, "PRUNES_COMPONENTS", False):
        return None
    centroids, merges = k_fed_record(getattr(estimator, "history_", []))
    floor = min_rows_of(estimator)
    held = "the clients" if n_rows is None else f"the {n_clients} clients' {n_rows} rows"
    why = (
        f"{held} could not back {asked} under their privacy floors ("
        + ("" if floor is None else f"min_rows={floor}; ")
        + "a client forms at most n_rows // min_rows k-means clusters)"
    )
    if centroids is not None:
        why += f": they sent {centroids} centroid{'' if centroids == 1 else 's'} in all"
        if centroids < asked:
            why += f", fewer than the {asked} centres asked, so each centre pools about two"
    for before, after in merges:
        why += (
            f"; a Lloyd round in which no client's rows backed its share of the {before} "
            f"centres merged them into {after}"
        )
    return (
        f"{name}: fitted {fitted} component{'' if fitted == 1 else 's'} where "
        f"n_components={asked} asked ({attribute}): {why}. Pass "
        f"n_components={fitted} to fit this size without the warning, or give the clients "
        "more rows (or lower Privacy(min_rows=...) only where their privacy allows it); "
        'warnings.simplefilter("error", FewerComponentsWarning) refuses such a fit instead.'
    )


def k_fed_record(history: Iterable[dict]) -> tuple[int | None, list[tuple[int, int]]]:
    """From a fit's ``history_`` (one dict a round): the k-means centroids the clients sent
    in the last ``centroids`` round (None: no such round) and, for each Lloyd round that
    merged the centres (``merged_centres``), the centres before and after (half as many,
    rounded up)."""
    centroids, merges = None, []
    for record in history:
        if record.get("kind") == "centroids" and "n_centroids" in record:
            centroids, merges = int(record["n_centroids"]), []
        elif record.get("merged_centres") is not None:
            before = int(record["merged_centres"])
            merges.append((before, (before + 1) // 2))
    return centroids, merges


def min_rows_of(estimator) -> int | None:
    """The clients' privacy floor (``Privacy.min_rows``) of a detector, or None."""
    option = getattr(estimator, "_option", None)
    try:
        floor = option("privacy").min_rows if option is not None else None
    except (KeyError, AttributeError, TypeError, ValueError):  # a detector without Privacy
        floor = None
    return None if floor is None else int(floor)


def empty_components_message(estimator, n_rows: int, name: str) -> str | None:
    """The warning for a fitted ``weights_`` (n_components,) with entries backed by less
    than one of the ``n_rows`` training rows (``weight * n_rows < 1``); None when there are
    none, or the estimator prunes components by design (``effective_n_components_``)."""
    weights = getattr(estimator, "weights_", None)
    if weights is None or n_rows < 1 or getattr(estimator, "PRUNES_COMPONENTS", False):
        return None
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1:
        return None
    k, kept = weights.size, kept_components(weights, n_rows)
    empty = k - kept
    if not empty:
        return None
    params = estimator.get_params(deep=False)
    fix = "fit with fewer components"
    if params.get("n_components") == k:
        fix += f" (n_components={max(kept, 1)})"
    if "prior" in params:
        fix += (
            ", or with a weaker covariance prior, which otherwise widens a few components "
            "over the rest: prior=Prior(strength=None) (none) or a smaller Prior(strength=...) "
            "or Prior(scale=...)"
        )
    return (
        f"{name}: {kept} of {k} components kept weight; {empty} "
        f"{'was' if empty == 1 else 'were'} emptied (weight below one of the {n_rows} "
        f"training rows, 1/{n_rows}) and score no row: n_components_ = {k} fitted, "
        f"effective_n_components_ = {kept} kept weight. "
        f"To keep them, {fix}."
    )
