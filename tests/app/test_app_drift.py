"""The Drift page's stream helpers: schedules per client, tracking, alarms on a jump."""

import numpy as np
import pytest
from fednovelty_app.drift import StreamSpec, client_share, run_stream, synthetic_window
from fednovelty_app.plots import alarms_figure, tracking_figure


def test_clients_follow_the_schedule_out_of_step():
    spec = StreamSpec(kind="linear", n_windows=10, n_clients=2, offset=0.5)
    assert client_share(spec, 0, 0) == 0.0 and client_share(spec, 0, 1) == pytest.approx(1.0)
    X, groups, shares = synthetic_window(spec, 0, np.random.default_rng(0))
    assert X.shape == (300, 2) and np.bincount(groups).tolist() == [150, 150]
    np.testing.assert_allclose(shares, [0.0, 1.0])


def test_a_stream_tracks_shares_and_alarms_when_b_jumps():
    run = run_stream(StreamSpec(n_windows=20, jump_at=10, kind="constant"))
    assert run.truth.shape == run.learned.shape == (21, 6)
    error = np.abs(run.learned - run.truth)
    assert error[1:10].mean() < 0.05 and error[12:].mean() < 0.05  # before and after the jump
    assert 10 in run.detector.global_alarms_
    assert not run.drift[run.drift.window < 10].alarm.any()
    assert len(tracking_figure(run.truth, run.learned, run.detector.client_ids_).data) == 12
    assert alarms_figure(run.drift).data[-1].name == "alarm"
