"""Algorithm layer: each federated algorithm as a client step and a server step over
plain ``Message`` objects, its settings as one frozen dataclass, its protocols as
composable steps. Nothing here knows which engine runs it.

Two parts hold the shared machinery. ``core`` is the algorithm core: messages and the
algorithm base (``core.base``), what steps declare (``core.declarations``), steps and the
chain (``core.steps``), settings (``core.config``), the wire format, aggregation and the
learners; it imports nothing from ``trust``. ``trust`` is the trust layer the runtime applies
around every step: the client gate (``trust.gate``, ``trust.privacy``), the server gate's
checks (``trust.validation``, ``trust.plausible``), robust aggregation, differential privacy,
the client's ledger and noise, and secure sums. Federated EM's preparation steps (``init``)
and the one-shot start (``local_fit``) sit beside the families, which are subpackages:
``mixtures`` (federated EM, FedGenGMM, PCA), ``joint_models`` (FedGMM's joint model, pFedEM),
``bayesian`` (variational Bayes, kNN markers, VGM2), ``clustered`` (clustered mixtures,
Fed-CAM) and ``streams`` (streaming EM). ``registry`` names every algorithm.

The names below are imported on first use (PEP 562): a process that runs one algorithm (a
Flower ClientApp) imports that algorithm's modules, not every family's.
"""

from __future__ import annotations

import importlib

#: public name -> the module that defines it (imported when the name is first read).
_EXPORTS: dict[str, str] = {
    "FederatedVB": "fednovelty.federated.bayesian.variational",
    "VBConfig": "fednovelty.federated.bayesian.variational",
    "VBState": "fednovelty.federated.bayesian.variational",
    "FederatedVBOneShot": "fednovelty.federated.bayesian.vb_oneshot",
    "VBOneShotConfig": "fednovelty.federated.bayesian.vb_oneshot",
    "VBOneShotState": "fednovelty.federated.bayesian.vb_oneshot",
    "CLUSTERED_METHODS": "fednovelty.federated.clustered.cam_methods",
    "ClusteredConfig": "fednovelty.federated.clustered.cam_settings",
    "ClusteredState": "fednovelty.federated.clustered.cam_settings",
    "ClusteredEM": "fednovelty.federated.clustered.clustered_em",
    "ClusteredEMConfig": "fednovelty.federated.clustered.clustered_em",
    "ClusteredEMState": "fednovelty.federated.clustered.clustered_em",
    "FedAvgPlus": "fednovelty.federated.clustered.fedavg_plus",
    "FeSEM": "fednovelty.federated.clustered.fesem",
    "FeSEMCAM": "fednovelty.federated.clustered.fesem_cam",
    "IFCA": "fednovelty.federated.clustered.ifca",
    "IFCACAM": "fednovelty.federated.clustered.ifca_cam",
    "ClientContext": "fednovelty.federated.core.base",
    "FederatedAlgorithm": "fednovelty.federated.core.base",
    "Message": "fednovelty.federated.core.base",
    "ChainedAlgorithm": "fednovelty.federated.core.steps",
    "Step": "fednovelty.federated.core.steps",
    "INIT_PARAMS": "fednovelty.federated.init.settings",
    "JointConfig": "fednovelty.federated.joint_models.joint",
    "JointFedGMM": "fednovelty.federated.joint_models.joint",
    "JointState": "fednovelty.federated.joint_models.joint",
    "pfl_algorithm": "fednovelty.federated.joint_models.joint",
    "PFedEM": "fednovelty.federated.joint_models.pfedem",
    "PFedEMConfig": "fednovelty.federated.joint_models.pfedem",
    "MIXTURE_WEIGHTS": "fednovelty.federated.mixtures.em",
    "EMConfig": "fednovelty.federated.mixtures.em",
    "EMState": "fednovelty.federated.mixtures.em",
    "FederatedEM": "fednovelty.federated.mixtures.em",
    "FedGenConfig": "fednovelty.federated.mixtures.fedgengmm",
    "FedGenGMM": "fednovelty.federated.mixtures.fedgengmm",
    "FedGenState": "fednovelty.federated.mixtures.fedgengmm",
    "LocalGMMs": "fednovelty.federated.mixtures.fedgengmm",
    "FederatedPCA": "fednovelty.federated.mixtures.pca",
    "PCAConfig": "fednovelty.federated.mixtures.pca",
    "PCAProjection": "fednovelty.federated.mixtures.pca",
    "PCAState": "fednovelty.federated.mixtures.pca",
    "ALGORITHMS": "fednovelty.federated.registry",
    "algorithm_name": "fednovelty.federated.registry",
    "algorithm_settings": "fednovelty.federated.registry",
    "build_algorithm": "fednovelty.federated.registry",
    "StreamConfig": "fednovelty.federated.streams.streaming",
    "StreamingEM": "fednovelty.federated.streams.streaming",
    "StreamState": "fednovelty.federated.streams.streaming",
    "DPPolicy": "fednovelty.federated.trust.dp",
    "PrivacyPolicy": "fednovelty.federated.trust.privacy",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fednovelty.federated' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
