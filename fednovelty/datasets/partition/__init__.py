"""Split one dataset's rows among simulated clients: Dirichlet, Quantity, IID, clustered schemes.

A partition is a ``list`` of ``n_clients`` int64 index arrays, each sorted, that together use
every row exactly once. One module per scheme:

- :mod:`~fednovelty.datasets.partition.dirichlet`: ``dirichlet_partition`` (Dir(alpha) shares of
  every group per client; small alpha = skewed, large alpha = near IID).
- :mod:`~fednovelty.datasets.partition.quantity`: ``quantity_partition`` (each client holds rows
  of only ``groups_per_client`` groups, NIID-Bench's ``#C=k``).
- :mod:`~fednovelty.datasets.partition.iid`: ``iid_partition`` (uniform, sizes within one).
- :mod:`~fednovelty.datasets.partition.shards`: ``shard_partition`` (McMahan's label shards:
  rows sorted by label, cut into equal shards, ``shards_per_client`` of them per client).
- :mod:`~fednovelty.datasets.partition.clustered`: ``cluster_dirichlet_partition`` and
  ``cluster_nclass_partition`` (the Fed-CAM paper's cluster-wise skews: clients in ground-truth
  clusters that share a label distribution; they return a ``ClusteredPartition``, the parts and
  each client's true cluster).
- :mod:`~fednovelty.datasets.partition.groups`: ``kmeans_groups`` (clusters to skew over when the
  data has no class column: the FedGenGMM paper's feature-distribution skew) and
  ``groups_from_partition`` (client id per row, the ``groups=`` a detector's ``fit`` takes).
- :mod:`~fednovelty.datasets.partition.plot`: ``partition_counts`` (rows per client and group)
  and ``partition_dot_plot`` (the FedGenGMM paper's Figure 1; matplotlib imported on call).
- :mod:`~fednovelty.datasets.partition.flower`: ``flower_partitions`` (a Flower Datasets
  partitioner's partitions as rows, labels and a client id per row; ``docs/flower.md``).

Randomness: ``random_state`` is None, an int, or a ``numpy.random.Generator``; the same int
gives the same partition on any machine (numpy's PCG64 stream is stable across platforms).

Example:
    >>> labels = np.repeat(np.arange(10), 100)  # 10 classes, 1000 rows
    >>> parts = dirichlet_partition(labels, n_clients=20, alpha=0.5, random_state=0)
    >>> client_id = groups_from_partition(parts, labels.size)  # for fit(X, groups=client_id)
    >>> counts, _ = partition_counts(parts, labels)  # (20, 10) rows per client and class
"""

# private helpers re-exported for sibling modules (synthetic.py, mnist.py, shifts.py)
from fednovelty.datasets.partition._common import _MAX_TRIES as _MAX_TRIES
from fednovelty.datasets.partition._common import _check_int as _check_int
from fednovelty.datasets.partition._common import _rng as _rng
from fednovelty.datasets.partition.clustered import (
    ClusteredPartition,
    cluster_dirichlet_partition,
    cluster_nclass_partition,
)
from fednovelty.datasets.partition.dirichlet import dirichlet_partition
from fednovelty.datasets.partition.flower import EmptyPartitionWarning, flower_partitions
from fednovelty.datasets.partition.groups import groups_from_partition, kmeans_groups
from fednovelty.datasets.partition.iid import iid_partition
from fednovelty.datasets.partition.plot import partition_counts, partition_dot_plot
from fednovelty.datasets.partition.quantity import quantity_partition
from fednovelty.datasets.partition.shards import shard_partition

__all__ = [
    "ClusteredPartition",
    "EmptyPartitionWarning",
    "cluster_dirichlet_partition",
    "cluster_nclass_partition",
    "dirichlet_partition",
    "flower_partitions",
    "groups_from_partition",
    "iid_partition",
    "kmeans_groups",
    "partition_counts",
    "partition_dot_plot",
    "quantity_partition",
    "shard_partition",
]
