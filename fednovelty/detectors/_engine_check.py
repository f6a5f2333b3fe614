"""What Flower's Simulation Engine cannot run of a detector's fit, refused at ``fit`` by the
detector's own parameters before any round runs.

``sampling=ClientSampling(engine="flower-sim")`` runs a detector's rounds on
:func:`~fednovelty.runtime.flower.sim_engine.run_flower_simulation`, which refuses what a
Flower node cannot do (``docs/flower.md``): differential privacy (a node calibrates its own
noise from its budget keys) and an algorithm the nodes cannot rebuild from the registry (the
PCA front end's wrapper). :func:`refuse_flower_sim` says so first, naming ``sampling`` and
the parameter in the way, so that the error never comes after rounds that already ran on
Ray (the private bounds round, federated PCA's two) and never falls back to the in-process
engine.
"""

from __future__ import annotations

from typing import Any

__all__ = ["refuse_flower_sim"]


def flower_sim_conflicts(estimator: Any, n_features: int) -> list[str]:
    """The settings of ``estimator`` that flower-sim cannot run on rows ``n_features`` wide,
    each as ``"<parameter>: <why>"`` (empty on the in-process engine or when none is set)."""
    if estimator._option("sampling").engine != "flower-sim":
        return []
    conflicts = []
    epsilon = estimator._option("privacy").epsilon
    if epsilon is not None:
        conflicts.append(
            f"privacy.epsilon={epsilon!r}: a Flower node calibrates its own differential-"
            "privacy noise from its budget (node config), which the simulation does not give it"
        )
    if estimator._front_end_rounds(n_features):
        conflicts.append(
            f"pca_components={estimator.pca_components!r} (the PCA front end on these "
            f"{n_features}-feature rows): each client projects its rows inside a wrapper of "
            "the family's algorithm, which Flower's nodes cannot rebuild from the registry; "
            "use pca_components=None (or project the rows before fit)"
        )
    return conflicts


def refuse_flower_sim(estimator: Any, n_features: int) -> None:
    """Refuse a fit of ``estimator`` on rows ``n_features`` wide that
    ``sampling=ClientSampling(engine="flower-sim")`` cannot run (:func:`flower_sim_conflicts`).

    Raises:
        ValueError: naming ``sampling``, each conflicting parameter and what to do.
    """
    conflicts = flower_sim_conflicts(estimator, n_features)
    if conflicts:
        raise ValueError(
            f"{type(estimator).__name__}: sampling=ClientSampling(engine='flower-sim') "
            f"cannot run {'; nor '.join(conflicts)}. Use sampling=ClientSampling("
            "engine='in-process') (the default engine) for these settings."
        )
