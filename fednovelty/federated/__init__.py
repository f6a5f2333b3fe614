"""Algorithm layer: each federated algorithm as a client step and a server step over
plain ``Message`` objects, its settings as one frozen dataclass, its protocols as
composable steps. Nothing here knows which engine runs it."""

from fednovelty.federated.base import ClientContext, FederatedAlgorithm, Message
from fednovelty.federated.cam import ClusteredFL, ClusteredState
from fednovelty.federated.clustered_em import ClusteredEM, ClusteredEMState
from fednovelty.federated.config import (
    INIT_PARAMS,
    MIXTURE_WEIGHTS,
    ClusteredConfig,
    ClusteredEMConfig,
    EMConfig,
    FedGenConfig,
    JointConfig,
    PCAConfig,
    PFedEMConfig,
    StreamConfig,
    VBConfig,
    VBOneShotConfig,
)
from fednovelty.federated.em import EMState, FederatedEM
from fednovelty.federated.fedgengmm import FedGenGMM, FedGenState, LocalGMMs
from fednovelty.federated.joint import JointFedGMM, JointState, pfl_algorithm
from fednovelty.federated.pca import FederatedPCA, PCAProjection, PCAState
from fednovelty.federated.pfedem import PFedEM
from fednovelty.federated.privacy import PrivacyPolicy
from fednovelty.federated.registry import (
    ALGORITHMS,
    algorithm_name,
    algorithm_settings,
    build_algorithm,
)
from fednovelty.federated.steps import ChainedAlgorithm, Step
from fednovelty.federated.streaming import StreamingEM, StreamState
from fednovelty.federated.variational import FederatedVB, VBState
from fednovelty.federated.vb_oneshot import FederatedVBOneShot, VBOneShotState

__all__ = [
    "ALGORITHMS",
    "INIT_PARAMS",
    "MIXTURE_WEIGHTS",
    "ChainedAlgorithm",
    "ClientContext",
    "ClusteredConfig",
    "ClusteredEM",
    "ClusteredEMConfig",
    "ClusteredEMState",
    "ClusteredFL",
    "ClusteredState",
    "EMConfig",
    "EMState",
    "FedGenConfig",
    "FedGenGMM",
    "FedGenState",
    "FederatedAlgorithm",
    "FederatedEM",
    "FederatedPCA",
    "FederatedVB",
    "FederatedVBOneShot",
    "JointConfig",
    "JointFedGMM",
    "JointState",
    "LocalGMMs",
    "Message",
    "PCAConfig",
    "PCAProjection",
    "PCAState",
    "PFedEM",
    "PFedEMConfig",
    "PrivacyPolicy",
    "Step",
    "StreamConfig",
    "StreamState",
    "StreamingEM",
    "VBConfig",
    "VBOneShotConfig",
    "VBOneShotState",
    "VBState",
    "algorithm_name",
    "algorithm_settings",
    "build_algorithm",
    "pfl_algorithm",
]
