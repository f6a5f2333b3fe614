"""The numbers behind the dashboard pages (app/fednovelty_app/analysis.py)."""

import numpy as np
import pandas as pd
import pytest
from fednovelty_app.analysis import (
    adaptation,
    client_rows,
    confusion_at,
    curves,
    explain_row,
    history_frame,
    joint_view,
    metrics_or_none,
    most_responsible,
    partition_table,
    per_client_auroc,
    score_axis,
    score_rows,
    scored_test_rows,
    training_clients,
)
from fednovelty_app.data import adbench_bundle
from fednovelty_app.training import DataSettings, MethodSettings, train
from sklearn.mixture import GaussianMixture

from fednovelty import FedGMMDetector
from fednovelty.evaluation import auroc


def test_confusion_counts_at_a_threshold():
    novel = np.array([0, 0, 0, 1, 1])
    scores = np.array([0.1, 0.5, 0.9, 0.4, 0.95])
    counts = confusion_at(novel, scores, 0.45)
    assert (counts["tp"], counts["fp"], counts["fn"], counts["tn"]) == (1, 2, 1, 1)
    assert counts["flagged"] == 3
    assert counts["precision"] == pytest.approx(1 / 3) and counts["recall"] == 0.5
    assert confusion_at(novel, scores, 2.0)["flagged"] == 0
    assert np.isnan(confusion_at(novel, scores, 2.0)["precision"])


def test_metrics_need_both_classes_and_known_labels():
    assert metrics_or_none([0, 1, 0, 1], [0.1, 0.9, 0.2, 0.8])["auroc"] == 1.0
    assert metrics_or_none([0, 0], [0.1, 0.2]) is None
    assert metrics_or_none([-1, -1], [0.1, 0.2]) is None
    c = curves([0, 1, 0, 1], [0.1, 0.9, 0.2, 0.8])
    assert c["tpr"][-1] == 1.0 and c["fpr"][0] == 0.0 and c["precision"].max() == 1.0


def test_scores_of_the_pooled_test_set_and_of_one_client(joint_run):
    det, bundle = joint_run.detector, joint_run.bundle
    assert score_axis(det) == ("log p(x)", -1)
    pooled = scored_test_rows(det, bundle)
    assert len(pooled) == bundle.X_test.shape[0]
    np.testing.assert_allclose(pooled.value, det.log_px(bundle.frame(bundle.X_test)))
    assert set(pooled.group) == {"normal", "novel"}
    client = bundle.client_ids[1]
    mine = scored_test_rows(det, bundle, client)
    rows = client_rows(bundle, client)
    assert len(mine) == rows.sum() < len(pooled)
    own = det.log_px(bundle.frame(bundle.X_test[rows]), client=client)
    np.testing.assert_allclose(mine.value, own)


def test_joint_view_separates_label_novelty_from_input_novelty(joint_run):
    frame, aurocs = joint_view(joint_run.detector, joint_run.bundle, max_rows=300)
    assert set(frame.group) == {"normal", "novel inputs", "permuted labels"}
    normal = frame[frame.group == "normal"]
    permuted = frame[frame.group == "permuted labels"]
    np.testing.assert_allclose(permuted.log_px.to_numpy(), normal.log_px.to_numpy())
    assert aurocs["permuted labels by log p(x)"] == pytest.approx(0.5)
    assert aurocs["permuted labels by log p(y|x)"] > 0.6  # a tiny model: 6 rounds, 1 epoch
    assert aurocs["novel inputs by log p(x)"] > 0.7
    novel = frame[frame.group == "novel inputs"]
    is_novel = np.r_[np.zeros(len(normal)), np.ones(len(novel))]
    expected = auroc(is_novel, -np.r_[normal.log_py_given_x, novel.log_py_given_x])
    assert aurocs["novel inputs by log p(y|x)"] == pytest.approx(expected)
    assert len(normal) <= 300


def test_partition_and_clients(joint_run):
    det, bundle = joint_run.detector, joint_run.bundle
    counts, ids, values = partition_table(bundle)
    assert counts.shape == (len(ids), len(values)) and counts.sum() == len(bundle.partition_labels)
    assert 4 in ids  # the unseen client is drawn too
    table = per_client_auroc(det, bundle)
    assert list(table.client) == [str(c) for c in bundle.client_ids]
    assert set(table.weights) == {"own pi_c"}
    assert table.n_rows.sum() == bundle.X_test.shape[0]
    history = history_frame(det)
    assert len(history) == det.n_rounds_ and history.bytes_up.sum() == det.bytes_up_


def test_per_client_auroc_needs_a_per_client_view():
    bundle = adbench_bundle("4_breastw", n_clients=3, alpha=1.0, n_unseen=0, seed=0)
    data = DataSettings(source="4_breastw", n_clients=3, alpha=1.0, n_unseen=0)
    dem = train(data, MethodSettings(method="DEM", n_components=2, max_iter=10), bundle)
    assert per_client_auroc(dem.detector, bundle) is None  # same global model everywhere
    fedgmm = train(data, MethodSettings(method="FedGMM", n_components=2, max_iter=10), bundle)
    table = per_client_auroc(fedgmm.detector, bundle)
    assert len(table) == 3 and table.n_rows.eq(bundle.X_test.shape[0]).all()
    assert table.auroc.between(0, 1).all()


def test_adaptation_before_and_after(joint_run):
    det, bundle = joint_run.detector, joint_run.bundle
    client = bundle.unseen[0]
    result = adaptation(det, bundle, client.client_id, 40)
    assert result.n_samples == 40 and result.labelled
    assert result.trace.shape == (result.n_iter + 1, det.n_components_)
    np.testing.assert_allclose(result.trace[0], det.weights_, atol=1e-6)
    np.testing.assert_allclose(result.trace.sum(axis=1), 1.0)
    assert 0 <= result.accuracy_before <= 1 and 0 <= result.auroc_after <= 1
    x_only = adaptation(det, bundle, client.client_id, 10**6, use_labels=False)
    assert x_only.n_samples == client.X_adapt.shape[0] and not x_only.labelled
    with pytest.raises(ValueError, match="not held out"):
        adaptation(det, bundle, 0, 10)


def test_most_responsible_matches_scikit_learn():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (150, 2)), rng.normal(6, 1, (150, 2))])
    groups = np.repeat([0, 1, 2], 100)
    for cov in ("full", "diag", "tied", "spherical"):
        det = FedGMMDetector(2, covariance_type=cov, random_state=0)
        det.fit(X, groups=groups)
        gm = GaussianMixture(2, covariance_type=cov)
        gm.weights_, gm.means_ = det.weights_, det.means_
        gm.covariances_, gm.precisions_cholesky_ = det.covariances_, det.precisions_cholesky_
        np.testing.assert_array_equal(most_responsible(det, X), gm.predict(X))
        clients = [None] * 100 + [2] * 200  # rows 100.. under client 2's own weights
        gm.weights_ = det.client_weights_[2]
        with np.errstate(divide="ignore"):  # a personal weight may be 0
            expected = gm.predict(X)[100:]
        np.testing.assert_array_equal(most_responsible(det, X, clients)[100:], expected)


def test_training_clients_match_uploaded_values_as_text(joint_run):
    det = joint_run.detector
    assert training_clients(det, ["1", 2, "nobody", np.int64(0)]) == [1, 2, None, 0]


def test_explain_row_is_the_detectors_explanation(joint_run):
    det, bundle = joint_run.detector, joint_run.bundle
    why = explain_row(det, bundle, 3)
    expected = det.explain(bundle.frame(bundle.X_test[3:4]))
    assert why["component"] == expected.component.iloc[0]
    assert why["mahalanobis_sq"] == expected.mahalanobis_sq.iloc[0]
    assert list(why["shares"].index) == list(bundle.feature_names)
    assert why["shares"].sum() == pytest.approx(1.0)
    client = bundle.client_ids[1]
    mine = explain_row(det, bundle, 0, client)
    rows = bundle.X_test[client_rows(bundle, client)]
    own = det.explain(bundle.frame(rows[:1]), client=client)
    assert mine["responsibility"] == own.responsibility.iloc[0]
    with pytest.raises(ValueError, match="row must be in"):
        explain_row(det, bundle, len(rows), client)


def test_score_rows_with_clients_and_labels(joint_run):
    det, bundle = joint_run.detector, joint_run.bundle
    X = bundle.frame(bundle.X_test[:50])
    clients = np.array([bundle.client_ids[0]] * 25 + ["nobody"] * 25, dtype=object)
    labels = bundle.y_test[:50]
    table, notes = score_rows(det, X, clients=clients, labels=labels, threshold=0.0)
    assert list(table.columns) == [
        "log_px",
        "log_py_given_x",
        "anomaly_score",
        "flag",
        "component",
    ]
    own = det.log_px(X.iloc[:25], client=bundle.client_ids[0])
    np.testing.assert_allclose(table.log_px[:25], own)
    np.testing.assert_allclose(table.log_px[25:], det.log_px(X.iloc[25:]))
    np.testing.assert_allclose(table.log_py_given_x, det.log_py_given_x(X, labels))
    assert (table.flag == (table.anomaly_score > 0.0)).all()
    assert any("nobody" in note for note in notes)
    plain, _ = score_rows(det, X)
    assert (plain.flag == (plain.anomaly_score > det.threshold_)).all()


def test_score_rows_of_a_baseline_has_no_log_px():
    bundle_frame = pd.DataFrame(np.random.default_rng(0).normal(size=(60, 2)), columns=["a", "b"])
    from pyod.models.ecod import ECOD

    det = ECOD().fit(bundle_frame)
    table, notes = score_rows(det, bundle_frame, labels=np.zeros(60))
    assert list(table.columns) == ["anomaly_score", "flag"]
    assert any("without labels" in n for n in notes)
    assert any("no Gaussian components" in n for n in notes)
    assert most_responsible(det, bundle_frame) is None and explain_row(det, None, 0) is None


def test_the_knn_markers_show_their_log_tail_probability():
    from fednovelty import FedKNNMarkerDetector

    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 2))
    det = FedKNNMarkerDetector(n_components=3, random_state=0).fit(X, groups=np.repeat([0, 1], 60))
    assert score_axis(det) == ("log tail probability", -1)
    assert score_axis(FedGMMDetector(2, random_state=0).fit(X)) == ("log p(x)", -1)
