"""The registry of named methods: the one place that lists them.

Every runner (``fednovelty bench``, ``fednovelty demo``, the CLI's choices, the dashboard) reads
:data:`METHODS`; adding a method is one :class:`Method` entry here plus its detector.

A :class:`Method` names a detector configuration: a ``factory`` that returns an unfitted
detector (imported on call, so that reading the registry imports neither the detectors nor
PyOD), its ``kind``, the ``paper`` it comes from and one line of ``description``.

- ``kind``: ``"federated"`` (fitted on clients, ``fit(X, groups=...)``, reports rounds and
  bytes), ``"local"`` (each client's own model, also fitted with ``groups``), ``"centralized"``
  (a mixture fitted on the pooled rows) or ``"pyod"`` (a PyOD baseline on the pooled rows).
- ``task``: ``"novelty"`` (an x-only detector: ``fit(X)``, ``decision_function``, higher = more
  anomalous), ``"stream"`` (a novelty detector that learns window by window: ``fit`` on the
  first window, ``partial_fit`` on each later one; the stream runner
  :mod:`fednovelty.evaluation.streams` runs these, the one-shot runners leave them out) or
  ``"pfl"`` (classifiers of federated clients, ``fit(X, y, groups)`` and
  ``predict_y(X, client=...)``: the FedGMM paper's personalised ones, a
  ``JointFedGMMDetector`` or ``PFedEMDetector``, and the Fed-CAM paper's clustered ones, a
  ``ClusteredFLClassifier``). Runners choose methods by ``kind`` and ``task``
  (:func:`method_names`), never by a list of names, so a method added to :data:`METHODS`
  reaches every runner that can run it.
- ``shared``: which of the settings a runner sets alike for every method
  (:data:`SHARED_SETTINGS`: the mixture's ``n_components``, the clients' ``client_components``,
  ``covariance_type``, ``random_state``) this method takes. PyOD's ``PCA`` has an
  ``n_components`` of its own, so a runner's mixture size is not passed to it.
- ``variant_of``: a variant of another method (FedVB's one-shot aggregations) names it;
  :func:`method_names` leaves the variants out unless asked.

The registry lists methods only: the ablations of the robust defaults (a mixture method run
without federated standardisation or the covariance prior, ``docs/robust.md``) are the
benchmark's (:mod:`fednovelty.evaluation.ablations`, ``fednovelty bench --ablations``).

Example:
    >>> from fednovelty.methods import get_method, method_names
    >>> method_names(kind="pyod")
    ['IForest', 'ECOD', 'COPOD', 'KNN', 'LOF', 'HBOS', 'PCA']
    >>> get_method("DEM-kmeans").build(n_components=3, random_state=0).mixture_weights
    'global'
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KINDS",
    "METHODS",
    "SHARED_SETTINGS",
    "TASKS",
    "Method",
    "check_known",
    "get_method",
    "method_names",
]

KINDS = ("federated", "local", "centralized", "pyod")
TASKS = ("novelty", "stream", "pfl")
#: Settings a runner sets alike for every method that takes them (see ``Method.shared``).
SHARED_SETTINGS = ("n_components", "client_components", "covariance_type", "random_state")


def check_known(kind: str, names: Iterable[str], known: Sequence[str], extra: str = "") -> None:
    """Raise ValueError naming each of ``names`` not in ``known`` with its closest known names.

    ``kind`` is what the names are (``"method"``, ``"dataset"``, ...); the known names are
    listed when there are at most 20 of them; ``extra`` ends the message.
    """
    bad = [n for n in names if n not in known]
    if not bad:
        return
    hints = []
    for name in bad:
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
        close += [k for k in known if str(name).lower() in k.lower() and k not in close]
        hints.append(f"{name!r}" + (f" (did you mean {', '.join(close[:3])}?)" if close else ""))
    listed = f" Known: {', '.join(known)}." if len(known) <= 20 else ""
    raise ValueError(f"unknown {kind} {', '.join(hints)}.{listed}{extra}")


# ----------------------------------------------------------------------------- factories
@dataclass(frozen=True)
class _Detector:
    """Factory of ``module.class_name(**fixed, **params)``, the class imported on call.

    ``fixed`` (pairs, so the factory stays hashable) are the settings that make the method
    what it is; :meth:`Method.build` refuses them as parameters.
    """

    class_name: str
    fixed_pairs: tuple[tuple[str, Any], ...] = ()
    module: str = "fednovelty.detectors"

    @property
    def fixed(self) -> dict[str, Any]:
        return dict(self.fixed_pairs)

    def __call__(self, **params):
        cls = getattr(importlib.import_module(self.module), self.class_name)
        fixed = {k: v.build() if isinstance(v, _Option) else v for k, v in self.fixed.items()}
        return cls(**fixed, **params)


@dataclass(frozen=True)
class _Option:
    """An option object of :mod:`fednovelty.detectors.options` a method fixes, built when
    the detector is (so that reading the registry imports no detector)."""

    class_name: str
    fields: tuple[tuple[str, Any], ...] = ()

    def build(self):
        cls = getattr(importlib.import_module("fednovelty.detectors.options"), self.class_name)
        return cls(**dict(self.fields))

    def __repr__(self) -> str:
        return f"{self.class_name}({', '.join(f'{k}={v!r}' for k, v in self.fields)})"


#: no privacy floor (a centralized fit: the pooled rows cross no wire).
_NO_FLOOR = _Option("Privacy", (("min_rows", 1),))


def _detector(class_name: str, module: str = "fednovelty.detectors", **fixed) -> _Detector:
    return _Detector(class_name, tuple(fixed.items()), module)


@dataclass(frozen=True)
class _PFLBaseline:
    """Factory of ``JointFedGMMDetector.pfl_baseline(paper_name, **params)`` (imported on call);
    the baseline's own settings (e.g. FedEM's one Gaussian) are applied by ``pfl_baseline``."""

    paper_name: str

    def __call__(self, **params):
        from fednovelty.detectors import JointFedGMMDetector

        return JointFedGMMDetector.pfl_baseline(self.paper_name, **params)


@dataclass(frozen=True)
class _FedVB:
    """Factory of ``FedVBDetector(n_components=FEDVB_MAX_COMPONENTS, posterior_merge=...,
    **params)`` (imported on call): a generous upper bound by default, which ``params`` may
    still change; the posterior rule is fixed (it makes the method)."""

    posterior_merge: str = "exact"

    @property
    def fixed(self) -> dict[str, Any]:
        return {"posterior_merge": self.posterior_merge}

    def __call__(self, **params):
        from fednovelty.detectors import FedVBDetector

        settings = {"n_components": FEDVB_MAX_COMPONENTS, **params, **self.fixed}
        return FedVBDetector(**settings)


# ----------------------------------------------------------------------------- the entry
@dataclass(frozen=True)
class Method:
    """A named detector configuration (see the module doc for ``kind``, ``task``, ``shared``).

    Attributes:
        name: the name in results and on the command line (``"FedGenGMM"``, ``"IForest"``).
        factory: ``(**params) -> an unfitted detector``.
        kind: ``"federated"``, ``"local"``, ``"centralized"`` or ``"pyod"``.
        paper: the paper or reference it comes from; ``""`` if none.
        description: one line.
        task: ``"novelty"``, ``"stream"`` or ``"pfl"``.
        shared: the names of :data:`SHARED_SETTINGS` the method takes.
        variant_of: the method this one is a variant of; ``""`` otherwise.
    """

    name: str
    factory: Callable[..., Any]
    kind: str
    paper: str
    description: str
    task: str = "novelty"
    shared: tuple[str, ...] = ("random_state",)
    variant_of: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"Method {self.name!r}: kind must be one of {KINDS}; got {self.kind!r}."
            )
        if self.task not in TASKS:
            raise ValueError(
                f"Method {self.name!r}: task must be one of {TASKS}; got {self.task!r}."
            )
        check_known("shared setting", self.shared, SHARED_SETTINGS)

    @property
    def fits_clients(self) -> bool:
        """Whether the detector is fitted with ``groups=`` (the client of each row)."""
        return self.kind in ("federated", "local")

    @property
    def fixed(self) -> dict[str, Any]:
        """Detector settings that make this method what it is; :meth:`build` refuses them."""
        return dict(getattr(self.factory, "fixed", {}))

    def parameters(self) -> tuple[str, ...]:
        """The parameter names :meth:`build` accepts: the detector's constructor parameters
        (``get_params``) less those the method fixes; ``()`` for a detector without
        ``get_params`` (then :meth:`build` passes parameters through unchecked)."""
        detector = self.factory()
        if not hasattr(detector, "get_params"):
            return ()
        fixed = self.fixed
        return tuple(name for name in detector.get_params(deep=False) if name not in fixed)

    def shared_params(self, **settings) -> dict[str, Any]:
        """Of the runner's shared ``settings``, those this method takes.

        Raises:
            ValueError: a setting outside :data:`SHARED_SETTINGS`.
        """
        check_known("shared setting", settings, SHARED_SETTINGS)
        return {name: value for name, value in settings.items() if name in self.shared}

    def build(self, **params):
        """An unfitted detector: ``factory(**params)`` with the names checked first.

        Raises:
            ValueError: a parameter the detector does not have, or one the method fixes
                (with the method's name and what to use instead).
        """
        clash = {name: value for name, value in self.fixed.items() if name in params}
        if clash:
            pinned = ", ".join(f"{k}={v!r}" for k, v in clash.items())
            raise ValueError(
                f"{self.name} fixes {pinned}: that is what makes it {self.name}. Choose the "
                f"method with the setting you want (method_names(variants=True)) or build the "
                f"detector class directly."
            )
        accepted = self.parameters()
        if accepted:
            check_known(
                f"parameter of {self.name}",
                params,
                accepted,
                f" {self.name} takes: {', '.join(accepted)}.",
            )
        return self.factory(**params)


# ----------------------------------------------------------------------------- the registry
FEDGENGMM_PAPER = "Zhang Pettersson et al.: Federated Gaussian Mixture Models (FedGenGMM), 2025"
MFA_PAPER = (
    "Ghahramani & Hinton: The EM algorithm for mixtures of factor analyzers, 1996; "
    "Tipping & Bishop: Mixtures of probabilistic principal component analysers, 1999"
)
FEDGMM_PAPER = (
    "Wu et al.: Personalized Federated Learning under Mixture of Distributions (FedGMM), ICML 2023"
)
DEM_PAPER = f"distributed EM as compared in {FEDGENGMM_PAPER}"
SQUAREM_PAPER = (
    "Varadhan, Roland: Simple and globally convergent methods for accelerating the "
    "convergence of any EM algorithm, Scand. J. Statist. 2008 (SQUAREM)"
)
PFEDEM_PAPER = (
    "Chen et al.: Adaptive Personalized Federated Learning for Non-IID Data with Continual "
    "Distribution Shift (pFedEM)"
)
FEDCAM_PAPER = (
    "Ma et al.: Structured Federated Learning through Clustered Additive Modeling (Fed-CAM)"
)
FEDEM_PAPER = (
    "Marfoq et al.: Federated Multi-Task Learning under a Mixture of Distributions, NeurIPS 2021"
)
FEDAVG_PAPER = (
    "McMahan et al.: Communication-Efficient Learning of Deep Networks from Decentralized "
    "Data, AISTATS 2017"
)
FEDPROX_PAPER = "Li et al.: Federated Optimization in Heterogeneous Networks, MLSys 2020"
IFCA_PAPER = "Ghosh et al.: An Efficient Framework for Clustered Federated Learning, NeurIPS 2020"
FESEM_PAPER = "Xie et al.: Multi-Center Federated Learning, 2021"
VB_PAPER = (
    "Blei, Jordan: Variational Inference for Dirichlet Process Mixtures, Bayesian Analysis "
    "2006 (scikit-learn's BayesianGaussianMixture), federated as in VGM2"
)
VGM2_PAPER = (
    "Puppala et al.: Variational Gaussian Mixture Manifold Models for Client-Specific "
    "Federated Personalization (VGM2)"
)
STREAMING_REFERENCE = (
    "Cappe, Moulines: On-line expectation-maximization algorithm for latent data models, "
    "JRSS-B 2009 (discounted sufficient statistics), federated as FedGMM's EM"
)
#: The upper bound on K that FedVB's prior prunes from (not the runner's shared K).
FEDVB_MAX_COMPONENTS = 20
_MIXTURE = ("n_components", "covariance_type", "random_state")
_CLIENT_MIXTURE = ("client_components", "covariance_type", "random_state")
_FEDGENGMM = ("n_components", *_CLIENT_MIXTURE)
_VB = ("covariance_type", "random_state")
_FEDVB_TEXT = (
    f"federated variational Bayes (Dirichlet-process weights, Normal-Wishart components), K "
    f"chosen by the prior from at most {FEDVB_MAX_COMPONENTS}, on federated z-scores with a "
    f"Wishart prior of n_features + 2 pseudo-rows at the pooled variances; scores with the "
    f"Student-t posterior predictive"
)
_ONESHOT_VB_TEXT = (
    f"one-shot federated VB: each client's own VB posterior (at most {FEDVB_MAX_COMPONENTS} "
    f"components) sent once, components matched on the server and combined by "
)
_PFL_TEXT = "personalised classification (the FedGMM paper's Table 2): "
_CAM_TEXT = "clustered classification (the Fed-CAM paper's Table 1): "
_VGM2_TEXT = "personalised classification (the VGM2 paper's Table 1): "


def _em(**fixed) -> _Detector:
    """Federated EM (``FedGMMDetector``) with the settings that make the method."""
    return _detector("FedGMMDetector", **fixed)


def _pyod(name: str, module: str, reference: str, what: str, seeded: bool = False) -> Method:
    """PyOD's ``name`` (``pyod.models.<module>``) with its defaults on the pooled rows."""
    return Method(
        name,
        _detector(name, f"pyod.models.{module}"),
        "pyod",
        f"PyOD; {reference}",
        f"PyOD's {name} with its defaults on the pooled rows: {what}",
        shared=("random_state",) if seeded else (),
    )


#: The registry's table: one entry per method, each with what makes it that method.
# fmt: off
_TABLE: tuple[Method, ...] = (
    # --- Gaussian mixtures of the rows (novelty: higher -log p(x) = more anomalous)
    Method("FedGenGMM", _detector("FedGenGMMDetector"), "federated", FEDGENGMM_PAPER,
           "one round: client mixtures -> synthetic rows on the server -> global mixture",
           shared=_FEDGENGMM),
    Method("FedGMM", _em(mixture_weights="personal"), "federated", FEDGMM_PAPER,
           "federated EM, shared Gaussians with personal mixture weights per client",
           shared=_MIXTURE),
    Method("DEM-kmeans", _em(mixture_weights="global", init_params="kmeans"), "federated",
           DEM_PAPER, "federated EM, one global weight vector, federated k-means "
           "initialisation (the paper's DEM init 3)", shared=_MIXTURE),
    Method("DEM-separated", _em(mixture_weights="global", init_params="separated"),
           "federated", DEM_PAPER, "federated EM, one global weight vector, centres spread "
           "over the feature range (DEM init 1)", shared=_MIXTURE),
    Method("DEM-subset", _em(mixture_weights="global", init_params="subset"), "federated",
           DEM_PAPER, "federated EM, one global weight vector, EM on 100 pooled raw rows "
           "first: not private (DEM init 2)", shared=_MIXTURE),
    Method("DEM-oneshot",
           _em(mixture_weights="global", init_params="oneshot", acceleration="squarem"),
           "federated",
           f"{DEM_PAPER}; started from FedGenGMM's round, accelerated by {SQUAREM_PAPER}",
           "federated EM, one global weight vector, from one round of local fits "
           "(FedGenGMM's) with SQUAREM on the server: DEM's quality in fewer rounds",
           shared=_MIXTURE),
    Method("ClusteredGMM-IFCA",
           _detector("ClusteredFedGMMDetector", assignment="likelihood"), "federated",
           FEDCAM_PAPER, "global Gaussians plus each client cluster's own (a client joins "
           "the cluster that fits its rows best)", shared=_MIXTURE),
    Method("ClusteredGMM-FeSEM",
           _detector("ClusteredFedGMMDetector", assignment="summary"), "federated",
           FEDCAM_PAPER, "global Gaussians plus each client cluster's own (the server "
           "clusters the clients' weight summaries)", shared=_MIXTURE),
    Method("Local", _detector("LocalGMMDetector"), "local", FEDGENGMM_PAPER,
           "each client's own mixture, scored as their size-weighted mixture (no "
           "federation)", shared=_CLIENT_MIXTURE),
    Method("CentralGMM",  # the pooled rows cross no wire: no privacy floor
           _em(mixture_weights="global", init_params="kmeans", privacy=_NO_FLOOR),
           "centralized", FEDGENGMM_PAPER,
           "EM on the pooled rows, the papers' non-federated ideal", shared=_MIXTURE),
    Method("FedGenGMM-copula", _detector("FedGenGMMDetector", copula=True), "federated",
           FEDGENGMM_PAPER, "FedGenGMM whose server also fits a Gaussian copula on its "
           "synthetic rows and scores with it (same round)", shared=_FEDGENGMM),
    Method("FedMFA", _detector("FedMFADetector"), "federated", MFA_PAPER,
           "federated EM for a mixture of factor analysers (low-rank-plus-diagonal "
           "covariances, O(N K d q) per round) on federated z-scores: for wide rows "
           "(embeddings)", shared=("n_components", "random_state")),
    Method("FedMFA-starts", _detector("FedMFADetector", n_members=8), "federated", MFA_PAPER,
           "FedMFA fitted from eight random starts, a row scored by the mean of their "
           "log-densities (n_members=8; eight fits' rounds): the image choice with "
           "--components 60", shared=("n_components", "random_state"), variant_of="FedMFA"),
    Method("FedVB", _FedVB(), "federated", VB_PAPER, _FEDVB_TEXT, shared=_VB),
    Method("FedVB-oneshot-natural", _FedVB("natural"), "federated", VB_PAPER,
           _ONESHOT_VB_TEXT + "natural-parameter averaging (VGM2's Sec. 3.5 text)",
           shared=_VB, variant_of="FedVB"),
    Method("FedVB-oneshot-moment", _FedVB("moment"), "federated", VB_PAPER,
           _ONESHOT_VB_TEXT + "moment matching (VGM2's Proposition 1)",
           shared=_VB, variant_of="FedVB"),
    Method("streaming", _detector("StreamingFedGMMDetector"), "federated",
           STREAMING_REFERENCE, "federated EM with personal weights on the first window, "
           "then one partial_fit per window (statistics discounted by rho, far rows re-bear "
           "components) with per-client drift alarms", task="stream", shared=_MIXTURE),
    Method("KNN-markers", _detector("FedKNNMarkerDetector"), "federated", VGM2_PAPER,
           "each client's leave-one-out k-th neighbour log-distances modelled by a "
           "federated Dirichlet-NIG mixture (VGM2's relation markers), personalised per "
           "client; scores the predictive tail probability of a row's distance to each "
           "client's rows", shared=("random_state",)),
    # --- PyOD's baselines on the pooled rows
    _pyod("IForest", "iforest", "Liu, Ting, Zhou: Isolation Forest, ICDM 2008",
          "isolation forest", seeded=True),
    _pyod("ECOD", "ecod", "Li et al.: ECOD, TKDE 2022", "empirical cumulative distributions"),
    _pyod("COPOD", "copod", "Li et al.: COPOD, ICDM 2020", "empirical copula"),
    _pyod("KNN", "knn", "Ramaswamy et al., SIGMOD 2000", "distance to the k-th nearest row"),
    _pyod("LOF", "lof", "Breunig et al., SIGMOD 2000", "local outlier factor"),
    _pyod("HBOS", "hbos", "Goldstein, Dengel, KI 2012", "histogram-based outlier score"),
    _pyod("PCA", "pca", "Shyu et al., ICDM 2003", "weighted distance to principal axes",
          seeded=True),
    # --- classifiers of federated clients: the FedGMM paper's joint-model baselines
    Method("PFL-FedGMM", _PFLBaseline("FedGMM"), "federated", FEDGMM_PAPER,
           _PFL_TEXT + "the joint model: shared Gaussians and learners",
           task="pfl", shared=_MIXTURE),
    Method("PFL-FedEM", _PFLBaseline("FedEM"), "federated", FEDEM_PAPER,
           _PFL_TEXT + "one Gaussian: a mixture of learners only",
           task="pfl", shared=_MIXTURE),
    Method("PFL-FedAvg", _PFLBaseline("FedAvg"), "federated", FEDAVG_PAPER,
           _PFL_TEXT + "one Gaussian, one averaged learner", task="pfl", shared=_MIXTURE),
    Method("PFL-FedProx", _PFLBaseline("FedProx"), "federated", FEDPROX_PAPER,
           _PFL_TEXT + "FedAvg with a proximal term in the local objective (mu_prox 0.01 "
           "unless given)", task="pfl", shared=_MIXTURE),
    Method("PFL-Local", _PFLBaseline("Local"), "local", FEDGMM_PAPER,
           _PFL_TEXT + "one learner per client, never averaged", task="pfl",
           shared=_MIXTURE),
    Method("PFL-pFedEM", _detector("PFedEMDetector"), "federated", PFEDEM_PAPER,
           "personalised classification: K Gaussians, one sub-model trained on each "
           "Gaussian's hard partition, inference by Eq. 15", task="pfl",
           shared=("n_components", "random_state")),
    # --- the Fed-CAM paper's clustered classifiers
    Method("PFL-FedAvg+", _detector("ClusteredFLClassifier", method="FedAvg+"), "federated",
           FEDCAM_PAPER, _CAM_TEXT + "an ensemble of K FedAvg models, soft vote",
           task="pfl"),
    Method("PFL-IFCA", _detector("ClusteredFLClassifier", method="IFCA"), "federated",
           IFCA_PAPER, _CAM_TEXT + "K cluster models, each client joins the one with the "
           "lowest loss", task="pfl"),
    Method("PFL-FeSEM", _detector("ClusteredFLClassifier", method="FeSEM"), "federated",
           FESEM_PAPER, _CAM_TEXT + "K cluster models, the server k-means-clusters the "
           "client models", task="pfl"),
    Method("PFL-IFCA-CAM", _detector("ClusteredFLClassifier", method="IFCA-CAM"),
           "federated", FEDCAM_PAPER, _CAM_TEXT + "IFCA plus a global model added to the "
           "cluster models (Eq. 1)", task="pfl"),
    Method("PFL-FeSEM-CAM", _detector("ClusteredFLClassifier", method="FeSEM-CAM"),
           "federated", FEDCAM_PAPER, _CAM_TEXT + "FeSEM plus a global model added to the "
           "cluster models (Eq. 1)", task="pfl"),
    # --- the VGM2 paper's classifiers
    Method("PFL-VGM2", _detector("VGM2Classifier", method="vgm2"), "federated", VGM2_PAPER,
           _VGM2_TEXT + "per-client parametric-UMAP encoders; only Dir-NIG "
           "same/different-class distance markers (10K scalars) are shared, moment-matched",
           task="pfl"),
    Method("PFL-VGM2-Local", _detector("VGM2Classifier", method="local"), "local",
           VGM2_PAPER, _VGM2_TEXT + "the VGM2 encoder plus a class head, each client alone",
           task="pfl"),
    Method("PFL-VGM2-FedAvg", _detector("VGM2Classifier", method="fedavg"), "federated",
           VGM2_PAPER, _VGM2_TEXT + "the VGM2 encoder plus a class head averaged by FedAvg",
           task="pfl"),
    Method("PFL-VGM2-Prototype", _detector("VGM2Classifier", method="prototype"),
           "federated", VGM2_PAPER, _VGM2_TEXT + "FedProto on the VGM2 encoder: class "
           "prototypes averaged per round", task="pfl"),
)
# fmt: on


def _by_name(methods: Sequence[Method]) -> dict[str, Method]:
    """The methods keyed by name; a name listed twice raises ValueError."""
    names = [m.name for m in methods]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"method names registered twice: {repeated}.")
    return {m.name: m for m in methods}


#: Every named method, by name, in the order of the table above: the novelty methods, the
#: stream method, PyOD's baselines, then the classifiers of federated clients (``"pfl"``).
METHODS: dict[str, Method] = _by_name(_TABLE)


def get_method(name: str) -> Method:
    """The method called ``name``.

    Raises:
        ValueError: an unknown name, with the closest known names and all of them.
    """
    if name not in METHODS:
        bases = [m.name for m in METHODS.values() if not m.variant_of]
        variants = [m.name for m in METHODS.values() if m.variant_of]
        check_known(
            "method",
            [name],
            list(METHODS),
            f" Known: {', '.join(bases)}; and the variants {', '.join(variants)}.",
        )
    return METHODS[name]


def method_names(
    *, kind: str | None = None, task: str | None = "novelty", variants: bool = False
) -> list[str]:
    """Names of the registered methods in registry order.

    Args:
        kind: only this kind (``KINDS``); None: every kind.
        task: only this task (``TASKS``); None: every task.
        variants: include the variants of methods (``"FedVB-oneshot-natural"``, ...).

    Raises:
        ValueError: an unknown kind or task.
    """
    if kind is not None:
        check_known("kind", [kind], KINDS)
    if task is not None:
        check_known("task", [task], TASKS)
    return [
        m.name
        for m in METHODS.values()
        if (kind is None or m.kind == kind)
        and (task is None or m.task == task)
        and (variants or not m.variant_of)
    ]
