"""Settings travel once: each algorithm's settings are one frozen dataclass, validated once
with errors that name the argument, written to JSON and read back as the same dataclass;
the registry builds any algorithm from its name and that JSON; messages carry no setting."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from fednovelty.federated import (
    ALGORITHMS,
    ClusteredEMConfig,
    EMConfig,
    FederatedEM,
    FederatedPCA,
    FedGenConfig,
    FedGenGMM,
    JointConfig,
    JointFedGMM,
    LocalGMMs,
    PCAConfig,
    PFedEMConfig,
    PrivacyPolicy,
    StreamConfig,
    VBConfig,
    VBOneShotConfig,
    algorithm_name,
    algorithm_settings,
    build_algorithm,
)
from fednovelty.federated.bayesian.knn_markers import FederatedKNNMarkers, KNNMarkerConfig
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.bayesian.vb_settings import VBMomentsSettings, VBPriorSettings
from fednovelty.federated.bayesian.vgm2 import VGM2
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvg
from fednovelty.federated.bayesian.vgm2_local import VGM2Local
from fednovelty.federated.bayesian.vgm2_prototype import VGM2Prototype
from fednovelty.federated.clustered.clustered_em import ClusteredEM
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus
from fednovelty.federated.clustered.fesem import FeSEM
from fednovelty.federated.clustered.fesem_cam import FeSEMCAM
from fednovelty.federated.clustered.ifca import IFCA
from fednovelty.federated.clustered.ifca_cam import IFCACAM
from fednovelty.federated.core.config import (
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    RobustSettings,
    TorchSettings,
)
from fednovelty.federated.core.learners import mlp_learner
from fednovelty.federated.init.settings import GivenMixture, InitSettings, MomentsSettings
from fednovelty.federated.joint_models.pfedem import PFedEM
from fednovelty.federated.mixtures.factor_em import FactorEMConfig, FederatedFactorEM
from fednovelty.federated.streams.streaming import StreamingEM
from fednovelty.federated.trust import gate

#: a one-component mixture in one feature, as a streaming window's start.
START = {"weights_init": [1.0], "means_init": [[0.0]], "precisions_init": [[[1.0]]]}

#: one algorithm of each registered name, with settings away from their defaults.
EXAMPLES = {
    "FederatedEM": lambda: FederatedEM(
        3,
        covariance_type="diag",
        mixture_weights="personal",
        standardize=True,
        prior_strength=4.0,
        means_init=np.arange(6.0).reshape(3, 2),
        pca_components=2,
        dtype=torch.float32,
        chunk_size=64,
    ),
    "JointFedGMM": lambda: JointFedGMM(
        2, 3, 4, learner_factory=mlp_learner, optimizer="adam", mu_prox=0.1, max_iter=7
    ),
    "FedGenGMM": lambda: FedGenGMM(k_range=(2, 4), copula=True, aggregation="median"),
    "LocalGMMs": lambda: LocalGMMs(client_components=2, min_client_samples=9),
    "FederatedVBOneShot": lambda: FederatedVBOneShot(
        3, posterior_aggregation="natural", aggregation="median", trim=0.2, client_weight_cap=4
    ),
    "FederatedPCA": lambda: FederatedPCA(2, dtype=torch.float32),
    "FedAvgPlus": lambda: FedAvgPlus(4, 3, n_clusters=2, rounds=9, aggregation="median"),
    "IFCA": lambda: IFCA(4, 3, n_clusters=2, rounds=9, empty_clusters="reseed"),
    "FeSEM": lambda: FeSEM(4, 3, n_clusters=2, rounds=9, kmeans_reg=0.1, momentum=0.5),
    "IFCACAM": lambda: IFCACAM(4, 3, n_clusters=2, rounds=9, cluster_average="global"),
    "FeSEMCAM": lambda: FeSEMCAM(
        4, 3, n_clusters=2, rounds=9, warmup_rounds=2, learner_factory="linear"
    ),
    "StreamingEM": lambda: StreamingEM(1, rho=0.5, aggregation="trimmed", **START),
    "PFedEM": lambda: PFedEM(3, 4, gaussian_aggregation="exact", covariance_type="full"),
    "ClusteredEM": lambda: ClusteredEM(2, n_clusters=3, standardize=True, warmup=4),
    "FederatedVB": lambda: FederatedVB(4, mean_prior=[0.0, 1.0], init_params="separated"),
    "FederatedKNNMarkers": lambda: FederatedKNNMarkers(3, n_neighbors=7, kmeans_rounds=3),
    "VGM2": lambda: VGM2(n_features=5, n_classes=3, aggregation="natural", n_markers=2),
    "VGM2Local": lambda: VGM2Local(n_features=5, n_classes=3, hidden=8, train_encoder=False),
    "VGM2FedAvg": lambda: VGM2FedAvg(n_features=5, n_classes=3, robust_aggregation="median"),
    "VGM2Prototype": lambda: VGM2Prototype(n_features=5, n_classes=3, prototype_weight=0.5),
    "FederatedFactorEM": lambda: FederatedFactorEM(
        3,
        2,
        isotropic=True,
        oversample=4,
        standardize=True,
        prior_strength=5.0,
        init_params="separated",
        means_init=np.arange(12.0).reshape(3, 4),
        max_iter=7,
    ),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_settings_round_trip_through_json_to_the_same_dataclass(name) -> None:
    algorithm = EXAMPLES[name]()
    assert algorithm_name(algorithm) == name
    settings = algorithm_settings(algorithm)
    text = json.dumps(settings)  # JSON values only
    rebuilt = build_algorithm(name, json.loads(text))
    assert type(rebuilt) is type(algorithm)
    assert rebuilt.config == algorithm.config
    assert algorithm_settings(rebuilt) == settings
    assert rebuilt.max_rounds == algorithm.max_rounds


def test_json_forms_of_dtypes_tuples_tensors_and_learners() -> None:
    em = algorithm_settings(EXAMPLES["FederatedEM"]())
    assert em["dtype"] == "float32" and em["device"] == "cpu"
    assert em["means_init"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert algorithm_settings(EXAMPLES["FedGenGMM"]())["k_range"] == [2, 4]
    assert algorithm_settings(EXAMPLES["JointFedGMM"]())["learner"] == "mlp"
    config = EMConfig.from_json({"n_components": 2, "means_init": [[0, 1], [2, 3]]})
    assert config.means_init.dtype == torch.float64 and config.means_init.shape == (2, 2)
    custom = JointFedGMM(2, 1, 2, learner_factory=lambda d, k: torch.nn.Linear(d, k))
    with pytest.raises(ValueError, match="custom learner factory"):
        algorithm_settings(custom)


def test_settings_read_as_attributes_and_are_frozen() -> None:
    algorithm = FederatedEM(3, tol=1e-4, covariance_type="tied")
    assert isinstance(algorithm.config, EMConfig)
    assert (algorithm.tol, algorithm.covariance_type, algorithm.n_components) == (1e-4, "tied", 3)
    with pytest.raises(AttributeError, match="settings are frozen"):
        algorithm.tol = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        algorithm.config.tol = 1.0
    changed = FederatedEM.from_config(dataclasses.replace(algorithm.config, tol=1e-2))
    assert changed.tol == 1e-2 and algorithm.tol == 1e-4
    with pytest.raises(TypeError, match="takes a EMConfig config"):
        FederatedEM.from_config(FedGenConfig())
    with pytest.raises(AttributeError, match="no attribute 'n_comps'"):
        _ = algorithm.n_comps


def test_local_gmms_is_a_configuration_of_fedgengmm() -> None:
    local = LocalGMMs(k_range=(1, 3), min_client_samples=4)
    assert isinstance(local, FedGenGMM) and isinstance(local.config, FedGenConfig)
    assert local.candidates() == [1, 2, 3] and local.rows_needed() == 4


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: EMConfig(n_components=0), "n_components must be >= 1"),
        (lambda: EMConfig(n_components=2, covariance_type="round"), "covariance_type"),
        (lambda: EMConfig(n_components=2, mixture_weights="mine"), "mixture_weights"),
        (lambda: EMConfig(n_components=2, init_params="random"), "init_params"),
        (lambda: EMConfig(n_components=2, reg_covar=-1.0), "reg_covar must be >= 0"),
        (lambda: EMConfig(n_components=2, tol=-1.0), "tol must be >= 0"),
        (lambda: EMConfig(n_components=2, max_iter=0), "max_iter must be >= 1"),
        (lambda: EMConfig(n_components=2, kmeans_rounds=0), "kmeans_rounds must be >= 1"),
        (lambda: EMConfig(n_components=2, pca_components=0), "pca_components must be >= 1 or"),
        (lambda: EMConfig(n_components=2, chunk_size=0), "chunk_size must be >= 1 or None"),
        (lambda: EMConfig(n_components=2, dtype=torch.int64), "'dtype'"),
        (lambda: EMConfig(n_components=2, dtype="float8"), "'dtype'"),
        (lambda: EMConfig(n_components=2, aggregation="median"), "aggregation"),
        (lambda: EMConfig(n_components=2, trim=0.5), "trim"),
        (lambda: EMConfig(n_components=2, client_weight_cap=0.5), "client_weight_cap"),
        (lambda: EMConfig(n_components=2, prior_strength=0.0), "prior_strength"),
        (lambda: EMConfig(n_components=2, prior_scale=0.0), "prior_scale"),
        (lambda: JointConfig(n_components=2, n_learners=1, n_classes=1), "n_classes >= 2"),
        (lambda: JointConfig(n_components=2, n_learners=0, n_classes=2), "n_learners >= 1"),
        (
            lambda: JointConfig(n_components=2, n_learners=1, n_classes=2, optimizer="lbfgs"),
            "optimizer",
        ),
        (
            lambda: JointConfig(n_components=2, n_learners=1, n_classes=2, learner_factory="rnn"),
            "'learner'",
        ),
        (
            lambda: JointConfig(n_components=2, n_learners=1, n_classes=2, batch_size=0),
            "batch_size",
        ),
        (lambda: FedGenConfig(k_range=(3, 2)), "k_range"),
        (lambda: FedGenConfig(n_components=0), "n_components must be >= 1 or None"),
        (lambda: FedGenConfig(max_iter=0), "max_iter"),
        (lambda: PCAConfig(n_components=0), "n_components must be >= 1"),
        (lambda: FactorEMConfig(n_components=2, n_factors=0), "n_factors must be >= 1"),
        (lambda: FactorEMConfig(n_components=2, n_factors=1, oversample=-1), "oversample"),
        (lambda: FactorEMConfig(n_components=2, n_factors=1, init_params="subset"), "init_params"),
        (
            lambda: FactorEMConfig(n_components=2, n_factors=1, precisions_init=[[[1.0]]] * 2),
            "give means_init",
        ),
        (lambda: FactorEMConfig(n_components=2, n_factors=1, aggregation="median"), "aggregation"),
        (
            lambda: EMConfig.from_json({"n_components": 2, "n_comps": 3}),
            r"unknown setting\(s\) \['n_comps'\]",
        ),
    ],
)
def test_bad_settings_are_named(build, match) -> None:
    with pytest.raises(ValueError, match=match):
        build()


def test_the_registry_names_what_it_cannot_build() -> None:
    assert set(ALGORITHMS) >= {  # the package's (a new algorithm adds its row)
        "FederatedEM",
        "JointFedGMM",
        "FedGenGMM",
        "LocalGMMs",
        "FederatedPCA",
        "StreamingEM",
        "PFedEM",
        "FedAvgPlus",
        "IFCA",
        "FeSEM",
        "IFCACAM",
        "FeSEMCAM",
        "ClusteredEM",
        "FederatedVB",
        "FederatedVBOneShot",
        "FederatedKNNMarkers",
        "VGM2",
        "VGM2Local",
        "VGM2FedAvg",
        "VGM2Prototype",
        "FederatedFactorEM",
    }
    with pytest.raises(ValueError, match="unknown algorithm 'KMeans'; must be one of"):
        build_algorithm("KMeans", {})
    with pytest.raises(ValueError, match="settings do not fit FedGenGMM: unknown setting"):
        build_algorithm("FedGenGMM", {"n_comps": 3})
    with pytest.raises(ValueError, match="settings do not fit FederatedEM"):
        build_algorithm("FederatedEM", {})  # n_components is required


def clients(n_clients: int = 3, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(40, 4, generator=gen, dtype=torch.float64) + 3 * c for c in range(n_clients)
    ]


def broadcasts(algorithm, data) -> list:
    """Every message of a full in-process run of ``algorithm`` on ``data``."""
    contexts = {c: gate.client_context(c, policy=PrivacyPolicy(allow_raw_rows=True)) for c in data}
    state, messages = algorithm.start(), []
    while not algorithm.finished(state):
        message = algorithm.configure(state)
        messages.append(message)
        replies = {c: algorithm.client_step(x, message, contexts[c]) for c, x in data.items()}
        state, _ = algorithm.server_step(state, replies)
    return messages


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "make",
    [
        lambda: FederatedEM(2, standardize=True, prior_strength=3.0, pca_components=3, max_iter=4),
        lambda: FederatedEM(2, init_params="subset", mixture_weights="personal", max_iter=3),
        lambda: FederatedEM(2, init_params="separated", covariance_type="spherical", max_iter=3),
        lambda: JointFedGMM(2, 2, 2, standardize=True, max_iter=3),
        lambda: FedGenGMM(k_range=(1, 3), standardize=True, prior_strength=2.0),
        lambda: IFCACAM(4, 2, n_clusters=2, rounds=3, warmup_rounds=1),
        lambda: FederatedFactorEM(2, 2, standardize=True, prior_strength=3.0, max_iter=3),
    ],
)
def test_messages_carry_only_what_changes_per_round(make) -> None:
    """Parameters, statistics and seeds only: no covariance type, candidate K, tolerance,
    prior or other setting in any broadcast's scalars."""
    algorithm = make()
    data = dict(enumerate(clients()))
    if algorithm.labelled:
        data = {c: (x, (x[:, 0] > 3 * c).long()) for c, x in data.items()}
    for message in broadcasts(algorithm, data):
        assert set(message.scalars) <= {"seed", "fraction"}, (message.kind, message.scalars)


def test_the_cnn_learner_reads_square_images_and_travels_by_name() -> None:
    from fednovelty.federated.core.learners import LEARNERS, cnn_learner

    module = cnn_learner(28 * 28, 62)
    assert module(torch.zeros(5, 784)).shape == (5, 62)
    assert cnn_learner(8 * 8, 3)(torch.zeros(2, 64)).shape == (2, 3)
    for bad in (783, 25):  # not a square; a side below 6
        with pytest.raises(ValueError, match="learner='cnn' needs square images"):
            cnn_learner(bad, 2)
    algorithm = JointFedGMM(2, 1, 3, learner_factory="cnn")
    assert algorithm.config.learner_factory is LEARNERS["cnn"]
    assert algorithm.config.to_json()["learner"] == "cnn"


#: (config, settings it needs, a setting its algorithm does not read): the config does not
#: have the setting, so its JSON is refused by name rather than accepted and ignored.
SETTINGS_A_FAMILY_LACKS = [
    (VBConfig, {"n_components": 2}, "pca_components", None),
    (VBConfig, {"n_components": 2}, "mixture_weights", "global"),
    (VBOneShotConfig, {"n_components": 2}, "init_params", "kmeans"),
    (VBOneShotConfig, {"n_components": 2}, "means_init", None),
    (StreamConfig, {"n_components": 1, **START}, "tol", 1e-3),
    (StreamConfig, {"n_components": 1, **START}, "max_iter", 100),
    (StreamConfig, {"n_components": 1, **START}, "standardize", False),
    (PFedEMConfig, {"n_components": 2, "n_classes": 2}, "prior_strength", None),
    (ClusteredEMConfig, {"n_components": 2}, "means_init", None),
    (FactorEMConfig, {"n_components": 2, "n_factors": 1}, "mixture_weights", "global"),
    (FactorEMConfig, {"n_components": 2, "n_factors": 1}, "pca_components", None),
]


@pytest.mark.parametrize(("config", "needs", "name", "value"), SETTINGS_A_FAMILY_LACKS)
def test_a_config_has_only_the_settings_its_algorithm_reads(config, needs, name, value) -> None:
    assert name not in {f.name for f in dataclasses.fields(config)}
    with pytest.raises(ValueError, match=rf"unknown setting\(s\) \['{name}'\]"):
        config.from_json({**config(**needs).to_json(), name: value})


@pytest.mark.parametrize(
    ("build", "declared", "match"),
    [
        (
            lambda: KNNMarkerConfig(n_components=2, covariance_type="diag"),
            lambda: KNNMarkerConfig.COVARIANCE_CHOICES == ("full",),
            r"covariance_type must be one of \['full'\] for KNNMarkerConfig",
        ),
        (
            lambda: VBOneShotConfig(n_components=2, covariance_type="tied"),
            lambda: "tied" not in VBOneShotConfig.COVARIANCE_CHOICES,
            r"covariance_type must be one of \['full', 'diag', 'spherical'\]",
        ),
        (
            lambda: ClusteredEMConfig(n_components=2, mixture_weights="global"),
            lambda: ClusteredEMConfig.MIXTURE_WEIGHT_CHOICES == ("personal",),
            r"mixture_weights must be one of \['personal'\] for ClusteredEMConfig",
        ),
        (
            lambda: FactorEMConfig(n_components=2, n_factors=1, covariance_type="full"),
            lambda: FactorEMConfig.COVARIANCE_CHOICES == ("diag",),
            r"covariance_type must be one of \['diag'\] for FactorEMConfig",
        ),
        (
            lambda: StreamConfig(n_components=1, aggregation="median", **START),
            lambda: StreamConfig.AGGREGATION_CHOICES == ("sum", "trimmed"),
            "aggregation must be one of",
        ),
    ],
)
def test_a_config_narrows_a_groups_choices_by_declaration(build, declared, match) -> None:
    assert declared()
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize(
    ("group", "settings", "match"),
    [
        (RobustSettings, {"trim": 0.6}, "trim"),
        (TorchSettings, {"dtype": "int8"}, "'dtype'"),
        (ComponentSettings, {"n_components": 0}, "n_components must be >= 1"),
        (CovarianceSettings, {"covariance_type": "round"}, "covariance_type"),
        (IterationSettings, {"max_iter": 0}, "max_iter must be >= 1"),
        (MomentsSettings, {"prior_scale": 0.0}, "prior_scale"),
        (InitSettings, {"init_params": "random"}, "init_params"),
        (GivenMixture, {"means_init": [[0.0]], "dtype": "float16"}, None),
        (VBPriorSettings, {"mean_precision_prior": -1.0}, "mean_precision_prior"),
    ],
)
def test_each_field_group_validates_its_own_fields(group, settings, match) -> None:
    """A group stands alone: it checks and normalises its fields, whatever config holds it."""
    if match is None:
        assert group(**settings).means_init.dtype == torch.float16  # placed by TorchSettings
        return
    with pytest.raises(ValueError, match=match):
        group(**({"n_components": 2} if group is ComponentSettings else {}) | settings)


def test_configs_compose_groups_and_live_beside_their_algorithms() -> None:
    for name, cls in ALGORITHMS.items():
        config = cls.config_class
        assert config.__module__ == cls.__module__, name
        if config is not PCAConfig:
            assert issubclass(config, TorchSettings), name  # seed and placement, one group
    assert issubclass(VBConfig, InitSettings) and issubclass(VBConfig, VBMomentsSettings)
    assert not issubclass(VBOneShotConfig, InitSettings | GivenMixture)
    assert not issubclass(StreamConfig, IterationSettings | MomentsSettings)
    assert issubclass(JointConfig, EMConfig) and not issubclass(PFedEMConfig, MomentsSettings)


def test_pfedem_ends_federated_ems_chain_with_its_own_step() -> None:
    """pFedEM reuses the joint model's setup: the chain's preparation steps, then its step
    (no moments round: its M-steps are plain)."""
    from fednovelty.federated.init.moments import MomentsStep
    from fednovelty.federated.joint_models.joint import JointEMStep
    from fednovelty.federated.joint_models.pfedem import PFedEM, PFedEMStep

    pfedem = PFedEM(2, 3)
    assert type(pfedem.steps[-1]) is PFedEMStep
    assert not any(isinstance(step, MomentsStep) for step in pfedem.steps)
    joint = JointFedGMM(2, 2, 3, standardize=True)
    assert type(joint.steps[-1]) is JointEMStep
    assert any(isinstance(step, MomentsStep) for step in joint.steps)
