"""Detector layer: PyOD ``BaseDetector`` subclasses, the public face of fednovelty (and the
clustered classifier of the Fed-CAM paper, ``ClusteredFLClassifier``, and VGM2's
``VGM2Classifier``), and the option objects that group the estimators' rarely set settings
(``Privacy``, ``Robustness``, ``ClientSampling``, ``Initialisation``, ``Prior``,
``Training``, ``Objective``)."""

from fednovelty._exports import public_names as _public_names
from fednovelty.detectors.base import MixtureDetector
from fednovelty.detectors.cam import ClusteredFLClassifier
from fednovelty.detectors.clustered import ClusteredFedGMMDetector
from fednovelty.detectors.fedgengmm import FedGenGMMDetector
from fednovelty.detectors.fedgmm import FedGMMDetector
from fednovelty.detectors.joint_fedgmm import JointFedGMMDetector
from fednovelty.detectors.knn_markers import FedKNNMarkerDetector
from fednovelty.detectors.local import LocalGMMDetector
from fednovelty.detectors.mfa import FedMFADetector
from fednovelty.detectors.options import (
    ClientSampling,
    Initialisation,
    Objective,
    Prior,
    Privacy,
    Robustness,
    Training,
)
from fednovelty.detectors.persistence import load
from fednovelty.detectors.pfedem import PFedEMDetector
from fednovelty.detectors.streaming import StreamingFedGMMDetector
from fednovelty.detectors.variational import FedVBDetector
from fednovelty.detectors.vgm2 import VGM2Classifier

__all__ = _public_names(globals())
