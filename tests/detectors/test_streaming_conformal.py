"""StreamingFedGMMDetector(drift_test="conformal"): the documented false-alarm rate on a
stationary stream (exact binomial interval), a jump detected in its window, the clients'
conformal state through save and load, bad settings refused by name."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from fednovelty import StreamingFedGMMDetector, load

CENTERS = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]])


def window(rng, shares, n=100, centers=CENTERS):
    """Rows of clients ``0..len(shares)-1``, each a mixture of ``centers`` with its shares."""
    X, groups = [], []
    for c, share in enumerate(shares):
        comp = rng.choice(len(share), size=n, p=share)
        X.append(centers[comp] + rng.normal(size=(n, 2)))
        groups.append(np.full(n, c))
    return np.concatenate(X), np.concatenate(groups)


def conformal(rng, shares, **kw):
    det = StreamingFedGMMDetector(
        3, random_state=0, drift_test="conformal", drift_resamples=199, **kw
    )
    X, g = window(rng, shares)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a convergence warning on some draws is fine here
        return det.fit(X, groups=g)


def test_false_alarms_on_a_stationary_stream_match_the_documented_rate():
    rng = np.random.default_rng(2)
    shares = rng.dirichlet(np.ones(3), 10)
    det = conformal(rng, shares, false_alarm_rate=0.05)
    for _ in range(40):
        X, g = window(rng, shares)
        det.partial_fit(X, groups=g)
    frame = det.drift_frame()
    tested = frame[frame.p_value.notna()]
    assert len(tested) == 390  # every client from its second streamed window on
    assert (tested.alarm == (tested.p_value <= 0.05)).all()
    low, high = binom.interval(0.999, len(tested), 0.05)  # exact: 7..35 of 390
    assert low <= int(tested.alarm.sum()) <= high
    assert frame.cusum.isna().all()  # the CUSUM does not run beside it
    # the martingale's guarantee is over the whole stream: at most 5 % of the clients
    assert frame.groupby("client").martingale_alarm.any().sum() <= 2


def test_a_population_that_moves_away_is_detected_in_its_window():
    rng = np.random.default_rng(3)
    shares = [[0.4, 0.3, 0.3]] * 6
    det = conformal(rng, shares)
    for _ in range(3):
        det.partial_fit(*_args(window(rng, shares)))
    moved = CENTERS.copy()
    moved[2] = [10.0, 10.0]  # the third population moves where no component sits
    det.partial_fit(*_args(window(rng, shares, centers=moved)))
    frame = det.drift_frame()
    jump = frame[frame.window == 4]
    assert jump.alarm.all() and (jump.p_value <= 0.01).all() and 4 in det.global_alarms_
    before = frame[frame.window == 3].set_index("client").martingale
    assert (jump.set_index("client").martingale > before).all()  # every martingale grows
    assert not frame[frame.window == 1].p_value.notna().any()  # window 1 fills the reference


def test_save_and_load_mid_stream_keep_the_clients_conformal_state(tmp_path):
    rng = np.random.default_rng(5)
    shares = [[0.5, 0.25, 0.25], [0.2, 0.6, 0.2]]
    det = conformal(rng, shares, drift_reference=150)
    for _ in range(2):
        det.partial_fit(*_args(window(rng, shares)))
    det.save(tmp_path / "stream.safetensors")
    again = load(tmp_path / "stream.safetensors")
    for i in range(2):
        for key in ("drift_reference", "drift_log_capital", "drift_windows"):
            np.testing.assert_array_equal(
                again._client_state[i][key].numpy(), det._client_state[i][key].numpy()
            )
    assert again._client_state[0]["drift_reference"].shape == (150,)
    X, g = window(rng, shares)
    det.partial_fit(X, groups=g)
    again.partial_fit(X, groups=g)
    new = pd.DataFrame(det.drift_history_[-2:])
    pd.testing.assert_frame_equal(pd.DataFrame(again.drift_history_[-2:]), new)
    assert new.p_value.between(0, 1).all() and new.cusum.isna().all()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"drift_test": "page"}, "drift_test"),
        ({"drift_reference": 0}, "drift_reference"),
        ({"drift_resamples": 0}, "drift_resamples"),
        ({"drift_resamples": 50}, "drift_resamples=50 cannot resolve false_alarm_rate=0.01"),
    ],
)
def test_bad_settings_are_refused_by_name(bad, match):
    rng = np.random.default_rng(6)
    X, g = window(rng, [[0.5, 0.25, 0.25]] * 2)
    det = StreamingFedGMMDetector(3, random_state=0, **{"drift_test": "conformal", **bad})
    with pytest.raises(ValueError, match=match):
        det.fit(X, groups=g)


def test_the_default_test_is_the_cusum_and_records_no_p_values():
    rng = np.random.default_rng(7)
    shares = [[0.5, 0.25, 0.25]] * 2
    det = StreamingFedGMMDetector(3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fit(*_args(window(rng, shares)))
    det.partial_fit(*_args(window(rng, shares)))
    frame = det.drift_frame()
    assert det.drift_test == "cusum" and frame.p_value.isna().all()
    assert frame.cusum.notna().all() and not frame.martingale_alarm.any()


def _args(pair):
    X, g = pair
    return X, None, g
