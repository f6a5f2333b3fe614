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

Ablation variants: every mixture method that runs with the robust defaults (federated
standardisation and the covariance prior, ``docs/robust.md``) also comes as its ablations,
registered under the base name plus a suffix of :data:`ABLATIONS` (``-plain``: neither, the
papers' plain maximum-likelihood mixture; ``-std``: standardisation only; ``-prior``: the prior
on the raw features). A variant records its base in ``variant_of``; :func:`method_names` leaves
the variants out unless asked.

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
    "ABLATIONS",
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
#: Ablation suffix -> the detector settings it switches off (see the module doc).
ABLATIONS: dict[str, dict[str, Any]] = {
    "-plain": {"standardize": False, "prior_strength": None},
    "-std": {"prior_strength": None},
    "-prior": {"standardize": False},
}


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
        return cls(**self.fixed, **params)


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
        variant_of: the base method of an ablation variant; ``""`` otherwise.
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
_ABLATION_TEXT = {
    "-plain": "ablation: plain maximum likelihood, no standardisation, no prior",
    "-std": "ablation: standardisation only, no covariance prior",
    "-prior": "ablation: covariance prior on the raw features, no standardisation",
}
_MIXTURE = ("n_components", "covariance_type", "random_state")
_CLIENT_MIXTURE = ("client_components", "covariance_type", "random_state")


def _mixtures(suffix: str = "", **settings) -> list[Method]:
    """The mixture methods with the detector ``settings`` of one ablation (``""``: defaults)."""

    def em(**fixed) -> _Detector:
        return _detector("FedGMMDetector", **fixed, **settings)

    out = [
        Method(
            "FedGenGMM",
            _detector("FedGenGMMDetector", **settings),
            "federated",
            FEDGENGMM_PAPER,
            "one round: client mixtures -> synthetic rows on the server -> global mixture",
            shared=("n_components", *_CLIENT_MIXTURE),
        ),
        Method(
            "FedGMM",
            em(mixture_weights="personal"),
            "federated",
            FEDGMM_PAPER,
            "federated EM, shared Gaussians with personal mixture weights per client",
            shared=_MIXTURE,
        ),
        *[
            Method(
                f"DEM-{init}",
                em(mixture_weights="global", init_params=init),
                "federated",
                DEM_PAPER,
                f"federated EM, one global weight vector, {how}",
                shared=_MIXTURE,
            )
            for init, how in (
                ("kmeans", "federated k-means initialisation (the paper's DEM init 3)"),
                ("separated", "centres spread over the feature range (DEM init 1)"),
                ("subset", "EM on 100 pooled raw rows first: not private (DEM init 2)"),
            )
        ],
        Method(
            "DEM-oneshot",
            em(mixture_weights="global", init_params="oneshot", acceleration="squarem"),
            "federated",
            f"{DEM_PAPER}; started from FedGenGMM's round, accelerated by {SQUAREM_PAPER}",
            "federated EM, one global weight vector, from one round of local fits (FedGenGMM's) "
            "with SQUAREM on the server: DEM's quality in fewer rounds",
            shared=_MIXTURE,
        ),
        *[
            Method(
                f"ClusteredGMM-{style}",
                _detector("ClusteredFedGMMDetector", assignment=assignment, **settings),
                "federated",
                FEDCAM_PAPER,
                f"global Gaussians plus each client cluster's own ({how})",
                shared=_MIXTURE,
            )
            for style, assignment, how in (
                ("IFCA", "likelihood", "a client joins the cluster that fits its rows best"),
                ("FeSEM", "summary", "the server clusters the clients' weight summaries"),
            )
        ],
        Method(
            "Local",
            _detector("LocalGMMDetector", **settings),
            "local",
            FEDGENGMM_PAPER,
            "each client's own mixture, scored as their size-weighted mixture (no federation)",
            shared=_CLIENT_MIXTURE,
        ),
        Method(
            "CentralGMM",
            # the pooled rows cross no wire: no privacy floor
            em(mixture_weights="global", init_params="kmeans", privacy_min_rows=1),
            "centralized",
            FEDGENGMM_PAPER,
            "EM on the pooled rows, the papers' non-federated ideal",
            shared=_MIXTURE,
        ),
    ]
    if not suffix:
        return out
    return [
        Method(
            m.name + suffix,
            m.factory,
            m.kind,
            m.paper,
            f"{m.description} [{_ABLATION_TEXT[suffix]}]",
            shared=m.shared,
            variant_of=m.name,
        )
        for m in out
    ]


_PYOD = (
    (
        "IForest",
        "iforest",
        True,
        "Liu, Ting, Zhou: Isolation Forest, ICDM 2008",
        "isolation forest",
    ),
    ("ECOD", "ecod", False, "Li et al.: ECOD, TKDE 2022", "empirical cumulative distributions"),
    ("COPOD", "copod", False, "Li et al.: COPOD, ICDM 2020", "empirical copula"),
    ("KNN", "knn", False, "Ramaswamy et al., SIGMOD 2000", "distance to the k-th nearest row"),
    ("LOF", "lof", False, "Breunig et al., SIGMOD 2000", "local outlier factor"),
    ("HBOS", "hbos", False, "Goldstein, Dengel, KI 2012", "histogram-based outlier score"),
    ("PCA", "pca", True, "Shyu et al., ICDM 2003", "weighted distance to principal axes"),
)

_PFL = (
    ("FedGMM", FEDGMM_PAPER, "federated", "the joint model: shared Gaussians and learners"),
    (
        "FedEM",
        "Marfoq et al.: Federated Multi-Task Learning under a Mixture of Distributions, "
        "NeurIPS 2021",
        "federated",
        "one Gaussian: a mixture of learners only",
    ),
    (
        "FedAvg",
        "McMahan et al.: Communication-Efficient Learning of Deep Networks from "
        "Decentralized Data, AISTATS 2017",
        "federated",
        "one Gaussian, one averaged learner",
    ),
    (
        "FedProx",
        "Li et al.: Federated Optimization in Heterogeneous Networks, MLSys 2020",
        "federated",
        "FedAvg with a proximal term in the local objective (mu_prox 0.01 unless given)",
    ),
    ("Local", FEDGMM_PAPER, "local", "one learner per client, never averaged"),
)


_CLUSTERED = (
    ("FedAvg+", FEDCAM_PAPER, "an ensemble of K FedAvg models, soft vote"),
    (
        "IFCA",
        "Ghosh et al.: An Efficient Framework for Clustered Federated Learning, NeurIPS 2020",
        "K cluster models, each client joins the one with the lowest loss",
    ),
    (
        "FeSEM",
        "Xie et al.: Multi-Center Federated Learning, 2021",
        "K cluster models, the server k-means-clusters the client models",
    ),
    ("IFCA-CAM", FEDCAM_PAPER, "IFCA plus a global model added to the cluster models (Eq. 1)"),
    ("FeSEM-CAM", FEDCAM_PAPER, "FeSEM plus a global model added to the cluster models (Eq. 1)"),
)


_VGM2 = (
    (
        "VGM2",
        "vgm2",
        "federated",
        "per-client parametric-UMAP encoders; only Dir-NIG same/different-class distance "
        "markers (10K scalars) are shared, moment-matched",
    ),
    ("VGM2-Local", "local", "local", "the VGM2 encoder plus a class head, each client alone"),
    (
        "VGM2-FedAvg",
        "fedavg",
        "federated",
        "the VGM2 encoder plus a class head averaged by FedAvg",
    ),
    (
        "VGM2-Prototype",
        "prototype",
        "federated",
        "FedProto on the VGM2 encoder: class prototypes averaged per round",
    ),
)


def _registry() -> dict[str, Method]:
    methods = [
        *_mixtures(),
        Method(
            "FedGenGMM-copula",
            _detector("FedGenGMMDetector", copula=True),
            "federated",
            FEDGENGMM_PAPER,
            "FedGenGMM whose server also fits a Gaussian copula on its synthetic rows and "
            "scores with it (same round)",
            shared=("n_components", *_CLIENT_MIXTURE),
        ),
        Method(
            "FedMFA",
            _detector("FedMFADetector"),
            "federated",
            MFA_PAPER,
            "federated EM for a mixture of factor analysers (low-rank-plus-diagonal "
            "covariances, O(N K d q) per round) on federated z-scores: for wide rows "
            "(embeddings)",
            shared=("n_components", "random_state"),
        ),
        Method(
            "FedVB",
            _FedVB(),
            "federated",
            VB_PAPER,
            f"federated variational Bayes (Dirichlet-process weights, Normal-Wishart "
            f"components), K chosen by the prior from at most {FEDVB_MAX_COMPONENTS}, on "
            f"federated z-scores with a Wishart prior of n_features + 2 pseudo-rows at the "
            f"pooled variances; scores with the Student-t posterior predictive",
            shared=("covariance_type", "random_state"),
        ),
        *[
            Method(
                f"FedVB-oneshot-{how}",
                _FedVB(how),
                "federated",
                VB_PAPER,
                f"one-shot federated VB: each client's own VB posterior (at most "
                f"{FEDVB_MAX_COMPONENTS} components) sent once, components matched on the "
                f"server and combined by {what}",
                shared=("covariance_type", "random_state"),
                variant_of="FedVB",
            )
            for how, what in (
                ("natural", "natural-parameter averaging (VGM2's Sec. 3.5 text)"),
                ("moment", "moment matching (VGM2's Proposition 1)"),
            )
        ],
        Method(
            "streaming",
            _detector("StreamingFedGMMDetector"),
            "federated",
            STREAMING_REFERENCE,
            "federated EM with personal weights on the first window, then one partial_fit "
            "per window (statistics discounted by rho, far rows re-bear components) with "
            "per-client drift alarms",
            task="stream",
            shared=_MIXTURE,
        ),
        Method(
            "KNN-markers",
            _detector("FedKNNMarkerDetector"),
            "federated",
            VGM2_PAPER,
            "each client's leave-one-out k-th neighbour log-distances modelled by a federated "
            "Dirichlet-NIG mixture (VGM2's relation markers), personalised per client; scores "
            "the predictive tail probability of a row's distance to each client's rows",
            shared=("random_state",),
        ),
        *[
            Method(
                name,
                _detector(name, f"pyod.models.{module}"),
                "pyod",
                f"PyOD; {reference}",
                f"PyOD's {name} with its defaults on the pooled rows: {what}",
                shared=("random_state",) if seeded else (),
            )
            for name, module, seeded, reference, what in _PYOD
        ],
        *[m for suffix, settings in ABLATIONS.items() for m in _mixtures(suffix, **settings)],
        *[
            Method(
                f"PFL-{name}",
                _PFLBaseline(name),
                kind,
                paper,
                f"personalised classification (the FedGMM paper's Table 2): {what}",
                task="pfl",
                shared=_MIXTURE,
            )
            for name, paper, kind, what in _PFL
        ],
        Method(
            "PFL-pFedEM",
            _detector("PFedEMDetector"),
            "federated",
            PFEDEM_PAPER,
            "personalised classification: K Gaussians, one sub-model trained on each "
            "Gaussian's hard partition, inference by Eq. 15",
            task="pfl",
            shared=("n_components", "random_state"),
        ),
    ]
    methods += [
        Method(
            f"PFL-{name}",
            _detector("ClusteredFLClassifier", method=name),
            "federated",
            paper,
            f"clustered classification (the Fed-CAM paper's Table 1): {what}",
            task="pfl",
        )
        for name, paper, what in _CLUSTERED
    ]
    methods += [
        Method(
            f"PFL-{name}",
            _detector("VGM2Classifier", method=method),
            kind,
            VGM2_PAPER,
            f"personalised classification (the VGM2 paper's Table 1): {what}",
            task="pfl",
        )
        for name, method, kind, what in _VGM2
    ]
    names = [m.name for m in methods]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"method names registered twice: {repeated}.")
    return {m.name: m for m in methods}


#: Every named method, by name (registry order: methods, then ablations, then PFL methods).
METHODS: dict[str, Method] = _registry()


def get_method(name: str) -> Method:
    """The method called ``name``.

    Raises:
        ValueError: an unknown name, with the closest known names and all of them.
    """
    if name not in METHODS:
        bases = [m.name for m in METHODS.values() if not m.variant_of]
        ablations = [m for m in METHODS.values() if m.name.endswith(tuple(ABLATIONS))]
        with_ablations = list(dict.fromkeys(m.variant_of for m in ablations))
        others = [m.name for m in METHODS.values() if m.variant_of and m not in ablations]
        check_known(
            "method",
            [name],
            list(METHODS),
            f" Known: {', '.join(bases)}; the ablations {', '.join(ABLATIONS)} of "
            f"{', '.join(with_ablations)} (e.g. {with_ablations[0]}{next(iter(ABLATIONS))}); "
            f"and the variants {', '.join(others)}.",
        )
    return METHODS[name]


def method_names(
    *, kind: str | None = None, task: str | None = "novelty", variants: bool = False
) -> list[str]:
    """Names of the registered methods in registry order.

    Args:
        kind: only this kind (``KINDS``); None: every kind.
        task: only this task (``TASKS``); None: every task.
        variants: include the ablation variants (``"FedGenGMM-plain"``, ...).

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
