"""The algorithms' settings: frozen dataclasses, validated once, written to and read from JSON.

Every federated algorithm holds one of these as ``algorithm.config``; both halves read their
settings from it (a client never learns a setting from a message), and Flower's ClientApp
rebuilds the same dataclass from the run config (``from_json(to_json())`` round-trips). Each
``__post_init__`` normalises what it is given (ints, floats, tuples, tensors in the
configured dtype and device) and raises a ``ValueError`` that names the bad argument.

JSON form (:meth:`Settings.to_json`): torch dtypes as ``"float64"``, devices as ``"cpu"``,
tuples and tensors as (nested) lists, the joint model's learner factory by name
(``"linear"``, ``"mlp"``; a custom factory is code, which JSON cannot carry).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from fednovelty.federated.robust import AGGREGATIONS, check_robust_arguments
from fednovelty.mixture.covariance import check_covariance_type
from fednovelty.mixture.variational import WEIGHT_PRIOR_TYPES, InvalidPriorError

INIT_PARAMS: tuple[str, ...] = ("kmeans", "separated", "subset")
MIXTURE_WEIGHTS: tuple[str, ...] = ("global", "personal")
#: JSON names of the floating dtypes the settings accept.
DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")

LearnerFactory = Callable[[int, int], nn.Module]


def linear_learner(n_features: int, n_classes: int) -> nn.Module:
    """Multinomial logistic regression (the default learner)."""
    return nn.Linear(n_features, n_classes)


def mlp_learner(n_features: int, n_classes: int, hidden: int = 64) -> nn.Module:
    """A small two-layer perceptron."""
    return nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


#: learner factories by their JSON name.
def cnn_learner(n_features: int, n_classes: int) -> nn.Module:
    """The FedGMM paper's FEMNIST encoder for square one-channel images flattened to
    ``n_features = side * side`` (side >= 6): two 3x3 convolutions (32 and 64 channels,
    ReLU), 2x2 max pooling, a 128-unit dense layer (ReLU) and the class layer. The paper's
    dropout is left out: the learners' local training draws no randomness but its batches'.

    Raises:
        ValueError: ``n_features`` is not the square of a side of at least 6.
    """
    side = math.isqrt(max(int(n_features), 0))
    if side * side != n_features or side < 6:
        raise ValueError(
            f"learner='cnn' needs square images flattened to side * side features with side "
            f">= 6 (784 for 28 x 28); got n_features={n_features}. Use 'linear' or 'mlp' for "
            "other rows."
        )
    pooled = (side - 4) // 2
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * pooled * pooled, 128),
        nn.ReLU(),
        nn.Linear(128, n_classes),
    )


LEARNERS: dict[str, LearnerFactory] = {
    "linear": linear_learner,
    "mlp": mlp_learner,
    "cnn": cnn_learner,
}


def as_dtype(value: Any) -> torch.dtype:
    """A floating torch dtype from a dtype or its JSON name, or a ``ValueError`` naming
    ``'dtype'``."""
    if isinstance(value, str) and value.removeprefix("torch.") in DTYPES:
        return DTYPES[value.removeprefix("torch.")]
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return value
    raise ValueError(
        f"'dtype' must be a floating torch dtype or one of {sorted(DTYPES)}, got {value!r}."
    )


def as_learner(value: Any) -> LearnerFactory:
    """A learner factory from a callable or its JSON name, or a ``ValueError`` naming
    ``'learner'``."""
    if isinstance(value, str):
        if value not in LEARNERS:
            raise ValueError(
                f"'learner' must be one of {sorted(LEARNERS)} (a custom factory is code, which "
                f"a JSON setting cannot carry); got {value!r}."
            )
        return LEARNERS[value]
    if not callable(value):
        raise ValueError(
            f"'learner' must be a factory (n_features, n_classes) -> nn.Module or one of "
            f"{sorted(LEARNERS)}; got {value!r}."
        )
    return value


def check_prior_arguments(
    prior_strength: float | None, prior_scale: float
) -> tuple[float | None, float]:
    """``(prior_strength, prior_scale)`` as floats, or a ``ValueError`` naming the bad one:
    the strength is ``None`` (no prior) or > 0 pseudo-rows, the scale > 0."""
    if prior_strength is not None and not float(prior_strength) > 0:
        raise ValueError(f"prior_strength must be > 0 or None, got {prior_strength}.")
    if not float(prior_scale) > 0:
        raise ValueError(f"prior_scale must be > 0, got {prior_scale}.")
    return (None if prior_strength is None else float(prior_strength)), float(prior_scale)


def _at_least(name: str, value: Any, low: float, optional: bool = False) -> Any:
    """``value`` unchanged if it is ``>= low`` (or ``None`` when ``optional``), else a
    ``ValueError`` naming ``name``."""
    if value is None and optional:
        return None
    if value is None or isinstance(value, bool) or not float(value) >= low:
        bound = f">= {low:g}" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {bound}, got {value!r}.")
    return value


def _json_value(value: Any) -> Any:
    """A setting as a JSON value (dtype and device as strings, tuples and tensors as lists,
    a learner factory by name)."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if callable(value):
        names = [name for name, factory in LEARNERS.items() if factory is value]
        if not names:
            raise ValueError(
                f"a custom learner factory cannot be written as JSON; use one of "
                f"{sorted(LEARNERS)} where the settings must travel (Flower)."
            )
        return names[0]
    return value


class Settings:
    """Base of the settings dataclasses: JSON in and out, equality by value.

    ``JSON_NAMES`` maps a field to its JSON key where they differ (e.g. the joint model's
    ``learner_factory`` is ``"learner"``).
    """

    JSON_NAMES: ClassVar[dict[str, str]] = {}

    def to_json(self) -> dict[str, Any]:
        """Every setting as a JSON value, keyed by its JSON name."""
        return {
            self.JSON_NAMES.get(f.name, f.name): _json_value(getattr(self, f.name))
            for f in fields(self)
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]):
        """The settings ``to_json`` wrote (missing keys keep their defaults).

        Raises:
            ValueError: an unknown key (naming it and the known ones), or a bad value.
        """
        by_json = {cls.JSON_NAMES.get(f.name, f.name): f.name for f in fields(cls)}
        unknown = sorted(set(data) - set(by_json))
        if unknown:
            raise ValueError(
                f"unknown setting(s) {unknown} for {cls.__name__}; known: {sorted(by_json)}."
            )
        values = {by_json[key]: value for key, value in data.items()}
        for name, read in (("dtype", as_dtype), ("learner_factory", as_learner)):
            if name in values:  # named before any missing setting
                values[name] = read(values[name])
        return cls(**values)

    def _values(self) -> dict[str, Any]:
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            values[f.name] = value if callable(value) else _json_value(value)
        return values

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(repr(sorted(self._values().items(), key=lambda item: item[0])))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


@dataclass(frozen=True, eq=False, kw_only=True)
class RobustSettings(Settings):
    """The robust options of an algorithm that sums or averages its clients' replies
    (:mod:`fednovelty.federated.robust`, ``docs/robust.md``); off by default.

    Attributes:
        aggregation: how the server combines the clients' contributions: ``"sum"`` (the
            exact sum or weighted mean), ``"trimmed"`` or ``"median"`` (robust), as far as
            the algorithm has them (``AGGREGATION_CHOICES``; others are refused by name).
        trim: share of clients a ``"trimmed"`` aggregation leaves out (at each end).
        client_weight_cap: no client counts for more than this many times the median
            client's row count (``None``: no cap).
    """

    #: the aggregations the algorithm has.
    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = AGGREGATIONS

    aggregation: str = "sum"
    trim: float = 0.1
    client_weight_cap: float | None = None

    def __post_init__(self) -> None:
        robust = check_robust_arguments(
            self.aggregation,
            self.trim,
            self.client_weight_cap,
            self.AGGREGATION_CHOICES,
            owner=type(self).__name__,
        )
        for name, value in zip(("aggregation", "trim", "client_weight_cap"), robust, strict=True):
            self._set(name, value)


@dataclass(frozen=True, eq=False, kw_only=True)
class MixtureSettings(RobustSettings):
    """The settings every Gaussian-mixture algorithm has.

    Attributes:
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.
        reg_covar: added to covariance diagonals (>= 0).
        tol: EM's convergence threshold on the change of mean log-likelihood (>= 0).
        max_iter: most EM iterations (>= 1).
        standardize: fit on z-scores (the result is in the original units).
        prior_strength: pseudo-rows of the covariance prior (``None``: plain ML M-steps).
        prior_scale: the prior's target variance, as a multiple of each feature's variance.
        aggregation, trim, client_weight_cap: the robust options (:class:`RobustSettings`).
        random_state: integer seed.
        dtype, device: where the server computes; client rows arrive in this dtype.
    """

    #: whether the k-means initialisation may seed fewer than ``n_components`` centres (an
    #: upper bound on K, as variational Bayes has); EM needs all of them.
    FEWER_CENTROIDS_OK: ClassVar[bool] = False

    covariance_type: str = "full"
    reg_covar: float = 1e-6
    tol: float = 1e-3
    max_iter: int = 100
    standardize: bool = False
    prior_strength: float | None = None
    prior_scale: float = 1.0
    random_state: int = 0
    dtype: torch.dtype = torch.float64
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        super().__post_init__()
        check_covariance_type(self.covariance_type)
        prior = check_prior_arguments(self.prior_strength, self.prior_scale)
        self._set("prior_strength", prior[0])
        self._set("prior_scale", prior[1])
        self._set("reg_covar", float(_at_least("reg_covar", self.reg_covar, 0)))
        self._set("tol", float(_at_least("tol", self.tol, 0)))
        self._set("max_iter", int(_at_least("max_iter", self.max_iter, 1)))
        self._set("standardize", bool(self.standardize))
        self._set("random_state", int(self.random_state))
        self._set("dtype", as_dtype(self.dtype))
        self._set("device", torch.device(self.device))


@dataclass(frozen=True, eq=False, kw_only=True)
class EMConfig(MixtureSettings):
    """Settings of federated EM (``FederatedEM``; FedGMM Algorithm 2 and DEM):
    :class:`MixtureSettings` (``aggregation`` ``"sum"`` or ``"trimmed"``) and

    Attributes:
        n_components: number of Gaussian components K (>= 1).
        mixture_weights: ``"global"`` (one pi for all clients; DEM) or ``"personal"``
            (one pi_c per client; FedGMM).
        init_params: ``"kmeans"``, ``"separated"`` or ``"subset"``.
        kmeans_rounds: maximum federated Lloyd rounds (``kmeans`` init, >= 1).
        kmeans_tol: Lloyd stops when the largest squared centre move is below
            ``kmeans_tol`` times the mean feature variance.
        subset_size: rows sent in total for ``init_params="subset"`` (>= 1).
        weights_init, means_init, precisions_init: scikit-learn's initial parameters
            (numpy, lists or torch; precisions, not covariances), kept as tensors in
            ``dtype`` on ``device``.
        pca_components: fit the Gaussians on a federated PCA of the rows with this many
            axes (two extra rounds first; ``None``: on the rows themselves).
        chunk_size: rows per E-step chunk (memory bound); default from K and d.

    ``standardize`` adds one ``moments`` round; ``max_iter`` counts EM rounds.
    """

    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = ("sum", "trimmed")

    n_components: int
    mixture_weights: str = "global"
    init_params: str = "kmeans"
    kmeans_rounds: int = 10
    kmeans_tol: float = 1e-4
    subset_size: int = 100
    weights_init: Tensor | None = None
    means_init: Tensor | None = None
    precisions_init: Tensor | None = None
    pca_components: int | None = None
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mixture_weights not in MIXTURE_WEIGHTS:
            raise ValueError(
                f"mixture_weights must be one of {MIXTURE_WEIGHTS}, got {self.mixture_weights!r}."
            )
        if self.init_params not in INIT_PARAMS:
            raise ValueError(f"init_params must be one of {INIT_PARAMS}, got {self.init_params!r}.")
        for name, low in (("n_components", 1), ("kmeans_rounds", 1), ("subset_size", 1)):
            self._set(name, int(_at_least(name, getattr(self, name), low)))
        self._set("kmeans_tol", float(_at_least("kmeans_tol", self.kmeans_tol, 0)))
        for name in ("pca_components", "chunk_size"):
            value = _at_least(name, getattr(self, name), 1, optional=True)
            self._set(name, None if value is None else int(value))
        for name in ("weights_init", "means_init", "precisions_init"):
            value = getattr(self, name)
            if isinstance(value, Tensor):
                value = value.detach().to(dtype=self.dtype, device=self.device, copy=True)
            elif value is not None:
                value = torch.tensor(np.asarray(value), dtype=self.dtype, device=self.device)
            self._set(name, value)

    @property
    def needs_moments(self) -> bool:
        """Whether a ``moments`` round runs first (standardisation or the prior)."""
        return self.standardize or self.prior_strength is not None

    @property
    def given_params(self) -> bool:
        """Whether the initial weights, means and precisions are all given (no init rounds)."""
        given = (self.weights_init, self.means_init, self.precisions_init)
        return all(value is not None for value in given)


def _as_tensor(value: Any, dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """A setting's array as a tensor in ``dtype`` on ``device`` (a copy); ``None`` stays."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        return value.detach().to(dtype=dtype, device=device, copy=True)
    return torch.tensor(np.asarray(value), dtype=dtype, device=device)


@dataclass(frozen=True, eq=False, kw_only=True)
class StreamConfig(MixtureSettings):
    """Settings of one window of streaming federated EM (``StreamingEM``): the model going
    into the window, the statistics it carries, and how the window updates them.

    Attributes:
        n_components: K (>= 1).
        weights_init, means_init, precisions_init: the mixture going into the window (the
            previous window's result; scikit-learn's precision factors), required.
        carry_counts, carry_sums, carry_second, carry_shift, carry_n_samples: the carried
            summed statistics ``S_{t-1}`` (``None``: the first window carries nothing).
        rho: forgetting factor in [0, 1]: ``S_t = rho S_{t-1} + S_window``.
        rounds: M-steps in the window (>= 0); 0 only tracks the clients' weights.
        far_quantile: a row is *far* when its squared Mahalanobis distance to every
            component exceeds this quantile of the chi-square law with d degrees of freedom
            (``None``: no births).
        birth_share: when the far rows are at least this share of the window's rows, the
            component with the least carried mass is re-born on their statistics.
        adapt_iter, adapt_tol: each client's EM over its weights at the window's start.
        chunk_size: rows per E-step chunk.

    The M-steps are plain (no standardisation, no covariance prior); ``max_iter`` and
    ``tol`` are not used.
    """

    #: the window's and the far rows' statistics: summed, or trimmed as federated EM's.
    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = ("sum", "trimmed")

    n_components: int
    weights_init: Tensor | None = None
    means_init: Tensor | None = None
    precisions_init: Tensor | None = None
    carry_counts: Tensor | None = None
    carry_sums: Tensor | None = None
    carry_second: Tensor | None = None
    carry_shift: Tensor | None = None
    carry_n_samples: float = 0.0
    rho: float = 0.9
    rounds: int = 1
    far_quantile: float | None = 0.999
    birth_share: float = 0.05
    adapt_iter: int = 100
    adapt_tol: float = 1e-6
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.standardize or self.prior_strength is not None:
            raise ValueError(
                "a streaming window fits plain M-steps: standardize=False and "
                "prior_strength=None (their scales would change from window to window)."
            )
        self._set("n_components", int(_at_least("n_components", self.n_components, 1)))
        self._set("rounds", int(_at_least("rounds", self.rounds, 0)))
        self._set("adapt_iter", int(_at_least("adapt_iter", self.adapt_iter, 1)))
        self._set("adapt_tol", float(_at_least("adapt_tol", self.adapt_tol, 0)))
        rho = float(_at_least("rho", self.rho, 0))
        if rho > 1:
            raise ValueError(f"rho (the forgetting factor) must be in [0, 1]; got {self.rho!r}.")
        self._set("rho", rho)
        share = float(_at_least("birth_share", self.birth_share, 0))
        if share > 1:
            raise ValueError(f"birth_share must be in [0, 1]; got {self.birth_share!r}.")
        self._set("birth_share", share)
        if self.far_quantile is not None and not 0.0 < float(self.far_quantile) < 1.0:
            raise ValueError(f"far_quantile must be in (0, 1) or None; got {self.far_quantile!r}.")
        if self.covariance_type == "tied" and self.far_quantile is not None:
            raise ValueError(
                "births re-bear one component's covariance, which covariance_type='tied' "
                "shares among all: use far_quantile=None with 'tied'."
            )
        value = _at_least("chunk_size", self.chunk_size, 1, optional=True)
        self._set("chunk_size", None if value is None else int(value))
        self._set("carry_n_samples", float(_at_least("carry_n_samples", self.carry_n_samples, 0)))
        for name in (
            "weights_init",
            "means_init",
            "precisions_init",
            "carry_counts",
            "carry_sums",
            "carry_second",
            "carry_shift",
        ):
            self._set(name, _as_tensor(getattr(self, name), self.dtype, self.device))
        if any(getattr(self, n) is None for n in ("weights_init", "means_init", "precisions_init")):
            raise ValueError(
                "a streaming window starts from a mixture: give weights_init, means_init and "
                "precisions_init (the previous window's result)."
            )
        carried = [getattr(self, n) is None for n in ("carry_counts", "carry_sums", "carry_second")]
        if any(carried) and not all(carried):
            raise ValueError("give all of carry_counts, carry_sums, carry_second or none.")
        if not all(carried) and self.carry_shift is None:
            raise ValueError(
                "carried statistics need the shift they were taken about (carry_shift)."
            )


@dataclass(frozen=True, eq=False, kw_only=True)
class JointConfig(EMConfig):
    """Settings of FedGMM's joint model (``JointFedGMM``): ``EMConfig`` plus the learners.

    Attributes:
        n_learners: M2 conditional models (>= 1).
        n_classes: number of label classes, labels 0..n_classes-1 (>= 2).
        learner_factory: ``(n_features, n_classes) -> nn.Module`` (JSON: ``"learner"``,
            ``"linear"`` or ``"mlp"``); default multinomial logistic regression.
        local_epochs, learning_rate, batch_size: the learners' local training.
        optimizer: ``"sgd"`` (plain mini-batch SGD) or ``"adam"`` (a fresh Adam state every
            round: optimiser state never crosses the wire).
        mu_prox: FedProx proximal coefficient (0 = none).
        aggregate_learners: ``False`` keeps every learner on its client (the Local baseline).
        n_learner_features: width of the learners' input ``Z`` when clients hold
            ``(X, y, Z)`` triples; default the width of the raw rows ``X``.
        learners_init: the learners' starting weights (one dict of parameter tensors per
            learner, e.g. an earlier run's ``state.learners``); default ``learner_factory``'s
            initialisation under ``random_state``.
        Other attributes as ``EMConfig``; ``mixture_weights`` defaults to ``"personal"``.
    """

    JSON_NAMES: ClassVar[dict[str, str]] = {"learner_factory": "learner"}

    n_learners: int
    n_classes: int
    mixture_weights: str = "personal"
    learner_factory: LearnerFactory = linear_learner
    local_epochs: int = 1
    learning_rate: float = 0.1
    batch_size: int = 128
    optimizer: str = "sgd"
    mu_prox: float = 0.0
    aggregate_learners: bool = True
    n_learner_features: int | None = None
    learners_init: tuple[dict[str, Tensor], ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.learners_init is not None:
            learners = list(self.learners_init)
            if len(learners) != int(self.n_learners) or not all(
                isinstance(p, Mapping) for p in learners
            ):
                raise ValueError(
                    f"learners_init must hold one dict of parameter tensors per learner "
                    f"({self.n_learners}); got {type(self.learners_init).__name__} of "
                    f"{len(learners)}."
                )
            self._set(
                "learners_init",
                tuple(
                    {k: _as_tensor(v, self.dtype, self.device) for k, v in p.items()}
                    for p in learners
                ),
            )
        if int(self.n_learners) < 1 or int(self.n_classes) < 2:
            raise ValueError(
                f"need n_learners >= 1 and n_classes >= 2; got n_learners={self.n_learners}, "
                f"n_classes={self.n_classes}."
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {sorted(OPTIMIZERS)}; got {self.optimizer!r}."
            )
        self._set("n_learners", int(self.n_learners))
        self._set("n_classes", int(self.n_classes))
        self._set("learner_factory", as_learner(self.learner_factory))
        self._set("local_epochs", int(_at_least("local_epochs", self.local_epochs, 0)))
        self._set("learning_rate", float(_at_least("learning_rate", self.learning_rate, 0)))
        self._set("batch_size", int(_at_least("batch_size", self.batch_size, 1)))
        self._set("mu_prox", float(_at_least("mu_prox", self.mu_prox, 0)))
        self._set("aggregate_learners", bool(self.aggregate_learners))
        value = _at_least("n_learner_features", self.n_learner_features, 1, optional=True)
        self._set("n_learner_features", None if value is None else int(value))


@dataclass(frozen=True, eq=False, kw_only=True)
class FedGenConfig(MixtureSettings):
    """Settings of one-shot FedGenGMM and its local-only baseline ``LocalGMMs``:
    :class:`MixtureSettings` (every local and global fit uses ``reg_covar``, ``tol``,
    ``max_iter``, ``standardize`` and the prior; ``aggregation`` ``"sum"``, the union of
    every client model, or ``"trimmed"`` / ``"median"``, leaving out the most outlying
    client models) and

    Attributes:
        n_components: global K; ``None`` picks it by BIC in ``k_range``.
        client_components: every client's K; ``None`` lets each pick by BIC in ``k_range``.
        k_range: inclusive ``(k_min, k_max)`` for BIC searches, ``1 <= k_min <= k_max``.
        samples_per_component: ``H``; the server draws ``H * sum_c K_c`` rows.
        min_client_samples: clients with fewer rows (or fewer than the smallest candidate K)
            are skipped (at least 1).
        copula: the server also fits a Gaussian copula with mixture marginals on its
            synthetic rows; no extra communication.
    """

    n_components: int | None = None
    client_components: int | None = None
    k_range: tuple[int, int] = (1, 10)
    samples_per_component: int = 100
    min_client_samples: int = 2
    copula: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        k_min, k_max = (int(k) for k in self.k_range)
        if not 1 <= k_min <= k_max:
            raise ValueError(
                f"k_range must satisfy 1 <= k_min <= k_max, got {tuple(self.k_range)}."
            )
        self._set("k_range", (k_min, k_max))
        for name in ("n_components", "client_components"):
            value = _at_least(name, getattr(self, name), 1, optional=True)
            self._set(name, None if value is None else int(value))
        self._set("samples_per_component", int(self.samples_per_component))
        self._set("min_client_samples", max(1, int(self.min_client_samples)))
        self._set("copula", bool(self.copula))

    def candidates(self) -> list[int]:
        """Numbers of components a client may fit."""
        if self.client_components is not None:
            return [self.client_components]
        return list(range(self.k_range[0], self.k_range[1] + 1))

    def global_candidates(self) -> list[int]:
        """Numbers of components the server's global fit may have."""
        if self.n_components is not None:
            return [self.n_components]
        return list(range(self.k_range[0], self.k_range[1] + 1))

    def rows_needed(self) -> int:
        """Fewest rows a client needs to take part (else it is skipped)."""
        return max(self.min_client_samples, min(self.candidates()))

    def client_candidates(self, n_samples: int, min_rows: int = 1) -> list[int]:
        """The K a client of ``n_samples`` rows fits among; empty when it must be skipped.

        ``min_rows`` is the client's privacy floor: the client needs ``max(rows_needed(),
        min_rows)`` rows and fits at most ``n_samples // min_rows`` components.
        """
        if n_samples < max(self.rows_needed(), int(min_rows), 1):
            return []
        most = n_samples // max(1, int(min_rows))
        return [k for k in self.candidates() if k <= most]

    def fit_settings(self, generator: torch.Generator) -> dict[str, Any]:
        """Keyword arguments of :func:`~fednovelty.mixture.fit_gmm_scaled` for one fit (all
        but the rows and the candidate K)."""
        return {
            "covariance_type": self.covariance_type,
            "reg_covar": self.reg_covar,
            "tol": self.tol,
            "max_iter": self.max_iter,
            "generator": generator,
            "standardize": self.standardize,
            "prior_strength": self.prior_strength,
            "prior_scale": self.prior_scale,
        }


@dataclass(frozen=True, eq=False, kw_only=True)
class PCAConfig(Settings):
    """Settings of federated PCA (``FederatedPCA``, and the PCA step of the mixtures).

    Attributes:
        n_components: number of principal axes to keep (>= 1; at most n_features, checked
            when the rows' width is known).
        device: where the server aggregates; ``None`` uses the device of the first reply.
        dtype: the server's floating dtype (float64 by default, for parity with scikit-learn).
    """

    n_components: int
    device: torch.device | None = None
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        if isinstance(self.n_components, bool) or int(self.n_components) < 1:
            raise ValueError(f"n_components must be >= 1, got {self.n_components}.")
        if isinstance(self.dtype, torch.dtype) and not self.dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating dtype, got {self.dtype}.")
        self._set("n_components", int(self.n_components))
        self._set("dtype", as_dtype(self.dtype))
        self._set("device", None if self.device is None else torch.device(self.device))


#: How pFedEM's server combines the clients' Gaussians (``PFedEMConfig``).
GAUSSIAN_AGGREGATIONS: tuple[str, ...] = ("paper", "exact")


@dataclass(frozen=True, eq=False, kw_only=True)
class PFedEMConfig(JointConfig):
    """Settings of pFedEM (``PFedEM``; the pFedEM paper's Algorithm 1): ``JointConfig``'s,
    with one sub-model per Gaussian (``n_learners`` = ``n_components``) and

    Attributes:
        gaussian_aggregation: ``"paper"`` (Eq. 12-14: each client's means and variances
            from its own E-step, averaged with its hard counts; ``covariance_type="diag"``)
            or ``"exact"`` (summed soft statistics, federated EM's exact M-step).
        covariance_type: ``"diag"`` by default (the paper's per-feature variances).
    """

    n_learners: int = 0
    covariance_type: str = "diag"
    gaussian_aggregation: str = "paper"

    def __post_init__(self) -> None:
        if int(self.n_learners) == 0:
            self._set("n_learners", int(self.n_components))
        super().__post_init__()
        if self.n_learners != self.n_components:
            raise ValueError(
                f"pFedEM trains one sub-model per Gaussian: n_learners must equal n_components "
                f"({self.n_components}); got {self.n_learners}."
            )
        if self.gaussian_aggregation not in GAUSSIAN_AGGREGATIONS:
            raise ValueError(
                f"gaussian_aggregation must be one of {GAUSSIAN_AGGREGATIONS}; got "
                f"{self.gaussian_aggregation!r}."
            )
        if self.gaussian_aggregation == "paper" and self.covariance_type != "diag":
            raise ValueError(
                "gaussian_aggregation='paper' averages the clients' per-feature variances "
                "(Eq. 13): use covariance_type='diag', or gaussian_aggregation='exact'."
            )
        if self.standardize or self.prior_strength is not None:
            raise ValueError("pFedEM's M-steps are plain: standardize=False, prior_strength=None.")


#: The Fed-CAM paper's methods (``ClusteredConfig.method``): name -> (how clients are
#: clustered, whether a global model is added to the cluster models).
CLUSTERED_METHODS: dict[str, tuple[str, bool]] = {
    "FedAvg+": ("ensemble", False),
    "IFCA": ("min_loss", False),
    "FeSEM": ("kmeans", False),
    "IFCA-CAM": ("min_loss", True),
    "FeSEM-CAM": ("kmeans", True),
}
#: How the server moves a cluster model towards its clients' copies (``cluster_average``).
CLUSTER_AVERAGES: tuple[str, ...] = ("cluster", "global")
#: What becomes of a cluster that no client joined (``empty_clusters``).
EMPTY_CLUSTER_RULES: tuple[str, ...] = ("keep", "reseed")
#: The share of ``rounds`` a CAM method warms up by default (the paper: 30 of 100).
WARMUP_SHARE = 0.3


@dataclass(frozen=True, eq=False, kw_only=True)
class ClusteredConfig(RobustSettings):
    """Settings of the Fed-CAM paper's classification methods (``ClusteredFL``,
    :mod:`fednovelty.federated.cam`); the defaults are the paper's (Sec. 5: 100 rounds of
    which 30 warm-up, 10 local steps of SGD with learning rate 0.001, momentum 0.9 and
    batch 32).

    Attributes:
        method: ``"FedAvg+"`` (an ensemble of ``n_clusters`` FedAvg models), ``"IFCA"``
            (min-loss clusters), ``"FeSEM"`` (k-means on client models), ``"IFCA-CAM"`` or
            ``"FeSEM-CAM"`` (either, plus a global model added to the cluster models' logits,
            Eq. 1).
        n_features: width of the clients' rows (the models are built before any reply).
        n_classes: number of label classes, labels 0..n_classes-1 (>= 2).
        n_clusters: K cluster models (FedAvg+: ensemble members), >= 1.
        rounds: communication rounds in all, warm-up included (>= 1).
        warmup_rounds: the CAM warm-up (Alg. 1): IFCA-CAM runs this many rounds of FedAvg
            on the global model alone; FeSEM and FeSEM-CAM this many rounds of local
            training only before their first k-means (at least 1: k-means needs trained
            client models). ``None``: ``round(0.3 * rounds)`` for the CAM methods (30 of
            100), 1 for FeSEM, 0 for IFCA and FedAvg+ (which have no warm-up).
        learner_factory: ``(n_features, n_classes) -> nn.Module`` (JSON: ``"learner"``,
            ``"linear"``, ``"mlp"`` or ``"cnn"``); every model (global, cluster, member) is
            one.
        local_steps: mini-batch steps of each local training per round (>= 1).
        learning_rate, momentum, batch_size, optimizer: the local training (``"sgd"`` with
            heavy-ball ``momentum``, or ``"adam"``).
        kmeans_reg: FeSEM's lambda (Eq. 12-13): proximal pull of a client's model towards
            its cluster's model in local training (>= 0; the paper picks it from 0.001, 0.01,
            0.1).
        kmeans_iter: most Lloyd iterations of the server's k-means each round (>= 1).
        cluster_average: ``"cluster"``: a cluster model becomes the row-weighted mean of its
            clients' copies (IFCA's and FeSEM's rule, Eq. 11); ``"global"``: Eq. 6, each
            copy weighted by its rows over all the round's rows and the rest kept from the
            current model.
        aggregation, trim, client_weight_cap: the robust options (:class:`RobustSettings`):
            every model the server averages (global, cluster, ensemble member, FeSEM's
            k-means centres) becomes the coordinate-wise trimmed mean (``"trimmed"``) or
            median (``"median"``) of its clients' copies instead of their row-weighted mean.
        empty_clusters: ``"keep"``: a cluster no client joined keeps its model and may win
            clients back (the paper's methods as written; collapse stays visible);
            ``"reseed"``: its model is replaced by the released client model farthest from
            its own cluster's model.
        random_state: integer seed (initial models, batches, k-means++).
        dtype, device: of the models, on the server and the clients.
    """

    JSON_NAMES: ClassVar[dict[str, str]] = {"learner_factory": "learner"}

    method: str
    n_features: int
    n_classes: int
    n_clusters: int = 5
    rounds: int = 100
    warmup_rounds: int | None = None
    learner_factory: LearnerFactory = mlp_learner
    local_steps: int = 10
    learning_rate: float = 0.001
    momentum: float = 0.9
    batch_size: int = 32
    optimizer: str = "sgd"
    kmeans_reg: float = 0.01
    kmeans_iter: int = 10
    cluster_average: str = "cluster"
    empty_clusters: str = "keep"
    random_state: int = 0
    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.method not in CLUSTERED_METHODS:
            raise ValueError(
                f"method must be one of {list(CLUSTERED_METHODS)}; got {self.method!r}."
            )
        for name, low in (
            ("n_features", 1),
            ("n_classes", 2),
            ("n_clusters", 1),
            ("rounds", 1),
            ("local_steps", 1),
            ("batch_size", 1),
            ("kmeans_iter", 1),
        ):
            value = _at_least(name, getattr(self, name), low)
            if int(value) != float(value):
                raise ValueError(f"{name} must be an integer, got {value!r}.")
            self._set(name, int(value))
        for name in ("learning_rate", "momentum", "kmeans_reg"):
            self._set(name, float(_at_least(name, getattr(self, name), 0)))
        if self.momentum >= 1:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum!r}.")
        for name, choices in (
            ("optimizer", OPTIMIZERS),
            ("cluster_average", CLUSTER_AVERAGES),
            ("empty_clusters", EMPTY_CLUSTER_RULES),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"{name} must be one of {list(choices)}; got {getattr(self, name)!r}."
                )
        self._set("learner_factory", as_learner(self.learner_factory))
        self._set("random_state", int(self.random_state))
        self._set("dtype", as_dtype(self.dtype))
        self._set("device", torch.device(self.device))
        self._set("warmup_rounds", self._checked_warmup())

    @property
    def clustering(self) -> str:
        """``"ensemble"`` (FedAvg+), ``"min_loss"`` (IFCA) or ``"kmeans"`` (FeSEM)."""
        return CLUSTERED_METHODS[self.method][0]

    @property
    def additive(self) -> bool:
        """Whether a global model is added to the cluster models (CAM, Eq. 1)."""
        return CLUSTERED_METHODS[self.method][1]

    def _checked_warmup(self) -> int:
        clustering, additive = CLUSTERED_METHODS[self.method]
        value = self.warmup_rounds
        if value is None:
            value = round(WARMUP_SHARE * self.rounds) if additive else 0
            value = max(value, 1) if clustering == "kmeans" else value
            return min(int(value), self.rounds)
        value = int(_at_least("warmup_rounds", value, 0))
        if value > self.rounds:
            raise ValueError(
                f"warmup_rounds={value} exceeds rounds={self.rounds} (rounds counts the "
                "warm-up); raise rounds or lower warmup_rounds."
            )
        if clustering == "kmeans" and value < 1:
            raise ValueError(
                f"{self.method} clusters client models by k-means, which needs models trained "
                "first: warmup_rounds must be >= 1 (rounds of local training only)."
            )
        if not additive and clustering != "kmeans" and value:
            raise ValueError(
                f"{self.method} has no warm-up (Alg. 1 warms up the CAM methods); use "
                "warmup_rounds=0 or None."
            )
        return value


#: how a clustered mixture's clients join clusters: IFCA's rule or FeSEM's.
CLUSTER_ASSIGNMENTS = ("likelihood", "summary")


@dataclass(frozen=True, eq=False, kw_only=True)
class ClusteredEMConfig(EMConfig):
    """Settings of the clustered additive mixture (``ClusteredEM``,
    :mod:`fednovelty.federated.clustered_em`): :class:`EMConfig` for the ``n_components``
    global components (its ``mixture_weights`` is always ``"personal"``) and

    Attributes:
        n_clusters: C client clusters (>= 1), each with its own components.
        cluster_components: K_c components per cluster (>= 1).
        assignment: ``"likelihood"`` (IFCA: every client joins the cluster whose mixture
            gives its rows the highest mean log-likelihood) or ``"summary"`` (FeSEM: the
            server runs k-means on the clients' summaries, the square roots of their
            weights).
        warmup: rounds of federated EM on all ``K_g + C K_c`` components (FedGMM with
            personal weights) before the clusters form and take their components (>= 1;
            the Fed-CAM warm-up).
        cluster_kmeans_restarts: k-means restarts of the server's clustering of summaries.

    ``max_iter`` counts the clustered rounds (after the warm-up); they stop when the mean
    log-likelihood changes by less than ``tol`` and no client changed cluster.
    """

    n_clusters: int = 2
    cluster_components: int = 2
    assignment: str = "likelihood"
    warmup: int = 10
    cluster_kmeans_restarts: int = 5
    mixture_weights: str = "personal"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mixture_weights != "personal":
            raise ValueError(
                "a clustered mixture keeps every client's own weights: mixture_weights must "
                f"be 'personal'; got {self.mixture_weights!r}."
            )
        if self.assignment not in CLUSTER_ASSIGNMENTS:
            raise ValueError(
                f"assignment must be one of {list(CLUSTER_ASSIGNMENTS)}; got {self.assignment!r}."
            )
        for name in ("n_clusters", "cluster_components", "warmup", "cluster_kmeans_restarts"):
            self._set(name, int(_at_least(name, getattr(self, name), 1)))
        if self.given_params:
            raise ValueError(
                "a clustered mixture initialises its global components itself; leave "
                "weights_init, means_init and precisions_init unset."
            )

    @property
    def total_components(self) -> int:
        """K_g + C K_c: every component of the model."""
        return self.n_components + self.n_clusters * self.cluster_components


@dataclass(frozen=True, eq=False, kw_only=True)
class VBConfig(EMConfig):
    """Settings of federated variational Bayes (``FederatedVB``): :class:`EMConfig`'s
    (``n_components`` is the upper bound K; ``tol`` applies to the ELBO, as scikit-learn)
    and scikit-learn's ``BayesianGaussianMixture`` priors (``None``: its defaults).

    Attributes:
        weight_concentration_prior_type: ``dirichlet_process`` or ``dirichlet_distribution``.
        weight_concentration_prior: > 0 (default ``1 / n_components``).
        mean_precision_prior: > 0 (default 1).
        mean_prior: (n_features,) (default: the pooled mean).
        degrees_of_freedom_prior: > n_features - 1 (default n_features; checked once the
            width is known).
        covariance_prior: (n_features, n_features), (n_features,) or a float by
            covariance type (default: from the pooled covariance).
        weight_threshold: expected weight above which a component counts as effective.
    """

    UNSUPPORTED: ClassVar[tuple[str, ...]] = ("standardize", "prior_strength", "pca_components")
    #: K is an upper bound: the k-means initialisation may seed fewer components than K when
    #: the clients' privacy floors allow fewer centroids; the rest start empty, at the prior.
    FEWER_CENTROIDS_OK: ClassVar[bool] = True

    weight_concentration_prior_type: str = "dirichlet_process"
    weight_concentration_prior: float | None = None
    mean_precision_prior: float | None = None
    mean_prior: Tensor | None = None
    degrees_of_freedom_prior: float | None = None
    covariance_prior: Tensor | float | None = None
    weight_threshold: float = 1e-2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weight_concentration_prior_type not in WEIGHT_PRIOR_TYPES:
            raise InvalidPriorError(
                f"weight_concentration_prior_type must be one of {WEIGHT_PRIOR_TYPES}, "
                f"got {self.weight_concentration_prior_type!r}."
            )
        for name in ("weight_concentration_prior", "mean_precision_prior"):
            value = getattr(self, name)
            if value is not None and not (float(value) > 0 and math.isfinite(float(value))):
                raise InvalidPriorError(f"{name} must be a finite number > 0, got {value}.")
        if (
            self.degrees_of_freedom_prior is not None
            and not float(self.degrees_of_freedom_prior) > 0
        ):
            raise InvalidPriorError(
                f"degrees_of_freedom_prior must be > n_features - 1, got "
                f"{self.degrees_of_freedom_prior}."
            )
        for name in ("mean_prior", "covariance_prior"):
            self._set(name, _as_tensor(getattr(self, name), self.dtype, self.device))
        if self.standardize or self.prior_strength is not None or self.pca_components:
            raise ValueError(
                "FederatedVB does not support standardize, prior_strength or pca_components "
                "yet; its Normal-Wishart prior replaces the covariance prior."
            )
        if self.mixture_weights != "global":
            raise ValueError(
                "FederatedVB needs mixture_weights='global' (one posterior of the weights)."
            )

    @property
    def needs_prior_moments(self) -> bool:
        """Whether a ``vb_prior`` round runs (a default mean or covariance prior)."""
        return self.mean_prior is None or self.covariance_prior is None


@dataclass(frozen=True, eq=False, kw_only=True)
class KNNMarkerConfig(VBConfig):
    """Settings of federated kNN-distance markers (``FederatedKNNMarkers``,
    :mod:`fednovelty.federated.knn_markers`): :class:`VBConfig`'s, applied to the one-column
    feature ``log(d_k + distance_floor)`` (``d_k`` a row's leave-one-out distance to its
    ``n_neighbors``-th nearest row of its own client), and:

    Attributes:
        n_neighbors: ``k`` (>= 1); a client needs ``k + 1`` rows to take part.
        distance_floor: added to every distance before the log (> 0), so duplicate rows
            (distance 0) give a finite feature; in the rows' units.

    ``covariance_type`` must be ``"full"`` (for one column every type is the same model).
    """

    n_neighbors: int = 5
    distance_floor: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("n_neighbors", int(_at_least("n_neighbors", self.n_neighbors, 1)))
        floor = self.distance_floor
        if isinstance(floor, bool) or not (float(floor) > 0 and math.isfinite(float(floor))):
            raise ValueError(f"distance_floor must be a finite number > 0, got {floor!r}.")
        self._set("distance_floor", float(floor))
        if self.covariance_type != "full":
            raise ValueError(
                f"FederatedKNNMarkers models one column: covariance_type must be 'full', got "
                f"{self.covariance_type!r}."
            )


#: VGM2's methods (issue 23): the paper's and its baselines on the same encoder.
VGM2_METHODS: tuple[str, ...] = ("vgm2", "local", "fedavg", "prototype")
#: how VGM2's server combines the client markers (Prop. 1 or Sec. 3.5).
VGM2_AGGREGATIONS: tuple[str, ...] = ("moment", "natural")
#: how VGM2 turns pair similarities into class predictions (``docs/vgm2.md``).
VGM2_PREDICTIONS: tuple[str, ...] = ("nearest", "top_pi")


@dataclass(frozen=True, eq=False, kw_only=True)
class VGM2Config(Settings):
    """Settings of VGM2 and its baselines (``VGM2``, :mod:`fednovelty.federated.vgm2`).

    The paper (Puppala et al., Sec. 5) fixes rounds (100), local epochs (8), Adam and
    B = 15 calibration bins; it gives no gamma, eta, lambda or d: the defaults here are this
    package's choice, fixed across datasets (``docs/vgm2.md``).

    Attributes:
        method: ``"vgm2"`` (markers only cross the wire), ``"local"`` (nothing does),
            ``"fedavg"`` (encoder and head averaged) or ``"prototype"`` (FedProto: class
            prototypes in the embedding averaged).
        n_features: width of the rows; n_classes: labels 0..n_classes-1 (>= 2).
        embedding_dim: d, the encoder's output width (>= 1).
        hidden: the encoder's hidden width (an MLP ``n_features -> hidden -> d``).
        n_markers: K components per relation marker (>= 1).
        rounds: communication rounds (>= 1); local_epochs: E passes over the rows per round.
        batch_size: rows per step (pairs: every pair of the batch; UMAP: as many edges).
        learning_rate: Adam's for the networks; marker_learning_rate: Adam's for the
            markers' unconstrained parameters.
        umap_weight, similarity_weight (gamma), calibration_weight (eta), kl_weight
            (lambda): the weights of Eq. 7's terms (calibration 0 switches Eq. 5 off).
        prototype_weight: FedProto's pull towards the global prototypes.
        train_encoder: False freezes the encoder at its initial weights (ablation).
        n_neighbors, min_dist, negative_sample_rate: parametric UMAP's graph and loss.
        n_bins: calibration bins (B).
        aggregation: ``"moment"`` (Prop. 1) or ``"natural"`` (Sec. 3.5).
        robust_aggregation, trim, client_weight_cap: the robust options of
            :class:`RobustSettings` (``robust_aggregation`` there ``aggregation``, a name
            this config gives the markers' rule): ``method="fedavg"`` averages the encoder
            and head as the coordinate-wise trimmed mean (``"trimmed"``) or median
            (``"median"``) of the clients' copies; the other methods have ``"sum"`` only
            (markers and prototypes are not model updates); the cap applies to every
            method.
        prediction, top_m: how VGM2 classifies a row from ``pi_1`` (Eq. 3) of its distances
            to the client's training rows: ``"nearest"`` (default): among its ``top_m``
            nearest training rows, a class scores the sum of its rows' ``pi_1``;
            ``"top_pi"``: a class scores the mean of its ``top_m`` largest ``pi_1``.
        random_state: integer seed; dtype, device: of the models.
    """

    method: str = "vgm2"
    n_features: int
    n_classes: int
    embedding_dim: int = 16
    hidden: int = 128
    n_markers: int = 3
    rounds: int = 100
    local_epochs: int = 8
    batch_size: int = 64
    learning_rate: float = 1e-3
    marker_learning_rate: float = 1e-2
    umap_weight: float = 1.0
    similarity_weight: float = 1.0
    calibration_weight: float = 1.0
    kl_weight: float = 0.01
    prototype_weight: float = 1.0
    train_encoder: bool = True
    n_neighbors: int = 15
    min_dist: float = 0.1
    negative_sample_rate: int = 5
    n_bins: int = 15
    aggregation: str = "moment"
    robust_aggregation: str = "sum"
    trim: float = 0.1
    client_weight_cap: float | None = None
    prediction: str = "nearest"
    top_m: int = 5
    random_state: int = 0
    dtype: torch.dtype = torch.float32
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        for name, choices in (
            ("method", VGM2_METHODS),
            ("aggregation", VGM2_AGGREGATIONS),
            ("prediction", VGM2_PREDICTIONS),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"{name} must be one of {list(choices)}; got {getattr(self, name)!r}."
                )
        for name, low in (
            ("n_features", 1),
            ("n_classes", 2),
            ("embedding_dim", 1),
            ("hidden", 1),
            ("n_markers", 1),
            ("rounds", 1),
            ("local_epochs", 1),
            ("batch_size", 2),
            ("n_neighbors", 2),
            ("negative_sample_rate", 1),
            ("n_bins", 1),
            ("top_m", 1),
        ):
            value = _at_least(name, getattr(self, name), low)
            if int(value) != float(value):
                raise ValueError(f"{name} must be an integer, got {value!r}.")
            self._set(name, int(value))
        for name in (
            "umap_weight",
            "similarity_weight",
            "calibration_weight",
            "kl_weight",
            "prototype_weight",
        ):
            self._set(name, float(_at_least(name, getattr(self, name), 0)))
        for name in ("learning_rate", "marker_learning_rate", "min_dist"):
            value = getattr(self, name)
            if isinstance(value, bool) or not float(value) > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}.")
            self._set(name, float(value))
        if not isinstance(self.train_encoder, bool):
            raise ValueError(f"train_encoder must be True or False, got {self.train_encoder!r}.")
        self._set("random_state", int(self.random_state))
        self._set("dtype", as_dtype(self.dtype))
        self._set("device", torch.device(self.device))
        allowed = RobustSettings.AGGREGATION_CHOICES if self.method == "fedavg" else ("sum",)
        robust = check_robust_arguments(
            self.robust_aggregation,
            self.trim,
            self.client_weight_cap,
            allowed,
            owner=f"VGM2 with method={self.method!r}",
            name="robust_aggregation",
        )
        for name, value in zip(
            ("robust_aggregation", "trim", "client_weight_cap"), robust, strict=True
        ):
            self._set(name, value)


@dataclass(frozen=True, eq=False, kw_only=True)
class VBOneShotConfig(VBConfig):
    """Settings of one-shot federated variational Bayes (``FederatedVBOneShot``,
    :mod:`fednovelty.federated.vb_oneshot`): :class:`VBConfig`'s (``max_iter`` and ``tol``
    apply to each client's local variational EM; the clients initialise it with local
    k-means, so ``init_params`` must be ``"kmeans"`` and no initial parameters are given;
    ``covariance_type`` is ``full``, ``diag`` or ``spherical``), and:

    Attributes:
        posterior_aggregation: how the server combines matched components
            (:func:`fednovelty.mixture.vb_aggregate.aggregate_posteriors`): ``"moment"``
            (moment matching, minimises the forward KL) or ``"natural"`` (natural-parameter
            averaging, minimises the reverse KL).
        match_threshold: a client component joins the closest slot when its symmetric KL
            divergence to the slot is at most ``match_threshold`` times its divergence to
            the pooled data's Gaussian; otherwise it opens a new slot while fewer than
            ``n_components`` are open (> 0).
        total_evidence: after combining a slot, scale its evidence from the average
            client's to the slot's total, the prior counted once
            (:func:`fednovelty.mixture.vb_aggregate.scale_evidence`); ``False`` keeps the
            rule's average (VGM2's use: the average as the next prior).
        aggregation, trim, client_weight_cap: the robust options (:class:`RobustSettings`):
            ``"trimmed"`` leaves out the ``ceil(trim * C)`` most outlying client posteriors,
            ``"median"`` those whose robust z-score exceeds 3.5, and both count every
            client as the typical client's rows (trimmed mean or median of the row counts).
    """

    #: ``"trimmed"`` / ``"median"``: every client counts as the typical client's rows, and
    #: outlying client posteriors are left out before the matching
    #: (:func:`fednovelty.federated.robust.outlying_models`); ``client_weight_cap`` applies.
    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = AGGREGATIONS

    posterior_aggregation: str = "moment"
    match_threshold: float = 0.5
    total_evidence: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.posterior_aggregation not in ("natural", "moment"):
            raise ValueError(
                "posterior_aggregation must be 'natural' or 'moment', got "
                f"{self.posterior_aggregation!r}."
            )
        threshold = self.match_threshold
        if isinstance(threshold, bool) or not (
            isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0
        ):
            raise ValueError(f"match_threshold must be a finite number > 0, got {threshold!r}.")
        self._set("match_threshold", float(threshold))
        if not isinstance(self.total_evidence, bool):
            raise ValueError(f"total_evidence must be True or False, got {self.total_evidence!r}.")
        if self.covariance_type == "tied":
            raise ValueError(
                "covariance_type='tied' is not supported by the one-shot algorithm (one "
                "Wishart shared by components that the clients' fits do not align); use "
                "'full', 'diag' or 'spherical', or the exact FederatedVB."
            )
        given = (self.weights_init, self.means_init, self.precisions_init)
        if self.init_params != "kmeans" or any(value is not None for value in given):
            raise ValueError(
                "one-shot clients initialise their local fits with local k-means: use "
                "init_params='kmeans' and leave weights_init, means_init and precisions_init "
                "unset."
            )
