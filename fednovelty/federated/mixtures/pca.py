"""Federated PCA: exact principal components of the pooled rows of all clients.

Two rounds, statistics only (:class:`PCAStep`):

1. ``moments_mean`` (empty broadcast): each client replies its row count and the sum of its
   rows; the server forms the pooled mean.
2. ``moments_scatter`` (broadcast: the pooled mean): each client replies its scatter about
   that mean (n_features, n_features) and its row count again. The server sums the
   scatters, divides by ``N - 1`` (the unbiased covariance, as
   ``sklearn.decomposition.PCA``), takes ``torch.linalg.eigh`` and keeps the top
   ``n_components`` eigenpairs (``"auto"``: as many as
   ``fednovelty.mixture.ppca.choose_n_components`` picks from all eigenvalues and the
   pooled row count), each signed as scikit-learn >= 1.5 does.

Centring about the *pooled* mean is the two-pass algorithm of a centralized PCA, so the
result equals scikit-learn's up to round-off for any partition of the rows into clients
(why, and the sign convention: :class:`PCAStep`). The same clients must answer both rounds:
run with ``fraction=1`` and no dropout; the server raises otherwise. A client below its
privacy floor skips both rounds. Clients compute in the dtype and on the device of their
rows; the server aggregates in ``dtype`` on ``device``.

``FederatedPCA`` runs :class:`PCAStep` alone; the detectors' PCA front end
(``fednovelty.federated.mixtures.projected``) runs it, then any algorithm on the projected
rows: the projection's mean and axes go out once, with the algorithm's first broadcast, and
each client keeps them in its ``ClientContext.state`` and projects its rows for every round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fednovelty.federated.core.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    Scalar,
    skipped_reply,
)
from fednovelty.federated.core.config import Settings, as_dtype, settings_dataclass
from fednovelty.federated.core.declarations import ReplySpec, declare
from fednovelty.federated.core.steps import ClientSkip, Step
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.value_checks import check_scatter
from fednovelty.mixture.ppca import choose_n_components

#: ``n_components`` value that lets the server choose the axes (``choose_n_components``).
AUTO = "auto"


def check_n_components(value) -> int | str:
    """``n_components`` as an int >= 1 or ``"auto"``; a ValueError naming it otherwise."""
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ValueError(f"n_components must be an integer >= 1 or 'auto', got {value!r}.")
    if int(value) < 1:
        raise ValueError(f"n_components must be >= 1 or 'auto', got {value}.")
    return int(value)


@settings_dataclass
class PCAConfig(Settings):
    """Settings of federated PCA (``FederatedPCA``, and the PCA step of the mixtures).

    Attributes:
        n_components: number of principal axes to keep (>= 1; at most n_features, checked
            when the rows' width is known), or ``"auto"``: the server picks it
            (``fednovelty.mixture.ppca.choose_n_components``).
        device: where the server aggregates; ``None`` uses the device of the first reply.
        dtype: the server's floating dtype (float64 by default, for parity with scikit-learn).
    """

    n_components: int | str
    device: torch.device | None = None
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        if isinstance(self.dtype, torch.dtype) and not self.dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating dtype, got {self.dtype}.")
        self._set("n_components", check_n_components(self.n_components))
        self._set("dtype", as_dtype(self.dtype))
        self._set("device", None if self.device is None else torch.device(self.device))


@dataclass(frozen=True, eq=False)
class PCAProjection:
    """A fitted PCA: the pooled mean and the leading principal axes.

    Attributes:
        mean: (n_features,) pooled mean of the rows.
        components: (n_components, n_features) principal axes as orthonormal rows, by
            decreasing explained variance; the largest-|.| entry of each row is positive.
        explained_variance: (n_components,) variance along each axis (eigenvalues of the
            covariance with denominator ``n_samples - 1``, as scikit-learn).
        n_samples: number of pooled rows the projection was fitted on.
        noise_variance: mean variance of the discarded directions (scikit-learn's
            ``noise_variance_``, probabilistic PCA's ``sigma^2``), floored at ``1e-6`` times the
            mean variance per feature so a constant feature cannot make it zero; 0 when no
            direction is discarded.
    """

    mean: Tensor
    components: Tensor
    explained_variance: Tensor
    n_samples: int
    noise_variance: float = 0.0

    def __post_init__(self) -> None:
        k, d = self.components.shape if self.components.ndim == 2 else (-1, -1)
        if (
            self.components.ndim != 2
            or tuple(self.mean.shape) != (d,)
            or tuple(self.explained_variance.shape) != (k,)
        ):
            raise ValueError(
                "PCAProjection needs mean (n_features,), components (n_components, n_features) "
                f"and explained_variance (n_components,); got shapes {tuple(self.mean.shape)}, "
                f"{tuple(self.components.shape)} and {tuple(self.explained_variance.shape)}."
            )

    @property
    def n_components(self) -> int:
        return int(self.components.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.components.shape[1])

    def transform(self, X: Tensor) -> Tensor:
        """Project rows onto the principal axes: ``(X - mean) @ components.T``.

        Args:
            X: (n_samples, n_features) rows; cast to the projection's dtype and device.

        Returns:
            (n_samples, n_components) scores in the projection's dtype, on its device.
        """
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(
                f"X must have shape (n_samples, {self.n_features}) to match the projection's "
                f"n_features, got {tuple(X.shape)}."
            )
        X = X.to(device=self.mean.device, dtype=self.mean.dtype)
        return (X - self.mean) @ self.components.T

    def tensors(self) -> dict[str, Tensor]:
        """The projection as named tensors (``n_samples`` as a 0-d int64 tensor), for saving."""
        return {
            "mean": self.mean,
            "components": self.components,
            "explained_variance": self.explained_variance,
            "n_samples": torch.tensor(self.n_samples, dtype=torch.int64),
            "noise_variance": torch.tensor(self.noise_variance, dtype=torch.float64),
        }

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor]) -> PCAProjection:
        """Rebuild a projection from ``tensors()``'s output."""
        missing = {"mean", "components", "explained_variance", "n_samples"} - set(tensors)
        if missing:
            raise ValueError(f"PCAProjection.from_tensors: missing tensors {sorted(missing)}.")
        return cls(
            mean=tensors["mean"],
            components=tensors["components"],
            explained_variance=tensors["explained_variance"],
            n_samples=int(tensors["n_samples"].item()),
            noise_variance=float(tensors["noise_variance"]) if "noise_variance" in tensors else 0.0,
        )


@dataclass
class PCAState:
    """Server state of ``FederatedPCA``.

    Attributes:
        round: communication rounds completed (0, 1 or 2; finished at 2).
        mean: (n_features,) pooled mean after round 1, else ``None``.
        n_samples: pooled row count after round 1.
        client_counts: each round-1 client's row count by client id (round 2 must match).
        projection: the fitted ``PCAProjection`` after round 2, else ``None``.
    """

    round: int = 0
    mean: Tensor | None = None
    n_samples: int = 0
    client_counts: dict[int, int] = field(default_factory=dict)
    projection: PCAProjection | None = None


def _count(cid: int, n: Tensor) -> int:
    value = float(n.reshape(()).item())
    if not math.isfinite(value) or value < 0 or value != round(value):
        raise ValueError(f"client {cid}: row count n must be a non-negative integer, got {value}.")
    return round(value)


#: kinds of the PCA rounds.
PCA_KINDS: tuple[str, str] = ("moments_mean", "moments_scatter")
#: the PCA rounds' replies: the row count and the sum of the rows, then their scatter about
#: the broadcast mean (d, d), symmetric positive semi-definite.
PCA_REPLIES = declare(
    ReplySpec(
        "moments_mean",
        shapes=lambda b, d: {"n": (), "sum": (d,)},
        backing={"n": "client", "sum": "client"},
    ),
    ReplySpec(
        "moments_scatter",
        shapes=lambda b, d: {"n": (), "scatter": (d, d)},
        checks=(check_scatter,),
        backing={"n": "client", "scatter": "client"},
    ),
)
#: names of the projection's tensors in a broadcast and in a client's state.
PROJECTION_MEAN, PROJECTION_COMPONENTS = "projection.mean", "projection.components"


class PCAStep(Step):
    """The two rounds of federated PCA as a chainable step (see the module docstring).

    Its own progress is a :class:`PCAState`: ``FederatedPCA`` passes its state, a chain
    keeps one in ``state.pca`` and gets the result in ``state.projection``.

    Why two rounds rather than one round of raw moments (``n``, ``sum x``, ``sum x x^T``)? The
    covariance from raw moments, ``(S - N m m^T) / (N - 1)``, subtracts two large, nearly equal
    matrices whenever the mean is large against the spread (pixels in [0, 255], sensor offsets):
    it loses about ``log10(|m|^2 / var)`` digits and can even turn small eigenvalues negative.
    Centring each client's rows about the *pooled* mean before forming outer products is the
    two-pass algorithm of a centralized PCA, so the federated result equals scikit-learn's up to
    round-off, for any partition of the rows into clients. The price is one extra round.

    The same clients must answer both rounds (a scatter about the mean of other rows is not that
    of these rows): run with ``fraction=1`` and no dropout; the server raises otherwise. A
    client with fewer rows than its privacy floor (``PrivacyPolicy.min_rows``; an empty client
    too) replies ``skipped`` in both rounds and is left out of the pooled rows. Clients compute
    in the dtype and on the device of their own rows ``X`` (``n`` is sent in that dtype too:
    exact below 2^24 rows per client in float32); the server aggregates in ``dtype`` on
    ``device``.

    Sign convention: an eigenvector is defined up to sign, so each component is flipped to make
    its entry of largest absolute value positive (the first such entry on ties). This is the
    convention of scikit-learn >= 1.5 (``svd_flip(..., u_based_decision=False)``), and it makes
    the result independent of the partition and of the eigen-solver's arbitrary choice.

    Args:
        n_components: number of principal axes to keep, or ``"auto"`` (the server picks it
            from all eigenvalues and the pooled row count:
            ``fednovelty.mixture.ppca.choose_n_components``).
        dtype: the server's floating dtype.
        device: where the server aggregates; ``None`` uses the device of the first reply.
    """

    kinds = PCA_KINDS
    replies = PCA_REPLIES
    counted = False
    max_rounds = 2

    def __init__(
        self,
        n_components: int | str,
        *,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> None:
        self.n_components = check_n_components(n_components)
        self.dtype = dtype
        self.device = None if device is None else torch.device(device)

    # ------------------------------------------------------------------ on a PCAState
    def configure_round(self, pca: PCAState) -> Message:
        """The message of the next PCA round."""
        if pca.round == 0:
            return Message("moments_mean")
        if pca.round == 1:
            return Message("moments_scatter", {"mean": pca.mean})
        raise RuntimeError("FederatedPCA has finished; there is no round to configure.")

    def fold(self, pca: PCAState, replies: dict[int, Message]) -> dict[str, Scalar]:
        """Fold one PCA round's replies into ``pca``; returns the round's metrics."""
        if pca.round == 0:
            return self._moments_mean(pca, replies)
        if pca.round == 1:
            return self._moments_scatter(pca, replies)
        raise RuntimeError("FederatedPCA has finished; no further server step.")

    # ------------------------------------------------------------------ in a chain
    def begin(self, state) -> str:
        state.pca = PCAState()
        return "moments_mean"

    def configure(self, state) -> Message:
        return self.configure_round(state.pca)

    def server_step(self, state, replies: dict[int, Message]) -> tuple[str | None, dict]:
        metrics = self.fold(state.pca, replies)
        if state.pca.round < 2:
            return "moments_scatter", metrics
        state.projection = state.pca.projection
        return None, metrics

    def broadcast(self, state) -> tuple[dict[str, Tensor], dict[str, Scalar]]:
        expect = {"n_features": state.projection.n_components}
        if state.rounds > 0:  # the clients hold the projection since the first later round
            return {}, expect
        projection = state.projection
        tensors = {PROJECTION_MEAN: projection.mean, PROJECTION_COMPONENTS: projection.components}
        return tensors, expect

    def view(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        """The client's rows projected, (n_samples, n_components); the projection is kept
        from the broadcast that carries it."""
        if PROJECTION_COMPONENTS in message.tensors:
            for name in (PROJECTION_MEAN, PROJECTION_COMPONENTS):
                context.state[name] = message.tensors[name]
        if PROJECTION_COMPONENTS not in context.state:
            raise ClientSkip(
                "the client has no PCA projection (it missed the round after the PCA rounds)"
            )
        mean = context.state[PROJECTION_MEAN].to(X.device, X.dtype)
        components = context.state[PROJECTION_COMPONENTS].to(X.device, X.dtype)
        return (X - mean) @ components.T

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if X.ndim != 2 or not X.is_floating_point():
            raise ValueError(
                f"client {context.client_id}: rows must be a 2-D floating tensor "
                f"(n_samples, n_features), got {X.dtype} of shape {tuple(X.shape)}."
            )
        if message.kind in PCA_KINDS and not context.terms.releases(X.shape[0]):
            return skipped_reply(message.kind, context.terms.below_floor)
        n = torch.tensor(float(X.shape[0]), dtype=X.dtype, device=X.device)
        if message.kind == "moments_mean":
            tensors = {"n": n, "sum": X.sum(dim=0)}
            return Message("moments_mean", tensors, backing=client_backing(tensors, X.shape[0]))
        if message.kind == "moments_scatter":
            mean = message.tensors["mean"]
            if tuple(mean.shape) != (X.shape[1],):
                raise ValueError(
                    f"client {context.client_id}: broadcast mean has shape "
                    f"{tuple(mean.shape)} but the rows have {X.shape[1]} features."
                )
            centred = X - mean.to(device=X.device, dtype=X.dtype)
            scatter = centred.T @ centred  # exactly symmetric: it travels as a triangle
            tensors = {"n": n, "scatter": (scatter + scatter.T) * 0.5}
            backing = client_backing(tensors, X.shape[0])
            return Message("moments_scatter", tensors, backing=backing)
        raise ValueError(f"FederatedPCA clients do not answer messages of kind {message.kind!r}.")

    # ------------------------------------------------------------------ server half
    def _replies(
        self, replies: dict[int, Message], kind: str, name: str, shape: tuple[int, ...] | None
    ) -> tuple[dict[int, int], dict[int, Tensor]]:
        """Check and unpack replies: counts and the ``name`` tensor per client, in order
        (skipped replies, of clients below their privacy floor, count as absent)."""
        replies = {cid: r for cid, r in replies.items() if not r.scalars.get("skipped")}
        if not replies:
            raise ValueError(
                f"round {kind!r}: no client replied with statistics (clients below their "
                "privacy floor skip); FederatedPCA needs replies."
            )
        counts, values = {}, {}
        target = self.device
        for cid, reply in sorted(replies.items()):
            if reply.kind != kind:
                raise ValueError(f"client {cid}: expected a {kind!r} reply, got {reply.kind!r}.")
            missing = {"n", name} - set(reply.tensors)
            if missing:
                raise ValueError(f"client {cid}: {kind!r} reply lacks tensors {sorted(missing)}.")
            n, value = reply.tensors["n"], reply.tensors[name]
            if n.numel() != 1:
                raise ValueError(f"client {cid}: n must be a scalar, got shape {tuple(n.shape)}.")
            if (value.ndim != 1) if shape is None else (tuple(value.shape) != shape):
                raise ValueError(
                    f"client {cid}: {name!r} has shape {tuple(value.shape)}, expected "
                    f"{shape if shape is not None else '(n_features,)'}."
                )
            if not bool(torch.isfinite(value).all()):
                raise ValueError(f"client {cid}: {name!r} contains NaN or inf.")
            counts[cid] = _count(cid, n)
            target = value.device if target is None else target
            values[cid] = value.to(device=target, dtype=self.dtype)
        return counts, values

    def _moments_mean(self, state: PCAState, replies: dict[int, Message]) -> dict[str, Scalar]:
        counts, sums = self._replies(replies, "moments_mean", "sum", None)
        widths = {cid: s.shape[0] for cid, s in sums.items()}
        if len(set(widths.values())) > 1:
            raise ValueError(f"clients sent sums of different n_features: {widths}.")
        n_features = next(iter(widths.values()))
        n_samples = sum(counts.values())
        if n_samples < 2:
            raise ValueError(
                f"FederatedPCA needs at least 2 rows pooled over all clients, got {n_samples}; "
                "add clients or rows."
            )
        if self.n_components != AUTO and self.n_components > min(n_samples, n_features):
            raise ValueError(
                f"n_components={self.n_components} must be <= min(n_samples, n_features) = "
                f"min({n_samples}, {n_features}); lower n_components."
            )
        state.mean = torch.stack(list(sums.values())).sum(dim=0) / n_samples
        state.n_samples, state.client_counts, state.round = n_samples, counts, 1
        return {"phase": "moments_mean", "n_samples": n_samples}

    def _moments_scatter(self, state: PCAState, replies: dict[int, Message]) -> dict[str, Scalar]:
        d = state.mean.shape[0]
        counts, scatters = self._replies(replies, "moments_scatter", "scatter", (d, d))
        if counts != state.client_counts:
            raise ValueError(
                "round 'moments_scatter': the clients (or their row counts) differ from round "
                f"'moments_mean' ({counts} vs {state.client_counts}); exact PCA needs the same "
                "clients in both rounds: use fraction=1 and dropout=0."
            )
        scatter = torch.stack(list(scatters.values())).sum(dim=0)
        covariance = (scatter + scatter.T) / (2 * (state.n_samples - 1))
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)
        q = self.n_components
        if q == AUTO:
            q = choose_n_components(eigenvalues.flip(0), state.n_samples)
        top = torch.arange(d - 1, d - 1 - q, -1, device=eigenvalues.device)
        components = eigenvectors[:, top].T
        largest = components.abs().argmax(dim=1)
        rows = torch.arange(q, device=components.device)
        signs = torch.sign(components[rows, largest])
        components = components * torch.where(signs == 0, 1.0, signs).to(components)[:, None]
        explained = eigenvalues[top].clamp_min(0.0)
        total = float(torch.diagonal(covariance).sum())
        rest = d - q
        noise = 0.0
        if rest > 0:
            noise = max((total - float(explained.sum())) / rest, 1e-6 * total / d)
        state.projection = PCAProjection(
            mean=state.mean.to(components),
            components=components,
            explained_variance=explained,
            n_samples=state.n_samples,
            noise_variance=noise,
        )
        state.round = 2
        ratio = float(explained.sum()) / total if total > 0 else float("nan")
        return {"phase": "moments_scatter", "explained_variance_ratio": ratio}


class FederatedPCA(FederatedAlgorithm):
    """Exact PCA of the pooled client rows in two rounds of summed statistics
    (:class:`PCAStep` run alone).

    Args:
        n_components: number of principal axes to keep (1 <= n_components <= n_features),
            or ``"auto"`` (``fednovelty.mixture.ppca.choose_n_components``).
        device: where the server aggregates; ``None`` uses the device of the first reply
            (by client id).
        dtype: the server's floating dtype (float64 by default, for parity with
            scikit-learn).
    """

    max_rounds = 2
    config_class = PCAConfig
    replies = PCA_REPLIES

    def __init__(
        self,
        n_components: int | str,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self._setup(PCAConfig(n_components=n_components, device=device, dtype=dtype))

    def _setup(self, config: PCAConfig) -> None:
        super()._setup(config)
        self._step = PCAStep(config.n_components, dtype=config.dtype, device=config.device)

    def start(self) -> PCAState:
        return PCAState()

    def finished(self, state: PCAState) -> bool:
        return state.round >= 2

    def configure(self, state: PCAState) -> Message:
        return self._step.configure_round(state)

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        return self._step.client_step(X, message, context)

    def server_step(
        self, state: PCAState, replies: dict[int, Message]
    ) -> tuple[PCAState, dict[str, Scalar]]:
        return state, self._step.fold(state, replies)
