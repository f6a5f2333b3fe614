"""Dashboard data sources and upload checks (app/fednovelty_app/data.py, uploads.py)."""

import io
import warnings
from contextlib import nullcontext

import numpy as np
import pandas as pd
import pytest
from fednovelty_app import data
from fednovelty_app.data import adbench_bundle, synthetic_bundle, upload_bundle
from fednovelty_app.uploads import (
    MIN_ROWS_PER_CLIENT,
    UploadError,
    check_score_table,
    check_table,
    read_table,
)

from fednovelty.datasets import load_adbench
from fednovelty.datasets.protocols import make_task


def table(n_clients=3, rows=40, seed=0, labels=True, novel=True) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = n_clients * rows
    frame = pd.DataFrame(rng.normal(size=(n, 3)), columns=["a", "b", "c"])
    frame["site"] = np.repeat([f"s{i}" for i in range(n_clients)], rows)
    if labels:
        frame["y"] = rng.integers(0, 2, n)
    if novel:
        frame["is_novel"] = (rng.random(n) < 0.1).astype(int)
    return frame


def test_synthetic_bundle_keeps_the_novel_component_and_unseen_clients_out_of_training():
    bundle = synthetic_bundle(n_clients=5, alpha=0.5, n_unseen=2, n_features=3, seed=1)
    assert set(np.unique(bundle.groups_train)) == set(range(5))
    assert bundle.X_train.shape[1] == bundle.n_features == 3
    assert bundle.labelled and bundle.y_train.shape == bundle.groups_train.shape
    assert {u.client_id for u in bundle.unseen} == {5, 6}
    assert set(bundle.partition_labels) <= {"component 0", "component 1", "component 2"}
    assert set(bundle.partition_clients) == set(range(7))  # unseen clients drawn too
    assert 0 < bundle.novel_test.mean() < 1
    for client in bundle.unseen:  # adaptation rows never reappear in evaluation
        assert not (client.X_adapt[:, None, :] == client.X_eval[None, :, :]).all(2).any()
        assert client.novel_eval.sum() == bundle.novel_test.sum()
        assert client.y_adapt.shape[0] == client.X_adapt.shape[0]


def test_adbench_bundle_holds_out_clients_and_marks_anomalies():
    bundle = adbench_bundle("4_breastw", n_clients=3, alpha=1.0, n_unseen=1, seed=0)
    assert set(np.unique(bundle.groups_train)) == {0, 1, 2}
    assert bundle.y_train is None and bundle.groups_test is None
    assert set(np.unique(bundle.novel_test)) == {0, 1}
    (unseen,) = bundle.unseen
    assert unseen.client_id == 3 and unseen.X_adapt.shape[0] >= 2
    assert unseen.novel_eval.sum() == bundle.novel_test.sum()
    assert bundle.partition_label_name == "k-means cluster"
    assert bundle.partition_clients.shape == bundle.partition_labels.shape


def test_adbench_bundle_is_the_task_with_clients_held_out():
    bundle = adbench_bundle("4_breastw", "outlier", n_clients=3, alpha=1.0, n_unseen=1, seed=2)
    task = make_task("4_breastw", "outlier", n_clients=4, alpha=1.0, seed=2, max_train=20_000,
                     max_test=5_000)  # fmt: skip
    train = task.groups_train < 3
    np.testing.assert_array_equal(bundle.X_train, task.X_train[train])
    np.testing.assert_array_equal(bundle.X_test, task.X_test)
    np.testing.assert_array_equal(bundle.novel_test, task.y_test)
    np.testing.assert_array_equal(bundle.partition_clients, task.groups_train)
    # the unseen client adapts and is evaluated on its inliers only (the outlier protocol
    # trains on anomalies too)
    (unseen,) = bundle.unseen
    own = task.groups_train == 3
    inliers = own & (load_adbench("4_breastw")[1][task.train_index] == 0)
    assert inliers.sum() < own.sum()
    held = unseen.X_adapt.shape[0] + (unseen.novel_eval == 0).sum()
    assert held == inliers.sum()


def test_the_bundled_digits_are_a_source_without_the_data_folder(tmp_path):
    """scikit-learn's digits are always offered, first; their clients were drawn over digits,
    and an unseen client adapts on its training rows that are not the novel digit."""
    assert data.adbench_names(tmp_path / "missing") == ["digits"]
    assert data.adbench_names()[0] == "digits" and "4_breastw" in data.adbench_names()
    bundle = data.adbench_bundle("digits", "outlier", n_clients=4, n_unseen=1, data_dir=tmp_path)
    assert bundle.partition_label_name == "digit"
    assert set(bundle.partition_labels) <= {f"digit {d}" for d in range(10)}
    assert "scikit-learn's bundled handwritten digits" in bundle.description


def test_without_the_data_folder_the_default_source_is_the_bundled_digits(tmp_path):
    assert data.default_source(tmp_path / "missing") == data.BUNDLED_DIGITS
    assert data.default_source() == data.SYNTHETIC  # the shared folder is beside the checkout
    from fednovelty.datasets.digits import BUNDLED_DIGITS

    assert data.BUNDLED_DIGITS == BUNDLED_DIGITS  # the app's copy of the task name
    assert data.source_label(data.FEMNIST) == "FEMNIST writers"
    assert data.source_label("4_breastw") == "4_breastw"


def test_femnist_writers_are_a_source_with_unseen_writers(tmp_path):
    """FEMNIST is offered when its file is there; the clients are writers and the held-out
    clients are whole writers whose images never reach training."""
    assert data.FEMNIST in data.adbench_names()
    assert data.FEMNIST not in data.adbench_names(tmp_path)  # a folder without femnist/
    bundle = data.adbench_bundle(data.FEMNIST, n_clients=4, n_unseen=1, seed=0)
    task = make_task("femnist", n_clients=5, alpha=None, seed=0, max_train=20_000,
                     max_test=5_000)  # fmt: skip
    train = task.groups_train < 4
    np.testing.assert_array_equal(bundle.X_train, task.X_train[train])
    np.testing.assert_array_equal(bundle.X_test, task.X_test)
    assert bundle.n_features == 25 and set(bundle.client_ids.tolist()) == {0, 1, 2, 3}
    (unseen,) = bundle.unseen
    own = task.X_train[task.groups_train == 4]
    assert unseen.X_adapt.shape[0] + int((unseen.novel_eval == 0).sum()) == own.shape[0]
    assert bundle.partition_label_name == "writer"
    assert set(bundle.partition_labels) == {f"writer {w}" for w in range(5)}
    assert "FEMNIST writers" in bundle.description and "each writer a client" in bundle.description


def test_the_tasks_anomalous_training_rows_stay_out_of_adaptation():
    task = make_task("4_breastw", "outlier", n_clients=3, alpha=1.0, seed=0)
    assert task.y_train.sum() > 0  # the outlier protocol trains on anomalies
    bundle = data.adbench_bundle("4_breastw", "outlier", n_clients=2, n_unseen=1, alpha=1.0)
    held = task.groups_train == 2
    client = bundle.unseen[0]
    inliers = client.X_adapt.shape[0] + int((client.novel_eval == 0).sum())
    assert inliers == (held & (task.y_train == 0)).sum()


def test_upload_bundle_splits_each_client_and_tests_novel_rows():
    frame = table()
    bundle = upload_bundle(frame, "site", "y", "is_novel", n_unseen=1, seed=0)
    assert bundle.feature_names == ("a", "b", "c")
    assert set(bundle.groups_train) == {"s0", "s1"}
    assert bundle.unseen[0].client_id == "s2"
    assert bundle.novel_test.sum() == frame.is_novel[frame.site != "s2"].sum()
    n_train = (frame.is_novel == 0) & (frame.site != "s2")
    assert bundle.X_train.shape[0] + (bundle.novel_test == 0).sum() == n_train.sum()
    assert bundle.partition_label_name == "class"


def test_upload_without_novelty_or_labels_still_builds():
    bundle = upload_bundle(table(labels=False, novel=False), "site")
    assert bundle.novel_test is None and bundle.y_train is None
    assert bundle.partition_label_name == "k-means cluster"


@pytest.mark.parametrize(
    ("change", "columns", "message"),
    [
        (lambda f: f, ("region", None, None), "no column 'region'"),
        (lambda f: f, ("site", "site", None), "must be different"),
        (lambda f: f.assign(b=f.b.astype(object).where(f.index != 4, "abc")), ("site",),
         "non-numeric values in feature column(s) 'b' (data row 5 holds 'abc')"),
        (lambda f: f.assign(c=f.c.where(f.index != 7)), ("site",),
         "column 'c' at data row 8"),
        (lambda f: f.iloc[: 40 * 2 + 3], ("site",), "too few rows per client: 's2' has 3"),
        (lambda f: f.assign(site=f.site.where(f.index != 2)), ("site",),
         "client column 'site' is empty at data row 3"),
        (lambda f: f.assign(y=0), ("site", "y"), "holds a single class"),
        (lambda f: f.assign(is_novel=2), ("site", None, "is_novel"), "must hold 0 (normal) or 1"),
        (lambda f: f[["site"]], ("site",), "no feature columns"),
    ],
)  # fmt: skip
def test_bad_tables_get_a_message(change, columns, message):
    with pytest.raises(UploadError) as error:
        check_table(change(table()), *columns)
    assert message in str(error.value)


def test_too_few_rows_names_the_minimum():
    with pytest.raises(UploadError, match=f"at least {MIN_ROWS_PER_CLIENT}"):
        check_table(table(rows=MIN_ROWS_PER_CLIENT - 1, novel=False), "site")


def test_holding_out_every_client_is_refused():
    with pytest.raises(UploadError, match="would leave none to train on"):
        upload_bundle(table(n_clients=2), "site", n_unseen=2)


def test_read_table_reads_csv_and_parquet_and_rejects_the_rest():
    frame = table()
    parquet = io.BytesIO()
    frame.to_parquet(parquet)
    pd.testing.assert_frame_equal(read_table("x.parquet", parquet.getvalue()), frame)
    assert read_table("x.csv", frame.to_csv(index=False).encode()).shape == frame.shape
    with pytest.raises(UploadError, match=r"expected a \.csv or \.parquet"):
        read_table("x.xlsx", b"...")
    with pytest.raises(UploadError, match=r"could not read x\.parquet as Parquet"):
        read_table("x.parquet", b"not parquet")
    with pytest.raises(UploadError, match="no data rows"):
        read_table("x.csv", b"a,b\n")


def test_score_table_checks_columns_by_name_or_count():
    frame = table()
    X, clients, labels = check_score_table(
        frame, ["c", "a"], 2, client_column="site", label_column="y"
    )
    assert list(X.columns) == ["c", "a"] and clients[0] == "s0" and labels.shape == (120,)
    with pytest.raises(UploadError, match="lack the model's feature column"):
        check_score_table(frame, ["a", "zz"], 2)
    X, _, _ = check_score_table(frame[["a", "b", "c"]], None, 3)
    assert isinstance(X, np.ndarray) and X.shape == (120, 3)
    with pytest.raises(UploadError, match="have 3 feature column"):
        check_score_table(frame[["a", "b", "c"]], None, 4)
    with pytest.raises(UploadError, match="non-numeric"):
        check_score_table(frame.assign(a="x"), ["a"], 1)


def counted(description: str) -> tuple[int, int]:
    """``(novel, test rows)`` from a description's ``"N novel of M test rows"``."""
    import re

    found = re.search(r"([\d,]+) novel of ([\d,]+) test rows", description)
    assert found, description
    return tuple(int(g.replace(",", "")) for g in found.groups())


@pytest.mark.parametrize("n_unseen", [0, 1, 2])
def test_upload_description_counts_the_rows_that_are_tested(n_unseen):
    """The held-out clients' novel rows are not in the test set, so the caption does not
    count them: its numbers are the training clients' novel rows and 30 % of their normal
    rows, counted here from the table."""
    frame = table(n_clients=3, rows=60)
    held = sorted(frame.site.unique())[3 - n_unseen :]
    training = ~frame.site.isin(held)
    with pytest.warns(data.OneTrainingClientWarning) if n_unseen == 2 else nullcontext():
        bundle = upload_bundle(frame, "site", None, "is_novel", n_unseen=n_unseen, seed=0)
    novel = int((frame.is_novel[training] == 1).sum())
    normal_tested = sum(
        max(1, round(data.TEST_SHARE * n))
        for n in frame[training & (frame.is_novel == 0)].groupby("site").size()
    )
    assert counted(bundle.description) == (novel, novel + normal_tested)
    assert counted(bundle.description) == (bundle.novel_test.sum(), len(bundle.X_test))
    if n_unseen:
        assert f"held-out clients' {int(frame.is_novel[~training].sum())} novel rows" in (
            bundle.description
        )


def test_tested_words_counts_novel_and_unknown_rows():
    assert data.tested_words(np.array([0, 1, 1, 0, 0])) == "2 novel of 5 test rows"
    assert data.tested_words(np.array([-1, -1])) == "2 test rows (novelty unknown)"
    assert data.tested_words(None, 3) == "3 test rows (novelty unknown)"
    with pytest.raises(ValueError, match="pass n_test"):
        data.tested_words(None)
    bundle = upload_bundle(table(labels=False, novel=False), "site")
    assert f"{len(bundle.X_test)} test rows (novelty unknown)" in bundle.description


def test_every_source_describes_its_test_set_as_it_is():
    for bundle in (
        synthetic_bundle(n_clients=4, n_unseen=1, n_features=3, seed=0),
        adbench_bundle("digits", n_clients=3, n_unseen=1, seed=0),
    ):
        assert counted(bundle.description) == (bundle.novel_test.sum(), len(bundle.X_test))


def test_an_upload_training_one_client_warns_naming_the_clients():
    with pytest.warns(data.OneTrainingClientWarning) as caught:
        bundle = upload_bundle(table(n_clients=3), "site", n_unseen=2)
    message = str(caught[0].message)
    assert "one client only: 's0' (held out: 's1', 's2')" in message
    assert message == bundle.one_client
    assert "1 training client + 2 unseen" in bundle.description
    with pytest.warns(data.OneTrainingClientWarning, match="'s0' \\(held out: none\\)"):
        upload_bundle(table(n_clients=1), "site")
    with warnings.catch_warnings():
        warnings.simplefilter("error", data.OneTrainingClientWarning)
        assert upload_bundle(table(n_clients=3), "site", n_unseen=1).one_client is None


def test_synthetic_clients_with_only_novel_rows_do_not_train_and_are_not_counted():
    """With alpha = 0.05 a client can draw nothing but the novel component: seed 0 leaves one
    of two clients with training rows (a warning names it), seed 35 none (an error)."""
    with pytest.warns(data.OneTrainingClientWarning, match="one client only"):
        bundle = synthetic_bundle(n_clients=2, alpha=0.05, n_unseen=2, seed=0)
    assert bundle.client_ids.size == 1
    assert "1 training client (1 of 2 drew only novel rows)" in bundle.description
    with pytest.raises(ValueError, match="none of the 2 training clients drew a normal row"):
        synthetic_bundle(n_clients=2, alpha=0.05, n_unseen=2, seed=35)
