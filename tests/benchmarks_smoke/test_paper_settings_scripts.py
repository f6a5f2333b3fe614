"""The paper benchmarks' named settings, ``--device`` and ``--paper-scale`` presets
(``benchmarks/fedgengmm_paper.py``, ``fedcam_table1.py``, ``vgm2_table1.py``): what each
setting and scale passes on, the FedGenGMM paper's test sets checked against independent
computations (scikit-learn's PCA, numpy's image operations), and quick runs whose reports
name the setting, scale and device."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.decomposition import PCA

from fednovelty.datasets import load_mnist, scale_images
from fednovelty.datasets import protocols as protocols_module
from fednovelty.datasets.protocols import make_task
from fednovelty.detectors.options import Privacy
from fednovelty.evaluation.ablations import ABLATIONS, resolve_method
from fednovelty.methods import METHODS


# ----------------------------------------------------------------------------- FedGenGMM
def test_thin_novel_keeps_every_inlier_and_a_tenth_of_novel_rows(benchmark_script):
    script = benchmark_script("fedgengmm_paper")
    task = make_task("digits", n_clients=3, alpha=1.0, seed=0)  # digit 0 novel: ~27 %
    thin = script.thin_novel(task, 0.1, np.random.default_rng(0))
    inliers, novel = task.y_test == 0, task.y_test == 1
    n_in = int(inliers.sum())
    assert int((thin.y_test == 0).sum()) == n_in
    assert int((thin.y_test == 1).sum()) == round(n_in * 0.1 / 0.9)
    np.testing.assert_array_equal(thin.X_test[thin.y_test == 0], task.X_test[inliers])
    kept = thin.test_index[thin.y_test == 1]
    assert set(kept.tolist()) <= set(task.test_index[novel].tolist())
    for row, source in zip(thin.X_test[thin.y_test == 1], kept, strict=True):
        np.testing.assert_array_equal(row, task.X_test[task.test_index == source][0])
    assert script.thin_novel(thin, 0.5, np.random.default_rng(0)) is thin  # already below


def test_paper_mnist_ood_matches_sklearn_pca_of_hand_transformed_digits(benchmark_script):
    """Novel rows: rotate 90 degrees counter-clockwise (np.rot90), flip left-right, zoom by
    1.2, then the task's 24 principal axes (here scikit-learn's SVD PCA, signs matched to the
    task's features) and min-max scaling; the inlier rows stay as they were."""
    script = benchmark_script("fedgengmm_paper")
    task = make_task("mnist", n_clients=4, alpha=0.5, seed=3, max_train=1500, max_test=300)
    paper = script.paper_mnist_ood(task)
    np.testing.assert_array_equal(paper.X_test[task.y_test == 0], task.X_test[task.y_test == 0])
    mnist = load_mnist()
    pixels = mnist["x_train"][task.train_index].reshape(-1, 784) / 255.0
    pca = PCA(n_components=task.n_features, svd_solver="full").fit(pixels)
    signs = np.sign(np.sum(pca.transform(pixels) * (task.X_train - task.X_train.mean(0)), 0))
    novel = task.y_test == 1
    images = mnist["x_test"][task.test_index[novel]]
    turned = np.ascontiguousarray(np.rot90(images, k=1, axes=(1, 2))[:, :, ::-1])
    zoomed = scale_images(turned, 1.2).reshape(-1, 784) / 255.0
    expected = task.scaling.transform(pca.transform(zoomed) * signs)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(paper.X_test[novel], expected, rtol=1e-6, atol=1e-6 * scale)
    assert np.abs(paper.X_test[novel] - task.X_test[novel]).max() > 0.1  # another OOD set


def test_paper_tasks_and_detectors_on_are_undone_on_exit(benchmark_script):
    script = benchmark_script("fedgengmm_paper")
    original, method = protocols_module.make_task, METHODS["FedGenGMM"]
    with script.paper_tasks(script.SETTINGS["paper"]):
        task = protocols_module.make_task("digits", n_clients=3, alpha=1.0, seed=0)
        assert task.y_test.mean() == pytest.approx(0.1, abs=0.01)
    assert script.ablation_names(["FedGenGMM"], [script.ABLATION]) == ["FedGenGMM-plain"]
    with script.detectors_on(["FedGenGMM", "CentralGMM"], "cpu", privacy=Privacy(min_rows=1)):
        # the runner builds the plain ablations from the methods the script changed
        plain = resolve_method("FedGenGMM-plain")
        params = plain.build(n_components=2).get_params()
        assert (params["device"], params["privacy__min_rows"]) == ("cpu", 1)
        assert {k: params[k] for k in ABLATIONS["plain"]} == ABLATIONS["plain"]
        central = resolve_method("CentralGMM-plain").build(n_components=2).get_params()
        assert central["device"] == "cpu"  # built: its fixed privacy not passed
    assert protocols_module.make_task is original and METHODS["FedGenGMM"] is method
    assert resolve_method("FedGenGMM-plain").build().get_params()["privacy"] is None
    with script.paper_tasks(script.SETTINGS["ours"]):
        assert protocols_module.make_task is original  # ours: make_task's own tasks
    with pytest.raises(ValueError, match="device must be one of"):
        with script.detectors_on(["FedGenGMM"], "tpu"):
            pass


def test_fedgengmm_settings_and_scales(benchmark_script):
    script = benchmark_script("fedgengmm_paper")
    paper, ours = script.SETTINGS["paper"], script.SETTINGS["ours"]
    assert (paper.covariance_type, paper.novel_share, paper.paper_mnist_ood) == ("diag", 0.1, True)
    assert (paper.k_of("10_cover:noise"), paper.k_of("mnist")) == (15, 30)
    assert paper.detector_params == {"privacy": Privacy(min_rows=1)} and not ours.detector_params
    assert (ours.covariance_type, ours.novel_share, ours.k_of("10_cover:noise")) == (
        "full",
        None,
        10,
    )
    args = script.parse_args(["--paper-scale", "--setting", "paper"])
    assert args.scale == "paper" and script.SCALES["paper"].caps == {
        "max_train": None,
        "max_test": None,
    }
    assert script.default_out("paper", "paper").name == "fedgengmm_paper_paper_scale"
    assert script.default_out("ours", "cpu").name == "fedgengmm"
    with pytest.raises(SystemExit):
        script.parse_args(["--quick", "--paper-scale"])


def test_fedgengmm_paper_setting_quick_run(benchmark_script, tmp_path):
    script = benchmark_script("fedgengmm_paper")
    argv = ["--quick", "--setting", "paper", "--device", "cpu", "--datasets", "4_breastw"]
    argv += ["--experiment", "alpha", "--out", str(tmp_path), "--no-progress"]
    assert script.main(argv) == 0
    report = (tmp_path / "report.md").read_text()
    assert "- device: cpu" in report and "- setting: paper (" in report
    assert "- scale: quick:" in report and "- date: " in report and "total runtime" in report
    cells = pd.read_csv(tmp_path / "alpha.csv")
    assert set(cells["covariance_type"]) == {"diag"}
    shares = cells["novel_share"].dropna()
    assert len(shares) and np.allclose(shares, 0.1, atol=0.01)


# ----------------------------------------------------------------------------- Fed-CAM
def test_fedcam_paper_setting_turns_eq6_on_for_ifca_cam_only(benchmark_script):
    script = benchmark_script("fedcam_table1")
    paper = script.build_settings(script.parse_args([]))  # the default setting is the paper's
    ours = script.build_settings(script.parse_args(["--setting", "ours"]))
    assert paper.setting == "paper"
    for method in script.METHODS:
        want = "global" if method == "IFCA-CAM" else "cluster"
        assert paper.model_params(method, 10, 0)["cluster_average"] == want
        assert ours.model_params(method, 10, 0)["cluster_average"] == "cluster"
        assert paper.model_params(method, 10, 0)["device"] == "cpu"


def test_fedcam_paper_scale_is_the_papers_section_5(benchmark_script):
    script = benchmark_script("fedcam_table1")
    settings = script.build_settings(script.parse_args(["--paper-scale"]))
    assert (settings.n_clients, settings.rounds, settings.warmup, settings.rows) == (
        200,
        100,
        30,
        70000,
    )
    assert (settings.learner, settings.learning_rate, settings.ks) == ("cnn", 0.001, (5, 10))
    assert settings.partitions == {"mnist": tuple(script.PARTITIONS)}
    params = settings.model_params("IFCA-CAM", 10, 0)
    training = params["training"]
    assert (params["learner"], params["warmup_rounds"], training.local_steps) == ("cnn", 30, 10)
    mine = script.build_settings(script.parse_args(["--paper-scale", "--rounds", "10"]))
    assert mine.rounds == 10 and mine.n_clients == 200  # an explicit flag wins


def test_fedcam_quick_run_names_setting_and_device(benchmark_script, tmp_path):
    script = benchmark_script("fedcam_table1")
    argv = ["--quick", "--setting", "paper", "--device", "cpu", "--methods", "IFCA", "IFCA-CAM"]
    report = script.main([*argv, "--out-dir", str(tmp_path)])
    assert "- setting: paper (" in report and "- device: cpu" in report
    assert "- scale: quick" in report and "- date: " in report and "total runtime" in report
    # per cluster-wise setting: IFCA-CAM > IFCA, IFCA collapses, IFCA-CAM near the truth
    assert report.count("PASS") + report.count("FAIL") == 6
    records = json.loads((tmp_path / "fedcam_table1.json").read_text())
    assert {r["method"] for r in records} == {"IFCA", "IFCA-CAM"}
    assert {r["setting"] for r in records} == {"paper"}
    args = script.parse_args(["--quick", "--methods", "IFCA", "IFCA-CAM"])
    assert set(script.load_finished(tmp_path, script.build_settings(args))) == {
        ("mnist", "cluster-dir", 4),
        ("mnist", "cluster-nclass", 4),
    }
    args = script.parse_args(["--quick", "--setting", "ours", "--methods", "IFCA", "IFCA-CAM"])
    assert script.load_finished(tmp_path, script.build_settings(args)) == {}


# ----------------------------------------------------------------------------- VGM2
def test_vgm2_paper_scale_holds_the_papers_2000_rows_per_client(benchmark_script):
    script = benchmark_script("vgm2_table1")
    args = script.parse_args(["--paper-scale"])
    assert (args.max_rows, args.scale, args.out_dir.name) == (2000, "paper", "vgm2_paper_scale")
    assert (args.clients, args.rounds, args.per_round, args.epochs, args.seeds) == (
        30,
        100,
        2,
        8,
        3,
    )
    split = script.mnist_shards(args.clients, args.max_rows, seed=0)
    assert [len(y) for _, y in split.train] == [1600] * 30  # 2 shards of 1,000 rows, a fifth tested
    assert [len(y) for _, y in split.test] == [400] * 30
    assert script.parse_args([]).max_rows == 200


def test_vgm2_quick_run_names_the_device(benchmark_script, tmp_path):
    script = benchmark_script("vgm2_table1")
    argv = ["--quick", "--device", "cpu", "--datasets", "mnist", "--variants", "Local", "VGM2"]
    report = script.main([*argv, "--out-dir", str(tmp_path)])
    assert "- device: cpu" in report and "- scale: quick" in report
    assert "- date: " in report and "total runtime" in report
    assert "| VGM2 |" in report and "| 0.909 |" in report  # the paper's number beside ours
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            script.parse_args(["--device", "cuda"])
