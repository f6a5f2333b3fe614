"""Every dashboard page driven by Streamlit's AppTest: widgets set, buttons clicked, the
expected charts and metrics present, no exception element, bad uploads answered with a
message."""

import io

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

UPLOAD = "Upload a CSV / Parquet file"
PAGES = {
    "train": "pages/1_Train.py",
    "scores": "pages/2_Scores.py",
    "joint": "pages/3_Joint_view.py",
    "clients": "pages/4_Clients.py",
    "unseen": "pages/5_Unseen_client.py",
    "score": "pages/6_Score_your_data.py",
    "drift": "pages/7_Drift.py",
    "clusters": "pages/8_Clusters.py",
}


def new_app(app_dir, state: dict | None = None) -> AppTest:
    at = AppTest.from_file(str(app_dir / "Home.py"), default_timeout=120)
    for key, value in (state or {}).items():
        at.session_state[key] = value
    return at.run()


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(PAGES[page]).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> int:
    return len(at.get("plotly_chart"))


def metrics(at: AppTest) -> dict:
    return {m.label: m.value for m in at.metric}


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label == label)


def train(at: AppTest) -> AppTest:
    at.button(key="do_train").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def csv_bytes(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode()


def table(n_clients=3, rows=40, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = n_clients * rows
    frame = pd.DataFrame(rng.normal(size=(n, 3)), columns=["a", "b", "c"])
    frame["site"] = np.repeat([f"s{i}" for i in range(n_clients)], rows)
    frame["label"] = (frame.a + frame.b > 0).astype(int)
    frame["novel"] = (rng.random(n) < 0.15).astype(int)
    frame.loc[frame.novel == 1, ["a", "b", "c"]] += 6.0
    return frame


def explain_scores_row(at: AppTest, client=None) -> None:
    """Pick test row 2 of the Scores page's view and check the explanation shown for it
    against the detector's own ``explain`` (under the client's weights where it has them)."""
    at.number_input[0].set_value(2).run()
    assert not at.exception
    run = at.session_state["run"]
    bundle = run.bundle
    rows = np.ones(len(bundle.X_test), bool) if client is None else bundle.groups_test == client
    expected = run.detector.explain(bundle.frame(bundle.X_test[rows][2:3]), client=client)
    shown = metrics(at)
    assert shown["Component"] == str(expected.component.iloc[0])
    assert shown["Squared distance"] == f"{expected.mahalanobis_sq.iloc[0]:.2f}"
    bars = at.get("plotly_chart")[-1].proto.spec
    assert "share of the squared Mahalanobis distance" in bars and "Row 2" in bars


def test_pages_without_a_model_point_to_train(app_dir):
    at = new_app(app_dir)
    assert at.title[0].value == "fednovelty dashboard" and not at.exception
    for page in ("scores", "joint", "clients", "unseen", "score"):
        goto(at, page)
        assert "No model yet" in at.info[0].value


def test_default_data_every_page(app_dir, quick_train):
    at = goto(new_app(app_dir, quick_train), "train")
    assert at.selectbox(key="train_source").value == "FedGMM synthetic (labelled)"
    assert at.selectbox(key="train_method").value == "FedGMM"
    train(at)
    assert at.get("progress")[0].proto.value == 100
    assert "done in" in at.get("progress")[0].proto.text
    assert {"Test AUROC", "Rounds", "MB up", "Fit seconds"} <= set(metrics(at))
    assert len(at.download_button) == 1  # the model file

    goto(at, "scores")
    assert {"AUROC", "AUPR (novel)", "FPR @ 95 % TPR", "Max-F1"} <= set(metrics(at))
    assert charts(at) == 4  # histogram, ROC, PR, the explained row's feature shares
    slider = next(s for s in at.slider if s.label.startswith("Threshold on log p(x)"))
    before = metrics(at)["Flagged"]
    slider.set_value(slider.min).run()
    assert metrics(at)["Flagged"] != before and not at.exception
    explain_scores_row(at)
    at.selectbox(key=next(s.key for s in at.selectbox)).set_value("1").run()
    assert not at.exception and charts(at) >= 1
    explain_scores_row(at, client=1)

    goto(at, "joint")
    assert charts(at) == 1
    assert "AUROC permuted labels, log p(y|x)" in metrics(at)

    goto(at, "clients")
    assert charts(at) == 4  # partition, weights, per-client AUROC, bytes per round
    assert int(metrics(at)["Rounds"]) > 0

    goto(at, "unseen")
    assert {"AUROC before", "AUROC after", "Accuracy before", "Accuracy after"} <= set(metrics(at))
    at.slider[0].set_value(5).run()
    assert not at.exception and charts(at) == 1
    assert at.caption[-1].value.startswith("5 rows with labels")

    goto(at, "score")
    assert at.download_button[0].label.startswith("Example file")
    run = at.session_state["run"]
    rows = run.bundle.frame(run.bundle.X_test[:30])
    rows["client"], rows["label"] = run.bundle.groups_test[:30], run.bundle.y_test[:30]
    at.file_uploader(key="score_file").set_value(("rows.csv", csv_bytes(rows), "text/csv"))
    at.run()
    assert not at.exception and not at.error
    scored = at.dataframe[0].value
    assert {"log_px", "log_py_given_x", "anomaly_score", "flag", "component"} <= set(scored)
    assert len(scored) == 30 and charts(at) == 1
    assert at.download_button[-1].label == "Download scores (CSV)"

    bad = rows.drop(columns=["x1"])
    at.file_uploader(key="score_file").set_value(("bad.csv", csv_bytes(bad), "text/csv"))
    at.run()
    assert not at.exception
    assert "lack the model's feature column(s) 'x1'" in at.error[0].value
    bad = rows.astype({"x2": object})
    bad.loc[3, "x2"] = "high"
    at.file_uploader(key="score_file").set_value(("bad.csv", csv_bytes(bad), "text/csv"))
    at.run()
    assert not at.exception
    assert "'x2' (data row 4 holds 'high')" in at.error[0].value


def test_same_settings_come_from_the_cache(app_dir, quick_train):
    at = goto(new_app(app_dir, {**quick_train, "train_seed": 7}), "train")
    train(at)
    first = at.session_state["run"]
    train(at)
    assert "Loaded from the cache" in at.success[0].value
    assert at.session_state["run"] is first


@pytest.mark.parametrize(
    ("change", "choices", "message"),
    [
        (lambda f: f.assign(b=f.b.astype(object).where(f.index != 4, "high")), {},
         "non-numeric values in feature column(s) 'b' (data row 5 holds 'high')"),
        (lambda f: f.assign(c=f.c.where(f.index != 9)), {}, "missing or infinite values"),
        (lambda f: f.iloc[:85], {}, "too few rows per client: 's2' has"),
        (lambda f: f, {"train_label_col": "site"}, "must be different columns"),
        (lambda f: f[["site", "label"]], {"train_label_col": "label"}, "no feature columns"),
    ],
)  # fmt: skip
def test_bad_training_uploads_get_a_message(app_dir, change, choices, message):
    state = {"train_source": UPLOAD}
    at = goto(new_app(app_dir, state), "train")
    content = csv_bytes(change(table().drop(columns=["novel"])))
    at.file_uploader(key="upload_data_file").set_value(("data.csv", content, "text/csv"))
    at.run()
    at.selectbox(key="train_client_col").set_value("site")
    for key, value in choices.items():
        at.selectbox(key=key).set_value(value)
    train(at)
    assert message in at.error[0].value
    assert "run" not in at.session_state


def test_unreadable_upload_gets_a_message(app_dir):
    at = goto(new_app(app_dir, {"train_source": UPLOAD}), "train")
    at.file_uploader(key="upload_data_file").set_value(("data.parquet", b"oops", "x"))
    at.run()
    assert not at.exception and "could not read data.parquet as Parquet" in at.error[0].value
    assert at.button(key="do_train").disabled


def test_uploaded_table_trains_and_every_page_works(app_dir, quick_train):
    at = goto(new_app(app_dir, {**quick_train, "train_source": UPLOAD}), "train")
    parquet = io.BytesIO()
    table().to_parquet(parquet)
    at.file_uploader(key="upload_data_file").set_value(("sites.parquet", parquet.getvalue(), "x"))
    at.run()
    assert at.selectbox(key="train_client_col").value == "site"  # guessed
    at.selectbox(key="train_label_col").set_value("label")
    at.selectbox(key="train_novel_col").set_value("novel")
    at.number_input(key="train_unseen").set_value(1)
    at.slider(key="train_k").set_value(2)
    train(at)
    assert not at.error, [e.value for e in at.error]
    run = at.session_state["run"]
    assert run.joint and list(run.bundle.feature_names) == ["a", "b", "c"]
    assert float(metrics(at)["Test AUROC"]) > 0.9  # the novel rows were shifted by 6
    for page, n_charts in (("scores", 4), ("joint", 1), ("clients", 4), ("unseen", 1)):
        goto(at, page)
        assert charts(at) == n_charts, page


def test_model_file_upload(app_dir, quick_train):
    from fednovelty_app.training import model_to_bytes

    at = goto(new_app(app_dir, quick_train), "train")
    train(at)
    trained = at.session_state["run"]
    content = model_to_bytes(trained.detector)
    uploader = at.file_uploader(key="upload_model_file")
    uploader.set_value(("model.safetensors", content, "application/octet-stream")).run()
    button(at, "Use the uploaded model").click().run()
    assert not at.exception and not at.error
    run = at.session_state["run"]
    assert run.origin == "uploaded" and run.joint and run is not trained
    X = trained.bundle.frame(trained.bundle.X_test)
    np.testing.assert_allclose(run.detector.log_px(X), trained.detector.log_px(X))
    goto(at, "joint")
    assert charts(at) == 1

    goto(at, "train")
    at.file_uploader(key="upload_model_file").set_value(("model.safetensors", b"junk", "x"))
    at.run()
    button(at, "Use the uploaded model").click().run()
    assert not at.exception and "not a fednovelty model file" in at.error[0].value


def test_adbench_dem_and_a_pyod_baseline(app_dir):
    state = {
        "train_source": "4_breastw",
        "train_ad_clients": 3,
        "train_unseen": 1,
        "train_method": "DEM",
        "train_k": 2,
        "train_rounds": 10,
    }
    at = goto(new_app(app_dir, state), "train")
    train(at)
    assert not at.error and at.session_state["run"].method.method == "DEM"
    goto(at, "clients")
    assert "no per-client mixture weights" in at.info[0].value
    assert charts(at) == 2  # partition, bytes per round
    goto(at, "unseen")
    assert {"AUROC before", "AUROC after"} <= set(metrics(at))
    assert "Accuracy before" not in metrics(at)
    goto(at, "joint")
    assert "needs FedGMM's joint model" in at.info[0].value

    goto(at, "train")
    at.selectbox(key="train_method").set_value("IForest").run()
    train(at)
    assert not at.error and any("no safe file format" in c.value for c in at.caption)
    goto(at, "scores")
    assert charts(at) == 3  # no components: no explained row
    assert "no Gaussian components" in at.info[-1].value
    assert any(s.label.startswith("Threshold on anomaly score") for s in at.slider)
    goto(at, "unseen")
    assert "cannot adapt" in at.info[0].value
    goto(at, "clients")
    assert "no rounds" in at.info[-1].value


#: Plotly charts per page once trained on the quick synthetic data (Scores, Joint view,
#: Clients, Unseen client): an explained row on Scores needs components (every fednovelty
#: detector), the joint view FedGMM, adaptation FedGMM / DEM / CentralGMM, client weights
#: FedGMM, rounds every fednovelty detector.
EXPECTED_CHARTS = {
    "FedGMM": (4, 1, 4, 1),
    "DEM": (4, 0, 3, 1),
    "FedGenGMM": (4, 0, 3, 0),
    "Local": (4, 0, 3, 0),
    "ClusteredGMM-IFCA": (4, 0, 4, 1),
    "ClusteredGMM-FeSEM": (4, 0, 4, 1),
    "CentralGMM": (4, 0, 3, 1),
    "FedMFA": (4, 0, 3, 0),
    "FedVB": (4, 0, 3, 0),
    "KNN-markers": (3, 0, 3, 0),
    **{name: (3, 0, 2, 0) for name in ("IForest", "ECOD", "COPOD", "HBOS", "KNN", "LOF", "PCA")},
}


def test_every_method_trains_and_every_page_renders(app_dir, quick_train):
    at = goto(new_app(app_dir, {**quick_train, "train_seed": 3}), "train")
    shown = {
        o.removesuffix(" (centralized baseline)") for o in at.selectbox(key="train_method").options
    }
    assert shown == set(EXPECTED_CHARTS)
    for method, expected in EXPECTED_CHARTS.items():
        at.selectbox(key="train_method").set_value(method).run()
        train(at)
        assert not at.error, (method, [e.value for e in at.error])
        assert at.session_state["run"].method.method == method
        found = []
        for page in ("scores", "joint", "clients", "unseen"):
            found.append(charts(goto(at, page)))
        goto(at, "score")
        assert tuple(found) == expected, method
        goto(at, "train")


def test_drift_page_streams_without_a_trained_model(app_dir):
    at = goto(new_app(app_dir), "drift")
    assert charts(at) == 2
    shown = metrics(at)
    assert shown["Windows"] == "30" and float(shown["Mean |pi - true share|"]) < 0.1
    at.checkbox(key="drift_jump").check().run()
    assert not at.exception, [e.value for e in at.exception]
    assert int(metrics(at)["Global alarms"]) >= 1  # B's jump is seen by every client


def wine_table(n_clients: int = 3) -> pd.DataFrame:
    """scikit-learn's wine with a text client column (seeded) and class 2 as the novel rows."""
    from sklearn.datasets import load_wine

    wine = load_wine(as_frame=True)
    frame = wine.data.copy()
    names = np.array(["alpha", "beta", "gamma", "delta"])[:n_clients]
    frame["client"] = names[np.random.default_rng(0).integers(0, n_clients, len(frame))]
    frame["novel"] = (wine.target == 2).astype(int)
    return frame


def upload(at: AppTest, frame: pd.DataFrame, name: str = "wine.csv") -> AppTest:
    content = csv_bytes(frame) if name.endswith(".csv") else parquet_bytes(frame)
    at.file_uploader(key="upload_data_file").set_value((name, content, "x"))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    out = io.BytesIO()
    frame.to_parquet(out)
    return out.getvalue()


def novel_and_tested(text: str) -> tuple[int, int]:
    import re

    found = re.search(r"([\d,]+) novel of ([\d,]+) test rows", text)
    assert found, text
    return tuple(int(g.replace(",", "")) for g in found.groups())


QUICK_UPLOAD = {"train_source": UPLOAD, "train_k": 2, "train_rounds": 6}


@pytest.mark.parametrize("name", ["wine.csv", "wine.parquet"])
def test_three_uploaded_clients_hold_one_out_and_the_counts_agree(app_dir, name):
    """Three clients: one held out by default and at most one, so two train; the Train
    caption's test counts are the Scores page's, and both are the training clients' novel
    rows plus 30 % of their normal rows, counted here from the table."""
    frame = wine_table(3)
    at = upload(goto(new_app(app_dir, QUICK_UPLOAD), "train"), frame, name)
    at.selectbox(key="train_novel_col").set_value("novel").run()
    held = at.number_input(key="train_unseen")
    assert held.value == 1 and held.max == 1
    assert any("holds 3 client(s): 2 train, 1 held out" in c.value for c in at.caption)
    assert not at.warning
    train(at)
    assert not at.error and not any("one client" in w.value for w in at.warning)
    run = at.session_state["run"]
    assert list(run.bundle.client_ids) == ["alpha", "beta"]
    training = frame.client != "gamma"
    novel = int(frame.novel[training].sum())
    normal = frame[training & (frame.novel == 0)].groupby("client").size()
    expected = (novel, novel + int(sum(max(1, round(0.3 * n)) for n in normal)))
    caption = next(c.value for c in at.caption if c.value.startswith("uploaded"))
    assert novel_and_tested(caption) == expected
    goto(at, "scores")
    view = next(c.value for c in at.caption if c.value.startswith("All test rows"))
    assert novel_and_tested(view) == expected
    assert len(at.get("plotly_chart")) >= 1


def test_two_uploaded_clients_hold_none_out(app_dir):
    at = upload(goto(new_app(app_dir, QUICK_UPLOAD), "train"), wine_table(2))
    held = at.number_input(key="train_unseen")
    assert held.value == 0 and held.max == 0 and held.disabled
    assert any("2 train, 0 held out (too few clients" in c.value for c in at.caption)
    assert not at.warning


def test_a_remembered_hold_out_shrinks_with_the_next_upload(app_dir):
    """2 held out of 4 clients, then a 3-client column: back to at most 1 held out."""
    frame = wine_table(4).assign(three=wine_table(3).client)
    at = upload(goto(new_app(app_dir, QUICK_UPLOAD), "train"), frame)
    assert at.number_input(key="train_unseen").value == 2  # 4 clients: 2 held out, 2 train
    at.selectbox(key="train_client_col").set_value("three").run()
    assert not at.exception
    held = at.number_input(key="train_unseen")
    assert held.value == 1 and held.max == 1


@pytest.mark.filterwarnings("ignore::fednovelty_app.holdout.OneTrainingClientWarning")
def test_one_uploaded_client_trains_with_a_warning_naming_it(app_dir):
    at = upload(goto(new_app(app_dir, QUICK_UPLOAD), "train"), wine_table(1))
    (warning,) = at.warning
    assert "one client only: 'alpha' (held out: none)" in warning.value
    train(at)
    assert not at.error
    assert any("one client only: 'alpha'" in w.value for w in at.warning)


@pytest.mark.filterwarnings("ignore::fednovelty_app.holdout.OneTrainingClientWarning")
def test_synthetic_clients_that_train_nothing_are_said(app_dir):
    """Two synthetic clients with alpha = 0.05 and seed 0: one draws only novel rows, so one
    client trains; the page names it (the bundle's warning), seed 35 none (an error)."""
    state = {**QUICK_UPLOAD, "train_source": "FedGMM synthetic (labelled)",
             "train_syn_clients": 2, "train_syn_alpha": 0.05, "train_seed": 0,
             "train_syn_features": 8, "train_learners": 1, "train_epochs": 1}  # fmt: skip
    at = train(goto(new_app(app_dir, state), "train"))
    assert not at.error
    run = at.session_state["run"]
    (only,) = run.bundle.client_ids
    shown = [w.value for w in at.warning if "one client only" in w.value]
    assert shown == [run.bundle.one_client]
    assert f"one client only: {int(only)} (held out: 2, 3)" in shown[0]
    assert "raise alpha or the number of training clients" in shown[0]
    caption = next(c.value for c in at.caption if c.value.startswith("FedGMM paper"))
    assert novel_and_tested(caption) == (run.bundle.novel_test.sum(), len(run.bundle.X_test))
    at.number_input(key="train_seed").set_value(35).run()
    train(at)
    assert "none of the 2 training clients drew a normal row" in at.error[0].value
