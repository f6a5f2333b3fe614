"""Iterative federated EM for Gaussian mixtures (FedGMM Algorithm 2; DEM of the FedGenGMM paper).

Each EM round, the server broadcasts the current parameters and a moment shift; every
client runs the E-step on its rows and replies with summed statistics (counts, first and
second moments about the shift, log-likelihood); the server adds them and runs the M-step.
With ``mixture_weights="global"`` (DEM) the summed statistics are exactly those of the
pooled rows, so any split of the rows into clients follows centralized EM (and
scikit-learn's ``GaussianMixture``) to round-off. With ``"personal"`` (FedGMM) every client
keeps its own weights ``pi_c`` (the counts of its last E-step over its row count) and uses
them in its E-step; means and covariances stay shared. The counts it sends every round are
``n_c * pi_c`` (with ``n_c``), so the server knows ``pi_c`` (``EMState.client_weights``).

Every client step enforces the client's own privacy policy (``ClientContext.policy``,
:mod:`fednovelty.federated.privacy`, ``docs/privacy.md``) whatever the message asks: a
client with fewer than ``min_rows`` rows skips every round (``skipped_reply``); local k-means
forms at most ``min(n_clusters, max_clusters, n_rows // min_rows)`` clusters and merges
those of fewer than ``min_rows`` rows into the nearest larger one; a range is the mean of the
``min_rows`` smallest / largest values of each feature; an assignment or EM component backed
by fewer than ``min_rows`` (effective) rows is sent as zeros; the ``subset`` round is refused
unless the policy allows raw rows. The server treats skipped replies as absent.

The paper's Algorithm 2 sends client means and covariances *about client means* and
averages them; averaging covariances taken about different means drops the between-client
spread of each component, so it is exact only for the means (its Lemma 2). Summing second
moments about a common shift is exact for covariances too, and costs the same bytes.

Initialisations (the FedGenGMM paper's DEM inits), chosen by ``init_params``:

``"kmeans"`` (default; DEM init 3)
    Round 1: each client runs k-means locally and sends its centroids and their counts.
    The server runs weighted k-means++ and Lloyd on the pooled centroids (k-FED). Then
    federated Lloyd rounds: clients send counts and sums of rows per nearest centre.
``"separated"`` (DEM init 1)
    Round 1: clients send their feature minima and maxima; the server places
    ``n_components`` centres far apart (greedy max-min over a scrambled Sobol set) in the
    merged box. One assignment round turns them into a mixture.
``"subset"`` (DEM init 2)
    Clients send their row counts, then a random ``subset_size`` rows in total (in
    proportion to their size); the server fits a mixture on them. **This sends raw rows to
    the server** and warns when used.

Standardisation and a covariance prior (``standardize``, ``prior_strength``; the remedies
of a plain mixture's failures on real tabular data, see ``docs/robust.md``): a first
``moments`` round has every client send its row count, feature means and sums of squared
deviations (``2 d + 1`` numbers), which merge exactly into the pooled mean and variance.
With ``standardize`` every later round broadcasts ``offset`` and ``scale`` and clients work
on ``z = (x - offset) / scale`` (k-means, ``reg_covar`` and the prior see one scale per
feature); the final mixture is mapped back to the original units, and the recorded
log-likelihoods include the Jacobian, so both are those of ``x``. With ``prior_strength``
every M-step is MAP under :class:`~fednovelty.mixture.CovariancePrior` towards
``prior_scale`` times each feature's pooled variance. Both act on the server's sums only.

The last assignment round of ``kmeans``/``separated`` sends second moments too, so the
initial mixture is the M-step from hard k-means responsibilities, like scikit-learn's
``init_params="kmeans"``. Given ``weights_init``, ``means_init`` and ``precisions_init``
the init rounds are skipped (scikit-learn's rule).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.aggregate import (
    merge_ranges,
    pool_centroids,
    stats_from_message,
    stats_message,
    sum_stats,
    total_variance,
)
from fednovelty.federated.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    Scalar,
    check_prior_arguments,
    client_generator,
    skipped_reply,
)
from fednovelty.federated.privacy import (
    backed,
    effective_rows,
    merge_small_clusters,
    suppress_components,
    trimmed_range,
)
from fednovelty.federated.robust import cap_replies, check_robust_arguments, robust_stats
from fednovelty.mixture import (
    CovariancePrior,
    FeatureMoments,
    MixtureParams,
    affine_params,
    e_step_stats,
    feature_moments,
    fit_gmm,
    kmeans,
    merge_moments,
    params_from_stats,
    precisions_cholesky_from_precisions,
    predict_proba,
    prior_target,
    standardization,
    stats_from_resp,
)
from fednovelty.mixture.covariance import check_covariance_type
from fednovelty.mixture.density import Workspace
from fednovelty.mixture.em import moment_shift
from fednovelty.mixture.kmeans import assign, one_hot
from fednovelty.mixture.stats import SufficientStats

INIT_PARAMS: tuple[str, ...] = ("kmeans", "separated", "subset")
MIXTURE_WEIGHTS: tuple[str, ...] = ("global", "personal")


@dataclass
class EMState:
    """Server state of federated EM.

    Attributes:
        phase: the next round's kind: ``moments``, ``centroids``, ``range``, ``count``,
            ``subset``, ``assign``, ``em`` or ``done``.
        params: current mixture (global weights) once initialised.
        centers: k-means centres during the assignment phase, (n_components, n_features).
        lloyd_rounds, lloyd_budget: assignment rounds run and allowed.
        subset_fraction: share of each client's rows to send (``subset`` init).
        lower_bounds: mean log-likelihood before each M-step.
        n_iter: EM rounds run; ``converged``: whether ``tol`` was reached.
        client_weights: personal weights by client id (last E-step), each (n_components,).
        rounds: communication rounds so far (init rounds included).
        next_phase: the phase after the ``moments`` round.
        offset, scale: the standardisation ``z = (x - offset) / scale`` (``standardize``),
            each (n_features,); the EM rounds' parameters are in ``z`` units until the end.
        prior: the covariance prior of every M-step (``prior_strength``), in ``z`` units.
    """

    phase: str
    params: MixtureParams | None = None
    centers: Tensor | None = None
    lloyd_rounds: int = 0
    lloyd_budget: int = 0
    subset_fraction: float = 0.0
    lower_bounds: list[float] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = False
    client_weights: dict[int, Tensor] = field(default_factory=dict)
    rounds: int = 0
    next_phase: str = ""
    offset: Tensor | None = None
    scale: Tensor | None = None
    prior: CovariancePrior | None = None


def separated_centers(low: Tensor, high: Tensor, n_centers: int, seed: int) -> Tensor:
    """``n_centers`` points far apart in the box ``[low, high]`` (each (n_features,)).

    Greedy max-min selection over a scrambled Sobol set, starting at the point nearest the
    box centre. Returns shape (n_centers, n_features).
    """
    d = low.shape[0]
    engine = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed)
    unit = engine.draw(max(256, 64 * n_centers), dtype=torch.float64).to(low.device, low.dtype)
    candidates = low + unit * (high - low)
    middle = (low + high) / 2
    chosen = [int((candidates - middle).square().sum(1).argmin())]
    nearest = (candidates - candidates[chosen[0]]).square().sum(1)
    for _ in range(1, n_centers):
        chosen.append(int(nearest.argmax()))
        nearest = torch.minimum(nearest, (candidates - candidates[chosen[-1]]).square().sum(1))
    return candidates[chosen]


class FederatedEM(FederatedAlgorithm):
    """Federated EM for a Gaussian mixture over clients (see module docstring).

    Args:
        n_components: number of Gaussian components K.
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.
        mixture_weights: ``"global"`` (one pi for all clients; DEM) or ``"personal"``
            (one pi_c per client; FedGMM).
        init_params: ``"kmeans"``, ``"separated"`` or ``"subset"``.
        reg_covar: added to covariance diagonals.
        tol: convergence threshold on the change of mean log-likelihood.
        max_iter: maximum EM rounds.
        kmeans_rounds: maximum federated Lloyd rounds (``kmeans`` init).
        kmeans_tol: Lloyd stops when the largest squared centre move is below
            ``kmeans_tol`` times the mean feature variance.
        subset_size: rows sent in total for ``init_params="subset"``.
        weights_init, means_init, precisions_init: scikit-learn's initial parameters
            (numpy or torch; precisions, not covariances).
        standardize: fit on federated z-scores (one extra ``moments`` round; the result is
            in the original units).
        prior_strength: pseudo-rows of the covariance prior (``None``: plain ML M-steps).
        prior_scale: the prior's target variance, as a multiple of each feature's pooled
            variance.
        aggregation: how the M-step combines the clients' statistics: ``"sum"`` (exact) or
            ``"trimmed"`` (robust to a share ``trim`` of hostile clients, at a cost on
            honest ones; :mod:`fednovelty.federated.robust`).
        trim: share of clients dropped at each end by ``aggregation="trimmed"``.
        client_weight_cap: no client counts for more than this many times the median
            client's row count (``None``: no cap).
        random_state: integer seed.
        dtype, device: where the server computes; client rows arrive in this dtype.
        chunk_size: rows per E-step chunk (memory bound); default from K and d.
    """

    def __init__(
        self,
        n_components: int,
        *,
        covariance_type: str = "full",
        mixture_weights: str = "global",
        init_params: str = "kmeans",
        reg_covar: float = 1e-6,
        tol: float = 1e-3,
        max_iter: int = 100,
        kmeans_rounds: int = 10,
        kmeans_tol: float = 1e-4,
        subset_size: int = 100,
        weights_init=None,
        means_init=None,
        precisions_init=None,
        standardize: bool = False,
        prior_strength: float | None = None,
        prior_scale: float = 1.0,
        aggregation: str = "sum",
        trim: float = 0.1,
        client_weight_cap: float | None = None,
        random_state: int = 0,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
        chunk_size: int | None = None,
    ) -> None:
        check_covariance_type(covariance_type)
        self.aggregation, self.trim, self.client_weight_cap = check_robust_arguments(
            aggregation, trim, client_weight_cap, ("sum", "trimmed")
        )
        if mixture_weights not in MIXTURE_WEIGHTS:
            raise ValueError(
                f"mixture_weights must be one of {MIXTURE_WEIGHTS}, got {mixture_weights!r}."
            )
        if init_params not in INIT_PARAMS:
            raise ValueError(f"init_params must be one of {INIT_PARAMS}, got {init_params!r}.")
        prior_strength, prior_scale = check_prior_arguments(prior_strength, prior_scale)
        self.n_components = int(n_components)
        self.covariance_type = covariance_type
        self.standardize = bool(standardize)
        self.prior_strength = prior_strength
        self.prior_scale = prior_scale
        self.mixture_weights = mixture_weights
        self.init_params = init_params
        self.reg_covar = float(reg_covar)
        self.tol = float(tol)
        self.max_iter = int(max_iter)
        self.kmeans_rounds = int(kmeans_rounds)
        self.kmeans_tol = float(kmeans_tol)
        self.subset_size = int(subset_size)
        self.random_state = int(random_state)
        self.dtype = dtype
        self.device = torch.device(device)
        self.chunk_size = chunk_size
        # E-step scratch buffers, reused by every client step this object runs (a client
        # process runs one client; the in-process engine runs them all in turn).
        self._workspace = Workspace()

        def as_tensor(value) -> Tensor | None:
            if value is None:
                return None
            return torch.as_tensor(np.asarray(value), dtype=dtype, device=self.device)

        self.weights_init = as_tensor(weights_init)
        self.means_init = as_tensor(means_init)
        self.precisions_init = as_tensor(precisions_init)
        init_rounds = {"kmeans": 1 + self.kmeans_rounds, "separated": 2, "subset": 2}[init_params]
        self.max_rounds = init_rounds + self.max_iter + int(self._needs_moments)

    @property
    def _needs_moments(self) -> bool:
        return self.standardize or self.prior_strength is not None

    # ------------------------------------------------------------------ server half
    def _round_seed(self, state: EMState) -> int:
        return int(np.random.SeedSequence([self.random_state, state.rounds]).generate_state(1)[0])

    def _server_generator(self, state: EMState) -> torch.Generator:
        return torch.Generator().manual_seed(self._round_seed(state) ^ 0x5EED)

    def start(self) -> EMState:
        state = self._start()
        if self._needs_moments:
            state.next_phase, state.phase = state.phase, "moments"
        return state

    def _start(self) -> EMState:
        if (
            self.weights_init is not None
            and self.means_init is not None
            and (self.precisions_init is not None)
        ):
            params = MixtureParams(
                self.weights_init,
                self.means_init,
                precisions_cholesky_from_precisions(self.precisions_init, self.covariance_type),
                self.covariance_type,
            )
            return EMState(phase="em", params=params)
        if self.means_init is not None:
            return EMState(phase="assign", centers=self.means_init, lloyd_budget=1)
        if self.init_params == "subset":
            warnings.warn(
                "init_params='subset' sends raw rows of every client to the server; use "
                "'kmeans' (the default) where data must stay on the clients.",
                UserWarning,
                stacklevel=2,
            )
        first = {"kmeans": "centroids", "separated": "range", "subset": "count"}
        return EMState(phase=first[self.init_params])

    def finished(self, state: EMState) -> bool:
        return state.phase == "done"

    def configure(self, state: EMState) -> Message:
        if state.phase == "moments":
            return Message("moments")
        message = self._configure(state)
        if state.scale is not None:
            message.tensors.update(offset=state.offset, scale=state.scale)
        return message

    def _configure(self, state: EMState) -> Message:
        seed = self._round_seed(state)
        ct = self.covariance_type
        if state.phase == "centroids":
            return Message("centroids", scalars={"n_clusters": self.n_components, "seed": seed})
        if state.phase in ("range", "count"):
            return Message(state.phase)
        if state.phase == "subset":
            return Message("subset", scalars={"fraction": state.subset_fraction, "seed": seed})
        if state.phase == "assign":
            return Message(
                "assign",
                {"centers": state.centers, "shift": state.centers.mean(0)},
                {"covariance_type": ct},
            )
        if state.phase == "em":
            return Message(
                "em",
                {**state.params.tensors(), "shift": moment_shift(state.params)},
                {"covariance_type": ct, "personal": self.mixture_weights == "personal"},
            )
        raise RuntimeError(f"no round to configure in phase {state.phase!r}")

    def server_step(
        self, state: EMState, replies: dict[int, Message]
    ) -> tuple[EMState, dict[str, Scalar]]:
        replies = {cid: r for cid, r in replies.items() if not r.scalars.get("skipped")}
        if not replies:
            raise ValueError(
                f"no client replied with statistics in round {state.rounds + 1} ({state.phase}); "
                "clients below their privacy floor, or refusing the round, skip."
            )
        replies = cap_replies(replies, self.client_weight_cap)
        handler = getattr(self, f"_server_{state.phase}")
        metrics = handler(state, replies)
        state.rounds += 1
        if state.phase == "done" and state.scale is not None:  # back to the user's units
            state.params = affine_params(state.params, state.offset, state.scale)
        return state, {"phase": metrics.pop("phase", ""), **metrics}

    def _server_moments(self, state: EMState, replies: dict[int, Message]) -> dict:
        moments = merge_moments(
            FeatureMoments(
                *(m.tensors[k].to(self.device, self.dtype) for k in ("n_samples", "mean", "m2"))
            )
            for m in replies.values()
        )
        if float(moments.n_samples) == 0:
            raise ValueError("no client with data replied in the moments round.")
        scale = torch.ones_like(moments.mean)
        if self.standardize:
            state.offset, scale = standardization(moments, self.covariance_type)
            state.scale = scale
            self._standardize_init(state)
        if self.prior_strength is not None:
            target = prior_target(moments.variance, scale, self.prior_scale)
            state.prior = CovariancePrior(self.prior_strength, target)
        state.phase = state.next_phase
        return {"phase": "moments", "n_samples": float(moments.n_samples)}

    def _standardize_init(self, state: EMState) -> None:
        """User-given initial parameters (original units) in z units."""
        offset, scale = state.offset, state.scale
        if state.params is not None:  # weights, means and precisions all given
            state.params = affine_params(state.params, -offset / scale, 1 / scale)
        if state.centers is not None:
            state.centers = (state.centers - offset) / scale

    def _server_centroids(self, state: EMState, replies: dict[int, Message]) -> dict:
        centers, counts = pool_centroids(replies.values())
        if centers.shape[0] < self.n_components:
            n_rows = int(sum(float(m.tensors["n_samples"]) for m in replies.values()))
            raise ValueError(
                f"The clients hold {n_rows} sample(s) in all but n_components="
                f"{self.n_components}; need at least as many samples as components, and "
                f"they sent {centers.shape[0]} centroid(s) (a client forms at most n_rows // "
                "min_rows clusters under its privacy floor). Lower n_components, add data or "
                "lower the clients' privacy floor (privacy_min_rows)."
            )
        centers = centers.to(self.device, self.dtype)
        counts = counts.to(self.device, self.dtype)
        state.centers, _ = kmeans(
            centers,
            self.n_components,
            generator=self._server_generator(state),
            sample_weight=counts,
        )
        state.phase, state.lloyd_budget = "assign", self.kmeans_rounds
        return {"phase": "centroids", "n_centroids": int(centers.shape[0])}

    def _server_range(self, state: EMState, replies: dict[int, Message]) -> dict:
        low, high = merge_ranges(replies.values())
        low, high = low.to(self.device, self.dtype), high.to(self.device, self.dtype)
        state.centers = separated_centers(low, high, self.n_components, self._round_seed(state))
        state.phase, state.lloyd_budget = "assign", 1
        return {"phase": "range"}

    def _server_count(self, state: EMState, replies: dict[int, Message]) -> dict:
        total = sum(float(m.tensors["n_samples"]) for m in replies.values())
        if total < self.n_components:
            raise ValueError(
                f"The clients hold {int(total)} sample(s) but n_components={self.n_components}."
            )
        state.subset_fraction = min(1.0, max(self.subset_size, self.n_components) / total)
        state.phase = "subset"
        return {"phase": "count", "n_samples": total}

    def _server_subset(self, state: EMState, replies: dict[int, Message]) -> dict:
        rows = torch.cat([m.tensors["rows"] for m in replies.values()]).to(self.device, self.dtype)
        k = self.n_components
        if rows.shape[0] < k:
            raise ValueError(f"the subset has {rows.shape[0]} rows, fewer than n_components={k}.")
        result = fit_gmm(
            rows,
            k,
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            tol=self.tol,
            max_iter=self.max_iter,
            generator=self._server_generator(state),
            prior=state.prior,
        )
        state.params, state.phase = result.params, "em"
        return {"phase": "subset", "rows_shared": int(rows.shape[0])}

    def _server_assign(self, state: EMState, replies: dict[int, Message]) -> dict:
        stats = self._combine(replies, state.centers.mean(0))
        if float(stats.n_samples) < self.n_components:
            raise ValueError(
                f"The clients hold {int(stats.n_samples)} sample(s) but n_components="
                f"{self.n_components}."
            )
        occupied = stats.counts > 0
        moved = stats.shift + stats.sums / stats.counts.clamp_min(1e-300).unsqueeze(1)
        new_centers = torch.where(occupied.unsqueeze(1), moved, state.centers)
        movement = float((new_centers - state.centers).square().sum(1).max())
        state.lloyd_rounds += 1
        threshold = self.kmeans_tol * total_variance(stats)
        if state.lloyd_rounds >= state.lloyd_budget or movement <= threshold:
            params = params_from_stats(stats, self.reg_covar, state.prior)
            state.params = self._apply_user_init(params, state)
            state.phase = "em"
        else:
            state.centers = new_centers
        return {"phase": "assign", "center_shift": movement}

    def _apply_user_init(self, params: MixtureParams, state: EMState) -> MixtureParams:
        weights = params.weights if self.weights_init is None else self.weights_init
        means, prec = params.means, params.precisions_cholesky
        if self.means_init is not None:
            means = self.means_init
            if state.scale is not None:
                means = (means - state.offset) / state.scale
        if self.precisions_init is not None:
            prec = precisions_cholesky_from_precisions(self.precisions_init, self.covariance_type)
            if state.scale is not None:  # x = offset + scale * z: U_z = D U_x
                prec = affine_params(
                    MixtureParams(weights, means, prec, self.covariance_type),
                    means.new_zeros(means.shape[1]),
                    1 / state.scale,
                ).precisions_cholesky
        return MixtureParams(weights, means, prec, self.covariance_type)

    def _server_em(self, state: EMState, replies: dict[int, Message]) -> dict:
        stats = self._combine(replies, moment_shift(state.params))
        if float(stats.n_samples) <= 0:
            raise ValueError("no client with data replied in this EM round.")
        state.params = params_from_stats(stats, self.reg_covar, state.prior)
        if self.mixture_weights == "personal":
            for cid, reply in replies.items():
                n = float(reply.tensors["n_samples"])
                if n > 0:
                    counts = reply.tensors["counts"].to(self.device, self.dtype)
                    state.client_weights[cid] = counts / counts.sum()
        return {"phase": "em", "mean_log_likelihood": self._advance(state, stats)}

    def _combine(self, replies: dict[int, Message], shift: Tensor) -> SufficientStats:
        """The M-step's statistics: the plain sum, or a robust combination
        (``aggregation``, :func:`~fednovelty.federated.robust.robust_stats`)."""
        if self.aggregation == "sum":
            return sum_stats(replies.values(), shift, self.covariance_type)
        per_client = {
            c: stats_from_message(m, shift, self.covariance_type) for c, m in replies.items()
        }
        return robust_stats(per_client, self.trim)

    def _advance(self, state: EMState, stats) -> float:
        """Record an EM round's mean log-likelihood and apply the stopping rule (|change| <
        tol, or max_iter rounds); returns the mean log-likelihood."""
        lower_bound = float(stats.log_likelihood / stats.n_samples)
        if state.scale is not None:  # log p(x) = log p(z) - sum log scale
            lower_bound -= float(state.scale.log().sum())
        previous = state.lower_bounds[-1] if state.lower_bounds else -math.inf
        state.lower_bounds.append(lower_bound)
        state.n_iter += 1
        if abs(lower_bound - previous) < self.tol:
            state.converged, state.phase = True, "done"
        elif state.n_iter >= self.max_iter:
            state.phase = "done"
        return lower_bound

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        handler = getattr(self, f"_client_{message.kind}", None)
        if handler is None:
            raise ValueError(
                f"FederatedEM clients do not answer messages of kind {message.kind!r}."
            )
        if "scale" in message.tensors:  # standardised rounds: work on z-scores
            offset = message.tensors["offset"].to(X.device, X.dtype)
            X = (X - offset) / message.tensors["scale"].to(X.device, X.dtype)
        return handler(X, message, context)

    def _client_moments(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.policy.releases(X.shape[0]):
            return skipped_reply("moments", context.policy.below_floor)
        return Message("moments", feature_moments(X).tensors())

    @staticmethod
    def _n(X: Tensor) -> Tensor:
        return torch.tensor(float(X.shape[0]), dtype=X.dtype)

    def _client_centroids(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        policy = context.policy
        k = policy.cluster_bound(int(message.scalars["n_clusters"]), X.shape[0])
        if k == 0:
            return skipped_reply("centroids", policy.below_floor)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        centers, labels = kmeans(X, k, generator=generator)
        centers, counts = merge_small_clusters(X, labels, centers, policy.min_rows)
        return Message("centroids", {"centers": centers, "counts": counts, "n_samples": self._n(X)})

    def _client_range(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.policy.releases(X.shape[0]):
            return skipped_reply("range", context.policy.below_floor)
        low, high = trimmed_range(X, context.policy.min_rows)
        return Message("range", {"min": low, "max": high, "n_samples": self._n(X)})

    def _client_count(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.policy.releases(X.shape[0]):
            return skipped_reply("count", context.policy.below_floor)
        return Message("count", {"n_samples": self._n(X)})

    def _client_subset(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.policy.allow_raw_rows:
            return skipped_reply(
                "subset", "the client's privacy policy does not allow raw rows (allow_raw_rows)"
            )
        n = X.shape[0]
        m = min(n, math.ceil(float(message.scalars["fraction"]) * n))
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        index = torch.randperm(n, generator=generator)[:m].to(X.device)
        return Message("subset", {"rows": X[index], "n_samples": self._n(X)})

    def _client_assign(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        policy = context.policy
        if not policy.releases(X.shape[0]):
            return skipped_reply("assign", policy.below_floor)
        centers = message.tensors["centers"].to(X.device, X.dtype)
        shift = message.tensors["shift"].to(X.device, X.dtype)
        ct = str(message.scalars["covariance_type"])
        labels, _ = assign(X, centers)
        resp = one_hot(labels, centers.shape[0], X)
        keep = backed(resp.sum(0), policy.min_rows)
        if not bool(keep.any()):
            return skipped_reply("assign", f"no centre has min_rows={policy.min_rows} rows")
        stats = stats_from_resp(X, resp * keep.to(X.dtype), ct, shift)
        return stats_message(stats, "assign")

    def _client_em(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        ct = str(message.scalars["covariance_type"])
        personal = bool(message.scalars.get("personal", False))
        log_weights = context.state.get("log_weights") if personal else None
        if log_weights is None:
            log_weights = t["weights"].log()
        policy = context.policy
        # sum_i r_ik^2: with the counts, each component's effective rows (the floor's test)
        squared = X.new_zeros(t["means"].shape[0]) if policy.has_floor else None
        stats = e_step_stats(
            X,
            log_weights,
            t["means"],
            t["precisions_cholesky"],
            ct,
            t["shift"],
            self.chunk_size,
            self._workspace,
            squared_counts=squared,
        )
        if personal and X.shape[0] > 0:
            counts = stats.counts + 10 * torch.finfo(X.dtype).eps
            context.state["log_weights"] = (counts / counts.sum()).log()
        if not policy.releases(X.shape[0]):
            return skipped_reply("em", policy.below_floor)
        if squared is None:  # no floor
            return stats_message(stats, "em")
        keep = backed(effective_rows(stats.counts, squared), policy.min_rows)
        if not bool(keep.any()):
            return skipped_reply("em", f"no component has min_rows={policy.min_rows} rows")
        if not bool(keep.all()):
            tied_second = None
            if ct == "tied":  # the one second moment of the kept components' rows
                params = MixtureParams(log_weights.exp(), t["means"], t["precisions_cholesky"], ct)
                resp = predict_proba(params, X, log_weights=log_weights) * keep.to(X.dtype)
                tied_second = stats_from_resp(X, resp, ct, t["shift"]).second
            stats = suppress_components(stats, keep, tied_second)
        return stats_message(stats, "em")
