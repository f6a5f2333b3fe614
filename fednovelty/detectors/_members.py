"""Ensembles of random starts: ``n_members`` fits of one family, scored together.

EM from a k-means start finds one of many local optima, and the more components a mixture
has (and the less a covariance prior holds them), the more the optima differ in where they
put density between the training rows. ``n_members=M`` fits the family ``M`` times from
different starts and scores a row by the mean of the members' log-densities,
``mean_m log p_m(x)``: the log of their geometric mean, a density up to a constant factor of
at most 1 (not normalised), so that a row is as novel as the members on average find it.
On FEMNIST writers' transforms set (``FedMFADetector``, K = 60) the mean of log-densities
scored 1-2 AUROC points above the mean of densities (the union of the members' components),
which a row dense under any one member escapes (``docs/low_rank.md``).

Each member is a whole federated fit of the family: its rounds run through the engine and
both gates like any fit's, so the clients' floors, limits and the server's checks hold for
every member without a declaration of their own. Member 0 uses the fit's seed (one member is
the family's fit exactly), member ``m`` ``derived_seed(seed, MEMBER_SALT + m)``. The members'
rounds are numbered in one sequence (member 0's first) in ``history_`` (each record with its
``member``) and in the records ``fit``'s callbacks receive; ``bytes_up_`` and ``bytes_down_``
are their sums. The members
read nothing of each other, so a deployment could run their rounds side by side; here they
run one after another.

A family takes ``n_members`` by writing it in its ``__init__`` (the shared
``_params.N_MEMBERS``) and giving two hooks: ``_member_model()`` (the fitted mixture of one
member, a :class:`~fednovelty.mixture.containers.ComponentTensors`) and
``_set_members(models, records)`` (the fitted attributes from every member's mixture and
iteration record). It keeps the members as one mixture,
:func:`~fednovelty.mixture.containers.union` of theirs (the per-component API shows every
member's components, weights over ``M``), and scores with :func:`member_mean`.
"""

from __future__ import annotations

import torch

from fednovelty.federated.core.base import derived_seed
from fednovelty.mixture.containers import split

__all__ = ["MEMBER_SALT", "fit_members", "member_mean", "member_seed"]

#: salt of member ``m``'s seed (``m > 0``).
MEMBER_SALT = 0x3E3B


def member_seed(seed: int, member: int) -> int:
    """The seed of member ``member``'s fit: ``seed`` for member 0, else
    ``derived_seed(seed, MEMBER_SALT + member)``."""
    return int(seed) if member == 0 else derived_seed(seed, MEMBER_SALT + member)


def fit_members(estimator, parts, clients, seed: int, labels=None) -> None:
    """Train ``estimator`` on the clients' rows: its family's ``_fit_clients`` once, or once
    per member when it holds ``n_members > 1`` (module docstring), then its
    ``_set_members`` hook and the members' joint round record.

    Raises:
        ValueError: ``n_members > 1`` under differential privacy (``privacy.epsilon``):
            every member would spend the clients' budget again.
    """
    n_members = int(getattr(estimator, "n_members", 1) or 1)
    if n_members == 1:
        estimator._fit_clients(parts, clients, seed, labels)
        return
    if getattr(estimator._option("privacy"), "epsilon", None) is not None:
        raise ValueError(
            f"n_members={n_members} with privacy.epsilon: every member is a fit of its own "
            "and would spend the clients' privacy budget again; use n_members=1 under "
            "differential privacy."
        )
    models, records, history = [], [], []
    bytes_up = bytes_down = 0
    try:
        for member in range(n_members):
            estimator._member_rounds = len(history)  # _simulate numbers rounds after these
            estimator._fit_clients(parts, clients, member_seed(seed, member), labels)
            models.append(estimator._member_model())
            records.append(
                {
                    "n_iter": int(getattr(estimator, "n_iter_", 0)),
                    "converged": bool(getattr(estimator, "converged_", True)),
                    "lower_bounds": list(getattr(estimator, "lower_bounds_", [])),
                }
            )
            history += [{**record, "member": member} for record in estimator.history_]
            bytes_up += estimator.bytes_up_
            bytes_down += estimator.bytes_down_
    finally:
        estimator.__dict__.pop("_member_rounds", None)
    estimator._set_members(models, records)
    estimator.history_ = history
    estimator.n_rounds_ = len(history)
    estimator.bytes_up_ = bytes_up
    estimator.bytes_down_ = bytes_down


def member_mean(mixture, sizes: list[int], log_density) -> torch.Tensor:
    """The members' mean log-density of some rows: ``mean_m log_density(member_m)``, the
    members being ``mixture``'s consecutive blocks of ``sizes`` components
    (:func:`~fednovelty.mixture.containers.split`, each renormalised).

    Args:
        mixture: the members' :func:`~fednovelty.mixture.containers.union`.
        sizes: each member's component count, summing to ``mixture.n_components``.
        log_density: ``member -> (n_samples,)`` log-densities of the rows under one member.

    Returns:
        (n_samples,).
    """
    if len(sizes) == 1:
        return log_density(mixture)
    return torch.stack([log_density(member) for member in split(mixture, sizes)]).mean(0)
