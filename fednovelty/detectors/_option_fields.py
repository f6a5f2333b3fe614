"""The option objects' fields: each rarely set setting, declared once.

Every :class:`~fednovelty.detectors._declare.Param` here is one field of an option object of
:mod:`fednovelty.detectors.options` (``Privacy``, ``Robustness``, ``ClientSampling``,
``Initialisation``, ``Prior``, ``Training``, ``Objective``): its name, default, constraints,
documentation and where its value goes. An estimator declares an option with
:func:`~fednovelty.detectors._declare.option`, naming the fields it reads (the tuples
:data:`FLOOR`, :data:`DP`, :data:`REMEDIES`, ... name the usual subsets); a field's
``legacy`` is its name when it was an estimator parameter of its own (files saved then).
"""

from __future__ import annotations

from numbers import Real

from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._declare import Group, Param
from fednovelty.detectors._params import PRIOR_SCALE, auto_prior, non_negative, positive_int

#: ``Training``: the local training of the networks an estimator trains (the joint models'
#: learners, the clustered classifiers, VGM2's encoder); ``"auto"`` is the estimator's own.
TRAINING_FIELDS: Group = (
    Param(
        "local_epochs",
        "auto",
        [StrOptions({"auto"}), *positive_int()],
        "local passes over each client's rows per round.",
    ),
    Param("local_steps", 10, positive_int(), "mini-batch steps of each local training."),
    Param(
        "learning_rate",
        "auto",
        [StrOptions({"auto"}), Interval(Real, 0.0, None, closed="neither")],
        "the local optimiser's step size.",
    ),
    Param(
        "batch_size",
        "auto",
        [StrOptions({"auto"}), *positive_int()],
        "rows per local step; with ``Privacy.epsilon``, DP-SGD's public expected lot: a "
        "step's noisy gradient sum is divided by it, never by the rows a client holds (set "
        "it near ``Privacy.sample_rate`` times a client's typical row count).",
    ),
    Param(
        "optimizer", "sgd", [StrOptions({"sgd", "adam"})], 'the local optimiser: "sgd" or "adam".'
    ),
    Param(
        "momentum",
        0.9,
        [Interval(Real, 0.0, 1.0, closed="left")],
        'heavy-ball momentum of ``optimizer="sgd"``.',
    ),
    Param(
        "mu_prox",
        0.0,
        non_negative(),
        "FedProx proximal coefficient of the local objective (0 = none).",
    ),
    Param(
        "marker_learning_rate",
        1e-2,
        [Interval(Real, 0.0, None, closed="neither")],
        "Adam's step size for the relation markers.",
    ),
)

#: ``Privacy``: the clients' privacy floor (``docs/privacy.md``) and the differential
#: privacy of their releases (``docs/differential_privacy.md``).
PRIVACY_FIELDS: Group = (
    Param(
        "min_rows",
        5,
        positive_int(),
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
        positive_int(),
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

#: ``ClientSampling``: client sampling, simulated failures of the in-process engine, and the
#: engine that runs the rounds.
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
    Param(
        "engine",
        "in-process",
        [StrOptions({"in-process", "flower-sim"})],
        'what runs the rounds: ``"in-process"`` (fednovelty\'s own engine, the default) or '
        '``"flower-sim"`` (Flower\'s Simulation Engine: one virtual SuperNode per client on '
        "Ray actors, the deployment's ServerApp and ClientApp code; the same model, "
        "``docs/flower.md``). ``flower-sim`` refuses ``dropout`` and differential privacy, "
        "and runs each client on its own (``batch_clients`` has no effect).",
        "engine",
    ),
)

#: ``Initialisation``: the details of a federated mixture's start (``init_params`` is the
#: estimator's own parameter).
INITIALISATION_FIELDS: Group = (
    Param("kmeans_rounds", 10, positive_int(), "most federated Lloyd rounds of the k-means start."),
    Param("subset_size", 100, positive_int(), 'rows pooled by ``init_params="subset"``.'),
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
        convert=auto_prior,
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
    Param(
        "weight_concentration_type",
        "dirichlet_process",
        [StrOptions({"dirichlet_process", "dirichlet_distribution"})],
        "the weights' prior (variational Bayes), as scikit-learn's ``BayesianGaussianMixture``.",
        setting="weight_concentration_prior_type",
        legacy="weight_concentration_prior_type",
    ),
    Param(
        "weight_concentration",
        None,
        [Interval(Real, 0.0, None, closed="neither"), None],
        "the weights' concentration (variational Bayes; ``None``: ``1 / n_components``).",
        setting="weight_concentration_prior",
        legacy="weight_concentration_prior",
    ),
)
#: The prior fields of federated EM's remedies (standardisation and the MAP prior).
REMEDIES = ("standardize", "strength", "scale")

#: ``Objective``: the terms of VGM2's training loss (the paper's Eq. 7) and its UMAP graph.
OBJECTIVE_FIELDS: Group = (
    Param("umap_weight", 1.0, non_negative(), "weight of ``L_umap`` (Eq. 7)."),
    Param("similarity_weight", 1.0, non_negative(), "gamma, weight of ``L_sim`` (Eq. 7)."),
    Param("calibration_weight", 1.0, non_negative(), "eta, weight of ``L_cal`` (Eq. 7)."),
    Param("kl_weight", 0.01, non_negative(), "lambda, weight of the KL term (Eq. 7)."),
    Param("prototype_weight", 1.0, non_negative(), "FedProto's pull towards the prototypes."),
    Param(
        "umap_neighbors",
        15,
        positive_int(2),
        "neighbours of parametric UMAP's graph.",
        setting="n_neighbors",
        legacy="n_neighbors",
    ),
    Param(
        "umap_min_dist",
        0.1,
        [Interval(Real, 0.0, None, closed="neither")],
        "parametric UMAP's curve (its ``min_dist``).",
        setting="min_dist",
        legacy="min_dist",
    ),
)
