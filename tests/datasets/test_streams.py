"""Shift schedules and FEMNIST writer streams (digits = A, letters = B)."""

from __future__ import annotations

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
