"""``FedGMMDetector``: iterative federated EM (FedGMM Algorithm 2, DEM) as a PyOD detector."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._validation import check_groups, split_by_client
from fednovelty.detectors.base import (
    AGGREGATION_CONSTRAINTS,
    COMMON_CONSTRAINTS,
    PRIOR_SCALE,
    ROBUST_CONSTRAINTS,
    MixtureDetector,
    check_callbacks,
)
from fednovelty.detectors.persistence import (
    check_items,
    check_probabilities,
    get_attr,
    get_tensor,
    register,
)
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated import INIT_PARAMS, FederatedEM
from fednovelty.federated.joint import (
    PFL_METHODS,
    JointFedGMM,
    JointState,
    adapt_joint_weights,
    global_log_joint_weights,
    joint_log_scores,
    linear_learner,
    mlp_learner,
)
from fednovelty.federated.pca import FederatedPCA, PCAProjection
from fednovelty.federated.privacy import DEFAULT_MAX_CLUSTERS, PrivacyPolicy
from fednovelty.mixture import fit_weights, log_gaussian_prob, score_samples

SCORES = ("px", "py|x", "pxy", "msp")


@dataclass(frozen=True)
class AdaptedClient:
    """Mixture weights of a client unseen in training (from ``FedGMMDetector.adapt``); pass
    it as ``client=`` to any scoring method.

    Attributes:
        weights: (M1, M2) joint weights ``pi`` (joint models) or (M1,) mixture weights.
        trace: weights after each EM iteration, (n_iter + 1, *weights.shape); row 0 = global.
        mean_log_likelihoods: (n_iter,) mean log-likelihood of the rows before each update.
        n_samples: rows used; n_iter, converged: the EM run; labelled: whether y was used;
        joint: whether it belongs to a joint model.
    """

    weights: np.ndarray
    trace: np.ndarray
    mean_log_likelihoods: np.ndarray
    n_samples: int
    n_iter: int
    converged: bool
    labelled: bool
    joint: bool


@register
class FedGMMDetector(MixtureDetector):
    """Gaussian mixture trained by federated EM over clients; scores novelty as ``-log p(x)``.

    Every EM iteration is one communication round: the server broadcasts the parameters,
    each client replies with summed sufficient statistics of its rows, the server adds them
    and runs the M-step. With ``mixture_weights="global"`` this is exactly centralized EM
    on the pooled rows (scikit-learn's ``GaussianMixture``), whatever the split.

    Args:
        n_components: number of Gaussian components.
        covariance_type: ``"full"``, ``"tied"``, ``"diag"`` or ``"spherical"``.
        mixture_weights: ``"personal"`` (FedGMM: one weight vector per client, shared
            Gaussians) or ``"global"`` (DEM: one weight vector).
        init_params: ``"kmeans"`` (federated k-means; default), ``"separated"`` (centres
            spread over the merged feature range) or ``"subset"`` (pools a few raw rows on
            the server: not private).
        reg_covar, tol, max_iter, weights_init, means_init, precisions_init: as in
            scikit-learn's ``GaussianMixture`` (``max_iter`` = maximum EM rounds).
        standardize: fit on federated z-scores (one extra round) of the features (the model and
            its scores stay in the original units); ``False`` fits the raw features.
        covariance_prior: pseudo-rows of a conjugate prior that pulls every covariance
            towards ``prior_scale`` times the pooled variance of each feature (MAP EM on summed
            statistics); ``"auto"`` (default) is ``n_features + 2``, ``None`` turns it off
            (plain maximum likelihood, the behaviour before these remedies).
        prior_scale: the prior's target variance as a multiple of each feature's variance
            (default 4: a component backed by few rows is flattened, not made a spike).
            These three act on the mixture of ``x`` (``fit`` without ``y``); the joint model
            keeps FedGMM's plain M-step.
        kmeans_rounds: maximum federated Lloyd rounds of the ``kmeans`` init.
        subset_size: rows pooled by the ``subset`` init.
        n_learners: M2 conditional models ``P_m2(y | x)`` of the joint model (``fit`` with y).
        learner: ``"linear"`` (multinomial logistic regression), ``"mlp"`` (one hidden layer
            of 64) or a factory ``(n_features, n_classes) -> torch.nn.Module``.
        local_epochs, learning_rate, batch_size: the learners' local training each round.
        optimizer: ``"sgd"`` (default) or ``"adam"`` for the learners' local steps.
        mu_prox: FedProx proximal coefficient of the learners' local objective (0 = none).
        aggregate_learners: ``False`` never averages learners (the Local baseline).
        pca_components: if set, the Gaussians model the rows' projection on this many
            principal components, computed by federated PCA (two extra rounds of summed
            moments); ``log p(x)`` is then the density of that projection (adding probabilistic
            PCA's isotropic density of the discarded directions scored *shrunken* MNIST
            digits as more normal, AUROC 0.04, so it is left out); learners see the full rows.
        fraction: share of clients asked each round; dropout: chance that one fails to reply.
        aggregation: how the server combines the clients' statistics: ``"sum"`` (exact
            federated EM) or ``"trimmed"`` (per component, the ``trim`` share of clients at
            each end left out: a few hostile clients cannot plant a component; costs
            accuracy where honest clients hold rare clusters; README "Poisoning").
            Unsupervised model only.
        trim: share of clients ``aggregation="trimmed"`` leaves out at each end; must
            exceed the share of hostile clients.
        client_weight_cap: no client counts for more than this many times the median
            client's row count (``None``: no cap). Unsupervised model only.
        privacy_min_rows: each client's privacy floor (``docs/privacy.md``): every statistic
            a client sends is backed by at least this many of its rows (smaller k-means
            clusters merged, components suppressed) and a client with fewer rows skips the
            round; ``1`` is no floor (exact, no protection). ``init_params="subset"`` lets
            the simulated clients send raw rows (you own them here).
        contamination: expected share of anomalies, sets ``threshold_`` (PyOD).
        random_state: seed (int, RandomState or None).
        device: ``"cpu"`` (default) or ``"cuda"``; dtype: ``"float64"`` (default) or ``"float32"``.
        progress: show a progress bar over rounds.

    Attributes:
        weights_, means_, covariances_, precisions_cholesky_: global mixture (numpy, as
            scikit-learn); with personal weights ``weights_`` is the sample-weighted average.
        client_weights_: (n_clients, n_components) personal weights, rows in ``client_ids_``
            order (``"personal"`` only).
        classes_, client_joint_weights_ (n_clients, M1, M2), joint_state_: the joint model
            (fitted with ``y``); client_learners_: Local models' per-client learners.
        pca_: the federated PCA projection (``pca_components`` set).
        n_iter_, converged_, lower_bounds_: EM rounds, convergence, mean log-likelihoods.
        history_: one dict per communication round (kind, clients, bytes, metrics).
        n_rounds_, bytes_up_, bytes_down_: communication totals.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.

    Examples:
        >>> import numpy as np
        >>> from fednovelty import FedGMMDetector
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(0, 1, (200, 2)), rng.normal(6, 1, (200, 2))])
        >>> groups = np.repeat([0, 1, 2, 3], 100)
        >>> det = FedGMMDetector(n_components=2, random_state=0).fit(X, groups=groups)
        >>> bool(det.decision_function([[3.0, 30.0]])[0] > det.threshold_)
        True
    """

    _parameter_constraints: ClassVar[dict] = {
        **COMMON_CONSTRAINTS,
        **ROBUST_CONSTRAINTS,
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "mixture_weights": [StrOptions({"global", "personal"})],
        "init_params": [StrOptions(set(INIT_PARAMS))],
        "weights_init": ["array-like", None],
        "means_init": ["array-like", None],
        "precisions_init": ["array-like", None],
        "kmeans_rounds": [Interval(Integral, 1, None, closed="left")],
        "subset_size": [Interval(Integral, 1, None, closed="left")],
        "n_learners": [Interval(Integral, 1, None, closed="left")],
        "learner": [StrOptions({"linear", "mlp"}), callable],
        "local_epochs": [Interval(Integral, 1, None, closed="left")],
        "learning_rate": [Interval(Real, 0.0, None, closed="neither")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "optimizer": [StrOptions({"sgd", "adam"})],
        "mu_prox": [Interval(Real, 0.0, None, closed="left")],
        "aggregate_learners": ["boolean"],
        "pca_components": [Interval(Integral, 1, None, closed="left"), None],
        "fraction": [Interval(Real, 0.0, 1.0, closed="right")],
        "dropout": [Interval(Real, 0.0, 1.0, closed="left")],
        "aggregation": [StrOptions({"sum", "trimmed"})],
        **AGGREGATION_CONSTRAINTS,
    }

    def __init__(
        self,
        n_components=8,
        *,
        covariance_type="full",
        mixture_weights="personal",
        init_params="kmeans",
        reg_covar=1e-6,
        tol=1e-3,
        max_iter=100,
        standardize=True,
        covariance_prior="auto",
        prior_scale=PRIOR_SCALE,
        weights_init=None,
        means_init=None,
        precisions_init=None,
        kmeans_rounds=10,
        subset_size=100,
        n_learners=2,
        learner="linear",
        local_epochs=5,
        learning_rate=0.5,
        batch_size=32,
        optimizer="sgd",
        mu_prox=0.0,
        aggregate_learners=True,
        pca_components=None,
        fraction=1.0,
        dropout=0.0,
        aggregation="sum",
        trim=0.1,
        client_weight_cap=None,
        privacy_min_rows=5,
        contamination=0.1,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.mixture_weights = mixture_weights
        self.init_params = init_params
        self.reg_covar = reg_covar
        self.tol = tol
        self.max_iter = max_iter
        self.standardize = standardize
        self.covariance_prior = covariance_prior
        self.prior_scale = prior_scale
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.kmeans_rounds = kmeans_rounds
        self.subset_size = subset_size
        self.n_learners = n_learners
        self.learner = learner
        self.local_epochs = local_epochs
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.mu_prox = mu_prox
        self.aggregate_learners = aggregate_learners
        self.pca_components = pca_components
        self.fraction = fraction
        self.dropout = dropout
        self.aggregation = aggregation
        self.trim = trim
        self.client_weight_cap = client_weight_cap
        self.privacy_min_rows = privacy_min_rows
        self.contamination = contamination
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.progress = progress

    def _fit_clients(self, parts, clients, seed) -> None:
        n_total = sum(p.shape[0] for p in parts)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        raw = clients
        pca_history = self._fit_pca(clients, seed)
        offset = 0 if pca_history is None else len(pca_history[0])  # EM rounds follow PCA's
        clients = [self._gmm_input(c) for c in clients]
        label_parts = getattr(self, "_label_parts", None)
        if label_parts is not None:
            device = clients[0].device
            labels = [torch.as_tensor(p, device=device) for p in label_parts]
            self._fit_joint(clients, seed, labels, raw, round_offset=offset)
        else:
            self._fit_plain(clients, seed, round_offset=offset)
        if pca_history is not None:
            history, up, down = pca_history
            self.history_ = history + self.history_
            self.n_rounds_ += len(history)
            self.bytes_up_ += up
            self.bytes_down_ += down

    def _fit_pca(self, clients, seed):
        """Federated PCA for the Gaussians' features (``pca_components``); returns the PCA
        rounds' ``(history, bytes_up, bytes_down)`` or None."""
        if self.pca_components is None:
            if hasattr(self, "pca_"):
                del self.pca_
            return None
        n_features = clients[0].shape[1]
        if self.pca_components > n_features:
            raise ValueError(
                f"pca_components={self.pca_components} must be <= n_features={n_features}."
            )
        options = self._torch_options()
        state = self._simulate(FederatedPCA(self.pca_components, **options), clients, seed)
        self.pca_ = state.projection
        return self.history_, self.bytes_up_, self.bytes_down_

    def _gmm_input(self, X: torch.Tensor) -> torch.Tensor:
        """The Gaussians' view of rows: their federated-PCA projection when
        ``pca_components`` is set, else the rows themselves."""
        pca = getattr(self, "pca_", None)
        return X if pca is None else pca.transform(X)

    def _fit_plain(self, clients, seed, round_offset: int = 0) -> None:
        algorithm = FederatedEM(
            self.n_components,
            mixture_weights=self.mixture_weights,
            weights_init=self.weights_init,
            means_init=self.means_init,
            precisions_init=self.precisions_init,
            aggregation=self.aggregation,
            trim=self.trim,
            client_weight_cap=self.client_weight_cap,
            **self._robust_options(clients[0].shape[1]),
            **self._em_options(seed),
        )
        state = self._simulate(
            algorithm,
            clients,
            seed,
            round_offset=round_offset,
            fraction=self.fraction,
            dropout=self.dropout,
            privacy=self._em_privacy(),
        )
        self._set_mixture(state.params)
        self.n_iter_ = state.n_iter
        self.converged_ = state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        if self.mixture_weights == "personal":
            self.client_weights_ = self._client_weight_matrix(state.client_weights)
        elif hasattr(self, "client_weights_"):
            del self.client_weights_
        if not self.converged_:
            warnings.warn(
                f"Federated EM did not converge in max_iter={self.max_iter} rounds (last change "
                "in mean log-likelihood above tol). Increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------------ joint model (y given)
    def fit(self, X, y=None, groups=None, *, callbacks=()):
        """Fit on rows ``X`` split into clients by ``groups``.

        Without ``y``: the Gaussian mixture of ``x`` by federated EM. With ``y`` (one label per
        row, any hashable values; ``classes_`` keeps the mapping): FedGMM's joint model
        ``p_c(x, y) = sum pi_c(m1, m2) N(x; m1) P_m2(y | x)`` with ``n_components`` Gaussians
        and ``n_learners`` conditional models.

        Args:
            X: rows (n_samples, n_features), numpy array or pandas DataFrame.
            y: one label per row (joint model), or ``None``.
            groups: client id of each row; ``None`` means one client.
            callbacks: callables, each called with every ``fednovelty.runtime.RoundRecord``
                as its round completes (initialisation, EM and, with ``pca_components``,
                federated PCA's rounds; numbered ``1..n_rounds_`` as in ``history_``); kept
                only while ``fit`` runs. For example, the log-likelihood per EM round::

                    det.fit(X, groups=g, callbacks=[
                        lambda r: print(r.round, r.metrics.get("mean_log_likelihood"))
                    ])

        Returns:
            self

        Raises:
            TypeError: ``callbacks`` is not a sequence of callables.
        """
        callbacks = check_callbacks(callbacks)  # fails before the labels are split
        if y is None:
            self._drop_joint_attributes()
            return super().fit(X, groups=groups, callbacks=callbacks)
        y_array = np.asarray(y)
        if y_array.ndim != 1:
            raise ValueError(f"y must be 1-D (one label per row), got shape {y_array.shape}.")
        if y_array.dtype.kind == "f" and not np.isfinite(y_array).all():
            raise ValueError("y contains NaN or inf; every row needs a label.")
        if len(y_array) != len(np.asarray(X)):
            raise ValueError(
                f"y has {len(y_array)} labels but X has {len(np.asarray(X))} rows; give one "
                "label per row."
            )
        self.classes_, codes = np.unique(y_array, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError("y has a single class; the joint model needs at least 2 classes.")
        client_ids, group_codes = check_groups(groups, len(y_array))
        self._label_parts = split_by_client(codes.astype(np.int64), group_codes, len(client_ids))
        try:
            return super().fit(X, groups=groups, callbacks=callbacks)
        finally:
            del self._label_parts

    @classmethod
    def pfl_baseline(cls, name: str, **params) -> FedGMMDetector:
        """A detector configured as one of the FedGMM paper's Table 2 methods.

        ``"FedGMM"`` (as given), ``"FedEM"`` (one Gaussian: mixture of learners only),
        ``"FedAvg"`` (one Gaussian, one learner), ``"FedProx"`` (FedAvg plus the proximal
        term, ``mu_prox=0.01`` unless given) and ``"Local"`` (one Gaussian, one learner per
        client, never aggregated: score with ``client=``). Fit with ``fit(X, y, groups)``.

        Example:
            >>> FedGMMDetector.pfl_baseline("FedEM", n_learners=3).n_components
            1
        """
        if name not in PFL_METHODS:
            raise ValueError(f"unknown method {name!r}; choose one of {sorted(PFL_METHODS)}.")
        config = dict(PFL_METHODS[name])
        if name == "FedProx" and "mu_prox" in params:
            config.pop("mu_prox")
        return cls(**{**params, **config})

    def _drop_joint_attributes(self) -> None:
        for name in (
            "classes_",
            "joint_state_",
            "learner_template_",
            "client_joint_weights_",
            "client_learners_",
        ):
            if hasattr(self, name):
                delattr(self, name)

    def _em_options(self, seed: int) -> dict:
        """Arguments shared by the plain and the joint federated EM algorithms."""
        return {
            "covariance_type": self.covariance_type,
            "init_params": self.init_params,
            "reg_covar": self.reg_covar,
            "tol": self.tol,
            "max_iter": self.max_iter,
            "kmeans_rounds": self.kmeans_rounds,
            "subset_size": self.subset_size,
            "random_state": seed,
            **self._torch_options(),
        }

    def _em_privacy(self) -> PrivacyPolicy:
        """The simulated clients' policy in the EM fits: the user owns them, so they answer
        the ``subset`` round when ``init_params="subset"`` asks for it, and form as many
        local clusters as ``n_components``."""
        return self._privacy_policy(
            allow_raw_rows=self.init_params == "subset",
            max_clusters=max(DEFAULT_MAX_CLUSTERS, int(self.n_components)),
        )

    def _learner_factory(self):
        return {"linear": linear_learner, "mlp": mlp_learner}.get(self.learner, self.learner)

    def _learner_template(self, n_features: int):
        options = self._torch_options()
        module = self._learner_factory()(n_features, len(self.classes_))
        return module.to(device=options["device"], dtype=options["dtype"])

    def _fit_joint(self, clients, seed, label_parts, learner_inputs, round_offset=0) -> None:
        if self.aggregation != "sum" or self.client_weight_cap is not None:
            raise ValueError(
                "aggregation and client_weight_cap apply to the unsupervised model; the joint "
                "model (fit with y) sums its clients' statistics. Use aggregation='sum' and "
                "client_weight_cap=None."
            )
        algorithm = JointFedGMM(
            self.n_components,
            self.n_learners,
            len(self.classes_),
            learner_factory=self._learner_factory(),
            local_epochs=self.local_epochs,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            mu_prox=self.mu_prox,
            aggregate_learners=self.aggregate_learners,
            n_learner_features=learner_inputs[0].shape[1],
            **self._em_options(seed),
        )
        data = list(zip(clients, label_parts, learner_inputs, strict=True))
        result = self._simulate(
            algorithm,
            data,
            seed,
            full=True,
            round_offset=round_offset,
            fraction=self.fraction,
            dropout=self.dropout,
            privacy=self._em_privacy(),
        )
        state = result.state
        self.joint_state_ = state
        self.learner_template_ = self._learner_template(learner_inputs[0].shape[1])
        self._set_mixture(state.params)
        self.n_iter_, self.converged_ = state.n_iter, state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        self.client_weights_ = self._client_weight_matrix(state.client_weights)
        joint = [
            state.client_joint_weights.get(c, state.joint_counts / state.joint_counts.sum())
            for c in range(self.n_clients_)
        ]
        self.client_joint_weights_ = torch.stack(joint).cpu().numpy()
        if self.aggregate_learners:
            if hasattr(self, "client_learners_"):
                del self.client_learners_
            return
        names = [name for name, _ in self.learner_template_.named_parameters()]
        self.client_learners_ = []
        for c in range(self.n_clients_):
            own = result.client_states.get(c, {})
            self.client_learners_.append(
                [
                    {n: own.get(f"learner.{m2}.{n}", state.learners[m2][n]) for n in names}
                    for m2 in range(self.n_learners)
                ]
            )

    def _check_labels(self, y, n_rows: int, device) -> torch.Tensor:
        y_array = np.asarray(y)
        if y_array.ndim != 1 or len(y_array) != n_rows:
            raise ValueError(
                f"y has {len(y_array) if y_array.ndim == 1 else y_array.shape} labels but X has "
                f"{n_rows} rows; give one label per row."
            )
        unknown = ~np.isin(y_array, self.classes_)
        if unknown.any():
            raise ValueError(
                f"y has label(s) {np.unique(y_array[unknown])[:5].tolist()} not seen in fit; "
                f"known classes: {self.classes_.tolist()}."
            )
        return torch.as_tensor(np.searchsorted(self.classes_, y_array), device=device)

    def _check_joint(self) -> None:
        self._check_fitted()
        if not hasattr(self, "joint_state_"):
            raise ValueError(
                "This FedGMMDetector was fitted without y; fit(X, y, groups=...) first."
            )

    def _log_pi(self, client, like: torch.Tensor, joint: bool) -> torch.Tensor | None:
        """``log pi`` of ``client`` (an id seen in fit or an ``adapt`` handle), or None for
        the global weights; (M1, M2) when ``joint`` else (M1,)."""
        if client is None:
            return None
        if isinstance(client, AdaptedClient):
            if client.weights.shape[0] != self.n_components_ or joint != client.joint:
                raise ValueError(
                    "this AdaptedClient was made by another model; call adapt on this detector."
                )
            return torch.as_tensor(client.weights).to(like).log()
        index = self._client_index(client)
        table = self.client_joint_weights_ if joint else self.client_weights_
        return torch.as_tensor(table[index]).to(like).log()

    def _local_learners(self, client):
        """Local (``aggregate_learners=False``): the client's own learners, or an error."""
        if self.aggregate_learners:
            return None
        if client is None or isinstance(client, AdaptedClient):
            raise ValueError(
                "a Local model (aggregate_learners=False) has no shared learner; pass client= "
                "one of the clients seen in fit."
            )
        return self.client_learners_[self._client_index(client)]

    def _joint_scores(self, X, y=None, client=None) -> dict[str, torch.Tensor]:
        Xt = self._check_score_input(X)
        self._check_joint()
        codes = None if y is None else self._check_labels(y, Xt.shape[0], Xt.device)
        with torch.no_grad():
            scores = joint_log_scores(
                self.joint_state_,
                self.learner_template_,
                self._gmm_input(Xt),
                codes,
                self._log_pi(client, Xt, joint=True),
                Z=Xt,
                learners=self._local_learners(client),
            )
        return scores

    def log_px(self, X, client=None) -> np.ndarray:
        """``log p(x)`` (covariate novelty), shape (n_samples,).

        Args:
            X: rows (n_samples, n_features).
            client: ``None`` for the sample-weighted global weights, a client id seen in fit
                for its ``pi_c``, or a handle returned by :meth:`adapt`.
        """
        Xt = self._check_score_input(X)
        self._check_joint()
        log_pi = self._log_pi(client, Xt, joint=True)
        if log_pi is None:
            log_pi = global_log_joint_weights(self.joint_state_)
        with torch.no_grad():
            log_px = score_samples(self.model_, self._gmm_input(Xt), torch.logsumexp(log_pi, 1))
        return log_px.cpu().numpy()

    def log_py_given_x(self, X, y, client=None) -> np.ndarray:
        """``log p(y | x)`` (label novelty), shape (n_samples,); ``client`` as in ``log_px``."""
        return self._joint_scores(X, y, client)["log_py_given_x"].cpu().numpy()

    def log_pxy(self, X, y, client=None) -> np.ndarray:
        """``log p(x, y)`` (joint novelty), shape (n_samples,); ``client`` as in ``log_px``."""
        return self._joint_scores(X, y, client)["log_pxy"].cpu().numpy()

    def predict_proba_y(self, X, client=None) -> np.ndarray:
        """Class probabilities ``p(y | x)`` (the paper's Eq. 3), shape (n_samples, n_classes);
        columns follow ``classes_``."""
        return self._joint_scores(X, client=client)["proba_y"].cpu().numpy()

    def predict_y(self, X, client=None) -> np.ndarray:
        """Most probable label of each row, in the original label values."""
        return self.classes_[self.predict_proba_y(X, client).argmax(1)]

    def decision_function(self, X, y=None, *, client=None, score="px") -> np.ndarray:
        """Anomaly score of each row (higher = more novel).

        Args:
            X: rows (n_samples, n_features).
            y: labels of the rows (for ``score="py|x"`` and ``"pxy"``).
            client: as in :meth:`log_px` (``None``: global weights).
            score: ``"px"`` (``-log p(x)``, the default and what ``threshold_``, ``predict``
                and ``predict_proba`` use), ``"py|x"`` (``-log p(y | x)``), ``"pxy"``
                (``-log p(x, y)``) or ``"msp"`` (``-max_k p(y = k | x)``, the
                maximum-softmax-probability baseline); all but ``"px"`` need a joint model.
        """
        if score not in SCORES:
            raise ValueError(f"score must be one of {list(SCORES)}; got {score!r}.")
        joint = hasattr(self, "joint_state_")
        if score == "px" and client is None:
            return super().decision_function(X)
        if score == "px" and not joint:
            return -self.score_samples_client(X, client)
        if score in ("py|x", "pxy") and y is None:
            raise ValueError(f"score={score!r} needs the labels of the rows: pass y=.")
        key = {"px": "log_px", "py|x": "log_py_given_x", "pxy": "log_pxy", "msp": "msp"}
        scores = self._joint_scores(X, y, client)[key[score]]
        return -scores.cpu().numpy().astype(np.float64)

    def adapt(self, X, y=None, *, max_iter: int = 100, tol: float = 1e-6) -> AdaptedClient:
        """Personal mixture weights for a client unseen in training, every shared parameter
        frozen (FedGMM Sec. 3: only ``pi`` is re-estimated, by EM from the global weights).

        With labels the E-step uses ``N(x; m1) P_m2(y | x)``; without, ``N(x; m1)`` alone
        (x-only EM; the only option for a model fitted without ``y``). The detector is not
        modified; the returned handle works as ``client=`` in every scoring method.

        Args:
            X: the new client's rows (n_samples, n_features); at least 2.
            y: their labels, optional (joint models only).
            max_iter: maximum EM iterations; tol: stop when the mean log-likelihood changes by
                less than this.

        Returns:
            An :class:`AdaptedClient` (weights, their trace over iterations, log-likelihoods).
        """
        Xt = self._check_score_input(X)
        if Xt.shape[0] < 2:
            raise ValueError(
                f"adapt needs at least 2 rows of the new client to re-estimate its mixture "
                f"weights; got {Xt.shape[0]}."
            )
        if not isinstance(max_iter, Integral) or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}.")
        joint = hasattr(self, "joint_state_")
        if y is not None and not joint:
            raise ValueError("y given but this model was fitted without labels; call adapt(X).")
        with torch.no_grad():
            if joint:
                if not self.aggregate_learners and y is not None:
                    raise ValueError(
                        "a Local model (aggregate_learners=False) has no shared learner to "
                        "adapt with labels; call adapt(X) for the Gaussian weights only."
                    )
                codes = None if y is None else self._check_labels(y, Xt.shape[0], Xt.device)
                result = adapt_joint_weights(
                    self.joint_state_,
                    self.learner_template_,
                    self._gmm_input(Xt),
                    codes,
                    Xt,
                    max_iter=max_iter,
                    tol=tol,
                )
            else:
                params = self.model_
                log_n = log_gaussian_prob(
                    self._gmm_input(Xt),
                    params.means,
                    params.precisions_cholesky,
                    params.covariance_type,
                )
                result = fit_weights(log_n, params.weights.log(), max_iter=max_iter, tol=tol)
        return AdaptedClient(
            weights=result.log_weights.exp().cpu().numpy(),
            trace=result.trace.cpu().numpy(),
            mean_log_likelihoods=result.mean_log_likelihoods.cpu().numpy(),
            n_samples=int(Xt.shape[0]),
            n_iter=result.n_iter,
            converged=result.converged,
            labelled=y is not None,
            joint=joint,
        )

    def _client_index(self, client) -> int:
        self._check_fitted()
        if isinstance(client, bool) or not isinstance(client, Integral | str | np.generic):
            raise TypeError(
                f"client must be a client id seen in fit or an AdaptedClient from adapt(); got "
                f"{type(client).__name__}."
            )
        matches = np.flatnonzero(self.client_ids_ == client)
        if matches.size == 0:
            raise ValueError(
                f"client {client!r} was not seen in fit; known clients: "
                f"{self.client_ids_[:10].tolist()}{'...' if self.n_clients_ > 10 else ''}."
            )
        return int(matches[0])

    def _client_weight_matrix(self, weights: dict[int, torch.Tensor]) -> np.ndarray:
        """(n_clients, n_components); a client that never replied gets the global weights."""
        rows = [weights.get(c, self.model_.weights) for c in range(self.n_clients_)]
        return torch.stack(rows).cpu().numpy()

    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        return score_samples(self.model_, self._gmm_input(X))

    def score_samples_client(self, X, client) -> np.ndarray:
        """``log p_c(x)`` under one client's personal weights (``"personal"`` only).

        Args:
            X: rows (n_samples, n_features).
            client: a client id as given in ``groups`` at fit time, or a handle from
                :meth:`adapt`.
        """
        Xt = self._check_score_input(X)
        if hasattr(self, "joint_state_"):
            return self.log_px(X, client=client)
        if not hasattr(self, "client_weights_") and not isinstance(client, AdaptedClient):
            raise ValueError("score_samples_client needs mixture_weights='personal'.")
        log_weights = self._log_pi(client, Xt, joint=False)
        with torch.no_grad():
            return score_samples(self.model_, self._gmm_input(Xt), log_weights).cpu().numpy()

    def _get_state(self):
        tensors = self._mixture_tensors(self.model_, "model")
        if hasattr(self, "client_weights_"):
            tensors["client_weights"] = torch.as_tensor(self.client_weights_)
        attrs = {
            "n_iter_": self.n_iter_,
            "converged_": self.converged_,
            "lower_bounds_": self.lower_bounds_,
        }
        if hasattr(self, "pca_"):
            tensors.update({f"pca.{k}": v for k, v in self.pca_.tensors().items()})
        if hasattr(self, "joint_state_"):
            if callable(self.learner):
                raise ValueError(
                    "a joint model with a custom learner factory cannot be saved safely (the "
                    "factory is code, and loading runs no code); use learner='linear' or "
                    "'mlp', or save the learner weights yourself."
                )
            state = self.joint_state_
            tensors["joint.counts"] = state.joint_counts
            tensors["joint.client_weights"] = torch.as_tensor(self.client_joint_weights_)
            for m2, learner in enumerate(state.learners):
                tensors.update({f"learner.{m2}.{k}": v for k, v in learner.items()})
            for c, learners in enumerate(getattr(self, "client_learners_", [])):
                for m2, learner in enumerate(learners):
                    tensors.update({f"client_learner.{c}.{m2}.{k}": v for k, v in learner.items()})
            attrs["classes_"] = self.classes_.tolist()
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        options = self._torch_options()
        width = self.n_features_in_
        if any(key.startswith("pca.") for key in tensors):
            self.pca_ = _pca_from(tensors, width, options)
            width = self.pca_.components.shape[0]
        self._set_mixture(self._mixture_from(tensors, "model", self.covariance_type, width))
        self.n_iter_ = get_attr(attrs, "n_iter_", int, minimum=0)
        self.converged_ = get_attr(attrs, "converged_", bool)
        bounds = get_attr(attrs, "lower_bounds_", list)
        self.lower_bounds_ = check_items(bounds, "lower_bounds_", float, finite=False)
        n_components = self.n_components_
        if "client_weights" in tensors:
            weights = get_tensor(tensors, "client_weights", (self.n_clients_, n_components))
            check_probabilities(weights, "the rows of 'client_weights'")
            self.client_weights_ = weights.numpy()
        if "classes_" not in attrs:
            return
        classes = check_items(get_attr(attrs, "classes_", list), "classes_", (str, int, float))
        if len(classes) < 2 or len(set(classes)) != len(classes):
            raise ModelFormatError(f"classes_ must hold at least 2 distinct labels: {classes}.")
        self.classes_ = np.asarray(classes)
        self.learner_template_ = self._learner_template(self.n_features_in_)
        shapes = {n: tuple(p.shape) for n, p in self.learner_template_.named_parameters()}

        def learners(prefix: str) -> list[dict[str, torch.Tensor]]:
            return [
                {
                    n: get_tensor(tensors, f"{prefix}{m2}.{n}", shape).to(**options)
                    for n, shape in shapes.items()
                }
                for m2 in range(self.n_learners)
            ]

        shape = (n_components, self.n_learners)
        joint_weights = get_tensor(tensors, "joint.client_weights", (self.n_clients_, *shape))
        check_probabilities(joint_weights, "the blocks of 'joint.client_weights'", dims=2)
        counts = get_tensor(tensors, "joint.counts", shape)
        if bool((counts < 0).any()):
            raise ModelFormatError("the tensor 'joint.counts' holds negative counts.")
        joint_weights = joint_weights.to(**options)
        self.client_joint_weights_ = joint_weights.cpu().numpy()
        self.joint_state_ = JointState(
            phase="done",
            params=self.model_,
            n_iter=self.n_iter_,
            converged=self.converged_,
            lower_bounds=list(self.lower_bounds_),
            learners=learners("learner."),
            joint_counts=counts.to(**options),
            client_joint_weights=dict(enumerate(joint_weights)),
        )
        if not self.aggregate_learners:
            self.client_learners_ = [
                learners(f"client_learner.{c}.") for c in range(self.n_clients_)
            ]


def _pca_from(tensors: dict[str, torch.Tensor], n_features: int, options: dict) -> PCAProjection:
    """The saved federated-PCA projection (``pca.*`` tensors), checked (finite, fitted on
    ``n_features`` features, a positive row count) and moved to ``options``' device and
    dtype. Raises ``ModelFormatError``."""
    parts = {
        name: get_tensor(tensors, f"pca.{name}").to(**options)
        for name in ("mean", "components", "explained_variance")
    }
    parts["noise_variance"] = get_tensor(tensors, "pca.noise_variance")
    n_samples = tensors.get("pca.n_samples")
    if n_samples is None or n_samples.dtype != torch.int64 or n_samples.numel() != 1:
        raise ModelFormatError("the tensor 'pca.n_samples' must be one int64 row count.")
    if int(n_samples) < 1 or tuple(parts["mean"].shape) != (n_features,):
        raise ModelFormatError(
            f"the PCA projection must be fitted on >= 1 row of {n_features} features; got "
            f"n_samples={int(n_samples)}, 'pca.mean' of shape {tuple(parts['mean'].shape)}."
        )
    try:
        return PCAProjection.from_tensors({**parts, "n_samples": n_samples})
    except ValueError as error:
        raise ModelFormatError(f"the PCA projection: {error}") from None
