"""Robust aggregation of private replies: ``Robustness(aggregation="trimmed")`` with
``Privacy.epsilon``.

Ten clients of 300 rows in 2 features; the tenth (the liar) holds rows about a far point
``FAR``, where half of the test's novel rows are planted, and lies: every sum over rows x
1e10 from its first reply on (``claim_rows``), or one tensor of every reply scaled to
1e300. Under differential privacy the server cannot compare a reply with the others (the
noise of a small client is no lie), so the plain sum is the liar's; the coordinate-wise
trimmed sum (``docs/differential_privacy.md``, "Robust aggregation of private replies")
keeps the AUROC of the fit without the liar's client in ``"central"`` and ``"local"``
mode. The noise is drawn from a seeded source here (the library draws fresh OS entropy),
so every run compares the same numbers.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from unittest import mock

import numpy as np
import pytest
import torch
from _liars import lying_client
from sklearn.metrics import roc_auc_score

from fednovelty.detectors import FedGMMDetector
from fednovelty.detectors.options import Initialisation, Privacy, Robustness
from fednovelty.exceptions import FederationError
from fednovelty.federated.mixtures.em import EMConfig
from fednovelty.federated.trust import noise
from fednovelty.federated.trust.robust import trimmed_sum

N_CLIENTS, LIAR, ROWS = 10, 9, 300
FAR = np.array([6.0, -6.0])
BOUNDS = ([-8.0, -8.0], [8.0, 8.0])
TOLERANCE = 0.03
CLAIM = {"lie": "claim_rows", "pick": 0, "factor": 1e10, "every_round": True, "first_round": 0}


def seeded_noise():
    """Within the block every draw of privacy noise comes from a seeded stream, in the
    order the fit asks (the same numbers whatever ran before)."""
    draws = itertools.count()
    return mock.patch.object(noise, "fresh_noise", lambda: noise.SeededNoise(7, next(draws)))


def task():
    """``(X_train, groups, X_test, y_test)``: novel rows are the positive class."""
    rng = np.random.default_rng(0)
    centres = np.array([[-2.0, -2.0], [2.0, 2.0]])

    def inliers(n):
        return centres[rng.integers(0, 2, n)] + 0.7 * rng.normal(size=(n, 2))

    X = [FAR + 0.3 * rng.normal(size=(ROWS, 2)) if c == LIAR else inliers(ROWS) for c in range(10)]
    planted = FAR + 0.3 * rng.normal(size=(100, 2))
    X_test = np.r_[inliers(300), planted, rng.uniform(-8, 8, size=(100, 2))]
    groups = np.repeat(np.arange(N_CLIENTS), ROWS)
    return np.concatenate(X), groups, X_test, np.r_[np.zeros(300), np.ones(200)]


TASK = task()


def _fit(mode: str, how: dict | None, liar_free: bool = False, **settings) -> float:
    """AUROC of a private fit in ``mode`` with client 9 lying as ``how`` says (``None``:
    honest; ``liar_free``: left out)."""
    X, groups, X_test, y_test = TASK
    keep = groups != LIAR if liar_free else np.ones(len(groups), dtype=bool)
    detector = FedGMMDetector(
        2,
        max_iter=8,
        random_state=0,
        **settings,
        initialisation=Initialisation(kmeans_rounds=2),
        privacy=Privacy(epsilon=4.0, bounds=BOUNDS, mode=mode),
    )
    with warnings.catch_warnings(), seeded_noise():
        warnings.simplefilter("ignore")
        if how is None:
            detector.fit(X[keep], groups=groups[keep])
        else:
            with lying_client(LIAR, {**how, "seed": 0}):
                detector.fit(X[keep], groups=groups[keep])
    return float(roc_auc_score(y_test, detector.decision_function(X_test)))


TRIMMED = {"robustness": Robustness(aggregation="trimmed", trim=0.1)}


@functools.cache
def _liar_free(mode: str, robust: bool) -> float:
    """AUROC of the fit of the nine honest clients alone (trimmed, or the plain sum)."""
    return _fit(mode, None, liar_free=True, **(TRIMMED if robust else {}))


@pytest.mark.parametrize("mode", ["central", "local"])
def test_trimmed_aggregation_keeps_the_auroc_of_the_fit_without_the_liar(mode) -> None:
    liar_free = _liar_free(mode, robust=True)
    attacked = _fit(mode, CLAIM, **TRIMMED)
    assert liar_free > 0.95
    assert abs(attacked - liar_free) <= TOLERANCE, (mode, attacked, liar_free)


@pytest.mark.parametrize("mode", ["central", "local"])
def test_with_the_plain_sum_the_liar_wins(mode) -> None:
    """The task can fail: the plain sum of private replies is the liar's."""
    assert _fit(mode, CLAIM) < _liar_free(mode, robust=False) - 0.3


@pytest.mark.parametrize(
    "how",
    [{**CLAIM, "factor": 1e300}]
    + [
        {"lie": "scale", "pick": p, "factor": 1e300, "every_round": True, "first_round": 0}
        for p in (0, 2, 3, 4)
    ],
)
def test_a_liar_at_1e300_under_local_dp_is_harmless(how) -> None:
    """Every sum over rows at 1e300, or one tensor of every reply (``pick``, by name: the
    moments' ``m2``, ``n_samples``, ``mean``; the statistics' ``counts``, ``n_samples``,
    ``second``, ``sums``) at 1e300: no error, and the AUROC of the fit without the liar."""
    liar_free = _liar_free("local", robust=True)
    try:
        attacked = _fit("local", how, **TRIMMED)
    except FederationError as error:  # named, and says why
        pytest.fail(f"the fit stopped: {error}")
    assert abs(attacked - liar_free) <= TOLERANCE, (how, attacked, liar_free)


# ---------------------------------------------------------------------- what is allowed
def test_robust_options_are_allowed_where_they_keep_the_guarantee() -> None:
    assert EMConfig(n_components=2, dp_mode="central", aggregation="trimmed").private
    local = EMConfig(n_components=2, dp_mode="local", aggregation="trimmed", client_weight_cap=3)
    assert local.client_weight_cap == 3.0
    with pytest.raises(ValueError, match="distributed"):
        EMConfig(n_components=2, dp_mode="distributed", aggregation="trimmed")
    with pytest.raises(ValueError, match=r"client_weight_cap.*local"):
        EMConfig(n_components=2, dp_mode="central", client_weight_cap=3)


def test_the_trimmed_sum_moves_by_at_most_one_rows_sensitivity() -> None:
    """The central-mode argument, checked: one clipped row added to one client's statistics
    moves the coordinate-wise trimmed sum of every block by at most the row's own L2
    contribution (counts 1, first moments ``B``, second moments ``B**2``)."""
    g = torch.Generator().manual_seed(0)
    bound, d, k = 1.5, 3, 2
    for trial in range(200):
        n_clients = 3 + trial % 8
        rows = [torch.randn(20, d, generator=g, dtype=torch.float64) for _ in range(n_clients)]
        rows = [r * (bound / r.norm(dim=1, keepdim=True)).clamp(max=1.0) for r in rows]
        resp = [torch.rand(20, k, generator=g, dtype=torch.float64) for _ in rows]
        resp = [r / r.sum(1, keepdim=True) for r in resp]

        def blocks(rows, resp):
            counts = torch.stack([r.sum(0) for r in resp])
            sums = torch.stack([r.T @ x for r, x in zip(resp, rows, strict=True)])
            second = torch.stack(
                [torch.einsum("nk,ni,nj->kij", r, x, x) for r, x in zip(resp, rows, strict=True)]
            )
            return counts, sums, second

        new = torch.randn(1, d, generator=g, dtype=torch.float64)
        new = new * (bound / new.norm()).clamp(max=1.0)
        weight = torch.rand(1, k, generator=g, dtype=torch.float64)
        weight = weight / weight.sum()
        who = trial % n_clients
        more_rows = [torch.cat([x, new]) if c == who else x for c, x in enumerate(rows)]
        more_resp = [torch.cat([r, weight]) if c == who else r for c, r in enumerate(resp)]
        trim = [0.0, 0.1, 0.2, 0.3, 0.45][trial % 5]
        for before, after, limit in zip(
            blocks(rows, resp), blocks(more_rows, more_resp), (1.0, bound, bound**2), strict=True
        ):
            change = trimmed_sum(after, trim) - trimmed_sum(before, trim)
            assert float(change.norm()) <= limit * (1 + 1e-12) + 1e-12
    assert math.isfinite(float(trimmed_sum(torch.tensor([[1.0], [1e300], [2.0]]), 0.34)))
