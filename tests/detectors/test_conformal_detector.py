"""``calibration="conformal"`` (``fednovelty.detectors._conformal``): per-client split-conformal
thresholds, p-values, Benjamini-Hochberg discoveries, ``calibrate``, saving, and PyOD's
contamination threshold left as it was.

The references are computed here, never through the detector's calibration code: a client's
threshold is the ``k``-th smallest of its held-out rows' scores (the rows ``calibration_index_``
names, scored with ``decision_function(X, client=c)``), ``k = ceil((1 - alpha)(n + 1))`` in
integer arithmetic; the bin edges are minus the model's highest log-density (SciPy's
log-sum-exp of its log-density at its means) plus the fixed offsets; the p-values count, for
each calibration score, the upper edge of its bin; Benjamini-Hochberg is written out. The
false-alarm counts on fresh rows are checked against their exact law under the conformal
guarantee: given ``n`` exchangeable calibration scores, the alarms among ``m`` fresh rows are
Beta-binomial with ``a = n + 1 - k``, ``b = k`` (mean ``a / (n + 1) <= alpha``).
"""

from __future__ import annotations

import copy
import json
import math
import warnings

import numpy as np
import pytest
from _every_estimator import NAMES, build, data, fit
from scipy.special import logsumexp
from scipy.stats import betabinom

import fednovelty
from fednovelty import FedGMMDetector, StreamingFedGMMDetector
from fednovelty.detectors.options import Privacy
from fednovelty.exceptions import ConformalCalibrationWarning, ModelFormatError

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

ALPHA = 0.05
SHARE = 0.5
#: three Gaussians in 2-d; each client draws them with its own weights.
MEANS = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
WEIGHTS = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.34, 0.33, 0.33]])
#: ... and its own spread: client 3's rows are broader than the shared Gaussians.
SCALES = (1.0, 1.0, 1.0, 1.4)
ROWS = 2500  # per client: 1,250 held out at SHARE
#: two-sided level of the exact intervals (each count is outside with probability below it).
LEVEL = 1e-6
OFFSETS = np.concatenate([[0.0], np.geomspace(1e-4, 1e6, 4096)])


def draw(rng, weights, n: int, scale: float = 1.0) -> np.ndarray:
    """``n`` rows of the mixture of ``MEANS`` (unit covariances times ``scale``)."""
    component = rng.choice(len(MEANS), size=n, p=weights)
    return MEANS[component] + scale * rng.normal(size=(n, 2))


def rank(n: int, alpha: float) -> int:
    """``ceil((1 - alpha)(n + 1))`` exactly, for ``alpha`` a multiple of 1/100."""
    hundredths = round(alpha * 100)
    return min(-(-(100 - hundredths) * (n + 1) // 100), n + 1)


def held_out(detector, groups, client) -> np.ndarray:
    """Positions in ``X`` of ``client``'s held-out rows (``calibration_index_``)."""
    index = detector.calibration_index_
    return index[groups[index] == client]


@pytest.fixture(scope="module")
def federation():
    """Four clients of 2,500 rows with different mixture weights (and client 3 broader), and
    the conformal FedGMM (personal weights) fitted on them (shared: do not modify)."""
    rng = np.random.default_rng(0)
    X = np.vstack([draw(rng, w, ROWS, scale) for w, scale in zip(WEIGHTS, SCALES, strict=True)])
    groups = np.repeat(np.arange(len(WEIGHTS)), ROWS)
    detector = FedGMMDetector(
        3,
        max_iter=30,
        random_state=0,
        calibration="conformal",
        alpha=ALPHA,
        calibration_share=SHARE,
    ).fit(X, groups=groups)
    return X, groups, detector


# ----------------------------------------------------------------------------- the split
def test_each_client_holds_out_its_share_and_trains_on_the_rest(federation):
    X, groups, det = federation
    for client in range(len(WEIGHTS)):
        rows = held_out(det, groups, client)
        assert rows.size == math.floor(SHARE * ROWS) == det.calibration_rows_[client]
    assert len(det.decision_scores_) == len(X) - det.calibration_index_.size
    keep = np.ones(len(X), bool)
    keep[det.calibration_index_] = False
    # the same fit on the training rows alone, without calibration: the same model
    alone = FedGMMDetector(3, max_iter=30, random_state=0).fit(X[keep], groups=groups[keep])
    np.testing.assert_allclose(det.means_, alone.means_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(det.client_weights_, alone.client_weights_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(det.decision_scores_, alone.decision_scores_, rtol=1e-10)
    kinds = [r["kind"] for r in det.history_]
    assert kinds[-1] == "calibration" and "calibration" not in kinds[:-1]
    assert [r["round"] for r in det.history_] == list(range(1, det.n_rounds_ + 1))
    assert det.n_rounds_ == alone.n_rounds_ + 1
    assert det.bytes_up_ == sum(r["bytes_up"] for r in det.history_)


def test_a_client_threshold_is_its_held_out_order_statistic(federation):
    X, groups, det = federation
    rng = np.random.default_rng(1)
    fresh = draw(rng, WEIGHTS[0], 500)
    for client in range(len(WEIGHTS)):
        scores = det.decision_function(X[held_out(det, groups, client)], client=client)
        expected = np.sort(scores)[rank(scores.size, ALPHA) - 1]
        got = det.client_thresholds_[client]
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)
        assert det.calibration_sources_[client] == "own"
        own = det.decision_function(fresh, client=client)
        np.testing.assert_array_equal(det.predict(fresh, client=client), (own > got).astype(int))
    shared = det.decision_function(fresh)
    np.testing.assert_array_equal(det.predict(fresh), (shared > det.threshold_).astype(int))


def test_the_false_alarm_rate_per_client_is_at_most_alpha(federation):
    """Fresh inliers of each client: the alarm count lies within the exact Beta-binomial
    interval of the conformal guarantee, whose mean is at most alpha, and above alpha / 2.
    The federation's threshold used for every client fails the same check: the test can
    fail."""
    _, _, det = federation
    rng = np.random.default_rng(2)
    m = 20_000
    n = det.calibration_rows_[0]
    k = rank(n, ALPHA)
    law = betabinom(m, n + 1 - k, k)
    assert (n + 1 - k) / (n + 1) <= ALPHA
    low, high = law.ppf(LEVEL / 2), law.isf(LEVEL / 2)
    outside_with_federation = 0
    for client, (weights, scale) in enumerate(zip(WEIGHTS, SCALES, strict=True)):
        fresh = draw(rng, weights, m, scale)
        alarms = int(det.predict(fresh, client=client).sum())
        assert low <= alarms <= high, (client, alarms / m, low / m, high / m)
        assert alarms / m >= ALPHA / 2
        federation_alarms = int(
            (det.decision_function(fresh, client=client) > det.threshold_).sum()
        )
        outside_with_federation += not low <= federation_alarms <= high
    assert outside_with_federation >= 1


def test_the_federations_threshold_is_calibrated_for_rows_scored_without_a_client():
    """``predict(X)`` scores with the shared model, so ``threshold_`` is read from the
    held-out rows' shared-model scores, not their personal ones. Three clients, each
    98.5 % one component: a row of it scores about log(0.985 / (1/3)) ~ 1.1 nats lower under
    its client's weights than under the shared ones, so a threshold read from personal
    scores flags 13 % of rows scored without a client at alpha = 5 % (measured before the
    fix). Fresh rows drawn as the held-out pool is alarm at
    most at the exact conformal rate of the pooled held-out rows (the histogram only rounds
    the threshold up), and at more than alpha / 2."""
    rng = np.random.default_rng(6)
    weights = np.full((3, 3), 0.005) + np.eye(3) * 0.985
    X = np.vstack([draw(rng, w, 2000) for w in weights])
    groups = np.repeat(np.arange(3), 2000)
    det = FedGMMDetector(
        3, max_iter=30, random_state=0, calibration="conformal", alpha=ALPHA,
        calibration_share=SHARE,
    ).fit(X, groups=groups)  # fmt: skip
    fresh = np.vstack([draw(rng, w, 6000) for w in weights])
    n = sum(det.calibration_rows_.values())
    k = rank(n, ALPHA)
    law = betabinom(len(fresh), n + 1 - k, k)
    alarms = int(det.predict(fresh).sum())
    assert alarms <= law.isf(LEVEL / 2), (alarms / len(fresh), law.isf(LEVEL / 2) / len(fresh))
    assert alarms / len(fresh) >= ALPHA / 2
    assert np.mean(det.p_values(fresh) <= ALPHA) <= law.isf(LEVEL / 2) / len(fresh)


def test_p_values_are_the_binned_formula(federation):
    X, groups, det = federation
    bound = logsumexp(det.score_samples(det.means_))  # log p at the means, summed
    np.testing.assert_allclose(det.calibration_edges_, -bound + OFFSETS, rtol=0, atol=1e-9)
    edges = det.calibration_edges_
    rng = np.random.default_rng(3)
    fresh = np.vstack([draw(rng, WEIGHTS[1], 300), [[20.0, 20.0], [2.5, 2.5]]])
    client = 1
    calibration = det.decision_function(X[held_out(det, groups, client)], client=client)
    upper = np.array(
        [edges[np.searchsorted(edges, c)] if c <= edges[-1] else np.inf for c in calibration]
    )
    tested = det.decision_function(fresh, client=client)
    expected = np.array([(1 + np.sum(upper >= s)) / (calibration.size + 1) for s in tested])
    np.testing.assert_allclose(det.p_values(fresh, client=client), expected, rtol=1e-12)
    exact = np.array([(1 + np.sum(calibration >= s)) / (calibration.size + 1) for s in tested])
    assert (expected >= exact).all() and np.abs(expected - exact).max() < 0.02
    # the federation's: the shared scores against the summed histogram of every client's
    # held-out rows under the shared model (what predict(X) without a client reads)
    shared = det.decision_function(fresh)
    summed = np.concatenate(
        [det.decision_function(X[held_out(det, groups, c)]) for c in range(len(WEIGHTS))]
    )
    upper = np.array([edges[np.searchsorted(edges, c)] for c in summed])
    expected = np.array([(1 + np.sum(upper >= s)) / (summed.size + 1) for s in shared])
    np.testing.assert_allclose(det.p_values(fresh), expected, rtol=1e-12)


def hand_bh(p: np.ndarray, q: float) -> np.ndarray:
    order = np.argsort(p)
    passed = np.flatnonzero(p[order] <= q * np.arange(1, p.size + 1) / p.size)
    out = np.zeros(p.size, bool)
    if passed.size:
        out[order[: passed[-1] + 1]] = True
    return out


def test_discoveries_keep_the_false_discovery_proportion_near_q(federation):
    _, _, det = federation
    rng = np.random.default_rng(4)
    q, batches, inliers, novel = 0.1, 40, 1000, 50
    proportions = []
    for _ in range(batches):
        batch = np.vstack([draw(rng, WEIGHTS[2], inliers), rng.normal(12.0, 1.0, (novel, 2))])
        found = det.discoveries(batch, q=q, client=2)
        np.testing.assert_array_equal(found, hand_bh(det.p_values(batch, client=2), q))
        assert found[inliers:].all()  # every planted novelty
        proportions.append(found[:inliers].sum() / max(found.sum(), 1))
    target = q * inliers / (inliers + novel)  # BH's bound q m0 / m
    mean, spread = np.mean(proportions), np.std(proportions) / np.sqrt(batches)
    assert target / 2 <= mean <= target + 4 * spread, (mean, target, spread)


def test_calibrate_moves_an_unseen_client_towards_its_own_threshold(federation):
    _, _, fitted = federation
    det = copy.deepcopy(fitted)
    means = det.means_.copy()
    rng = np.random.default_rng(5)
    rows = draw(rng, [0.05, 0.05, 0.9], 6000, scale=1.6)  # broader than any client's
    own = np.sort(det.decision_function(rows))[rank(rows.shape[0], ALPHA) - 1]
    federation_threshold = det.threshold_
    gaps = []
    for n in (10, 3000):
        det.calibrate(rows[:n], client="new")
        threshold = det.client_thresholds_["new"]
        gaps.append(abs(threshold - own))
        assert det.calibration_sources_["new"] == "calibrated"
        assert det.calibration_rows_["new"] == n
    assert gaps[0] < abs(federation_threshold - own) and gaps[1] < gaps[0]
    fresh = rows[3000:]
    np.testing.assert_array_equal(
        det.predict(fresh, client="new"),
        (det.decision_function(fresh) > det.client_thresholds_["new"]).astype(int),
    )
    np.testing.assert_array_equal(det.means_, means)  # the model is not changed
    assert det.client_thresholds_[0] == fitted.client_thresholds_[0]
    with pytest.raises(ValueError, match=r"client 'other' was not seen in fit.*calibrate"):
        det.predict(fresh, client="other")


# ----------------------------------------------------------------------------- few rows
def small_federation():
    """Three clients of 300 rows, one of 40 (8 held out: fewer than the 19 alpha=0.05
    needs) and one of 20 (4 held out: below the privacy floor of 5)."""
    rng = np.random.default_rng(6)
    sizes = [300, 300, 300, 40, 20]
    X = np.vstack([draw(rng, WEIGHTS[i % 4], n) for i, n in enumerate(sizes)])
    groups = np.repeat(np.arange(len(sizes)), sizes)
    return X, groups


def small_detector(**params):
    settings = {"max_iter": 10, "random_state": 0, "calibration": "conformal", "alpha": ALPHA}
    return FedGMMDetector(2, **{**settings, "calibration_share": 0.2, **params})


def test_a_client_with_too_few_rows_takes_the_federations_threshold_with_a_warning():
    X, groups = small_federation()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        det = small_detector().fit(X, groups=groups)
    named = [w for w in caught if issubclass(w.category, ConformalCalibrationWarning)]
    messages = [str(w.message) for w in named]
    few = [m for m in messages if "fewer held-out calibration rows" in m]
    assert len(few) == 1 and "2 of 5 clients" in few[0]
    assert "client 3 (8 rows)" in few[0] and "client 4 (4 rows)" in few[0]
    assert "(19 = ceil(1 / alpha) - 1, about 95 rows of a client" in few[0]
    silent = [m for m in messages if "released no calibration histogram" in m]
    assert len(silent) == 1 and "client 4 (4 rows)" in silent[0] and "client 3" not in silent[0]
    assert all(w.filename == __file__ for w in named)
    for client in (3, 4):
        assert det.client_thresholds_[client] == det.threshold_
        assert det.calibration_sources_[client] == "federation"
    assert det.calibration_counts_.sum() == 3 * 60 + 8  # client 4 withheld its 4 rows
    assert det.history_[-1]["n_skipped"] == 1


def test_the_fits_data_loss_warnings_count_the_training_rows_alone():
    """A client of 10 rows trains on 8 and holds out 2 (below the floor of 5: it releases no
    histogram, which the calibration's warning says); one of 3 rows trains on all 3. The
    fit's data-loss warning counts their training rows, and not the calibration round."""
    from fednovelty.exceptions import DataLossWarning

    X, groups = small_federation()
    position = np.arange(len(X))
    keep = (groups < 3) | (groups == 3) & (position < 910) | (groups == 4) & (position < 943)
    X, groups = X[keep], groups[keep]
    assert np.bincount(groups).tolist() == [300, 300, 300, 10, 3]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small_detector().fit(X, groups=groups)
    losses = [str(w.message) for w in caught if issubclass(w.category, DataLossWarning)]
    assert len(losses) == 1 and "2 of 5 clients" in losses[0]
    assert "client 4 (3 rows;" in losses[0] and "client 3 (8 rows;" in losses[0]
    assert "calibration" not in losses[0]
    calibration = [str(w.message) for w in caught if w.category is ConformalCalibrationWarning]
    silent = [m for m in calibration if "released no calibration histogram" in m]
    assert len(silent) == 1 and "client 3 (2 rows)" in silent[0]


def test_no_client_with_the_floors_rows_fails_the_fit_and_keeps_the_detector():
    X, groups = small_federation()
    few = np.isin(groups, [3, 4])
    det = small_detector(calibration_share=0.1)
    with pytest.raises(ValueError, match=r"no client holds privacy.min_rows=5 held-out rows"):
        det.fit(X[few], groups=groups[few])
    assert not [name for name in vars(det) if name.endswith("_")]


# ----------------------------------------------------------------------------- contamination
def test_contamination_keeps_pyods_threshold_and_refuses_the_conformal_methods(federation):
    X, groups, conformal = federation
    det = FedGMMDetector(3, max_iter=30, random_state=0).fit(X, groups=groups)
    assert det.threshold_ == np.percentile(det.decision_scores_, 100 * (1 - det.contamination))
    assert len(det.decision_scores_) == len(X)
    assert not hasattr(det, "client_thresholds_") and not hasattr(det, "calibration_index_")
    assert "calibration" not in [r["kind"] for r in det.history_]
    for call in (
        lambda: det.predict(X[:3], client=0),
        lambda: det.p_values(X[:3]),
        lambda: det.discoveries(X[:3]),
        lambda: det.calibrate(X[:30], client=9),
    ):
        with pytest.raises(ValueError, match="calibration='conformal'"):
            call()
    refit = copy.deepcopy(conformal).set_params(calibration="contamination")
    refit.fit(X, groups=groups)
    assert not hasattr(refit, "client_thresholds_") and not hasattr(refit, "calibration_index_")
    assert refit.threshold_ == det.threshold_


# ----------------------------------------------------------------------------- saving
def test_save_and_load_keep_the_calibration(federation, tmp_path):
    X, _, fitted = federation
    det = copy.deepcopy(fitted).calibrate(draw(np.random.default_rng(7), WEIGHTS[0], 300), "new")
    det.save(tmp_path / "det.safetensors")
    loaded = fednovelty.load(tmp_path / "det.safetensors")
    assert loaded.client_thresholds_ == det.client_thresholds_
    assert loaded.calibration_rows_ == det.calibration_rows_
    assert loaded.calibration_sources_ == det.calibration_sources_
    assert loaded.threshold_ == det.threshold_
    np.testing.assert_array_equal(loaded.calibration_edges_, det.calibration_edges_)
    np.testing.assert_array_equal(loaded.calibration_counts_, det.calibration_counts_)
    assert loaded.client_calibration_counts_.keys() == det.client_calibration_counts_.keys()
    for client, counts in det.client_calibration_counts_.items():
        np.testing.assert_array_equal(loaded.client_calibration_counts_[client], counts)
    rows = X[:400]
    for client in (None, 0, 3, "new"):
        np.testing.assert_array_equal(
            loaded.predict(rows, client=client), det.predict(rows, client=client)
        )
        np.testing.assert_array_equal(
            loaded.p_values(rows, client=client), det.p_values(rows, client=client)
        )
    np.testing.assert_array_equal(loaded.labels_, det.labels_)


def _tensor(name, change):
    def forge(tensors, document):
        tensors[name] = change(tensors[name].clone())

    return forge


def _attr(name, change):
    def forge(tensors, document):
        change(document["attrs"][name])

    return forge


def _shift_first(t):
    t[0] += 1.0
    return t


def _count_one_more(t):
    t[0, -5] += 1.0
    return t


def _negative_count(t):
    t[3] = -1.0
    return t


def _threshold_up(t):
    t[0] = t[0] + 1.0
    return t


def _last_up(t):
    t[-1] = t[-1] + 1.0
    return t


def _one_more_row(rows):
    rows[0] += 1


def _federation_source(sources):
    sources[0] = "federation"


#: (forgery, what the refusal says): each check of the calibration on load.
FORGERIES = [
    (_tensor("calibration.edges", _shift_first), "'calibration.edges' is not the public grid"),
    (_tensor("calibration.counts", _negative_count), "'calibration.counts' holds 1 value"),
    (_tensor("calibration.counts", lambda t: t * 1e200), "'calibration.counts' must count"),
    (_tensor("calibration.client_counts", _count_one_more), "'calibration.client_counts'"),
    (_tensor("calibration.thresholds", _threshold_up), "'calibration.thresholds'.*outside"),
    (_tensor("calibration.thresholds", lambda t: t * np.nan), "'calibration.thresholds' holds"),
    (_attr("calibration_rows_", _one_more_row), "'calibration_rows_'"),
    (_attr("calibration_sources_", _federation_source), "'calibration.client_counts' has shape"),
    (_tensor("calibration.thresholds", _last_up), "'calibration.thresholds'.*federation's"),
]


@pytest.mark.parametrize(("forge", "message"), FORGERIES, ids=[m for _, m in FORGERIES])
def test_a_forged_calibration_is_refused_by_name(tmp_path, forge, message):
    from test_forged_files import read, write

    X, groups = small_federation()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConformalCalibrationWarning)
        small_detector().fit(X, groups=groups).save(tmp_path / "det.safetensors")
    tensors, document = read(tmp_path / "det.safetensors")
    tensors = dict(tensors)
    document = json.loads(json.dumps(document))
    forge(tensors, document)
    write(tmp_path / "forged.safetensors", tensors, document)
    with pytest.raises(ModelFormatError, match=message):
        fednovelty.load(tmp_path / "forged.safetensors")


def test_the_forgery_sweep_refuses_or_scores_a_conformal_file_finitely(tmp_path):
    """``test_forged_files``' systematic sweep (every tensor and number forged, the checksum
    recomputed) on a conformal file of its rows, with a calibrated client."""
    from test_forged_files import GROUPS, X_HELD, Saved, outputs, read, sweep
    from test_forged_files import X as ROWS_4D

    det = FedGMMDetector(2, max_iter=5, random_state=0, calibration="conformal", alpha=0.1)
    det.fit(ROWS_4D, groups=GROUPS).calibrate(X_HELD[:20], client="new")
    assert set(det.calibration_sources_.values()) == {"own", "calibrated"}
    det.save(tmp_path / "det.safetensors")
    tensors, document = read(tmp_path / "det.safetensors")
    saved = Saved(tensors, document, outputs(fednovelty.load(tmp_path / "det.safetensors")))
    outcomes = sweep(saved, tmp_path / "forged.safetensors")
    calibration = [o for o in outcomes if "calibration" in o.forgery]
    assert len(calibration) >= 40 and all(o.verdict == "refused" for o in calibration[:8])
    bad = [o for o in outcomes if o.verdict in ("broken", "far")]
    assert not bad, "\n".join(f"{o.forgery}: {o.verdict} ({o.detail[:160]})" for o in bad[:20])


# ----------------------------------------------------------------------------- atomic fits
def test_a_failed_fit_leaves_the_detector_as_it_was(federation):
    X, groups, fitted = federation
    det = copy.deepcopy(fitted)
    before = copy.deepcopy(vars(det))

    def fail_at_calibration(record):
        if record.kind == "calibration":
            raise RuntimeError("stop at the calibration round")

    with pytest.raises(RuntimeError, match="calibration round"):
        det.fit(X[::2], groups=groups[::2], callbacks=[fail_at_calibration])
    assert set(vars(det)) == set(before)
    assert det.client_thresholds_ == before["client_thresholds_"]
    np.testing.assert_array_equal(det.calibration_index_, before["calibration_index_"])
    np.testing.assert_array_equal(det.means_, before["means_"])
    assert det.history_ == before["history_"]
    fresh = small_detector()
    with pytest.raises(RuntimeError, match="calibration round"):
        fresh.fit(X[::2], groups=groups[::2], callbacks=[fail_at_calibration])
    assert not [name for name in vars(fresh) if name.endswith("_")]


# ----------------------------------------------------------------------------- privacy
def test_a_private_fit_takes_private_quantiles_and_keeps_no_client_histogram(tmp_path):
    rng = np.random.default_rng(8)
    X = np.vstack([draw(rng, w, 400) for w in WEIGHTS])
    groups = np.repeat(np.arange(4), 400)
    bounds = [[-5.0, -5.0], [10.0, 10.0]]
    det = FedGMMDetector(
        2,
        max_iter=5,
        random_state=0,
        calibration="conformal",
        alpha=0.1,
        privacy=Privacy(epsilon=4.0, delta=1e-5, bounds=bounds),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fit(X, groups=groups)
    assert set(det.calibration_sources_.values()) == {"private"}
    edges = det.calibration_edges_
    assert all(np.isin(t, edges) for t in det.client_thresholds_.values())
    assert det.client_calibration_counts_ == {}
    p = det.p_values(X[:50], client=0)  # no histogram of its own: the federation's
    counts, upper = det.calibration_counts_, np.append(edges, np.inf)
    scores = det.decision_function(X[:50], client=0)
    expected = [(1 + counts[upper >= s].sum()) / (counts.sum() + 1) for s in scores]
    np.testing.assert_allclose(p, np.clip(expected, 0, 1), rtol=1e-12)
    assert det.history_[-1]["kind"] == "calibration" and det.history_[-1]["noise"] > 0
    with pytest.raises(ValueError, match=r"calibrate under privacy\.epsilon"):
        det.calibrate(X[:50], client="new")
    det.save(tmp_path / "private.safetensors")
    loaded = fednovelty.load(tmp_path / "private.safetensors")
    assert loaded.client_thresholds_ == det.client_thresholds_
    assert loaded.threshold_ == det.threshold_


# ----------------------------------------------------------------------------- windows
def test_a_stream_window_recalibrates_every_client():
    rng = np.random.default_rng(9)
    X = np.vstack([draw(rng, w, 300) for w in WEIGHTS[:3]])
    groups = np.repeat(np.arange(3), 300)
    det = StreamingFedGMMDetector(
        3, random_state=0, calibration="conformal", alpha=0.1, calibration_share=0.5
    ).fit(X, groups=groups)
    window = np.vstack([draw(rng, WEIGHTS[1], 300), draw(rng, WEIGHTS[0], 300)])
    window_groups = np.repeat([0, 1], 300)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        det.partial_fit(window, groups=window_groups)
    named = [w for w in caught if issubclass(w.category, ConformalCalibrationWarning)]
    assert len(named) == 1 and "client 2 (0 rows)" in str(named[0].message)
    assert str(named[0].message).startswith("StreamingFedGMMDetector.partial_fit: ")
    assert named[0].filename == __file__
    for client in (0, 1):
        rows = held_out(det, window_groups, client)
        assert rows.size == 150 == det.calibration_rows_[client]
        scores = det.decision_function(window[rows], client=client)
        expected = np.sort(scores)[rank(150, 0.1) - 1]
        assert det.client_thresholds_[client] == pytest.approx(expected, rel=1e-12)
    assert det.client_thresholds_[2] == det.threshold_
    assert det.calibration_sources_[2] == "federation"
    assert len(det.decision_scores_) == 300
    assert det.history_[-1]["kind"] == "calibration"
    assert det.total_bytes_up_ >= det.bytes_up_


def test_a_joint_window_recalibrates_its_clients():
    X, y, groups = data()
    det = build("PFL-FedGMM", calibration="conformal", alpha=0.1, calibration_share=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConformalCalibrationWarning)
        det.fit(X, y, groups)
        det.partial_fit(X.iloc[:80], y[:80], groups[:80])  # clients 0 and 1
    for client in (0, 1):
        rows = held_out(det, groups[:80], client)
        scores = det.decision_function(X.iloc[rows], client=client)
        expected = np.sort(scores)[rank(rows.size, 0.1) - 1]
        assert det.client_thresholds_[client] == pytest.approx(expected, rel=1e-12)
    assert det.calibration_sources_[2] == "federation"


# ----------------------------------------------------------------------------- every detector
DETECTORS = [n for n in NAMES if "calibration" in build(n).get_params(deep=False)]


def test_every_novelty_detector_takes_the_calibration():
    assert len(DETECTORS) >= 10 and "KNN-markers" in DETECTORS and "StreamingFedGMM" in DETECTORS


@pytest.mark.parametrize("name", DETECTORS)
def test_every_detector_calibrates_conformally_and_predicts(name, tmp_path):
    X, y, groups = data()
    det = build(name, calibration="conformal", alpha=0.1, calibration_share=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(det, name, X, y, groups)
    assert det.calibration_rows_ == {c: 20 for c in range(4)}
    assert len(det.decision_scores_) == 80 and det.history_[-1]["kind"] == "calibration"
    assert math.isfinite(det.threshold_)
    first = det.client_ids_[0]
    labels = det.predict(X, client=first)
    assert set(np.unique(labels)) <= {0, 1} and labels.shape == (len(X),)
    assert set(np.unique(det.predict(X))) <= {0, 1}
    p = det.p_values(X, client=first)
    assert ((p > 0) & (p <= 1)).all() and det.discoveries(X, q=0.2).shape == (len(X),)
    det.save(tmp_path / "det.safetensors")
    loaded = fednovelty.load(tmp_path / "det.safetensors")
    assert loaded.client_thresholds_ == det.client_thresholds_
    np.testing.assert_allclose(loaded.p_values(X, client=first), p, rtol=1e-12)


def test_from_model_refuses_the_conformal_calibration():
    with pytest.raises(ValueError, match="from_model cannot calibrate conformally"):
        FedGMMDetector.from_model(None, np.zeros((3, 2)), calibration="conformal")
