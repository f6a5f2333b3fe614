"""The client's privacy policy: what a client releases, whatever the server asks.

The server is not trusted: whatever a message asks, a client releases only values its own
:class:`PrivacyPolicy` allows (the simulation's ``run_simulation(..., privacy=...)``, a
Flower node's ``node_config``; never a field of a message). The rule is a **floor**: every
value a client releases (a component's statistics, a centroid, a row count, feature moments,
a local mixture's component, a range, a prototype, a cluster row's log-likelihood) is backed
by at least ``min_rows`` of its rows; a client with fewer rows releases nothing.

The floor is k-anonymity-style disclosure control of each released value, not differential
privacy (``docs/privacy.md``): a server can combine tensors and rounds. A policy with ``dp``
(:class:`~fednovelty.federated.trust.dp.DPPolicy`) releases each reply in its declared private
form, with noise (``docs/differential_privacy.md``).

The trust layer applies the policy in parts: what backs each value
(:mod:`~fednovelty.federated.trust.backing`), values built to clear the floor
(:mod:`~fednovelty.federated.trust.floors`), sums of per-row values backed under every
contrast (:mod:`~fednovelty.federated.trust.contrast`), and the client gate that releases a
reply (:mod:`~fednovelty.federated.trust.release`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_sgd import DPSGDSettings

#: the default floor (see ``PrivacyPolicy``).
DEFAULT_MIN_ROWS = 5


#: the default bound on the local k-means clusters a message may ask for.
DEFAULT_MAX_CLUSTERS = 64


@dataclass(frozen=True)
class PrivacyPolicy:
    """What a client releases, whatever the server asks.

    Attributes:
        min_rows: the floor: every released statistic is backed by at least this many of
            the client's rows (effective rows for soft statistics), and a client with fewer
            rows releases nothing. The default 5 is the common minimum cell size of
            statistical disclosure control's threshold rule (agencies suppress published
            cells backed by fewer than 3 to 10 units; k-anonymity with k = 5 is the usual
            starting point), and small enough that a client of a few dozen rows still
            takes part in every round. ``min_rows=1`` is no floor: replies are those of the
            unprotected protocol (a client without rows replies ``skipped`` instead of
            zeros, which adds the same nothing) and give away small clients' rows (for
            tests against centralized references and for federations whose clients trust
            the server).
        allow_raw_rows: whether the client answers the ``subset`` round (raw rows sent to
            the server, ``init_params="subset"``); refused by default.
        max_clusters: the most local k-means clusters a ``centroids`` message may ask for;
            the client also never forms more than ``n_rows // min_rows``.
        dp: the client's differential-privacy policy
            (:class:`~fednovelty.federated.trust.dp.DPPolicy`), or ``None``. With one, every row a
            round works on is clipped, every reply is released only in its declared private
            form with the client's noise (``ReplySpec.private``; a kind without one is
            refused), and the floor gives way to the noise: the client releases from its
            first row and zeroes no component (which components it zeroed would depend on
            its rows).
        dp_sgd: the client's DP-SGD (:class:`~fednovelty.federated.trust.dp_sgd.DPSGDSettings`)
            for learners that leave it under ``dp``; ``None``: a private round releases no
            learner weights.

    Raises:
        TypeError / ValueError: a field of the wrong type or below 1, naming it.
    """

    min_rows: int = DEFAULT_MIN_ROWS
    allow_raw_rows: bool = False
    max_clusters: int = DEFAULT_MAX_CLUSTERS
    dp: DPPolicy | None = None
    dp_sgd: DPSGDSettings | None = None

    def __post_init__(self) -> None:
        for name in ("min_rows", "max_clusters"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    f"PrivacyPolicy.{name} must be an int, got {type(value).__name__} {value!r}."
                )
            if value < 1:
                raise ValueError(f"PrivacyPolicy.{name} must be >= 1, got {value}.")
        if not isinstance(self.allow_raw_rows, bool):
            raise TypeError(
                "PrivacyPolicy.allow_raw_rows must be True or False, got "
                f"{type(self.allow_raw_rows).__name__} {self.allow_raw_rows!r}."
            )
        if self.dp is not None and not isinstance(self.dp, DPPolicy):
            raise TypeError(
                f"PrivacyPolicy.dp must be a DPPolicy or None, got {type(self.dp).__name__}."
            )
        if self.dp_sgd is not None and not isinstance(self.dp_sgd, DPSGDSettings):
            raise TypeError(
                "PrivacyPolicy.dp_sgd must be a DPSGDSettings or None, got "
                f"{type(self.dp_sgd).__name__}."
            )

    @property
    def floor(self) -> int:
        """The rows that must back a released value: ``min_rows``, or 1 under ``dp`` (the
        noise protects the rows; which values a floor suppressed would depend on them)."""
        return 1 if self.dp is not None else self.min_rows

    @property
    def has_floor(self) -> bool:
        """Whether the floor applies (:attr:`floor` > 1); without it the client steps release
        what the unprotected protocol does (and the noise of ``dp``, where set)."""
        return self.floor > 1


def unfloored(rows: Tensor, n_rows: float, policy: PrivacyPolicy) -> Tensor:
    """``rows``, or, for a policy without a floor (``min_rows=1``), the client's row count
    in their place: every entry is then released, as the unprotected protocol does."""
    return rows if policy.has_floor else torch.full_like(rows, float(n_rows))


__all__ = [
    "DEFAULT_MAX_CLUSTERS",
    "DEFAULT_MIN_ROWS",
    "PrivacyPolicy",
    "unfloored",
]
