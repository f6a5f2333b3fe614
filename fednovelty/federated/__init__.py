"""Algorithm layer: each federated algorithm as a client step and a server step over
plain ``Message`` objects. Nothing here knows which engine runs it."""

from fednovelty.federated.base import ClientContext, FederatedAlgorithm, Message
from fednovelty.federated.em import INIT_PARAMS, MIXTURE_WEIGHTS, EMState, FederatedEM
from fednovelty.federated.fedgengmm import FedGenGMM, FedGenState, LocalGMMs
from fednovelty.federated.privacy import PrivacyPolicy

__all__ = [
    "INIT_PARAMS",
    "MIXTURE_WEIGHTS",
    "ClientContext",
    "EMState",
    "FedGenGMM",
    "FedGenState",
    "FederatedAlgorithm",
    "FederatedEM",
    "LocalGMMs",
    "Message",
    "PrivacyPolicy",
]
