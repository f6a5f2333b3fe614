"""What the joint models of ``(x, y)`` share: ``JointModelDetector``, the base of
``JointFedGMMDetector`` (FedGMM's joint model, ``fednovelty.detectors.joint_fedgmm``) and
``PFedEMDetector``.

Each client models ``p_c(x, y) = sum pi_c(m1, m2) N(x; m1) P_m2(y | x)`` with shared
Gaussians, shared conditional models (learners) and personal weights ``pi_c`` (M1, M2).
``fit(X, y, groups)`` needs the labels; ``FedGMMDetector`` is the model of ``x`` alone and
ignores ``y`` (``docs/joint.md``).
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
import torch

from fednovelty.detectors._conformal import split_for_calibration
from fednovelty.detectors._dp import (
    LearningPlan,
    bounds_engine,
    bounds_rounds,
    dp_plan,
    finish_private_fit,
    run_private_bounds,
)
from fednovelty.detectors._em_detector import AdaptedClient, EMDetector
from fednovelty.detectors._fit_state import atomic_fit
from fednovelty.detectors._labels import label_codes
from fednovelty.detectors._validation import check_groups, split_by_client
from fednovelty.detectors.persistence import (
    check_items,
    check_positive,
    check_probabilities,
    get_attr,
    get_tensor,
)
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.core.learners import LEARNERS
from fednovelty.federated.joint_models.joint import (
    JointState,
    adapt_joint_weights,
    global_log_joint_weights,
    joint_log_scores,
    unpack_client_data,
)
from fednovelty.federated.trust.dp_sgd import steps_for_epochs
from fednovelty.mixture import score_samples
from fednovelty.mixture.covariance import precisions_from_precisions_cholesky
from fednovelty.mixture.em import check_prior_rows

SCORES = ("px", "py|x", "pxy", "msp")


class JointModelDetector(EMDetector):
    """What the joint models of ``(x, y)`` share (``JointFedGMMDetector``,
    ``PFedEMDetector``; not used directly): the labelled fit and ``partial_fit``, the
    learners' template, the joint scores (``log_px``, ``log_py_given_x``, ``log_pxy``,
    ``predict_y``), ``adapt`` with labels, and saving.

    Subclasses declare their parameters (``_params``, with ``learner`` among them), build
    their algorithm (``_algorithm``) and say how many learners they train
    (``_n_learners``) and whether the server averages them (``_shared_learners``).
    """

    _joint = True
    _labelled = True
    _without_labels = " For a model of X alone use FedGMMDetector."

    @property
    def _n_learners(self) -> int:
        raise NotImplementedError

    @property
    def _shared_learners(self) -> bool:
        return True

    def _algorithm(self, learner_width: int, seed: int, pca_components, **overrides):
        """The federated algorithm a fit runs; ``overrides`` replace its settings
        (``partial_fit``'s start and rounds)."""
        raise NotImplementedError

    def _joint_options(self, learner_width: int, seed: int, pca_components, overrides) -> dict:
        """The joint algorithm's settings: the declared ones, the classes, the learners'
        factory and width (the learners see all ``learner_width`` features), then
        ``overrides``."""
        return {
            **self._em_options(seed, pca_components, learner_width),
            "n_classes": len(self.classes_),
            "n_learner_features": learner_width,
            **overrides,
        }

    # -------------------------------------------------------------- fitting
    def fit(self, X, y=None, groups=None, *, callbacks=(), classes=None):
        """Fit the joint model on rows ``X`` with labels ``y``, split into clients by
        ``groups``.

        Args:
            X: rows (n_samples, n_features), numpy array or pandas DataFrame.
            y: one label per row (n_samples,), any sortable values; ``classes_`` keeps them.
            groups: client id of each row; ``None`` means one client.
            callbacks: callables, each called with every ``fednovelty.runtime.RoundRecord``
                as its round completes (federated PCA's, the initialisation's and EM's rounds,
                numbered ``1..n_rounds_`` as in ``history_``); kept only while ``fit`` runs.
            classes: every label value the model will know (``classes_``), when later
                ``partial_fit`` windows may hold labels this ``y`` lacks; default ``y``'s.

        Returns:
            self

        Raises:
            ValueError: ``y`` missing, not one label per row, with NaN, or a single class.
            TypeError: ``callbacks`` is not a sequence of callables.
        """
        self._fit_classes = classes
        try:
            return self._fit(X, y, groups, callbacks)
        finally:
            del self._fit_classes

    @atomic_fit
    def partial_fit(self, X, y=None, groups=None, *, rounds: int = 1):
        """Continue training on a new window of rows (the pFedEM paper's setting: clients
        whose data move from round to round): ``rounds`` more rounds from the current
        Gaussians, learners and each client's weights, on ``X`` alone.

        Args:
            X: the window's rows (n_samples, n_features), the width ``fit`` saw.
            y: their labels, among ``classes_``.
            groups: client id of each row, ids seen in ``fit`` (a new client: ``adapt``).
            rounds: communication rounds on this window (>= 1).

        With ``calibration="conformal"`` each client's window rows are split as ``fit``'s
        (``fednovelty.detectors._conformal``) and every threshold is set again under the
        updated model; a client absent from the window takes the federation's, with a
        ``ConformalCalibrationWarning``.

        Returns:
            self

        Raises:
            NotFittedError: before ``fit``. ValueError: another width, NaN, unknown labels or
                client ids, ``rounds < 1``. On any error the model is unchanged.
        """
        self._validate_params()
        self._check_fitted()
        if not isinstance(rounds, Integral) or rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1; got {rounds!r}.")
        if not self._shared_learners:
            raise ValueError("a Local model (aggregate_learners=False) has no partial_fit.")
        if self._option("privacy").epsilon is not None:
            raise ValueError(
                "partial_fit under privacy.epsilon would spend budget beyond what fit planned and "
                "reported; fit again on the new rows with a budget of its own."
            )
        array = self._check_X(X, fitted=True)
        if y is None:
            raise ValueError("partial_fit needs the window's labels y.")
        codes = label_codes(y, self.classes_, array.shape[0], torch.device("cpu")).numpy()
        ids, group_codes = check_groups(
            np.zeros(array.shape[0], int) if groups is None else groups, array.shape[0]
        )
        known = {c: i for i, c in enumerate(self.client_ids_.tolist())}
        unknown = [c for c in ids.tolist() if c not in known]
        if unknown:
            raise ValueError(
                f"groups holds client ids {unknown[:3]} not seen in fit; partial_fit continues "
                "the clients of fit (a new client's weights: adapt(X))."
            )
        seed = getattr(self, "_seed", 0) + len(self.history_)
        order = [known[c] for c in ids.tolist()]
        array, codes, group_codes, held = split_for_calibration(
            self, array, codes, group_codes, seed, order
        )
        parts = split_by_client(array, group_codes, len(ids))
        labels = split_by_client(codes, group_codes, len(ids))
        data, states = {}, {}
        for c, rows, lab in zip(ids.tolist(), parts, labels, strict=True):
            i = known[c]
            Xt = self._as_tensor(rows)
            yt = torch.as_tensor(lab, device=Xt.device)
            data[i] = (Xt, yt) if not hasattr(self, "pca_") else (self.pca_.transform(Xt), yt, Xt)
            states[i] = self._kept_state(i)
        params = self.model_
        algorithm = self._algorithm(
            self.n_features_in_,
            seed,
            None,
            weights_init=params.weights,
            means_init=params.means,
            precisions_init=precisions_from_precisions_cholesky(
                params.precisions_cholesky, self.covariance_type
            ),
            learners_init=self.joint_state_.learners,
            max_iter=int(rounds),
            tol=0.0,
        )
        rows = [0] * self.n_clients_
        for c, part in zip(ids.tolist(), parts, strict=True):
            rows[known[c]] = part.shape[0]
        with self._data_losses("partial_fit", rows, len(ids)):
            result = self._simulate(
                algorithm, data, seed, full=True, client_states=states, **self._em_engine()
            )
            kept = getattr(self, "_client_states", {})
            before = self.client_weights_.copy(), self.client_joint_weights_.copy()
            self._set_joint_result(result, self.n_features_in_)
            self._client_states = {**kept, **self._client_states}
            absent = [i for i in range(self.n_clients_) if i not in result.state.client_weights]
            self.client_weights_[absent] = before[0][absent]  # their weights carry over
            self.client_joint_weights_[absent] = before[1][absent]
            self.decision_scores_ = self.decision_function(array)
            self._process_decision_scores()
        if held is not None:  # every threshold again, under the updated model
            self._calibrate_clients(dict(zip(order, held, strict=True)), seed, 4, "partial_fit")
        return self

    def _kept_state(self, index: int) -> dict[str, torch.Tensor]:
        """What client ``index`` kept from the last run (its joint weights); after a load,
        rebuilt from ``client_joint_weights_``."""
        kept = getattr(self, "_client_states", {}).get(index)
        if kept is not None:
            return kept
        weights = torch.as_tensor(self.client_joint_weights_[index]).to(**self._torch_options())
        return {"log_joint_weights": weights.clamp_min(1e-300).log()}

    def _fit_em(self, data, seed, *, pca_components, round_offset=0):
        learner_width = unpack_client_data(data[0])[2].shape[1]  # the learners see all rows
        plan = dp_plan(
            self,
            unpack_client_data(data[0])[0].shape[1],
            len(data),
            lambda private: self._algorithm(learner_width, seed, None, **private).max_rounds,
            standardized="prior" in self._params.names and self._option("prior").standardize,
            learning=self._dp_learning(),
            histograms=int(self.max_iter),
        )
        rows = [unpack_client_data(part)[0] for part in data]  # what the box maps
        plan, box = run_private_bounds(self, plan, rows, seed, round_offset=round_offset)
        overrides = plan.settings if plan else {}
        algorithm = self._algorithm(learner_width, seed, pca_components, **overrides)
        result = self._simulate(
            algorithm,
            data,
            seed,
            full=True,
            round_offset=round_offset + bounds_rounds(box),
            **self._em_engine(plan),
            **bounds_engine(box),
        )
        finish_private_fit(self, plan, algorithm, box)
        self._seed = seed
        return self._set_joint_result(result, learner_width)

    def _dp_learning(self) -> LearningPlan | None:
        """The learners' DP-SGD under ``Privacy.epsilon`` when they leave the clients: every
        EM round trains them for ``ceil(local_epochs / Privacy.sample_rate)`` steps."""
        privacy = self._option("privacy")
        if privacy.epsilon is None or not self._shared_learners:
            return None
        rate = float(privacy.sample_rate)
        training = self._option("training")
        steps = steps_for_epochs(int(training.local_epochs), rate)
        return LearningPlan(
            int(self.max_iter), steps, rate, float(privacy.sgd_clip), float(training.batch_size)
        )

    def _set_joint_result(self, result, learner_width: int):
        """The fitted attributes from a finished run of the joint algorithm; returns it."""
        self._client_states = dict(result.client_states)
        state = result.state
        self.joint_state_ = state
        self.learner_template_ = self._learner_template(learner_width)
        self._set_em_state(state)
        self.client_weights_ = self._client_weight_matrix(state.client_weights)
        global_pi = state.joint_counts / state.joint_counts.sum()
        joint = [state.client_joint_weights.get(c, global_pi) for c in range(self.n_clients_)]
        self.client_joint_weights_ = torch.stack(joint).cpu().numpy()
        if self._shared_learners:
            if hasattr(self, "client_learners_"):
                del self.client_learners_
            return result
        names = [name for name, _ in self.learner_template_.named_parameters()]
        self.client_learners_ = [
            [
                {n: own.get(f"learner.{m2}.{n}", state.learners[m2][n]) for n in names}
                for m2 in range(self._n_learners)
            ]
            for own in (result.client_states.get(c, {}) for c in range(self.n_clients_))
        ]
        return result

    def _learner_factory(self):
        return LEARNERS[self.learner] if isinstance(self.learner, str) else self.learner

    def _learner_template(self, n_features: int):
        options = self._torch_options()
        module = self._learner_factory()(n_features, len(self.classes_))
        return module.to(device=options["device"], dtype=options["dtype"])

    def _set_result(self, result) -> None:
        raise ValueError(
            "from_model does not rebuild joint models yet; fit JointFedGMMDetector with "
            "fit(X, y, groups)."
        )

    # -------------------------------------------------------------- scoring
    def _personal_weights(self) -> np.ndarray:
        return self.client_joint_weights_

    def _local_learners(self, client):
        """Local (``aggregate_learners=False``): the client's own learners, or an error."""
        if self._shared_learners:
            return None
        if client is None or isinstance(client, AdaptedClient):
            raise ValueError(
                "a Local model (aggregate_learners=False) has no shared learner; pass client= "
                "one of the clients seen in fit."
            )
        return self.client_learners_[self._client_index(client)]

    def _joint_scores(self, X, y=None, client=None) -> dict[str, torch.Tensor]:
        Xt = self._check_score_input(X)
        codes = None if y is None else label_codes(y, self.classes_, Xt.shape[0], Xt.device)
        with torch.no_grad():
            return joint_log_scores(
                self.joint_state_,
                self.learner_template_,
                self._gmm_input(Xt),
                codes,
                self._log_pi(client, Xt),
                Z=Xt,
                learners=self._local_learners(client),
            )

    def _x_log_density(self, X: torch.Tensor) -> torch.Tensor:
        """``log p(x)`` (n,) of rows (n, n_features) under the global weights: the Gaussians
        evaluated on ``_gmm_input(X)``, the one map from rows to the Gaussians' rows every
        score of a joint model goes through (the PCA projection, or a subclass's features:
        ``PFedEMDetector(gaussian_features="backbone")``)."""
        return self._log_density(self._gmm_input(X))

    def log_px(self, X, client=None) -> np.ndarray:
        """``log p(x)`` (covariate novelty), shape (n_samples,).

        Args:
            X: rows (n_samples, n_features).
            client: ``None`` for the global weights (``global_weights``: sample-weighted,
                or the clients' mean), a client id seen in fit for its ``pi_c``, or a handle
                returned by :meth:`adapt`.
        """
        Xt = self._check_score_input(X)
        log_pi = self._log_pi(client, Xt)
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
                maximum-softmax-probability baseline).
        """
        if score not in SCORES:
            raise ValueError(f"score must be one of {list(SCORES)}; got {score!r}.")
        if score == "px" and client is None:
            return super().decision_function(X)
        if score in ("py|x", "pxy") and y is None:
            raise ValueError(f"score={score!r} needs the labels of the rows: pass y=.")
        key = {"px": "log_px", "py|x": "log_py_given_x", "pxy": "log_pxy", "msp": "msp"}
        scores = self._joint_scores(X, y, client)[key[score]]
        return -scores.cpu().numpy().astype(np.float64)

    def adapt(
        self,
        X,
        y=None,
        *,
        prior_rows="auto",
        max_iter: int = 100,
        tol: float = 1e-6,
    ) -> AdaptedClient:
        """Personal weights ``pi`` (M1, M2) for a client unseen in training, every shared
        parameter frozen (FedGMM Sec. 3: only ``pi`` is re-estimated, by EM from the global
        weights), MAP under a Dirichlet prior centred on the global weights.

        With labels the E-step uses ``N(x; m1) P_m2(y | x)``; without, ``N(x; m1)`` alone.
        The M-step is ``pi = (counts + prior_rows * global) / (n + prior_rows)``
        (:func:`~fednovelty.mixture.em.fit_weights_map`): a few rows
        barely move the global weights, many rows reach their own. The detector is not
        modified; the returned handle works as ``client=`` in every scoring method.

        Args:
            X: the new client's rows (n_samples, n_features); at least 2.
            y: their labels, optional.
            prior_rows: the prior's strength in pseudo-rows (a number >= 0; ``0`` is the
                maximum-likelihood EM of the FedGMM paper); ``"auto"`` is ``n_components``
                (one pseudo-row per Gaussian: on FEMNIST writers never below the global
                weights at 5, 20 or 50 rows; ``docs/joint.md``).
            max_iter: maximum EM iterations; tol: stop when the penalised log-likelihood per
                row changes by less than this.

        Returns:
            An :class:`AdaptedClient` (weights, their trace over iterations, log-likelihoods).
        """
        Xt = self._adapt_rows(X, max_iter)
        if not self._shared_learners and y is not None:
            raise ValueError(
                "a Local model (aggregate_learners=False) has no shared learner to adapt "
                "with labels; call adapt(X) for the Gaussian weights only."
            )
        strength = check_prior_rows(self.n_components_ if prior_rows == "auto" else prior_rows)
        codes = None if y is None else label_codes(y, self.classes_, Xt.shape[0], Xt.device)
        with torch.no_grad():
            result = adapt_joint_weights(
                self.joint_state_,
                self.learner_template_,
                self._gmm_input(Xt),
                codes,
                Xt,
                prior_rows=strength,
                max_iter=max_iter,
                tol=tol,
            )
        return self._adapted(result, Xt.shape[0], labelled=y is not None)

    # -------------------------------------------------------------- persistence
    def _get_state(self):
        if callable(self.learner):
            raise ValueError(
                "a joint model with a custom learner factory cannot be saved safely (the "
                f"factory is code, and loading runs no code); use a named learner "
                f"{sorted(LEARNERS)}, or save the learner weights yourself."
            )
        tensors, attrs = super()._get_state()
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
                for m2 in range(self._n_learners)
            ]

        shape = (self.n_components_, self._n_learners)
        joint_weights = get_tensor(tensors, "joint.client_weights", (self.n_clients_, *shape))
        check_probabilities(joint_weights, "the blocks of 'joint.client_weights'", dims=2)
        counts = get_tensor(tensors, "joint.counts", shape)
        check_positive(
            counts, "the tensor 'joint.counts'", "counts are sums of weights", allow_zero=True
        )
        check_positive(
            counts.sum(), "the total of 'joint.counts'", "the global weights divide by it"
        )
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
            global_weights=getattr(self, "global_weights", "pooled"),
        )
        if not self._shared_learners:
            self.client_learners_ = [
                learners(f"client_learner.{c}.") for c in range(self.n_clients_)
            ]
