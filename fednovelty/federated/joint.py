"""FedGMM's joint model (FedGMM paper, Sections 2-3, Algorithm 1) (algorithm layer).

Each client models ``p_c(x, y) = sum_{m1, m2} pi_c(m1, m2) N(x; mu_m1, Sigma_m1) P_theta_m2(y | x)``
with ``M1`` shared Gaussians, ``M2`` shared conditional models (*learners*, torch modules) and
personal weights ``pi_c`` of shape (M1, M2), estimated and used by the client. They are not
private: every round the client sends its joint counts ``sum_i q_i = n_c * pi_c`` (with its
row count ``n_c``), from which the server computes ``pi_c`` (``JointState.client_joint_weights``).

The client enforces its privacy policy (``ClientContext.policy``, ``docs/privacy.md``): with
fewer than ``min_rows`` rows it skips the round; a Gaussian, a cell ``(m1, m2)`` of the joint
counts or a learner backed by fewer than ``min_rows`` effective rows (Kish's
``(sum q)^2 / sum q^2``) is not released: its statistics and counts go out as zeros, and the
learner's weights go back as broadcast (so the server gives them no weight).

One EM round = one communication round:

- E-step on the client: ``q_i(m1, m2) ∝ pi_c(m1, m2) N(x_i; m1) P_m2(y_i | x_i)`` in log space;
  ``pi_c <- mean_i q_i``.
- Gaussian M-step: the client sends the sufficient statistics of ``x`` under
  ``r_i(m1) = sum_m2 q_i(m1, m2)`` about the broadcast shift; the server sums them and runs the
  M-step (exact, like ``FederatedEM``; the paper's reference code averages covariances taken
  about client means instead).
- Learner M-step: for each ``m2`` the client runs ``local_epochs`` of SGD from the broadcast
  weights on the cross-entropy weighted by ``w_i(m2) = sum_m1 q_i(m1, m2)`` and sends the new
  weights with ``gamma_c(m2) = sum_i w_i(m2)``; the server averages them weighted by gamma.

The Gaussians are initialised by ``FederatedEM``'s rounds (``init_params``: federated k-means
by default); the learners start from ``learner_factory`` under ``random_state``.

Special cases: ``M1 = 1`` is FedEM (Marfoq et al. 2021); ``M1 = M2 = 1`` is FedAvg.

Client data is a pair ``(X, y)``: rows (n_c, n_features) and integer labels (n_c,), or a
triple ``(X, y, Z)`` when the learners see other features ``Z`` (n_c, n_learner_features)
of the same rows than the Gaussians (the MNIST experiment: Gaussians on PCA features,
learners on pixels).

Named baselines (the FedGMM paper's Table 2) are configurations of this one algorithm, see
``PFL_METHODS`` and :func:`pfl_algorithm`: FedGMM, FedEM (``M1 = 1``), FedAvg
(``M1 = M2 = 1``), FedProx (FedAvg plus a proximal term) and Local (``M1 = M2 = 1``, learners
never aggregated).

Scoring and adaptation are pure functions of a trained ``JointState``:
:func:`joint_log_components` gives ``log N(x; m1) + log P_m2(y | x)`` per row and pair,
:func:`joint_log_scores` the marginal, conditional and joint log-likelihoods under some
``pi``, and :func:`adapt_joint_weights` fits a new client's ``pi`` with every shared
parameter frozen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fednovelty.federated.aggregate import stats_message, sum_stats
from fednovelty.federated.base import ClientContext, Message, client_generator, skipped_reply
from fednovelty.federated.em import EMState, FederatedEM
from fednovelty.federated.privacy import joint_backing
from fednovelty.mixture import (
    WeightsFit,
    fit_weights,
    log_gaussian_prob,
    params_from_stats,
    stats_from_resp,
)
from fednovelty.mixture.em import moment_shift

LearnerFactory = Callable[[int, int], nn.Module]
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}


def linear_learner(n_features: int, n_classes: int) -> nn.Module:
    """Multinomial logistic regression (the default learner)."""
    return nn.Linear(n_features, n_classes)


def mlp_learner(n_features: int, n_classes: int, hidden: int = 64) -> nn.Module:
    """A small two-layer perceptron."""
    return nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


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


def log_likelihoods_of_labels(
    module: nn.Module, params: dict[str, Tensor], X: Tensor, y: Tensor
) -> Tensor:
    """``log P_theta(y_i | x_i)`` of each row, shape (n_samples,)."""
    logits = functional_call(module, params, (X,))
    return -nn.functional.cross_entropy(logits, y, reduction="none")


class JointFedGMM(FederatedEM):
    """Federated EM for FedGMM's joint model (see module docstring).

    Args:
        n_components: M1 Gaussians.
        n_learners: M2 conditional models.
        n_classes: number of label classes (labels are 0..n_classes-1).
        learner_factory: ``(n_features, n_classes) -> nn.Module``; default multinomial
            logistic regression.
        local_epochs, learning_rate, batch_size: the learners' local training.
        optimizer: ``"sgd"`` (plain mini-batch SGD, default) or ``"adam"`` (a fresh Adam
            state every round: optimiser state never crosses the wire).
        mu_prox: FedProx proximal coefficient (0 = none).
        aggregate_learners: ``False`` keeps every learner on its client (the Local baseline:
            each client trains from its own previous weights and sends no learner weights;
            the trained learners stay in the client's state as ``learner.{m2}.{name}``).
        n_learner_features: width of the learners' input ``Z`` when clients hold
            ``(X, y, Z)`` triples (e.g. Gaussians on PCA features, learners on pixels);
            default the width of ``X``.
        Other arguments as ``FederatedEM`` (mixture weights are always personal).
    """

    labelled = True

    def __init__(
        self,
        n_components: int,
        n_learners: int,
        n_classes: int,
        *,
        learner_factory: LearnerFactory = linear_learner,
        local_epochs: int = 1,
        learning_rate: float = 0.1,
        batch_size: int = 128,
        optimizer: str = "sgd",
        mu_prox: float = 0.0,
        aggregate_learners: bool = True,
        n_learner_features: int | None = None,
        **kwargs,
    ) -> None:
        kwargs.setdefault("mixture_weights", "personal")
        if kwargs.get("standardize") or kwargs.get("prior_strength") is not None:
            raise ValueError(
                "JointFedGMM does not take standardize or prior_strength (its M-step is "
                "FedGMM's plain one); standardise the features beforehand if needed."
            )
        super().__init__(n_components, **kwargs)
        self.n_learners = int(n_learners)
        self.n_classes = int(n_classes)
        self.learner_factory = learner_factory
        self.local_epochs = int(local_epochs)
        self.learning_rate = float(learning_rate)
        self.batch_size = int(batch_size)
        self.mu_prox = float(mu_prox)
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}; got {optimizer!r}.")
        self.optimizer = optimizer
        self.aggregate_learners = bool(aggregate_learners)
        self.n_learner_features = None if n_learner_features is None else int(n_learner_features)
        if self.n_learners < 1 or self.n_classes < 2:
            raise ValueError(
                f"need n_learners >= 1 and n_classes >= 2; got n_learners={n_learners}, "
                f"n_classes={n_classes}."
            )

    # ------------------------------------------------------------------ helpers
    def _template(self, n_features: int) -> nn.Module:
        module = self.learner_factory(n_features, self.n_classes)
        return module.to(device=self.device, dtype=self.dtype)

    def _initial_learners(self, n_features: int) -> list[dict[str, Tensor]]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.random_state)
            return [
                {k: v.detach().clone() for k, v in self._template(n_features).named_parameters()}
                for _ in range(self.n_learners)
            ]

    # ------------------------------------------------------------------ server half
    def start(self) -> JointState:
        base = super().start()
        return JointState(**vars(base))

    def configure(self, state: JointState) -> Message:
        message = super().configure(state)
        if message.kind != "em":
            return message
        if not state.learners:
            state.learners = self._initial_learners(
                self.n_learner_features or state.params.n_features
            )
        tensors = dict(message.tensors)
        for m2, learner in enumerate(state.learners):
            tensors.update({f"learner.{m2}.{k}": v for k, v in learner.items()})
        scalars = {**message.scalars, "seed": self._round_seed(state)}
        return Message("joint_em", tensors, scalars)

    def _server_em(self, state: JointState, replies: dict[int, Message]) -> dict:
        shift = moment_shift(state.params)
        stats = sum_stats(replies.values(), shift, self.covariance_type)
        if float(stats.n_samples) <= 0:
            raise ValueError("no client with data replied in this EM round.")
        state.params = params_from_stats(stats, self.reg_covar)
        joint = torch.stack([r.tensors["joint_counts"] for r in replies.values()])
        state.joint_counts = joint.sum(0).to(self.device, self.dtype)
        for cid, reply in replies.items():
            counts = reply.tensors["joint_counts"]
            if float(counts.sum()) > 0:
                state.client_joint_weights[cid] = (counts / counts.sum()).to(
                    self.device, self.dtype
                )
                state.client_weights[cid] = state.client_joint_weights[cid].sum(1)
        gammas = joint.sum(1)  # (n_replies, M2)
        for m2, learner in enumerate(state.learners if self.aggregate_learners else []):
            weight = gammas[:, m2]
            total = float(weight.sum())
            if total <= 0:
                continue  # no client used this learner: keep it
            for name in learner:
                stacked = torch.stack([r.tensors[f"learner.{m2}.{name}"] for r in replies.values()])
                shape = (-1,) + (1,) * (stacked.ndim - 1)
                learner[name] = (
                    (stacked * (weight / total).view(shape)).sum(0).to(self.device, self.dtype)
                )
        return {"phase": "joint_em", "mean_log_likelihood": self._advance(state, stats)}

    # ------------------------------------------------------------------ client half
    def client_step(self, data, message: Message, context: ClientContext) -> Message:
        X, y, Z = unpack_client_data(data)
        if message.kind != "joint_em":
            return super().client_step(X, message, context)
        return self._client_joint_em(X, y, Z, message, context)

    def _client_joint_em(
        self, X: Tensor, y: Tensor, Z: Tensor, message: Message, context: ClientContext
    ) -> Message:
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        ct = str(message.scalars["covariance_type"])
        k1, k2 = t["means"].shape[0], self.n_learners
        template = self._template(Z.shape[1])
        names = [name for name, _ in template.named_parameters()]
        source = t
        if not self.aggregate_learners and f"learner.0.{names[0]}" in context.state:
            source = context.state  # Local: continue from this client's own learners
        learners = [{name: source[f"learner.{m2}.{name}"] for name in names} for m2 in range(k2)]
        n = X.shape[0]
        log_pi = context.state.get("log_joint_weights")
        if log_pi is None:
            log_pi = (t["weights"].unsqueeze(1) / k2).log().expand(k1, k2)
        log_n = log_gaussian_prob(X, t["means"], t["precisions_cholesky"], ct)  # (n, M1)
        with torch.no_grad():
            log_py = torch.stack(
                [log_likelihoods_of_labels(template, p, Z, y) for p in learners], dim=1
            )  # (n, M2)
        weighted = log_pi.unsqueeze(0) + log_n.unsqueeze(2) + log_py.unsqueeze(1)
        flat = weighted.reshape(n, -1)
        log_norm = torch.logsumexp(flat, dim=1)
        q = (flat - log_norm.unsqueeze(1)).exp().view(n, k1, k2)
        joint_counts = q.sum(0)  # (M1, M2)
        if n > 0:
            eps = 10 * torch.finfo(X.dtype).eps
            context.state["log_joint_weights"] = ((joint_counts + eps) / (n + eps * k1 * k2)).log()
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        trained = [
            self._local_sgd(template, params, Z, y, q[:, :, m2].sum(1), generator)
            for m2, params in enumerate(learners)
        ]
        if not self.aggregate_learners:
            for m2, params in enumerate(trained):
                context.state.update({f"learner.{m2}.{k}": v for k, v in params.items()})
        policy = context.policy
        if not policy.releases(n):
            return skipped_reply("joint_em", policy.below_floor)
        gaussians, cells, used_learners = joint_backing(q, policy.min_rows)
        if not bool(gaussians.any()):
            return skipped_reply("joint_em", f"no Gaussian has min_rows={policy.min_rows} rows")
        kept = cells.to(X.dtype)
        stats = stats_from_resp(X, (q * kept).sum(2), ct, t["shift"])
        stats = replace(stats, log_likelihood=log_norm.sum())
        tensors = dict(stats_message(stats, "joint_em").tensors)
        tensors["joint_counts"] = joint_counts * kept
        for m2, params in enumerate(trained if self.aggregate_learners else []):
            released = params if bool(used_learners[m2]) else learners[m2]
            tensors.update({f"learner.{m2}.{k}": v.clone() for k, v in released.items()})
        return Message("joint_em", tensors)

    def _local_sgd(
        self,
        template: nn.Module,
        start: dict[str, Tensor],
        X: Tensor,
        y: Tensor,
        weight: Tensor,
        generator: torch.Generator,
    ) -> dict[str, Tensor]:
        """``local_epochs`` of mini-batch SGD or Adam on ``mean_i w_i CE_i`` from ``start``."""
        params = {k: v.detach().clone().requires_grad_(True) for k, v in start.items()}
        optimizer = OPTIMIZERS[self.optimizer](params.values(), lr=self.learning_rate)
        n = X.shape[0]
        for _ in range(self.local_epochs if n else 0):
            order = torch.randperm(n, generator=generator).to(X.device)
            for begin in range(0, n, self.batch_size):
                batch = order[begin : begin + self.batch_size]
                logits = functional_call(template, params, (X[batch],))
                loss = (
                    weight[batch] * nn.functional.cross_entropy(logits, y[batch], reduction="none")
                ).mean()
                if self.mu_prox > 0:
                    loss = loss + 0.5 * self.mu_prox * sum(
                        (params[k] - start[k]).square().sum() for k in params
                    )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return {k: v.detach() for k, v in params.items()}


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


def global_log_joint_weights(state: JointState) -> Tensor:
    """Sample-weighted global ``log pi`` (M1, M2): the summed joint counts, normalised."""
    return (state.joint_counts / state.joint_counts.sum()).log()


def learner_log_probs(template: nn.Module, learners: list[dict[str, Tensor]], Z: Tensor) -> Tensor:
    """``log P_m2(y = k | z_i)`` for every learner and class, shape (n, M2, n_classes)."""
    with torch.no_grad():
        return torch.stack(
            [
                nn.functional.log_softmax(functional_call(template, p, (Z,)), dim=1)
                for p in learners
            ],
            dim=1,
        )


def joint_log_components(
    state: JointState,
    template: nn.Module,
    X: Tensor,
    y: Tensor | None = None,
    Z: Tensor | None = None,
    learners: list[dict[str, Tensor]] | None = None,
) -> Tensor:
    """``log N(x_i; m1) + log P_m2(y_i | z_i)``, shape (n, M1, M2); without ``y`` the
    Gaussian part alone, shape (n, M1, 1) (broadcasts against (M1, M2) weights).

    ``learners`` overrides ``state.learners`` (a Local client's own learners).
    """
    params = state.params
    log_n = log_gaussian_prob(X, params.means, params.precisions_cholesky, params.covariance_type)
    if y is None:
        return log_n.unsqueeze(2)
    log_probs = learner_log_probs(template, learners or state.learners, X if Z is None else Z)
    log_py = log_probs.gather(2, y.view(-1, 1, 1).expand(-1, log_probs.shape[1], 1)).squeeze(2)
    return log_n.unsqueeze(2) + log_py.unsqueeze(1)


def joint_log_scores(
    state: JointState,
    template: nn.Module,
    X: Tensor,
    y: Tensor | None = None,
    log_joint_weights: Tensor | None = None,
    Z: Tensor | None = None,
    learners: list[dict[str, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """``log_px`` (n,), ``proba_y`` (n, n_classes) = Eq. 3's ``p(y | x)``, ``msp`` (n,) =
    its largest entry, and with labels ``y`` also ``log_pxy`` and ``log_py_given_x`` (n,).

    Everything is computed in log space: ``log p(x, y) = logsumexp_{m1, m2} [log pi(m1, m2)
    + log N(x; m1) + log P_m2(y | z)]`` (the paper's reference code adds ``pi`` instead of
    ``log pi`` here).

    Args:
        log_joint_weights: ``log pi`` (M1, M2) of one client; default the global weights.
        Z: the learners' input rows when it differs from ``X``.
        learners: a Local client's own learners instead of ``state.learners``.
    """
    log_pi = global_log_joint_weights(state) if log_joint_weights is None else log_joint_weights
    params = state.params
    log_n = log_gaussian_prob(X, params.means, params.precisions_cholesky, params.covariance_type)
    log_px = torch.logsumexp(log_n + torch.logsumexp(log_pi, dim=1), dim=1)
    log_probs = learner_log_probs(template, learners or state.learners, X if Z is None else Z)
    # log sum_{m1,m2} pi N P(y|x) for every class: (n, n_classes)
    joint_all = torch.logsumexp(
        (log_pi.unsqueeze(0) + log_n.unsqueeze(2)).unsqueeze(3) + log_probs.unsqueeze(1),
        dim=(1, 2),
    )
    proba = (joint_all - log_px.unsqueeze(1)).exp()
    out = {"log_px": log_px, "proba_y": proba, "msp": proba.max(1).values}
    if y is not None:
        log_pxy = joint_all.gather(1, y.view(-1, 1)).squeeze(1)
        out["log_pxy"] = log_pxy
        out["log_py_given_x"] = log_pxy - log_px
    return out


def adapt_joint_weights(
    state: JointState,
    template: nn.Module,
    X: Tensor,
    y: Tensor | None = None,
    Z: Tensor | None = None,
    *,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> WeightsFit:
    """A new client's ``pi`` (M1, M2) by EM with every shared parameter frozen.

    With labels the E-step uses ``pi N(x; m1) P_m2(y | z)``; without, ``pi N(x; m1)`` (x-only
    EM: the Gaussian weights move, the learner split within each Gaussian keeps the global
    proportions). Starts from the global weights. Nothing in ``state`` is modified.

    Returns:
        ``fit_weights``'s result; ``log_weights`` (M1, M2) is usable as
        ``joint_log_scores(..., log_joint_weights=...)``.
    """
    log_components = joint_log_components(state, template, X, y, Z)
    return fit_weights(log_components, global_log_joint_weights(state), max_iter=max_iter, tol=tol)


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
    "JointFedGMM",
    "JointState",
    "adapt_joint_weights",
    "global_log_joint_weights",
    "joint_log_components",
    "joint_log_scores",
    "learner_log_probs",
    "linear_learner",
    "mlp_learner",
    "pfl_algorithm",
    "unpack_client_data",
]
