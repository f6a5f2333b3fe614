"""What the Train page runs: settings, detectors, fitting with per-round progress, model files.

- :class:`DataSettings` and :class:`MethodSettings` (frozen dataclasses) describe a run;
  :func:`run_key` turns them into the key under which the app caches the trained model, so
  the same settings are trained once per server process.
- :func:`build_bundle` makes the data, :func:`build_detector` the (unfitted) detector and
  :func:`train` fits it and returns a :class:`TrainedRun`.
- :func:`~fednovelty_app.progress.fit_with_progress` reports each communication round while a
  detector fits (:mod:`fednovelty_app.progress`, re-exported here).
- :func:`model_to_bytes` / :func:`model_from_bytes`: the safetensors model file (no pickle).

Choices, and why:

- Methods come from the registry (:mod:`fednovelty.methods`), read when the page runs (a
  method added to ``METHODS`` appears at once): the page offers its novelty methods, with
  DEM's four initialisations as one choice (``DEM``, ``init_params`` a setting) and
  FedGenGMM's copula as a setting of ``FedGenGMM`` (:func:`registry_name`). FedGMM on
  labelled data with ``joint`` fits the registry's ``PFL-FedGMM``, the joint estimator
  ``JointFedGMMDetector``, with ``fit(X, y, groups)``. What a choice's ``max_iter`` counts
  comes from its detector (:func:`counts_rounds`, :func:`fits_locally`), the progress bar's
  total from the detector's ``max_fit_rounds()``.
- Default settings (the Train page's first run): the FedGMM paper's synthetic data, 10
  training clients + 2 unseen, d = 8, FedGMM's joint model with 3 Gaussians, 3 linear
  learners, 5 local epochs, 30 rounds: every page has something to show, quickly.
- Alarm calibration (:attr:`MethodSettings.calibration`): PyOD's contamination rule by
  default; ``"conformal"`` builds the detector with ``calibration="conformal"`` and
  ``alpha`` (split conformal: each client holds out ``calibration_share``, 0.2, of its rows
  and keeps its own alarm threshold; ``fednovelty.detectors._conformal`` has the method).
  Only the methods whose detector takes ``calibration`` offer it (:func:`calibrates`): the
  PyOD baselines do not.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fednovelty_app.data import SYNTHETIC, DataBundle, adbench_bundle, synthetic_bundle
from fednovelty_app.progress import Progress, fit_with_progress, max_rounds

from fednovelty.methods import Method, get_method, method_names

__all__ = [
    "CALIBRATIONS",
    "DataSettings",
    "MethodSettings",
    "ModelFileError",
    "Progress",
    "TrainedRun",
    "build_bundle",
    "build_detector",
    "calibrates",
    "centralized_choices",
    "choice_method",
    "counts_rounds",
    "federated_choices",
    "fit_with_progress",
    "fits_locally",
    "max_rounds",
    "method_description",
    "model_from_bytes",
    "model_to_bytes",
    "registry_name",
    "run_key",
    "train",
    "uploaded_run",
]

#: Page choices that stand for several registry methods -> (the setting that tells them
#: apart, its value -> registry name).
GROUPED: dict[str, tuple[str, dict]] = {
    "DEM": (
        "init_params",
        {init: f"DEM-{init}" for init in ("kmeans", "separated", "subset", "oneshot")},
    ),
    "FedGenGMM": ("copula", {False: "FedGenGMM", True: "FedGenGMM-copula"}),
}
#: The joint model of the FedGMM choice on labelled data.
JOINT_METHOD = "PFL-FedGMM"


def _choices() -> list[str]:
    """The registry's novelty methods as page choices (``GROUPED`` members as their group)."""
    group_of = {name: group for group, (_, names) in GROUPED.items() for name in names.values()}
    return list(dict.fromkeys(group_of.get(name, name) for name in method_names()))


def choice_method(choice: str) -> Method:
    """The registry entry a page choice stands for (a group: its first member).

    Raises:
        ValueError: an unknown name (from the registry).
    """
    if choice in GROUPED:
        return get_method(next(iter(GROUPED[choice][1].values())))
    return get_method(choice)


def federated_choices() -> dict[str, str]:
    """Page choices fitted on clients (``groups=``) -> what they are (the registry's
    description), read from the registry on every call."""
    return {
        choice: choice_method(choice).description
        for choice in _choices()
        if choice_method(choice).fits_clients
    }


def centralized_choices() -> tuple[str, ...]:
    """Page choices fitted on the pooled rows (the papers' "ideal" and PyOD with its
    defaults)."""
    return tuple(c for c in _choices() if not choice_method(c).fits_clients)


def fits_locally(choice: str) -> bool:
    """Whether the choice's detector fits its mixtures within each client in one round
    (``max_fit_rounds() == 1``): its ``max_iter`` counts a client's own EM iterations."""
    return getattr(choice_method(choice).build(), "max_fit_rounds", lambda: None)() == 1


def counts_rounds(choice: str) -> bool:
    """Whether the choice's ``max_iter`` counts federated rounds (the page's "rounds at
    most"): its detector takes ``max_iter`` and does not fit within each client."""
    return "max_iter" in choice_method(choice).parameters() and not fits_locally(choice)


def calibrates(choice: str) -> bool:
    """Whether the choice's detector takes ``calibration`` (and so ``"conformal"`` alarms);
    FedGMM's joint model takes it as the plain one does."""
    return "calibration" in choice_method(choice).parameters()


#: The page's alarm calibrations: PyOD's contamination share or split conformal.
CALIBRATIONS = ("contamination", "conformal")

PLAIN_TOL = 1e-3
JOINT_TOL = 1e-6  # joint models run (nearly) every round: learners improve after the Gaussians


class ModelFileError(ValueError):
    """An uploaded model file cannot be used (not a fednovelty model, or another dataset)."""


@dataclass(frozen=True)
class DataSettings:
    """Which data and how it is split into clients.

    Attributes:
        source: ``SYNTHETIC``, an ADBench name, or ``"upload"``.
        n_clients: training clients; n_unseen: clients held out of training.
        alpha: Dirichlet concentration (synthetic: of the clients' component weights;
            ADBench: of the cluster shares; quantity partition: clusters per client).
        seed: drives data, partition and the detectors.
        protocol, partition, max_train: ADBench only (``make_task``).
        n_features: synthetic only.
        upload_digest, client_column, label_column, novel_column, upload_name: uploads only.
    """

    source: str = SYNTHETIC
    n_clients: int = 10
    n_unseen: int = 2
    alpha: float = 0.4
    seed: int = 0
    protocol: str = "novelty"
    partition: str = "dirichlet"
    max_train: int | None = 20_000
    n_features: int = 8
    upload_digest: str | None = None
    client_column: str | None = None
    label_column: str | None = None
    novel_column: str | None = None
    upload_name: str | None = None


@dataclass(frozen=True)
class MethodSettings:
    """Which detector and its main parameters.

    Attributes:
        method: a key of :func:`federated_choices` or an entry of
            :func:`centralized_choices` (see :func:`registry_name` for the registry method
            it fits).
        n_components: K of the global mixture (FedGMM, DEM, FedGenGMM, CentralGMM).
        covariance_type: ``"full"``, ``"diag"``, ``"tied"`` or ``"spherical"``.
        max_iter: maximum EM rounds.
        init_params: DEM's initialisation (``"kmeans"``, ``"separated"``, ``"subset"``,
            ``"oneshot"``: one round of local fits, then EM rounds with SQUAREM).
        joint: FedGMM fits the joint model p(x, y) when the data are labelled.
        n_learners, local_epochs: the joint model's learners.
        client_components: K_c of FedGenGMM / Local clients; None = BIC over 1..10.
        copula: FedGenGMM scores with a Gaussian copula fitted on the server's synthetic rows.
        calibration: ``"contamination"`` (PyOD's threshold) or ``"conformal"`` (per-client
            split-conformal thresholds; methods for which :func:`calibrates` is true).
        alpha: the conformal false-alarm rate per client, in (0, 0.5].
    """

    method: str = "FedGMM"
    n_components: int = 3
    covariance_type: str = "full"
    max_iter: int = 30
    init_params: str = "kmeans"
    joint: bool = True
    n_learners: int = 3
    local_epochs: int = 5
    client_components: int | None = None
    copula: bool = False
    calibration: str = "contamination"
    alpha: float = 0.01


def run_key(data: DataSettings, method: MethodSettings) -> str:
    """A stable text key of a run's settings (the model cache's key)."""
    return json.dumps({"data": asdict(data), "method": asdict(method)}, sort_keys=True)


def build_bundle(settings: DataSettings, frame=None) -> DataBundle:
    """The data of ``settings``; ``frame`` is the uploaded table when ``source="upload"``.

    Raises:
        ValueError: bad settings for the source (from ``make_task``), or an ``UploadError``.
    """
    if settings.source == SYNTHETIC:
        return synthetic_bundle(
            settings.n_clients,
            settings.alpha,
            settings.n_unseen,
            settings.n_features,
            settings.seed,
        )
    if settings.source == "upload":
        from fednovelty_app.data import upload_bundle

        if frame is None:
            raise ValueError("source='upload' needs the uploaded table.")
        return upload_bundle(
            frame,
            settings.client_column,
            settings.label_column,
            settings.novel_column,
            n_unseen=settings.n_unseen,
            seed=settings.seed,
            name=settings.upload_name or "upload",
        )
    return adbench_bundle(
        settings.source,
        settings.protocol,
        settings.partition,
        settings.n_clients,
        settings.alpha,
        settings.n_unseen,
        settings.seed,
        settings.max_train,
    )


def is_joint(method: MethodSettings, bundle: DataBundle) -> bool:
    """Whether this run fits FedGMM's joint model p(x, y)."""
    return method.method == "FedGMM" and method.joint and bundle.labelled


def registry_name(method: MethodSettings, *, joint: bool = False) -> str:
    """The registry method (:mod:`fednovelty.methods`) a page choice with its settings is.

    Raises:
        ValueError: an unknown method name, or ``joint`` for another choice than FedGMM.
    """
    if method.method not in _choices():
        raise ValueError(f"unknown method {method.method!r}; choose one of {_choices()}.")
    if joint:
        if method.method != "FedGMM":
            raise ValueError(f"joint=True fits FedGMM's joint model; got {method.method!r}.")
        return JOINT_METHOD
    if method.method not in GROUPED:
        return method.method
    setting, names = GROUPED[method.method]
    value = getattr(method, setting)
    if value not in names:
        raise ValueError(f"{method.method}: {setting} must be one of {list(names)}; got {value!r}.")
    return names[value]


def method_description(method: MethodSettings) -> str:
    """The registry's one-line description of what ``method`` fits."""
    return get_method(registry_name(method)).description


def _fit_settings(method: MethodSettings, joint: bool) -> dict:
    """The page's round and learner settings, as the chosen detector takes them."""
    if joint:
        from fednovelty.detectors.options import Training

        return {
            "max_iter": method.max_iter,
            "tol": JOINT_TOL,
            "n_learners": method.n_learners,
            "training": Training(local_epochs=method.local_epochs),
        }
    if counts_rounds(method.method):
        takes_tol = "tol" in choice_method(method.method).parameters()
        return {"max_iter": method.max_iter, **({"tol": PLAIN_TOL} if takes_tol else {})}
    if fits_locally(method.method):  # EM within each client: its own iterations
        return {"max_iter": max(method.max_iter, 100)}
    return {}


def build_detector(method: MethodSettings, seed: int, *, joint: bool = False):
    """An unfitted detector for ``method``, built by the registry (``registry_name``); with
    ``method.calibration == "conformal"`` also ``calibration="conformal", alpha=...``.

    Raises:
        ValueError: an unknown method name or calibration, or ``"conformal"`` for a method
            whose detector has no ``calibration`` (a PyOD baseline).
    """
    entry = get_method(registry_name(method, joint=joint))
    shared = entry.shared_params(
        n_components=method.n_components,
        client_components=method.client_components,
        covariance_type=method.covariance_type,
        random_state=seed,
    )
    return entry.build(**shared, **_fit_settings(method, joint), **_calibration(method, entry))


def _calibration(method: MethodSettings, entry: Method) -> dict:
    """``{"calibration": "conformal", "alpha": ...}`` for a conformal choice, else ``{}``."""
    if method.calibration not in CALIBRATIONS:
        raise ValueError(
            f"calibration must be one of {list(CALIBRATIONS)}; got {method.calibration!r}."
        )
    if method.calibration == "contamination":
        return {}
    if "calibration" not in entry.parameters():
        raise ValueError(
            f"{method.method} has no conformal calibration (its detector takes no "
            "'calibration'); choose calibration='contamination' or a fednovelty detector."
        )
    return {"calibration": "conformal", "alpha": float(method.alpha)}


# ----------------------------------------------------------------------------- runs
@dataclass(eq=False)
class TrainedRun:
    """A fitted detector with its data and settings (what every page reads).

    Attributes:
        key: ``run_key`` of the settings (uploaded models: the file's hash).
        data, method: the settings; bundle: the data; detector: the fitted detector.
        fit_seconds: wall time of the fit; warnings: messages caught while fitting.
        origin: ``"trained"`` or ``"uploaded"``.
    """

    key: str
    data: DataSettings
    method: MethodSettings
    bundle: DataBundle
    detector: object
    fit_seconds: float
    warnings: list[str] = field(default_factory=list)
    origin: str = "trained"

    @property
    def joint(self) -> bool:
        """Whether the detector is FedGMM's joint model (log p(y|x) available)."""
        from fednovelty.detectors import JointFedGMMDetector

        return isinstance(self.detector, JointFedGMMDetector)

    @property
    def fednovelty(self) -> bool:
        """Whether the detector is a fednovelty mixture (log p(x), rounds, save)."""
        return hasattr(self.detector, "history_")

    @property
    def label(self) -> str:
        """e.g. ``"FedGMM (joint) on synthetic (10 clients, d=8)"``."""
        name = self.method.method + (" (joint)" if self.joint else "")
        return f"{name} on {self.bundle.name}"


def train(
    data: DataSettings,
    method: MethodSettings,
    bundle: DataBundle,
    on_progress: Callable[[Progress], None] = lambda progress: None,
) -> TrainedRun:
    """Fit ``method`` on ``bundle``: methods that fit clients get the client of every row, the
    joint model (``is_joint``) also the class labels: ``fit(X, y, groups)``.

    Raises:
        ValueError: from the detector (e.g. more components than rows), with its message.
    """
    joint = is_joint(method, bundle)
    entry = get_method(registry_name(method, joint=joint))
    detector = build_detector(method, data.seed, joint=joint)
    X = bundle.frame(bundle.X_train)
    groups = bundle.groups_train if entry.fits_clients else None  # pooled: one client

    def fit(hook):
        if joint:
            return detector.fit(X, bundle.y_train, groups, callbacks=[hook])
        if entry.kind == "pyod":  # no rounds, no callbacks=
            return detector.fit(X)
        return detector.fit(X, groups=groups, callbacks=[hook])

    started = time.perf_counter()
    detector, caught = fit_with_progress(fit, on_progress, total=max_rounds(detector))
    return TrainedRun(
        key=run_key(data, method),
        data=data,
        method=method,
        bundle=bundle,
        detector=detector,
        fit_seconds=time.perf_counter() - started,
        warnings=caught,
    )


_SAVE_LOCK = threading.Lock()


def model_to_bytes(detector) -> bytes:
    """The detector's safetensors file (``detector.save``) as bytes.

    Raises:
        ModelFileError: the detector cannot be saved (a PyOD baseline, or a custom learner).
    """
    if not hasattr(detector, "save"):
        raise ModelFileError(
            f"{type(detector).__name__} has no safe file format (PyOD models pickle); train "
            "it again instead."
        )
    with _SAVE_LOCK, tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.safetensors"
        try:
            detector.save(path)
        except ValueError as error:
            raise ModelFileError(str(error)) from None
        return path.read_bytes()


def model_from_bytes(content: bytes):
    """A detector from an uploaded ``.safetensors`` file (``fednovelty.load``; runs no code).

    Raises:
        ModelFileError: not a fednovelty model file, or damaged.
    """
    from fednovelty import load

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "uploaded.safetensors"
        path.write_bytes(content)
        try:
            return load(path)
        except Exception as error:  # ModelFormatError, and whatever a damaged file raises
            message = str(error).replace(repr(str(path)), "the uploaded file")
            raise ModelFileError(message) from None


def uploaded_run(detector, data: DataSettings, bundle: DataBundle, digest: str) -> TrainedRun:
    """A :class:`TrainedRun` for an uploaded model, checked against the chosen data.

    Raises:
        ModelFileError: the model expects other features than the data has.
    """
    n_features = getattr(detector, "n_features_in_", None)
    if n_features != bundle.n_features:
        raise ModelFileError(
            f"the uploaded model was trained on {n_features} features but {bundle.name} has "
            f"{bundle.n_features}; choose the data it was trained on."
        )
    names = getattr(detector, "feature_names_in_", None)
    if names is not None and list(names) != list(bundle.feature_names):
        raise ModelFileError(
            f"the uploaded model's feature names {list(names)[:6]} differ from the data's "
            f"{list(bundle.feature_names)[:6]}; choose the data it was trained on."
        )
    name = type(detector).__name__.removesuffix("Detector").removeprefix("Joint")
    if name == "FedGMM" and getattr(detector, "mixture_weights", "") == "global":
        name = "DEM"
    conformal = getattr(detector, "calibration", None) == "conformal"
    method = MethodSettings(
        method=f"uploaded {name}",
        calibration="conformal" if conformal else "contamination",
        alpha=float(detector.alpha) if conformal else MethodSettings.alpha,
    )
    return TrainedRun(
        key=f"uploaded:{digest}",
        data=data,
        method=method,
        bundle=bundle,
        detector=detector,
        fit_seconds=0.0,
        origin="uploaded",
    )
