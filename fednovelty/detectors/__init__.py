"""Detector layer: PyOD ``BaseDetector`` subclasses, the public face of fednovelty."""

from fednovelty.detectors.base import MixtureDetector
from fednovelty.detectors.fedgengmm import FedGenGMMDetector
from fednovelty.detectors.fedgmm import FedGMMDetector
from fednovelty.detectors.joint import JointFedGMMDetector
from fednovelty.detectors.local import LocalGMMDetector
from fednovelty.detectors.persistence import load
from fednovelty.detectors.pfedem import PFedEMDetector
from fednovelty.detectors.streaming import StreamingFedGMMDetector

__all__ = [
    "FedGMMDetector",
    "FedGenGMMDetector",
    "JointFedGMMDetector",
    "LocalGMMDetector",
    "MixtureDetector",
    "PFedEMDetector",
    "StreamingFedGMMDetector",
    "load",
]
