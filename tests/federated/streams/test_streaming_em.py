"""Streaming federated EM (``fednovelty.federated.streams.streaming``): one window against the same
computation done by hand, forgetting, births, weight tracking, the privacy floor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.registry import algorithm_settings, build_algorithm
from fednovelty.federated.streams.streaming import StreamingEM
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.reply_form import check_reply
from fednovelty.mixture import e_step_stats, params_from_stats
from fednovelty.mixture.density import log_gaussian_prob
from fednovelty.mixture.em import fit_weights, moment_shift
from fednovelty.mixture.streaming import forget_and_add
from fednovelty.runtime import run_simulation

A, B, FAR = np.array([0.0, 0.0]), np.array([6.0, 0.0]), np.array([0.0, 12.0])
NO_FLOOR = PrivacyPolicy(min_rows=1)


def window(shares, seed, n=120, far_share=0.0):
    """Clients' rows: a share of population A, the rest B, and optionally some at FAR."""
    rng = np.random.default_rng(seed)
    out = []
    for s in shares:
        n_far = int(far_share * n)
        n_a = round(s * (n - n_far))
        rows = [A + rng.normal(size=(n_a, 2)), B + rng.normal(size=(n - n_far - n_a, 2))]
        rows.append(FAR + rng.normal(size=(n_far, 2)))
        out.append(torch.tensor(np.concatenate(rows)))
    return out


@pytest.fixture(scope="module")
def start():
    """The stream's first window fitted by personal federated EM."""
    result = run_simulation(
        FederatedEM(2, mixture_weights="personal", random_state=0),
        window([0.8, 0.5, 0.2], seed=0),
        random_state=0,
    )
    return result.state.params, result.client_states


def settings_of(params, carry=None, **kw):
    out = {
        "weights_init": params.weights,
        "means_init": params.means,
        "precisions_init": params.precisions_cholesky,
        **kw,
    }
    if carry is not None:
        out.update(
            carry_counts=carry.counts,
            carry_sums=carry.sums,
            carry_second=carry.second,
            carry_shift=carry.shift,
            carry_n_samples=float(carry.n_samples),
        )
    return out


def test_one_window_equals_adapted_weights_then_one_m_step_on_forgotten_sums(start):
    params, states = start
    first = run_simulation(
        StreamingEM(2, **settings_of(params, rho=0.5)),
        window([0.9, 0.5, 0.1], seed=1),
        client_states=states,
        privacy=NO_FLOOR,
    )
    carry = first.state.carry
    clients = window([0.3, 0.5, 0.7], seed=2)
    result = run_simulation(
        StreamingEM(2, **settings_of(first.state.params, carry, rho=0.5)),
        clients,
        client_states=first.client_states,
        privacy=NO_FLOOR,
    )
    # by hand: each client adapts its kept weights with the components frozen, then E-step
    p = first.state.params
    shift = moment_shift(p)
    total = None
    for cid, X in enumerate(clients):
        log_n = log_gaussian_prob(X, p.means, p.precisions_cholesky, "full")
        fit = fit_weights(log_n, first.client_states[cid]["log_weights"], max_iter=100, tol=1e-6)
        assert_close_scaled(
            result.client_states[cid]["log_weights"].exp(), fit.log_weights.exp(), rtol=1e-12
        )
        stats = e_step_stats(X, fit.log_weights, p.means, p.precisions_cholesky, "full", shift)
        total = stats if total is None else total + stats
    expected = params_from_stats(forget_and_add(carry, total, 0.5), 1e-6)
    for name, tensor in expected.tensors().items():
        assert_close_scaled(result.state.params.tensors()[name], tensor, rtol=1e-10, err_msg=name)
    assert result.state.births == [] and result.state.far_share < 0.01  # 0.1 % beyond q
    drift = result.state.drift[0]
    assert 0.0 < float(drift[2]) <= 1.0 and float(drift[3]) == 0.0  # weights moved, not new


def test_weights_follow_the_clients_shares(start):
    params, states = start
    result = run_simulation(
        StreamingEM(2, **settings_of(params, rho=0.9)),
        window([1.0, 0.5, 0.0], seed=3, n=400),
        client_states=states,
    )
    a = int(torch.argmin(result.state.params.means.norm(dim=1)))  # the component at A
    shares = [float(result.state.client_weights[c][a]) for c in range(3)]
    np.testing.assert_allclose(shares, [1.0, 0.5, 0.0], atol=0.05)


def test_a_population_where_no_component_sits_gets_a_component_in_one_window(start):
    params, states = start
    moved = window([0.5, 0.5, 0.5], seed=4, far_share=0.4)
    result = run_simulation(
        StreamingEM(2, **settings_of(params, rho=0.9)), moved, client_states=states
    )
    means = result.state.params.means.numpy()
    assert result.state.births and result.state.far_share == pytest.approx(0.4, abs=0.02)
    assert np.linalg.norm(means - FAR, axis=1).min() < 0.3  # a component at FAR
    assert np.linalg.norm(means - A, axis=1).min() < 0.3  # and A's stays at A
    without = run_simulation(
        StreamingEM(2, **settings_of(params, rho=0.9, far_quantile=None)),
        moved,
        client_states=states,
    )
    assert without.state.births == []
    assert np.linalg.norm(without.state.params.means.numpy() - FAR, axis=1).min() > 3.0


def test_rounds_zero_tracks_weights_only_and_sends_less(start):
    params, states = start
    clients = window([0.9, 0.5, 0.1], seed=5)
    track = run_simulation(
        StreamingEM(2, **settings_of(params, rounds=0)), clients, client_states=states
    )
    full = run_simulation(StreamingEM(2, **settings_of(params)), clients, client_states=states)
    for name, tensor in params.tensors().items():
        assert torch.equal(track.state.params.tensors()[name], tensor)
    assert track.state.carry is None and len(track.history) == 1
    assert sum(h.bytes_up for h in track.history) < sum(h.bytes_up for h in full.history) / 4
    for c in range(3):  # the same weights either way: tracking happens before the M-step
        torch.testing.assert_close(track.state.client_weights[c], full.state.client_weights[c])


def test_clients_new_to_the_stream_start_from_the_global_weights(start):
    params, states = start
    clients = {0: window([0.5], seed=6)[0], 7: window([0.5], seed=7)[0]}
    result = run_simulation(
        StreamingEM(2, **settings_of(params)), clients, client_states={0: states[0]}
    )
    assert float(result.state.drift[7][3]) == 1.0 and float(result.state.drift[0][3]) == 0.0


def test_a_client_below_its_floor_keeps_tracking_but_sends_nothing(start):
    params, states = start
    clients = window([0.5, 0.5], seed=8)
    clients[1] = clients[1][:3]
    result = run_simulation(StreamingEM(2, **settings_of(params)), clients, client_states=states)
    assert 1 not in result.state.drift and 0 in result.state.drift
    assert "log_weights" in result.client_states[1]  # updated locally


def test_settings_round_trip_and_errors_are_named(start):
    params, _ = start
    algorithm = StreamingEM(2, **settings_of(params, rho=0.7, rounds=2))
    again = build_algorithm("StreamingEM", algorithm_settings(algorithm))
    assert again.config == algorithm.config
    with pytest.raises(ValueError, match="weights_init, means_init and precisions_init"):
        StreamingEM(2)
    with pytest.raises(ValueError, match="rho"):
        StreamingEM(2, **settings_of(params, rho=1.5))
    with pytest.raises(TypeError, match="standardize"):  # plain M-steps: not a setting
        StreamingEM(2, **settings_of(params, standardize=True))
    with pytest.raises(ValueError, match="far_quantile=None with 'tied'"):
        StreamingEM(2, covariance_type="tied", **settings_of(params))
    with pytest.raises(ValueError, match="carry_shift"):
        StreamingEM(
            2,
            **settings_of(params),
            carry_counts=[1.0, 1.0],
            carry_sums=[[0, 0], [0, 0]],
            carry_second=np.zeros((2, 2, 2)),
        )


def test_the_server_drops_impossible_stream_replies(start):
    params, states = start
    algorithm = StreamingEM(2, **settings_of(params))
    state = algorithm.start()
    broadcast = algorithm.configure(state)

    X = window([0.5], seed=9)[0]
    reply = algorithm.client_step(X, broadcast, gate.client_context(0, state=dict(states[0])))
    check_reply(reply, broadcast, 2)
    bad = reply.tensors["drift"].clone()
    bad[2] = 1.5
    with pytest.raises(InvalidReplyError, match="drift values"):
        check_reply(type(reply)(reply.kind, {**reply.tensors, "drift": bad}), broadcast, 2)
    far = reply.tensors["counts"] * 2 + 1
    with pytest.raises(InvalidReplyError, match="more far rows"):
        check_reply(type(reply)(reply.kind, {**reply.tensors, "far_counts": far}), broadcast, 2)
