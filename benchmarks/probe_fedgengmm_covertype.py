"""Research probe: why FedGenGMM trails CentralGMM on Covertype at the paper's setting.

Builds the paper-setting Covertype task of ``benchmarks.fedgengmm_paper`` (full rows, seed 0,
20 clients, alphas 0.1 and 1, K = K_c = 15, diagonal covariances, the ``plain`` ablation,
no privacy floor) exactly as ``_bench`` does, and reports AUC-PR (novel = positive) and the
mean log-likelihood per row (real training rows, synthetic rows, test inliers, novel test
rows) of: CentralGMM; FedGenGMM's server model; the size-weighted union of the clients'
local fits (what the server samples from); server refits of that union with full
covariances (H = 100) and with H = 1000 (diagonal); CentralGMM with full covariances; and
the smallest per-feature variance of each model.

Run: ``python -m benchmarks.probe_fedgengmm_covertype`` (one torch thread).
"""

from __future__ import annotations

import time

import numpy as np
import torch

import fednovelty.federated.mixtures.fedgengmm as fedgen_module
from benchmarks.fedgengmm_paper import ABLATION, SETTINGS, detectors_on, paper_task
from fednovelty.datasets.protocols import make_task
from fednovelty.evaluation.ablations import resolve_method
from fednovelty.evaluation.metrics import aupr_out
from fednovelty.federated.core.aggregate import union_mixture
from fednovelty.mixture import fit_gmm_scaled, sample, score_samples

DATASET = "10_cover:noise"
SEED = 0
ALPHAS = (0.1, 1.0)


def build(name: str, setting, k: int, covariance_type: str, client_k: int | None):
    method = resolve_method(f"{name}-{ABLATION}")
    shared = {
        "n_components": k,
        "client_components": client_k,
        "covariance_type": covariance_type,
        "random_state": SEED,
    }
    return method.build(**method.shared_params(**shared))


def report(label, scores_test, y_test, ll_train, ll_synth, params, seconds):
    """One line: AUC-PR, mean log-likelihood per row (real training rows, synthetic rows,
    test inliers, novel test rows), the smallest variance, the fit time."""
    variances = params.covariances
    if variances.dim() == 3:
        variances = torch.diagonal(variances, dim1=-2, dim2=-1)
    min_var = variances.min(dim=0).values.cpu().numpy()
    print(
        f"  {label:38s} AUC-PR {aupr_out(y_test, scores_test):.4f}  "
        f"train ll/row {ll_train:8.3f}  synth ll/row {ll_synth:8.3f}  "
        f"test inlier {-scores_test[y_test == 0].mean():8.3f}  "
        f"novel {-scores_test[y_test == 1].mean():8.3f}  "
        f"min var {min_var.min():.2e} (median over features {np.median(min_var):.2e})  "
        f"{seconds:5.1f} s",
        flush=True,
    )


def main() -> None:
    torch.set_num_threads(1)
    setting = SETTINGS["paper"]
    k = setting.k_of(DATASET)
    captured: dict = {}
    original = fedgen_module.reduce_union

    def capture(models, sizes, candidates, samples_per_component, settings):
        result, bics, synthetic = original(
            models, sizes, candidates, samples_per_component, settings
        )
        captured.update(models=models, sizes=sizes, synthetic=synthetic, result=result)
        captured["settings"] = {k: v for k, v in settings.items() if k != "generator"}
        return result, bics, synthetic

    fedgen_module.reduce_union = capture
    names = ["FedGenGMM", "CentralGMM"]
    try:
        with detectors_on(names, "cpu", **setting.detector_params):
            for alpha in ALPHAS:
                started = time.perf_counter()
                task = make_task(
                    DATASET, "novelty", n_clients=20, alpha=alpha, partition="dirichlet",
                    seed=SEED, max_train=None, max_test=None, min_size=None,
                )  # fmt: skip
                task = paper_task(task, setting)
                X_train = torch.as_tensor(task.X_train, dtype=torch.float64)
                X_test = torch.as_tensor(task.X_test, dtype=torch.float64)
                y = task.y_test
                print(
                    f"alpha={alpha}: train {X_train.shape}, test {X_test.shape}, novel "
                    f"{y.mean():.3f}, task {time.perf_counter() - started:.1f} s",
                    flush=True,
                )
                fits = {}
                for label, name, cov, client_k in [
                    ("(a) CentralGMM diag", "CentralGMM", "diag", None),
                    ("(b) FedGenGMM server (diag, H=100)", "FedGenGMM", "diag", k),
                    ("(e) CentralGMM full", "CentralGMM", "full", None),
                ]:
                    det = build(name, setting, k, cov, client_k)
                    t0 = time.perf_counter()
                    if name == "FedGenGMM":
                        det.fit(task.X_train, groups=task.groups_train)
                    else:
                        det.fit(task.X_train)
                    assert getattr(det, "pca_", None) is None, "PCA front end engaged"
                    fits[label] = (det.model_, time.perf_counter() - t0, det)
                synthetic = captured["synthetic"]
                union = union_mixture(captured["models"], captured["sizes"])
                fits["(c) clients' union (300 comps)"] = (union, 0.0, None)
                base = captured["settings"]
                for label, cov, h in [
                    ("(d1) server refit full, H=100", "full", 100),
                    ("(d2) server refit diag, H=1000", "diag", 1000),
                ]:
                    t0 = time.perf_counter()
                    gen = torch.Generator().manual_seed(12345)
                    rows = synthetic
                    if h != 100:
                        rows, _ = sample(union, h * union.n_components, generator=gen)
                    result, _ = fit_gmm_scaled(
                        rows, [k], **{**base, "covariance_type": cov, "generator": gen}
                    )
                    fits[label] = (result.params, time.perf_counter() - t0, None)
                print(
                    f"  server fit: {synthetic.shape[0]} synthetic rows, converged "
                    f"{captured['result'].converged} after {captured['result'].n_iter} iters; "
                    f"settings {captured['settings']}",
                    flush=True,
                )
                for label, (params, seconds, det) in fits.items():
                    if det is not None:
                        scores = det.decision_function(task.X_test)
                        ll_train = float(det.score_samples(task.X_train).mean())
                    else:
                        scores = -score_samples(params, X_test).numpy()
                        ll_train = float(score_samples(params, X_train).mean())
                    ll_synth = float(score_samples(params, synthetic).mean())
                    report(label, scores, y, ll_train, ll_synth, params, seconds)
    finally:
        fedgen_module.reduce_union = original


if __name__ == "__main__":
    main()
