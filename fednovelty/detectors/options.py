"""Option objects: the rarely set settings of the estimators, grouped under one name each.

An estimator takes each group as one parameter holding an option object (``None``, the
default, means the option's defaults)::

    from fednovelty import FedGMMDetector, Privacy, Robustness

    det = FedGMMDetector(
        n_components=4,
        privacy=Privacy(epsilon=1.0, bounds=[[-5, -5], [5, 5]]),
        robustness=Robustness(aggregation="trimmed", trim=0.2),
    )
    det.set_params(privacy__epsilon=2.0)  # nested, as scikit-learn's

- :class:`Privacy` (``privacy=``): the clients' privacy floor and differential privacy;
- :class:`Robustness` (``robustness=``): robust aggregation against hostile clients;
- :class:`ClientSampling` (``sampling=``): client sampling and simulated dropout;
- :class:`Initialisation` (``initialisation=``): the details of a mixture's start;
- :class:`Prior` (``prior=``): standardisation, the covariance (Gaussian-Wishart) prior and
  the variational mixtures' weight prior;
- :class:`Training` (``training=``): the local training of the networks an estimator trains;
- :class:`Objective` (``objective=``): the terms of VGM2's loss and its UMAP graph.

A field keeps one meaning across estimators; each estimator reads the fields it documents
(a field it does not read must keep its default: ``fit`` names it otherwise), and a field
whose default is ``"auto"`` is the estimator's own choice, documented with its parameter.
The option objects are scikit-learn estimators of settings only (``get_params``,
``set_params``, ``clone``); an estimator never changes the object it was given. Two options
of one class with equal fields are equal.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator

from fednovelty.detectors import _declare
from fednovelty.detectors._option_fields import (
    INITIALISATION_FIELDS,
    OBJECTIVE_FIELDS,
    PRIOR_FIELDS,
    PRIVACY_FIELDS,
    ROBUSTNESS_FIELDS,
    SAMPLING_FIELDS,
    TRAINING_FIELDS,
)
from fednovelty.detectors._params import PRIOR_SCALE, declare

__all__ = [
    "ClientSampling",
    "Initialisation",
    "Objective",
    "Prior",
    "Privacy",
    "Robustness",
    "Training",
]


class _Options(BaseEstimator):
    """Base of the option objects: a written-out ``__init__`` checked against ``_params``
    (its fields in :mod:`fednovelty.detectors._params`), which also give
    ``_parameter_constraints`` and the ``Args:`` docs."""

    #: the estimator parameter that holds this option, and its one-line summary.
    param_name: ClassVar[str]
    summary: ClassVar[str]
    #: what a field's ``"auto"`` is unless an estimator says otherwise.
    auto_defaults: ClassVar[dict[str, Any]] = {}
    _params: ClassVar[_declare.ParamSet]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "_params" in cls.__dict__:
            _declare.compose(cls)
            _declare.OPTION_CLASSES[cls.param_name] = cls

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        mine, theirs = self.get_params(deep=False), other.get_params(deep=False)
        return all(_equal(mine[name], theirs[name]) for name in mine)

    def __hash__(self) -> int:  # equal options hash alike; fields may change (set_params)
        return hash(type(self).__name__)


def _equal(a: Any, b: Any) -> bool:
    """Field equality: arrays and nested sequences by value."""
    if a is b:
        return True
    if isinstance(a, str) or isinstance(b, str) or a is None or b is None:
        return type(a) is type(b) and a == b
    try:
        return bool(np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))
    except (TypeError, ValueError):
        return False


class Privacy(_Options):
    """The clients' privacy: the floor every released statistic respects
    (``docs/privacy.md``) and differential privacy of what leaves a client
    (``docs/differential_privacy.md``).

    Every estimator reads ``min_rows``; those with differential privacy read ``epsilon``
    (``None``: off) and the fields they document.

    Examples:
        >>> import numpy as np
        >>> from fednovelty import FedGMMDetector, Privacy
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(0, 1, (400, 2))
        >>> det = FedGMMDetector(n_components=2, max_iter=5, random_state=0,
        ...     privacy=Privacy(epsilon=1.0, bounds=[[-4, -4], [4, 4]]))
        >>> det = det.fit(X, groups=np.repeat([0, 1, 2, 3], 100))
        >>> det.privacy_spent_["epsilon"] <= 1.0
        True
    """

    param_name = "privacy"
    summary = "the clients' privacy floor and differential privacy"
    auto_defaults: ClassVar[dict[str, Any]] = {"learner_share": 0.5}
    _params = declare(PRIVACY_FIELDS)

    def __init__(
        self,
        *,
        min_rows=5,
        epsilon=None,
        delta=1e-05,
        bounds=None,
        clip="auto",
        mode="central",
        local_iterations=20,
        sample_rate=0.05,
        sgd_clip=1.0,
        learner_share="auto",
        loss_clip=None,
    ) -> None:
        _declare.store(self, locals())


class Robustness(_Options):
    """Robust aggregation against hostile clients (``docs/robust.md``): how the server
    combines the replies and how much one client may count."""

    param_name = "robustness"
    summary = "robust aggregation against hostile clients"
    _params = declare(ROBUSTNESS_FIELDS)

    def __init__(self, *, aggregation="sum", trim=0.1, client_weight_cap=None) -> None:
        self.aggregation = aggregation
        self.trim = trim
        self.client_weight_cap = client_weight_cap


class ClientSampling(_Options):
    """Which clients each round asks, simulated failures of the in-process engine, and the
    engine that runs the rounds (in-process, or Flower's Simulation Engine)."""

    param_name = "sampling"
    summary = "client sampling and simulated dropout of the rounds"
    _params = declare(SAMPLING_FIELDS)

    def __init__(
        self, *, fraction=1.0, dropout=0.0, batch_clients=True, engine="in-process"
    ) -> None:
        self.fraction = fraction
        self.dropout = dropout
        self.batch_clients = batch_clients
        self.engine = engine


class Initialisation(_Options):
    """The details of a federated mixture's start (the estimator's ``init_params`` chooses
    the protocol): the k-means rounds, the subset's size, given starting parameters."""

    param_name = "initialisation"
    summary = "the details of the mixture's start"
    _params = declare(INITIALISATION_FIELDS)

    def __init__(
        self,
        *,
        kmeans_rounds=10,
        subset_size=100,
        weights_init=None,
        means_init=None,
        precisions_init=None,
    ) -> None:
        _declare.store(self, locals())


class Prior(_Options):
    """The remedies for real tabular data (``docs/robust.md``): federated standardisation
    and a covariance prior of ``strength`` pseudo-rows at ``scale`` times each feature's
    pooled variance; and the variational mixtures' Gaussian-Wishart prior (``mean``,
    ``mean_precision``, ``degrees_of_freedom``, ``covariance``; scikit-learn's
    ``mean_prior``, ``mean_precision_prior``, ``degrees_of_freedom_prior``,
    ``covariance_prior``) and weight prior (``weight_concentration_type``,
    ``weight_concentration``; scikit-learn's ``weight_concentration_prior_type``,
    ``weight_concentration_prior``)."""

    param_name = "prior"
    summary = "standardisation and the covariance prior"
    auto_defaults: ClassVar[dict[str, Any]] = {"scale": PRIOR_SCALE}
    _params = declare(PRIOR_FIELDS)

    def __init__(
        self,
        *,
        standardize=True,
        strength="auto",
        scale="auto",
        mean=None,
        mean_precision=None,
        degrees_of_freedom=None,
        covariance=None,
        weight_concentration_type="dirichlet_process",
        weight_concentration=None,
    ) -> None:
        _declare.store(self, locals())


class Training(_Options):
    """The local training of the networks an estimator trains (the joint models' learners,
    the clustered classifiers, VGM2's encoder and markers): epochs or steps, step size,
    batch, optimiser and FedProx's proximal term. A field left ``"auto"`` is the
    estimator's own default, given with its ``training`` parameter.

    Examples:
        >>> from fednovelty import JointFedGMMDetector, Training
        >>> det = JointFedGMMDetector(2, training=Training(local_epochs=2, learning_rate=0.1))
        >>> det.set_params(training__batch_size=16).training.batch_size
        16
    """

    param_name = "training"
    summary = "the local training of the networks"
    _params = declare(TRAINING_FIELDS)

    def __init__(
        self,
        *,
        local_epochs="auto",
        local_steps=10,
        learning_rate="auto",
        batch_size="auto",
        optimizer="sgd",
        momentum=0.9,
        mu_prox=0.0,
        marker_learning_rate=0.01,
    ) -> None:
        _declare.store(self, locals())


class Objective(_Options):
    """The terms of VGM2's training loss (the paper's Eq. 7: parametric UMAP, similarity,
    calibration, the markers' KL; FedProto's prototype pull) and its UMAP graph."""

    param_name = "objective"
    summary = "the weights of the training loss's terms and its UMAP graph"
    _params = declare(OBJECTIVE_FIELDS)

    def __init__(
        self,
        *,
        umap_weight=1.0,
        similarity_weight=1.0,
        calibration_weight=1.0,
        kl_weight=0.01,
        prototype_weight=1.0,
        umap_neighbors=15,
        umap_min_dist=0.1,
    ) -> None:
        _declare.store(self, locals())
