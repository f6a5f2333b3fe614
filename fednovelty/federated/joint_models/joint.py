"""FedGMM's joint model (FedGMM paper, Sections 2-3, Algorithm 1) (algorithm layer).

Each client models ``p_c(x, y) = sum_{m1, m2} pi_c(m1, m2) N(x; mu_m1, Sigma_m1) P_theta_m2(y | x)``
with ``M1`` shared Gaussians, ``M2`` shared conditional models (*learners*, torch modules) and
personal weights ``pi_c`` of shape (M1, M2), estimated and used by the client. They are not
private: every round the client sends its joint counts ``n_c * pi_c`` (with its row count),
from which the server computes ``pi_c`` (``JointState.client_joint_weights``).

``JointFedGMM`` is federated EM's chain (:func:`~fednovelty.federated.mixtures.em.em_steps`: PCA,
moments, initialisation) ending in :class:`JointEMStep`: each round the clients run the
joint E-step, send the Gaussians' statistics (combined by federated EM's exact M-step) and
their learners trained on the responsibility-weighted cross-entropy (averaged by those
weights, or trimmed); the round is stated on :class:`JointFedGMM`. A Gaussian, a cell of
the joint counts or a learner backed by fewer than ``min_rows`` effective rows of a client
is not released (``docs/privacy.md``).

Special cases: ``M1 = 1`` is FedEM (Marfoq et al. 2021); ``M1 = M2 = 1`` is FedAvg. The
FedGMM paper's Table 2 baselines are configurations of this one algorithm
(``PFL_METHODS``, :func:`pfl_algorithm`). Client data is a pair ``(X, y)``, or a triple
``(X, y, Z)`` when the learners see other features ``Z`` (n_c, n_learner_features) of the
same rows than the Gaussians. Scoring and adaptation are pure functions of a trained
``JointState`` (:mod:`fednovelty.federated.joint_models.joint_scores`, re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fednovelty.federated.core.aggregate import learner_name, learners_tensors, stats_message
from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    Scalar,
    client_generator,
    round_seed,
    skipped_reply,
)
from fednovelty.federated.core.config import (
    TorchSettings,
    as_tensor,
    at_least,
    optional_count,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import declare, stats_reply
from fednovelty.federated.core.label_tasks import LabelTask
from fednovelty.federated.core.learners import (
    OPTIMIZERS,
    ClientRound,
    LearnerFactory,
    LearnerRounds,
    SGDTask,
    as_learner,
    initial_parameters,
    learner_template,
    linear_learner,
    local_sgd_many,
    mlp_learner,
)
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.joint_models.joint_scores import (
    adapt_joint_weights,
    global_log_joint_weights,
    joint_log_components,
    joint_log_scores,
    learner_log_probs,
)
from fednovelty.federated.mixtures.em import EMConfig, EMState, EMStep, em_steps
from fednovelty.federated.trust.backing import backed, joint_rows, resp_rows, stats_backing
from fednovelty.federated.trust.dp import server_noise
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE, private_sgd
from fednovelty.federated.trust.noise import add_gaussian
from fednovelty.federated.trust.reply_form import Shape, learner_count, stats_shapes
from fednovelty.federated.trust.robust import robust_average_learners
from fednovelty.federated.trust.value_checks import check_stats
from fednovelty.mixture import log_gaussian_prob, stats_from_resp
from fednovelty.mixture.em import moment_shift


@settings_dataclass
class JointLearners(TorchSettings):
    """The conditional models ``p(y | x, m2)`` of a joint model and their local training.

    Attributes:
        n_learners: M2 conditional models (>= 1).
        n_classes: number of label classes, labels 0..n_classes-1 (>= 2).
        learner_factory: ``(n_features, n_classes) -> nn.Module`` (JSON: ``"learner"``,
            ``"linear"``, ``"mlp"`` or ``"cnn"``); default multinomial logistic regression.
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
    """

    JSON_NAMES: ClassVar[dict[str, str]] = {"learner_factory": "learner"}

    n_learners: int
    n_classes: int
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
        if int(self.n_learners) < 1 or int(self.n_classes) < 2:
            raise ValueError(
                f"need n_learners >= 1 and n_classes >= 2; got n_learners={self.n_learners}, "
                f"n_classes={self.n_classes}."
            )
        self._set("n_learners", int(self.n_learners))
        self._set("n_classes", int(self.n_classes))
        if self.learners_init is not None:
            learners = list(self.learners_init)
            if len(learners) != self.n_learners or not all(
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
                    {k: as_tensor(v, self.dtype, self.device) for k, v in p.items()}
                    for p in learners
                ),
            )
        self._check_choice("optimizer", tuple(OPTIMIZERS))
        self._set("learner_factory", as_learner(self.learner_factory))
        self._set("local_epochs", int(at_least("local_epochs", self.local_epochs, 0)))
        self._set("learning_rate", float(at_least("learning_rate", self.learning_rate, 0)))
        self._set("batch_size", int(at_least("batch_size", self.batch_size, 1)))
        self._set("mu_prox", float(at_least("mu_prox", self.mu_prox, 0)))
        self._set("aggregate_learners", bool(self.aggregate_learners))
        self._set(
            "n_learner_features", optional_count("n_learner_features", self.n_learner_features)
        )


@settings_dataclass
class JointConfig(EMConfig, JointLearners):
    """Settings of FedGMM's joint model (``JointFedGMM``): federated EM's
    (:class:`~fednovelty.federated.mixtures.em.EMConfig`; ``mixture_weights`` defaults to
    ``"personal"``) and the learners' (:class:`JointLearners`)."""

    mixture_weights: str = "personal"


@dataclass
class JointState(EMState):
    """``EMState`` plus the learners' weights and the summed joint responsibilities.

    Attributes:
        learners: one dict of parameter tensors per learner (M2 entries).
        joint_counts: ``sum_c gamma_c(m1, m2)`` of the last round, (M1, M2).
        client_joint_weights: each client's ``pi_c`` of the last round, (M1, M2).
    """

    learners: list[dict[str, Tensor]] = field(default_factory=list)
    joint_counts: Tensor | None = None
    client_joint_weights: dict[int, Tensor] = field(default_factory=dict)


def unpack_client_data(data) -> tuple[Tensor, Tensor, Tensor]:
    """``(X, y)`` or ``(X, y, Z)`` -> ``(X, y, Z)`` with ``Z = X`` when absent."""
    if not isinstance(data, tuple | list) or len(data) not in (2, 3):
        raise ValueError(
            f"JointFedGMM clients hold (X, y) or (X, y, Z) tuples; got {type(data).__name__}."
        )
    X, y = data[0], data[1]
    Z = data[2] if len(data) == 3 else X
    if y.shape[0] != X.shape[0] or Z.shape[0] != X.shape[0]:
        raise ValueError(
            f"client data rows disagree: X has {X.shape[0]}, y {y.shape[0]}, Z {Z.shape[0]}."
        )
    return X, y, Z


def joint_em_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A joint EM reply: federated EM's statistics and the joint counts (K, n_learners);
    the learners it trained have the broadcast's shapes."""
    k = int(broadcast.tensors["means"].shape[0])
    return {**stats_shapes(broadcast, d), "joint_counts": (k, learner_count(broadcast))}


#: a ``joint_em`` reply: statistics (in the client's box), joint counts and the learners
#: (``learner.{m}.*``, backed as models); learner SGD runs on one thread.
JOINT_EM_REPLY = stats_reply(
    "joint_em",
    joint_em_shapes,
    (check_stats,),
    {"joint_counts": "components", "learner.": "model"},
    serial=True,
    covariance=True,
    private="stats",
    private_parts={"joint_counts": "histogram", "learner.": "dp_sgd"},
)


def histogram_sum(histograms: Tensor, config: Any, rounds: int) -> Tensor:
    """The summed histograms of responsibilities (e.g. joint counts) of the replies
    ``histograms`` (n_replies, ...) -> (...), in ``config``'s dtype and device: under
    ``"central"`` DP (``config.dp_mode``) with the trusted server's histogram noise
    (``HISTOGRAM_SHARE * dp_noise_multiplier``, drawn from fresh OS entropy: never from
    ``random_state``),
    and under any DP kept positive (post-processing)."""
    total = histograms.sum(0).to(config.device, config.dtype)
    if not config.private:
        return total
    if config.dp_mode == "central":
        spread = HISTOGRAM_SHARE * config.dp_noise_multiplier
        total = add_gaussian(total, spread, server_noise(config, rounds, 1))
    return total.clamp_min(1e-6 * float(total.abs().sum()) + 1e-300)


class JointEMStep(LearnerRounds, Step):
    """The joint EM rounds (module docstring): the joint E-step and learner training on the
    client; federated EM's Gaussian M-step plus learner averaging on the server.

    Args:
        algorithm: the ``JointFedGMM`` whose learners it trains (its ``_template``,
            ``_initial_learners`` and ``_local_sgd``).
    """

    kinds = ("joint_em",)
    replies = declare(JOINT_EM_REPLY)
    labelled = True

    def __init__(self, algorithm: JointFedGMM) -> None:
        self.algorithm = algorithm
        self.config: JointConfig = algorithm.config
        self.gaussian = EMStep(self.config)
        self.max_rounds = self.config.max_iter

    def begin(self, state: JointState) -> str:
        if not state.learners and self.config.learners_init is not None:
            state.learners = [dict(p) for p in self.config.learners_init]
        elif not state.learners:
            raw = state.projection.n_features if state.projection is not None else None
            width = self.config.n_learner_features or raw or state.params.n_features
            state.learners = self.algorithm._initial_learners(width)
        return self.kinds[0]

    def configure(self, state: JointState) -> Message:
        tensors = {**state.params.tensors(), "shift": moment_shift(state.params)}
        tensors.update(learners_tensors(state.learners))
        return Message(
            "joint_em",
            tensors,
            {"seed": round_seed(self.config, state)},
            expect={"covariance_type": self.config.covariance_type},
        )

    # ------------------------------------------------------------------ server half
    def server_step(
        self, state: JointState, replies: dict[int, Message]
    ) -> tuple[str | None, dict]:
        config = self.config
        stats = self.gaussian.m_step(state, replies)
        joint = torch.stack([r.tensors["joint_counts"] for r in replies.values()])
        state.joint_counts = histogram_sum(joint, config, state.rounds)
        # a trusted server's clients send exact counts ("central"): their weights would
        # leave the fit outside its guarantee, so only noisy ones are kept
        for cid, reply in replies.items() if config.dp_mode != "central" else ():
            counts = reply.tensors["joint_counts"]
            if config.private:  # noisy counts: positive by post-processing
                counts = counts.clamp_min(1e-6 * float(counts.abs().sum()) + 1e-300)
            if float(counts.sum()) > 0:
                weights = (counts / counts.sum()).to(config.device, config.dtype)
                state.client_joint_weights[cid] = weights
                state.client_weights[cid] = weights.sum(1)
        if config.aggregate_learners:
            robust = (config.aggregation, config.trim)
            # under DP every copy is DP-SGD's output: weights from exact counts would not be
            gammas = torch.ones_like(joint.sum(1)) if config.private else joint.sum(1)
            state.learners = robust_average_learners(
                state.learners, list(replies.values()), gammas, *robust
            )
        done, lower_bound = self.gaussian.advance(state, stats)
        metrics = {"phase": "joint_em"}
        if not math.isnan(lower_bound):
            metrics["mean_log_likelihood"] = lower_bound
        return (None if done else "joint_em"), metrics

    # ------------------------------------------------------------------ client half
    def train_many(self, tasks: list[SGDTask]) -> list[dict[str, Tensor]]:
        return self.algorithm._local_sgd_many(tasks)

    def gaussian_rows(self, X: Tensor, Z: Tensor, broadcast: Message) -> Tensor:
        """The rows (n, d) the client's Gaussians model this round, from the chain's rows
        ``X`` (n, d_x), the learners' rows ``Z`` (n, p) and the round's ``broadcast``: ``X``
        itself (pFedEM's ``gaussian_features="backbone"`` maps ``Z`` through a broadcast
        learner's backbone instead)."""
        return X

    def private_learners(
        self,
        template: nn.Module,
        learners: list[dict[str, Tensor]],
        Z: Tensor,
        y: Tensor,
        weight: Tensor,
        context: ClientContext,
    ) -> tuple[list[dict[str, Tensor]], dict[str, Scalar]]:
        """The ``learners`` trained by the client's own DP-SGD (noise from its own source,
        never the broadcast's seed) on rows ``Z`` (n, p) and labels ``y`` (n,), row ``i``
        weighing ``weight[i, m]`` (n, M) in learner ``m``'s loss; returns them and the
        reply's scalars (``dp_sgd_steps``)."""
        config, private = self.config, context.terms.private
        generator = private.noise()
        trained = private_sgd(
            template,
            learners,
            Z,
            y,
            weight,
            private.dp_sgd,
            generator,
            learning_rate=config.learning_rate,
            optimizer=config.optimizer,
            mu_prox=config.mu_prox,
        )
        return trained, {"dp_sgd_steps": private.dp_sgd.steps}

    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        """One client's joint round: the E-step, its learners' training (yielded as
        :class:`~fednovelty.federated.core.learners.SGDTask` objects, or its own DP-SGD under
        DP), then its reply."""
        X, y, Z = data
        X = self.gaussian_rows(X, Z, message)
        config, algorithm = self.config, self.algorithm
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        ct = config.covariance_type
        k1, k2 = t["means"].shape[0], config.n_learners
        template = algorithm._shared_template(Z.shape[1])
        names = [name for name, _ in template.named_parameters()]
        source = t
        if not config.aggregate_learners and learner_name(0, names[0]) in context.state:
            source = context.state  # Local: continue from this client's own learners
        learners = [{name: source[learner_name(m2, name)] for name in names} for m2 in range(k2)]
        n = X.shape[0]
        # under DP weights kept from exact counts would carry a row into later rounds
        own = context.terms.private is None
        log_pi = context.state.get("log_joint_weights") if own else None
        if log_pi is None:
            log_pi = (t["weights"].unsqueeze(1) / k2).log().expand(k1, k2)
        log_n = log_gaussian_prob(X, t["means"], t["precisions_cholesky"], ct)  # (n, M1)
        # (n, M2): the round's clients' rows under the broadcast learners in few passes
        log_py = torch.stack((yield [LabelTask(template, p, Z, y) for p in learners]), dim=1)
        weighted = log_pi.unsqueeze(0) + log_n.unsqueeze(2) + log_py.unsqueeze(1)
        flat = weighted.reshape(n, -1)
        log_norm = torch.logsumexp(flat, dim=1)
        q = (flat - log_norm.unsqueeze(1)).exp().view(n, k1, k2)
        joint_counts = q.sum(0)  # (M1, M2)
        if n > 0:
            eps = 10 * torch.finfo(X.dtype).eps
            context.state["log_joint_weights"] = ((joint_counts + eps) / (n + eps * k1 * k2)).log()
        terms = context.terms
        scalars = {}
        if terms.private is not None and config.aggregate_learners:
            if terms.private.dp_sgd is None:
                return skipped_reply("joint_em", "learners leave under DP only by DP-SGD")
            # the learners leave the client: its own DP-SGD, from its own generator
            trained, scalars = self.private_learners(template, learners, Z, y, q.sum(1), context)
        else:
            generator = client_generator(int(message.scalars["seed"]), context.client_id)
            trained = yield [
                SGDTask(params, Z, y, q[:, :, m2].sum(1), generator)
                for m2, params in enumerate(learners)
            ]
        if not config.aggregate_learners:
            context.state.update(learners_tensors(trained))
        if not terms.releases(n):
            return skipped_reply("joint_em", terms.below_floor)
        floor = terms.floor
        gaussian_rows, cell_rows, learner_rows = joint_rows(q, floor)
        # a Gaussian's statistics are of its backed cells' responsibilities (the gate
        # zeros the cells and Gaussians below the floor, which is 1 under DP)
        weight = (q * backed(cell_rows, floor).to(X.dtype)).sum(2)  # (n, M1)
        stats = stats_from_resp(X, weight, ct, t["shift"])
        stats = replace(stats, log_likelihood=log_norm.sum())
        tensors = dict(stats_message(stats, "joint_em").tensors)
        tensors["joint_counts"] = joint_counts
        backing = stats_backing(stats, gaussian_rows, resp_rows(weight.sum(1, keepdim=True))[0])
        backing["joint_counts"] = cell_rows
        for m2, params in enumerate(trained if config.aggregate_learners else []):
            used = bool(backed(learner_rows[m2], floor))
            released = params if used else learners[m2]
            tensors.update({learner_name(m2, k): v.clone() for k, v in released.items()})
            # a learner not trained on enough rows goes back as broadcast: none of the rows
            behind = learner_rows[m2] if used else learner_rows.new_tensor(math.inf)
            backing.update(dict.fromkeys((learner_name(m2, k) for k in released), behind))
        return Message("joint_em", tensors, scalars, backing=backing)


class JointFedGMM(ChainedAlgorithm):
    """Federated EM for FedGMM's joint model (see the module docstring).

    ``JointFedGMM(n_components, n_learners, n_classes, **settings)`` with the settings of
    :class:`JointConfig`: federated EM's (``covariance_type``,
    ``init_params``, ``standardize``, ``prior_strength``, ``pca_components``, ...; mixture
    weights are personal) plus ``learner_factory``, ``local_epochs``, ``learning_rate``,
    ``batch_size``, ``optimizer``, ``mu_prox``, ``aggregate_learners`` and
    ``n_learner_features``; or ``JointFedGMM.from_config(JointConfig(...))``. With
    ``aggregate_learners=False`` (the Local baseline) each client trains from its own
    previous weights and sends no learner weights; the trained learners stay in the client's
    state as ``learner.{m2}.{name}``.

    One joint EM round is one communication round:

    - E-step on the client: ``q_i(m1, m2) ∝ pi_c(m1, m2) N(x_i; m1) P_m2(y_i | x_i)`` in log
      space; ``pi_c <- mean_i q_i``. Learner training needs ``q`` of every row, so the client
      holds it (n_c, M1, M2).
    - Gaussian M-step: the client sends the sufficient statistics of ``x`` under ``r_i(m1) =
      sum_m2 q_i(m1, m2)`` about the broadcast shift (``stats_from_resp``, as the Lloyd rounds);
      the server combines them and runs the M-step with federated EM's own server half
      (:meth:`~fednovelty.federated.mixtures.em.EMStep.m_step`; exact, and with ``standardize``,
      ``prior_strength`` and ``aggregation`` as there; the paper's reference code averages
      covariances taken about client means instead).
    - Learner M-step: for each ``m2`` the client runs ``local_epochs`` of SGD from the broadcast
      weights on the cross-entropy weighted by ``w_i(m2) = sum_m1 q_i(m1, m2)`` and sends the
      new weights with ``gamma_c(m2) = sum_i w_i(m2)``; the server averages them weighted by
      gamma (:func:`~fednovelty.federated.core.aggregate.average_learners`), or under
      ``aggregation="trimmed"`` takes the coordinate-wise trimmed mean of the copies of the
      clients that used the learner
      (:func:`~fednovelty.federated.trust.robust.robust_average_learners`; the Gaussians' statistics
      are then trimmed as federated EM's).

    The Gaussians are initialised by federated EM's init steps (``init_params``: federated
    k-means by default); the learners start from ``learner_factory`` under ``random_state``.
    With ``standardize`` or ``pca_components`` the Gaussians see z-scores or projected rows; the
    learners keep seeing the raw rows (or ``Z``).
    """

    labelled = True
    config_class = JointConfig
    #: the step that ends the chain (after federated EM's preparation steps).
    em_step: ClassVar[type[JointEMStep]] = JointEMStep

    def __init__(self, n_components: int, n_learners: int, n_classes: int, **settings: Any):
        config = JointConfig(
            n_components=n_components, n_learners=n_learners, n_classes=n_classes, **settings
        )
        self._setup(config)

    def _setup(self, config: JointConfig) -> None:
        super()._setup(config)
        self._templates: dict[int, nn.Module] = {}
        self._chain(em_steps(config, self.em_step(self)))

    def new_state(self) -> JointState:
        return JointState(phase="")

    def split_data(self, data: Any) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        X, y, Z = unpack_client_data(data)
        return X, (y, Z)

    # ------------------------------------------------------------------ learners
    def _template(self, n_features: int) -> nn.Module:
        """A fresh learner module for rows ``n_features`` wide (its parameters drawn now)."""
        config = self.config
        return learner_template(
            config.learner_factory, n_features, config.n_classes, config.device, config.dtype
        )

    def _shared_template(self, n_features: int) -> nn.Module:
        """The learners' template for rows ``n_features`` wide, built once: it is only
        evaluated with parameters given (``functional_call``), so every client and round
        reads the same module, and a round's label log-likelihoods under one learner are
        computed together (:mod:`~fednovelty.federated.core.label_tasks` groups by it)."""
        if n_features not in self._templates:
            self._templates[n_features] = self._template(n_features)
        return self._templates[n_features]

    def _initial_learners(self, n_features: int) -> list[dict[str, Tensor]]:
        return initial_parameters(
            lambda: self._template(n_features), self.config.n_learners, self.config.random_state
        )

    def _local_sgd(
        self,
        template: nn.Module,
        start: dict[str, Tensor],
        X: Tensor,
        y: Tensor,
        weight: Tensor,
        generator: torch.Generator,
    ) -> dict[str, Tensor]:
        """``local_epochs`` of mini-batch SGD or Adam on ``mean_i w_i CE_i`` from ``start``
        (one task of :meth:`_local_sgd_many`)."""
        return self._local_sgd_many([SGDTask(start, X, y, weight, generator)])[0]

    def _local_sgd_many(self, tasks: list[SGDTask]) -> list[dict[str, Tensor]]:
        """The learners' local training of ``tasks`` (:class:`~fednovelty.federated.
        learners.SGDTask`, any clients) as one batched computation
        (:func:`~fednovelty.federated.core.learners.local_sgd_many`) under the settings."""
        if not tasks:
            return []
        config = self.config
        return local_sgd_many(
            self._shared_template(tasks[0].X.shape[1]),
            tasks,
            epochs=config.local_epochs,
            learning_rate=config.learning_rate,
            batch_size=config.batch_size,
            optimizer=config.optimizer,
            mu_prox=config.mu_prox,
        )


#: The FedGMM paper's Table 2 methods as configurations of ``JointFedGMM``.
PFL_METHODS: dict[str, dict] = {
    "FedGMM": {},
    "FedEM": {"n_components": 1},
    "FedAvg": {"n_components": 1, "n_learners": 1},
    "FedProx": {"n_components": 1, "n_learners": 1, "mu_prox": 0.01},
    "Local": {"n_components": 1, "n_learners": 1, "aggregate_learners": False},
}


def pfl_algorithm(
    name: str, n_classes: int, *, n_components: int = 3, n_learners: int = 3, **options
) -> JointFedGMM:
    """One of ``PFL_METHODS`` by name, e.g. ``pfl_algorithm("FedEM", n_classes=2)``.

    ``n_components`` / ``n_learners`` are FedGMM's sizes (FedEM keeps ``n_learners``);
    the method's own settings override them, ``options`` go to ``JointFedGMM``.
    """
    if name not in PFL_METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {sorted(PFL_METHODS)}.")
    config = {"n_components": n_components, "n_learners": n_learners, **options}
    config.update(PFL_METHODS[name])
    k1, k2 = config.pop("n_components"), config.pop("n_learners")
    return JointFedGMM(k1, k2, n_classes, **config)


__all__ = [
    "PFL_METHODS",
    "JointConfig",
    "JointFedGMM",
    "JointLearners",
    "JointState",
    "adapt_joint_weights",
    "global_log_joint_weights",
    "histogram_sum",
    "joint_log_components",
    "joint_log_scores",
    "learner_log_probs",
    "linear_learner",
    "mlp_learner",
    "pfl_algorithm",
    "unpack_client_data",
]
