"""The client's privacy ledger: what it has released under differential privacy, charged to
one accountant and held outside the algorithm's state.

Every noisy release a client makes (summed statistics, feature moments, a released
histogram, a private local fit's iterations, a round of DP-SGD steps) is charged here
before it leaves, by what it costs in privacy, not by how many messages it took: a release
of ``b`` Gaussian mechanisms of multiplier ``z`` adds ``b / z^2`` to the ledger's Gaussian
part (``mu^2`` in Gaussian differential privacy, which composes by addition), and DP-SGD
steps add to a count of Poisson-subsampled Gaussian steps per ``(sigma, rate)``. The epsilon
of everything charged (:func:`ledger_epsilon`) is read from dp-accounting's PLD accountant;
a release that would take it past the client's budget (``DPPolicy.epsilon`` at
``DPPolicy.delta``) is refused, so a server that sends costlier rounds than planned (joint
rounds with learners in place of moments or Lloyd rounds) is refused when the budget runs
out, not after a count of messages.

The ledger belongs to the client, not to a run: the in-process engine keeps one per
client for the whole fit (a restart after a liar is caught keeps it), and a Flower node
keeps it in its own state, saved under the dataset it serves, so that a new attempt or a
new run on the same rows starts from what was already spent
(:func:`ledger_to_tensors`, :func:`ledger_from_tensors`). It only grows: nothing a server
sends resets it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from torch import Tensor

#: the relative slack of the budget check: the plan's calibration reads the same accountant,
#: and its last planned release must not be refused for round-off.
BUDGET_SLACK = 1e-4


@dataclass
class PrivacyLedger:
    """One client's record of its noisy releases; it only grows.

    Attributes:
        gaussian: ``sum (1 / z_b)^2`` over every Gaussian mechanism released (``mu^2`` of
            their composition in Gaussian differential privacy).
        sgd: ``(sigma, sample_rate) -> steps``: Poisson-subsampled Gaussian DP-SGD steps.
        releases: how many noisy releases were charged (the index of the next one).
    """

    gaussian: float = 0.0
    sgd: dict[tuple[float, float], int] = field(default_factory=dict)
    releases: int = 0

    def after(
        self, gaussian: float = 0.0, sgd: tuple[float, float, int] | None = None
    ) -> PrivacyLedger:
        """The ledger with one more release charged: ``gaussian`` more ``mu^2`` and, with
        ``sgd = (sigma, rate, steps)``, that many more DP-SGD steps. ``self`` is not
        changed."""
        steps = dict(self.sgd)
        if sgd is not None and sgd[2] > 0:
            key = (float(sgd[0]), float(sgd[1]))
            steps[key] = steps.get(key, 0) + int(sgd[2])
        return PrivacyLedger(self.gaussian + float(gaussian), steps, self.releases + 1)

    def epsilon(self, delta: float) -> float:
        """The epsilon at ``delta`` of everything charged (:func:`ledger_epsilon`)."""
        return ledger_epsilon(self.gaussian, tuple(sorted(self.sgd.items())), delta)


def gaussian_cost(noise_multiplier: float, blocks: float) -> float:
    """``mu^2`` of ``blocks`` Gaussian mechanisms of multiplier ``noise_multiplier``:
    ``blocks / z^2`` (``inf`` without noise, 0 for no blocks)."""
    if blocks <= 0:
        return 0.0
    return math.inf if noise_multiplier <= 0 else float(blocks) / float(noise_multiplier) ** 2


def accounting():
    """Google's dp-accounting: ``(dp_accounting, its pld_privacy_accountant module)``.

    Raises:
        ImportError: the optional extra is not installed (names the install command).
    """
    try:
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant
    except ImportError:  # pragma: no cover - the extra is installed in the test environment
        raise ImportError(
            "differential privacy accounting needs Google's dp-accounting: "
            "pip install 'fednovelty[dp]'."
        ) from None
    return dp_accounting, pld_privacy_accountant


@lru_cache(maxsize=4096)
def ledger_epsilon(
    gaussian: float,
    sgd: tuple[tuple[tuple[float, float], int], ...],
    delta: float,
    resolution: float = 1e-4,
) -> float:
    """The epsilon at ``delta`` of a Gaussian mechanism of ``mu^2 = gaussian`` composed with
    the DP-SGD steps ``sgd`` (``((sigma, rate), steps)`` pairs), read from dp-accounting's
    privacy-loss-distribution accountant (its discretisation ``resolution``, pessimistic):
    the one accountant of the ledger and of the plans
    (:func:`fednovelty.federated.trust.dp_sgd.learning_epsilon` reads it).

    Raises:
        ValueError: ``delta`` outside (0, 1).
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1); got {delta!r}.")
    if math.isinf(gaussian):
        return math.inf
    dp_accounting, pld = accounting()
    events = []
    if gaussian > 0:
        events.append(dp_accounting.GaussianDpEvent(1.0 / math.sqrt(gaussian)))
    for (sigma, rate), steps in sgd:
        if steps <= 0:
            continue
        if sigma <= 0:
            return math.inf
        step = dp_accounting.GaussianDpEvent(sigma)
        if rate < 1:
            step = dp_accounting.PoissonSampledDpEvent(rate, step)
        events.append(dp_accounting.SelfComposedDpEvent(step, int(steps)))
    if not events:
        return 0.0
    accountant = pld.PLDAccountant(value_discretization_interval=resolution)
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    return float(accountant.get_epsilon(delta))


def within_budget(ledger: PrivacyLedger, epsilon: float | None, delta: float) -> bool:
    """Whether ``ledger`` spends at most ``epsilon`` (``None``: no budget) at ``delta``,
    with the relative slack :data:`BUDGET_SLACK`."""
    if epsilon is None:
        return True
    return ledger.epsilon(delta) <= float(epsilon) * (1 + BUDGET_SLACK)


def ledger_to_tensors(ledger: PrivacyLedger) -> dict[str, Tensor]:
    """The ledger as float64 tensors (a Flower node's state, a file): ``gaussian`` (),
    ``releases`` () and ``sgd`` (n, 3) rows ``(sigma, rate, steps)``."""
    rows = [(s, r, float(n)) for (s, r), n in sorted(ledger.sgd.items())]
    sgd = torch.tensor(rows, dtype=torch.float64).reshape(-1, 3)
    return {
        "gaussian": torch.tensor(float(ledger.gaussian), dtype=torch.float64),
        "releases": torch.tensor(float(ledger.releases), dtype=torch.float64),
        "sgd": sgd,
    }


def ledger_from_tensors(tensors: dict[str, Tensor]) -> PrivacyLedger:
    """The ledger :func:`ledger_to_tensors` wrote.

    Raises:
        ValueError: a missing tensor, a wrong shape, or a negative or non-finite entry (a
            damaged ledger is never read as an empty one).
    """
    missing = {"gaussian", "releases", "sgd"} - set(tensors)
    if missing:
        raise ValueError(f"the privacy ledger lacks {sorted(missing)}; it is damaged.")
    gaussian, releases, sgd = tensors["gaussian"], tensors["releases"], tensors["sgd"]
    sgd = sgd.to(torch.float64)
    if gaussian.numel() != 1 or releases.numel() != 1 or sgd.ndim != 2 or sgd.shape[1] != 3:
        raise ValueError("the privacy ledger's tensors have the wrong shapes; it is damaged.")
    values = torch.cat([gaussian.reshape(1).double(), releases.reshape(1).double(), sgd.flatten()])
    if bool(torch.isnan(values).any()) or bool((values < 0).any()):
        raise ValueError("the privacy ledger holds negative or NaN entries; it is damaged.")
    steps = {(float(s), float(r)): int(n) for s, r, n in sgd.tolist()}
    return PrivacyLedger(float(gaussian), steps, int(releases))


__all__ = [
    "BUDGET_SLACK",
    "PrivacyLedger",
    "accounting",
    "gaussian_cost",
    "ledger_epsilon",
    "ledger_from_tensors",
    "ledger_to_tensors",
    "within_budget",
]
