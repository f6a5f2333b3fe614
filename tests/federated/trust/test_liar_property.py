"""A lying client cannot crash a fit: property test over every algorithm in the registry.

One client of ten replies whatever hypothesis draws from its honest reply: tensors scaled to
1e300 or 1e-300 or negated, a NaN or an inf, a tensor of the wrong shape, a tensor missing or
one too many, the second moments made non-PSD, another kind, a huge row count. The server's
gate must drop or neutralise it: the fit ends normally, or (when no round can go on) with a
:class:`~fednovelty.exceptions.FederationError` that says why; never with an error from deep
inside (a torch RuntimeError, an IndexError, a singular covariance).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from _liars import lie, lies, lying_client
from hypothesis import HealthCheck, given, settings

from fednovelty.exceptions import FederationError
from fednovelty.federated import registry
from fednovelty.federated.bayesian.knn_markers import FederatedKNNMarkers
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.bayesian.vgm2 import VGM2
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvg
from fednovelty.federated.bayesian.vgm2_local import VGM2Local
from fednovelty.federated.bayesian.vgm2_prototype import VGM2Prototype
from fednovelty.federated.calibration.quantile import FederatedCalibration
from fednovelty.federated.clustered.clustered_em import ClusteredEM
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus
from fednovelty.federated.clustered.fesem import FeSEM
from fednovelty.federated.clustered.fesem_cam import FeSEMCAM
from fednovelty.federated.clustered.ifca import IFCA
from fednovelty.federated.clustered.ifca_cam import IFCACAM
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.conformal import calibration_edges
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.joint_models.pfedem import PFedEM
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.mixtures.factor_em import FederatedFactorEM
from fednovelty.federated.mixtures.fedgengmm import FedGenGMM, LocalGMMs
from fednovelty.federated.mixtures.pca import FederatedPCA
from fednovelty.federated.streams.streaming import StreamingEM
from fednovelty.runtime import run_simulation

N_CLIENTS, LIAR, D = 10, 9, 3


def _rows(seed: int, n: int = 40, d: int = D) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centre = 4.0 * (seed % 2)
    return torch.randn(n, d, dtype=torch.float64, generator=g) + centre


def _unlabelled() -> list[torch.Tensor]:
    return [_rows(c) for c in range(N_CLIENTS)]


def _labelled(d: int = D) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for c in range(N_CLIENTS):
        X = _rows(c, d=d)
        out.append((X, (X[:, 0] > X[:, 0].median()).long()))
    return out


def _scores() -> list[torch.Tensor]:
    """Each client's calibration scores, one column (n, 1)."""
    return [_rows(c)[:, :1].square() for c in range(N_CLIENTS)]


def _stream() -> StreamingEM:
    start = run_simulation(FederatedEM(2, random_state=0, max_iter=5), _unlabelled())
    p = start.state.params
    return StreamingEM(
        2, weights_init=p.weights, means_init=p.means, precisions_init=p.precisions_cholesky
    )


#: VGM2 and its baselines, small.
SMALL_VGM2 = {"hidden": 8, "embedding_dim": 2, "local_epochs": 1, "batch_size": 16, "rounds": 2}
#: registry name -> (algorithm factory, client data factory); small and fast settings.
CASES: dict[str, tuple[Callable, Callable]] = {
    "FederatedEM": (lambda: FederatedEM(2, max_iter=4, random_state=0), _unlabelled),
    "JointFedGMM": (lambda: JointFedGMM(2, 2, 2, max_iter=2, random_state=0), _labelled),
    "FedGenGMM": (lambda: FedGenGMM(k_range=(1, 2), random_state=0), _unlabelled),
    "LocalGMMs": (lambda: LocalGMMs(k_range=(1, 2), random_state=0), _unlabelled),
    "FederatedPCA": (lambda: FederatedPCA(2), _unlabelled),
    "StreamingEM": (_stream, _unlabelled),
    "PFedEM": (lambda: PFedEM(2, 2, max_iter=2, local_epochs=1, random_state=0), _labelled),
    "FedAvgPlus": (
        lambda: FedAvgPlus(D, 2, n_clusters=2, rounds=2, learner_factory="linear"),
        _labelled,
    ),
    "IFCA": (lambda: IFCA(D, 2, n_clusters=2, rounds=2, learner_factory="linear"), _labelled),
    "FeSEM": (lambda: FeSEM(D, 2, n_clusters=2, rounds=2, learner_factory="linear"), _labelled),
    "IFCACAM": (
        lambda: IFCACAM(D, 2, n_clusters=2, rounds=2, learner_factory="linear"),
        _labelled,
    ),
    "FeSEMCAM": (
        lambda: FeSEMCAM(D, 2, n_clusters=2, rounds=2, learner_factory="linear"),
        _labelled,
    ),
    "ClusteredEM": (
        lambda: ClusteredEM(2, n_clusters=2, cluster_components=1, max_iter=4, random_state=0),
        _unlabelled,
    ),
    "FederatedVB": (lambda: FederatedVB(3, max_iter=4, random_state=0), _unlabelled),
    "FederatedVBOneShot": (lambda: FederatedVBOneShot(3, random_state=0), _unlabelled),
    "FederatedKNNMarkers": (
        lambda: FederatedKNNMarkers(2, n_neighbors=3, max_iter=4, random_state=0),
        _unlabelled,
    ),
    "VGM2": (lambda: VGM2(D, 2, **SMALL_VGM2), _labelled),
    "VGM2Local": (lambda: VGM2Local(D, 2, **SMALL_VGM2), _labelled),
    "VGM2FedAvg": (lambda: VGM2FedAvg(D, 2, **SMALL_VGM2), _labelled),
    "VGM2Prototype": (lambda: VGM2Prototype(D, 2, **SMALL_VGM2), _labelled),
    # one Lloyd round: the liar's first lie (rounds 0-3) falls in each kind it answers
    # (centroids, assign, factor_start, factor_em)
    "FederatedFactorEM": (
        lambda: FederatedFactorEM(2, 1, kmeans_rounds=1, max_iter=3, random_state=0),
        _unlabelled,
    ),
    "FederatedCalibration": (lambda: FederatedCalibration(edges=calibration_edges(0.0)), _scores),
}


def test_every_registered_algorithm_has_a_case() -> None:
    assert set(CASES) == set(registry.ALGORITHMS)


def run_with_liar(name: str, how: dict):
    build, data = CASES[name]
    with lying_client(LIAR, how):
        return run_simulation(build(), data(), random_state=0)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(how=lies())
def test_a_liar_never_crashes_a_fit_with_an_unnamed_error(name, how) -> None:
    try:
        result = run_with_liar(name, how)
    except FederationError:
        return  # named: the federation could not go on, and the message says why
    for record in result.history:
        for _, reason in record.dropped:
            assert reason  # every drop has a reason
    state = result.state
    for field in ("params", "factors"):  # a mixture; a mixture of factor analysers
        fitted = getattr(state, field, None)
        if fitted is not None:
            for tensor in fitted.tensors().values():
                assert bool(torch.isfinite(tensor).all()), f"{name}: non-finite {field}"
    counts = getattr(state, "counts", None)  # a calibration histogram
    if counts is not None and name == "FederatedCalibration":
        assert bool(torch.isfinite(counts).all() and (counts >= 0).all()), f"{name}: counts"


def test_the_liar_is_dropped_by_name_in_the_round_it_lies() -> None:
    how = {
        "lie": "nan",
        "pick": 0,
        "factor": 1.0,
        "every_round": True,
        "first_round": 0,
        "seed": 0,
    }
    result = run_with_liar("FederatedEM", how)
    drops = [reason for r in result.history for c, reason in r.dropped if c == LIAR]
    assert drops and all("NaN" in reason or "liar" in reason or reason for reason in drops)
    assert np.isfinite(result.state.lower_bounds[-1])


def test_lie_changes_the_reply() -> None:
    ones = {"counts": torch.ones(2, dtype=torch.float64), "sums": torch.ones(2, 3)}
    reply = Message("em", ones)
    how = {"lie": "scale", "pick": 0, "factor": 1e300, "every_round": False, "first_round": 0}
    assert float(lie(reply, {**how, "seed": 0}).tensors["counts"][0]) == 1e300
    assert lie(reply, {**how, "lie": "missing", "seed": 0}).tensors.keys() == {"sums"}
    assert torch.equal(reply.tensors["counts"], torch.ones(2, dtype=torch.float64))  # not mutated


@pytest.mark.parametrize("factor", [1e10, 1e300])
@pytest.mark.parametrize(
    ("kind", "name"),
    [("factor_start", "sketch"), ("factor_em", "xz"), ("factor_em", "sum_z"), ("factor_em", "zz")],
)
def test_a_factor_analysers_scaled_statistic_is_dropped_by_name(kind, name, factor) -> None:
    """One client of ten multiplies one statistic of its ``kind`` replies by ``factor`` (its
    counts and moments honest): the server drops the first such reply naming the tensor,
    the run restarts without that client, and the fit is the one without it. (A sketch,
    ``E[z]`` statistics or ``E[z z^T]`` scaled by 1e300 used to be accepted: the start's
    loadings reached 1e149, and an ``xz`` so scaled ended the fit with a ValueError from a
    client's E-step.)"""
    from _liars import Forging

    def scaled(reply, message, number):
        if reply.kind != kind:
            return reply
        return Message(reply.kind, {**reply.tensors, name: reply.tensors[name] * factor})

    build, data = CASES["FederatedFactorEM"]
    result = run_simulation(Forging(build(), LIAR, scaled), data(), random_state=0)
    drops = [(r.kind, c, why) for r in result.history for c, why in r.dropped]
    assert len(drops) == 1 and drops[0][:2] == (kind, LIAR)
    assert f"'{name}'" in drops[0][2]
    assert LIAR not in result.history[-1].replied
    alone = run_simulation(build(), data()[:LIAR], random_state=0)
    assert not any(r.dropped for r in alone.history)  # honest replies all pass
    for part, want in alone.state.factors.tensors().items():
        got = result.state.factors.tensors()[part]
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9 * float(want.abs().max()))
