"""A streaming client's own conformal drift test (``StreamConfig.conformal_drift``): its
reference is the window's -log p(x) under the model it had (against scipy), it tests from
its second window on, releases nothing more, and refuses bad settings by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.streams.conformal_drift import OUTPUT_KEYS
from fednovelty.federated.streams.streaming import StreamingEM
from fednovelty.federated.trust import gate
from fednovelty.runtime import run_simulation

NO_FLOOR = PrivacyPolicy(min_rows=1)


def rows(seed, n=120, shift=0.0):
    rng = np.random.default_rng(seed)
    parts = [rng.normal(size=(n // 2, 2)), rng.normal(size=(n - n // 2, 2)) + np.array([6.0, 0.0])]
    return torch.tensor(np.concatenate(parts) + shift)


@pytest.fixture(scope="module")
def start():
    result = run_simulation(
        FederatedEM(2, mixture_weights="personal", random_state=0),
        [rows(0), rows(1)],
        random_state=0,
    )
    return result.state.params, result.client_states


def settings(params, **kw):
    return {
        "weights_init": params.weights,
        "means_init": params.means,
        "precisions_init": params.precisions_cholesky,
        "conformal_drift": True,
        "drift_alpha": 0.05,
        "drift_resamples": 199,
        **kw,
    }


def log_p_by_scipy(X, params, log_weights):
    """Per-row log p(x) of a full-covariance mixture with the given log weights."""
    dens = []
    for k in range(params.means.shape[0]):
        chol = params.precisions_cholesky[k].numpy()
        cov = np.linalg.inv(chol @ chol.T)
        dens.append(multivariate_normal(params.means[k].numpy(), cov).logpdf(X.numpy()))
    return logsumexp(np.stack(dens, 1) + log_weights.numpy(), axis=1)


def test_the_reference_is_the_windows_scores_and_the_test_starts_in_the_second_window(start):
    params, states = start
    clients = [rows(2), rows(3)]
    first = run_simulation(
        StreamingEM(2, **settings(params, drift_reference=150)),
        clients,
        client_states=states,
        privacy=NO_FLOOR,
    )
    for cid, X in enumerate(clients):
        state = first.client_states[cid]
        expected = -log_p_by_scipy(X, params, states[cid]["log_weights"])
        np.testing.assert_allclose(state["drift_reference"].numpy(), expected, rtol=1e-10)
        assert not set(OUTPUT_KEYS) & set(state) and float(state["drift_windows"]) == 1.0
    later = [rows(4), rows(5, shift=4.0)]  # client 1's rows moved where no component sits
    second = run_simulation(
        StreamingEM(2, **settings(first.state.params, drift_reference=150)),
        later,
        client_states=first.client_states,
        privacy=NO_FLOOR,
    )
    for cid, X in enumerate(later):
        state = second.client_states[cid]
        scores = -log_p_by_scipy(X, first.state.params, first.client_states[cid]["log_weights"])
        kept = np.r_[first.client_states[cid]["drift_reference"].numpy(), scores][-150:]
        np.testing.assert_allclose(state["drift_reference"].numpy(), kept, rtol=1e-10)
        assert 0.0 < float(state["drift_p_value"]) <= 1.0 and float(state["drift_martingale"]) > 0
    assert float(second.client_states[1]["drift_p_value"]) < 0.01
    assert float(second.client_states[1]["drift_martingale_alarm"]) == 1.0
    # the runs repeat: the client's randomness is seeded by random_state, id and window
    again = run_simulation(
        StreamingEM(2, **settings(first.state.params, drift_reference=150)),
        later,
        client_states=first.client_states,
        privacy=NO_FLOOR,
    )
    for cid in range(2):
        for key in OUTPUT_KEYS:
            assert float(again.client_states[cid][key]) == float(second.client_states[cid][key])


def test_the_test_releases_nothing_more(start):
    params, states = start
    X = rows(6)
    replies = []
    for conformal in (False, True):
        algorithm = StreamingEM(2, **settings(params, conformal_drift=conformal))
        broadcast = algorithm.configure(algorithm.start())
        context = gate.client_context(0, state={k: v.clone() for k, v in states[0].items()})
        replies.append(algorithm.client_step(X, broadcast, context))
    plain, tested = replies
    assert set(plain.tensors) == set(tested.tensors) and plain.scalars == tested.scalars
    for name, tensor in plain.tensors.items():
        assert torch.equal(tensor, tested.tensors[name]), name


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"drift_alpha": 1.0}, "drift_alpha"),
        ({"drift_reference": 0}, "drift_reference"),
        ({"drift_resamples": 2.5}, "drift_resamples"),
        ({"drift_alpha": 0.01, "drift_resamples": 50}, "drift_resamples=50 cannot resolve"),
    ],
)
def test_bad_settings_are_refused_by_name(start, bad, match):
    params, _ = start
    with pytest.raises(ValueError, match=match):
        StreamingEM(2, **settings(params, **bad))
