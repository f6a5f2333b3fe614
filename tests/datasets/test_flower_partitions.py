"""Flower Datasets partitions as fednovelty's input (``flower_partitions``), offline: real
``IidPartitioner``, ``DirichletPartitioner`` and ``NaturalIdPartitioner`` on a
``datasets.Dataset.from_dict``, and a ``FederatedDataset`` over a local CSV (no Hub).

Every check reads the partitions back from the partitioner itself (``load_partition``) and
compares the pooled rows, labels and client ids with them, row for row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("flwr_datasets")

from datasets import Dataset
from flwr_datasets import FederatedDataset
from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, NaturalIdPartitioner

from fednovelty import FedGMMDetector
from fednovelty.datasets.partition import EmptyPartitionWarning, flower_partitions


def table(n: int = 90, seed: int = 0) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 3, n)
    return {
        "x0": (rng.normal(size=n) + 3 * label).tolist(),
        "x1": rng.normal(size=n).tolist(),
        "flag": (rng.random(n) > 0.5).tolist(),
        "label": label.tolist(),
        "writer": [f"w{i % 5}" for i in range(n)],
    }


def with_dataset(partitioner, data: dict | None = None):
    partitioner.dataset = Dataset.from_dict(table() if data is None else data)
    return partitioner


def assert_matches_partitions(partitioner, X, groups, features, y=None, label=None):
    """Rows of client ``i`` are partition ``i``'s, in its order."""
    for i in range(partitioner.num_partitions):
        part = partitioner.load_partition(i).to_pandas()
        mine = groups == i
        np.testing.assert_array_equal(X[mine].to_numpy(), part[features].to_numpy(float))
        if y is not None:
            np.testing.assert_array_equal(y[mine], part[label].to_numpy())
    assert list(X.columns) == list(features) and X.dtypes.eq(np.float64).all()


def test_iid_partitions_with_named_features_and_labels():
    partitioner = with_dataset(IidPartitioner(num_partitions=4))
    X, y, groups = flower_partitions(partitioner, ["x0", "x1", "flag"], "label")
    assert groups.dtype == np.int64 and np.bincount(groups).tolist() == [23, 23, 22, 22]
    assert_matches_partitions(partitioner, X, groups, ["x0", "x1", "flag"], y, "label")


def test_dirichlet_partitions_leave_out_the_column_they_split_by():
    partitioner = with_dataset(
        DirichletPartitioner(5, partition_by="label", alpha=0.3, min_partition_size=2, seed=1)
    )
    X, groups = flower_partitions(partitioner, features=["x0", "x1"])
    assert_matches_partitions(partitioner, X, groups, ["x0", "x1"])
    sizes = [len(partitioner.load_partition(i)) for i in range(5)]
    assert np.bincount(groups, minlength=5).tolist() == sizes and len(set(sizes)) > 1
    with pytest.raises(ValueError, match=r"\{'writer': '(str|object)'\}"):
        flower_partitions(partitioner)  # label left out (partition_by); writer is text


def test_natural_id_partitions_are_the_natural_clients():
    partitioner = with_dataset(NaturalIdPartitioner(partition_by="writer"))
    X, y, groups = flower_partitions(partitioner, label="label")  # writer left out
    assert list(X.columns) == ["x0", "x1", "flag"]
    assert_matches_partitions(partitioner, X, groups, ["x0", "x1", "flag"], y, "label")
    writers = np.array(table()["writer"])
    ids = partitioner.partition_id_to_natural_id
    for i, writer in ids.items():  # client i holds exactly writer ids[i]'s rows
        assert (groups == i).sum() == (writers == writer).sum()


def test_a_federated_dataset_over_a_local_csv(tmp_path):
    frame = pd.DataFrame(table(30))
    frame.to_csv(tmp_path / "rows.csv", index=False)
    fds = FederatedDataset(
        dataset="csv",
        partitioners={"train": IidPartitioner(3)},
        data_files=str(tmp_path / "rows.csv"),
        cache_dir=str(tmp_path / "cache"),
        shuffle=False,
    )
    X, y, groups = flower_partitions(fds, ["x0", "x1"], "label")
    np.testing.assert_array_equal(X.to_numpy(), frame[["x0", "x1"]].to_numpy())
    np.testing.assert_array_equal(y, frame["label"].to_numpy())
    assert groups.tolist() == [0] * 10 + [1] * 10 + [2] * 10
    with pytest.raises(ValueError, match="not partitioned"):
        flower_partitions(fds, ["x0"], split="test")


def test_the_result_is_a_detector_s_input():
    partitioner = with_dataset(IidPartitioner(num_partitions=3))
    X, groups = flower_partitions(partitioner, ["x0", "x1"])
    detector = FedGMMDetector(2, max_iter=50, random_state=0).fit(X, groups=groups)
    assert list(detector.feature_names_in_) == ["x0", "x1"] and detector.n_clients_ == 3
    same = FedGMMDetector(2, max_iter=50, random_state=0).fit(X.to_numpy(), groups=groups)
    np.testing.assert_allclose(detector.score_samples(X), same.score_samples(X.to_numpy()))


def test_a_list_of_partitions_with_an_empty_one_warns():
    data = table(12)
    parts = [Dataset.from_dict({k: v[:6] for k, v in data.items()}),
             Dataset.from_dict({k: [] for k in data}),
             Dataset.from_dict({k: v[6:] for k, v in data.items()})]  # fmt: skip
    with pytest.warns(EmptyPartitionWarning, match=r"partitions \[1\]"):
        X, groups = flower_partitions(parts, ["x0", "x1"])
    assert groups.tolist() == [0] * 6 + [2] * 6 and X.shape == (12, 2)


@pytest.mark.parametrize(
    ("source", "kwargs", "error", "says"),
    [
        (IidPartitioner(2), {}, ValueError, "has no dataset"),
        ("rows.csv", {}, TypeError, "partitioner"),
        ([], {}, ValueError, "empty"),
        ([{"x0": [1.0]}], {}, TypeError, "partition 0 is a dict"),
    ],
)
def test_bad_sources_are_named(source, kwargs, error, says):
    with pytest.raises(error, match=says):
        flower_partitions(source, **kwargs)


def test_bad_columns_are_named():
    partitioner = with_dataset(IidPartitioner(2))
    with pytest.raises(ValueError, match=r"columns \['x9'\] are not in the partitions"):
        flower_partitions(partitioner, ["x0", "x9"])
    with pytest.raises(ValueError, match="is the label"):
        flower_partitions(partitioner, ["x0", "label"], "label")
    gaps = with_dataset(IidPartitioner(2), {"x0": [1.0, None, 2.0, 3.0], "x1": [1.0] * 4})
    with pytest.raises(ValueError, match=r"\['x0'\] have missing values"):
        flower_partitions(gaps)
    with pytest.raises(ValueError, match="split= applies to a FederatedDataset only"):
        flower_partitions(partitioner, ["x0"], split="train")
