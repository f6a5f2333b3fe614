"""Shared set-up of the dashboard tests: the app folder on ``sys.path`` (as ``streamlit run``
puts it) and small, fast settings for every run the tests train."""

import sys
from pathlib import Path

import pytest

APP_DIR = Path(__file__).resolve().parents[2] / "app"
if str(APP_DIR) not in sys.path:
    sys.path.insert(0, str(APP_DIR))

pytest.importorskip("streamlit", reason="the dashboard tests need fednovelty[app]")
pytest.importorskip("plotly", reason="the dashboard tests need fednovelty[app]")

#: Train-page widget values for a quick run: 4 synthetic clients + 1 unseen, 6 rounds.
QUICK_TRAIN = {
    "train_syn_clients": 4,
    "train_syn_features": 4,
    "train_unseen": 1,
    "train_rounds": 6,
    "train_learners": 2,
    "train_epochs": 1,
}


@pytest.fixture(scope="session")
def app_dir() -> Path:
    return APP_DIR


@pytest.fixture(scope="session")
def quick_train() -> dict:
    return dict(QUICK_TRAIN)


@pytest.fixture(scope="module")
def joint_run():
    """A small joint FedGMM run on synthetic data (shared by a module's read-only tests)."""
    from fednovelty_app.training import DataSettings, MethodSettings, build_bundle, train

    data = DataSettings(n_clients=4, n_unseen=1, n_features=4, seed=0)
    method = MethodSettings(max_iter=6, n_learners=2, local_epochs=1)
    return train(data, method, build_bundle(data))
