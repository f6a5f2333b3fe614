"""Algorithm layer: each federated algorithm as a client step and a server step over
plain ``Message`` objects, its settings as one frozen dataclass, its protocols as
composable steps. Nothing here knows which engine runs it."""

from fednovelty._exports import public_names as _public_names
from fednovelty.federated.base import ClientContext, FederatedAlgorithm, Message
from fednovelty.federated.cam import ClusteredConfig, ClusteredFL, ClusteredState
from fednovelty.federated.clustered_em import ClusteredEM, ClusteredEMConfig, ClusteredEMState
from fednovelty.federated.em import MIXTURE_WEIGHTS, EMConfig, EMState, FederatedEM
from fednovelty.federated.fedgengmm import FedGenConfig, FedGenGMM, FedGenState, LocalGMMs
from fednovelty.federated.init import INIT_PARAMS
from fednovelty.federated.joint import JointConfig, JointFedGMM, JointState, pfl_algorithm
from fednovelty.federated.pca import FederatedPCA, PCAConfig, PCAProjection, PCAState
from fednovelty.federated.pfedem import PFedEM, PFedEMConfig
from fednovelty.federated.privacy import PrivacyPolicy
from fednovelty.federated.registry import (
    ALGORITHMS,
    algorithm_name,
    algorithm_settings,
    build_algorithm,
)
from fednovelty.federated.steps import ChainedAlgorithm, Step
from fednovelty.federated.streaming import StreamConfig, StreamingEM, StreamState
from fednovelty.federated.variational import FederatedVB, VBConfig, VBState
from fednovelty.federated.vb_oneshot import FederatedVBOneShot, VBOneShotConfig, VBOneShotState

__all__ = _public_names(globals())
