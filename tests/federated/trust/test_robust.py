"""Robust aggregation (``federated.trust.robust``): what one hostile client can do with each option.

The attacks are consistent liars that pass validation: a client whose "rows" are 10,000
made-up points far from everyone's data (planted anomalies there then score as normal), a
client that claims 1e12 rows, and a FedGenGMM client whose local covariances are 1e150.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fednovelty.federated import FederatedEM, FedGenGMM, Message
from fednovelty.federated.core.config import check_robust_arguments
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.robust import (
    cap_replies,
    robust_stats,
    trimmed_mean,
    weight_factors,
)
from fednovelty.mixture import merge_stats, score_samples, stats_from_resp
from fednovelty.runtime import run_simulation
from tests.federated.trust.test_validation import WithForger

D = 3
FAR = torch.full((D,), 20.0, dtype=torch.float64)
EXTENSIVE = ("counts", "sums", "second", "log_likelihood", "n_samples", "m2")


def honest_clients() -> list[torch.Tensor]:
    """Nine clients, each holding one of three clusters (a non-IID federation)."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(200, D, generator=gen, dtype=torch.float64) + 3 * (c % 3) for c in range(9)]


def held_out_rows() -> tuple[torch.Tensor, np.ndarray]:
    """Inliers of the three clusters and anomalies planted where the attacker claims rows."""
    gen = torch.Generator().manual_seed(1)
    inliers = torch.randn(300, D, generator=gen, dtype=torch.float64)
    inliers += 3 * (torch.arange(300) % 3).unsqueeze(1)
    planted = torch.randn(100, D, generator=gen, dtype=torch.float64) * 0.5 + FAR
    return torch.cat([inliers, planted]), np.r_[np.zeros(300), np.ones(100)]


def auroc(params) -> float:
    X, y = held_out_rows()
    return roc_auc_score(y, -score_samples(params, X).numpy())


def far_rows(n: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    return torch.randn(n, D, generator=gen, dtype=torch.float64) * 0.5 + FAR


def fake_rows(algorithm):
    """Client 9 answers every round honestly about 10,000 made-up rows around ``FAR``."""
    fake = far_rows(10_000)

    def forge(reply: Message, message: Message) -> Message:
        return algorithm.client_step(fake, message, gate.client_context(9))

    return forge


def claim_1e12(algorithm):
    """Client 9 answers about 200 rows around ``FAR`` with every sum over rows scaled as
    if it held 1e12 of them (consistently, from its first reply on)."""
    fake, factor = far_rows(200), 1e12 / 200

    def forge(reply: Message, message: Message) -> Message:
        reply = algorithm.client_step(fake, message, gate.client_context(9))
        tensors = {k: (v * factor if k in EXTENSIVE else v) for k, v in reply.tensors.items()}
        return Message(reply.kind, tensors, dict(reply.scalars))

    return forge


def run_em(forge=None, **options):
    algorithm = FederatedEM(4, standardize=True, prior_strength=5.0, random_state=0, **options)
    clients = [*honest_clients(), honest_clients()[0]]
    if forge is not None:
        algorithm = WithForger(algorithm, 9, forge(algorithm))
    return run_simulation(algorithm, clients).state.params


def test_without_defences_the_attacks_take_the_model() -> None:
    assert auroc(run_em()) > 0.99
    assert auroc(run_em(fake_rows)) < 0.1  # planted anomalies score as normal
    assert auroc(run_em(claim_1e12)) < 0.1


def test_trimmed_aggregation_stops_a_client_of_made_up_rows() -> None:
    assert auroc(run_em(fake_rows, aggregation="trimmed")) > 0.99
    assert auroc(run_em(fake_rows, client_weight_cap=3.0)) < 0.5  # a cap alone does not


def far_weight(params) -> float:
    """Mixture weight of the components whose mean lies in the attacker's region."""
    near = (params.means - FAR).norm(dim=1) < 5
    return float(params.weights[near].sum())


def test_the_weight_cap_bounds_a_client_claiming_1e12_rows() -> None:
    assert far_weight(run_em(claim_1e12)) > 0.99
    # capped at 3 medians of 200 rows, against 9 honest clients of 200 rows: 600 / 2400
    capped = run_em(claim_1e12, client_weight_cap=3.0)
    assert 0.2 < far_weight(capped) <= 600 / 2400 + 0.005
    both = run_em(claim_1e12, client_weight_cap=3.0, aggregation="trimmed")
    assert far_weight(both) < 0.01 and auroc(both) > 0.99


def test_honest_federations_keep_their_model_under_both_options() -> None:
    plain, robust = run_em(), run_em(client_weight_cap=3.0, aggregation="trimmed")
    np.testing.assert_allclose(
        np.sort(robust.means.numpy(), 0), np.sort(plain.means.numpy(), 0), atol=0.3
    )


def _precision_times(factor: float):
    def forge(reply: Message, message: Message) -> Message:
        return Message(
            reply.kind,
            {
                **reply.tensors,
                "precisions_cholesky": reply.tensors["precisions_cholesky"] * factor,
                "n_samples": torch.tensor(10.0, dtype=torch.float64),
            },
            dict(reply.scalars),
        )

    return forge


def _fedgengmm_runs(factor: float) -> dict:
    clients = [*honest_clients(), honest_clients()[0]]
    results = {}
    for aggregation in ("sum", "median", "trimmed"):
        algorithm = FedGenGMM(
            n_components=4, standardize=True, prior_strength=5.0, aggregation=aggregation
        )
        results[aggregation] = run_simulation(
            WithForger(algorithm, 9, _precision_times(factor)), clients
        )
    return results


def test_a_model_with_covariances_of_1e150_is_dropped_at_the_gate_under_every_aggregation():
    """The gross-outlier rule (``fednovelty.federated.trust.plausible``) drops it by name before
    any aggregation, the default ``"sum"`` included."""
    for result in _fedgengmm_runs(1e-75).values():
        assert [c for c, _ in result.history[0].dropped] == [9]
        assert "implausible" in result.history[0].dropped[0][1]
        assert float(result.state.params.means.abs().max()) < 10
        assert auroc(result.state.params) > 0.99


def test_fedgengmm_median_screening_leaves_out_a_model_with_wide_covariances() -> None:
    """Covariances x 1e4 (standard deviations x 100, below the gross rule's 1e3): the gate
    keeps the model, the robust aggregations leave it out."""
    results = _fedgengmm_runs(1e-2)
    assert results["sum"].history[0].dropped == ()
    for aggregation in ("median", "trimmed"):
        assert results[aggregation].state.left_out == [9]
        assert float(results[aggregation].state.params.means.abs().max()) < 10
        assert auroc(results[aggregation].state.params) > 0.99
    clients = [*honest_clients(), honest_clients()[0]]
    honest = run_simulation(FedGenGMM(n_components=4, aggregation="median"), clients).state
    assert honest.left_out == []


def test_weight_factors_cap_at_multiples_of_the_median() -> None:
    factors = weight_factors({0: 100.0, 1: 120.0, 2: 80.0, 3: 1e12}, 3.0)
    assert factors[0] == factors[1] == factors[2] == 1.0
    np.testing.assert_allclose(factors[3] * 1e12, 3 * 110.0, rtol=1e-12)
    assert weight_factors({0: 5.0, 1: 1e6}, None) == {0: 1.0, 1: 1.0}
    reply = Message("em", {"counts": torch.tensor([1e12]), "n_samples": torch.tensor(1e12)})
    small = Message("em", {"counts": torch.tensor([100.0]), "n_samples": torch.tensor(100.0)})
    capped = cap_replies({0: small, 1: small, 2: reply}, 2.0)
    assert float(capped[2].tensors["n_samples"]) == pytest.approx(200.0, rel=1e-12)
    assert capped[0] is small
    joint = Message("joint_em", {**reply.tensors, "joint_counts": torch.tensor([[6e11, 4e11]])})
    capped = cap_replies({0: small, 1: small, 2: joint}, 2.0)  # the joint model's counts too
    torch.testing.assert_close(capped[2].tensors["joint_counts"], torch.tensor([[120.0, 80.0]]))


def test_trimmed_mean_drops_both_ends() -> None:
    values = torch.tensor([[0.0], [1.0], [2.0], [3.0], [100.0]])
    assert float(trimmed_mean(values, 0.2)) == pytest.approx(2.0)
    assert float(trimmed_mean(values, 0.0)) == pytest.approx(21.2)


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_robust_stats_of_identical_clients_are_the_plain_sum(covariance_type) -> None:
    # equal sizes, every client holding every component, nothing trimmed: the same M-step
    gen = torch.Generator().manual_seed(3)
    shift = torch.zeros(D, dtype=torch.float64)
    per_client = {}
    for c in range(4):
        X = torch.randn(50, D, generator=gen, dtype=torch.float64)
        resp = torch.softmax(torch.randn(50, 2, generator=gen, dtype=torch.float64) * 0.1, 1)
        per_client[c] = stats_from_resp(X, resp, covariance_type, shift)
    plain = merge_stats(per_client.values())
    robust = robust_stats(per_client, 0.0)
    share = torch.stack([s.counts / s.n_samples for s in per_client.values()]).mean(0)
    np.testing.assert_allclose(robust.counts, 200 * share / share.sum(), rtol=1e-12)
    means = robust.sums / robust.counts.unsqueeze(1)
    np.testing.assert_allclose(means, plain.sums / plain.counts.unsqueeze(1), rtol=0.1)


def test_bad_robust_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="aggregation must be one of"):
        FederatedEM(2, aggregation="median")
    with pytest.raises(ValueError, match=r"trim must be in \[0, 0.5\)"):
        check_robust_arguments("trimmed", 0.5, None)
    with pytest.raises(ValueError, match="client_weight_cap must be >= 1"):
        FedGenGMM(client_weight_cap=0.5)
