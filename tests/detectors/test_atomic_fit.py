"""Atomic fits (``fednovelty.detectors._fit_state.atomic_fit``): a ``fit`` or ``partial_fit`` that
fails keeps every estimator's previous fitted state exactly, or leaves it unfitted.

The failure is forced after the input checks and a real federation: ``_simulate`` runs the
engine (so ``history_`` and the byte counts are overwritten, and the algorithm may touch the
broadcast tensors), then raises. The refit sees other data, reordered columns and other client
ids, so a half-updated estimator would differ in ``n_features_in_``-like attributes, in
``client_ids_`` and in ``feature_names_in_``."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from _every_estimator import COLUMNS, NAMES, build, data, fit, labelled, scores
from _tolerance import assert_close_scaled

from fednovelty.detectors.base import SimulatedFitMixin
from fednovelty.exceptions import NotFittedError


class Boom(RuntimeError):
    """The forced failure."""


def fail_after_runs(monkeypatch) -> None:
    """From now on every ``_simulate`` runs the real federation, then raises ``Boom``."""
    real = SimulatedFitMixin._simulate

    def run_then_fail(self, *args, **kwargs):
        real(self, *args, **kwargs)
        raise Boom("the federation failed")

    monkeypatch.setattr(SimulatedFitMixin, "_simulate", run_then_fail)


def assert_same(after, before, where="state", seen=None):
    """Exact equality of two copies of estimator state (values copied, never recomputed);
    ``seen``: the objects already compared (state may hold cycles)."""
    seen = set() if seen is None else seen  # ids of objects the state holds, not temporaries
    if isinstance(before, torch.Tensor):
        assert isinstance(after, torch.Tensor), where
        assert after.dtype == before.dtype and after.device == before.device, where
        np.testing.assert_array_equal(after.cpu().numpy(), before.cpu().numpy(), err_msg=where)
    elif isinstance(before, np.ndarray):
        assert isinstance(after, np.ndarray) and after.dtype == before.dtype, where
        np.testing.assert_array_equal(after, before, err_msg=where)
    elif isinstance(before, torch.nn.Module):
        assert_same(after.state_dict(), before.state_dict(), where, seen)
    elif isinstance(before, dict):
        assert isinstance(after, dict) and list(after) == list(before), where
        for key in before:
            assert_same(after[key], before[key], f"{where}[{key!r}]", seen)
    elif isinstance(before, list | tuple):
        assert type(after) is type(before) and len(after) == len(before), where
        for i, (a, b) in enumerate(zip(after, before, strict=True)):
            assert_same(a, b, f"{where}[{i}]", seen)
    elif id(before) in seen:
        return
    elif dataclasses.is_dataclass(before) and not isinstance(before, type):
        seen.add(id(before))
        assert type(after) is type(before), where
        for field in dataclasses.fields(before):
            name = field.name
            assert_same(getattr(after, name), getattr(before, name), f"{where}.{name}", seen)
    elif hasattr(before, "get_arrays"):  # a scikit-learn KDTree / BallTree
        assert_same(after.get_arrays(), before.get_arrays(), where, seen)
    elif hasattr(before, "__dict__") and not callable(before):  # e.g. neighbour indexes
        seen.add(id(before))
        assert type(after) is type(before), where
        assert_same(vars(after), vars(before), where, seen)
    elif isinstance(before, float) and np.isnan(before):
        assert isinstance(after, float) and np.isnan(after), where
    else:
        assert after == before, where


def _refit_data():
    """Other rows, the columns reordered and other client ids."""
    X, y, groups = data(seed=1, shift=2.0)
    return X[COLUMNS[::-1]], y, np.array(["p", "q", "r", "s"])[groups]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.filterwarnings("ignore:init_params='subset' sends raw rows:UserWarning")
@pytest.mark.parametrize("name", NAMES)
def test_a_failed_refit_keeps_the_previous_model_exactly(name, monkeypatch):
    X, y, groups = data()
    detector = fit(build(name), name, X, y, groups)
    before = copy.deepcopy(vars(detector))
    expected = scores(detector, name, X)

    fail_after_runs(monkeypatch)
    with pytest.raises(Boom):
        fit(detector, name, *_refit_data())
    monkeypatch.undo()

    assert_same(vars(detector), before)
    # recomputed from the kept (copied) state: equal up to round-off of the scoring
    assert_close_scaled(scores(detector, name, X), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="feature names of X differ"):
        scores(detector, name, X[COLUMNS[::-1]])


@pytest.mark.filterwarnings("ignore:init_params='subset' sends raw rows:UserWarning")
@pytest.mark.parametrize("name", NAMES)
def test_a_failed_first_fit_leaves_the_estimator_unfitted(name, monkeypatch):
    fail_after_runs(monkeypatch)
    detector = build(name)
    before = copy.deepcopy(vars(detector))
    X, y, groups = data()
    with pytest.raises(Boom):
        fit(detector, name, X, y, groups)
    assert_same(vars(detector), before)
    assert not [k for k in vars(detector) if k.endswith("_")]
    with pytest.raises(NotFittedError):
        scores(detector, name, X)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", ["StreamingFedGMM", "PFL-FedGMM", "PFL-pFedEM"])
def test_a_failed_partial_fit_keeps_the_model(name, monkeypatch):
    """A window with a new client (streaming) or of the known clients (joint models) that
    fails midway: client ids, weights, mixture and every record stay as they were."""
    X, y, groups = data()
    detector = fit(build(name), name, X, y, groups)
    before = copy.deepcopy(vars(detector))
    expected = scores(detector, name, X)
    window, wy, wgroups = data(seed=2, shift=1.0)
    if name == "StreamingFedGMM":
        wgroups = wgroups + 10  # new clients: client_ids_ grows before the run
    fail_after_runs(monkeypatch)
    with pytest.raises(Boom):
        if labelled(name):
            detector.partial_fit(window, wy, wgroups)
        else:
            detector.partial_fit(window, groups=wgroups)
    monkeypatch.undo()
    assert_same(vars(detector), before)
    # recomputed from the kept (copied) state: equal up to round-off of the scoring
    assert_close_scaled(scores(detector, name, X), expected, rtol=1e-12)


def test_an_interrupted_fit_is_rolled_back_too(monkeypatch):
    """``KeyboardInterrupt`` (not an ``Exception``) also restores the state."""
    X, y, groups = data()
    name = "FedGMM"
    detector = fit(build(name), name, X, y, groups)
    before = copy.deepcopy(vars(detector))

    def interrupted(self, *args, **kwargs):
        self.n_features_in_ = -1
        raise KeyboardInterrupt

    monkeypatch.setattr(SimulatedFitMixin, "_simulate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fit(detector, name, *_refit_data())
    assert_same(vars(detector), before)


def test_the_caller_random_state_object_is_kept():
    """Constructor arguments are not copied back: a ``RandomState`` passed by the caller is
    the same object after a failed fit."""
    rng = np.random.RandomState(0)
    detector = build("FedGMM").set_params(random_state=rng)
    X, _, groups = data()
    with pytest.raises(ValueError):
        detector.fit(X, groups=groups[:-1])
    assert detector.random_state is rng
