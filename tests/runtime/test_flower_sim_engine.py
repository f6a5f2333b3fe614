"""Flower's Simulation Engine as a fednovelty engine (``engine="flower-sim"``).

The same algorithm on the same clients gives the in-process engine's model: federated EM
with personal weights and client sampling (the nodes' registration, the sampled rounds, the
client states kept on the nodes and collected after the run), FedGenGMM's one-shot round, a
streaming window whose clients start from states kept from an earlier window, and a
detector's scores through ``ClientSampling(engine="flower-sim")``. Ray starts once for
the module (two CPUs) and stays up between the runs, and so do the two ClientApp actors the
first run starts (they import torch, Flower and fednovelty: most of that run's ~9 s on the
2-core test machine; a later run takes ~2 s). What flower-sim refuses and the resource
checks need no Ray.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytest.importorskip("ray", reason="Flower's simulation needs flwr[simulation] (Ray)")

import ray

from fednovelty import FedGMMDetector
from fednovelty.detectors import ClientSampling
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.registry import build_algorithm
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime import run_simulation
from fednovelty.runtime.flower.sim_engine import (
    release_actors,
    run_flower_simulation,
    run_with_engine,
)
from fednovelty.runtime.flower.sim_resources import SimulationResourceWarning, check_resources

RTOL = 1e-9


@pytest.fixture(scope="module")
def ray_up():
    """Ray for the whole module (the engine leaves a Ray it did not start running)."""
    started = not ray.is_initialized()
    if started:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # Ray's accelerator tip
            ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    assert release_actors() == 2  # the runs shared one pool of two actors, kept till now
    if started:
        ray.shutdown()


def federation(n_clients: int = 6, seed: int = 0) -> dict[int, torch.Tensor]:
    """Clients of different sizes around three centres."""
    rng = np.random.default_rng(seed)
    return {
        c: torch.as_tensor(rng.normal(size=(30 + 7 * c, 3)) + 3.0 * (c % 3))
        for c in range(n_clients)
    }


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    scale = float(a.abs().max())
    assert float((a - b).abs().max()) <= RTOL * max(scale, 1e-300), what


def assert_same_params(a, b) -> None:
    for name in ("weights", "means", "precisions_cholesky"):
        assert_close(getattr(a, name), getattr(b, name), name)


def rounds(result) -> list[tuple]:
    return [
        (r.kind, r.sampled, tuple(sorted(r.replied)), r.bytes_up, r.bytes_down, r.failed)
        for r in result.history
    ]


def test_federated_em_with_sampling_and_client_states_equals_in_process(ray_up):
    """Personal weights (a state each client keeps between rounds) and 4 of 6 clients a
    round: the same rounds, the same model, the same kept states."""
    clients = federation()
    params = {"n_components": 2, "kmeans_rounds": 2, "max_iter": 4, "tol": 0.0,
              "mixture_weights": "personal", "random_state": 1}  # fmt: skip
    kwargs = {"fraction": 0.6, "random_state": 3, "privacy": PrivacyPolicy(min_rows=2)}
    ours = run_simulation(build_algorithm("FederatedEM", params), clients, **kwargs)
    flower = run_flower_simulation(build_algorithm("FederatedEM", params), clients, **kwargs)
    assert rounds(flower) == rounds(ours)
    assert {r.sampled for r in ours.history} != {tuple(clients)}  # clients were sampled
    assert_same_params(ours.state.params, flower.state.params)
    assert list(flower.client_states) == sorted(clients)
    for c, kept in ours.client_states.items():
        assert sorted(flower.client_states[c]) == sorted(kept) == ["log_weights"]
        assert_close(kept["log_weights"], flower.client_states[c]["log_weights"], f"client {c}")
    assert set(flower.ledgers) == set(clients)
    assert all(r.metrics["wire_bytes_up"] > r.bytes_up for r in flower.history)
    assert ray.is_initialized()  # a Ray the caller started is left running


def test_fedgengmm_one_shot_equals_in_process(ray_up):
    clients = federation(5, seed=1)
    params = {"k_range": [1, 3], "random_state": 0}
    ours = run_simulation(build_algorithm("FedGenGMM", params), clients, random_state=0)
    flower = run_with_engine(
        "flower-sim", build_algorithm("FedGenGMM", params), clients, random_state=0
    )
    assert rounds(flower) == rounds(ours) and len(ours.history) == 1
    assert_same_params(ours.state.params, flower.state.params)
    assert ours.state.params.means.shape[0] > 1


def test_streaming_window_from_kept_client_states_equals_in_process(ray_up):
    """A streaming window whose clients start from the weights they kept from an earlier
    window (``client_states``): each node starts from its own, as in process (their drift
    values and final weights depend on them)."""
    clients = federation()
    start = run_simulation(build_algorithm("FederatedEM", {"n_components": 2}), clients)
    p = start.state.params
    params = {
        "n_components": 2,
        "rounds": 2,
        "weights_init": p.weights.tolist(),
        "means_init": p.means.tolist(),
        "precisions_init": p.precisions_cholesky.tolist(),
    }
    rng = np.random.default_rng(5)
    kept = {c: {"log_weights": torch.as_tensor(rng.dirichlet([1.0, 1.0])).log()} for c in clients}
    ours = run_simulation(build_algorithm("StreamingEM", params), clients, client_states=kept)
    flower = run_flower_simulation(
        build_algorithm("StreamingEM", params), clients, client_states=kept
    )
    assert rounds(flower) == rounds(ours)
    assert_same_params(ours.state.params, flower.state.params)
    for c in clients:
        assert_close(ours.state.drift[c], flower.state.drift[c], f"drift of client {c}")
        mine, theirs = ours.client_states[c]["log_weights"], flower.client_states[c]
        assert_close(mine, theirs["log_weights"], f"weights of client {c}")


def test_detector_on_flower_sim_scores_as_in_process(ray_up):
    rng = np.random.default_rng(2)
    X = np.vstack([rng.normal(size=(120, 3)), rng.normal(size=(120, 3)) + 4.0])
    groups = np.repeat(np.arange(4), 60)
    settings = {"n_components": 2, "max_iter": 5, "random_state": 0}
    ours = FedGMMDetector(**settings).fit(X, groups=groups)
    flower = FedGMMDetector(**settings, sampling=ClientSampling(engine="flower-sim"))
    flower.fit(X, groups=groups)
    assert flower.n_rounds_ == ours.n_rounds_
    assert [r["kind"] for r in flower.history_] == [r["kind"] for r in ours.history_]
    a, b = ours.score_samples(X), flower.score_samples(X)
    np.testing.assert_allclose(b, a, rtol=0, atol=RTOL * np.abs(a).max())
    assert flower.threshold_ == pytest.approx(ours.threshold_, rel=RTOL)


# ------------------------------------------------------------- refused, by name (no Ray)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"dropout": 0.2}, "dropout"),
        ({"secure_sum": True}, "secure sums"),
        ({"privacy": PrivacyPolicy(dp=DPPolicy(1.0, 1.0))}, "differential privacy"),
        ({"fraction": 0.0}, "fraction"),
    ],
)
def test_what_flower_sim_cannot_do_is_refused(options, says):
    algorithm = build_algorithm("FederatedEM", {"n_components": 2})
    with pytest.raises(ValueError, match=says):
        run_flower_simulation(algorithm, federation(3), **options)


def test_an_algorithm_the_nodes_cannot_rebuild_is_refused():
    """A class the registry does not hold (as the PCA front end's ``Projected`` wrapper)."""

    class MyEM(FederatedEM):
        pass

    with pytest.raises(ValueError, match=r"rebuild.*in-process"):
        run_flower_simulation(MyEM(n_components=2), federation(3))


def test_data_tuples_other_than_rows_and_labels_are_refused():
    algorithm = build_algorithm("FederatedEM", {"n_components": 2})
    clients = {c: (x, torch.zeros(len(x))) for c, x in federation(3).items()}
    with pytest.raises(ValueError, match="tuple of 2"):
        run_flower_simulation(algorithm, clients)


def test_a_detector_refuses_dropout_on_flower_sim():
    X = np.random.default_rng(0).normal(size=(60, 2))
    detector = FedGMMDetector(2, sampling=ClientSampling(engine="flower-sim", dropout=0.3))
    with pytest.raises(ValueError, match="dropout"):
        detector.fit(X, groups=np.repeat([0, 1, 2], 20))


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine"):
        FedGMMDetector(2, sampling=ClientSampling(engine="ray")).fit(np.zeros((10, 2)))
    with pytest.raises(ValueError, match="engine must be one of"):
        run_with_engine("ray", None, {})


# ------------------------------------------------------------- resources (no Ray)


def test_resources_default_to_one_cpu_per_actor_on_every_core():
    resources, args, actors = check_resources(None, None, cpus=8, gpus=[])
    assert resources == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert args["num_cpus"] == 8 and args["include_dashboard"] is False and actors == 8
    _, _, actors = check_resources({"num_cpus": 2}, {"num_cpus": 6}, cpus=8, gpus=[])
    assert actors == 3


def test_num_cpus_no_actor_fits_is_refused_and_more_cpus_than_cores_warn():
    with pytest.raises(ValueError, match="no ClientApp actor fits"):
        check_resources({"num_cpus": 4}, None, cpus=2, gpus=[])
    with pytest.warns(SimulationResourceWarning, match="more than this machine's 2 cores"):
        check_resources(None, {"num_cpus": 8}, cpus=2, gpus=[])
    with pytest.raises(ValueError, match="client_resources takes"):
        check_resources({"cpus": 1}, None, cpus=2, gpus=[])


def test_init_args_of_a_running_ray_warn():
    with pytest.warns(SimulationResourceWarning, match="Ray is already running"):
        _, _, actors = check_resources(
            None, {"num_cpus": 1}, ray_running=True, ray_cpus=4.0, cpus=2, gpus=[]
        )
    assert actors == 4


def test_too_many_actors_on_one_gpu_are_refused():
    """``num_gpus=0.01`` packs 100 actors on a 16 GiB GPU, 1 GiB each: refused, with the
    least share that fits (16 actors)."""
    with pytest.raises(ValueError, match=r"up to 100 ClientApp actors.*num_gpus >= 0\.0625"):
        check_resources({"num_gpus": 0.01}, None, cpus=128, gpus=[16.0])
    resources, _, actors = check_resources({"num_gpus": 0.25}, None, cpus=16, gpus=[16.0] * 2)
    assert resources["num_gpus"] == 0.25 and actors == 8
    with pytest.raises(ValueError, match="sees no GPU"):
        check_resources({"num_gpus": 0.5}, None, cpus=4, gpus=[])
    with pytest.raises(ValueError, match="Ray hides every GPU"):
        check_resources(None, None, device="cuda", cpus=4, gpus=[16.0])
