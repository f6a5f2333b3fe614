"""Data: loaders for ``../shared/data``, client partitioners and federated min-max scaling.

- :mod:`~fednovelty.datasets.loaders`: ``data_dir``, ``list_adbench``, ``load_adbench``,
  ``load_mnist``, ``load_femnist`` (read-only, no downloads).
- :mod:`~fednovelty.datasets.partition`: ``iid_partition``, ``dirichlet_partition``,
  ``quantity_partition``, ``cluster_dirichlet_partition`` and ``cluster_nclass_partition``
  (Fed-CAM's cluster-wise skews, with each client's true cluster), ``kmeans_groups``,
  ``groups_from_partition`` (client id per row for ``fit(groups=...)``), ``partition_counts``
  and ``partition_dot_plot`` (FedGenGMM Figure 1).
- :mod:`~fednovelty.datasets.scaling`: ``client_minmax``, ``merge_minmax``, ``MinMaxScaling``.
- :mod:`~fednovelty.datasets.mnist`: ``make_mnist_federated`` (MNIST clients with Dirichlet
  label skew, the FedGMM paper's novelty experiments).
- :mod:`~fednovelty.datasets.femnist`: ``make_femnist_federated`` (FEMNIST's writers as
  clients, split 60 / 20 / 20 inside each writer), ``split_writers`` (unseen writers),
  ``shift_writers`` (the FedGMM paper's transformed-and-relabelled rows).
- :mod:`~fednovelty.datasets.digits`: ``load_bundled_digits`` (scikit-learn's bundled 8x8
  digits, no data folder needed; the ``"digits"`` benchmark task and the demo's fallback).
- :mod:`~fednovelty.datasets.shifts`: OOD sets: ``rotate90``, ``hflip``, ``scale_images``,
  ``invert``, ``transform_images``, ``add_gaussian_noise``, ``permute_labels``.
- :mod:`~fednovelty.datasets.synthetic`: ``make_fedgmm_synthetic`` (the FedGMM paper's
  synthetic federated classification data) and its ``FederatedSplit``.
- :mod:`~fednovelty.datasets.streams`: ``schedule_share``, ``writer_stream`` and
  ``domain_stream`` (client data whose mix of two populations moves over time), drawn for
  novelty streams from :mod:`~fednovelty.datasets.domain_pools` (``stream_pools``,
  ``adbench_pools``, ``femnist_pools``).
"""

from fednovelty.datasets.digits import load_bundled_digits

# femnist imports shifts, so it comes after it
from fednovelty.datasets.femnist import (
    FederatedWriters,
    make_femnist_federated,
    shift_writers,
    split_writers,
)
from fednovelty.datasets.loaders import (
    data_dir,
    list_adbench,
    load_adbench,
    load_femnist,
    load_mnist,
)
from fednovelty.datasets.mnist import FederatedImages, make_mnist_federated
from fednovelty.datasets.partition import (
    ClusteredPartition,
    cluster_dirichlet_partition,
    cluster_nclass_partition,
    dirichlet_partition,
    groups_from_partition,
    iid_partition,
    kmeans_groups,
    partition_counts,
    partition_dot_plot,
    quantity_partition,
)
from fednovelty.datasets.scaling import MinMaxScaling, client_minmax, merge_minmax
from fednovelty.datasets.shifts import (
    TRANSFORMS,
    add_gaussian_noise,
    hflip,
    invert,
    permute_labels,
    rotate90,
    scale_images,
    transform_images,
)
from fednovelty.datasets.synthetic import FederatedSplit, make_fedgmm_synthetic

__all__ = [
    "TRANSFORMS",
    "ClusteredPartition",
    "FederatedImages",
    "FederatedSplit",
    "FederatedWriters",
    "MinMaxScaling",
    "add_gaussian_noise",
    "client_minmax",
    "cluster_dirichlet_partition",
    "cluster_nclass_partition",
    "data_dir",
    "dirichlet_partition",
    "groups_from_partition",
    "hflip",
    "iid_partition",
    "invert",
    "kmeans_groups",
    "list_adbench",
    "load_adbench",
    "load_bundled_digits",
    "load_femnist",
    "load_mnist",
    "make_fedgmm_synthetic",
    "make_femnist_federated",
    "make_mnist_federated",
    "merge_minmax",
    "partition_counts",
    "partition_dot_plot",
    "permute_labels",
    "quantity_partition",
    "rotate90",
    "scale_images",
    "shift_writers",
    "split_writers",
    "transform_images",
]
