"""Shift schedules, FEMNIST writer streams (digits = A, letters = B) and two-domain novelty
streams."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fednovelty.datasets.femnist import make_femnist_federated
from fednovelty.datasets.streams import schedule_share, writer_stream


def test_schedules_cycle_between_zero_and_one():
    linear = [schedule_share(t, 8, "linear", cycles=2) for t in range(8)]
    np.testing.assert_allclose(linear, [0, 0.5, 1, 0.5] * 2)
    cosine = [schedule_share(t, 4, "cosine") for t in range(4)]
    np.testing.assert_allclose(cosine, [0, 0.5, 1, 0.5], atol=1e-12)
    assert schedule_share(3, 10, "constant", constant=0.3) == 0.3
    for kwargs, match in (
        ({"kind": "sine"}, "kind must be one of"),
        ({"cycles": 0}, "cycles"),
        ({"kind": "constant", "constant": 2.0}, "constant"),
    ):
        with pytest.raises(ValueError, match=match):
            schedule_share(1, 10, **kwargs)


@pytest.fixture(scope="module")
def writers():
    return make_femnist_federated(6, random_state=0)


def test_a_window_mixes_each_writers_digits_and_letters_by_the_schedule(writers):
    stream = writer_stream(writers, 4, kind="linear", rows_per_window=400, random_state=0)
    assert [w.share for w in stream] == [0.0, 0.5, 1.0, 0.5]
    for w in stream:
        assert (w.y[w.from_a] < 10).all() and (w.y[~w.from_a] >= 10).all()
        assert np.bincount(w.groups).tolist() == [400] * 6
        assert w.X.shape == (2400, 784) and w.X.max() <= 1.0
    assert stream[1].from_a.mean() == pytest.approx(0.5, abs=0.05)
    again = writer_stream(writers, 4, kind="linear", rows_per_window=400, random_state=0)
    np.testing.assert_array_equal(again[1].X, stream[1].X)


def test_stream_errors_are_named(writers):
    with pytest.raises(ValueError, match="split"):
        writer_stream(writers, 2, split="holdout")
    with pytest.raises(ValueError, match="rows_per_window"):
        writer_stream(writers, 2, rows_per_window=0)


# ----------------------------------------------------------------------------- novelty streams
from fednovelty.datasets.domain_pools import DomainPools  # noqa: E402
from fednovelty.datasets.streams import domain_stream  # noqa: E402


def toy_pools(rng, clients=False, width=3):
    """A around 0, B around 5, novel around 12; with ``clients`` each training row's first
    feature is its client (4 clients; client 3 holds no A rows)."""
    train_a, train_b = rng.normal(0, 1, (200, width)), rng.normal(5, 1, (240, width))
    owners_a = owners_b = None
    if clients:
        owners_a, owners_b = rng.integers(0, 3, 200), rng.integers(0, 4, 240)
        train_a[:, 0], train_b[:, 0] = owners_a, owners_b
    return DomainPools(
        "toy",
        train_a,
        train_b,
        rng.normal(0, 1, (80, width)),
        rng.normal(5, 1, (80, width)),
        rng.normal(12, 1, (30, width)),
        clients_a=owners_a,
        clients_b=owners_b,
    )


def test_domain_stream_windows_follow_the_schedule_after_a_warm_up():
    pools = toy_pools(np.random.default_rng(0))
    stream = domain_stream(
        pools, 8, kind="linear", n_clients=5, rows_per_window=400, test_inliers=500,
        test_novel=40, first_share=0.5, random_state=0,
    )  # fmt: skip
    assert stream.n_windows == 8 and len(stream.windows) == 9 and stream.features == "none"
    expected = [0.5] + [schedule_share(t, 8, "linear") for t in range(1, 9)]
    assert [w.share for w in stream.windows] == expected
    for w in stream.windows:
        assert w.X.shape == (2000, 3) and np.bincount(w.groups).tolist() == [400] * 5
        assert w.from_a.mean() == pytest.approx(w.share, abs=0.05)
        # A's rows are A's (around 0), B's around 5: the flags tell the truth
        if w.share > 0:
            assert np.all(np.abs(w.X[w.from_a].mean(0)) < 0.3)
        if w.share < 1:
            assert np.all(np.abs(w.X[~w.from_a].mean(0) - 5) < 0.3)
        assert w.y_test.tolist() == [0] * 500 + [1] * 40 and w.X_test.shape == (540, 3)
        assert not w.test_from_a[500:].any() and w.test_from_a.mean() == pytest.approx(
            w.share * 500 / 540, abs=0.06
        )
        assert np.all(w.X_test[500:].mean(0) > 10)  # novel rows from the novel pool
        np.testing.assert_allclose(w.client_share, w.share)
    again = domain_stream(
        pools, 8, n_clients=5, rows_per_window=400, test_inliers=500, test_novel=40,
        random_state=0,
    )  # fmt: skip
    np.testing.assert_array_equal(again.windows[3].X, stream.windows[3].X)
    other = domain_stream(pools, 8, n_clients=5, rows_per_window=400, random_state=1)
    assert not np.array_equal(other.windows[3].X, stream.windows[3].X)


def test_writer_pools_draw_each_clients_own_rows():
    pools = toy_pools(np.random.default_rng(1), clients=True)
    assert pools.n_writers == 4
    stream = domain_stream(pools, 4, rows_per_window=50, test_inliers=20, test_novel=5)
    assert stream.n_clients == 4  # every writer by default
    for w in stream.windows:
        np.testing.assert_array_equal(w.X[:, 0], w.groups)  # a writer's own rows only
        assert not w.from_a[w.groups == 3].any()  # client 3 has no A rows: all B
        assert w.client_share[3] == 0.0 and np.allclose(w.client_share[:3], w.share)
    assert domain_stream(pools, 2, n_clients=2, rows_per_window=5).windows[1].groups.max() == 1
    with pytest.raises(ValueError, match="hold 4 writers"):
        domain_stream(pools, 2, n_clients=5)


def test_features_are_learned_on_the_warm_up_window_only():
    pools = toy_pools(np.random.default_rng(2), width=6)
    pca = domain_stream(pools, 4, features="pca", n_axes=2, n_clients=4, rows_per_window=100)
    warm = pca.windows[0].X
    assert warm.shape == (400, 2) and pca.n_features == 2 and pca.n_axes == 2
    np.testing.assert_allclose(warm.mean(0), 0.0, atol=1e-9 * (1 + np.abs(warm).max()))
    assert abs(pca.windows[2].X.mean(0)[0]) > 1.0  # the all-A window is off the warm-up mean
    positive = replace(
        pools, **{n: np.abs(getattr(pools, n)) for n in ("train_a", "train_b", "test_a")}
    )
    positive = replace(positive, test_b=np.abs(pools.test_b), novel=np.abs(pools.novel))
    polar = domain_stream(positive, 3, features="polar", n_axes=3, rows_per_window=100)
    warm = polar.windows[0].X
    assert warm.shape == (1000, 4)  # 3 axes + the log norm; 10 clients by default
    np.testing.assert_allclose([warm.min(), warm.max()], [0.0, 1.0], atol=1e-12)
    assert polar.windows[2].X_test[-10:, -1].min() > 1.0  # novel rows: more norm than seen


def test_domain_stream_errors_are_named():
    rng = np.random.default_rng(3)
    pools = toy_pools(rng)
    for kwargs, match in (
        ({"n_windows": 0}, "n_windows"),
        ({"rows_per_window": 0}, "rows_per_window"),
        ({"test_novel": 0}, "test_novel"),
        ({"first_share": 1.5}, "first_share"),
        ({"kind": "sine"}, "kind must be one of"),
        ({"features": "fourier"}, "features must be one of"),
        ({"features": "pca", "n_axes": 9}, "n_axes"),
    ):
        with pytest.raises(ValueError, match=match):
            domain_stream(pools, **{"n_windows": 3, **kwargs})
    with pytest.raises(ValueError, match="widths differ"):
        domain_stream(replace(pools, train_b=pools.train_b[:, :2]), 2)
    with pytest.raises(ValueError, match="clients_a and clients_b"):
        domain_stream(replace(pools, clients_a=np.zeros(200, np.int64)), 2)
    with pytest.raises(ValueError, match="DomainPools"):
        domain_stream({"train_a": pools.train_a}, 2)


def test_doctests():
    import doctest

    import fednovelty.datasets.streams as streams

    result = doctest.testmod(streams, raise_on_error=False)
    assert result.attempted >= 3 and result.failed == 0
