"""The method registry (fednovelty/methods.py): names, factories, checks."""

from __future__ import annotations

import pytest

import fednovelty.detectors
from fednovelty import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector, Training
from fednovelty.methods import METHODS, SHARED_SETTINGS, Method, get_method, method_names

MIXTURES = ["FedGenGMM", "FedGMM", "DEM-kmeans", "DEM-separated", "DEM-subset",
            "DEM-oneshot", "ClusteredGMM-IFCA", "ClusteredGMM-FeSEM", "Local",
            "CentralGMM"]  # fmt: skip
PYOD = ["IForest", "ECOD", "COPOD", "KNN", "LOF", "HBOS", "PCA"]


def in_order(expected: list[str], names: list[str]) -> bool:
    """Whether ``expected`` stand in ``names`` in this order (a new method may stand between
    them: the checks below hold when a method is added)."""
    remaining = iter(names)
    return all(name in remaining for name in expected)


def test_names_by_task_kind_and_variant():
    known = [*MIXTURES, "FedGenGMM-copula", "FedMFA", "FedVB", "KNN-markers", *PYOD]
    assert in_order(known, method_names())
    assert not in_order(["FedVB", "FedMFA"], method_names())  # the check can fail
    assert method_names(kind="pyod") == PYOD
    assert method_names(kind="centralized") == ["CentralGMM"]
    assert method_names(kind="local") == ["Local"]
    assert method_names(kind="local", task=None) == ["Local", "PFL-Local", "PFL-VGM2-Local"]
    assert method_names(task="pfl") == [
        "PFL-FedGMM",
        "PFL-FedEM",
        "PFL-FedAvg",
        "PFL-FedProx",
        "PFL-Local",
        "PFL-pFedEM",
        "PFL-FedAvg+",
        "PFL-IFCA",
        "PFL-FeSEM",
        "PFL-IFCA-CAM",
        "PFL-FeSEM-CAM",
        "PFL-VGM2",
        "PFL-VGM2-Local",
        "PFL-VGM2-FedAvg",
        "PFL-VGM2-Prototype",
    ]
    variants = set(method_names(variants=True)) - set(method_names())
    assert variants == {"FedMFA-starts", "FedVB-oneshot-natural", "FedVB-oneshot-moment"}
    assert set(method_names(task=None, variants=True)) == set(METHODS)
    assert len(METHODS) >= 39  # the methods only: ablations are the benchmark's
    assert not [name for name in METHODS if name.endswith(("-plain", "-std", "-prior"))]
    with pytest.raises(ValueError, match="unknown kind 'pooled'"):
        method_names(kind="pooled")
    with pytest.raises(ValueError, match="unknown task 'classify'"):
        method_names(task="classify")


def test_every_entry_is_described_and_hashable():
    for method in METHODS.values():
        assert method.description and "\n" not in method.description, method.name
        assert set(method.shared) <= set(SHARED_SETTINGS)
        assert method.fits_clients == (method.kind in ("federated", "local"))
        hash(method)
    assert "FedGenGMM" in METHODS["FedGenGMM"].paper and "ICML" in METHODS["FedGMM"].paper
    assert METHODS["IForest"].paper.startswith("PyOD")


@pytest.mark.parametrize("name", method_names(variants=True))
def test_every_novelty_method_builds_an_unfitted_detector(name):
    method = get_method(name)
    shared = {"n_components": 3, "client_components": 2, "covariance_type": "diag",
              "random_state": 7}  # fmt: skip
    detector = method.build(**method.shared_params(**shared))
    assert hasattr(detector, "fit") and hasattr(detector, "decision_function")
    params = detector.get_params()
    for setting in method.shared:
        assert params[setting] == shared[setting], (name, setting)
    assert not hasattr(detector, "decision_scores_")  # not fitted


def test_the_mixtures_are_the_detector_configurations_the_papers_name():
    def params(name):
        return get_method(name).build(n_components=3, random_state=0).get_params()

    assert isinstance(get_method("FedGMM").build(), FedGMMDetector)
    assert params("FedGMM")["mixture_weights"] == "personal"
    for init in ("kmeans", "separated", "subset"):
        dem = params(f"DEM-{init}")
        assert (dem["mixture_weights"], dem["init_params"]) == ("global", init)
    central = params("CentralGMM")
    assert (central["mixture_weights"], central["init_params"]) == ("global", "kmeans")
    assert central["privacy__min_rows"] == 1 and params("DEM-kmeans")["privacy"] is None
    assert isinstance(get_method("FedGenGMM").build(), FedGenGMMDetector)
    assert get_method("FedGenGMM-copula").build().copula and not params("FedGenGMM")["copula"]
    local = get_method("Local").build(client_components=2, random_state=0)
    assert isinstance(local, LocalGMMDetector) and local.client_components == 2
    assert get_method("Local").shared_params(n_components=9, random_state=1) == {"random_state": 1}


def test_pyod_baselines_take_only_their_seed():
    pca = get_method("PCA")
    assert pca.shared_params(n_components=10, covariance_type="full", random_state=3) == {
        "random_state": 3
    }
    assert pca.build(**pca.shared_params(n_components=10, random_state=3)).n_components is None
    assert get_method("ECOD").shared_params(n_components=10, random_state=3) == {}
    assert get_method("IForest").build(random_state=3).random_state == 3


def test_unknown_names_and_parameters_are_refused_with_the_closest():
    with pytest.raises(ValueError, match=r"unknown method 'IForrest' \(did you mean IForest"):
        get_method("IForrest")
    known = (
        r"Known: FedGenGMM, FedGMM, .*PFL-Local, PFL-pFedEM, .*PFL-VGM2-Prototype.*; and the "
        r"variants FedMFA-starts, FedVB-oneshot-natural, FedVB-oneshot-moment\.$"
    )
    with pytest.raises(ValueError, match=known):
        get_method("nope")
    with pytest.raises(ValueError, match=r"'n_compnents' \(did you mean n_components"):
        get_method("DEM-kmeans").build(n_compnents=3)
    with pytest.raises(ValueError, match="DEM-kmeans fixes mixture_weights='global'"):
        get_method("DEM-kmeans").build(mixture_weights="personal")
    with pytest.raises(ValueError, match=r"unknown method 'FedGenGMM-plain' \(did you mean"):
        get_method("FedGenGMM-plain")  # an ablation: fednovelty.evaluation.ablations
    with pytest.raises(ValueError, match="unknown shared setting 'seed'"):
        get_method("FedGMM").shared_params(seed=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        Method("X", FedGMMDetector, "cloud", "", "x")
    with pytest.raises(ValueError, match="task must be one of"):
        Method("X", FedGMMDetector, "federated", "", "x", task="regression")


def test_a_factory_without_get_params_passes_parameters_through():
    method = Method("Echo", lambda **params: params, "centralized", "", "returns its params")
    assert method.parameters() == () and method.build(anything=1) == {"anything": 1}


def test_pfl_methods_are_joint_baselines_built_by_name(monkeypatch):
    calls = []

    class FakeJoint:
        @classmethod
        def pfl_baseline(cls, name, **params):
            calls.append((name, params))
            return cls()

        def get_params(self, deep=True):
            return {"n_components": 3, "n_learners": 3, "random_state": None}

    monkeypatch.setattr(fednovelty.detectors, "JointFedGMMDetector", FakeJoint, raising=False)
    for name in ("FedGMM", "FedEM", "FedAvg", "FedProx", "Local"):
        method = get_method(f"PFL-{name}")
        assert method.task == "pfl" and method.kind == ("local" if name == "Local" else "federated")
        calls.clear()
        assert isinstance(method.build(n_components=2, random_state=1), FakeJoint)
        assert calls[-1] == (name, {"n_components": 2, "random_state": 1})
    with pytest.raises(ValueError, match="unknown parameter of PFL-FedAvg 'mixture_weights'"):
        get_method("PFL-FedAvg").build(mixture_weights="global")


def test_pfl_methods_build_the_joint_estimator():
    joint = fednovelty.detectors.JointFedGMMDetector
    fedem = get_method("PFL-FedEM").build(n_learners=3, random_state=0)
    assert isinstance(fedem, joint) and fedem.n_components == 1 and fedem.n_learners == 3
    assert get_method("PFL-FedProx").build().training.mu_prox == 0.01
    built = get_method("PFL-FedProx").build(training=Training(mu_prox=0.5, local_epochs=2))
    assert (built.training.mu_prox, built.training.local_epochs) == (0.5, 2)


def test_fedvb_takes_no_runner_k_and_its_variants_fix_the_aggregation():
    fedvb = get_method("FedVB")
    assert fedvb.shared_params(n_components=3, covariance_type="diag", random_state=1) == {
        "covariance_type": "diag",
        "random_state": 1,
    }
    assert fedvb.build().n_components == 20 and fedvb.build(n_components=5).n_components == 5
    for how in ("natural", "moment"):
        variant = get_method(f"FedVB-oneshot-{how}")
        assert variant.variant_of == "FedVB" and variant.build().posterior_merge == how
        with pytest.raises(ValueError, match="fixes posterior_merge"):
            variant.build(posterior_merge="exact")
    assert get_method("FedVB").build().posterior_merge == "exact"


def test_the_streaming_detector_is_a_stream_method():
    streaming = get_method("streaming")
    assert method_names(task="stream") == ["streaming"] and streaming.fits_clients
    assert "streaming" not in method_names(variants=True)  # the one-shot runners' lists
    detector = streaming.build(n_components=2, covariance_type="diag", random_state=4, rho=0.5)
    assert isinstance(detector, fednovelty.detectors.StreamingFedGMMDetector)
    assert (detector.n_components, detector.rho, detector.random_state) == (2, 0.5, 4)


def test_pfedem_does_not_inherit_the_joint_baselines():
    from sklearn.base import clone

    pfedem, joint = fednovelty.detectors.PFedEMDetector, fednovelty.detectors.JointFedGMMDetector
    assert not hasattr(pfedem, "pfl_baseline") and not hasattr(pfedem(), "pfl_baseline")
    with pytest.raises(AttributeError, match="pfl_baseline"):
        pfedem.pfl_baseline("FedAvg")
    assert type(joint.pfl_baseline("FedAvg")) is joint
    assert clone(pfedem(3)).n_components == 3  # the estimator contract is untouched


def test_the_registry_names_every_variant_the_algorithms_define():
    # the registry keeps its import light (no torch), so it names the algorithms' variants
    # with their papers and descriptions; each must be one the algorithm layer defines, and
    # every one it defines must be registered
    from fednovelty.federated.bayesian.vgm2_methods import VGM2_METHODS
    from fednovelty.federated.clustered.cam_methods import CLUSTERED_METHODS
    from fednovelty.federated.joint_models.joint import PFL_METHODS

    def fixed(class_name: str, setting: str) -> set:
        return {
            m.fixed[setting]
            for m in METHODS.values()
            if getattr(m.factory, "class_name", "") == class_name
        }

    pfl = {m.factory.paper_name for m in METHODS.values() if hasattr(m.factory, "paper_name")}
    assert pfl == set(PFL_METHODS)
    assert fixed("ClusteredFLClassifier", "method") == set(CLUSTERED_METHODS)
    assert fixed("VGM2Classifier", "method") == set(VGM2_METHODS)


def test_reading_the_registry_imports_no_detector_and_no_pyod():
    """The CLI's choices and the dashboard read the registry before any fit: the detector
    classes (and an option object a method fixes) are imported when a method is built."""
    import subprocess
    import sys

    code = (
        "import sys, fednovelty.methods as m; "
        "print(sorted(x for x in ('pyod', 'fednovelty.detectors.fedgmm', "
        "'fednovelty.detectors.options') if x in sys.modules)); "
        "print(m.get_method('CentralGMM').build(n_components=2).privacy.min_rows)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "1"]
