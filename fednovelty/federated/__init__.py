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
"""

from fednovelty._exports import public_names as _public_names
from fednovelty.federated.bayesian.variational import FederatedVB, VBConfig, VBState
from fednovelty.federated.bayesian.vb_oneshot import (
    FederatedVBOneShot,
    VBOneShotConfig,
    VBOneShotState,
)
from fednovelty.federated.clustered.cam_methods import CLUSTERED_METHODS
from fednovelty.federated.clustered.cam_settings import ClusteredConfig, ClusteredState
from fednovelty.federated.clustered.clustered_em import (
    ClusteredEM,
    ClusteredEMConfig,
    ClusteredEMState,
)
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus
from fednovelty.federated.clustered.fesem import FeSEM
from fednovelty.federated.clustered.fesem_cam import FeSEMCAM
from fednovelty.federated.clustered.ifca import IFCA
from fednovelty.federated.clustered.ifca_cam import IFCACAM
from fednovelty.federated.core.base import ClientContext, FederatedAlgorithm, Message
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init.settings import INIT_PARAMS
from fednovelty.federated.joint_models.joint import (
    JointConfig,
    JointFedGMM,
    JointState,
    pfl_algorithm,
)
from fednovelty.federated.joint_models.pfedem import PFedEM, PFedEMConfig
from fednovelty.federated.mixtures.em import MIXTURE_WEIGHTS, EMConfig, EMState, FederatedEM
from fednovelty.federated.mixtures.fedgengmm import FedGenConfig, FedGenGMM, FedGenState, LocalGMMs
from fednovelty.federated.mixtures.pca import FederatedPCA, PCAConfig, PCAProjection, PCAState
from fednovelty.federated.registry import (
    ALGORITHMS,
    algorithm_name,
    algorithm_settings,
    build_algorithm,
)
from fednovelty.federated.streams.streaming import StreamConfig, StreamingEM, StreamState
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy

__all__ = _public_names(globals())
