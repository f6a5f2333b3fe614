"""Conformal alarms in the dashboard (app/fednovelty_app/conformal.py, the p-value histogram,
the Train page's calibration choice and the pages that show the thresholds).

References are independent of the helpers' path: alarms by their definition
(``score > threshold`` on ``decision_function``), exact binomial intervals from the beta
quantiles, histogram densities counted by hand, the p-values' grid from the clients'
calibration row counts, and ``fednovelty score``'s own conformal columns."""

import copy
import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest
from fednovelty_app import conformal
from fednovelty_app.plots import COLORS, p_value_histogram
from fednovelty_app.training import (
    DataSettings,
    MethodSettings,
    build_bundle,
    build_detector,
    calibrates,
    model_from_bytes,
    model_to_bytes,
    run_key,
    train,
    uploaded_run,
)
from scipy.stats import beta
from streamlit.testing.v1 import AppTest

ALPHA = 0.05
DATA = DataSettings(n_clients=4, n_unseen=1, n_features=4, seed=0)


@pytest.fixture(scope="module")
def fitted():
    """FedGMM (personal weights, x only) with conformal alarms at alpha 0.05 on 4 synthetic
    clients of 72-173 training rows: 14-34 held out each, so some clients have a threshold
    of their own (19 rows needed) and some take the federation's."""
    bundle = build_bundle(DATA)
    method = MethodSettings(joint=False, max_iter=6, calibration="conformal", alpha=ALPHA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the clients that take the federation's threshold
        run = train(DATA, method, bundle)
    return run.detector, bundle


def alarms_by_definition(detector, X, client=None) -> np.ndarray:
    """1 where ``decision_function`` (under the client's weights) exceeds its threshold."""
    if client is None:
        return (detector.decision_function(X) > detector.threshold_).astype(int)
    scores = detector.decision_function(X, client=client)
    return (scores > detector.client_thresholds_[client]).astype(int)


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    low = 0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1)
    high = 1.0 if k == n else beta.ppf(0.975, k + 1, n - k)
    return float(low), float(high)


# ----------------------------------------------------------------------------- training
def test_the_train_settings_build_a_conformal_detector():
    assert calibrates("FedGMM") and calibrates("FedGenGMM") and not calibrates("IForest")
    plain = MethodSettings()
    settings = MethodSettings(calibration="conformal", alpha=0.02)
    assert run_key(DATA, plain) != run_key(DATA, settings)
    detector = build_detector(settings, seed=0)
    assert (detector.calibration, detector.alpha) == ("conformal", 0.02)
    assert build_detector(plain, seed=0).calibration == "contamination"
    joint = build_detector(settings, seed=0, joint=True)
    assert (joint.calibration, joint.alpha) == ("conformal", 0.02)
    with pytest.raises(ValueError, match="IForest has no conformal calibration"):
        build_detector(MethodSettings(method="IForest", calibration="conformal"), seed=0)
    with pytest.raises(ValueError, match="calibration must be one of"):
        build_detector(MethodSettings(calibration="split"), seed=0)


def test_an_uploaded_conformal_model_keeps_its_calibration(fitted):
    detector, bundle = fitted
    loaded = model_from_bytes(model_to_bytes(detector))
    run = uploaded_run(loaded, DATA, bundle, "abc")
    assert (run.method.calibration, run.method.alpha) == ("conformal", ALPHA)
    assert conformal.is_conformal(run.detector)
    assert run.detector.client_thresholds_ == detector.client_thresholds_


# ----------------------------------------------------------------------------- table
def test_threshold_table_rates_are_the_clients_alarms_on_their_normal_test_rows(fitted):
    detector, bundle = fitted
    table = conformal.threshold_table(detector, bundle)
    clients = list(detector.client_thresholds_)
    assert table.client.tolist() == [*map(str, clients), conformal.FEDERATION]
    assert set(table.source[:-1]) == {"own", "federation"}  # both kinds in this fit
    assert (table.alpha == ALPHA).all()
    normal = bundle.novel_test == 0
    for (_, row), client in zip(table.iloc[:-1].iterrows(), clients, strict=True):
        assert row["source"] == detector.calibration_sources_[client]
        assert row["calibration rows"] == detector.calibration_rows_[client]
        assert row["threshold"] == detector.client_thresholds_[client]
        X = bundle.frame(bundle.X_test[normal & (bundle.groups_test == client)])
        flags = alarms_by_definition(detector, X, client)
        assert row["normal test rows"] == len(X) > 0
        assert row["false alarms"] == flags.sum()
        assert row["false-alarm rate"] == pytest.approx(flags.mean(), rel=1e-12)
        low, high = clopper_pearson(int(flags.sum()), len(X))
        assert row["95 % low"] == pytest.approx(low, rel=1e-9, abs=1e-15)
        assert row["95 % high"] == pytest.approx(high, rel=1e-9)
    federation = table.iloc[-1]
    flags = alarms_by_definition(detector, bundle.frame(bundle.X_test[normal]))
    assert federation["threshold"] == detector.threshold_
    assert federation["calibration rows"] == sum(detector.calibration_rows_.values())
    assert federation["false-alarm rate"] == pytest.approx(flags.mean(), rel=1e-12)


def test_a_pooled_test_set_has_no_per_client_rates(fitted):
    detector, bundle = fitted
    table = conformal.threshold_table(detector, dataclasses.replace(bundle, groups_test=None))
    assert table["false-alarm rate"][:-1].isna().all()
    assert (table["normal test rows"][:-1] == 0).all()
    assert table["normal test rows"].iloc[-1] == int((bundle.novel_test == 0).sum())


# ----------------------------------------------------------------------------- p-values
def test_view_p_values_route_each_row_to_its_client(fitted):
    detector, bundle = fitted
    pooled, grid = conformal.view_p_values(detector, bundle)
    assert grid is None  # clients with own histograms of different sizes
    for client in detector.client_thresholds_:
        rows = bundle.groups_test == client
        X = bundle.frame(bundle.X_test[rows])
        expected = detector.p_values(X, client=client)
        np.testing.assert_array_equal(pooled.p_value[rows], expected)
        view, grid = conformal.view_p_values(detector, bundle, client)
        np.testing.assert_array_equal(view.p_value, expected)
        groups = np.where(bundle.novel_test[rows] == 1, "novel", "normal")
        assert view.group.tolist() == groups.tolist()
        # own histogram: its held-out rows; else the federation's: every client's
        own = detector.calibration_sources_[client] == "own"
        n = detector.calibration_rows_[client] if own else sum(detector.calibration_rows_.values())
        assert grid == n + 1
        np.testing.assert_allclose(view.p_value * grid, np.round(view.p_value * grid), atol=1e-9)


def test_p_value_edges_hold_equal_runs_of_the_grid():
    np.testing.assert_array_equal(conformal.p_value_edges(None, 4), [0, 0.25, 0.5, 0.75, 1])
    # 30 values in 20 bins: floor(1.5 i + 0.5) of them up to edge i, by hand
    cuts = [0, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 23, 24, 26, 27, 29, 30]
    np.testing.assert_allclose(conformal.p_value_edges(30), np.array(cuts) / 30, rtol=1e-15)
    np.testing.assert_allclose(conformal.p_value_edges(7), np.arange(8) / 7, rtol=1e-15)
    for bad in ({"grid": 0}, {"grid": 5, "n_bins": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            conformal.p_value_edges(**bad)


@pytest.mark.parametrize("grid", [7, 21, 30, 85, 1001])
def test_exactly_uniform_p_values_look_flat(grid):
    """Each value j / grid once (as a conformal p-value computes it): density 1 in every
    bin; equal-width bins would not be flat for 21, 30 or 85 values."""
    p = (1.0 + np.arange(grid)) / grid
    frame = pd.DataFrame({"p_value": p, "group": "normal"})
    (bars,) = p_value_histogram(frame, conformal.p_value_edges(grid)).data
    np.testing.assert_allclose(bars.y, 1.0, rtol=1e-12)
    assert sum(bars.customdata) == grid


def test_p_value_histogram_counts_by_hand():
    frame = pd.DataFrame(
        {
            "p_value": [0.25, 0.5, 0.75, 1.0, 0.1, 0.2, 0.3, 0.9],
            "group": ["normal"] * 4 + ["novel"] * 4,
        }
    )
    fig = p_value_histogram(frame, np.array([0.0, 0.5, 1.0]), alpha=0.05, title="t")
    normal, novel = fig.data
    assert (normal.name, novel.name) == ("normal", "novel")
    assert novel.marker.color == COLORS["novel"] and fig.layout.barmode == "overlay"
    # right-closed bins: 0.5 counts in (0, 0.5]; density = share / width
    assert list(normal.customdata) == [2, 2] and list(novel.customdata) == [3, 1]
    np.testing.assert_allclose(normal.y, [1.0, 1.0])
    np.testing.assert_allclose(novel.y, [1.5, 0.5])
    assert list(normal.x) == [0.25, 0.75] and list(normal.width) == [0.5, 0.5]
    uniform, alpha = fig.layout.shapes
    assert (uniform.y0, uniform.y1) == (1.0, 1.0) and (alpha.x0, alpha.x1) == (0.05, 0.05)
    assert fig.layout.title.text == "t"


# ----------------------------------------------------------------------------- new clients
def test_unseen_alarms_before_and_after_calibrate(fitted):
    detector, bundle = fitted
    (unseen,) = bundle.unseen
    before = copy.deepcopy(detector.client_thresholds_)
    result = conformal.unseen_alarms(detector, bundle, unseen.client_id, 50)
    assert detector.client_thresholds_ == before  # the model given is not changed
    assert unseen.client_id not in detector.calibration_sources_
    normal = np.vstack([unseen.X_adapt, unseen.X_eval[unseen.novel_eval == 0]])
    rest, novel = bundle.frame(normal[50:]), bundle.frame(unseen.X_eval[unseen.novel_eval == 1])
    assert (result.n_calibration, result.n_normal, result.n_novel) == (50, len(rest), len(novel))
    assert result.threshold_before == detector.threshold_
    assert result.false_alarm_before == pytest.approx(
        alarms_by_definition(detector, rest).mean(), rel=1e-12
    )
    assert result.detected_before == pytest.approx(
        alarms_by_definition(detector, novel).mean(), rel=1e-12
    )
    own = copy.deepcopy(detector).calibrate(bundle.frame(normal[:50]), unseen.client_id)
    threshold = own.client_thresholds_[unseen.client_id]
    assert result.threshold_after == threshold
    scores = detector.decision_function(rest)  # a new client: the shared model's scores
    assert result.false_alarm_after == pytest.approx(np.mean(scores > threshold), rel=1e-12)
    novel_scores = detector.decision_function(novel)
    assert result.detected_after == pytest.approx(np.mean(novel_scores > threshold), rel=1e-12)
    for bad in (0, len(normal)):
        with pytest.raises(ValueError, match=r"n_rows must be in \[1, "):
            conformal.unseen_alarms(detector, bundle, unseen.client_id, bad)


def test_contamination_models_are_not_conformal(joint_run):
    assert not conformal.is_conformal(joint_run.detector)
    with pytest.raises(ValueError, match="not fitted with calibration='conformal'"):
        conformal.unseen_alarms(joint_run.detector, joint_run.bundle, 4, 10)


def test_row_alarms_match_fednovelty_score(fitted):
    from fednovelty._cli.scoring import conformal_columns

    detector, bundle = fitted
    X = bundle.frame(bundle.X_test[:12])
    clients = [*bundle.groups_test[:8].tolist(), "2", "zz", 3, "zz"]
    table, notes = conformal.row_alarms(detector, X, clients)
    expected = conformal_columns(detector, X, pd.Series(clients, dtype=object), None)
    np.testing.assert_array_equal(table.p_value, expected["p_value"])
    np.testing.assert_array_equal(table.alarm, expected["is_anomaly"])
    assert table.alarm[8] == alarms_by_definition(detector, X.iloc[8:9], 2)[0]  # "2" is 2
    assert table.alarm[9] == alarms_by_definition(detector, X.iloc[9:10])[0]
    assert len(notes) == 1 and "client(s) zz have no conformal threshold" in notes[0]
    pooled, notes = conformal.row_alarms(detector, X)
    np.testing.assert_array_equal(pooled.alarm, alarms_by_definition(detector, X))
    assert notes == []


# ----------------------------------------------------------------------------- pages
QUICK = {"train_syn_clients": 4, "train_syn_features": 4, "train_unseen": 1,
         "train_rounds": 6, "train_joint": False}  # fmt: skip
PAGES = {
    "train": "pages/1_Train.py",
    "scores": "pages/2_Scores.py",
    "clients": "pages/4_Clients.py",
    "unseen": "pages/5_Unseen_client.py",
    "score": "pages/6_Score_your_data.py",
}


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(PAGES[page]).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    parts = [*at.subheader, *at.caption, *at.markdown]
    return "\n".join(p.value for p in parts)


def metric_values(at: AppTest) -> dict:
    return {m.label: m.value for m in at.metric}


def upload_rows(at: AppTest) -> pd.DataFrame:
    run = at.session_state["run"]
    rows = run.bundle.frame(run.bundle.X_test[:30])
    rows["client"] = run.bundle.groups_test[:30]
    content = rows.to_csv(index=False).encode()
    at.file_uploader(key="score_file").set_value(("rows.csv", content, "text/csv")).run()
    assert not at.exception and not at.error
    return at.dataframe[0].value


@pytest.mark.filterwarnings("ignore::fednovelty.exceptions.ConformalCalibrationWarning")
def test_conformal_pages_and_none_in_contamination_mode(app_dir):
    at = AppTest.from_file(str(app_dir / "Home.py"), default_timeout=120)
    for key, value in QUICK.items():
        at.session_state[key] = value
    goto(at.run(), "train")
    assert at.radio(key="train_calibration").value == "contamination"
    assert "train_alpha" not in [n.key for n in at.number_input]
    at.button(key="do_train").click().run()
    assert at.session_state["run"].detector.calibration == "contamination"
    for page in ("scores", "clients", "unseen"):
        assert "onformal" not in texts(goto(at, page)), page
        assert not any("False-alarm" in label for label in metric_values(at)), page
    assert "p_value" not in upload_rows(goto(at, "score"))

    goto(at, "train")
    at.radio(key="train_calibration").set_value("conformal").run()
    at.number_input(key="train_alpha").set_value(ALPHA).run()
    at.button(key="do_train").click().run()
    assert not at.exception and not at.error
    run = at.session_state["run"]
    detector, bundle = run.detector, run.bundle
    assert (detector.calibration, detector.alpha) == ("conformal", ALPHA)
    assert "Conformal alarms at alpha = 0.05" in texts(at)

    goto(at, "scores")
    assert "Conformal alarms (alpha = 0.05)" in texts(at)
    shown = next(d.value for d in at.dataframe if "false-alarm rate" in d.value)
    expected = conformal.threshold_table(detector, bundle)
    pd.testing.assert_frame_equal(shown.reset_index(drop=True), expected)
    spec = at.get("plotly_chart")[-2].proto.spec  # before the explained row's bars
    assert "Conformal p-values" in spec and "uniform" in spec
    assert len(at.get("plotly_chart")) == 5  # histogram, ROC, PR, p-values, explained row

    goto(at, "clients")
    assert "Alarm thresholds per client (conformal, alpha = 0.05)" in texts(at)
    assert any("false-alarm rate" in d.value for d in at.dataframe)

    goto(at, "unseen")
    (unseen,) = bundle.unseen
    slider = at.slider(key=next(s.key for s in at.slider if "calibrate" in s.label))
    assert slider.value == 50
    for n in (50, 20):
        slider.set_value(n).run()
        result = conformal.unseen_alarms(detector, bundle, unseen.client_id, n)
        values = metric_values(at)
        assert values["False-alarm rate before"] == f"{result.false_alarm_before:.3f}"
        assert values["False-alarm rate after"] == f"{result.false_alarm_after:.3f}"
        assert f"first {n} normal rows" in texts(at)

    scored = upload_rows(goto(at, "score"))
    assert {"p_value", "alarm"} <= set(scored)
    alarms, _ = conformal.row_alarms(detector, bundle.frame(bundle.X_test[:30]),
                                     bundle.groups_test[:30])  # fmt: skip
    np.testing.assert_array_equal(scored.alarm, alarms.alarm)
    assert metric_values(at)["Conformal alarms (alpha 0.05)"] == str(int(alarms.alarm.sum()))


def test_baselines_offer_no_conformal_choice(app_dir):
    at = AppTest.from_file(str(app_dir / "Home.py"), default_timeout=120)
    at.session_state["train_method"] = "IForest"
    goto(at.run(), "train")
    assert "train_calibration" not in [r.key for r in at.radio]
