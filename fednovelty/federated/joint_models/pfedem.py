"""pFedEM (the pFedEM paper, Algorithm 1): K Gaussians and K sub-models, one EM step per
round, a hard partition of each client's rows.

Each round a client computes its rows' posteriors under the broadcast Gaussians and its
kept personal weights or the broadcast ones (Eq. 8-11, ``estep_start``), partitions its
rows by their most likely Gaussian, trains sub-model ``k`` on partition ``k`` alone from
the broadcast weights, and sends the sub-models, the hard counts and, by
``gaussian_aggregation``, its own means and variances (``"paper"``, Eq. 9-10) or the summed
statistics of its rows (``"exact"``). The server averages each sub-model weighted by the
hard counts or the clients' row shares (Eq. 5, ``submodel_weights``; trimmed under
``aggregation="trimmed"``) and sets the Gaussians by Eq. 12-14 (``"paper"``) or federated
EM's exact M-step (``"exact"``). :class:`PFedEM` states the round and the paper's settings
(``PAPER_ALGORITHM``); the first round starts from federated EM's initialisation.

Inference (Eq. 15, :func:`pfedem_predict_proba`): ``P(y | x) = sum_k pi_k P_k(y | x)``.
Clients enforce their privacy floor: below ``min_rows`` rows they skip; a component whose
partition or whose responsibilities (Kish's effective rows) hold fewer than ``min_rows`` rows
is sent as zeros and its sub-model as broadcast. Under differential privacy (``dp_mode`` with
``bounds``, and the client's own ``PrivacyPolicy.dp``) the reply leaves as the exact
aggregation's summed statistics, the hard counts as a histogram and the sub-models trained
by the client's DP-SGD with the one-hot partition as weight (``"paper"`` aggregation has no
sensitivity bound and is refused); the server averages sub-models without exact per-client
weights and sums the hard counts with its own noise in ``"central"`` mode
(``docs/differential_privacy.md``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fednovelty.federated.bayesian.vb_settings import BoxSettings
from fednovelty.federated.core.aggregate import learner_name, stats_message
from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    client_generator,
    round_seed,
    skipped_reply,
)
from fednovelty.federated.core.config import settings_dataclass
from fednovelty.federated.core.declarations import declare, stats_reply
from fednovelty.federated.core.learners import ClientRound, SGDTask
from fednovelty.federated.init.moments import MomentsStep
from fednovelty.federated.init.settings import GivenMixture
from fednovelty.federated.joint_models.joint import (
    JointEMStep,
    JointFedGMM,
    JointLearners,
    JointState,
    histogram_sum,
)
from fednovelty.federated.joint_models.joint_scores import learner_log_probs
from fednovelty.federated.joint_models.pfedem_backbone import (
    GAUSSIAN_FEATURES,
    backbone_features,
    backbone_width,
    check_backbone_settings,
)
from fednovelty.federated.mixtures.em import EMSettings
from fednovelty.federated.trust.backing import backed, effective_rows, stats_backing
from fednovelty.federated.trust.reply_form import Shape, covariance_shape, expectation
from fednovelty.federated.trust.robust import robust_average_learners, robust_stats
from fednovelty.federated.trust.value_checks import check_counts_within, check_stats
from fednovelty.mixture import (
    MixtureParams,
    SufficientStats,
    log_gaussian_prob,
    params_from_stats,
    stats_from_resp,
)
from fednovelty.mixture.em import moment_shift

__all__ = [
    "ESTEP_STARTS",
    "GAUSSIAN_AGGREGATIONS",
    "PAPER_ALGORITHM",
    "PFEDEM_KIND",
    "SUBMODEL_WEIGHTS",
    "PFedEM",
    "PFedEMConfig",
    "PFedEMStep",
    "learner_weights",
    "paper_gaussians",
    "pfedem_predict_proba",
]

PFEDEM_KIND = "pfedem"
#: How pFedEM's server combines the clients' Gaussians (``PFedEMConfig``).
GAUSSIAN_AGGREGATIONS: tuple[str, ...] = ("paper", "exact")
#: Which mixture weights a client's E-step starts from (``PFedEMConfig.estep_start``).
ESTEP_STARTS: tuple[str, ...] = ("kept", "broadcast")
#: What the server weights each client's sub-models by (``PFedEMConfig.submodel_weights``).
SUBMODEL_WEIGHTS: tuple[str, ...] = ("counts", "clients")
#: The pFedEM paper's algorithm as written: Algorithm 1 line 5 (every round's E-step from
#: the broadcast parameters), Eq. 5 with ``p_i = |D_i| / sum_j |D_j|`` and Eq. 12-14;
#: ``PFedEM(K, n_classes, **PAPER_ALGORITHM)`` (JSON-able settings).
PAPER_ALGORITHM: dict[str, str] = {
    "estep_start": "broadcast",
    "submodel_weights": "clients",
    "gaussian_aggregation": "paper",
}


@settings_dataclass
class PFedEMConfig(EMSettings, GivenMixture, BoxSettings, JointLearners):
    """Settings of pFedEM (``PFedEM``; the pFedEM paper's Algorithm 1): federated EM's chain
    (:class:`~fednovelty.federated.mixtures.em.EMSettings`, plain M-steps: no moments round) with
    given initial parameters, a public box ``bounds``
    (:class:`~fednovelty.federated.bayesian.vb_settings.BoxSettings`: the rounds work in
    ``[-1, 1]`` per feature, what differential privacy clips around), the learners
    (:class:`~fednovelty.federated.joint_models.joint.JointLearners`, one sub-model per
    Gaussian: ``n_learners`` is ``n_components``), and

    Attributes:
        gaussian_aggregation: ``"paper"`` (Eq. 12-14: each client's means and variances
            from its own E-step, averaged with its hard counts; ``covariance_type="diag"``)
            or ``"exact"`` (summed soft statistics, federated EM's exact M-step).
        estep_start: the mixture weights of a client's E-step (Eq. 8); the Gaussians and
            the sub-models always start from the broadcast. ``"kept"`` (default): its own
            weights ``pi_i`` of Eq. 11 from the last round it took part in, kept in its
            state (the broadcast weights in its first round, and under differential
            privacy, where weights from exact counts would carry a row into later
            releases); ``"broadcast"``: Algorithm 1 line 5, ``theta_ik <- theta_k``: the
            broadcast global weights ``pi_k`` (Eq. 14) every round. Eq. 11's weights are
            still computed and kept either way.
        submodel_weights: the weight of client ``i``'s copy of sub-model ``k`` in the
            server's average. ``"counts"`` (default): its hard count ``|D_ik|`` (Eq. 6's
            weighting; a client whose partition ``k`` is empty has no say on sub-model
            ``k``); ``"clients"``: Eq. 5's ``p_i = |D_i| / sum_j |D_j|``, its whole row count
            (``n_samples``), the same for every ``k``: a client that did not train
            sub-model ``k`` sends it as broadcast, a zero update with weight ``p_i``. The
            sum runs over the clients that replied (Eq. 5's sum over all clients, as the
            paper's experiments, with full participation). Both go through
            :func:`~fednovelty.federated.trust.robust.robust_average_learners` (under a robust
            ``aggregation`` a positive weight only admits a copy); under ``"central"``
            differential privacy both are uniform, under ``"local"``/``"distributed"`` the
            noisy counts or noisy row counts (:func:`learner_weights`).
        gaussian_features: what the Gaussians model (Eq. 8-11): ``"input"`` (default), the
            rows ``X`` the chain hands them, or ``"backbone"``, the paper's ``z = f(x)``
            (:mod:`~fednovelty.federated.joint_models.pfedem_backbone` says how, and what
            it needs and refuses).
        covariance_type: ``"diag"`` by default (the paper's per-feature variances).
        mixture_weights: ``"personal"`` by default.

    Raises:
        ValueError: ``n_learners`` other than ``n_components``; ``"paper"`` aggregation with
            another covariance type, or with ``dp_mode`` (the clients' own means and
            variances have no sensitivity bound); ``dp_mode`` without ``bounds``;
            ``bounds`` with ``pca_components``; ``gaussian_features="backbone"`` with what
            it refuses (:func:`~fednovelty.federated.joint_models.pfedem_backbone.
            check_backbone_settings`).
    """

    n_learners: int = 0
    covariance_type: str = "diag"
    mixture_weights: str = "personal"
    gaussian_aggregation: str = "paper"
    estep_start: str = "kept"
    submodel_weights: str = "counts"
    gaussian_features: str = "input"

    def __post_init__(self) -> None:
        if int(self.n_learners) == 0:
            self._set("n_learners", int(self.n_components))
        super().__post_init__()
        if self.n_learners != self.n_components:
            raise ValueError(
                f"pFedEM trains one sub-model per Gaussian: n_learners must equal n_components "
                f"({self.n_components}); got {self.n_learners}."
            )
        self._check_choice("gaussian_aggregation", GAUSSIAN_AGGREGATIONS)
        self._check_choice("estep_start", ESTEP_STARTS)
        self._check_choice("submodel_weights", SUBMODEL_WEIGHTS)
        self._check_choice("gaussian_features", GAUSSIAN_FEATURES)
        if self.gaussian_features == "backbone":
            check_backbone_settings(self)
        if self.gaussian_aggregation == "paper" and self.covariance_type != "diag":
            raise ValueError(
                "gaussian_aggregation='paper' averages the clients' per-feature variances "
                "(Eq. 13): use covariance_type='diag', or gaussian_aggregation='exact'."
            )
        if self.private and self.gaussian_aggregation == "paper":
            raise ValueError(
                "gaussian_aggregation='paper' sends each client's own means and variances "
                "(Eq. 9-10), which have no sensitivity bound and no private form: use "
                "gaussian_aggregation='exact' (summed statistics) with dp_mode set "
                "(dp_epsilon on the detector)."
            )
        if self.private and self.bounds is None:
            raise ValueError(
                "differential privacy clips rows around the centre of a public box: give "
                "bounds=(low, high) (one value per feature each) with dp_mode set."
            )
        if self.bounds is not None and self.pca_components is not None:
            raise ValueError(
                "pFedEM maps the raw rows to the public box bounds; use bounds with "
                "pca_components=None."
            )


def paper_gaussians(
    hard_counts: Tensor, means: Tensor, variances: Tensor, reg_covar: float
) -> MixtureParams:
    """Eq. 12-14: (n_clients, K) hard counts, (n_clients, K, d) client means and variances
    -> the global diagonal mixture (components no client's partition held keep weight 0 and
    get the unweighted mean of the clients' values)."""
    total = hard_counts.sum(0)  # (K,)
    safe = total.clamp_min(torch.finfo(hard_counts.dtype).tiny)
    share = torch.where(total > 0, hard_counts / safe, 1.0 / hard_counts.shape[0])
    mu = (share.unsqueeze(2) * means).sum(0)
    var = (share.unsqueeze(2) * variances).sum(0) + reg_covar
    weights = total / total.sum()
    return MixtureParams.from_covariances(weights, mu, var, "diag")


def paper_stats(hard_counts: Tensor, replies: dict[str, Tensor]) -> dict[int, SufficientStats]:
    """The paper's replies read as per-client diagonal statistics about 0: counts the hard
    counts (n_clients, K), sums ``counts * client_means`` and second moments ``counts *
    (client_vars + client_means^2)`` (n_clients, K, d), with each client's
    ``log_likelihood`` and ``n_samples`` (n_clients,) from ``replies``; what
    :func:`~fednovelty.federated.trust.robust.robust_stats` combines under a robust
    ``aggregation`` (a component's between-client spread then counts, unlike Eq. 13)."""
    means, variances = replies["client_means"], replies["client_vars"]
    weight = hard_counts.unsqueeze(2)
    return {
        c: SufficientStats(
            counts=hard_counts[c],
            sums=weight[c] * means[c],
            second=weight[c] * (variances[c] + means[c].square()),
            shift=means.new_zeros(means.shape[2]),
            log_likelihood=replies["log_likelihood"][c],
            n_samples=replies["n_samples"][c],
            covariance_type="diag",
        )
        for c in range(hard_counts.shape[0])
    }


def pfedem_predict_proba(
    template: nn.Module, learners: list[dict[str, Tensor]], Z: Tensor, weights: Tensor
) -> Tensor:
    """Eq. 15: ``sum_k pi_k P_k(y | z)``, (n, n_classes), for rows ``Z`` and weights (K,)."""
    probs = learner_log_probs(template, learners, Z).exp()  # (n, K, n_classes)
    return (weights.to(probs).view(1, -1, 1) * probs).sum(1)


def pfedem_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A pFedEM reply: hard counts (K,), the log-likelihood sum and the row count; with
    ``exact`` Gaussian aggregation the statistics, else per-component client means and
    variances (K, d); the learners it trained have the broadcast's shapes."""
    k = int(broadcast.tensors["means"].shape[0])
    shapes: dict[str, Shape] = {"hard_counts": (k,), "log_likelihood": (), "n_samples": ()}
    if expectation(broadcast, "gaussian_aggregation") == "exact":
        ct = str(expectation(broadcast, "covariance_type"))
        shapes.update(counts=(k,), sums=(k, d), second=covariance_shape(ct, k, d))
    else:
        shapes.update(client_means=(k, d), client_vars=(k, d))
    return shapes


def check_pfedem(reply: Message, broadcast: Message) -> None:
    """Hard counts within the rows; statistics, where sent, those of some rows."""
    check_counts_within(reply, "hard_counts", "hard counts")
    if "sums" in reply.tensors:
        check_stats(reply, broadcast)


#: a ``pfedem`` reply (:func:`pfedem_shapes`); exact statistics lie in the client's box.
#: Under differential privacy: the exact statistics (``"stats"``), the hard counts as a
#: histogram and the sub-models by DP-SGD; the paper's means and variances have no private
#: form, so the client gate refuses a reply that holds them.
PFEDEM_REPLY = stats_reply(
    PFEDEM_KIND,
    pfedem_shapes,
    (check_pfedem,),
    {
        "hard_counts": "components",
        "client_means": "components",
        "client_vars": "components",
        "learner.": "model",
    },
    private="stats",
    private_parts={"hard_counts": "histogram", "learner.": "dp_sgd"},
)


class PFedEMStep(JointEMStep):
    """pFedEM's rounds (module docstring); the learners start as the joint model's."""

    kinds = (PFEDEM_KIND,)
    replies = declare(PFEDEM_REPLY)

    def configure(self, state: JointState) -> Message:
        tensors = {**state.params.tensors(), "shift": moment_shift(state.params)}
        for k, learner in enumerate(state.learners):
            tensors.update({learner_name(k, name): v for name, v in learner.items()})
        return Message(
            PFEDEM_KIND,
            tensors,
            {"seed": round_seed(self.config, state)},
            expect={
                "covariance_type": self.config.covariance_type,
                "gaussian_aggregation": self.config.gaussian_aggregation,
            },
        )

    # ------------------------------------------------------------------ server half
    def server_step(
        self, state: JointState, replies: dict[int, Message]
    ) -> tuple[str | None, dict]:
        config = self.config
        hard = torch.stack([r.tensors["hard_counts"] for r in replies.values()]).to(
            config.device, config.dtype
        )
        rows = None
        if config.submodel_weights == "clients":
            rows = torch.stack([r.tensors["n_samples"] for r in replies.values()])
            rows = rows.to(config.device, config.dtype)
        state.learners = robust_average_learners(
            state.learners,
            list(replies.values()),
            learner_weights(hard, config.dp_mode, rows),
            config.aggregation,
            config.trim,
        )
        # a trusted server's clients send exact counts ("central"): their weights would
        # leave the fit outside its guarantee, so only noisy ones are kept
        for cid, counts in zip(replies, hard, strict=True) if config.dp_mode != "central" else ():
            if config.private:  # noisy counts: positive by post-processing
                counts = counts.clamp_min(1e-6 * float(counts.abs().sum()) + 1e-300)
            if float(counts.sum()) > 0:
                state.client_weights[cid] = counts / counts.sum()
                state.client_joint_weights[cid] = torch.diag(state.client_weights[cid])
        if config.gaussian_aggregation == "exact":
            stats = self.gaussian.m_step(state, replies)
        else:
            t = {
                name: torch.stack([r.tensors[name] for r in replies.values()]).to(
                    config.device, config.dtype
                )
                for name in ("client_means", "client_vars", "log_likelihood", "n_samples")
            }
            if config.aggregation == "sum":
                state.params = paper_gaussians(
                    hard, t["client_means"], t["client_vars"], config.reg_covar
                )
            else:
                per_client = paper_stats(hard, t)
                combined = robust_stats(per_client, config.trim)
                state.params = params_from_stats(combined, config.reg_covar)
            stats = _totals(t["log_likelihood"].sum(), t["n_samples"].sum(), state.params)
        state.joint_counts = torch.diag(histogram_sum(hard, config, state.rounds))
        done, lower_bound = self.gaussian.advance(state, stats)
        metrics = {"phase": PFEDEM_KIND}
        if not math.isnan(lower_bound):  # under DP the log-likelihood is withheld
            metrics["mean_log_likelihood"] = lower_bound
        return (None if done else PFEDEM_KIND), metrics

    # ------------------------------------------------------------------ client half
    def gaussian_rows(self, X: Tensor, Z: Tensor, broadcast: Message) -> Tensor:
        """With ``gaussian_features="backbone"`` the rows ``Z`` (n, p) through the broadcast
        sub-model 0's backbone, (n, width); else ``X``."""
        if self.config.gaussian_features == "input":
            return X
        template = self.algorithm._shared_template(Z.shape[1])
        names = [name for name, _ in template.named_parameters()]
        params = {name: broadcast.tensors[learner_name(0, name)] for name in names}
        return backbone_features(template, params, Z)

    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        """One client's pFedEM round: Eq. 8-11, the hard partition, each backed
        sub-model's training on its partition (yielded as
        :class:`~fednovelty.federated.core.learners.SGDTask` objects, batched with the other
        clients' by :meth:`JointEMStep.client_steps`; its own DP-SGD under DP), its reply."""
        X, y, Z = data
        X = self.gaussian_rows(X, Z, message)
        config, algorithm = self.config, self.algorithm
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        k = t["means"].shape[0]
        template = algorithm._shared_template(Z.shape[1])
        names = [name for name, _ in template.named_parameters()]
        learners = [{name: t[learner_name(j, name)] for name in names} for j in range(k)]
        # under DP weights kept from exact counts would carry a row into later rounds
        kept = config.estep_start == "kept" and context.terms.private is None
        log_pi = context.state.get("log_weights") if kept else None
        if log_pi is None:  # Algorithm 1 line 5: the broadcast global weights
            log_pi = t["weights"].log()
        n = X.shape[0]
        log_n = log_gaussian_prob(X, t["means"], t["precisions_cholesky"], config.covariance_type)
        joint = log_n + log_pi
        log_norm = torch.logsumexp(joint, dim=1)
        gamma = (joint - log_norm.unsqueeze(1)).exp()  # Eq. 8, (n, K)
        soft = gamma.sum(0)
        if n > 0:
            eps = 10 * torch.finfo(X.dtype).eps
            context.state["log_weights"] = ((soft + eps) / (n + eps * k)).log()  # Eq. 11
        part = gamma.argmax(1) if n > 0 else torch.zeros(0, dtype=torch.long, device=X.device)
        hard = torch.bincount(part, minlength=k).to(X.dtype)
        terms = context.terms
        if not terms.releases(n):
            return skipped_reply(PFEDEM_KIND, terms.below_floor)
        private = terms.private is not None
        if private and config.gaussian_aggregation == "paper":
            return skipped_reply(
                PFEDEM_KIND,
                "the paper's per-client means and variances have no private form; under "
                "differential privacy only gaussian_aggregation='exact' is released",
            )
        if private and terms.private.dp_sgd is None:
            return skipped_reply(PFEDEM_KIND, "sub-models leave under DP only by DP-SGD")
        # a component is backed by its partition's rows and by its responsibilities'
        # effective rows (a wide component's few far rows can carry most of its sums);
        # under DP the noise protects the rows and no component is zeroed (which ones
        # would be depends on them)
        rows = torch.minimum(hard, effective_rows(soft, gamma.square().sum(0)))
        keep = torch.ones_like(hard, dtype=torch.bool) if private else backed(rows, terms.floor)
        behind = dict.fromkeys(("hard_counts", "counts", "sums", "client_means"), rows)
        behind.update(client_vars=rows, log_likelihood=rows.new_tensor(float(n)))
        tensors: dict[str, Tensor] = {"hard_counts": hard * keep.to(X.dtype)}
        scalars = {}
        if private:  # every sub-model by the client's own DP-SGD, on its partition alone
            one_model = nn.functional.one_hot(part, k).to(X.dtype)  # (n, K): one row, one model
            models, scalars = self.private_learners(template, learners, Z, y, one_model, context)
        else:
            generator = client_generator(int(message.scalars["seed"]), context.client_id)
            trained = iter(
                (
                    yield [
                        partition_task(params, Z, y, part == j, generator)
                        for j, params in enumerate(learners)
                        if bool(keep[j])
                    ]
                )
            )
            models = [next(trained) if bool(keep[j]) else p for j, p in enumerate(learners)]
        for j, trained in enumerate(models):
            tensors.update({learner_name(j, name): v.clone() for name, v in trained.items()})
            # an unbacked component's learner goes back as broadcast: none of the rows
            behind.update(
                dict.fromkeys(
                    (learner_name(j, name) for name in trained),
                    rows[j] if bool(keep[j]) else rows.new_tensor(math.inf),
                )
            )
        resp = gamma * keep.to(X.dtype)
        tensors["log_likelihood"] = log_norm.sum()
        tensors["n_samples"] = torch.tensor(float(n), dtype=X.dtype, device=X.device)
        if config.gaussian_aggregation == "exact":
            stats = stats_from_resp(X, resp, config.covariance_type, t["shift"])
            stats = replace(stats, log_likelihood=log_norm.sum())
            tensors.update(stats_message(stats, PFEDEM_KIND).tensors)
            tied_rows = rows[keep].min() if bool(keep.any()) else rows.new_zeros(())
            behind.update(stats_backing(stats, rows, tied_rows))
        else:  # Eq. 9-10 on the client's rows, zeros for components it does not release
            weight = soft.unsqueeze(1)  # a component with no responsibility sends zeros
            safe = weight.clamp_min(torch.finfo(X.dtype).tiny)
            means = torch.where(weight > 0, gamma.T @ X / safe, 0.0)
            variances = torch.where(weight > 0, gamma.T @ X.square() / safe - means.square(), 0.0)
            mask = keep.to(X.dtype).unsqueeze(1)
            tensors["client_means"] = means * mask
            tensors["client_vars"] = variances.clamp_min(0) * mask
        behind["n_samples"] = rows.new_tensor(float(n))
        return Message(PFEDEM_KIND, tensors, scalars, backing={k: behind[k] for k in tensors})


def partition_task(
    params: dict[str, Tensor], Z: Tensor, y: Tensor, members: Tensor, generator: torch.Generator
) -> SGDTask:
    """A sub-model's training from ``params`` on the rows ``members`` (n,) bool of ``Z``
    (n, n_learner_features) and ``y`` (n,), each of weight 1."""
    ones = torch.ones(int(members.sum()), dtype=Z.dtype, device=Z.device)
    return SGDTask(params, Z[members], y[members], ones, generator)


def learner_weights(hard_counts: Tensor, dp_mode: str | None, rows: Tensor | None = None) -> Tensor:
    """The weights (n_replies, K) the server averages the sub-models with: the hard counts
    (n_replies, K) ``|D_ik|`` (``submodel_weights="counts"``), or with ``rows``
    (n_replies,), each client's row count ``|D_i|`` for every sub-model (``"clients"``:
    Eq. 5's ``p_i`` once the average divides by their sum); under ``"central"`` DP, where
    the clients send exact counts, uniform (weights from them would leave the fit outside
    its guarantee); under ``"local"`` or ``"distributed"`` DP the noisy values floored at 0
    (post-processing: a copy whose count the noise made negative gets no weight)."""
    weights = hard_counts if rows is None else rows.unsqueeze(1).expand_as(hard_counts)
    if dp_mode is None:
        return weights
    if dp_mode == "central":
        return torch.ones_like(weights)
    return weights.clamp_min(0)


def _totals(log_likelihood: Tensor, n_samples: Tensor, params: MixtureParams) -> SufficientStats:
    """Statistics that carry only a round's summed log-likelihood and rows (what
    ``EMStep.advance`` reads) for the paper's aggregation, which has no summed moments."""
    k, d = params.means.shape
    zeros = torch.zeros(k, d, dtype=params.means.dtype, device=params.means.device)
    return SufficientStats(
        counts=zeros[:, 0],
        sums=zeros,
        second=zeros,
        shift=zeros[0],
        log_likelihood=log_likelihood,
        n_samples=n_samples,
        covariance_type="diag",
    )


class PFedEM(JointFedGMM):
    """pFedEM (see the module docstring): ``PFedEM(n_components, n_classes, **settings)``
    with the settings of :class:`PFedEMConfig`; the joint model's chain ending in
    :class:`PFedEMStep`.

    Each round, on client ``i`` (with ``estep_start="kept"`` its personal weights ``pi_i``
    kept in its state, the global weights when it has none; with ``"broadcast"``, Algorithm
    1 line 5, the global weights every round):

    - Eq. 8: posteriors ``gamma_ik(z) ∝ pi_ik N(z; mu_k, sigma_k)`` of its rows under the
      broadcast Gaussians; Eq. 9-11: its own means, variances (per feature) and weights from
      them;
    - the rows are partitioned by their most likely Gaussian, ``D_ik``, and sub-model ``k`` is
      trained from the broadcast weights on ``D_ik`` alone (``local_epochs`` of SGD or Adam);
    - it sends the sub-models, the hard counts ``|D_ik|`` and, by ``gaussian_aggregation``:
      ``"paper"``: its means and variances (Eq. 9-10); ``"exact"``: the summed statistics of its
      rows under ``gamma`` about the broadcast shift.

    The server averages each sub-model over the clients weighted by ``|D_ik|``
    (``submodel_weights="counts"``) or by Eq. 5's ``p_i = |D_i| / sum_j |D_j|``
    (``"clients"``; under
    ``aggregation="trimmed"``, the coordinate-wise trimmed mean of the copies of the clients
    whose partition held the component, and the Gaussians by
    :func:`~fednovelty.federated.trust.robust.robust_stats`, the paper's replies read as statistics:
    :func:`paper_stats`) and sets the Gaussians: ``"paper"``: Eq. 12-14, means and variances
    averaged with the hard counts (the between-client spread of each component is dropped, as
    written); ``"exact"``: federated EM's M-step on the summed statistics (the pooled rows'
    M-step). The first round starts from federated EM's initialisation (``init_params``, k-means
    by default) and sub-models from ``learner_factory`` under ``random_state``.

    With ``bounds`` the Gaussians' rounds work in the public box's units (``[-1, 1]`` per
    feature; the sub-models keep seeing the raw rows) and the mixture is mapped back at the
    end; differential privacy (``dp_mode``) needs it and ``gaussian_aggregation="exact"``
    (module docstring).

    The paper's algorithm as written is ``PFedEM(K, n_classes, **PAPER_ALGORITHM)``
    (``estep_start="broadcast"``, ``submodel_weights="clients"``,
    ``gaussian_aggregation="paper"``). The paper's Gaussians model backbone features ``z =
    f(x)`` of the network being trained; here they model the client's rows ``X`` (after
    ``pca_components`` or ``bounds``), the sub-models ``Z``; with
    ``gaussian_features="backbone"`` they model ``f(Z)``, sub-model 0's backbone features
    (:class:`PFedEMConfig`, ``docs/papers/pfedem.md``).
    """

    config_class = PFedEMConfig
    em_step: ClassVar[type[JointEMStep]] = PFedEMStep

    def __init__(self, n_components: int, n_classes: int, **settings: Any):
        self._setup(PFedEMConfig(n_components=n_components, n_classes=n_classes, **settings))

    def _setup(self, config: PFedEMConfig) -> None:
        super()._setup(config)
        if config.bounds is not None:  # the public box first: a moments step without a round
            self._chain([MomentsStep(config), *self.steps])
        self._start_backbone: dict[str, Tensor] | None = None

    def split_data(self, data: Any) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The joint model's split; with ``gaussian_features="backbone"`` the Gaussians' rows
        are ``Z`` through the initial sub-model 0's backbone (what federated EM's
        initialisation sees; the EM rounds map ``Z`` through the broadcast one,
        :meth:`PFedEMStep.gaussian_rows`)."""
        X, (y, Z) = super().split_data(data)
        if self.config.gaussian_features == "input":
            return X, (y, Z)
        if self._start_backbone is None:  # what the server starts from (JointEMStep.begin)
            config = self.config
            start = config.learners_init or self._initial_learners(config.n_learner_features)
            self._start_backbone = dict(start[0])
        template = self._shared_template(Z.shape[1])
        return backbone_features(template, self._start_backbone, Z), (y, Z)

    def configure(self, state: JointState) -> Message:
        """The chain's broadcast; with ``gaussian_features="backbone"`` it declares the
        backbone's width as the rows' (``expect["n_features"]``: the replies' ``d``)."""
        message = super().configure(state)
        if self.config.gaussian_features == "backbone":
            width = backbone_width(self._shared_template(self.config.n_learner_features))
            message.expect["n_features"] = width
        return message
