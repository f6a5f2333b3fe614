"""The Flower app ``fednovelty flower new`` writes (``fednovelty/runtime/flower/app_template``):
``examples/flower`` is the same files; its defaults are ``FedGenGMMDetector``'s (standardisation
and the ``"auto"`` covariance prior, resolved with the rows' width); and its run, on nodes
answered in this process, gives the detector's model and AUROC on ADBench Pima.

Flower's own local simulation (``flwr run .``) of the same app: ``test_flower_simulation.py``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty import FedGenGMMDetector, Prior
from fednovelty._cli.flower import TEMPLATE, TEMPLATE_FILES
from fednovelty.detectors._fit_state import seed_from
from fednovelty.detectors._params import auto_prior
from fednovelty.federated import FedGenGMM
from fednovelty.runtime.flower.config import (
    WIDTH_AUTO,
    algorithm_from_run_config,
    needs_width,
    resolve_width,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "flower"
N_NODES = 3


def template_run_config() -> dict:
    """The template's ``[tool.flwr.app.config]``: the run config of a plain ``flwr run``."""
    text = (TEMPLATE / "pyproject.toml").read_text()
    return dict(tomllib.loads(text)["tool"]["flwr"]["app"]["config"])


def test_examples_flower_is_the_template() -> None:
    example = sorted(p.name for p in EXAMPLE.iterdir() if p.name != "__pycache__")
    assert example == sorted(TEMPLATE_FILES)
    for name in TEMPLATE_FILES:
        assert (EXAMPLE / name).read_bytes() == (TEMPLATE / name).read_bytes(), name


def test_width_auto_is_the_detectors_auto_prior() -> None:
    for n_features in (1, 2, 8, 30, 201):
        assert WIDTH_AUTO["prior_strength"](n_features) == auto_prior("auto", n_features)


@pytest.mark.parametrize("n_features", [2, 8, 30])
def test_template_settings_are_the_detectors_defaults(n_features) -> None:
    """The algorithm both halves build from the template's run config, for rows of
    ``n_features`` columns, is the one ``FedGenGMMDetector()`` fits with (all settings)."""
    run_config = template_run_config()
    assert run_config["algorithm"] == "FedGenGMM"
    assert needs_width(run_config)
    on_flower = algorithm_from_run_config(run_config, n_features=n_features)
    detector = FedGenGMMDetector()
    in_process = FedGenGMM(**detector._settings(n_features), random_state=run_config["seed"])
    assert on_flower.config == in_process.config
    assert on_flower.config.standardize and on_flower.config.prior_strength == n_features + 2


def test_an_auto_setting_needs_the_width() -> None:
    run_config = template_run_config()
    with pytest.raises(ValueError, match=r"prior_strength=\"auto\" depends on the rows' width"):
        algorithm_from_run_config(run_config)
    assert resolve_width({"prior_strength": 3.0, "k_range": [1, 2]}, None) == {
        "prior_strength": 3.0,
        "k_range": [1, 2],
    }
    assert not needs_width({**run_config, "algorithm-params": '{"prior_strength": 4}'})


@pytest.fixture
def task_identity(monkeypatch):
    pytest.importorskip("flwr")
    from _flower_grid import set_task_identity

    set_task_identity(monkeypatch)


def pima():
    """ADBench Pima (8 features) under the novelty protocol: training inliers, test rows."""
    from fednovelty.datasets.protocols import make_task

    try:
        task = make_task("29_Pima", "novelty", n_clients=N_NODES, alpha=None, partition="iid")
    except FileNotFoundError as error:
        pytest.skip(f"ADBench Pima is not in the shared data folder: {error}")
    return task.X_train, task.X_test, task.y_test


def in_process_nodes(run_config: dict):
    """A grid of ``N_NODES`` ClientApps of the template's ``client_app.py`` (the package's
    ``make_client_app()``), each with the node config Flower's simulation gives a node:
    ``partition-id`` and ``num-partitions``."""
    from _flower_grid import InProcessGrid
    from flwr.app import Context, RecordDict

    from fednovelty.runtime.flower import make_client_app

    contexts = {
        100 + 7 * c: Context(
            1, 100 + 7 * c, {"partition-id": c, "num-partitions": N_NODES}, RecordDict(), run_config
        )
        for c in range(N_NODES)
    }
    return InProcessGrid(make_client_app(), contexts)


def assert_same_detector(on_flower, in_process) -> None:
    """Same mixture up to float64 round-off relative to each tensor's scale, same threshold."""
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        got, want = getattr(on_flower, name), getattr(in_process, name)
        assert_close_scaled(torch.as_tensor(got), torch.as_tensor(want), rtol=1e-10, err_msg=name)
    assert on_flower.threshold_ == pytest.approx(in_process.threshold_, rel=1e-10)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_template_on_flower_gives_the_detectors_model_on_pima(tmp_path, task_identity):
    """The template's run config as is (but the data and result paths, and the detector's
    seed), its nodes reading one file split by partition-id as in Flower's simulation: the
    model equals ``FedGenGMMDetector(k_range=(1, 10)).fit`` on the same blocks of rows, and so
    does its AUROC; the plain algorithm (no standardisation, no prior) scores lower."""
    from sklearn.metrics import roc_auc_score

    from fednovelty.runtime.flower.server import serve

    X_train, X_test, y_test = pima()
    np.save(tmp_path / "train.npy", X_train)
    seed = 0
    run_config = {
        **template_run_config(),
        "data-path": str(tmp_path / "train.npy"),
        "result-path": str(tmp_path / "model.safetensors"),
        "seed": seed_from(seed),  # the seed FedGenGMMDetector(random_state=0) runs with
    }
    grid = in_process_nodes(run_config)
    result = serve(grid, type("Context", (), {"run_config": run_config})())
    assert [t for _, t in grid.sent].count("query") == N_NODES  # the width, asked once
    groups = np.concatenate([np.full(len(b), c) for c, b in enumerate(np.array_split(
        X_train, N_NODES))])  # fmt: skip
    on_flower = FedGenGMMDetector.from_model(result, X_train)
    in_process = FedGenGMMDetector(random_state=seed).fit(X_train, groups=groups)
    assert_same_detector(on_flower, in_process)
    auroc = roc_auc_score(y_test, on_flower.decision_function(X_test))
    assert auroc == pytest.approx(
        roc_auc_score(y_test, in_process.decision_function(X_test)), rel=1e-9
    )
    plain = FedGenGMMDetector(random_state=seed, prior=Prior(standardize=False, strength=None)).fit(
        X_train, groups=groups
    )
    assert roc_auc_score(y_test, plain.decision_function(X_test)) < auroc


@pytest.mark.parametrize("n_features", [3, 5])
def test_a_node_resolves_auto_with_its_own_rows_width(n_features) -> None:
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from fednovelty.exceptions import ClientDataError
    from fednovelty.runtime.flower.client import node_inputs

    context = Context(1, 7, {"partition-id": 2}, RecordDict(), template_run_config())
    rows = np.random.default_rng(0).normal(size=(20, n_features))
    algorithm, client_id, data = node_inputs(context, lambda _: (2, rows))
    assert client_id == 2 and tuple(data.shape) == rows.shape
    assert algorithm.config.prior_strength == auto_prior("auto", n_features)
    with pytest.raises(ClientDataError, match=r"client 2: rows must be 2-D .* got shape \(20,\)"):
        node_inputs(context, lambda _: (2, rows[:, 0]))


def test_the_flower_page_says_to_activate_the_virtualenv() -> None:
    """Flower starts flower-superlink, flower-superexec and flwr-simulation by name from
    PATH: docs/flower.md's set-up activates the virtualenv and says why, and its quick start
    is the command this package ships (fednovelty flower new) and Flower's local simulation."""
    text = (Path(__file__).parents[2] / "docs" / "flower.md").read_text()
    quick_start = text.index("## Quick start")
    setup = text[quick_start : text.index("\nflwr run", quick_start)]
    assert "source .venv/bin/activate" in setup
    assert "flower-superexec" in text and "PATH" in text
    assert "fednovelty flower new" in text and "num-supernodes" in text
