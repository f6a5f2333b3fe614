"""Forged model files: a recomputed checksum does not make a file's values load.

A saved file's SHA-256 checksum catches damage and edits by anyone who does not recompute
it; a forger recomputes it (``persistence.checksum``), so only the meaning checks of each
kind's ``_set_state`` stand between a forged file and a loaded model. For every detector
kind the registry builds and that saves (one small fit each: 240 rows, 3 clients, few
rounds), every file is forged systematically, each forgery alone, the checksum recomputed:

- every floating tensor multiplied by 1e200, 1e-200, -1 and 0, and its first and last entry
  set to 1e300 and -1e300 (:data:`TENSOR_FORGERIES`);
- every number in the JSON document (settings and fitted attributes; of a list, its first
  and last item) multiplied by 1e200 and -1, integers staying integers
  (:data:`NUMBER_FORGERIES`).

The rule, for each forgery: loading raises ``ModelFormatError`` naming a tensor, attribute
or setting of the file, or the loaded model's outputs on held-out rows are finite
(``decision_function``, ``score_samples``; a classifier's probabilities, in [0, 1]) and its
scores within :data:`ORDERS` orders of magnitude of the genuine model's (a forger can still
make a plausible but different model; not one whose scores are off by 1e200).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fednovelty import load
from fednovelty.detectors.options import Initialisation, Training
from fednovelty.detectors.persistence import _CHECKSUM_KEY, _METADATA_KEY, checksum
from fednovelty.exceptions import ModelFormatError
from fednovelty.methods import METHODS

#: One registry method per saved layout: every class, and the settings that change what a
#: file holds (the copula, the one-shot posteriors, the classifiers' methods).
KINDS = (
    "FedGMM",
    "ClusteredGMM-IFCA",
    "Local",
    "FedGenGMM",
    "FedGenGMM-copula",
    "FedMFA",
    "FedVB",
    "FedVB-oneshot-natural",
    "streaming",
    "KNN-markers",
    "PFL-FedGMM",
    "PFL-Local",
    "PFL-pFedEM",
    "PFL-IFCA-CAM",
    "PFL-VGM2",
    "PFL-VGM2-FedAvg",
    "PFL-VGM2-Prototype",
)
#: Settings that keep each fit short, applied where the detector takes them.
FAST = {
    "max_iter": 5,
    "rounds": 2,
    "hidden": 8,
    "embedding_dim": 2,
    "n_clusters": 2,
}
#: ... and the local training's, where the detector reads them (``Training``).
FAST_TRAINING = {"local_epochs": 1, "local_steps": 1, "batch_size": 64}
#: A loaded forgery's scores may differ from the genuine model's by at most 10**ORDERS
#: times the larger of 1 and the genuine scores' magnitude.
ORDERS = 2

RNG = np.random.default_rng(0)
GROUPS = np.repeat(np.arange(3), 80)
X = RNG.normal(0, 1, (240, 4)) + np.where(np.arange(240) % 2 == 0, 0.0, 3.0)[:, None]
Y = (X[:, 0] > 1.5).astype(int)
#: held-out rows: the training populations and rows a little beyond them.
X_HELD = np.vstack(
    [RNG.normal(0, 1, (20, 4)), RNG.normal(3, 1, (20, 4)), RNG.normal(1, 4, (10, 4))]
)


def _scaled(factor: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda tensor: tensor * factor


def _entry(index: int, value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(tensor: torch.Tensor) -> torch.Tensor:
        flat = tensor.reshape(-1).clone()
        flat[index] = math.copysign(min(abs(value), torch.finfo(tensor.dtype).max), value)
        return flat.reshape(tensor.shape)

    return change


#: name -> change of one floating tensor (n-d -> same shape).
TENSOR_FORGERIES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "x1e200": _scaled(1e200),
    "x1e-200": _scaled(1e-200),
    "x-1": _scaled(-1.0),
    "x0": _scaled(0.0),
    "first=1e300": _entry(0, 1e300),
    "last=1e300": _entry(-1, 1e300),
    "first=-1e300": _entry(0, -1e300),
    "last=-1e300": _entry(-1, -1e300),
}
#: name -> (float factor, integer factor) for a number of the JSON document.
NUMBER_FORGERIES = {"x1e200": (1e200, 10**200), "x-1": (-1.0, -1)}


@dataclass(frozen=True)
class Saved:
    """A genuine file's content and the genuine model's outputs on ``X_HELD``."""

    tensors: dict[str, torch.Tensor]
    document: dict
    outputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class Outcome:
    """One forgery's verdict: ``refused`` (the message), ``far`` (loaded, scores moved by
    more than ``ORDERS`` orders of magnitude), ``broken`` (non-finite outputs, another
    exception, or a refusal that names nothing of the file) or ``loaded``."""

    forgery: str
    verdict: str
    detail: str = ""


def build(name: str):
    """An unfitted, small detector of registry method ``name``."""
    method = METHODS[name]
    shared = {"n_components": 2, "client_components": 2, "random_state": 0}
    detector = method.build(**method.shared_params(**shared))
    names = detector.get_params(deep=False)
    fast = {k: v for k, v in FAST.items() if k in names}
    if "training" in names:
        read = {f.name for f in type(detector)._params["training"].fields}
        fast["training"] = Training(**{k: v for k, v in FAST_TRAINING.items() if k in read})
    if "initialisation" in names:
        fast["initialisation"] = Initialisation(kmeans_rounds=3)
    return detector.set_params(**fast)


def fitted(name: str):
    detector = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings on 240 rows are not the point
        if METHODS[name].task == "pfl":
            return detector.fit(X, Y, GROUPS)
        return detector.fit(X, groups=GROUPS)


def outputs(model) -> dict[str, np.ndarray]:
    """What a loaded model gives ``X_HELD``: ``decision_function`` and ``score_samples`` of
    a detector, its first client's label probabilities where it classifies."""
    out = {}
    if hasattr(model, "decision_function"):
        out["decision_function"] = np.asarray(model.decision_function(X_HELD), np.float64)
        out["score_samples"] = np.asarray(model.score_samples(X_HELD), np.float64)
    first = model.client_ids_[0]
    if hasattr(model, "predict_proba_y"):
        out["proba"] = np.asarray(model.predict_proba_y(X_HELD, client=first), np.float64)
    elif "decision_function" not in out:
        out["proba"] = np.asarray(model.predict_proba(X_HELD, client=first), np.float64)
    return out


def read(path) -> tuple[dict[str, torch.Tensor], dict]:
    with safe_open(os.fspath(path), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
        document = json.loads(handle.metadata()[_METADATA_KEY])
    return tensors, document


def write(path, tensors: dict[str, torch.Tensor], document: dict) -> None:
    """A model file with a valid checksum over ``tensors`` and ``document``: a forgery."""
    text = json.dumps(document)
    save_file(
        tensors, os.fspath(path), {_METADATA_KEY: text, _CHECKSUM_KEY: checksum(text, tensors)}
    )


def number_paths(value, path=()) -> Iterator[tuple]:
    """Paths to every number of a JSON value (bools excluded); of a list, the first and
    last item only; tensor references skipped."""
    if isinstance(value, dict):
        if set(value) == {"__tensor__"}:
            return
        items = list(value.items())
    elif isinstance(value, list):
        items = [(i, value[i]) for i in sorted({0, len(value) - 1}) if value]
    else:
        return
    for key, child in items:
        if isinstance(child, int | float) and not isinstance(child, bool):
            yield (*path, key)
        else:
            yield from number_paths(child, (*path, key))


def forgeries(saved: Saved) -> Iterator[tuple[str, dict[str, torch.Tensor], dict]]:
    """Every forgery of a file: ``(description, tensors, document)``."""
    for name in sorted(saved.tensors):
        if not saved.tensors[name].is_floating_point() or saved.tensors[name].numel() == 0:
            continue
        for label, change in TENSOR_FORGERIES.items():
            tensors = dict(saved.tensors)
            tensors[name] = change(saved.tensors[name]).contiguous()
            yield f"tensor {name!r} {label}", tensors, saved.document
    for section in ("params", "attrs"):
        for path in number_paths(saved.document[section], (section,)):
            for label, factors in NUMBER_FORGERIES.items():
                document = json.loads(json.dumps(saved.document))
                parent = document
                for key in path[:-1]:
                    parent = parent[key]
                value = parent[path[-1]]
                parent[path[-1]] = value * factors[isinstance(value, int)]
                yield f"number {'.'.join(map(str, path))} {label}", saved.tensors, document


def names_of(saved: Saved) -> tuple[set[str], set[str]]:
    """What a refusal may name: ``(names, groups)``, the file's settings, attributes,
    tensors and their groups of two or more parts (``client.0``), and its one-part groups
    (``model``), which count only quoted."""
    names = set(saved.document["params"]) | set(saved.document["attrs"]) | set(saved.tensors)
    groups = set()
    for key in saved.tensors:
        parts = key.split(".")
        names |= {".".join(parts[:i]) for i in range(2, len(parts))}
        groups.add(parts[0])
    return names, groups


def named(message: str, saved: Saved) -> bool:
    """Whether a refusal ``message`` names a setting, attribute or tensor of the file."""
    names, groups = names_of(saved)
    words = {w.rstrip(".") for w in re.findall(r"[A-Za-z_][\w.]*", message)}
    quoted = {q.rstrip(".*") for q in re.findall(r"'([\w.*]+)'", message)}
    return bool(words & names or quoted & (names | groups))


def judge(description: str, path, saved: Saved) -> Outcome:
    """Load the forged file at ``path`` and judge it by the module's rule."""
    try:
        model = load(path)
    except ModelFormatError as error:
        if named(str(error), saved):
            return Outcome(description, "refused", str(error))
        return Outcome(description, "broken", f"refused naming nothing of the file: {error}")
    except Exception as error:
        return Outcome(description, "broken", f"load raised {type(error).__name__}: {error}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = outputs(model)
    except Exception as error:
        return Outcome(description, "broken", f"scoring raised {type(error).__name__}: {error}")
    for key, values in got.items():
        if not np.isfinite(values).all():
            return Outcome(description, "broken", f"{key} not finite")
        if key == "proba" and ((values < 0) | (values > 1)).any():
            return Outcome(description, "broken", "probabilities outside [0, 1]")
    for key in ("decision_function", "score_samples"):
        if key in got:
            genuine = saved.outputs[key]
            moved = float(np.abs(got[key] - genuine).max())
            scale = max(1.0, float(np.abs(genuine).max()))
            if moved > 10**ORDERS * scale:
                return Outcome(
                    description, "far", f"{key} moved by {moved:.3g} (scale {scale:.3g})"
                )
    return Outcome(description, "loaded", _moved(got, saved))


def _moved(got: dict[str, np.ndarray], saved: Saved) -> str:
    """How far a loaded forgery's scores moved, relative to the genuine scores' scale."""
    key = "decision_function" if "decision_function" in got else "proba"
    genuine = saved.outputs[key]
    moved = float(np.abs(got[key] - genuine).max())
    return f"{moved / max(1.0, float(np.abs(genuine).max())):.3g}"


def sweep(saved: Saved, path) -> list[Outcome]:
    """Every forgery of ``saved``, written to ``path`` and judged."""
    outcomes = []
    for description, tensors, document in forgeries(saved):
        write(path, tensors, document)
        outcomes.append(judge(description, path, saved))
    return outcomes


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Saved]:
    folder = tmp_path_factory.mktemp("genuine")
    out = {}
    for name in KINDS:
        model = fitted(name)
        path = folder / f"{name}.safetensors"
        model.save(path)
        tensors, document = read(path)
        out[name] = Saved(tensors, document, outputs(load(path)))
    return out


def test_every_kind_that_saves_is_swept():
    classes = {type(build(name)).__name__ for name in KINDS}
    for name, method in METHODS.items():
        if method.kind == "pyod":
            continue
        detector = method.build()
        if hasattr(detector, "save"):
            assert type(detector).__name__ in classes, f"{name} is not swept"


@pytest.mark.parametrize("kind", KINDS)
def test_forged_files_are_refused_by_name_or_score_finitely(files, kind, tmp_path):
    saved = files[kind]
    assert all(np.isfinite(v).all() for v in saved.outputs.values())
    outcomes = sweep(saved, tmp_path / "forged.safetensors")
    bad = [o for o in outcomes if o.verdict in ("broken", "far")]
    assert len(outcomes) > 20
    assert not bad, f"{len(bad)} of {len(outcomes)} forgeries of {kind}:\n" + "\n".join(
        f"  {o.forgery}: {o.verdict} ({o.detail[:160]})" for o in bad[:40]
    )


def test_a_genuine_file_of_every_kind_scores_as_saved(files, tmp_path):
    for kind, saved in files.items():
        path = tmp_path / f"{kind}.safetensors"
        write(path, saved.tensors, saved.document)
        again = outputs(load(path))
        for key, values in saved.outputs.items():
            scale = max(1.0, float(np.abs(values).max()))
            assert np.abs(again[key] - values).max() <= 1e-9 * scale, (kind, key)


def test_the_sweep_is_systematic(files):
    saved = files["FedMFA"]
    described = [d for d, *_ in forgeries(saved)]
    floating = [k for k, v in saved.tensors.items() if v.is_floating_point()]
    tensors = [d for d in described if d.startswith("tensor")]
    assert len(tensors) == len(floating) * len(TENSOR_FORGERIES)
    assert any(d.startswith("number params.reg_covar") for d in described)
    assert any(d.startswith("number attrs.threshold_") for d in described)


def _tensor(name: str, change: Callable[[torch.Tensor], torch.Tensor]):
    return lambda tensors, document: tensors.__setitem__(name, change(tensors[name]))


def _number(section: str, name: str, value):
    return lambda tensors, document: document[section].__setitem__(name, value)


#: (kind, forgery, what the refusal says): one of each check the sweep relies on.
NAMED = [
    ("FedMFA", _tensor("model.means", _scaled(1e200)), "'model.means' and 'model.psi' are too"),
    ("FedMFA", _tensor("model.psi", _scaled(1e-200)), "'model.psi' holds 8 value.* below the"),
    ("FedMFA", _tensor("model.psi", _scaled(-1.0)), "'model.psi' holds 8 value.*<= 0"),
    ("FedMFA", _tensor("model.factors", _scaled(1e200)), "the loadings 'model.factors'"),
    ("FedMFA", _tensor("model.psi", _scaled(1e200)), "gives no row more than"),
    ("FedGMM", _tensor("model.means", _scaled(1e200)), "'model.means' and 'model.precisions_"),
    ("FedVB", _tensor("posterior.means", _scaled(1e200)), "'posterior.means' and 'posterior.co"),
    (
        "KNN-markers",
        _tensor("client.0.posterior.covariances", _scaled(1e200)),
        "predictive spread of 'client.0.posterior'",
    ),
    (
        "KNN-markers",
        _tensor("client.1.posterior.mean_precision", _scaled(1e-200)),
        "predictive spread of 'client.1.posterior'",
    ),
    (
        "KNN-markers",
        _tensor("client.2.posterior.degrees_of_freedom", _scaled(1e-200)),
        "'client.2.posterior.degrees_of_freedom' holds 10 value.* below the floor",
    ),
    ("KNN-markers", _tensor("posterior.covariances", _scaled(-1.0)), "'posterior.covariances'"),
    ("PFL-IFCA-CAM", _tensor("cluster.0.0.weight", _entry(0, 1e300)), "model 'cluster.0.\\*'"),
    ("PFL-VGM2-FedAvg", _tensor("state.head.weight", _entry(0, 1e300)), "head 'state.\\*'"),
    (
        "PFL-VGM2",
        _tensor("client.1.vgm2.encoder.0.weight", _entry(-1, 1e300)),
        "the encoder 'client.1.\\*' are too large",
    ),
    ("PFL-VGM2", _number("attrs", "n_features_in_", 4 * 10**200), "'n_features_in_' and"),
    ("Local", _number("attrs", "n_models", 4), "'n_models' \\(4\\) exceeds the 3 clients"),
]


@pytest.mark.parametrize(
    ("kind", "forge", "message"), NAMED, ids=[f"{k}-{i}" for i, (k, *_) in enumerate(NAMED)]
)
def test_each_meaning_check_names_what_is_wrong(files, tmp_path, kind, forge, message):
    saved = files[kind]
    tensors, document = dict(saved.tensors), json.loads(json.dumps(saved.document))
    forge(tensors, document)
    write(tmp_path / "forged.safetensors", tensors, document)
    with pytest.raises(ModelFormatError, match=message):
        load(tmp_path / "forged.safetensors")
