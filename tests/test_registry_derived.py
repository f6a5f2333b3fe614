"""Everything that lists methods reads the registry: a method registered in one place (the
``probe`` fixture adds it to ``fednovelty.methods.METHODS``) reaches ``fednovelty bench``'s
help and checks (with its ablations: a mixture's detector has their settings),
``fednovelty fit --method``, the dashboard's Train page and
``fednovelty.load`` of a saved fit; a stream method reaches the stream runner and a
personalised one no novelty runner."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fednovelty
from fednovelty.cli import build_parser, fit_methods, main
from fednovelty.detectors import FedGMMDetector, StreamingFedGMMDetector
from fednovelty.evaluation.benchmark import check_methods
from fednovelty.methods import METHODS, Method, method_names

APP_DIR = Path(__file__).resolve().parents[1] / "app"
NAME = "RegistryProbe"


class RegistryProbeDetector(FedGMMDetector):
    """A detector class defined only here: no decorator, no list names it."""


class RegistryProbeStream(StreamingFedGMMDetector):
    """A stream detector class defined only here."""


def _register(monkeypatch, method: Method) -> Method:
    monkeypatch.setitem(METHODS, method.name, method)
    return method


@pytest.fixture
def probe(monkeypatch) -> Method:
    """The one place the probe method is registered (removed after the test)."""
    return _register(
        monkeypatch,
        Method(
            NAME,
            RegistryProbeDetector,
            "federated",
            "",
            "a probe of the registry",
            shared=("n_components", "covariance_type", "random_state"),
        ),
    )


def test_bench_lists_and_accepts_a_registered_method(probe, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    assert NAME in capsys.readouterr().out
    assert NAME in method_names()
    assert check_methods([NAME]) == [NAME]
    assert check_methods([NAME], ["plain"]) == [NAME, f"{NAME}-plain"]  # a mixture: ablated


def test_fit_trains_it_and_load_finds_its_class(probe, tmp_path, capsys):
    assert NAME in fit_methods()
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(0, 1, (120, 2)), columns=["a", "b"])
    frame["site"] = np.repeat([0, 1, 2], 40)
    data, model = tmp_path / "train.csv", tmp_path / "model.safetensors"
    frame.to_csv(data, index=False)
    argv = ["fit", str(data), "--method", NAME, "--client-column", "site", "--components", "2"]
    assert main([*argv, "--out", str(model)]) == 0, capsys.readouterr().err
    loaded = fednovelty.load(model)
    assert type(loaded) is RegistryProbeDetector and loaded.n_clients_ == 3


def test_the_train_page_offers_it(probe):
    pytest.importorskip("streamlit", reason="the dashboard tests need fednovelty[app]")
    from streamlit.testing.v1 import AppTest

    if str(APP_DIR) not in sys.path:
        sys.path.insert(0, str(APP_DIR))
    at = AppTest.from_file(str(APP_DIR / "Home.py"), default_timeout=120).run()
    at.switch_page("pages/1_Train.py").run()
    assert not at.exception, [e.value for e in at.exception]
    detector = at.selectbox(key="train_method")
    assert NAME in detector.options
    detector.select(NAME).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("a probe of the registry" in c.value for c in at.caption)


def test_a_stream_method_reaches_the_stream_runner_only(monkeypatch):
    from fednovelty.evaluation.streams import check_stream_methods, stream_methods

    stream = _register(
        monkeypatch,
        Method(
            "probe-stream",
            RegistryProbeStream,
            "federated",
            "",
            "a probe stream method",
            task="stream",
            shared=("n_components", "covariance_type", "random_state"),
        ),
    )
    assert stream.name in stream_methods() and "streaming" in stream_methods()
    assert check_stream_methods([stream.name, "refit"]) == [stream.name, "refit"]
    assert stream.name not in method_names() and stream.name not in fit_methods()
    with pytest.raises(ValueError, match="probe-stream: learns window by window"):
        check_methods([stream.name])
