"""Clustered additive mixtures: global components shared by every client plus the components
of the client's cluster (the Fed-CAM paper's idea carried to Gaussian mixtures).

Client ``c`` in cluster ``j`` has the density

    p_c(x) = sum_{k in G} pi_ck N(x; mu_k, Sigma_k) + sum_{k in C_j} pi_ck N(x; mu_k, Sigma_k)

over the ``K_g`` global components ``G`` and the ``K_c`` components ``C_j`` of its cluster; its
weights ``pi_c`` are its own (zero outside ``G`` and ``C_j``). The model is one mixture of
``M = K_g + C K_c`` components whose clients' weights are masked by cluster: the E-step of a
client touches only its allowed components, so every component's summed statistics are
exact sums over the rows that use it, and the server's M-step is federated EM's.

``ClusteredEM`` chains a warm-up of federated EM on all ``M`` components (personal weights),
a server-side clustering of the clients' weight summaries that hands each cluster its
``K_c`` components (:func:`~.mixture_clusters.partition_components`), and clustered EM rounds (kind
``"cluster_em"``) in which each client joins a cluster, by the likelihood of its rows
(IFCA's rule) or by the server's k-means of the summaries (FeSEM's), and sends the
statistics of its allowed components. The rounds and the degenerate cases (too many
clusters, empty clusters, clients below their privacy floor) are stated on
:class:`ClusteredEM`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from fednovelty.federated.clustered.mixture_clusters import (
    allowed_components,
    hellinger_kmeans,
    log_normalised,
    partition_components,
    row_log_likelihoods,
    summary_of,
)
from fednovelty.federated.core.base import ClientContext, Message, derived_seed, skipped_reply
from fednovelty.federated.core.config import at_least, settings_dataclass
from fednovelty.federated.core.declarations import InvalidReplyError, declare, stats_reply
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init.combine import combine_stats
from fednovelty.federated.init.settings import MomentsSettings
from fednovelty.federated.mixtures.em import EMConfig, EMSettings, EMState, EMStep, em_steps
from fednovelty.federated.trust.backing import backed
from fednovelty.federated.trust.contrast import contrast_backed
from fednovelty.federated.trust.reply_form import Shape, stats_shapes
from fednovelty.federated.trust.value_checks import check_stats
from fednovelty.mixture import MixtureParams, params_from_stats
from fednovelty.mixture.density import log_gaussian_prob
from fednovelty.mixture.em import moment_shift

__all__ = [
    "CLUSTER_ASSIGNMENTS",
    "ClusteredEM",
    "ClusteredEMConfig",
    "ClusteredEMState",
]

#: a client's cluster in a broadcast assignment when it chooses for itself.
CHOOSE = -1


#: how a clustered mixture's clients join clusters: IFCA's rule or FeSEM's.
CLUSTER_ASSIGNMENTS = ("likelihood", "summary")


@settings_dataclass
class ClusteredEMConfig(EMSettings, MomentsSettings):
    """Settings of the clustered additive mixture (``ClusteredEM``,
    :mod:`fednovelty.federated.clustered.clustered_em`): federated EM's chain
    (:class:`~fednovelty.federated.mixtures.em.EMSettings`) and moments round
    (:class:`~fednovelty.federated.init.settings.MomentsSettings`) for the ``n_components`` global
    components (every client keeps its own weights: ``mixture_weights`` is ``"personal"``;
    the global components are initialised by the rounds, never given), and

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

    MIXTURE_WEIGHT_CHOICES: ClassVar[tuple[str, ...]] = ("personal",)

    n_clusters: int = 2
    cluster_components: int = 2
    assignment: str = "likelihood"
    warmup: int = 10
    cluster_kmeans_restarts: int = 5
    mixture_weights: str = "personal"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("assignment", CLUSTER_ASSIGNMENTS)
        for name in ("n_clusters", "cluster_components", "warmup", "cluster_kmeans_restarts"):
            self._set(name, int(at_least(name, getattr(self, name), 1)))

    @property
    def total_components(self) -> int:
        """K_g + C K_c: every component of the model."""
        return self.n_components + self.n_clusters * self.cluster_components


@dataclass
class ClusteredEMState(EMState):
    """``EMState`` plus the clusters.

    Attributes:
        component_clusters: (M,) int64, each component's cluster (-1: global).
        cluster_log_weights: (C, M) each cluster's pooled log weights (-inf outside its
            allowed components).
        client_clusters: cluster of every client that replied in the last round, by id.
        client_log_likelihoods: by client id, (C,) its rows' mean log-likelihood under
            each cluster's mixture in its last reply.
        assignment: by client id, the server's cluster for the next round (``"summary"``).
        summary_centers: (C, M) the k-means centres of the summaries (``"summary"``).
        cluster_sizes: clients per cluster, one list per clustered round.
        events: one dict per noteworthy event (``round``, ``cluster``, ``event``).
        cluster_rounds: clustered rounds run.
    """

    component_clusters: Tensor | None = None
    cluster_log_weights: Tensor | None = None
    client_clusters: dict[int, int] = field(default_factory=dict)
    client_log_likelihoods: dict[int, Tensor] = field(default_factory=dict)
    assignment: dict[int, int] = field(default_factory=dict)
    summary_centers: Tensor | None = None
    cluster_sizes: list[list[int]] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    cluster_rounds: int = 0


# ---------------------------------------------------------------------- the step
def cluster_em_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A clustered EM reply: federated EM's statistics and one log-likelihood per cluster
    row of the broadcast (C,)."""
    c = int(broadcast.tensors["cluster_log_weights"].shape[0])
    return {**stats_shapes(broadcast, d), "cluster_log_likelihood": (c,)}


def check_cluster_reply(reply: Message, broadcast: Message) -> None:
    """A clustered EM reply names a cluster of the broadcast and has statistics only on
    the components that cluster's clients use."""
    cluster = reply.scalars.get("cluster")
    n_clusters = int(broadcast.tensors["cluster_log_weights"].shape[0])
    if not isinstance(cluster, int) or isinstance(cluster, bool) or not 0 <= cluster < n_clusters:
        raise InvalidReplyError(f"cluster {cluster!r} is not one of the {n_clusters} clusters.")
    owners = broadcast.tensors["component_clusters"]
    foreign = (owners != -1) & (owners != cluster)
    if bool((reply.tensors["counts"][foreign] != 0).any()):
        raise InvalidReplyError(
            f"statistics on components of another cluster than the reply's ({cluster})."
        )


def cluster_em_limit(config: ClusteredEMConfig, broadcast: Message) -> dict[str, int]:
    """The client's own bounds on grouped entries, by what backs them: its components
    (``total_components``) and its clusters (``n_clusters`` cluster rows, however many
    the broadcast carries)."""
    return {"components": int(config.total_components), "clusters": int(config.n_clusters)}


#: a ``cluster_em`` reply: statistics (in the client's box) and cluster log-likelihoods.
CLUSTER_EM_REPLY = stats_reply(
    "cluster_em",
    cluster_em_shapes,
    (check_cluster_reply, check_stats),
    {"cluster_log_likelihood": "clusters"},
    limit=cluster_em_limit,
)


class ClusteredEMStep(Step):
    """Clusters form and clustered EM rounds (module docstring, steps 2-3)."""

    kinds = ("cluster_em",)
    replies = declare(CLUSTER_EM_REPLY)

    def __init__(self, config: ClusteredEMConfig, em: EMStep) -> None:
        self.config = config
        self.max_rounds = config.max_iter
        self._em = em  # its client half answers the E-step; its server half is reused

    # ------------------------------------------------------------------ server half
    def begin(self, state: ClusteredEMState) -> str:
        config = self.config
        clients = sorted(state.client_weights)
        if config.n_clusters > len(clients):
            raise ValueError(
                f"n_clusters={config.n_clusters} exceeds the {len(clients)} client(s) that "
                "replied in the warm-up: lower n_clusters or add clients."
            )
        summaries = torch.stack([state.client_weights[c].clamp_min(0).sqrt() for c in clients])
        generator = torch.Generator().manual_seed(derived_seed(config.random_state, 7919))
        labels, centers = hellinger_kmeans(
            summaries.cpu(), config.n_clusters, generator, restarts=config.cluster_kmeans_restarts
        )
        weights = summaries.square().to(state.params.weights)  # (n_clients, M)
        members = [weights[labels.to(weights.device) == j] for j in range(config.n_clusters)]
        component_clusters, cluster_log_weights = partition_components(
            members, config.cluster_components
        )
        state.component_clusters = component_clusters
        state.cluster_log_weights = cluster_log_weights
        state.summary_centers = centers.to(state.params.means)
        state.assignment = {c: int(lab) for c, lab in zip(clients, labels.tolist(), strict=True)}
        state.client_weights = {}
        return "cluster_em"

    def configure(self, state: ClusteredEMState) -> Message:
        tensors = {
            **state.params.tensors(),
            "shift": moment_shift(state.params),
            "component_clusters": state.component_clusters,
            "cluster_log_weights": state.cluster_log_weights,
        }
        if self.config.assignment == "summary" and state.assignment:
            size = max(state.assignment) + 1
            assignment = torch.full((size,), CHOOSE, dtype=torch.long)
            for client, cluster in state.assignment.items():
                assignment[client] = cluster
            tensors["assignment"] = assignment.to(state.params.means.device)
        return Message(
            "cluster_em",
            tensors,
            expect={
                "covariance_type": self.config.covariance_type,
                "n_clusters": self.config.n_clusters,
            },
        )

    def server_step(self, state: ClusteredEMState, replies: dict[int, Message]):
        config = self.config
        previous = state.params
        stats = combine_stats(replies, moment_shift(previous), self._em_config)
        if float(stats.n_samples) <= 0:
            raise ValueError("no client with data replied in this clustered EM round.")
        fitted = params_from_stats(stats, config.reg_covar, state.prior)
        used = stats.counts > 0
        state.params = _keep_unused(fitted, previous, used)
        old = dict(state.client_clusters)
        state.client_clusters = {c: int(r.scalars["cluster"]) for c, r in replies.items()}
        jacobian = 0.0 if state.scale is None else float(state.scale.log().sum())
        state.client_log_likelihoods = {  # in the user's units: log p(x) = log p(z) - ...
            c: r.tensors["cluster_log_likelihood"].to(config.device, config.dtype) - jacobian
            for c, r in replies.items()
        }
        for c, reply in replies.items():
            counts = reply.tensors["counts"].to(config.device, config.dtype)
            if float(counts.sum()) > 0:
                state.client_weights[c] = counts / counts.sum()
        self._update_cluster_weights(state, replies)
        sizes = [0] * config.n_clusters
        for cluster in state.client_clusters.values():
            sizes[cluster] += 1
        state.cluster_sizes.append(sizes)
        state.cluster_rounds += 1
        for j, size in enumerate(sizes):
            if size == 0:
                state.events.append(
                    {"round": state.cluster_rounds, "cluster": j, "event": "empty: kept"}
                )
        if config.assignment == "summary":
            self._reassign(state, replies)
        changed = sum(int(old.get(c, -2) != j) for c, j in state.client_clusters.items())
        done, lower_bound = self._advance(state, stats, changed)
        metrics = {
            "phase": "cluster_em",
            "mean_log_likelihood": lower_bound,
            "clusters_changed": changed,
            "empty_clusters": sizes.count(0),
        }
        return (None if done else "cluster_em"), metrics

    @property
    def _em_config(self) -> EMConfig:
        return self._em.config

    def _update_cluster_weights(self, state: ClusteredEMState, replies) -> None:
        """Each cluster's pooled weights: its members' counts summed (a cluster without
        members keeps its weights)."""
        config = self.config
        allowed = allowed_components(state.component_clusters, config.n_clusters)
        rows = []
        for j in range(config.n_clusters):
            members = [r for c, r in replies.items() if state.client_clusters[c] == j]
            if not members:
                rows.append(state.cluster_log_weights[j])
                continue
            counts = sum(r.tensors["counts"].to(config.device, config.dtype) for r in members)
            counts = counts.clamp_min(0) + 10 * torch.finfo(config.dtype).eps
            counts = torch.where(allowed[j], counts, torch.zeros_like(counts))
            rows.append(log_normalised(counts))
        state.cluster_log_weights = torch.stack(rows)

    def _reassign(self, state: ClusteredEMState, replies) -> None:
        """FeSEM: k-means on the replying clients' summaries, warm-started from the centres."""
        config = self.config
        clients = sorted(replies)
        if len(clients) < config.n_clusters:
            return
        summaries = torch.stack([summary_of(replies[c].tensors["counts"]) for c in clients]).to(
            state.summary_centers
        )
        generator = torch.Generator().manual_seed(
            derived_seed(config.random_state, 7919 + state.cluster_rounds)
        )
        labels, centers = hellinger_kmeans(
            summaries.cpu(),
            config.n_clusters,
            generator,
            centers_init=state.summary_centers.cpu(),
        )
        state.summary_centers = centers.to(state.summary_centers)
        state.assignment = {c: int(lab) for c, lab in zip(clients, labels.tolist(), strict=True)}

    def _advance(self, state: ClusteredEMState, stats, changed: int) -> tuple[bool, float]:
        lower_bound = float(stats.log_likelihood / stats.n_samples)
        if state.scale is not None:  # log p(x) = log p(z) - sum log scale
            lower_bound -= float(state.scale.log().sum())
        previous = state.lower_bounds[-1] if state.lower_bounds else -math.inf
        state.lower_bounds.append(lower_bound)
        state.n_iter += 1
        state.converged = changed == 0 and abs(lower_bound - previous) < self.config.tol
        return state.converged or state.cluster_rounds >= self.config.max_iter, lower_bound

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        t = {name: value.to(X.device) for name, value in message.tensors.items()}
        floats = {n: v.to(X.dtype) for n, v in t.items() if v.is_floating_point()}
        clusters = t["component_clusters"].long()
        cluster_log_weights = floats["cluster_log_weights"]
        n_clusters = cluster_log_weights.shape[0]
        if X.shape[0] == 0 or not context.terms.releases(X.shape[0]):
            return skipped_reply("cluster_em", context.terms.below_floor)
        log_prob = log_gaussian_prob(
            X, floats["means"], floats["precisions_cholesky"], self.config.covariance_type
        )
        per_row = row_log_likelihoods(log_prob, cluster_log_weights)  # (n, C)
        # every cluster row's score is backed by the rows behind any contrast of the scores;
        # rows that alone would make up a contrast are left out of the scores
        finite = torch.isfinite(per_row).all(0)
        summed = torch.ones(X.shape[0], dtype=torch.bool, device=X.device)
        behind = X.new_zeros(())
        if bool(finite.any()):
            summed, behind = contrast_backed(per_row[:, finite], context.terms.min_rows)
        scores = per_row[summed].mean(0)
        withheld = not bool(backed(behind, context.terms.min_rows))
        cluster = int(torch.argmax(scores))  # the first of tied maxima
        if withheld and "cluster" in context.state:
            # the scores would release a few rows' values: the client keeps its cluster and
            # sends no contrast between clusters (below)
            cluster = int(context.state["cluster"])
        if "assignment" in t and context.client_id < t["assignment"].shape[0]:
            given = int(t["assignment"][context.client_id])
            if 0 <= given < n_clusters:
                cluster = given
        allowed = allowed_components(clusters, n_clusters)[cluster]
        kept = context.state.get("log_weights")
        same = "cluster" in context.state and int(context.state["cluster"]) == cluster
        if kept is not None and "cluster" not in context.state and kept.shape == allowed.shape:
            # the first clustered round: the warm-up's own weights on the allowed components
            own = kept.to(X.dtype).masked_fill(~allowed, -math.inf)
            kept = own - torch.logsumexp(own, 0) if bool(torch.isfinite(own).any()) else None
            same = kept is not None
        if kept is None or not same or kept.shape != allowed.shape:
            kept = cluster_log_weights[cluster]
        context.state["log_weights"] = kept.to(X.dtype)
        em_message = Message(
            "em", {n: floats[n] for n in ("weights", "means", "precisions_cholesky", "shift")}
        )
        reply = self._em.client_step(X, em_message, context)
        masked = context.state["log_weights"].masked_fill(~allowed, -math.inf)
        context.state["log_weights"] = masked - torch.logsumexp(masked, 0)
        context.state["cluster"] = torch.tensor(cluster)
        if reply.scalars.get("skipped"):
            return skipped_reply("cluster_em", str(reply.scalars.get("reason", "")))
        if withheld:  # every cluster row scored as the client's released log-likelihood
            scores = (reply.tensors["log_likelihood"] / X.shape[0]).expand(n_clusters).clone()
            behind = reply.backing["log_likelihood"].reshape(())
        return Message(
            "cluster_em",
            {**reply.tensors, "cluster_log_likelihood": scores},
            {**reply.scalars, "cluster": cluster},
            backing={**reply.backing, "cluster_log_likelihood": behind.expand(n_clusters)},
        )


def _keep_unused(fitted: MixtureParams, previous: MixtureParams, used: Tensor) -> MixtureParams:
    """``fitted`` with the means and precisions of the unused components taken from
    ``previous`` (their weights stay as fitted: ~0)."""
    if bool(used.all()):
        return fitted
    means = torch.where(used.unsqueeze(1), fitted.means, previous.means)
    prec = fitted.precisions_cholesky
    if fitted.covariance_type != "tied":
        shape = (-1,) + (1,) * (prec.ndim - 1)
        prec = torch.where(used.view(shape), prec, previous.precisions_cholesky)
    return MixtureParams(fitted.weights, means, prec, fitted.covariance_type)


def warmup_config(config: ClusteredEMConfig) -> EMConfig:
    """The warm-up's federated EM settings: ``config``'s with every component (K_g + C K_c),
    ``warmup`` rounds and personal weights."""
    names = {f.name for f in dataclasses.fields(config)}
    base = {
        f.name: getattr(config, f.name) for f in dataclasses.fields(EMConfig) if f.name in names
    }
    return EMConfig(
        **{
            **base,
            "n_components": config.total_components,
            "max_iter": config.warmup,
            "mixture_weights": "personal",
        }
    )


class ClusteredEM(ChainedAlgorithm):
    """The clustered additive mixture (see the module docstring).

    ``ClusteredEM(n_components, **settings)`` with the settings of
    :class:`ClusteredEMConfig` (``n_clusters``,
    ``cluster_components``, ``assignment``, ``warmup`` and federated EM's), or
    ``ClusteredEM.from_config(ClusteredEMConfig(...))``.

    Rounds (``ClusteredEM`` chains them; :mod:`fednovelty.federated.core.steps`):

    1. **Warm-up** (``warmup`` rounds): ``[PCA?] + [moments] + init + EM`` on all ``M``
    components with personal weights (FedGMM), every client using every component: the Fed-CAM
    paper's warm-up, which trains before any clustering.
    2. **Clusters form** (server only, no round): k-means (``cluster_kmeans_restarts`` restarts,
    k-means++) on every client's summary, the square roots of its warm-up weights (their
    Euclidean distance is the Hellinger distance of the weight vectors). Each cluster then takes
    the ``K_c`` components its members use most relative to the other clusters
    (:func:`~.mixture_clusters.partition_components`); the remaining ``K_g`` components are
    global. The clustering reads the weights of the whole codebook, so clusters that differ in
    any component are told apart.
    3. **Clustered EM** (kind ``"cluster_em"``, at most ``max_iter`` rounds): the broadcast
    holds the mixture, each component's cluster (-1: global), each cluster's weights (its
    members' rows pooled) and, with ``assignment="summary"``, the server's choice of cluster per
    client id. A client scores its rows under every cluster's mixture (mean log-likelihood per
    row, ``(C,)``, sent: the client-level anomaly score reads it), joins the best cluster
    (``"likelihood"``, IFCA's rule; ties go to the lowest index) or the server's choice
    (``"summary"``), runs the E-step under its personal weights (its warm-up weights on the
    allowed components in the first round; the cluster's weights when it changed cluster) and
    sends the statistics of all ``M`` components (zero outside its allowed ones), its cluster
    and its row count. The server sums the statistics and runs the M-step; a component nobody
    used in the round keeps its parameters. With ``"summary"`` the next round's assignment is
    k-means on the clients' summaries (square roots of their new weights), warm-started from the
    clusters' centres.

    Degenerate cases: ``n_clusters`` above the clients that replied in the warm-up raises by
    name; a cluster no client joined keeps its components (IFCA lets it win clients back;
    FeSEM's k-means re-seeds an empty centre at the summary farthest from its centre) and the
    round's record says so (``ClusteredEMState.events``); a client below its privacy floor skips
    every round (``skipped_reply``) and has no cluster; a component backed by fewer than
    ``min_rows`` effective rows of a client is sent as zeros (federated EM's floor).
    """

    config_class = ClusteredEMConfig

    def __init__(self, n_components: int, **settings: Any) -> None:
        self._setup(ClusteredEMConfig(n_components=n_components, **settings))

    def _setup(self, config: ClusteredEMConfig) -> None:
        super()._setup(config)
        warm_config = warmup_config(config)
        warm = EMStep(warm_config)
        self._chain([*em_steps(warm_config, warm), ClusteredEMStep(config, warm)])

    def new_state(self) -> ClusteredEMState:
        return ClusteredEMState(phase="")
