"""Robust options of every family that sums or averages (``federated.trust.robust``): one liar
among ten clients, with the options on and off, and their cost on honest federations.

The task: nine honest clients with rows of three Gaussian blobs; client 9 holds rows far
from them (``FAR``). The liar is *consistent*: it answers every round about its own rows
with every sum over rows x 1e10 (``scaled``), or sends one centroid at 1e133 in the
k-means round (``far_centroid``). The reference is the fit of the nine honest clients
alone; the held-out rows are inliers of the blobs and anomalies where the liar's rows lie
(a poisoned model calls them normal) or anywhere in a wide box.
"""

from __future__ import annotations

import warnings
from unittest import mock

import numpy as np
import pytest
import torch
from scipy.stats import trim_mean
from sklearn.metrics import roc_auc_score

from fednovelty.detectors.joint_fedgmm import JointFedGMMDetector
from fednovelty.detectors.options import Privacy, Robustness
from fednovelty.detectors.pfedem import PFedEMDetector
from fednovelty.detectors.streaming import StreamingFedGMMDetector
from fednovelty.detectors.variational import FedVBDetector
from fednovelty.federated import FederatedEM, Message
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvg
from fednovelty.federated.bayesian.vgm2_networks import embed, encoder_template, head_template
from fednovelty.federated.bayesian.vgm2_prototype import VGM2Prototype
from fednovelty.federated.clustered.cam_models import ensemble_proba, model_template
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus
from fednovelty.federated.init.centroids import robust_centroid_replies
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.joint_models.joint_scores import learner_log_probs
from fednovelty.federated.joint_models.pfedem import PFedEM, pfedem_predict_proba
from fednovelty.federated.streams.streaming import StreamingEM
from fednovelty.federated.trust.robust import (
    EXTENSIVE,
    coordinate_median,
    coordinate_trimmed_mean,
    outlying_points,
    robust_average_learners,
    robust_average_params,
)
from fednovelty.mixture import score_samples
from fednovelty.mixture.vb_predictive import vb_predictive_log_prob
from fednovelty.runtime import run_simulation
from tests.federated.trust.test_validation import WithForger

D, N_CLIENTS, LIAR, FACTOR = 4, 10, 9, 1e10
BLOBS = torch.tensor([[0.0] * D, [4.0] + [0.0] * (D - 1), [0.0, 4.0] + [0.0] * (D - 2)])
FAR = 10.0
#: what the robust option may lose against the liar-free fit (AUROC or accuracy).
CLOSE = 0.02


# ---------------------------------------------------------------------- the task
def _blobs(n: int, gen: torch.Generator) -> torch.Tensor:
    labels = torch.randint(0, 3, (n,), generator=gen)
    return BLOBS.double()[labels] + torch.randn(n, D, generator=gen, dtype=torch.float64)


def _far(n: int, gen: torch.Generator) -> torch.Tensor:
    return FAR + torch.randn(n, D, generator=gen, dtype=torch.float64)


def clients(seed: int, liar: bool = True) -> list[torch.Tensor]:
    """Ten clients of 200 rows: client 9's are far from the others' (``liar``) or blobs."""
    gen = torch.Generator().manual_seed(seed)
    out = [_blobs(200, gen) for _ in range(N_CLIENTS)]
    if liar:
        out[LIAR] = _far(200, gen)
    return out


def held_out(seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """500 inliers of the blobs, 100 anomalies where the liar's rows lie and 100 in a box."""
    gen = torch.Generator().manual_seed(1000 + seed)
    box = torch.rand(100, D, generator=gen, dtype=torch.float64) * 20 - 8
    X = torch.cat([_blobs(500, gen), _far(100, gen), box])
    return X, np.r_[np.zeros(500), np.ones(200)]


def scaled(algorithm):
    """The liar: every sum over rows of every reply x ``FACTOR``."""

    def forge(reply: Message, message: Message) -> Message:
        if reply.scalars.get("skipped"):
            return reply
        t = {k: (v * FACTOR if k in EXTENSIVE else v) for k, v in reply.tensors.items()}
        return Message(reply.kind, t, dict(reply.scalars))

    return forge


def far_centroid(algorithm):
    """The liar: honest, but its first k-means centroid sent at 1e133."""

    def forge(reply: Message, message: Message) -> Message:
        if reply.kind != "centroids" or reply.scalars.get("skipped"):
            return reply
        centers = reply.tensors["centers"].clone()
        centers[0] = 1e133
        return Message(reply.kind, {**reply.tensors, "centers": centers}, dict(reply.scalars))

    return forge


def fit(make, data, attack=None, seed: int = 0):
    """The final state of ``make()`` run on ``data`` (client ``LIAR`` forged by ``attack``)."""
    algorithm = make()
    if attack is not None:
        algorithm = WithForger(algorithm, LIAR, attack(algorithm))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_simulation(algorithm, data, random_state=seed).state


# ---------------------------------------------------------------------- pure functions
@pytest.mark.parametrize("n", [1, 4, 5])
def test_coordinate_median_is_numpys_median(n) -> None:
    values = torch.randn(n, 3, 2, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    expected = np.median(values.numpy(), axis=0)
    np.testing.assert_allclose(coordinate_median(values).numpy(), expected, rtol=1e-12)


def test_coordinate_median_by_hand() -> None:
    values = torch.tensor([[1.0, -5.0], [3.0, 1e10], [2.0, 0.0], [10.0, 1.0]])
    assert coordinate_median(values).tolist() == [2.5, 0.5]


@pytest.mark.parametrize(("n", "trim"), [(10, 0.1), (10, 0.25), (7, 0.2), (3, 0.0)])
def test_coordinate_trimmed_mean_is_scipys_trim_mean(n, trim) -> None:
    values = torch.randn(n, 4, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    expected = trim_mean(values.numpy(), trim, axis=0)
    np.testing.assert_allclose(coordinate_trimmed_mean(values, trim).numpy(), expected, rtol=1e-12)


def test_robust_average_params_by_hand() -> None:
    current = {"w": torch.zeros(2, dtype=torch.float32), "b": torch.zeros(())}
    values = [(1.0, 2.0), (2.0, 4.0), (3.0, 6.0), (1e10, -1e10), (5.0, 5.0)]
    copies = [{"w": torch.tensor([a, b]), "b": torch.tensor(a)} for a, b in values]
    weights = torch.tensor([1.0, 1.0, 1.0, 1e12, 0.0])  # the last took no part
    median = robust_average_params(current, copies, weights, "median", 0.1)
    # median of 4 copies: the mean of the middle two, whatever the claimed weight
    assert median["w"].tolist() == [2.5, 3.0] and float(median["b"]) == 2.5
    assert median["w"].dtype == torch.float32
    trimmed = robust_average_params(current, copies, weights, "trimmed", 0.25)
    assert trimmed["w"].tolist() == [2.5, 3.0]
    plain = robust_average_params(current, copies, weights, "sum", 0.1)
    assert float(plain["b"]) == pytest.approx(1e10, rel=1e-6)  # the weighted mean follows it
    nobody = robust_average_params(current, copies, torch.zeros(5), "median", 0.1)
    assert nobody["w"] is current["w"]


def test_robust_average_learners_per_learner_weights() -> None:
    learners = [{"w": torch.zeros(1)}, {"w": torch.zeros(1)}]
    replies = [
        Message("x", {"learner.0.w": torch.tensor([float(c)]), "learner.1.w": torch.tensor([-c])})
        for c in (1.0, 2.0, 3.0)
    ]
    gammas = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    new = robust_average_learners(learners, replies, gammas, "median", 0.1)
    assert new[0]["w"].tolist() == [2.0] and new[1]["w"].tolist() == [-2.5]


def test_outlying_points() -> None:
    points = torch.tensor(
        [[0.0, 0.0], [1.0, 0.5], [0.5, 1.0], [0.2, 0.6], [1e133, 0.4]], dtype=torch.float64
    )  # robust z of the honest ones <= 1.6 in each feature
    assert outlying_points(points).tolist() == [False] * 4 + [True]
    assert not outlying_points(points[:2]).any()  # too few to say
    # most points agree in feature 0 (MAD 0): the floor keeps the others in
    agree = torch.tensor([[0.0, 0], [0, 1], [0, 2], [3, 0], [3, 1]], dtype=torch.float64)
    assert outlying_points(agree).tolist() == [False] * 3 + [True] * 2
    floor = torch.ones(2, dtype=torch.float64)
    assert not outlying_points(agree, floor).any()


def test_robust_centroid_replies_leave_out_a_far_centroid() -> None:
    def reply(centers):
        centers = torch.tensor(centers, dtype=torch.float64)
        counts = torch.full((centers.shape[0],), 5.0, dtype=torch.float64)
        return Message("centroids", {"centers": centers, "counts": counts})

    replies = {c: reply([[3.0 * (c % 2), 0.0], [3.0 * (c % 2) + 1.0, 1.0]]) for c in range(5)}
    replies[5] = reply([[1e133, 0.0], [1.0, 1.0]])
    assert sorted(robust_centroid_replies(replies, "trimmed")) == [0, 1, 2, 3, 4]
    assert robust_centroid_replies(replies, "sum") is replies


# ---------------------------------------------------------------------- FedVB
def _vb(aggregation: str, seed: int):
    return lambda: FederatedVB(6, aggregation=aggregation, random_state=seed)


def _vb_auroc(state, seed: int) -> float:
    X, y = held_out(seed)
    return roc_auc_score(y, -vb_predictive_log_prob(X, state.posterior).numpy())


@pytest.mark.parametrize("seed", [0, 1])
def test_fedvb_trimmed_stops_a_consistent_liar(seed) -> None:
    data = clients(seed)
    reference = _vb_auroc(fit(_vb("sum", seed), data[:LIAR], seed=seed), seed)
    robust = _vb_auroc(fit(_vb("trimmed", seed), data, scaled, seed), seed)
    plain = _vb_auroc(fit(_vb("sum", seed), data, scaled, seed), seed)
    assert robust >= reference - CLOSE
    assert plain < reference - 0.3  # what the option buys


def test_fedvb_trimmed_survives_a_far_centroid() -> None:
    """(Under "sum" the server gate's box from the vb_prior round drops it too.)"""
    data = clients(0)
    reference = _vb_auroc(fit(_vb("sum", 0), data[:LIAR]), 0)
    assert _vb_auroc(fit(_vb("trimmed", 0), data, far_centroid), 0) >= reference - CLOSE


def test_fedvb_trimmed_costs_little_on_honest_federations() -> None:
    data = clients(0, liar=False)
    plain = _vb_auroc(fit(_vb("sum", 0), data), 0)
    assert _vb_auroc(fit(_vb("trimmed", 0), data), 0) >= plain - CLOSE


# ---------------------------------------------------------------------- one-shot VB
def _one_shot(aggregation: str, seed: int, how: str = "moment", **settings):
    return lambda: FederatedVBOneShot(
        6, aggregation=aggregation, posterior_aggregation=how, random_state=seed, **settings
    )


ONE_SHOT_CASES = [("trimmed", "moment", s) for s in (0, 1, 2)] + [("median", "natural", 0)]


@pytest.mark.parametrize(("aggregation", "how", "seed"), ONE_SHOT_CASES)
def test_one_shot_vb_robust_stops_a_consistent_liar(aggregation, how, seed) -> None:
    """The liar's posterior (its rows far away, every sum x 1e10, its declared row count
    too) is left out, and its claimed rows buy no weight."""
    data = clients(seed)
    reference = _vb_auroc(fit(_one_shot("sum", seed, how), data[:LIAR], seed=seed), seed)
    state = fit(_one_shot(aggregation, seed, how), data, scaled, seed)
    plain = _vb_auroc(fit(_one_shot("sum", seed, how), data, scaled, seed), seed)
    assert state.left_out == [LIAR]
    assert _vb_auroc(state, seed) >= reference - CLOSE
    assert plain < reference - 0.3  # what the option buys


@pytest.mark.parametrize(("aggregation", "how"), [("trimmed", "moment"), ("median", "natural")])
def test_one_shot_vb_robust_costs_little_on_honest_federations(aggregation, how) -> None:
    data = clients(0, liar=False)
    plain = _vb_auroc(fit(_one_shot("sum", 0, how), data), 0)
    assert _vb_auroc(fit(_one_shot(aggregation, 0, how), data), 0) >= plain - CLOSE


def test_one_shot_vb_robust_counts_every_client_as_the_typical_one() -> None:
    """Equal honest clients: the robust options change nothing (every factor is 1 and
    none is left out under "median"); one client claiming ten times its rows counts as
    the others under "median", as much as under the sum without the claim (the prior is
    given, so no vb_prior round the claim would move)."""
    data = clients(0, liar=False)
    given = {"mean_prior": torch.zeros(D), "covariance_prior": torch.eye(D)}
    plain = fit(_one_shot("sum", 0, "natural", **given), data)
    robust = fit(_one_shot("median", 0, "natural", **given), data)
    assert robust.left_out == []
    for name in ("means", "covariances", "weight_concentration"):
        a, b = getattr(robust.posterior, name), getattr(plain.posterior, name)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12 * float(b.abs().max()))

    def claim_ten(algorithm):
        def forge(reply: Message, message: Message) -> Message:
            t = {k: (v * 10 if k in EXTENSIVE else v) for k, v in reply.tensors.items()}
            return Message(reply.kind, t, dict(reply.scalars))

        return forge

    claimed = fit(_one_shot("median", 0, "natural", **given), data, claim_ten)
    summed = fit(_one_shot("sum", 0, "natural", **given), data, claim_ten)
    concentration = plain.posterior.weight_concentration
    torch.testing.assert_close(
        claimed.posterior.weight_concentration, concentration, rtol=1e-9, atol=1e-9
    )
    assert not torch.allclose(summed.posterior.weight_concentration, concentration, rtol=1e-3)


# ---------------------------------------------------------------------- federated EM, streaming
def _em(aggregation: str, seed: int):
    return lambda: FederatedEM(3, aggregation=aggregation, random_state=seed)


def _auroc(params, seed: int) -> float:
    X, y = held_out(seed)
    return roc_auc_score(y, -score_samples(params, X).numpy())


def test_federated_em_trimmed_survives_a_far_centroid() -> None:
    """The k-means round's robust form, shared by every family that starts with it; under
    the plain sum the first round's screen drops the far centroid's client (it used to end
    the fit with a SingularCovarianceError)."""
    data = clients(0)
    reference = _auroc(fit(_em("sum", 0), data[:LIAR]).params, 0)
    assert _auroc(fit(_em("sum", 0), data, far_centroid).params, 0) >= reference - CLOSE
    assert _auroc(fit(_em("trimmed", 0), data, far_centroid).params, 0) >= reference - CLOSE


def _window(aggregation: str, seed: int):
    """A streaming window of three rounds from the nine honest clients' EM mixture."""
    start = fit(_em("sum", seed), clients(seed)[:LIAR], seed=seed).params

    def make():
        return StreamingEM(
            3,
            weights_init=start.weights,
            means_init=start.means,
            precisions_init=start.precisions_cholesky,
            rounds=3,
            aggregation=aggregation,
            random_state=seed,
        )

    return make


@pytest.mark.parametrize("seed", [0, 1])
def test_streaming_trimmed_stops_a_consistent_liar(seed) -> None:
    data = clients(seed)
    reference = _auroc(fit(_window("sum", seed), data[:LIAR], seed=seed).params, seed)
    robust = _auroc(fit(_window("trimmed", seed), data, scaled, seed).params, seed)
    plain = _auroc(fit(_window("sum", seed), data, scaled, seed).params, seed)
    assert robust >= reference - CLOSE
    assert plain < reference - 0.3


def test_streaming_trimmed_costs_little_on_honest_federations() -> None:
    data = clients(0, liar=False)
    plain = _auroc(fit(_window("sum", 0), data).params, 0)
    assert _auroc(fit(_window("trimmed", 0), data).params, 0) >= plain - CLOSE


# ---------------------------------------------------------------------- learner families
def labelled(seed: int, liar: bool = True, n: int = 150):
    """Ten clients of (rows, blob labels); the liar's labels are shifted by one class."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for c in range(N_CLIENTS):
        y = torch.randint(0, 3, (n,), generator=gen)
        X = BLOBS.double()[y] + torch.randn(n, D, generator=gen, dtype=torch.float64)
        out.append((X, (y + 1) % 3 if liar and c == LIAR else y))
    return out


def labelled_held_out(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    X, y = labelled(2000 + seed, liar=False, n=300)[0]
    return X, y


def accuracy(proba: torch.Tensor, y: torch.Tensor) -> float:
    return float((proba.argmax(1) == y).double().mean())


def _joint(aggregation: str, seed: int):
    return lambda: JointFedGMM(
        1, 1, 3, max_iter=8, learning_rate=0.5, aggregation=aggregation, random_state=seed
    )


def _joint_accuracy(state, seed: int) -> float:
    X, y = labelled_held_out(seed)
    template = JointFedGMM(1, 1, 3)._template(D)
    return accuracy(learner_log_probs(template, state.learners, X)[:, 0], y)


def _pfedem(aggregation: str, seed: int):
    return lambda: PFedEM(
        2, 3, max_iter=8, learning_rate=0.5, aggregation=aggregation, random_state=seed
    )


def _pfedem_accuracy(state, seed: int) -> float:
    X, y = labelled_held_out(seed)
    template = PFedEM(2, 3)._template(D)
    return accuracy(pfedem_predict_proba(template, state.learners, X, state.params.weights), y)


def _vgm2(aggregation: str, seed: int):
    return lambda: VGM2FedAvg(
        n_features=D,
        n_classes=3,
        rounds=5,
        local_epochs=2,
        hidden=16,
        embedding_dim=4,
        learning_rate=1e-2,
        robust_aggregation=aggregation,
        random_state=seed,
        dtype=torch.float64,
    )


def _vgm2_accuracy(state, seed: int) -> float:
    X, y = labelled_held_out(seed)
    config = _vgm2("sum", seed)().config
    Z = embed(encoder_template(config), state.global_encoder, X)
    out = torch.func.functional_call(head_template(config), state.global_head, (Z,))
    return accuracy(out, y)


def _clustered(aggregation: str, seed: int):
    return lambda: FedAvgPlus(
        D,
        3,
        n_clusters=2,
        rounds=8,
        learner_factory="linear",
        learning_rate=0.1,
        aggregation=aggregation,
        random_state=seed,
        dtype=torch.float64,
    )


def _clustered_accuracy(state, seed: int) -> float:
    X, y = labelled_held_out(seed)
    config = _clustered("sum", seed)().config
    return accuracy(ensemble_proba(model_template(config), state, X), y)


#: family -> (algorithm factory by aggregation and seed, accuracy of a final state, the
#: robust aggregations it has besides "sum").
LEARNER_FAMILIES = {
    "JointFedGMM": (_joint, _joint_accuracy, ("trimmed",)),
    "PFedEM": (_pfedem, _pfedem_accuracy, ("trimmed",)),
    "VGM2-fedavg": (_vgm2, _vgm2_accuracy, ("trimmed", "median")),
    "ClusteredFL": (_clustered, _clustered_accuracy, ("trimmed", "median")),
}
CASES = [(f, a) for f, (_, _, robust) in LEARNER_FAMILIES.items() for a in robust]


@pytest.mark.parametrize(("family", "aggregation"), CASES)
def test_learner_families_stop_a_consistent_liar(family, aggregation) -> None:
    make, score, _ = LEARNER_FAMILIES[family]
    data = labelled(0)
    reference = score(fit(make("sum", 0), data[:LIAR]), 0)
    robust = score(fit(make(aggregation, 0), data, scaled), 0)
    plain = score(fit(make("sum", 0), data, scaled), 0)
    assert robust >= reference - CLOSE
    assert plain < reference - 0.3  # the liar's shifted labels win without the option


@pytest.mark.parametrize(("family", "aggregation"), CASES)
def test_learner_families_robust_options_cost_little_on_honest_federations(
    family, aggregation
) -> None:
    make, score, _ = LEARNER_FAMILIES[family]
    data = labelled(0, liar=False)
    plain = score(fit(make("sum", 0), data), 0)
    assert score(fit(make(aggregation, 0), data), 0) >= plain - CLOSE


@pytest.mark.parametrize("family", ["JointFedGMM", "PFedEM"])
def test_gaussian_learner_families_survive_a_far_centroid(family) -> None:
    make, score, _ = LEARNER_FAMILIES[family]
    data = labelled(0)
    reference = score(fit(make("sum", 0), data[:LIAR]), 0)
    assert score(fit(make("trimmed", 0), data, far_centroid), 0) >= reference - CLOSE


def test_options_a_family_lacks_are_refused_by_name() -> None:
    pfedem_has = r"one of \('sum', 'trimmed'\) \(the robust options PFedEMConfig has\)"
    with pytest.raises(ValueError, match=pfedem_has):
        PFedEM(2, 3, aggregation="median")
    with pytest.raises(ValueError, match=r"robust_aggregation .*VGM2 with method='prototype'"):
        VGM2Prototype(n_features=D, n_classes=3, robust_aggregation="median")
    with pytest.raises(ValueError, match="VBOneShotConfig has"):
        FederatedVBOneShot(3, aggregation="mean")


# ---------------------------------------------------------------------- detectors
def detector_auroc(detector, module: str, algorithm) -> float:
    """AUROC of ``detector`` fitted on ``clients(0)`` with the liar forging the replies of
    ``algorithm`` (which ``module`` imports and the detector builds)."""
    data = clients(0)
    X, groups = torch.cat(data).numpy(), np.repeat(np.arange(N_CLIENTS), 200)
    held, y = held_out(0)

    def build(*args, **settings):
        inner = algorithm(*args, **settings)
        return WithForger(inner, LIAR, scaled(inner))

    with mock.patch(f"{module}.{algorithm.__name__}", build), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector.fit(X, groups=groups)
    return roc_auc_score(y, detector.decision_function(held.numpy()))


def test_fedvb_detector_reaches_the_robust_options() -> None:
    module = "fednovelty.detectors.variational"

    def auroc(**options) -> float:
        detector = FedVBDetector(6, random_state=0, **options, privacy=Privacy(min_rows=1))
        return detector_auroc(detector, module, FederatedVB)

    assert auroc(robustness=Robustness(aggregation="trimmed")) > 0.99
    assert auroc() < 0.7
    X, groups = torch.cat(clients(0)).numpy(), np.repeat(np.arange(N_CLIENTS), 200)
    with pytest.raises(ValueError, match="aggregation='median' is a one-shot option"):
        FedVBDetector(3, robustness=Robustness(aggregation="median")).fit(X, groups=groups)


@pytest.mark.parametrize(("merge", "robust"), [("moment", "trimmed"), ("natural", "median")])
def test_one_shot_fedvb_detector_reaches_the_robust_options(merge, robust) -> None:
    def auroc(**options) -> float:
        detector = FedVBDetector(
            6, posterior_merge=merge, random_state=0, **options, privacy=Privacy(min_rows=1)
        )
        return detector_auroc(detector, "fednovelty.detectors.variational", FederatedVBOneShot)

    assert auroc(robustness=Robustness(aggregation=robust, trim=0.1)) > 0.99
    assert auroc() < 0.7


def test_streaming_detector_reaches_the_robust_options() -> None:
    module = "fednovelty.detectors.streaming"

    def auroc(**options) -> float:
        detector = StreamingFedGMMDetector(
            3, random_state=0, **options, privacy=Privacy(min_rows=1)
        )
        return detector_auroc(detector, module, FederatedEM)

    assert auroc(robustness=Robustness(aggregation="trimmed")) > 0.99
    assert auroc() < 0.9  # the liar's far component takes weight in the mix


@pytest.mark.parametrize(
    ("detector", "module", "algorithm"),
    [
        (
            lambda **o: JointFedGMMDetector(1, n_learners=1, max_iter=8, **o),
            "fednovelty.detectors.joint_fedgmm",
            JointFedGMM,
        ),
        (
            lambda **o: PFedEMDetector(2, max_iter=8, **o),
            "fednovelty.detectors.pfedem",
            PFedEM,
        ),
    ],
    ids=["JointFedGMMDetector", "PFedEMDetector"],
)
def test_joint_detectors_reach_the_robust_options(detector, module, algorithm) -> None:
    parts = labelled(0)
    X = torch.cat([X for X, _ in parts]).numpy()
    y = torch.cat([y for _, y in parts]).numpy()
    groups = np.repeat(np.arange(N_CLIENTS), 150)
    held, y_held = labelled_held_out(0)

    def accuracy_of(liar: bool = True, **options) -> float:
        def build(*args, **settings):
            inner = algorithm(*args, **settings)
            return WithForger(inner, LIAR, scaled(inner))

        model = detector(random_state=0, **options, privacy=Privacy(min_rows=1))
        with mock.patch(f"{module}.{algorithm.__name__}", build), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if liar:
                model.fit(X, y, groups=groups)
            else:  # the nine honest clients alone
                model.fit(X[groups < LIAR], y[groups < LIAR], groups=groups[groups < LIAR])
        return float((model.predict_y(held.numpy()) == y_held.numpy()).mean())

    reference = accuracy_of(liar=False)
    assert accuracy_of(robustness=Robustness(aggregation="trimmed")) >= reference - CLOSE
    assert accuracy_of() < 0.3
