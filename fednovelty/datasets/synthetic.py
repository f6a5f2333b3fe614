"""The FedGMM paper's synthetic federated classification data (Wu et al., ICML 2023, Sec. 4.1).

Every client mixes the same ``n_components`` base distributions with its own weights, and every
component has its own linear labelling rule, so the joint distribution p(x, y) differs across
clients while each component stays simple:

1. component means ``mu_m ~ U(-1, 1)^d`` and covariance ``Sigma = d^(-1/2) I`` (each coordinate
   has variance ``1 / sqrt(d)``, standard deviation ``d^(-1/4)``);
2. labelling vectors ``v_m = s_m (mu_j - mu_m)`` with ``j != m`` uniform among the other
   components and a random sign ``s_m`` in {-1, +1};
3. per client ``c``: weights ``pi_c ~ Dir(alpha * 1)``, train size
   ``n_c = min(int(LogNormal(4, 2)) + 100, 1000)`` and test size
   ``max(1, floor(test_fraction * n_c + 0.5))``; each row draws ``z ~ pi_c``, ``x`` from component
   ``z`` and ``y = 1{(x - mu_z) . v_z > 0}``.

These are the constants of the paper's reference code (``data/gmsynthetic`` in
github.com/zshuai8/FedGMM_ICML2023); the text says ``I_d`` and ~3000 rows a client, the code uses
``d^(-1/2) I_d`` and the size rule above, which we follow. Labels are linear within a component
(a per-component logistic regression fits them almost perfectly) but no single hyperplane fits
all components, which is what makes the data a test of personalised / mixture models.

Non-Gaussian components (the paper's Table 3). Every variant keeps each component's mean
``mu_m`` and per-coordinate variance ``1 / sqrt(d)``, so only the *shape* of the noise changes:

- ``"laplace"``: ``x = mu_m + Laplace(0, b)`` per coordinate with ``b = sqrt(var / 2)``
  (excess kurtosis 3 instead of 0).
- ``"beta"``: each component has its own Beta parameters per coordinate,
  ``a_md, b_md ~ U(1, 5)``; a draw ``B ~ Beta(a_md, b_md)`` is standardised with the Beta's exact
  mean ``a / (a + b)`` and standard deviation ``sqrt(a b / ((a + b)^2 (a + b + 1)))`` and then
  placed at ``x = mu_md + sqrt(var) * (B - mean) / std``. So mean and variance match the Gaussian
  exactly, while each coordinate is bounded and skewed (skew sign set by ``a < b`` or ``a > b``).

Setting 1 is ``distribution="laplace"`` or ``"beta"`` for all clients. Setting 2 is
``n_other_clients=k, other_distribution=...``: the last ``k`` clients draw from the other
distribution, the rest from ``distribution`` (the paper: 30 clients, last 10 differ). Unlike the
reference code, where the differing clients also get new means and labelling vectors and raw
``Beta`` draws in [0, 1], here they share ``mu_m`` and ``v_m`` with everyone, so the difference
between client groups is the noise shape alone; labels always use the rule above with ``mu_m``
the component mean.

Randomness: one ``numpy.random.Generator`` from ``random_state`` (None, int or Generator; never
the global state). Means, labelling vectors, Beta parameters, sizes, weights and components are
drawn before any noise and in the same order for every ``distribution``, so one seed gives the
same clients, the same ``components_*`` and the same labelling geometry whatever noise shape is
chosen; only ``X`` and ``y`` differ.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from fednovelty.datasets.partition._common import _check_int, _check_positive, _rng

__all__ = ["DISTRIBUTIONS", "FederatedSplit", "make_fedgmm_synthetic"]

DISTRIBUTIONS = ("gaussian", "laplace", "beta")
_MIN_SIZE = 100
_MAX_SIZE = 1000
_BETA_RANGE = (1.0, 5.0)


@dataclass(frozen=True)
class FederatedSplit:
    """A federated dataset as flat arrays, rows grouped by client (client 0 first).

    Attributes:
        X_train: shape (n_train, n_features), float64.
        y_train: shape (n_train,), int64 labels in {0, 1}.
        groups_train: shape (n_train,), int64 client id per row in ``range(n_clients)``;
            non-decreasing. Pass as ``fit(X, y, groups=...)``.
        X_test: shape (n_test, n_features), float64; fresh rows from each client's distribution.
        y_test: shape (n_test,), int64.
        groups_test: shape (n_test,), int64 client id per row.
        components_train: shape (n_train,), int64 generating component per row (diagnostics;
            not something a learner should see).
        components_test: shape (n_test,), int64.
        client_weights: shape (n_clients, n_components), each client's drawn ``pi_c``.
        means: shape (n_components, n_features), component means ``mu_m``.
        directions: shape (n_components, n_features), labelling vectors ``v_m``.
    """

    X_train: np.ndarray
    y_train: np.ndarray
    groups_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    groups_test: np.ndarray
    components_train: np.ndarray
    components_test: np.ndarray
    client_weights: np.ndarray
    means: np.ndarray
    directions: np.ndarray


def _check_distribution(value, name: str) -> str:
    if value not in DISTRIBUTIONS:
        raise ValueError(f"{name} must be one of {DISTRIBUTIONS}; got {value!r}.")
    return value


def _labelling_directions(means: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``v_m = sign * (mu_j - mu_m)`` with ``j`` uniform over the other components."""
    n_components = means.shape[0]
    directions = np.empty_like(means)
    for m in range(n_components):
        j = int(rng.integers(n_components - 1))
        j += j >= m  # skip m itself
        sign = 2.0 * rng.integers(2) - 1.0
        directions[m] = sign * (means[j] - means[m])
    return directions


def _standard_noise(
    dist: str,
    z: np.ndarray,
    n_features: int,
    beta_a: np.ndarray,
    beta_b: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Noise with mean 0 and variance 1 per coordinate, shape (z.size, n_features)."""
    shape = (z.shape[0], n_features)
    if dist == "gaussian":
        return rng.standard_normal(shape)
    if dist == "laplace":
        return rng.laplace(0.0, np.sqrt(0.5), shape)
    a, b = beta_a[z], beta_b[z]
    mean = a / (a + b)
    std = np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))
    return (rng.beta(a, b) - mean) / std


def make_fedgmm_synthetic(
    n_clients: int = 30,
    *,
    n_components: int = 3,
    n_features: int = 32,
    alpha: float = 0.4,
    test_fraction: float = 0.25,
    distribution: str = "gaussian",
    n_other_clients: int = 0,
    other_distribution: str | None = None,
    random_state: int | np.random.Generator | None = None,
) -> FederatedSplit:
    """Draw the FedGMM synthetic federated binary-classification data (see the module doc).

    Args:
        n_clients: number of clients, >= 1 (the paper uses 300 for the Gaussian data and 30 for
            the Table 3 settings).
        n_components: number of shared components ``M``, >= 2 (each labelling vector points at
            another component).
        n_features: dimension ``d``, >= 1; every coordinate has variance ``1 / sqrt(d)``.
        alpha: Dirichlet concentration of each client's component weights, > 0; smaller means
            each client sees fewer components.
        test_fraction: test rows per client as a fraction of its train rows, in (0, 1); test
            rows are fresh draws from the same client distribution.
        distribution: noise shape of the components, ``"gaussian"``, ``"laplace"`` or
            ``"beta"`` (Table 3, setting 1).
        n_other_clients: how many of the clients, counted from the end, draw from
            ``other_distribution`` instead (Table 3, setting 2); 0 <= n_other_clients <=
            n_clients.
        other_distribution: noise shape of the last ``n_other_clients`` clients; required
            when ``n_other_clients > 0``.
        random_state: None, int or ``numpy.random.Generator``.

    Returns:
        A :class:`FederatedSplit`; rows are grouped by client in order, each client's rows in
        draw order.

    Raises:
        ValueError: a bad argument, named in the message.

    Example:
        >>> data = make_fedgmm_synthetic(5, random_state=0)
        >>> data.X_train.shape[1], data.means.shape, sorted(set(data.y_train.tolist()))
        (32, (3, 32), [0, 1])
        >>> np.unique(data.groups_train).tolist()
        [0, 1, 2, 3, 4]
    """
    n_clients = _check_int(n_clients, "n_clients", 1)
    n_components = _check_int(n_components, "n_components", 2)
    n_features = _check_int(n_features, "n_features", 1)
    alpha = _check_positive(alpha, "alpha")
    if (
        not isinstance(test_fraction, numbers.Real)
        or isinstance(test_fraction, bool)
        or not 0.0 < test_fraction < 1.0
    ):
        raise ValueError(f"test_fraction must be a number in (0, 1); got {test_fraction!r}.")
    distribution = _check_distribution(distribution, "distribution")
    n_other_clients = _check_int(n_other_clients, "n_other_clients", 0)
    if n_other_clients > n_clients:
        raise ValueError(
            f"n_other_clients={n_other_clients} exceeds n_clients={n_clients}; at most every "
            f"client can draw from other_distribution."
        )
    if n_other_clients > 0:
        if other_distribution is None:
            raise ValueError(
                f"other_distribution is required when n_other_clients={n_other_clients} > 0; "
                f"pass one of {DISTRIBUTIONS}."
            )
        other_distribution = _check_distribution(other_distribution, "other_distribution")
    elif other_distribution is not None:
        _check_distribution(other_distribution, "other_distribution")
    rng = _rng(random_state)

    # Everything but the noise first, in a fixed order, so all distributions share it.
    means = rng.uniform(-1.0, 1.0, size=(n_components, n_features))
    directions = _labelling_directions(means, rng)
    beta_a = rng.uniform(*_BETA_RANGE, size=(n_components, n_features))
    beta_b = rng.uniform(*_BETA_RANGE, size=(n_components, n_features))
    sizes = np.minimum(
        rng.lognormal(4.0, 2.0, size=n_clients).astype(np.int64) + _MIN_SIZE, _MAX_SIZE
    )
    test_sizes = np.maximum(1, np.floor(test_fraction * sizes + 0.5).astype(np.int64))
    client_weights = rng.dirichlet(np.full(n_components, alpha), size=n_clients)
    components = [
        [rng.choice(n_components, size=int(n), p=client_weights[c]) for n in (n_tr, n_te)]
        for c, (n_tr, n_te) in enumerate(zip(sizes, test_sizes, strict=True))
    ]

    scale = n_features**-0.25  # sqrt of the per-coordinate variance 1 / sqrt(d)
    dists = [distribution] * (n_clients - n_other_clients) + [other_distribution] * n_other_clients
    splits: list[list[np.ndarray]] = [[], []]  # X blocks for train and test
    for c in range(n_clients):
        for part, z in enumerate(components[c]):
            noise = _standard_noise(dists[c], z, n_features, beta_a, beta_b, rng)
            splits[part].append(means[z] + scale * noise)

    def _assemble(part: int, counts: np.ndarray):
        X = np.concatenate(splits[part]).astype(np.float64, copy=False)
        z = np.concatenate([components[c][part] for c in range(n_clients)]).astype(np.int64)
        y = (np.einsum("ij,ij->i", X - means[z], directions[z]) > 0).astype(np.int64)
        groups = np.repeat(np.arange(n_clients, dtype=np.int64), counts)
        return X, y, groups, z

    X_train, y_train, groups_train, z_train = _assemble(0, sizes)
    X_test, y_test, groups_test, z_test = _assemble(1, test_sizes)
    return FederatedSplit(
        X_train=X_train,
        y_train=y_train,
        groups_train=groups_train,
        X_test=X_test,
        y_test=y_test,
        groups_test=groups_test,
        components_train=z_train,
        components_test=z_test,
        client_weights=client_weights,
        means=means,
        directions=directions,
    )
