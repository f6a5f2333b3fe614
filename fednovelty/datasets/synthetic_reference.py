"""The FedGMM reference code's own Table 2 data: Gaussian clients and a last group of Beta clients.

:func:`~fednovelty.datasets.synthetic.make_fedgmm_synthetic` follows the constants of the FedGMM
paper's reference code (github.com/zshuai8/FedGMM_ICML2023, ``data/gmsynthetic``) with every
client Gaussian. The command that code's README gives for Table 2
(``generate_artificial_data.py``, whose ``--marginal`` defaults to ``"beta"``) draws something
else for its last 10 clients, which this module reproduces (same distributions, its own random
stream):

- clients ``0 .. n - n_beta - 1`` ("Gaussian clients"): as ``make_fedgmm_synthetic`` — means
  ``mu_m ~ U(-1, 1)^d``, covariance ``d^(-1/2) I``, label ``1{(x - mu_z) . v_z > 0}``;
- the last ``n_beta`` clients ("Beta clients"): components with their own parameters. Per
  component ``m``, in turn, two sets of per-coordinate Beta parameters are drawn,
  ``a ~ Gamma(3, 1)``, ``b ~ Gamma(5, 1)``; the first set's mean ``a / (a + b)`` becomes the
  component's centre ``c_m`` and its labelling vector is ``w_m = s (c_j - c_m)`` (``j != m``
  uniform, ``s = +-1``), where a later component's centre ``c_j`` is still its placeholder
  ``U(-1, 1)^d`` draw. Component ``m``'s rows come from the ``m``-th parameter set *in drawing
  order* (component 0 from its own first set, 1 from component 0's second set, 2 from
  component 1's first), so a component's rows need not centre on ``c_m``. Both quirks of the
  reference code are kept. Rows are raw Beta draws in ``[0, 1]^d``; the label is
  ``1{(x - c_z) . w_z > 0}``.

Client sizes ``min(int(LogNormal(4, 2)) + 100, 1000)`` and weights ``Dir(alpha)`` as the
reference code. Test rows: ``test_fraction`` of each client's training size (the reference
code draws 5,000 test rows per client; the per-client accuracy is an average over rows, so
only its variance differs).

Randomness: one ``numpy.random.Generator`` from ``random_state`` (None, int or Generator).
"""

from __future__ import annotations

import numpy as np

from fednovelty.datasets.partition._common import _check_int, _check_positive, _rng
from fednovelty.datasets.synthetic import FederatedSplit, _labelling_directions

__all__ = ["make_fedgmm_reference_synthetic"]

_MIN_SIZE, _MAX_SIZE = 100, 1000


def _beta_components(n_components: int, n_features: int, rng: np.random.Generator):
    """Centres (n_components, n_features), labelling vectors (same) and the Beta parameters
    each component's rows are drawn with, ``a`` and ``b`` (each (n_components, n_features)),
    in the reference code's order (see the module doc)."""
    centres = rng.uniform(-1.0, 1.0, size=(n_components, n_features))
    directions = np.empty_like(centres)
    sets = []
    for m in range(n_components):
        sets.append(rng.gamma((3.0, 5.0), size=(n_features, 2)))
        centres[m] = sets[-1][:, 0] / sets[-1].sum(1)
        j = int(rng.integers(n_components - 1))
        j += j >= m
        directions[m] = (2.0 * rng.integers(2) - 1.0) * (centres[j] - centres[m])
        sets.append(rng.gamma((3.0, 5.0), size=(n_features, 2)))
    drawn = np.stack(sets[:n_components])
    return centres, directions, drawn[..., 0], drawn[..., 1]


def make_fedgmm_reference_synthetic(
    n_clients: int,
    n_beta_clients: int = 10,
    *,
    n_components: int = 3,
    n_features: int = 32,
    alpha: float = 0.4,
    test_fraction: float = 0.25,
    random_state: int | np.random.Generator | None = None,
) -> FederatedSplit:
    """Draw the reference code's Table 2 federation (see the module doc).

    Args:
        n_clients: number of clients, >= 1.
        n_beta_clients: how many of them, counted from the end, are Beta clients; 0 <=
            n_beta_clients <= n_clients (the reference code: 10).
        n_components: components per group, >= 2.
        n_features: dimension ``d``, >= 1.
        alpha: Dirichlet concentration of each client's component weights, > 0.
        test_fraction: test rows per client as a fraction of its training rows, in (0, 1).
        random_state: None, int or ``numpy.random.Generator``.

    Returns:
        A :class:`~fednovelty.datasets.synthetic.FederatedSplit`; ``means`` and ``directions``
        are the Gaussian components'; ``components_*`` index the client's own group's
        components.

    Raises:
        ValueError: a bad argument, named in the message.

    Example:
        >>> data = make_fedgmm_reference_synthetic(4, 1, random_state=0)
        >>> beta = data.groups_train == 3
        >>> bool((data.X_train[beta] >= 0).all() and (data.X_train[beta] <= 1).all())
        True
    """
    n_clients = _check_int(n_clients, "n_clients", 1)
    n_beta_clients = _check_int(n_beta_clients, "n_beta_clients", 0)
    if n_beta_clients > n_clients:
        raise ValueError(
            f"n_beta_clients={n_beta_clients} exceeds n_clients={n_clients}; at most every "
            "client can be a Beta client."
        )
    n_components = _check_int(n_components, "n_components", 2)
    n_features = _check_int(n_features, "n_features", 1)
    alpha = _check_positive(alpha, "alpha")
    if not isinstance(test_fraction, float | int) or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be a number in (0, 1); got {test_fraction!r}.")
    rng = _rng(random_state)

    sizes = np.minimum(rng.lognormal(4.0, 2.0, n_clients).astype(np.int64) + _MIN_SIZE, _MAX_SIZE)
    test_sizes = np.maximum(1, np.floor(test_fraction * sizes + 0.5).astype(np.int64))
    weights = rng.dirichlet(np.full(n_components, alpha), size=n_clients)
    means = rng.uniform(-1.0, 1.0, size=(n_components, n_features))
    directions = _labelling_directions(means, rng)
    centres, beta_directions, a, b = _beta_components(n_components, n_features, rng)
    sd = n_features**-0.25

    parts = {"train": [], "test": []}
    for c in range(n_clients):
        beta = c >= n_clients - n_beta_clients
        for part, n in (("train", sizes[c]), ("test", test_sizes[c])):
            z = rng.choice(n_components, size=int(n), p=weights[c])
            if beta:
                X = rng.beta(a[z], b[z])
                y = np.einsum("ij,ij->i", X - centres[z], beta_directions[z]) > 0
            else:
                X = means[z] + sd * rng.standard_normal((int(n), n_features))
                y = np.einsum("ij,ij->i", X - means[z], directions[z]) > 0
            parts[part].append((X, y.astype(np.int64), np.full(int(n), c, np.int64), z))

    def stack(part: str):
        X, y, g, z = zip(*parts[part], strict=True)
        return np.concatenate(X), np.concatenate(y), np.concatenate(g), np.concatenate(z)

    X_train, y_train, groups_train, z_train = stack("train")
    X_test, y_test, groups_test, z_test = stack("test")
    return FederatedSplit(
        X_train=X_train.astype(np.float64, copy=False),
        y_train=y_train,
        groups_train=groups_train,
        X_test=X_test.astype(np.float64, copy=False),
        y_test=y_test,
        groups_test=groups_test,
        components_train=z_train.astype(np.int64),
        components_test=z_test.astype(np.int64),
        client_weights=weights,
        means=means,
        directions=directions,
    )
