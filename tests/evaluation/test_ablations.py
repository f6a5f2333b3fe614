"""Ablations of the robust defaults (fednovelty/evaluation/ablations.py): which methods take
them, what they switch, their names, and a benchmark run with ``ablations=``."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from fednovelty.evaluation import benchmark
from fednovelty.evaluation.ablations import (
    ABLATIONS,
    ablated,
    ablation_names,
    check_ablations,
    resolve_method,
    takes_ablation,
    with_ablations,
)
from fednovelty.evaluation.benchmark import METRICS, run_benchmark
from fednovelty.methods import METHODS, get_method, method_names

MIXTURES = ["FedGenGMM", "FedGMM", "DEM-kmeans", "DEM-separated", "DEM-subset",
            "DEM-oneshot", "ClusteredGMM-IFCA", "ClusteredGMM-FeSEM", "Local",
            "CentralGMM"]  # fmt: skip
TINY = {"n_components": 2, "max_train": 150, "n_clients": (3,), "progress": False}


def test_the_methods_whose_detectors_have_the_settings_take_every_ablation():
    takers = [*MIXTURES, "FedGenGMM-copula", "FedMFA", "FedVB"]
    assert ablation_names(method_names()) == [f"{m}-{a}" for m in takers for a in ABLATIONS]
    assert ablation_names(method_names(task="pfl")) == []  # the classifiers take none
    assert not takes_ablation(METHODS["IForest"], "plain")
    assert not takes_ablation(METHODS["streaming"], "plain")
    assert not set(ablation_names(method_names())) & set(METHODS)  # not registry entries


@pytest.mark.parametrize("ablation", list(ABLATIONS))
def test_an_ablation_sets_its_settings_and_keeps_the_method(ablation):
    for name in MIXTURES:
        method, variant = get_method(name), resolve_method(f"{name}-{ablation}")
        assert variant.name == f"{name}-{ablation}"
        assert (variant.kind, variant.task, variant.shared) == (
            method.kind,
            method.task,
            method.shared,
        )
        assert variant.fixed == {**method.fixed, **ABLATIONS[ablation]}
        shared = method.shared_params(n_components=2, random_state=0)
        default = method.build(**shared).get_params(deep=False)
        params = variant.build(**shared).get_params(deep=False)
        assert params == {**default, **ABLATIONS[ablation]}, name
        assert default != params  # the robust defaults are on by default
    assert resolve_method("CentralGMM-plain").build().get_params()["privacy__min_rows"] == 1


def test_an_ablation_refuses_the_settings_it_fixes():
    setting, value = next(iter(ABLATIONS["plain"].items()))
    with pytest.raises(ValueError, match=re.escape(f"FedGenGMM-plain fixes {setting}={value!r}")):
        resolve_method("FedGenGMM-plain").build(**{setting: value})


def test_names_and_refusals():
    assert check_ablations("plain,std") == ["plain", "std"]
    assert check_ablations(["prior", "plain, prior"]) == ["prior", "plain"]
    with pytest.raises(ValueError, match=r"unknown ablation 'plian' \(did you mean plain"):
        check_ablations(["plian"])
    assert with_ablations(["FedGenGMM", "IForest", "DEM-kmeans"], "plain,std") == [
        "FedGenGMM", "IForest", "DEM-kmeans", "FedGenGMM-plain", "FedGenGMM-std",
        "DEM-kmeans-plain", "DEM-kmeans-std",
    ]  # fmt: skip
    assert with_ablations(["FedGMM", "FedGMM-plain"], ["plain"]) == ["FedGMM", "FedGMM-plain"]
    assert with_ablations(["IForest"]) == ["IForest"]
    with pytest.raises(ValueError, match="none of the methods IForest takes the ablation"):
        with_ablations(["IForest"], ["plain"])
    assert resolve_method("FedGMM") is METHODS["FedGMM"]
    with pytest.raises(ValueError, match="IForest does not take the ablation 'plain'"):
        resolve_method("IForest-plain")
    with pytest.raises(ValueError, match=r"unknown method 'FedGMM-plian' \(did you mean"):
        resolve_method("FedGMM-plian")
    with pytest.raises(ValueError, match="unknown ablation"):
        ablated(METHODS["FedGMM"], "none")


def test_bench_checks_ablation_names():
    check = benchmark.check_methods
    assert check(["DEM-kmeans-plain", "IForest"]) == ["DEM-kmeans-plain", "IForest"]
    assert check(["FedGMM", "IForest"], ["prior"]) == ["FedGMM", "IForest", "FedGMM-prior"]
    with pytest.raises(ValueError, match="IForest does not take the ablation"):
        check(["IForest-plain"])
    with pytest.raises(ValueError, match="unknown method 'streaming-plain'"):
        check(["streaming-plain"])
    with pytest.raises(ValueError, match="unknown ablation"):
        check(["FedGMM"], ["plian"])


def test_a_run_with_ablations_adds_their_rows_and_keeps_the_methods(tmp_path):
    methods = ["DEM-kmeans", "IForest"]
    plain = run_benchmark(["4_breastw"], methods, **TINY)
    both = run_benchmark(["4_breastw"], methods, ablations=["plain"], **TINY)
    alone = run_benchmark(["4_breastw"], ["DEM-kmeans-plain"], **TINY)
    assert both["error"].isna().all(), both["error"].dropna().tolist()
    assert list(both["method"]) == ["DEM-kmeans", "IForest", "DEM-kmeans-plain"]
    pd.testing.assert_frame_equal(
        both[list(METRICS)].iloc[:2].reset_index(drop=True),
        plain[list(METRICS)].reset_index(drop=True),
    )  # the methods' own rows are those of a run without ablations
    pd.testing.assert_frame_equal(
        both[list(METRICS)].iloc[2:].reset_index(drop=True),
        alone[list(METRICS)].reset_index(drop=True),
    )  # the ablation's row is that of the ablation run alone
    assert both.iloc[2]["rounds"] >= 1  # fitted on clients, as DEM-kmeans
