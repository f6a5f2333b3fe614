"""VGM2 and its baselines (fednovelty.federated.bayesian.vgm2 and the vgm2_* modules): settings,
the method table and the registry, what crosses the wire, the server's validation and
aggregation, determinism, ablations and the prediction rule."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated.bayesian.vgm2 import VGM2, VGM2Config
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvgConfig
from fednovelty.federated.bayesian.vgm2_local import VGM2LocalConfig
from fednovelty.federated.bayesian.vgm2_markers import (
    aggregate_priors,
    marker_scores,
    pair_distances,
)
from fednovelty.federated.bayesian.vgm2_methods import VGM2_ALGORITHMS, VGM2_METHODS
from fednovelty.federated.bayesian.vgm2_prototype import VGM2PrototypeConfig, class_prototypes
from fednovelty.federated.bayesian.vgm2_umap import fuzzy_graph, umap_loss
from fednovelty.federated.core.base import Message
from fednovelty.federated.registry import algorithm_name, algorithm_settings, build_algorithm
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.mixture.dirnig import default_markers, same_class_logit
from fednovelty.runtime import run_simulation

SMALL = {"hidden": 8, "embedding_dim": 3, "local_epochs": 1, "batch_size": 16, "rounds": 2}


def make_clients(n_clients: int = 3, rows: int = 30, seed: int = 0):
    """Clients of two of three Gaussian classes each (centres 3 e_k in 6 features)."""
    g = torch.Generator().manual_seed(seed)
    clients = []
    for c in range(n_clients):
        labels = torch.tensor([c % 3, (c + 1) % 3]).repeat_interleave(rows // 2)
        X = 0.4 * torch.randn(labels.numel(), 6, generator=g) + 3 * torch.eye(6)[labels]
        clients.append((X, labels))
    return clients


def simulate(algorithm, clients, **kwargs):
    return run_simulation(
        algorithm, clients, random_state=0, privacy=PrivacyPolicy(min_rows=1), **kwargs
    )


# ----------------------------------------------------------------------------- settings
def test_config_validates_and_round_trips_json() -> None:
    config = VGM2Config(n_features=6, n_classes=3, aggregation="natural", n_markers=1)
    assert VGM2Config.from_json(config.to_json()) == config
    for bad, match in (
        ({"aggregation": "mean"}, "aggregation must be one of"),
        ({"n_markers": 0}, "n_markers"),
        ({"kl_weight": -1}, "kl_weight"),
        ({"learning_rate": 0}, "learning_rate"),
        ({"train_encoder": "no"}, "train_encoder"),
    ):
        with pytest.raises(ValueError, match=match):
            VGM2Config(n_features=6, n_classes=3, **bad)
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['method'\]"):
        VGM2Config.from_json({**config.to_json(), "method": "fedavg"})  # a class per method


def test_encoder_type_convnet_is_a_setting_of_every_method() -> None:
    """``encoder_type="convnet"``: the ConvNet on 16 x 16 images (256 features) for every
    method, rebuilt from its JSON settings; an unknown type or rows that are no square image
    of side >= 16 are refused naming the setting."""
    for cls in VGM2_ALGORITHMS.values():
        algorithm = cls(256, 3, **SMALL, encoder_type="convnet")
        convolutions = [m for m in algorithm.encoder.modules() if isinstance(m, torch.nn.Conv2d)]
        assert [(m.in_channels, m.out_channels) for m in convolutions] == [(1, 16), (16, 32)]
        Z = algorithm.encoder(torch.zeros(5, 256))
        assert Z.shape == (5, SMALL["embedding_dim"])
        settings = json.loads(json.dumps(algorithm_settings(algorithm)))
        assert build_algorithm(algorithm_name(algorithm), settings).config == algorithm.config
    with pytest.raises(ValueError, match=r"encoder_type must be one of \['mlp', 'convnet'\]"):
        VGM2Config(n_features=256, n_classes=3, encoder_type="cnn")
    for width in (6, 225):  # no square; 15 x 15, below the smallest side
        with pytest.raises(ValueError, match=rf"encoder_type='convnet'.*n_features={width}"):
            VGM2Config(n_features=width, n_classes=3, encoder_type="convnet")


def test_each_method_has_its_own_settings() -> None:
    """The markers' settings are VGM2's, the prototypes' pull the prototype baseline's; the
    robust aggregations and the private form are the methods' own."""
    assert not hasattr(VGM2LocalConfig(n_features=6, n_classes=3), "n_markers")
    assert VGM2PrototypeConfig(n_features=6, n_classes=3).prototype_weight == 1.0
    assert not hasattr(VGM2FedAvgConfig(n_features=6, n_classes=3), "prototype_weight")
    assert VGM2FedAvgConfig(n_features=6, n_classes=3, robust_aggregation="median").trim == 0.1
    with pytest.raises(ValueError, match=r"robust_aggregation .*VGM2 with method='local'"):
        VGM2LocalConfig(n_features=6, n_classes=3, robust_aggregation="median")
    assert VGM2LocalConfig(n_features=6, n_classes=3, dp_mode="local").private


def test_the_method_table_names_one_registered_algorithm_per_method() -> None:
    assert VGM2_METHODS == ("vgm2", "local", "fedavg", "prototype")
    for method, cls in VGM2_ALGORITHMS.items():
        assert cls.config_class.METHOD == method
        algorithm = cls(6, 3, **SMALL)
        settings = algorithm_settings(algorithm)
        rebuilt = build_algorithm(algorithm_name(algorithm), json.loads(json.dumps(settings)))
        assert algorithm_name(algorithm) == cls.__name__ and type(rebuilt) is cls
        assert rebuilt.config == algorithm.config
    assert algorithm_name(VGM2(6, 3, **SMALL)) == "VGM2"


# ----------------------------------------------------------------------------- the wire
def test_only_markers_cross_the_wire_and_their_size() -> None:
    clients = make_clients()
    algorithm = VGM2(6, 3, **SMALL)
    result = simulate(algorithm, clients)
    record = result.history[0]
    assert record.bytes_up == 3 * (2 * 5 * 3 * 4 + 2 * 4)  # markers + n_samples + loss
    state = algorithm.start()
    reply = algorithm.client_step(clients[0], algorithm.configure(state), gate.client_context(0))
    assert set(reply.tensors) == {"markers", "n_samples", "loss"}
    assert reply.tensors["markers"].shape == (2, 5, 3)
    assert not reply.scalars
    assert torch.isfinite(torch.as_tensor(result.state.losses)).all()


@pytest.mark.parametrize("method", ["local", "fedavg", "prototype"])
def test_baselines_send_what_their_method_shares(method) -> None:
    clients = make_clients()
    algorithm = VGM2_ALGORITHMS[method](6, 3, **SMALL)
    state = algorithm.start()
    reply = algorithm.client_step(clients[0], algorithm.configure(state), gate.client_context(0))
    names = set(reply.tensors) - {"n_samples", "loss"}
    if method == "local":
        assert names == set()
    elif method == "fedavg":
        assert all(n.startswith(("encoder.", "head.")) for n in names) and names
    else:
        assert names == {"prototypes", "class_counts"}
        assert reply.tensors["class_counts"].tolist() == [15.0, 15.0, 0.0]
    result = simulate(algorithm, clients)
    assert len(result.history) == 2


def test_same_seed_same_numbers_and_client_states_kept() -> None:
    clients = make_clients()
    first = simulate(VGM2(6, 3, **SMALL), clients)
    second = simulate(VGM2(6, 3, **SMALL), clients)
    assert_close_scaled(first.state.prior, second.state.prior, rtol=1e-12)
    kept = first.client_states[0]
    assert {"vgm2.markers", "vgm2.graph.heads"} <= set(kept)
    assert any(k.startswith("vgm2.encoder.") for k in kept)


# ----------------------------------------------------------------------------- server
def test_server_aggregates_markers_by_the_chosen_rule() -> None:
    for how in ("moment", "natural"):
        algorithm = VGM2(6, 3, aggregation=how, **SMALL)
        state = algorithm.start()
        message = algorithm.configure(state)
        markers = [default_markers(3) * s for s in (1.0, 1.5)]
        replies = {
            c: Message(
                "vgm2", {"markers": m, "n_samples": torch.tensor(n), "loss": torch.tensor(0.5)}
            )
            for c, (m, n) in enumerate(zip(markers, (10.0, 30.0), strict=True))
        }
        state, metrics = algorithm.server_step(state, replies)
        want = aggregate_priors(
            [m.double() for m in markers], torch.tensor([10.0, 30.0]).double(), how
        )
        assert_close_scaled(state.prior, want.float(), rtol=1e-6)
        assert metrics["n_invalid"] == 0
        assert message.tensors["prior"].shape == (2, 5, 3)


def test_server_drops_invalid_replies() -> None:
    algorithm = VGM2(6, 3, **SMALL)
    state = algorithm.start()
    broadcast = algorithm.configure(state)
    good = default_markers(3) * 1.2
    bad_values = default_markers(3)
    bad_values[0, 3, 0] = -1.0
    nan = default_markers(3)
    nan[1, 1, 1] = float("nan")
    n, loss = torch.tensor(20.0), torch.tensor(0.1)
    cases = {
        0: Message("vgm2", {"markers": good, "n_samples": n, "loss": loss}),
        1: Message("vgm2", {"markers": bad_values, "n_samples": n, "loss": loss}),
        2: Message("vgm2", {"markers": nan, "n_samples": n, "loss": loss}),
        3: Message("vgm2", {"markers": good[:, :, :2], "n_samples": n, "loss": loss}),
        4: Message("vgm2", {"markers": good, "n_samples": torch.tensor(0.0), "loss": loss}),
        5: Message(
            "vgm2", {"markers": good, "rows": torch.ones(3, 6), "n_samples": n, "loss": loss}
        ),
    }
    reasons = {c: algorithm.steps[0].reply_problem(r, broadcast) for c, r in cases.items()}
    assert reasons[0] is None
    assert "> 0" in reasons[1] and "NaN" in reasons[2] and "shape" in reasons[3]
    assert "at least one row" in reasons[4] and "tensors" in reasons[5]
    state, metrics = algorithm.server_step(state, cases)
    assert metrics["n_invalid"] == 5
    assert_close_scaled(state.prior, good, rtol=1e-5)  # the one valid reply alone


# ----------------------------------------------------------------------------- ablations
def test_frozen_encoder_keeps_its_weights_and_trains_markers() -> None:
    clients = make_clients()
    algorithm = VGM2(6, 3, train_encoder=False, **SMALL)
    result = simulate(algorithm, clients)
    kept = result.client_states[0]
    for name, value in algorithm.initial_encoder().items():
        assert torch.equal(kept[f"vgm2.encoder.{name}"], value)
    assert "vgm2.graph.heads" not in kept  # no UMAP term without an encoder to train
    assert not torch.equal(kept["vgm2.markers"], algorithm.initial_prior())


def test_single_component_and_no_calibration_run() -> None:
    clients = make_clients()
    one = simulate(VGM2(6, 3, n_markers=1, **SMALL), clients)
    assert one.state.prior.shape == (2, 5, 1)
    plain = simulate(VGM2(6, 3, calibration_weight=0.0, **SMALL), clients)
    full = simulate(VGM2(6, 3, **SMALL), clients)
    assert not torch.equal(plain.state.prior, full.state.prior)


def test_learning_separates_classes_and_predicts() -> None:
    clients = make_clients(rows=40)
    algorithm = VGM2(6, 3, **{**SMALL, "rounds": 6, "local_epochs": 3})
    result = simulate(algorithm, clients)
    prior = result.state.prior
    same_mean = (prior[1, 0] * prior[1, 1]).sum() / prior[1, 0].sum()
    diff_mean = (prior[0, 0] * prior[0, 1]).sum() / prior[0, 0].sum()
    assert float(same_mean) < float(diff_mean)
    X, y = clients[1]
    proba = algorithm.client_proba(result.client_states[1], result.state, X, reference=(X, y))
    assert proba.shape == (X.shape[0], 3)
    assert_close_scaled(proba.sum(1), torch.ones(X.shape[0]), rtol=1e-6)
    assert float((proba.argmax(1) == y).float().mean()) > 0.9
    assert float(proba[:, 0].max()) == 0.0  # structural: client 1 has no reference row of class 0
    with pytest.raises(ValueError, match="reference"):
        algorithm.client_proba(result.client_states[1], result.state, X)


# ----------------------------------------------------------------------------- helpers
def test_pair_distances_scores_prototypes_and_graph() -> None:
    Z = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])
    s, i, j = pair_distances(Z)
    assert_close_scaled(s, torch.tensor([5.0, 1.0, (9 + 9) ** 0.5]), rtol=1e-6)
    assert i.tolist() == [0, 0, 1] and j.tolist() == [1, 2, 2]
    markers = default_markers(2)
    scores = marker_scores(Z[:1], Z, torch.tensor([0, 1, 0]), markers, 3, top_m=1)
    assert scores.shape == (1, 3) and float(scores[0, 2]) == 0.0
    assert float(scores[0, 0]) > 0.0 and float(scores[0, 1]) == 0.0  # its nearest: itself
    top = marker_scores(Z[:1], Z, torch.tensor([0, 1, 0]), markers, 3, 1, rule="top_pi")
    pi = torch.sigmoid(same_class_logit(torch.cdist(Z[:1], Z)[0], markers))
    assert_close_scaled(top[0], torch.stack([pi[[0, 2]].max(), pi[1], torch.tensor(0.0)]))
    with pytest.raises(ValueError, match="rule"):
        marker_scores(Z, Z, torch.tensor([0, 1, 0]), markers, 3, 1, rule="vote")
    protos, counts = class_prototypes(Z, torch.tensor([0, 1, 0]), 3)
    assert counts.tolist() == [2.0, 1.0, 0.0]
    assert_close_scaled(protos[0], torch.tensor([0.0, 0.5]))
    X = make_clients(1, 20)[0][0]
    heads, tails, weights = fuzzy_graph(X, 5, 0)
    assert heads.numel() == tails.numel() == weights.numel() > 0
    assert bool((heads != tails).all()) and bool(((weights > 0) & (weights <= 1)).all())
    z = torch.randn(8, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    loss = umap_loss(z, z.flip(0), 1.6, 0.9, 2, torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()


def test_client_below_its_floor_skips() -> None:
    clients = make_clients(rows=4)
    algorithm = VGM2(6, 3, **SMALL)
    state = algorithm.start()
    reply = algorithm.client_step(
        clients[0],
        algorithm.configure(state),
        gate.client_context(0, policy=PrivacyPolicy(min_rows=5)),
    )
    assert reply.scalars.get("skipped") and not reply.tensors
    assert dataclasses.replace(algorithm.config, rounds=3).rounds == 3
