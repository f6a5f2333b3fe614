"""The privacy contract of every fednovelty estimator (``_every_estimator.NAMES``).

:data:`READS_EPSILON` classifies each estimator: private ones read ``Privacy.epsilon``
(differential privacy) and report the budget they spent in ``privacy_spent_``; the others
refuse ``epsilon`` by name. For each estimator the contract checks:

- not private: ``privacy.epsilon`` set is a ``ValueError`` naming it, raised before any round
  (the estimator stays unfitted);
- private: a fit on the small data spends ``0 < epsilon <= privacy.epsilon`` and scores every
  row finitely; two fits with the same ``random_state`` (and the same global numpy and torch
  seeds) release different noise, while two fits without privacy are bit for bit the same;
  saving and loading keeps ``privacy_spent_``; a refit without ``epsilon`` removes it;
- private: each setting without a private form (:data:`NO_PRIVATE_FORM`, and the federated
  PCA front end ``pca_components``) is a ``ValueError`` naming the setting, raised before
  any round.

The fits are the ones of ``_every_estimator.build`` shortened further (:data:`SHORT`) at a
small budget (:data:`EPSILON`): dp-accounting's privacy-loss distributions, most of a private
fit's time, are smaller there. Family files (``test_dp_*.py``) keep what is particular to a
family: closed forms, accountants run by hand, utility, mechanism details.
"""

from __future__ import annotations

import copy
import functools
import warnings

import numpy as np
import pytest
import torch
from _every_estimator import NAMES, build, data, fit, labelled, scores
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

from fednovelty import Privacy, load
from fednovelty.detectors.options import Initialisation
from fednovelty.methods import METHODS

#: Whether each estimator reads ``Privacy.epsilon`` (differential privacy). A new estimator
#: must be added here.
READS_EPSILON = {
    "FedGenGMM": True,
    "FedGMM": True,
    "DEM-kmeans": True,
    "DEM-separated": True,
    "DEM-subset": True,
    "DEM-oneshot": True,
    "ClusteredGMM-IFCA": False,
    "ClusteredGMM-FeSEM": False,
    "Local": True,
    "CentralGMM": False,  # the method fixes privacy=Privacy(min_rows=1): nothing crosses a wire
    "FedGenGMM-copula": True,
    "FedMFA": False,
    "FedMFA-starts": False,
    "FedVB": True,
    "FedVB-oneshot-natural": True,
    "FedVB-oneshot-moment": True,
    "streaming": False,
    "KNN-markers": False,
    "PFL-FedGMM": True,
    "PFL-FedEM": True,
    "PFL-FedAvg": True,
    "PFL-FedProx": True,
    "PFL-Local": True,
    "PFL-pFedEM": True,
    "PFL-FedAvg+": True,
    "PFL-IFCA": True,
    "PFL-FeSEM": True,
    "PFL-IFCA-CAM": True,
    "PFL-FeSEM-CAM": True,
    "PFL-VGM2": True,
    "PFL-VGM2-Local": True,
    "PFL-VGM2-FedAvg": True,
    "PFL-VGM2-Prototype": True,
    "StreamingFedGMM": False,
}
#: The settings of private estimators that have no private form, each refused by name:
#: ``name -> (settings beyond build's, the refusal)``; no settings: the method fixes it.
NO_PRIVATE_FORM = {
    "DEM-subset": ({}, r"init_params='subset' has no private form"),
    "DEM-oneshot": ({}, r"acceleration='squarem' .* no dp_mode"),
    "FedVB-oneshot-natural": ({}, r"posterior_merge='natural' .* no private form"),
    "FedVB-oneshot-moment": ({}, r"posterior_merge='moment' .* no private form"),
    "PFL-pFedEM": ({}, r"gaussian_aggregation='paper' .* no private form"),
    "PFL-VGM2-Prototype": ({}, r"prototype baseline has no private form .* use method="),
}
#: The settings that give an estimator of :data:`NO_PRIVATE_FORM` its private form.
PRIVATE_FORM = {"PFL-pFedEM": {"gaussian_aggregation": "exact"}}
#: The budget of every private fit here.
EPSILON = 1.0
#: Shorter than ``_every_estimator.FAST`` where the estimator has them: each release charges
#: the clients' ledgers, read from dp-accounting one release at a time.
SHORT = {"max_iter": 2, "rounds": 2, "initialisation": Initialisation(kmeans_rounds=1)}
#: The ``Privacy`` fields of the private fits, each passed where the estimator reads it:
#: a public box wider than every row of ``data()``, few DP-EM iterations of a client's own
#: fit, four DP-SGD steps an epoch.
FIELDS = {"bounds": ([-5.0] * 3, [9.0] * 3), "local_iterations": 2, "sample_rate": 0.25}

PRIVATE = [name for name in NAMES if READS_EPSILON.get(name)]
NOT_PRIVATE = [name for name in NAMES if not READS_EPSILON.get(name, True)]
FITS_PRIVATELY = [n for n in PRIVATE if n not in NO_PRIVATE_FORM or n in PRIVATE_FORM]
#: the private estimators with a federated PCA front end (``pca_components``): it has no
#: private form in any of them.
PCA = [n for n in FITS_PRIVATELY if "pca_components" in build(n).get_params(deep=False)]
#: private estimators whose model never leaves the clients: only row counts are released
#: (noisy), the model is each client's own, trained without noise.
KEPT_ON_CLIENTS = ("PFL-VGM2-Local",)


def _privacy_fields(name: str) -> set[str]:
    """The ``Privacy`` fields the estimator of ``name`` declares that it reads."""
    options = type(build(name))._params.options
    return {field.name for option in options if option.name == "privacy" for field in option.fields}


def _private(name: str, **fields) -> Privacy:
    """``Privacy(epsilon=EPSILON)`` with those of :data:`FIELDS` (or ``fields``) it reads."""
    reads = _privacy_fields(name)
    return Privacy(epsilon=EPSILON, **{k: v for k, v in {**FIELDS, **fields}.items() if k in reads})


def _build(name: str, **params):
    """``build(name)`` shortened by :data:`SHORT` where the estimator has those settings."""
    detector = build(name, **params)
    names = detector.get_params(deep=False)
    return detector.set_params(**{k: v for k, v in SHORT.items() if k in names})


def _fit(detector, name: str):
    """``detector`` fitted on ``data()`` after seeding numpy's and torch's global generators
    (a fit without fresh noise is then fully reproducible)."""
    np.random.seed(0)  # noqa: NPY002 - the legacy global seed is a source the noise must not use
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*did not converge")  # 2 rounds, on purpose
        return fit(detector, name, *data())


def _outputs(detector, name: str) -> np.ndarray:
    """Every score the fitted estimator gives ``data()``'s rows, flattened: ``scores`` and,
    for a classifier with a density, ``decision_function`` too."""
    X = data()[0]
    parts = [np.asarray(scores(detector, name, X), dtype=float).ravel()]
    if labelled(name) and hasattr(detector, "decision_function"):
        parts.append(np.asarray(detector.decision_function(X), dtype=float))
    return np.concatenate(parts)


@functools.cache
def _private_fits(name: str):
    """Two private fits of ``name``: same data, ``random_state`` and global seeds."""
    return tuple(
        _fit(_build(name, privacy=_private(name), **PRIVATE_FORM.get(name, {})), name)
        for _ in range(2)
    )


def _refused_before_any_round(detector, name: str, match: str) -> None:
    """``fit`` raises a ``ValueError`` matching ``match`` and leaves ``detector`` unfitted."""
    with pytest.raises(ValueError, match=match):
        _fit(detector, name)
    with pytest.raises(NotFittedError):
        check_is_fitted(detector)
    assert not hasattr(detector, "history_")


# ----------------------------------------------------------------------------- the table
def test_the_table_classifies_every_estimator_by_its_declared_privacy_fields():
    """Every estimator is classified, and private exactly where it declares
    ``Privacy.epsilon`` and its method does not fix ``privacy``."""
    assert sorted(READS_EPSILON) == sorted(NAMES)
    declared = {
        name: "epsilon" in _privacy_fields(name)
        and "privacy" not in (METHODS[name].fixed if name in METHODS else {})
        for name in NAMES
    }
    assert declared == READS_EPSILON
    assert set(NO_PRIVATE_FORM) <= set(PRIVATE) and set(PRIVATE_FORM) <= set(NO_PRIVATE_FORM)


# ----------------------------------------------------------------------------- not private
@pytest.mark.parametrize("name", NOT_PRIVATE)
def test_an_estimator_without_dp_refuses_epsilon_by_name_before_any_round(name):
    """``privacy.epsilon`` is named before any round; a method that fixes ``privacy``
    (CentralGMM) refuses any ``privacy=`` when it is built, naming what it fixes."""
    privacy = Privacy(epsilon=EPSILON)
    if name in METHODS and "privacy" in METHODS[name].fixed:
        with pytest.raises(ValueError, match=r"fixes privacy="):
            build(name, privacy=privacy)
        return
    _refused_before_any_round(_build(name, privacy=privacy), name, r"privacy\.epsilon")


# ----------------------------------------------------------------------------- private
@pytest.mark.parametrize("name", FITS_PRIVATELY)
def test_the_fit_spends_its_budget_and_no_more(name):
    """``0 < privacy_spent_["epsilon"] <= privacy.epsilon`` and a finite score of every row."""
    det, _ = _private_fits(name)
    assert 0 < det.privacy_spent_["epsilon"] <= EPSILON * (1 + 1e-9)
    assert np.isfinite(_outputs(det, name)).all()


@pytest.mark.parametrize("name", [n for n in FITS_PRIVATELY if n not in KEPT_ON_CLIENTS])
def test_the_noise_is_fresh_whatever_the_random_state(name):
    """Same data, ``random_state`` and global seeds: without privacy the same model bit for
    bit, with it different noise (drawn from the OS, not from any seed an adversary knows)."""
    plain = [_outputs(_fit(_build(name, **PRIVATE_FORM.get(name, {})), name), name)]
    plain.append(_outputs(_fit(_build(name, **PRIVATE_FORM.get(name, {})), name), name))
    np.testing.assert_array_equal(plain[0], plain[1])
    a, b = _private_fits(name)
    assert not np.array_equal(_outputs(a, name), _outputs(b, name))


@pytest.mark.parametrize("name", KEPT_ON_CLIENTS)
def test_a_model_kept_on_the_clients_is_the_plain_one_and_runs_no_dp_sgd(name):
    """Nothing noisy reaches such a model: under ``privacy.epsilon`` it is the plain fit's,
    bit for bit, and ``privacy_spent_`` counts the noisy row counts only (no DP-SGD step)."""
    plain = _fit(_build(name, **PRIVATE_FORM.get(name, {})), name)
    private, _ = _private_fits(name)
    np.testing.assert_array_equal(_outputs(private, name), _outputs(plain, name))
    assert "sgd_steps" not in private.privacy_spent_
    assert private.privacy_spent_["releases"] == 0


@pytest.mark.parametrize("name", FITS_PRIVATELY)
def test_privacy_spent_is_saved(name, tmp_path):
    """The loaded model keeps ``privacy_spent_`` and scores bit for bit as the saved one."""
    det, _ = _private_fits(name)
    det.save(tmp_path / "model")
    back = load(tmp_path / "model")
    assert back.privacy_spent_ == det.privacy_spent_
    np.testing.assert_array_equal(_outputs(back, name), _outputs(det, name))


@pytest.mark.parametrize("name", FITS_PRIVATELY)
def test_a_refit_without_dp_drops_privacy_spent(name):
    """A private model refitted with ``privacy.epsilon=None`` has no ``privacy_spent_``
    (the attribute is removed, not set to ``None``)."""
    det = copy.deepcopy(_private_fits(name)[1])
    _fit(det.set_params(privacy__epsilon=None), name)
    assert not hasattr(det, "privacy_spent_")


@pytest.mark.parametrize("name", list(NO_PRIVATE_FORM))
def test_settings_without_a_private_form_are_refused_before_any_round(name):
    settings, match = NO_PRIVATE_FORM[name]
    _refused_before_any_round(_build(name, privacy=_private(name), **settings), name, match)


@pytest.mark.parametrize("name", PCA)
def test_the_pca_front_end_is_refused_before_any_round(name):
    """The federated PCA rounds have no private form in any estimator that offers them."""
    settings = {**PRIVATE_FORM.get(name, {}), "pca_components": 2}
    detector = _build(name, privacy=_private(name), **settings)
    _refused_before_any_round(detector, name, r"pca_components")
