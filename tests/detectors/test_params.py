"""Every public estimator writes its ``__init__`` out, and it matches the parameter table.

``fednovelty.detectors._params`` declares each estimator's parameters once (documentation,
constraints, routing); the estimator's own file writes ``__init__`` with those names,
defaults and order, its body one ``store(self, locals())`` that keeps each argument under
its own name (scikit-learn's rule). These tests check the written signatures against the
table, check that a mismatch is refused (the probes), and that no code in
``fednovelty/detectors`` builds functions with ``exec``.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone

import fednovelty
import fednovelty.detectors as detectors
from fednovelty.detectors import (
    ClientSampling,
    FedGMMDetector,
    FedMFADetector,
    FedVBDetector,
    Initialisation,
    JointFedGMMDetector,
    Objective,
    Prior,
    Privacy,
    Robustness,
    Training,
    VGM2Classifier,
    _declare,
    _params,
)
from fednovelty.detectors._params import Param, declare, store
from fednovelty.detectors.base import MixtureDetector, SimulatedFitMixin
from fednovelty.exceptions import ModelFormatError

DETECTORS_DIR = Path(detectors.__file__).parent

#: every public estimator class (the exports that declare their parameters).
ESTIMATORS = [
    getattr(detectors, name)
    for name in detectors.__all__
    if isinstance(getattr(detectors, name), type)
    and issubclass(getattr(detectors, name), SimulatedFitMixin)
    and "_params" in vars(getattr(detectors, name))
]


def test_every_public_estimator_is_covered():
    names = {cls.__name__ for cls in ESTIMATORS}
    assert {"FedGMMDetector", "FedVBDetector", "JointFedGMMDetector", "PFedEMDetector"} <= names
    assert {"VGM2Classifier", "ClusteredFLClassifier", "StreamingFedGMMDetector"} <= names
    assert len(ESTIMATORS) == 12


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda cls: cls.__name__)
def test_the_written_signature_is_the_declared_one(cls):
    spec = cls._params
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in parameters] == list(spec.names)
    for index, (param, declared) in enumerate(zip(parameters, spec.params, strict=True)):
        assert param.default == declared.default, param.name
        assert type(param.default) is type(declared.default), param.name
        expected = (
            inspect.Parameter.POSITIONAL_OR_KEYWORD
            if index < spec.positional
            else inspect.Parameter.KEYWORD_ONLY
        )
        assert param.kind is expected, param.name
    assert _params.signature_mismatch(cls, spec) == ""
    assert set(cls._parameter_constraints) == set(spec.names)
    assert list(cls().get_params(deep=False)) == sorted(spec.names)


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda cls: cls.__name__)
def test_init_is_written_in_the_estimators_own_file_and_only_stores(cls):
    init = cls.__dict__["__init__"]
    assert Path(inspect.getsourcefile(init)).resolve() == Path(inspect.getsourcefile(cls)).resolve()
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    (statement,) = tree.body[0].body  # the one statement: store(self, locals())
    assert ast.unparse(statement) == "store(self, locals())"
    # each argument is kept under its own name, the very object given
    given = {name: object() for name in cls._params.names}
    det = cls(**given)
    assert all(getattr(det, name) is value for name, value in given.items())
    assert set(vars(det)) == set(given)


def test_store_names_an_argument_it_was_not_given():
    class Forgetful:
        def __init__(self, alpha=1, beta=2):
            arguments = locals()
            del arguments["beta"]
            store(self, arguments)

    with pytest.raises(TypeError, match=r"Forgetful.__init__ .* 'beta' is missing"):
        Forgetful()


def test_no_exec_in_the_detector_layer():
    for path in sorted(DETECTORS_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("exec", "eval")
        ]
        assert not calls, f"{path.name} calls exec/eval"


# ------------------------------------------------------------------ the probes
_OWN = declare(Param("alpha", True, ["boolean"], "a probe."), docs={"contamination": "Probe."})


def _probe_class(init_source: str) -> type:
    namespace: dict = {}
    source = textwrap.dedent(init_source)
    code = compile(source, "<probe>", "exec")
    exec(code, {}, namespace)  # the probe's own __init__, written as text
    return type("Probe", (), {"__init__": namespace["__init__"]})


_GOOD = """
def __init__(self, alpha=True, *, contamination=0.2, random_state=None, device=None,
             dtype="float64", progress=False):
    pass
"""


def test_the_signature_completes_the_declaration_from_the_shared_table():
    spec = _declare.complete(_probe_class(_GOOD), _OWN, _params.SHARED)
    assert spec.names == ("alpha", "contamination", "random_state", "device", "dtype", "progress")
    assert spec.positional == 1 and spec["alpha"].doc == "a probe."
    shared = _params.SHARED["contamination"]  # the table's, with the signature's default
    assert (spec["contamination"].default, shared.default) == (0.2, 0.1)
    assert spec["contamination"].doc == f"{shared.doc} Probe."
    assert spec["contamination"].constraints == shared.constraints
    assert _params.signature_mismatch(_probe_class(_GOOD), spec) == ""


@pytest.mark.parametrize(
    ("init_source", "problem"),
    [
        (_GOOD.replace("alpha=True", "alpha=2"), "alpha"),  # outside its constraints
        (_GOOD.replace("contamination=0.2", "contamination=0.9"), "contamination"),
        (_GOOD.replace("progress=False", "progres=False"), "'progres', which is neither"),
        (_GOOD.replace("alpha=True, *,", "*,"), "does not write declared ['alpha']"),
        (_GOOD.replace("contamination=0.2, ", ""), "docs of Probe name 'contamination'"),
    ],
)
def test_a_signature_the_table_cannot_complete_is_named(init_source, problem):
    with pytest.raises(TypeError, match=re.escape(problem)):
        _declare.complete(_probe_class(init_source), _OWN, _params.SHARED)


def test_a_class_whose_init_differs_is_refused_when_defined():
    with pytest.raises(TypeError, match=r"Wrong.__init__ writes 'colour', which is neither"):

        class Wrong(MixtureDetector):
            _params = declare()

            def __init__(self, *, colour="red", contamination=0.1):
                store(self, locals())

    with pytest.raises(TypeError, match=r"Unwritten.__init__ writes no __init__"):

        class Unwritten(MixtureDetector):
            _params = declare()


def test_a_written_class_clones_with_its_arguments():
    for cls in ESTIMATORS:
        det = cls(random_state=3)
        again = clone(det)
        assert again.get_params(deep=False) == det.get_params(deep=False)


# ------------------------------------------------------------------ the option objects
OPTIONS = [ClientSampling, Initialisation, Objective, Prior, Privacy, Robustness, Training]


@pytest.mark.parametrize("cls", OPTIONS, ids=lambda cls: cls.__name__)
def test_each_option_writes_its_init_from_its_table(cls):
    assert _params.signature_mismatch(cls, cls._params) == ""
    assert set(cls._parameter_constraints) == set(cls._params.names)
    option = cls()
    assert clone(option) == option and clone(option) is not option
    assert repr(option) == f"{cls.__name__}()"
    assert getattr(fednovelty, cls.__name__) is cls
    assert getattr(detectors, cls.__name__) is cls


def test_one_meaning_per_name_across_estimators():
    """An option field is the same Param wherever an estimator reads it; only its routing
    name may differ (VGM2's robust aggregation is ``robust_aggregation``)."""
    for cls in ESTIMATORS:
        for option in cls._params.options:
            table = option.option._params
            for field in option.fields:
                declared = table[field.name]
                assert (field.default, field.doc, field.role) == (
                    declared.default,
                    declared.doc,
                    declared.role,
                ), (cls.__name__, field.name)
    for cls in ESTIMATORS:  # no flat copy of a field the estimator reads from an option
        names = set(cls._params.names) - {"init_params"}
        read = {f.legacy or f.name for option in cls._params.options for f in option.fields}
        assert not read & names, cls.__name__


def test_an_option_left_none_routes_the_former_defaults():
    """``None`` options give the algorithm the settings the flat parameters gave."""
    settings = FedGMMDetector()._settings(5)
    assert {k: settings[k] for k in ("aggregation", "trim", "client_weight_cap")} == {
        "aggregation": "sum",
        "trim": 0.1,
        "client_weight_cap": None,
    }
    assert (settings["kmeans_rounds"], settings["subset_size"]) == (10, 100)
    assert (settings["standardize"], settings["prior_strength"], settings["prior_scale"]) == (
        True,
        7.0,
        4.0,
    )
    assert FedGMMDetector()._engine_settings() == {
        "fraction": 1.0,
        "dropout": 0.0,
        "batch_clients": True,
        "engine": "in-process",
    }
    vb = FedVBDetector()._settings(3)
    assert (vb["prior_scale"], vb["prior_strength"], vb["covariance_prior"]) == (1.0, 5.0, None)
    assert FedMFADetector()._option("prior").strength is None
    assert VGM2Classifier()._option("privacy").learner_share == 0.9
    assert JointFedGMMDetector()._option("privacy").learner_share == 0.5
    given = FedGMMDetector(prior=Prior(strength=3.0, scale=2.0))._settings(5)
    assert (given["prior_strength"], given["prior_scale"]) == (3.0, 2.0)


def test_nested_set_params_never_shares_a_default_object():
    a, b = FedGMMDetector(), FedGMMDetector()
    a.set_params(privacy__epsilon=1.0)
    b.set_params(privacy__epsilon=2.0, robustness__trim=0.2)
    assert a.privacy == Privacy(epsilon=1.0) and b.privacy == Privacy(epsilon=2.0)
    assert a.privacy is not b.privacy and a.robustness is None
    assert b.get_params()["robustness__trim"] == 0.2
    given = Robustness(aggregation="trimmed")
    c = FedGMMDetector(robustness=given)
    assert c.get_params()["robustness"] is given
    assert c.get_params()["robustness__aggregation"] == "trimmed"


def test_fit_does_not_change_the_options_it_was_given():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 2))
    prior, start = Prior(standardize=False, strength=None), Initialisation(kmeans_rounds=2)
    before = (prior.get_params(), start.get_params())
    det = FedGMMDetector(2, max_iter=3, prior=prior, initialisation=start, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fit(X, groups=np.arange(120) % 3)
    assert det.prior is prior and det.initialisation is start
    assert (prior.get_params(), start.get_params()) == before
    kinds = [record["kind"] for record in det.history_]
    assert kinds.count("em") == 3 and kinds.count("assign") <= 2  # 2 Lloyd rounds at most
    assert not [kind for kind in kinds if kind.startswith("moments")]  # no standardisation


def test_a_field_the_estimator_does_not_read_is_named():
    X = np.random.default_rng(0).normal(size=(60, 3))
    with pytest.raises(ValueError, match=r"FedMFADetector does not read privacy\.epsilon"):
        FedMFADetector(privacy=Privacy(epsilon=1.0)).fit(X)
    FedVBDetector(initialisation=Initialisation(weights_init=[1.0]))._validate_params()  # read
    with pytest.raises(ValueError, match=r"does not read initialisation\.weights_init"):
        JointFedGMMDetector(initialisation=Initialisation(weights_init=[1.0]))._validate_params()
    with pytest.raises(ValueError, match=r"'epsilon' parameter of Privacy"):
        FedGMMDetector(privacy=Privacy(epsilon=-1.0))._validate_params()
    with pytest.raises(ValueError, match="'privacy' parameter"):
        FedGMMDetector(privacy={"epsilon": 1.0})._validate_params()


def test_a_saved_option_with_a_field_of_another_class_is_named(tmp_path):
    from _saved_files import rewrite

    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det = FedGMMDetector(2, max_iter=2, random_state=0).fit(rng.normal(size=(60, 2)))
    det.set_params(robustness__trim=0.2).save(tmp_path / "m")
    assert fednovelty.load(tmp_path / "m").robustness == Robustness(trim=0.2)
    rewrite(tmp_path / "m", lambda text: text.replace('"trim": 0.2', '"fraction": 0.5'))
    with pytest.raises(ModelFormatError, match=r"'robustness' must be an object of Robustness"):
        fednovelty.load(tmp_path / "m")


def test_the_option_objects_docstring_examples_run():
    import doctest

    from fednovelty.detectors import options

    result = doctest.testmod(options, raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0
