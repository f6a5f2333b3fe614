"""The parameter table: every constructor parameter the estimators share, declared once.

Each :class:`~fednovelty.detectors._declare.Param` here is one argument (or one field of an
option object): its name, default, scikit-learn constraints, documentation and where its
value goes. Parameters that several estimators share live in groups (:data:`RUNTIME`,
:data:`DETECTOR`, :data:`EM`, :data:`PCA`, ...); the rarely set federation, privacy and
robustness settings are the fields of the option objects of
:mod:`fednovelty.detectors.options` (:data:`PRIVACY_FIELDS`, :data:`ROBUSTNESS_FIELDS`,
:data:`SAMPLING_FIELDS`, :data:`INITIALISATION_FIELDS`, :data:`PRIOR_FIELDS`), which an
estimator declares with :func:`~fednovelty.detectors._declare.option`, naming the fields it
reads. An estimator lists its parameters and writes its ``__init__`` out::

    class MyDetector(MixtureDetector):
        _params = declare(
            N_COMPONENTS, EM, option(Privacy, fields=FLOOR), DETECTOR, RUNTIME,
            defaults={"max_iter": 50},
        )

        def __init__(self, n_components=1, *, covariance_type="full", reg_covar=1e-06,
                     tol=0.001, max_iter=50, privacy=None, contamination=0.1, ...):
            store(self, locals())

(:mod:`fednovelty.detectors._declare` checks the written signature against the table and
writes ``_parameter_constraints`` and the ``Args:`` docs from it). :meth:`ParamSet.settings`
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


def _positive_int(low: int = 1) -> list:
    return [Interval(Integral, low, None, closed="left")]


def _non_negative() -> list:
    return [Interval(Real, 0.0, None, closed="left")]


def _auto_prior(value: Any, n_features: int) -> float | None:
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
        _non_negative(),
        "added to every covariance's diagonal (as scikit-learn's).",
    ),
    Param(
        "tol",
        1e-3,
        _non_negative(),
        "stop when the mean log-likelihood (or bound) changes by less than this.",
    ),
    Param("max_iter", 100, _positive_int(), "most iterations (federated: rounds)."),
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
        _positive_int(),
        "a client with fewer rows sends nothing.",
    ),
)

#: Communication rounds of a model trained for a fixed number of rounds.
ROUNDS = Param("rounds", 100, _positive_int(), "communication rounds in all.")

#: Local training of a learner: single parameters (the estimators that train networks take
#: different subsets) and the joint models' group.
LOCAL_EPOCHS = Param(
    "local_epochs", 5, _positive_int(), "local passes over each client's rows per round."
)
LEARNING_RATE = Param(
    "learning_rate",
    1e-3,
    [Interval(Real, 0.0, None, closed="neither")],
    "the local optimiser's step size.",
)
BATCH_SIZE = Param(
    "batch_size",
    32,
    _positive_int(),
    "rows per local step; with ``Privacy.epsilon``, DP-SGD's public expected lot: a step's "
    "noisy gradient sum is divided by it, never by the rows a client holds (set it near "
    "``Privacy.sample_rate`` times a client's typical row count).",
)
OPTIMIZER = Param(
    "optimizer", "sgd", [StrOptions({"sgd", "adam"})], 'the local optimiser: "sgd" or "adam".'
)
LEARNER: Group = (LOCAL_EPOCHS, LEARNING_RATE, BATCH_SIZE, OPTIMIZER)

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

#: The variational mixtures' weight prior (scikit-learn's names; their Gaussian-Wishart
#: prior is :data:`PRIOR_FIELDS`).
WEIGHT_PRIORS: Group = (
    Param(
        "weight_concentration_prior_type",
        "dirichlet_process",
        [StrOptions({"dirichlet_process", "dirichlet_distribution"})],
        "the weights' prior, as scikit-learn's ``BayesianGaussianMixture``.",
    ),
    Param(
        "weight_concentration_prior",
        None,
        [Interval(Real, 0.0, None, closed="neither"), None],
        "the weights' concentration (``None``: ``1 / n_components``).",
    ),
)

# ------------------------------------------------------------------ option objects' fields
#: ``Privacy``: the clients' privacy floor (``docs/privacy.md``) and the differential
#: privacy of their releases (``docs/differential_privacy.md``).
PRIVACY_FIELDS: Group = (
    Param(
        "min_rows",
        5,
        _positive_int(),
        "each client's privacy floor (``docs/privacy.md``): every statistic a client sends "
        "is backed by at least this many of its rows, or it is not sent; ``1`` is no floor.",
        "estimator",
        legacy="privacy_min_rows",
    ),
    Param(
        "epsilon",
        None,
        [Interval(Real, 0.0, 100.0, closed="right"), None],
        "the fit's differential-privacy budget epsilon per client row (``None``: off). The "
        "noise is calibrated so that every round the fit can run together spends at most "
        "this at ``delta`` (Google's dp-accounting, ``pip install 'fednovelty[dp]'``); "
        "each round spends budget, so fewer rounds (``max_iter``, "
        "``Initialisation.kmeans_rounds``) mean less noise. ``privacy_spent_`` reports what "
        "the fit spent.",
        "estimator",
        legacy="dp_epsilon",
    ),
    Param(
        "delta",
        1e-5,
        [Interval(Real, 0.0, 1.0, closed="neither")],
        "the differential-privacy delta (below one over the rows of a client).",
        "estimator",
        legacy="dp_delta",
    ),
    Param(
        "bounds",
        None,
        ["array-like", None],
        "public per-feature bounds ``(low, high)`` (two rows of ``n_features`` values, from "
        "domain knowledge, not from the rows): the rows are mapped to ``[-1, 1]`` per feature "
        "before anything is taken from them; ``None`` with ``epsilon``: estimated "
        "privately first (per-feature DP quantiles, 10% of the budget).",
        "estimator",
        legacy="dp_bounds",
    ),
    Param(
        "clip",
        "auto",
        [StrOptions({"auto"}), Interval(Real, 0.0, None, closed="neither")],
        "the L2 radius every row is clipped to, in the units the rounds work in (z-scores "
        "with federated EM's ``Prior.standardize``, else the bounds' ``[-1, 1]``); "
        '``"auto"`` is ``1.5 * sqrt(n_features)`` in z-scores and ``sqrt(n_features)`` in '
        "the box (no row inside the bounds is clipped).",
        "estimator",
        legacy="dp_clip",
    ),
    Param(
        "mode",
        "central",
        [StrOptions({"central", "local", "distributed"})],
        'who adds the noise: ``"central"`` (a trusted server, to the sum), ``"local"`` '
        '(each client, all of it: the server may be curious) or ``"distributed"`` (each '
        "client 1/m of the variance, for secure sums).",
        "estimator",
        legacy="dp_mode",
    ),
    Param(
        "local_iterations",
        20,
        _positive_int(),
        "with ``epsilon``, the fixed number of DP-EM iterations of each client's local fit "
        "(the one-shot and local models): each is one noisy release of its summed "
        "statistics, so the budget is split over them.",
        setting="dp_iterations",
        legacy="dp_iterations",
    ),
    Param(
        "sample_rate",
        0.05,
        [Interval(Real, 0.0, 1.0, closed="right")],
        "with ``epsilon`` (models whose learners leave the clients), each row's chance to be "
        "in one DP-SGD step's Poisson sample (a round runs ``ceil(local_epochs / "
        "sample_rate)`` steps); smaller rates amplify privacy more and take more steps.",
        "estimator",
        legacy="dp_sample_rate",
    ),
    Param(
        "sgd_clip",
        1.0,
        [Interval(Real, 0.0, None, closed="neither")],
        "with ``epsilon``, the L2 bound of one row's gradient over all the learners.",
        "estimator",
        legacy="dp_sgd_clip",
    ),
    Param(
        "learner_share",
        "auto",
        [StrOptions({"auto"}), Interval(Real, 0.0, 1.0, closed="neither")],
        "with ``epsilon``, the learners' share of the budget (of ``mu**2`` in Gaussian "
        'differential privacy); the statistics get the rest. ``"auto"``: the estimator\'s '
        "(0.5; ``VGM2Classifier`` 0.9).",
        "estimator",
        legacy="dp_learner_share",
    ),
    Param(
        "loss_clip",
        None,
        [Interval(Real, 0.0, None, closed="neither"), None],
        "with ``epsilon``, the public bound each row's cross-entropy is clipped to in "
        "IFCA's and IFCA-CAM's noisy min-loss choice (the noise scales with it: it sets "
        "the choice's accuracy, not its privacy); ``None``: ``2 log(n_classes)``.",
        setting="dp_loss_clip",
        legacy="dp_loss_clip",
    ),
)
#: The privacy fields an estimator reads: the floor alone (no differential privacy), the
#: floor and differential privacy of summed statistics, and the learners' DP-SGD.
FLOOR = ("min_rows",)
DP = ("min_rows", "epsilon", "delta", "bounds", "clip", "mode")
DP_SGD = ("sample_rate", "sgd_clip", "learner_share")

#: ``Robustness``: robust aggregation against hostile clients (``docs/robust.md``).
ROBUSTNESS_FIELDS: Group = (
    Param(
        "aggregation",
        "sum",
        [StrOptions({"sum", "trimmed", "median"})],
        'how the server combines the clients\' replies: ``"sum"`` (exact), ``"trimmed"`` '
        '(the ``trim`` share of clients at each end left out, per coordinate) or ``"median"`` '
        "where the algorithm has it (``docs/robust.md``).",
    ),
    Param(
        "trim",
        0.1,
        [Interval(Real, 0.0, 0.5, closed="left")],
        'share of clients ``aggregation="trimmed"`` leaves out at each end; must exceed the '
        "share of hostile clients.",
    ),
    Param(
        "client_weight_cap",
        None,
        [Interval(Real, 1.0, None, closed="left"), None],
        "no client counts for more than this many times the median client's row count "
        "(``None``: no cap).",
    ),
)

#: ``ClientSampling``: client sampling and simulated failures of the in-process engine.
SAMPLING_FIELDS: Group = (
    Param(
        "fraction",
        1.0,
        [Interval(Real, 0.0, 1.0, closed="right")],
        "share of clients asked each round.",
        "engine",
    ),
    Param(
        "dropout",
        0.0,
        [Interval(Real, 0.0, 1.0, closed="left")],
        "chance that an asked client fails to reply (simulated).",
        "engine",
    ),
    Param(
        "batch_clients",
        True,
        ["boolean"],
        "run a round's clients as one batched computation where the algorithm batches "
        "them (the joint models' learner SGD); ``False``: one after another, as Flower "
        "nodes. Equal fits to rounding.",
        "engine",
    ),
)

#: ``Initialisation``: the details of a federated mixture's start (``init_params`` is the
#: estimator's own parameter).
INITIALISATION_FIELDS: Group = (
    Param(
        "kmeans_rounds", 10, _positive_int(), "most federated Lloyd rounds of the k-means start."
    ),
    Param("subset_size", 100, _positive_int(), 'rows pooled by ``init_params="subset"``.'),
    Param("weights_init", None, ["array-like", None], "starting weights (n_components,)."),
    Param("means_init", None, ["array-like", None], "starting means (n_components, n_features)."),
    Param(
        "precisions_init",
        None,
        ["array-like", None],
        "starting precisions, shaped as scikit-learn's for ``covariance_type``.",
    ),
)
#: The initialisation fields of a k-means start without given parameters.
KMEANS_START = ("kmeans_rounds", "subset_size")

#: ``Prior``: the remedies for real tabular data (``docs/robust.md``: standardisation and a
#: covariance prior) and the variational mixtures' Gaussian-Wishart prior.
PRIOR_FIELDS: Group = (
    Param(
        "standardize",
        True,
        ["boolean"],
        "fit on federated z-scores of the features (one extra round; the model and its "
        "scores stay in the original units); ``False`` fits the raw features.",
    ),
    Param(
        "strength",
        "auto",
        [StrOptions({"auto"}), Interval(Real, 0.0, None, closed="neither"), None],
        "pseudo-rows of a conjugate prior that pulls every covariance towards ``scale`` "
        "times the pooled variance of each feature (federated EM: MAP EM; variational "
        "Bayes: the Wishart's, whose ``degrees_of_freedom`` default to it and whose "
        "``covariance`` to it times ``scale`` times the pooled variances, diagonal); "
        '``"auto"`` is ``n_features + 2``; ``None`` turns it off (plain maximum '
        "likelihood; variational Bayes: scikit-learn's defaults, ``n_features`` and the "
        "pooled covariance). A given ``degrees_of_freedom`` or ``covariance`` wins.",
        setting="prior_strength",
        convert=_auto_prior,
        legacy="prior_strength",
    ),
    Param(
        "scale",
        "auto",
        [StrOptions({"auto"}), Interval(Real, 0.0, None, closed="neither")],
        "the prior's target variance as a multiple of each feature's pooled variance (a "
        'component backed by few rows is flattened, not made a spike); ``"auto"``: the '
        f"estimator's ({PRIOR_SCALE:g} for federated EM's prior, 1 for variational "
        "Bayes' Wishart).",
        setting="prior_scale",
        legacy="prior_scale",
    ),
    Param(
        "mean",
        None,
        ["array-like", None],
        "(n_features,) the means' prior mean (variational Bayes; ``None``: the pooled mean, "
        "one extra round).",
        setting="mean_prior",
        legacy="mean_prior",
    ),
    Param(
        "mean_precision",
        None,
        [Interval(Real, 0.0, None, closed="neither"), None],
        "the means' prior precision ``beta_0`` (variational Bayes; ``None``: 1).",
        setting="mean_precision_prior",
        legacy="mean_precision_prior",
    ),
    Param(
        "degrees_of_freedom",
        None,
        [Interval(Real, 0.0, None, closed="neither"), None],
        "the Wishart's degrees of freedom ``nu_0`` (variational Bayes; ``None``: "
        "``strength``, or ``n_features`` without it).",
        setting="degrees_of_freedom_prior",
        legacy="degrees_of_freedom_prior",
    ),
    Param(
        "covariance",
        None,
        ["array-like", Real, None],
        "the Wishart's ``W_0^-1`` (variational Bayes): (n_features, n_features) for "
        "full/tied, (n_features,) for diag, a float for spherical (``None``: from "
        "``strength`` and ``scale``, or scikit-learn's pooled covariance, its diagonal, or "
        "the mean of its diagonal; one extra round).",
        setting="covariance_prior",
        legacy="covariance_prior",
    ),
)
#: The prior fields of federated EM's remedies (standardisation and the MAP prior).
REMEDIES = ("standardize", "strength", "scale")
