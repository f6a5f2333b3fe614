"""Constructor parameters declared once and composed into every estimator.

A :class:`Param` is one constructor argument: its name, default, scikit-learn constraints,
one line of documentation and where its value goes (:attr:`Param.role`). Parameters that
several estimators share live in groups (:data:`RUNTIME`, :data:`PRIVACY`, :data:`ROBUST`,
:data:`SAMPLING`, :data:`EM`, :data:`INIT`, :data:`PRIOR`, ...), each defined here once.
An estimator lists its parameters in a class attribute::

    class MyDetector(MixtureDetector):
        _params = declare(
            Param("n_components", 8, [Interval(Integral, 1, None, closed="left")], "..."),
            EM, ROBUST, PRIVACY, DETECTOR, RUNTIME,
            defaults={"max_iter": 50},
        )

and :func:`compose` (run by ``__init_subclass__`` of the estimator bases) writes, from that one
list:

- ``__init__``: stores each argument under its own name and nothing else (scikit-learn's
  rule), with the real signature (``inspect.signature``, ``get_params``, ``clone`` and
  ``help`` see every argument and its default); the first ``positional`` arguments may be
  passed by position, the rest are keyword-only;
- ``_parameter_constraints``, read by ``_validate_params``;
- the ``Args:`` section of the class docstring (placed before ``Attributes:``);

and :meth:`ParamSet.settings` gives the algorithm's settings (``role="algorithm"``,
renamed by :attr:`Param.setting` where the algorithm spells it differently) so that an
estimator builds its algorithm as ``Algorithm(**self._settings(n_features))``.

One name has one meaning across estimators: a group's parameter keeps its documentation and
constraints everywhere it is used; an estimator changes only its default.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from numbers import Integral, Real
from typing import Any

import torch
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.federated.core.learners import LEARNERS

#: where a parameter's value goes: the algorithm's settings, the engine (client sampling,
#: dropout), or the estimator itself (scores, torch placement, progress, seeds).
ROLES = ("algorithm", "engine", "estimator")


@dataclass(frozen=True)
class Param:
    """One constructor argument.

    Attributes:
        name: the argument's name (and the attribute ``__init__`` stores it under).
        default: its default value (immutable: a number, string, tuple or None).
        constraints: scikit-learn ``_parameter_constraints`` entries for it.
        doc: its documentation, one or a few sentences (the docstring's ``Args:`` entry).
        role: where the value goes (:data:`ROLES`).
        setting: the algorithm's name for it, where different (``role="algorithm"``).
        convert: ``convert(value, n_features)`` -> the algorithm's value (e.g. ``"auto"``
            resolved once the width is known); ``None`` passes the value as is.
    """

    name: str
    default: Any
    constraints: list
    doc: str
    role: str = "algorithm"
    setting: str | None = None
    convert: Callable[[Any, int], Any] | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(
                f"Param {self.name!r}: role must be one of {ROLES}, got {self.role!r}."
            )


Group = tuple[Param, ...]


def _positive_int(low: int = 1) -> list:
    return [Interval(Integral, low, None, closed="left")]


def _non_negative() -> list:
    return [Interval(Real, 0.0, None, closed="left")]


def _auto_prior(value: Any, n_features: int) -> float | None:
    """``prior_strength="auto"`` -> ``n_features + 2`` pseudo-rows; a number or None as is."""
    return n_features + 2.0 if value == "auto" else value


#: Default target of the covariance prior, as a multiple of each feature's pooled variance.
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

#: The clients' privacy floor (``docs/privacy.md``): every estimator.
PRIVACY: Group = (
    Param(
        "privacy_min_rows",
        5,
        _positive_int(),
        "each client's privacy floor (``docs/privacy.md``): every statistic a client sends "
        "is backed by at least this many of its rows, or it is not sent; ``1`` is no floor.",
        "estimator",
    ),
)

#: Differential privacy of the clients' releases (``docs/differential_privacy.md``).
DIFFERENTIAL_PRIVACY: Group = (
    Param(
        "dp_epsilon",
        None,
        [Interval(Real, 0.0, 100.0, closed="right"), None],
        "the fit's differential-privacy budget epsilon per client row (``None``: off). The "
        "noise is calibrated so that every round the fit can run together spends at most "
        "this at ``dp_delta`` (Google's dp-accounting, ``pip install 'fednovelty[dp]'``); "
        "each round spends budget, so fewer rounds (``max_iter``, ``kmeans_rounds``) mean "
        "less noise. ``privacy_spent_`` reports what the fit spent.",
        "estimator",
    ),
    Param(
        "dp_delta",
        1e-5,
        [Interval(Real, 0.0, 1.0, closed="neither")],
        "the differential-privacy delta (below one over the rows of a client).",
        "estimator",
    ),
    Param(
        "dp_bounds",
        None,
        ["array-like", None],
        "public per-feature bounds ``(low, high)`` (two rows of ``n_features`` values, from "
        "domain knowledge, not from the rows): the rows are mapped to ``[-1, 1]`` per feature "
        "before anything is taken from them; ``None`` with ``dp_epsilon``: estimated "
        "privately first (per-feature DP quantiles, 10% of the budget).",
        "estimator",
    ),
    Param(
        "dp_clip",
        "auto",
        [StrOptions({"auto"}), Interval(Real, 0.0, None, closed="neither")],
        "the L2 radius every row is clipped to, in the units the rounds work in (z-scores "
        "with federated EM's ``standardize``, else the bounds' ``[-1, 1]``); ``\"auto\"`` is "
        "``1.5 * sqrt(n_features)`` in z-scores and ``sqrt(n_features)`` in the box (no row "
        "inside the bounds is clipped).",
        "estimator",
    ),
    Param(
        "dp_mode",
        "central",
        [StrOptions({"central", "local", "distributed"})],
        'who adds the noise: ``"central"`` (a trusted server, to the sum), ``"local"`` '
        '(each client, all of it: the server may be curious) or ``"distributed"`` (each '
        "client 1/m of the variance, for secure sums).",
        "estimator",
    ),
)

#: The learners' DP-SGD under ``dp_epsilon`` (models whose learners leave the clients).
DP_LEARNERS: Group = (
    Param(
        "dp_sample_rate",
        0.05,
        [Interval(Real, 0.0, 1.0, closed="right")],
        "with ``dp_epsilon``, each row's chance to be in one DP-SGD step's Poisson sample "
        "(a round runs ``ceil(local_epochs / dp_sample_rate)`` steps); smaller rates "
        "amplify privacy more and take more steps.",
        "estimator",
    ),
    Param(
        "dp_sgd_clip",
        1.0,
        [Interval(Real, 0.0, None, closed="neither")],
        "with ``dp_epsilon``, the L2 bound of one row's gradient over all the learners.",
        "estimator",
    ),
    Param(
        "dp_learner_share",
        0.5,
        [Interval(Real, 0.0, 1.0, closed="neither")],
        "with ``dp_epsilon``, the learners' share of the budget (of ``mu**2`` in Gaussian "
        "differential privacy); the statistics get the rest.",
        "estimator",
    ),
)

#: Robust aggregation against hostile clients (``docs/robust.md``).
ROBUST: Group = (
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

#: Client sampling and simulated failures of the in-process engine.
SAMPLING: Group = (
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

#: Federated k-means rounds of an initialisation.
KMEANS: Group = (
    Param(
        "kmeans_rounds", 10, _positive_int(), "most federated Lloyd rounds of the k-means start."
    ),
)

#: How a federated mixture starts (``kmeans_rounds`` included).
INIT: Group = (
    Param(
        "init_params",
        "kmeans",
        [StrOptions({"kmeans", "separated", "subset", "oneshot"})],
        '``"kmeans"`` (federated k-means), ``"separated"`` (centres spread over the merged '
        'feature range), ``"subset"`` (pools a few raw rows on the server: not private) or '
        '``"oneshot"`` (one round of local fits reduced on the server, FedGenGMM\'s round).',
    ),
    *KMEANS,
    Param("subset_size", 100, _positive_int(), 'rows pooled by ``init_params="subset"``.'),
)

#: Given starting parameters (as scikit-learn's ``GaussianMixture``).
START: Group = (
    Param("weights_init", None, ["array-like", None], "starting weights (n_components,)."),
    Param("means_init", None, ["array-like", None], "starting means (n_components, n_features)."),
    Param(
        "precisions_init",
        None,
        ["array-like", None],
        "starting precisions, shaped as scikit-learn's for ``covariance_type``.",
    ),
)

#: The remedies for real tabular data (``docs/robust.md``): standardisation and the prior.
PRIOR: Group = (
    Param(
        "standardize",
        True,
        ["boolean"],
        "fit on federated z-scores of the features (one extra round; the model and its "
        "scores stay in the original units); ``False`` fits the raw features.",
    ),
    Param(
        "prior_strength",
        "auto",
        [StrOptions({"auto"}), Interval(Real, 0.0, None, closed="neither"), None],
        "pseudo-rows of a conjugate prior that pulls every covariance towards "
        '``prior_scale`` times the pooled variance of each feature (MAP EM); ``"auto"`` is '
        "``n_features + 2``, ``None`` turns it off (plain maximum likelihood).",
        convert=_auto_prior,
    ),
    Param(
        "prior_scale",
        PRIOR_SCALE,
        [Interval(Real, 0.0, None, closed="neither")],
        "the prior's target variance as a multiple of each feature's variance (a component "
        "backed by few rows is flattened, not made a spike).",
    ),
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
    "rows per local step; with ``dp_epsilon``, DP-SGD's public expected lot: a step's noisy "
    "gradient sum is divided by it, never by the rows a client holds (set it near "
    "``dp_sample_rate`` times a client's typical row count).",
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

#: The variational mixtures' weight and Gaussian-Wishart priors (scikit-learn's names).
VB_PRIORS: Group = (
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
    Param(
        "mean_precision_prior",
        None,
        [Interval(Real, 0.0, None, closed="neither"), None],
        "the means' prior precision ``beta_0`` (``None``: 1).",
    ),
    Param(
        "degrees_of_freedom_prior",
        None,
        [Interval(Real, 0.0, None, closed="neither"), None],
        "the Wishart's degrees of freedom ``nu_0`` (``None``: ``n_features``).",
    ),
)


# ------------------------------------------------------------------ the declaration
@dataclass(frozen=True)
class ParamSet:
    """An estimator's parameters in signature order (:func:`declare`)."""

    params: tuple[Param, ...]
    positional: int = 0

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise TypeError(f"parameters declared twice: {twice}; declare each name once.")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def __getitem__(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def constraints(self) -> dict[str, list]:
        """``_parameter_constraints``: name -> constraints."""
        return {p.name: list(p.constraints) for p in self.params}

    def settings(
        self,
        estimator: Any,
        n_features: int,
        role: str = "algorithm",
        config: type | None = None,
    ) -> dict:
        """The values of ``estimator``'s ``role`` parameters as the algorithm (or engine)
        takes them: renamed by :attr:`Param.setting`, converted by :attr:`Param.convert`;
        with ``config`` (a settings dataclass), only the settings it has (an estimator that
        runs two algorithms, e.g. a stream's first fit and its windows)."""
        accepted = None if config is None else {f.name for f in fields(config)}
        out = {}
        for p in self.params:
            if p.role != role or (accepted is not None and (p.setting or p.name) not in accepted):
                continue
            value = getattr(estimator, p.name)
            out[p.setting or p.name] = value if p.convert is None else p.convert(value, n_features)
        return out

    def doc(self) -> str:
        """The ``Args:`` section (Google style), one entry per parameter."""
        lines = ["Args:"]
        for p in self.params:
            entry = f"{p.name}: {p.doc} Default ``{p.default!r}``."
            lines.append(textwrap.fill(entry, 92, initial_indent="    ", subsequent_indent=" " * 8))
        return "\n".join(lines)


def declare(
    *items: Param | Iterable[Param],
    defaults: dict[str, Any] | None = None,
    docs: dict[str, str] | None = None,
    settings: dict[str, str] | None = None,
    positional: int = 0,
) -> ParamSet:
    """An estimator's parameters: ``items`` (params and groups, in signature order) with
    ``defaults`` changed by name, ``docs`` extending a shared parameter's documentation
    with what it means for this estimator and ``settings`` naming a shared parameter as
    this estimator's algorithm spells it (:attr:`Param.setting`). The first ``positional``
    may be given by position.

    Raises:
        TypeError: a name in ``defaults``, ``docs`` or ``settings`` that is not declared,
            or a name declared twice.
    """
    params: list[Param] = []
    for item in items:
        params.extend([item] if isinstance(item, Param) else item)
    names = {p.name for p in params}
    defaults, docs, settings = defaults or {}, docs or {}, settings or {}
    for what, given in (("defaults", defaults), ("docs", docs), ("settings", settings)):
        unknown = sorted(set(given) - names)
        if unknown:
            raise TypeError(f"{what} names parameters that are not declared: {unknown}.")
    params = [
        replace(
            p,
            default=defaults.get(p.name, p.default),
            doc=f"{p.doc} {docs[p.name]}" if p.name in docs else p.doc,
            setting=settings.get(p.name, p.setting),
        )
        for p in params
    ]
    return ParamSet(tuple(params), positional)


def compose(cls: type) -> None:
    """Write ``cls.__init__``, ``cls._parameter_constraints`` and the ``Args:`` section of
    ``cls.__doc__`` from ``cls._params`` (a :class:`ParamSet` declared on ``cls`` itself)."""
    spec: ParamSet = cls.__dict__["_params"]
    cls.__init__ = _init_function(cls, spec)
    cls._parameter_constraints = spec.constraints()
    cls.__doc__ = _with_args(cls.__doc__ or "", spec.doc())


def _init_function(cls: type, spec: ParamSet) -> Callable:
    """``__init__(self, <positional>, *, <keyword-only>)`` storing every argument, built as
    dataclasses build theirs (source compiled once per class)."""
    defaults = {f"_d_{p.name}": p.default for p in spec.params}
    head = [f"{p.name}=_d_{p.name}" for p in spec.params[: spec.positional]]
    tail = [f"{p.name}=_d_{p.name}" for p in spec.params[spec.positional :]]
    arguments = ", ".join(["self", *head, *(["*", *tail] if tail else [])])
    body = "\n".join(f"    self.{p.name} = {p.name}" for p in spec.params) or "    pass"
    namespace: dict = {}
    exec(f"def __init__({arguments}):\n{body}\n", dict(defaults), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = f"Store the arguments (see :class:`{cls.__name__}`); nothing is checked here."
    return init


_SECTIONS = ("Attributes:", "Examples:", "Example:", "Notes:", "References:")


def _with_args(doc: str, args: str) -> str:
    """``doc`` (dedented) with ``args`` placed before its first ``Attributes:``/``Examples:``
    section, or at its end."""
    text = inspect.cleandoc(doc)
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.strip() in _SECTIONS and not line.startswith(" "):
            return "\n".join([*lines[:index], args, "", *lines[index:]])
    return f"{text}\n\n{args}" if text else args
