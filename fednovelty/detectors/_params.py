"""The parameter table: every constructor parameter the estimators share, declared once.

Each :class:`~fednovelty.detectors._declare.Param` here is one argument (or one field of an
option object): its name, default, scikit-learn constraints, documentation and where its
value goes. Parameters that several estimators share live in groups (:data:`RUNTIME`,
:data:`DETECTOR`, :data:`EM`, :data:`PCA`, ...); the rarely set federation, privacy and
robustness settings are the fields of the option objects of
:mod:`fednovelty.detectors.options` (their fields are declared in
:mod:`fednovelty.detectors._option_fields`), which an
estimator declares with :func:`~fednovelty.detectors._declare.option`, naming the fields it
reads. An estimator writes its ``__init__`` out and declares only its own parameters and
the options it reads; every other written parameter comes from :data:`SHARED` (this table
by name), with the signature's default::

    class MyDetector(MixtureDetector):
        _params = declare(option(Privacy, fields=FLOOR))

        def __init__(self, n_components=1, *, covariance_type="full", reg_covar=1e-06,
                     tol=0.001, max_iter=50, privacy=None, contamination=0.1, ...):
            store(self, locals())

(:func:`~fednovelty.detectors._declare.compose` completes the declaration from the signature
and writes ``_parameter_constraints`` and the ``Args:`` docs). :meth:`ParamSet.settings`
gives the algorithm's settings (``role="algorithm"``, renamed by :attr:`Param.setting` where
the algorithm spells it differently) so that an estimator builds its algorithm as
``Algorithm(**self._settings(n_features))``.

One name has one meaning across estimators: a group's parameter (or an option's field)
keeps its documentation and constraints everywhere it is used; an estimator changes only
its default (an option field's ``"auto"``).
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import torch
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._declare import (
    ROLES,
    Group,
    Param,
    ParamSet,
    compose,
    declare,
    option,
    signature_mismatch,
    store,
)
from fednovelty.federated.core.learners import LEARNERS

__all__ = [
    "ROLES",
    "Group",
    "Param",
    "ParamSet",
    "compose",
    "declare",
    "option",
    "signature_mismatch",
    "store",
]


def positive_int(low: int = 1) -> list:
    return [Interval(Integral, low, None, closed="left")]


def non_negative() -> list:
    return [Interval(Real, 0.0, None, closed="left")]


def auto_prior(value: Any, n_features: int) -> float | None:
    """``strength="auto"`` -> ``n_features + 2`` pseudo-rows; a number or None as is."""
    return n_features + 2.0 if value == "auto" else value


#: Default target of federated EM's covariance prior, as a multiple of each feature's pooled
#: variance (``Prior.scale="auto"``).
PRIOR_SCALE = 4.0

# ------------------------------------------------------------------ the shared groups
#: The size of a mixture (an upper bound where a variational mixture prunes components).
N_COMPONENTS = Param(
    "n_components",
    1,
    [Interval(Integral, 1, None, closed="left")],
    "number of Gaussian components.",
)

#: Torch placement, seeding and progress: every estimator.
RUNTIME: Group = (
    Param("random_state", None, ["random_state"], "seed (int, RandomState or None).", "estimator"),
    Param(
        "device",
        None,
        [None, str, torch.device],
        '``"cpu"`` (default) or ``"cuda"``: where the rows and the model live.',
        "estimator",
    ),
    Param(
        "dtype",
        "float64",
        [StrOptions({"float64", "float32"})],
        '``"float64"`` or ``"float32"``: the precision the fit and the scores compute in.',
        "estimator",
    ),
    Param(
        "progress",
        False,
        ["boolean"],
        "show a progress bar over the communication rounds (only where the output is a terminal).",
        "estimator",
    ),
)

#: PyOD's threshold: every novelty detector.
DETECTOR: Group = (
    Param(
        "contamination",
        0.1,
        [Interval(Real, 0.0, 0.5, closed="right")],
        "expected share of anomalies; sets ``threshold_`` and ``labels_`` (PyOD).",
        "estimator",
    ),
)

#: Split-conformal calibration of the alarm threshold: every novelty detector
#: (:mod:`fednovelty.detectors._conformal`).
CALIBRATION: Group = (
    Param(
        "calibration",
        "contamination",
        [StrOptions({"contamination", "conformal"})],
        '``"contamination"`` (PyOD\'s: ``threshold_`` is the ``1 - contamination`` quantile '
        'of the training scores) or ``"conformal"`` (split conformal: ``fit`` holds out '
        "``calibration_share`` of each client's rows, trains on the rest, and sets each "
        "client's threshold from its held-out rows' scores so that a new row of that "
        "client raises a false alarm with probability at most ``alpha``; ``threshold_`` "
        "is the federation's, from one extra round of binned scores; ``p_values``, "
        "``discoveries`` and ``calibrate`` need it).",
        "estimator",
    ),
    Param(
        "alpha",
        0.01,
        [Interval(Real, 0.0, 0.5, closed="right")],
        'the false-alarm rate ``calibration="conformal"`` guarantees per client (a client '
        "needs at least ``ceil(1 / alpha) - 1`` calibration rows for a threshold of its own).",
        "estimator",
    ),
    Param(
        "calibration_share",
        0.2,
        [Interval(Real, 0.0, 0.5, closed="right")],
        'with ``calibration="conformal"``, the share of each client\'s rows held out of '
        "training to calibrate its threshold (``floor(share * n_rows)`` rows, drawn with "
        "``random_state``).",
        "estimator",
    ),
)

#: A Gaussian mixture's covariance shape.
COVARIANCE_TYPE = Param(
    "covariance_type",
    "full",
    [StrOptions({"full", "tied", "diag", "spherical"})],
    '``"full"``, ``"tied"``, ``"diag"`` or ``"spherical"`` (as scikit-learn\'s).',
)

#: The M-step's regularisation and the stopping rule of the iterations (every mixture,
#: the one-feature mixtures without a covariance type included).
EM_ITERATION: Group = (
    Param(
        "reg_covar",
        1e-6,
        non_negative(),
        "added to every covariance's diagonal (as scikit-learn's).",
    ),
    Param(
        "tol",
        1e-3,
        non_negative(),
        "stop when the mean log-likelihood (or bound) changes by less than this.",
    ),
    Param("max_iter", 100, positive_int(), "most iterations (federated: rounds)."),
)

#: A Gaussian mixture's covariances and the stopping rule of its iterations.
EM: Group = (COVARIANCE_TYPE, *EM_ITERATION)

#: How a federated mixture starts (its details are :data:`INITIALISATION_FIELDS`).
INIT_PARAMS = Param(
    "init_params",
    "kmeans",
    [StrOptions({"kmeans", "separated", "subset", "oneshot"})],
    '``"kmeans"`` (federated k-means), ``"separated"`` (centres spread over the merged '
    'feature range), ``"subset"`` (pools a few raw rows on the server: not private) or '
    '``"oneshot"`` (one round of local fits reduced on the server, FedGenGMM\'s round).',
)

#: Widest rows ``pca_components="auto"`` leaves alone: above it the front end engages. The
#: widest of the 25 tabular benchmark sets has 166 features (their full-covariance fits
#: finish there), so ``"auto"`` changes none of them; image and text embeddings (512, 1,555
#: features) are projected.
AUTO_PCA_FEATURES = 200


def front_end_axes(value: Any, n_features: int) -> int | str | None:
    """What ``pca_components`` asks of rows ``n_features`` wide: ``None`` (no front end),
    an axis count, or ``"auto"`` (the server picks it after the PCA rounds).

    Raises:
        ValueError: an axis count above ``n_features``.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"pca_components must be an integer >= 1, 'auto' or None, got {value!r}.")
    if value == "auto":
        return "auto" if n_features > AUTO_PCA_FEATURES else None
    if int(value) > n_features:
        raise ValueError(
            f"pca_components={value} must be <= n_features={n_features}; lower it, or use "
            "'auto' or None."
        )
    return int(value)


#: A federated PCA front end (the estimator runs it before the algorithm; docs/high_dimension.md).
PCA: Group = (
    Param(
        "pca_components",
        "auto",
        [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"}), None],
        "federated PCA front end (two extra rounds of summed moments): the mixture models "
        "the rows' projection on this many principal axes and ``log p(x)`` adds the "
        "probabilistic-PCA residual term (an isotropic Gaussian on the discarded directions "
        "whose variance is their mean eigenvalue), so it stays a density of ``x``. "
        f'``"auto"``: only for rows of more than {AUTO_PCA_FEATURES} features, with the '
        "number of axes chosen by the server (``fednovelty.mixture.ppca."
        "choose_n_components``); ``None``: the full rows.",
        "estimator",
    ),
)


#: Each client's own mixture, its size chosen by BIC.
LOCAL_FIT: Group = (
    Param(
        "client_components",
        None,
        [Interval(Integral, 1, None, closed="left"), None],
        "components of each client's local mixture; ``None`` chooses it by BIC over ``k_range``.",
    ),
    Param(
        "k_range",
        (1, 10),
        [tuple, list],
        "(smallest, largest) local component count the BIC search tries.",
        convert=lambda value, n_features: tuple(value),
    ),
    Param(
        "min_client_samples",
        2,
        positive_int(),
        "a client with fewer rows sends nothing.",
    ),
)

#: Communication rounds of a model trained for a fixed number of rounds.
ROUNDS = Param("rounds", 100, positive_int(), "communication rounds in all.")

#: The learners' architecture (the joint models, the clustered classifiers).
LEARNER_CHOICE = Param(
    "learner",
    "linear",
    [StrOptions(set(LEARNERS)), callable],
    '``"linear"`` (multinomial logistic regression), ``"mlp"`` (one hidden layer of 64), '
    '``"cnn"`` (the FedGMM paper\'s FEMNIST encoder, for square images flattened to rows) '
    "or a factory ``(n_features, n_classes) -> torch.nn.Module`` (a model with a factory "
    "cannot be saved).",
    setting="learner_factory",
)


#: Random starts fitted and scored together (``fednovelty.detectors._members``).
N_MEMBERS = Param(
    "n_members",
    1,
    positive_int(),
    "fits of the model from different starts (member 0 from ``random_state``), each a whole "
    "federated fit; a row's score is the mean of the members' log-densities (the log of "
    "their geometric mean, not a normalised density for ``n_members > 1``). Rounds and "
    "bytes grow ``n_members`` times.",
    "estimator",
)


#: every shared parameter by name: an estimator that writes one in its ``__init__`` gets it
#: from here unless it declares its own (:func:`~fednovelty.detectors._declare.complete`).
SHARED: dict[str, Param] = {
    p.name: p
    for p in (
        N_COMPONENTS,
        *RUNTIME,
        *DETECTOR,
        *CALIBRATION,
        *EM,
        INIT_PARAMS,
        *PCA,
        *LOCAL_FIT,
        ROUNDS,
        LEARNER_CHOICE,
        N_MEMBERS,
    )
}
