"""The detector contract shared by every fednovelty detector (PyOD ``BaseDetector``).

``fit(X, y=None, groups=None)`` splits the rows by ``groups`` (one client id per row; none
means a single client), runs a simulated federation on the in-process engine, and keeps the
trained model. Scores follow scikit-learn and PyOD: ``score_samples`` is the log-density
``log p(x)`` (higher = more normal) and ``decision_function`` is ``-log p(x)`` (higher =
more anomalous); ``threshold_``, ``labels_``, ``predict`` and ``predict_proba`` come from
PyOD with ``contamination``, or, with ``calibration="conformal"``, ``threshold_`` and a
threshold per client from rows each client held out of training
(``fednovelty.detectors._conformal``).

Subclasses implement ``_fit_clients`` (train on the list of client tensors and set fitted
attributes), ``_log_density`` (torch rows -> log p(x)) and the state hooks used by
``save``/``load``. ``__init__`` only stores arguments; validation happens in ``fit``. The
per-component API (``responsibilities``, ``explain``, ...) comes from
``fednovelty.detectors.explain.ComponentsMixin``.

Per-round hooks are a fit-time argument, ``fit(..., callbacks=[...])``, not a constructor
parameter: they are code, not hyper-parameters, so ``clone``/``get_params`` never see them and
the fitted detector stays saveable. ``fit`` keeps them in the private ``_fit_callbacks`` only
while it runs (removed in a ``finally``), and ``_simulate`` hands them to the engine. Every
round a fit runs is numbered in one sequence ``1..n_rounds_`` (e.g. federated PCA's rounds,
then EM's), in ``history_`` and in the records the callbacks receive alike.

A federated PCA front end (``pca_components``; ``docs/high_dimension.md``) is the same for
every mixture family that has it (``_pca_front_end``; ``fednovelty.detectors._front_end``):
``_fit`` runs federated PCA on the clients' rows first, then the family's own fit on the
projected rows, its algorithm wrapped so that the server sends the projection and each
client projects its own rows; ``score_samples`` is the family's log-density of the
projection plus the probabilistic-PCA residual term, a log-density of ``x``.

Fits are atomic: every method that sets fitted state (``fit``, ``partial_fit``) is wrapped by
``atomic_fit`` (``fednovelty.detectors._fit_state``), which deep-copies the estimator's state
first and puts it back on any error, so a failed refit keeps the previous model exactly (its
``n_features_in_``, ``feature_names_in_`` and ``client_ids_`` included) and a failed first fit
leaves the estimator unfitted. What a detector saves and restores:
``fednovelty.detectors._saved_state``.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from contextlib import contextmanager
from typing import ClassVar

import numpy as np
import torch
from pyod.models.base import BaseDetector
from sklearn.utils.validation import check_is_fitted

from fednovelty.detectors import _params
from fednovelty.detectors import options as _options  # noqa: F401 - the classes register
from fednovelty.detectors._conformal import ConformalMixin, split_for_calibration
from fednovelty.detectors._data_loss import Releases, kept_components, warn_data_loss
from fednovelty.detectors._dp import check_delta, private_threshold
from fednovelty.detectors._fit_state import atomic_fit, check_callbacks, renumbered, seed_from
from fednovelty.detectors._front_end import ClientViews, FrontEndMixin, check_front_end_params
from fednovelty.detectors._labels import encode_labels
from fednovelty.detectors._members import fit_members
from fednovelty.detectors._mixture_surface import MixtureSurfaceMixin
from fednovelty.detectors._probability import outlier_probability
from fednovelty.detectors._row_input import fit_source, refuse_source, score_source, stream_scores
from fednovelty.detectors._saved_state import SavedStateMixin
from fednovelty.detectors._validation import check_groups, check_X, feature_names, split_by_client
from fednovelty.detectors.explain import ComponentsMixin
from fednovelty.detectors.persistence import register
from fednovelty.exceptions import NotFittedError
from fednovelty.federated.init.settings import PrivateSettings
from fednovelty.federated.mixtures.projected import Projected
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.mixture import MixtureParams
from fednovelty.mixture.rows import is_row_source
from fednovelty.runtime import run_simulation
from fednovelty.runtime.threads import scoring_threads


class SimulatedFitMixin(FrontEndMixin):
    """What every estimator that trains on a simulated federation shares: its torch options
    (``device``, ``dtype``), its clients' privacy policy (``Privacy.min_rows``), its option
    objects (:mod:`fednovelty.detectors.options`: validated, read through :meth:`_option`,
    nested ``set_params``), client rows as tensors and the run of an algorithm on the
    in-process engine (``_simulate``: the history, rounds and bytes it records, ``fit``'s
    callbacks)."""

    #: how the estimator is fitted, for the not-fitted error.
    _fit_call: ClassVar[str] = "fit(X, groups=...)"
    #: whether ``n_components`` is an upper bound the fit prunes by design (variational
    #: mixtures set their own ``effective_n_components_``); otherwise a mixture's fit sets
    #: ``effective_n_components_`` to the components backed by at least one training row.
    PRUNES_COMPONENTS: ClassVar[bool] = False
    #: the constructor's parameters: each estimator writes its ``__init__`` and declares its
    #: own parameters and the options it reads; the others come from the shared table
    #: (``_shared_params``), in the signature's order with its defaults
    #: (``fednovelty.detectors._declare.compose``); ``_parameter_constraints`` and the
    #: ``Args:`` docs come from it.
    _shared_params: ClassVar[dict] = _params.SHARED
    _params: ClassVar[_params.ParamSet] = _params.declare()

    #: settings saved under an older name in files this class loads: old name -> new name.
    _renamed_params: ClassVar[dict[str, str]] = {}
    #: whether the estimator takes the federated PCA front end; a class that sets it declares
    #: the ``_params.PCA`` group (``pca_components``) in its ``_params``
    #: (:func:`~fednovelty.detectors._front_end.check_front_end_params`).
    _pca_front_end: ClassVar[bool] = False
    #: whether ``fit`` takes rows read in chunks (``fednovelty.detectors._row_input``).
    _row_sources: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "_params" in cls.__dict__:
            _params.compose(cls)
            check_front_end_params(cls)
        register(cls)  # every estimator class is loadable by name (persistence.REGISTRY)

    def max_fit_rounds(self, n_features: int | None = None) -> int | None:
        """Most communication rounds ``fit`` can run with these settings on rows
        ``n_features`` wide (default: the fitted width, if any): a progress bar's total;
        None if the estimator does not know it before it sees the data."""
        return None

    # -------------------------------------------------------------- configuration
    def _torch_options(self) -> dict:
        device = torch.device(self.device or "cpu")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "device='cuda' was requested but torch sees no CUDA device; use device='cpu'."
            )
        return {"device": device, "dtype": getattr(torch, self.dtype)}

    def _option(self, name: str):
        """The fields of the option object ``name`` (``"privacy"``, ``"robustness"``,
        ``"sampling"``, ``"initialisation"``, ``"prior"``) as this estimator uses them: the
        object's, or its class's defaults where the estimator holds ``None`` (or does not
        take the option), a field's ``"auto"`` resolved for this estimator
        (a ``SimpleNamespace``; the object given is never changed)."""
        return self._params.option_values(self, name)

    def _validate_params(self) -> None:
        """scikit-learn's check of the parameters' constraints, then the option objects':
        their fields' constraints, and no field set that this estimator does not read."""
        super()._validate_params()
        self._params.check_options(self)

    def set_params(self, **params):
        """scikit-learn's ``set_params``; a nested option field
        (``set_params(privacy__epsilon=1.0)``) on an option left at ``None`` sets it on a
        new option object of the defaults (never a shared one)."""
        options = {p.name: p.option for p in self._params.options}
        for key in params:
            name, nested, _ = key.partition("__")
            if nested and name in options and getattr(self, name) is None and name not in params:
                setattr(self, name, options[name]())
        return super().set_params(**params)

    def _settings(self, n_features: int, config: type | None = None) -> dict:
        """The algorithm's settings from the declared parameters (``role="algorithm"``, an
        option's fields by their own role), renamed and converted as declared (e.g.
        ``Prior.strength="auto"`` for rows of ``n_features``); with ``config``, only those
        that settings class has."""
        return self._params.settings(self, n_features, config=config)

    def _engine_settings(self) -> dict:
        """The engine's options from the declared parameters (``ClientSampling``'s)."""
        return self._params.settings(self, 0, role="engine")

    def _privacy_policy(self, **options) -> PrivacyPolicy:
        """The privacy policy of the simulated clients: at least ``Privacy.min_rows`` rows
        behind every statistic they release (``docs/privacy.md``); ``options`` set the
        policy's other fields."""
        return PrivacyPolicy(min_rows=int(self._option("privacy").min_rows), **options)

    def _as_tensor(self, X: np.ndarray) -> torch.Tensor:
        options = self._torch_options()
        if is_row_source(X):  # rows read in chunks stay a source (``_row_input``)
            return X.astype(**options)
        if not X.flags.writeable:  # torch cannot share read-only memory; copy once
            X = np.array(X)
        return torch.as_tensor(X).to(**options)

    def _simulate(
        self,
        algorithm,
        clients: list[torch.Tensor],
        seed: int,
        full: bool = False,
        round_offset: int = 0,
        privacy: PrivacyPolicy | None = None,
        **engine,
    ):
        """Run ``algorithm`` on the engine ``ClientSampling.engine`` names (the in-process
        engine, or Flower's Simulation Engine:
        :func:`~fednovelty.runtime.flower.sim_engine.run_flower_simulation`), record the
        rounds, return its state (the whole ``SimulationResult`` with ``full``).

        Rounds are numbered from ``round_offset + 1`` (the rounds this fit ran before, the
        earlier members' included: ``fednovelty.detectors._members``), in
        ``history_`` and in the records passed to ``fit``'s callbacks. Every client enforces
        ``privacy`` (default :meth:`_privacy_policy`). Given the PCA front end's
        :class:`ClientViews`, the algorithm runs wrapped in ``Projected`` on the clients'
        original rows (the clients project them). Within ``fit`` the rounds' releases and
        skips are tallied for its data-loss warnings (``_data_loss``)."""
        callbacks = getattr(self, "_fit_callbacks", ())
        round_offset += self.__dict__.get("_member_rounds", 0)  # earlier members' rounds
        front = self.__dict__.get("_front_end_run")
        wrapped = front is not None and isinstance(clients, ClientViews)
        if wrapped:  # the family's algorithm on the projected rows: the clients project
            algorithm = Projected(algorithm, front.projection, resend=front.resend)
            clients = clients.rows
            round_offset += len(front.pca.history)
        if round_offset:
            callbacks = [renumbered(callback, round_offset) for callback in callbacks]
        run = run_simulation  # ClientSampling.engine: the in-process engine or Flower's
        if (engine.pop("engine", None) or self._option("sampling").engine) == "flower-sim":
            from fednovelty.runtime.flower.sim_engine import run_flower_simulation as run
        result = run(
            algorithm,
            clients,
            random_state=seed,
            progress=self.progress,
            callbacks=callbacks,
            description=type(self).__name__,
            privacy=self._privacy_policy() if privacy is None else privacy,
            **engine,
        )
        self.history_ = [
            {**record.as_dict(), "round": record.round + round_offset} for record in result.history
        ]
        self.n_rounds_ = len(result.history)
        self.bytes_up_ = result.bytes_up
        self.bytes_down_ = result.bytes_down
        releases = self.__dict__.get("_fit_releases")
        if releases is not None:  # the running fit's tally of who released what
            releases.add(result.history)
        if wrapped:
            result = dataclasses.replace(result, state=result.state.inner)
        return result if full else result.state

    # -------------------------------------------------------------- the fit template
    #: whether ``fit`` needs labels ``y`` (a classifier or a joint model of ``(x, y)``), and
    #: what to use instead without them.
    _labelled: ClassVar[bool] = False
    _without_labels: ClassVar[str] = ""

    @atomic_fit
    def _fit(self, X, y, groups, callbacks):
        """The fit every estimator runs: check the settings, the callbacks, ``X``, the labels
        (``_label_codes``) and ``groups``; set the input attributes; split the rows (and
        labels) by client; train (``_fit_clients``, once per member with ``n_members``:
        ``fednovelty.detectors._members``) with the callbacks; then ``_after_fit``
        (a detector's PyOD outputs); last, a ``DataLossWarning`` for each loss the fit met
        (:func:`~fednovelty.detectors._data_loss.warn_data_loss`). Returns self; on any error
        the estimator keeps its previous fitted state (``atomic_fit``)."""
        self._validate_params()
        callbacks = check_callbacks(callbacks)
        array = self._check_X(X)
        codes = self._label_codes(y, array.shape[0])
        client_ids, group_codes = check_groups(groups, array.shape[0])
        self.n_features_in_ = array.shape[1]
        privacy = self._option("privacy")
        if privacy.epsilon is not None:
            check_delta(privacy.delta, array.shape[0])
        names = feature_names(array if is_row_source(array) else X)
        if names is not None:
            self.feature_names_in_ = names
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        self.client_ids_ = client_ids
        self.n_clients_ = len(client_ids)
        seed = seed_from(self.random_state)
        # calibration="conformal" holds rows out of training (fednovelty.detectors._conformal)
        array, codes, group_codes, held = split_for_calibration(
            self, array, codes, group_codes, seed
        )
        parts = split_by_client(array, group_codes, self.n_clients_)
        labels = None if codes is None else split_by_client(codes, group_codes, self.n_clients_)
        rows = [part.shape[0] for part in parts]
        self._fit_callbacks = callbacks
        try:
            with self._data_losses("fit", rows):
                try:
                    tensors = [self._as_tensor(p) for p in parts]
                    if self._pca_front_end and labels is None:
                        parts, tensors = self._front_end(parts, tensors, seed)
                    fit_members(self, parts, tensors, seed, labels)
                    self._join_front_end_record()
                finally:
                    self.__dict__.pop("_front_end_run", None)
                self._after_fit(array, group_codes)
            if held is not None:  # the calibration round follows the fit's rounds
                self._calibrate_clients(dict(enumerate(held)), seed, 5, "fit")
        finally:
            del self._fit_callbacks
        return self

    @contextmanager
    def _data_losses(self, method: str, rows: list[int], taking_part: int | None = None):
        """Tally the rounds run inside the block (``_simulate`` reads ``_fit_releases``);
        after it succeeds, set ``effective_n_components_`` and give ``method``'s data-loss
        warnings (:func:`~fednovelty.detectors._data_loss.warn_data_loss`) for clients of
        ``rows`` rows (``client_ids_`` order; 0 for a client not in a window), of which
        ``taking_part`` held rows (default: all)."""
        self._fit_releases = releases = Releases()
        try:
            yield
        finally:
            del self._fit_releases
        weights = getattr(self, "weights_", None)
        if not self.PRUNES_COMPONENTS and weights is not None and np.ndim(weights) == 1:
            self.effective_n_components_ = kept_components(weights, sum(rows))
        # the user's line: past this generator, contextlib, _fit (or partial_fit), atomic_fit
        # and fit
        level = 6 if method == "fit" else 5
        warn_data_loss(self, releases, rows, level, method, taking_part)

    def _label_codes(self, y, n_rows: int) -> np.ndarray | None:
        """Integer codes (n_rows,) of the labels a labelled fit models, ``classes_`` set; or
        None: the unsupervised detectors ignore ``y`` (PyOD's contract).

        Raises:
            ValueError: a labelled fit without ``y``, not one label per row, or one class.
        """
        if not self._labelled:
            return None
        if y is None:
            raise ValueError(
                f"{type(self).__name__}.fit requires y to be passed, but the target y is None: "
                "fit(X, y, groups) with one label per row." + self._without_labels
            )
        self.classes_, codes = encode_labels(y, n_rows, getattr(self, "_fit_classes", None))
        return codes

    def _fit_clients(
        self,
        parts: list[np.ndarray],
        clients: list[torch.Tensor],
        seed: int,
        labels: list[np.ndarray] | None = None,
    ) -> None:
        """Train on the clients' rows (``parts`` as arrays, ``clients`` as tensors, in
        ``client_ids_`` order; ``labels``: each client's label codes in a labelled fit) and
        set the fitted attributes."""
        raise NotImplementedError

    def _after_fit(self, array: np.ndarray, group_codes: np.ndarray) -> None:
        """What a fit sets last from the training rows ``array`` (n_samples, n_features) and
        each row's client, ``group_codes`` (n_samples,) indexes into ``client_ids_`` (nothing
        by default)."""

    # -------------------------------------------------------------- checks
    def _check_fitted(self) -> None:
        try:
            check_is_fitted(self, "history_")
        except Exception:
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet; call "
                f"{self._fit_call} first, or load a saved model with fednovelty.load(path)."
            ) from None

    def _check_X(self, X, *, fitted: bool = False) -> np.ndarray:
        """``X`` checked (``check_X``) as rows this estimator computes with: no value whose
        square overflows its ``dtype``; with ``fitted``, the width and the column names seen
        in fit (scikit-learn's feature-name warnings; other columns named); a row source
        fit streams comes back validated (``_row_input.fit_source``)."""
        if not fitted:
            source = fit_source(self, X)
            return check_X(X, dtype=self.dtype) if source is None else source
        return check_X(
            X,
            n_features=self.n_features_in_,
            fitted_by=type(self).__name__,
            dtype=self.dtype,
            feature_names_in=getattr(self, "feature_names_in_", None),
        )

    def _check_score_input(self, X) -> torch.Tensor:
        """Rows to score as a tensor (:meth:`_check_score_array`)."""
        return self._as_tensor(self._check_score_array(X))

    def _check_score_array(self, X) -> np.ndarray:
        """Rows to score (n_samples, n_features), float64: the estimator fitted and ``X``
        checked (:meth:`_check_X`: its width and column names against those seen in fit); a
        row source or path is refused (``_row_input.refuse_source``)."""
        self._check_fitted()
        refuse_source(self, X)
        return self._check_X(X, fitted=True)


class MixtureDetector(
    ConformalMixin,
    MixtureSurfaceMixin,
    ComponentsMixin,
    SimulatedFitMixin,
    SavedStateMixin,
    BaseDetector,
):
    """Base class of the fednovelty detectors (not used directly).

    Besides PyOD's contract every detector has the per-component API of
    ``fednovelty.detectors.explain.ComponentsMixin``: ``component_log_densities``,
    ``component_weights``, ``responsibilities``, ``predict_components`` and ``explain``;
    and the conformal calibration of ``fednovelty.detectors._conformal.ConformalMixin``
    (``calibration="conformal"``): ``predict(X, client=...)``, ``p_values``,
    ``discoveries`` and ``calibrate``.
    """

    # -------------------------------------------------------------- fitting
    def fit(self, X, y=None, groups=None, *, callbacks=()):
        """Fit on rows ``X`` (n_samples, n_features) split into clients by ``groups``.

        Args:
            X: numpy array or pandas DataFrame of numeric features.
            y: ignored (present for API consistency).
            groups: client id of each row, shape (n_samples,); ``None`` means one client.
            callbacks: callables, each called with every ``fednovelty.runtime.RoundRecord``
                as its communication round completes (rounds numbered ``1..n_rounds_``, as
                in ``history_``); kept only while ``fit`` runs. For example
                ``det.fit(X, groups=g, callbacks=[lambda r: print(r.round, r.kind)])``.

        Returns:
            self

        Raises:
            TypeError: ``callbacks`` is not a sequence of callables.
        """
        return self._fit(X, None, groups, callbacks)

    def _after_fit(self, array: np.ndarray, group_codes: np.ndarray) -> None:
        """PyOD's ``decision_scores_``, ``threshold_`` and ``labels_`` on the training rows;
        after a private fit (``privacy_spent_``) the threshold is the exponential
        mechanism's quantile (:func:`private_threshold`), charged to the budget."""
        self._classes = 2  # PyOD's predict_proba reads it
        self.decision_scores_ = self.decision_function(array)
        self._process_decision_scores()
        if hasattr(self, "privacy_spent_"):
            self.threshold_ = private_threshold(self)
            self.labels_ = (self.decision_scores_ > self.threshold_).astype(int)

    def _set_mixture(self, params: MixtureParams) -> None:
        """Store a fitted mixture and its scikit-learn-named numpy attributes."""
        self.model_ = params
        self.weights_ = params.weights.cpu().numpy()
        self.means_ = params.means.cpu().numpy()
        self.precisions_cholesky_ = params.precisions_cholesky.cpu().numpy()
        self.covariances_ = params.covariances.cpu().numpy()
        self.n_components_ = params.n_components

    @classmethod
    def from_model(cls, result, X, **params):
        """A fitted detector from a model trained elsewhere, e.g. on Flower nodes.

        Args:
            result: the finished run of this class's algorithm: a ``SimulationResult``, or
                the ``FlowerResult`` of ``fednovelty.runtime.flower.load_result(path)``.
            X: rows (n_samples, n_features) that set ``decision_scores_``, ``threshold_``
                and ``labels_`` as the training rows do in ``fit`` (e.g. the pooled training
                rows, or a held-out set of normal rows).
            **params: constructor arguments; those not given are taken from the run's
                algorithm settings (``result.config``) where the names agree.

        Returns:
            The detector, fitted: it scores, saves and loads like one from ``fit``.

        Example::

            from fednovelty.runtime.flower import load_result
            det = FedGenGMMDetector.from_model(load_result("result.safetensors"), X_normal)
        """
        # the run's differential-privacy settings are the server's view (the noise it
        # knew); the detector's Privacy plans a fit from a budget instead
        server_only = {f.name for f in dataclasses.fields(PrivateSettings)}
        config = {k: v for k, v in getattr(result, "config", {}).items() if k not in server_only}
        detector = cls(**{**cls._params.from_names(config), **params})
        detector._validate_params()
        if detector.calibration == "conformal":
            raise ValueError(
                "from_model cannot calibrate conformally (no client's held-out rows reach it); "
                "pass calibration='contamination', or fit the detector with groups."
            )
        array = detector._check_X(X)
        detector.n_features_in_ = array.shape[1]
        if feature_names(X) is not None:
            detector.feature_names_in_ = feature_names(X)
        ids = {c for record in result.history for c in record.sampled} | set(result.client_states)
        detector.client_ids_ = np.asarray(sorted(ids))
        detector.n_clients_ = len(ids)
        detector.history_ = [record.as_dict() for record in result.history]
        detector.n_rounds_ = len(result.history)
        detector.bytes_up_, detector.bytes_down_ = result.bytes_up, result.bytes_down
        detector._set_result(result)
        detector._classes = 2
        detector.decision_scores_ = detector.decision_function(array)
        detector._process_decision_scores()
        return detector

    def _set_result(self, result) -> None:
        """Fitted attributes from a finished run (``from_model``): one mixture with federated
        EM's record (``n_iter_``, ``converged_``, ``lower_bounds_``, personal
        ``client_weights_`` in ``client_ids_`` order). Subclasses with other models override."""
        state = result.state
        if getattr(state, "learners", None):
            raise ValueError(
                "from_model does not rebuild joint models (JointFedGMM runs) yet; fit "
                "JointFedGMMDetector in the simulation instead."
            )
        if state.params.n_features != self.n_features_in_:
            raise ValueError(
                f"X has {self.n_features_in_} features but the model was trained on "
                f"{state.params.n_features}."
            )
        self._set_mixture(state.params.to(**self._torch_options()))
        self.n_iter_, self.converged_ = state.n_iter, state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        if state.client_weights:
            rows = [state.client_weights.get(c, state.params.weights) for c in self.client_ids_]
            self.client_weights_ = torch.stack(rows).cpu().numpy()

    # -------------------------------------------------------------- scoring
    @abstractmethod
    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        """log p(x) of torch rows (n_samples, n_features) -> (n_samples,)."""

    def score_samples(self, X) -> np.ndarray:
        """Log-density ``log p(x)`` of each row, shape (n_samples,); higher = more normal.
        With the PCA front end (``pca_``): the family's log-density of the projected rows
        plus the residual term of the discarded directions. Rows read in chunks (a row
        source, a path, an ``np.memmap``) are scored chunk by chunk (``_row_input``)."""
        self._check_fitted()
        source = score_source(self, X)
        if source is not None:
            return stream_scores(self, source, self._x_log_density)
        Xt = self._check_score_input(X)
        with torch.no_grad(), scoring_threads(*Xt.shape, getattr(self, "n_components_", 1)):
            return self._x_log_density(Xt).cpu().numpy().astype(np.float64)

    def _x_log_density(self, X: torch.Tensor) -> torch.Tensor:
        """``log p(x)`` of rows (n, n_features) -> (n,), through the PCA front end when the
        detector has one."""
        pca = getattr(self, "pca_", None)
        if pca is None or not self._pca_front_end:
            return self._log_density(X)
        if self._labelled:  # a joint model scores the projection (as its log_px)
            return self._log_density(pca.transform(X))
        return self._log_density(pca.transform(X)) + self._residual(X)

    def decision_function(self, X) -> np.ndarray:
        """Anomaly score ``-log p(x)``, shape (n_samples,); higher = more anomalous."""
        return -self.score_samples(X)

    def predict_proba(self, X, method="linear", return_confidence=False):
        """Outlier probabilities as PyOD's, shape (n_samples, 2); column 1 = anomaly.

        ``method="linear"`` scales ``decision_function(X)`` by the training scores' range
        (``decision_scores_``' minimum -> 0, maximum -> 1) and clips to [0, 1];
        ``"unify"`` is ``erf((score - mean) / (std * sqrt(2)))`` of the training scores,
        clipped. Unlike PyOD's, a score of +inf (a row so far out that its density underflows
        to 0) gets probability 1 and -inf gets 0, and the training range and moments use the
        finite training scores: never NaN. ``return_confidence`` adds PyOD's confidence.
        """
        self._check_fitted()
        if method not in ("linear", "unify"):
            raise ValueError(f"method must be 'linear' or 'unify', got {method!r}.")
        if not hasattr(self, "decision_scores_"):
            raise ValueError(
                "this private model was loaded from a file, which keeps no training scores "
                "(an exact score per training row would leave with the model); predict_proba "
                "scales by them: use predict (the private threshold_) or decision_function."
            )
        array = self._checked_array(X)
        anomaly = outlier_probability(
            np.asarray(self.decision_function(array), dtype=np.float64),
            np.asarray(self.decision_scores_, dtype=np.float64),
            method,
        )
        probs = np.column_stack([1.0 - anomaly, anomaly])
        if return_confidence:
            return probs, self.predict_confidence(array)
        return probs

    def _checked_array(self, X):
        """``X`` validated for scoring, kept as a DataFrame when it is one (feature names),
        or as a row source (scored chunk by chunk)."""
        source = score_source(self, X)
        if source is not None:
            return source
        if feature_names(X) is not None:
            return X
        return self._check_X(X, fitted=True)


def labelled_tensors(
    clients: list[torch.Tensor], labels: list[np.ndarray]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each client's ``(rows, label codes)`` as tensors on the rows' device: what a labelled
    algorithm's clients hold (``clients``: (n_c, n_features) tensors; ``labels``: (n_c,)
    codes, in the same order)."""
    return [
        (rows, torch.as_tensor(codes, device=rows.device))
        for rows, codes in zip(clients, labels, strict=True)
    ]
