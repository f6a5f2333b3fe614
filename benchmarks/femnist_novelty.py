"""Novelty detection on real federated clients: FEMNIST writers.

Run ``python -m benchmarks.femnist_novelty`` (100 writers, seeds 0 1 2, about 15 minutes on
2 cores) or ``--quick`` (a smoke run: 8 writers, one seed, a few methods). ``--writers N``,
``--seeds``, ``--out FILE`` (the markdown report), ``--figure FILE`` (the per-writer figure).

Data: ``make_task("femnist:<ood>", n_clients=N, seed=s)``: the first N writers of a seeded
choice are the clients and train on their training images (60 % of each writer's images);
their test images (20 %) are halved into inliers and novel images. Features: the task's
default ``"polar"`` map (each image's direction on 24 federated principal axes plus the log
of its L2 norm), the same for every method; ``--pixels`` adds rows on the MNIST features
(pixels / 255 on 24 axes) for FedGMM and the centralized mixture.

1. Covariate novelty, pooled: the mixture methods of the registry (K = 10, each with its
   defaults; ``-plain`` = the ``plain`` ablation (:mod:`fednovelty.evaluation.ablations`):
   maximum likelihood without standardisation or covariance prior;
   ``FedVB`` with its own defaults: at most 20 components, the prior choosing how many)
   and PyOD's detectors on the pooled rows (the centralized references), AUROC / AUPR-out
   over all test rows. Two novel sets: ``inv-flip-rot``, the FedGMM paper's transform ``T``
   (Appendix C.3's out-of-domain images: inversion, horizontal flip, 90-degree rotation)
   and ``transforms``, its main text's (scale 0.5, rotation, flip, one per novel image),
   broken down by transform for the mixtures.
2. Per writer: FedGMM's AUROC on each writer's own test rows, scored with the global weights
   and with that writer's personal weights (mean and quartiles over writers).
3. Label novelty: ``JointFedGMMDetector`` (FedGMM, 10 Gaussians on 24 federated principal
   axes of the pixels, 2 linear learners on the pixels, 15 rounds of 5 local epochs of SGD
   at learning rate 0.5: FedAvg's validation accuracy 53 % on seed 0, against 38 % with 1
   epoch at 0.1 and 52 % with 2 epochs of Adam at 0.01; nothing else was tried) and
   FedAvg, trained on the writers' labelled training images; test rows are the writers'
   test images, half with their true label and half with the label moved by one random
   permutation of the 62 classes (rows it maps to themselves count as inliers). Scores:
   ``-log p(y|x)``, ``-log p(x)``, ``-log p(x, y)`` and FedAvg's ``-log p(y|x)``.
4. Unseen writers: FedGMM trained on a seeded 80 % of the writers; features from the seen
   writers only (their summed statistics, as ``make_task`` does). Each unseen writer's
   training images are its unlabelled adaptation rows (the first 5, 20 or 50, capped at
   what it has); its test rows (inliers and ``transforms`` novel images) are scored with the
   global weights and with adapted weights: ``FedGMMDetector.adapt``'s maximum-likelihood
   EM (the FedGMM paper's) and MAP EM under a Dirichlet prior of K pseudo-rows centred on
   the global weights (``mixture.em.fit_weights_map``, ``JointFedGMMDetector.adapt``'s
   default). Mean per-writer AUROC per seed; target: adapted never below global.
5. What the robust defaults cost on the ``transforms`` set: the centralized mixture
   (``fit_gmm_scaled``: the model federated EM with global weights fits exactly) on the
   same rows, varying one setting at a time: standardisation and the covariance prior
   (``n_features + 2`` pseudo-rows at 4 x each feature's variance), the prior's strength and
   scale, and K, beside KNN; and the smallest eigenvalues of the plain mixture's
   covariances (z-score units) against what the prior adds to each variance.

Targets: FedGMM ``log p(x)`` AUROC >= 99 % on transformed FEMNIST and within
0.5 points of the centralized mixture on the same features.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from benchmarks.common import (
    Experiment,
    PaperTables,
    add_out,
    add_quick,
    add_seeds,
    add_threads,
    check,
    command_line,
    markdown_table,
    mean_std,
    quick_seeds,
    run_paper_tables,
    with_options,
)
from fednovelty.datasets.femnist import make_femnist_federated, split_writers
from fednovelty.datasets.protocols import make_task, polar_rows
from fednovelty.datasets.shifts import transform_images
from fednovelty.detectors._em_detector import AdaptedClient
from fednovelty.detectors.fedgmm import FedGMMDetector
from fednovelty.detectors.joint_fedgmm import JointFedGMMDetector
from fednovelty.evaluation.ablations import resolve_method
from fednovelty.evaluation.metrics import evaluate
from fednovelty.methods import METHODS
from fednovelty.mixture import fit_gmm_scaled, score_samples
from fednovelty.mixture.em import fit_weights_map

MIXTURES = (
    "FedGMM",
    "FedGMM-plain",
    "DEM-kmeans",
    "FedGenGMM",
    "Local",
    "CentralGMM",
    "CentralGMM-plain",
    "FedVB",
)
PYOD = ("IForest", "ECOD", "HBOS", "KNN", "LOF", "PCA")
OOD_SETS = ("inv-flip-rot", "transforms")
CYCLE = ("scale", "rotate", "hflip")  # the order make_task cycles the novel rows through
ADAPT_ROWS = (5, 20, 50)
N_COMPONENTS = 10
TARGET_AUROC = 99.0
TARGET_GAP = 0.5


@dataclass(frozen=True)
class Settings:
    n_writers: int
    seeds: tuple[int, ...]
    methods: tuple[str, ...]
    joint_rounds: int
    pixels: bool
    ablation: bool = True


def auroc(y: np.ndarray, scores: np.ndarray) -> float:
    return 100.0 * float(roc_auc_score(y, scores))


def fit_method(name: str, X: np.ndarray, groups: np.ndarray, seed: int):
    method = resolve_method(name)
    detector = method.build(
        **method.shared_params(
            n_components=N_COMPONENTS,
            client_components=None,
            covariance_type="full",
            random_state=seed,
        )
    )
    if method.fits_clients:
        return detector.fit(X, groups=groups)
    return detector.fit(X)


def cycle_labels(y_test: np.ndarray) -> np.ndarray:
    """Which transform made each novel row of a ``transforms`` task ('' for inliers)."""
    names = np.full(y_test.shape[0], "", dtype=object)
    novel = np.flatnonzero(y_test == 1)
    for j, name in enumerate(CYCLE):
        names[novel[j :: len(CYCLE)]] = name
    return names


def by_transform(y_test: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """AUROC of the inliers against the novel rows of one transform, per transform."""
    names = cycle_labels(y_test)
    return {
        name: auroc(
            y_test[(names == name) | (y_test == 0)], scores[(names == name) | (y_test == 0)]
        )
        for name in CYCLE
    }


def per_writer(y: np.ndarray, scores: np.ndarray, writers: np.ndarray) -> list[float]:
    """AUROC on each writer's rows (writers whose rows hold both classes)."""
    out = []
    for w in np.unique(writers):
        rows = writers == w
        if 0 < y[rows].sum() < rows.sum():
            out.append(auroc(y[rows], scores[rows]))
    return out


# ----------------------------------------------------------------------------- 1 and 2
def pooled_tasks(settings: Settings, seed: int):
    """Section 1's tasks of a seed, made one at a time: ``(ood, feature map, task)`` per
    novel set and feature map (``"polar"``, and ``"pixels"`` under ``--pixels``)."""
    for ood in OOD_SETS:
        feature_maps = [("polar", None)] + ([("pixels", "pixels")] if settings.pixels else [])
        for label, image_features in feature_maps:
            task = make_task(
                f"femnist:{ood}",
                n_clients=settings.n_writers,
                alpha=None,
                seed=seed,
                image_features=image_features,
            )
            yield ood, label, task


def run_pooled(tasks, settings: Settings, seed: int) -> dict:
    """Section 1 and 2 for one seed on its ``tasks`` (:func:`pooled_tasks`):
    {(ood, method): metrics}, per-writer lists."""
    out: dict = {"pooled": {}, "transforms": {}, "writers": {}}
    for ood, label, task in tasks:
        names = settings.methods if label == "polar" else ("FedGMM", "CentralGMM")
        for name in names:
            started = time.perf_counter()
            det = fit_method(name, task.X_train, task.groups_train, seed)
            scores = np.asarray(det.decision_function(task.X_test), dtype=np.float64)
            metrics = evaluate(task.y_test, scores)
            key = (ood, name if label == "polar" else f"{name} (pixels)")
            out["pooled"][key] = {
                "auroc": 100 * metrics["auroc"],
                "aupr_out": 100 * metrics["aupr_out"],
                "seconds": time.perf_counter() - started,
            }
            if ood == "transforms" and name in MIXTURES:
                out["transforms"][key] = by_transform(task.y_test, scores)
            if ood == "transforms" and name == "FedGMM" and label == "polar":
                if settings.ablation:
                    out["ablation"] = run_ablation(task, seed)
            if name == "FedGMM" and label == "polar":
                own = np.empty_like(scores)
                for w in np.unique(task.groups_test):
                    rows = task.groups_test == w
                    own[rows] = det.decision_function(task.X_test[rows], client=int(w))
                out["writers"][ood] = {
                    "global": per_writer(task.y_test, scores, task.groups_test),
                    "personal": per_writer(task.y_test, own, task.groups_test),
                }
            print(
                f"  seed {seed} {ood:13s} {key[1]:20s} AUROC {out['pooled'][key]['auroc']:6.2f}",
                flush=True,
            )
    return out


def pooled_report(per_seed: list[dict], settings: Settings) -> str:
    keys = list(per_seed[0]["pooled"])
    methods = list(dict.fromkeys(k[1] for k in keys))
    rows = []
    for name in methods:
        row = [name, resolve_method(name.split(" ")[0]).kind]
        for ood in OOD_SETS:
            vals = [s["pooled"][(ood, name)]["auroc"] for s in per_seed]
            pr = [s["pooled"][(ood, name)]["aupr_out"] for s in per_seed]
            row += [mean_std(vals, 2), mean_std(pr, 2)]
        row.append(mean_std([s["pooled"][("transforms", name)]["seconds"] for s in per_seed]))
        rows.append(row)
    header = ["method", "kind"]
    for ood in OOD_SETS:
        header += [f"{ood} AUROC %", f"{ood} AUPR-out %"]
    header.append("fit+score s")
    trans_rows = [
        [name] + [mean_std([s["transforms"][k][t] for s in per_seed], 2) for t in CYCLE]
        for k in per_seed[0]["transforms"]
        for name in [k[1]]
    ]

    def mean_of(ood: str, name: str) -> float:
        return float(np.mean([s["pooled"][(ood, name)]["auroc"] for s in per_seed]))

    checks = []
    for ood in OOD_SETS:
        fed = mean_of(ood, "FedGMM")
        checks.append(
            check(f"{ood}: FedGMM AUROC >= {TARGET_AUROC:.0f} % ({fed:.2f} %)", fed >= TARGET_AUROC)
        )
        for suffix in ("", "-plain"):
            if f"FedGMM{suffix}" not in methods or f"CentralGMM{suffix}" not in methods:
                continue
            fed, central = mean_of(ood, f"FedGMM{suffix}"), mean_of(ood, f"CentralGMM{suffix}")
            checks.append(
                check(
                    f"{ood}: FedGMM{suffix} within {TARGET_GAP} points of CentralGMM{suffix} "
                    f"({fed:.2f} vs {central:.2f})",
                    central - fed <= TARGET_GAP,
                )
            )
    lines = [
        f"## 1. Covariate novelty, pooled ({settings.n_writers} writers, seeds "
        f"{list(settings.seeds)}, K = {N_COMPONENTS})",
        "",
        markdown_table(header, rows),
        "",
        "By transform (`transforms` set: AUROC % of the inliers against one transform's "
        "novel rows):",
        "",
        markdown_table(["method", *CYCLE], trans_rows),
        "",
        *checks,
    ]
    writer_rows = []
    for ood in OOD_SETS:
        for kind in ("global", "personal"):
            vals = np.concatenate([s["writers"][ood][kind] for s in per_seed])
            q1, med, q3 = np.percentile(vals, [25, 50, 75])
            writer_rows.append(
                [
                    ood,
                    kind,
                    f"{vals.mean():.2f}",
                    f"{q1:.1f} / {med:.1f} / {q3:.1f}",
                    str(vals.size),
                ]
            )
    lines += [
        "",
        "## 2. Per writer (FedGMM, AUROC on each writer's own test rows, all seeds pooled)",
        "",
        markdown_table(
            ["novel set", "weights", "mean AUROC %", "quartiles", "writer-seeds"], writer_rows
        ),
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- 5
#: (label, standardize, prior strength ("d+2", a number or None), prior scale, K)
ABLATION = (
    ("plain (maximum likelihood, raw features)", False, None, 4.0, 10),
    ("standardised only", True, None, 4.0, 10),
    ("prior only (raw features)", False, "d+2", 4.0, 10),
    ("standardised + prior (the defaults)", True, "d+2", 4.0, 10),
    ("defaults, prior strength 1 pseudo-row", True, 1.0, 4.0, 10),
    ("defaults, prior strength 100 pseudo-rows", True, 100.0, 4.0, 10),
    ("defaults, prior scale 1", True, "d+2", 1.0, 10),
    ("defaults, prior scale 0.1", True, "d+2", 0.1, 10),
    ("plain, K = 5", False, None, 4.0, 5),
    ("plain, K = 20", False, None, 4.0, 20),
    ("plain, K = 40", False, None, 4.0, 40),
    ("standardised only, K = 40", True, None, 4.0, 40),
    ("defaults, K = 20", True, "d+2", 4.0, 20),
    ("defaults, K = 40", True, "d+2", 4.0, 40),
)


def run_ablation(task, seed: int) -> dict:
    """Section 5 for one seed: AUROC % of each ``ABLATION`` setting and KNN, and the
    eigenvalue diagnosis of the plain K = 10 mixture."""
    X = torch.as_tensor(task.X_train, dtype=torch.float64)
    X_test = torch.as_tensor(task.X_test, dtype=torch.float64)
    out: dict = {"auroc": {}}
    for label, standardize, strength, scale, k in ABLATION:
        result, _ = fit_gmm_scaled(
            X,
            [k],
            standardize=standardize,
            prior_strength=X.shape[1] + 2 if strength == "d+2" else strength,
            prior_scale=scale,
            generator=torch.Generator().manual_seed(seed),
        )
        scores = -score_samples(result.params, X_test).numpy()
        out["auroc"][label] = auroc(task.y_test, scores)
        if label.startswith("standardised only") and k == N_COMPONENTS:
            out["eigen"] = prior_inflation(result.params, X)
    knn = METHODS["KNN"].build(**METHODS["KNN"].shared_params(random_state=seed))
    knn.fit(task.X_train)
    out["auroc"]["KNN (reference)"] = auroc(task.y_test, knn.decision_function(task.X_test))
    print(f"  seed {seed} ablation " + ", ".join(f"{v:.1f}" for v in out["auroc"].values()))
    return out


def prior_inflation(params, X: torch.Tensor) -> list[tuple[float, float, float]]:
    """Per component of a mixture fitted on z-scores (n_features units of variance 1):
    (rows, smallest covariance eigenvalue, what the default prior adds to every variance,
    ``(d + 2) / (n_k + d + 2) * 4``), components by rows."""
    d, n = X.shape[1], X.shape[0]
    std = X.std(dim=0)
    out = []
    for k in range(params.means.shape[0]):
        cov = params.covariances[k] / torch.outer(std, std)  # the z-score covariance
        n_k = float(params.weights[k]) * n
        smallest = float(torch.linalg.eigvalsh(cov)[0])
        out.append((n_k, smallest, (d + 2) / (n_k + d + 2) * 4.0))
    return sorted(out)


def ablation_report(per_seed: list[dict], settings: Settings) -> str:
    seeds = [s["ablation"] for s in per_seed if "ablation" in s]
    if not seeds:
        return ""
    rows = [[label, mean_std([s["auroc"][label] for s in seeds], 2)] for label in seeds[0]["auroc"]]
    eigen = seeds[0]["eigen"]
    eigen_rows = [
        [f"{n_k:.0f}", f"{low:.4f}", f"{add:.4f}", f"{(low + add) / low:.1f}"]
        for n_k, low, add in eigen
    ]
    return "\n".join(
        [
            "## 5. What the robust defaults cost on the `transforms` set (centralized mixture, "
            f"same rows; K = {N_COMPONENTS} unless named)",
            "",
            markdown_table(["setting", "AUROC %"], rows),
            "",
            "Standardised K = 10 mixture without prior, seed "
            f"{settings.seeds[0]}: each component's rows, smallest covariance "
            "eigenvalue (z-score units), what the default prior adds to every variance, and the "
            "factor by which that multiplies the smallest eigenvalue:",
            "",
            markdown_table(
                ["rows n_k", "smallest eigenvalue", "prior adds", "smallest x"], eigen_rows
            ),
        ]
    )


# ----------------------------------------------------------------------------- 3
def run_labels(data, settings: Settings, seed: int) -> dict[str, float]:
    """Section 3 for one seed on its writers ``data``: AUROC per score on true vs permuted
    labels."""
    rng = np.random.default_rng(seed)
    y_test = data.y_test.copy()
    moved = rng.permutation(y_test.size) < y_test.size // 2
    mapping = np.arange(int(data.classes.max()) + 1)
    mapping[data.classes] = data.classes[rng.permutation(data.classes.size)]
    y_test[moved] = mapping[y_test[moved]]
    novel = (y_test != data.y_test).astype(np.int64)
    params = {
        "n_components": N_COMPONENTS,
        "n_learners": 2,
        "pca_components": 24,
        "max_iter": settings.joint_rounds,
        "tol": 0.0,
        "local_epochs": 5,
        "learning_rate": 0.5,
        "random_state": seed,
        "dtype": "float32",
    }
    out = {}
    fedgmm = JointFedGMMDetector(**with_options(params)).fit(
        data.X_train, data.y_train, data.groups_train
    )
    for score, label in (("py|x", "FedGMM -log p(y \\| x)"), ("px", "FedGMM -log p(x)")):
        scores = fedgmm.decision_function(data.X_test, y_test, score=score)
        out[label] = auroc(novel, scores)
    out["FedGMM -log p(x, y)"] = auroc(
        novel, fedgmm.decision_function(data.X_test, y_test, score="pxy")
    )
    out["FedGMM accuracy (true labels)"] = 100 * float(
        np.mean(fedgmm.predict_y(data.X_test) == data.y_test)
    )
    fedavg = JointFedGMMDetector.pfl_baseline("FedAvg", **with_options(params))
    fedavg.fit(data.X_train, data.y_train, data.groups_train)
    out["FedAvg -log p(y \\| x)"] = auroc(
        novel, fedavg.decision_function(data.X_test, y_test, score="py|x")
    )
    out["FedAvg accuracy (true labels)"] = 100 * float(
        np.mean(fedavg.predict_y(data.X_test) == data.y_test)
    )
    print(f"  seed {seed} labels " + ", ".join(f"{k} {v:.1f}" for k, v in out.items()), flush=True)
    return out


def labels_report(per_seed: list[dict[str, float]], settings: Settings) -> str:
    rows = [[k, mean_std([s[k] for s in per_seed], 2)] for k in per_seed[0]]
    return "\n".join(
        [
            f"## 3. Label novelty ({settings.n_writers} writers, {settings.joint_rounds} rounds; "
            "AUROC % of permuted labels against true ones)",
            "",
            markdown_table(["score", "%"], rows),
        ]
    )


# ----------------------------------------------------------------------------- 4
def polar_features(seen_images: list[np.ndarray], n_axes: int = 24):
    """A feature map ``images -> (n, n_axes + 1)`` from the seen writers' images: the
    direction's principal axes (from the writers' summed rows and scatter) and the log norm."""
    units = [polar_rows(im.reshape(im.shape[0], -1) / 255.0)[0] for im in seen_images]
    n = sum(u.shape[0] for u in units)
    mean = sum(u.sum(axis=0) for u in units) / n
    scatter = sum((u - mean).T @ (u - mean) for u in units) / (n - 1)
    values, vectors = np.linalg.eigh(scatter)
    axes = vectors[:, np.argsort(values)[::-1][:n_axes]].T

    def transform(images: np.ndarray) -> np.ndarray:
        unit, log_norm = polar_rows(images.reshape(images.shape[0], -1) / 255.0)
        return np.c_[(unit - mean) @ axes.T, log_norm]

    return transform


def map_adapted(det: FedGMMDetector, rows: np.ndarray, prior_rows: float) -> AdaptedClient:
    """A new client's weights by MAP EM under a Dirichlet prior of ``prior_rows``
    pseudo-rows centred on ``det``'s global weights, every Gaussian frozen; a handle for
    ``client=``."""
    with np.errstate(divide="ignore"):
        log_g = torch.as_tensor(np.log(det.component_weights()))
    fit = fit_weights_map(torch.as_tensor(det.component_log_densities(rows)), log_g, prior_rows)
    return AdaptedClient(
        weights=fit.log_weights.exp().numpy(),
        trace=fit.trace.numpy(),
        mean_log_likelihoods=fit.mean_log_likelihoods.numpy(),
        n_samples=rows.shape[0],
        n_iter=fit.n_iter,
        converged=fit.converged,
        labelled=False,
        joint=False,
    )


def run_unseen(data, settings: Settings, seed: int) -> dict[str, list[float]]:
    """Section 4 for one seed on its writers ``data``: per unseen writer AUROC, global vs
    adapted weights."""
    seen, unseen = split_writers(data, unseen=0.2, random_state=seed)
    features = polar_features(
        [seen.images_train[seen.groups_train == c] for c in range(seen.n_writers)]
    )
    det = FedGMMDetector(N_COMPONENTS, random_state=seed).fit(
        features(seen.images_train), groups=seen.groups_train
    )
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {"global": []}
    for k in ADAPT_ROWS:
        out[f"adapt {k}"] = []  # FedGMMDetector.adapt: maximum likelihood
        out[f"adapt {k}, prior"] = []  # MAP under K pseudo-rows centred on the global weights
    for w in range(unseen.n_writers):
        images = unseen.images_test[unseen.groups_test == w]
        if images.shape[0] < 4:
            continue
        y = np.zeros(images.shape[0], dtype=np.int64)
        y[rng.permutation(y.size)[: y.size // 2]] = 1
        test = images.copy()
        novel = np.flatnonzero(y)
        for j, name in enumerate(CYCLE):
            test[novel[j :: len(CYCLE)]] = transform_images(test[novel[j :: len(CYCLE)]], name)
        X_test = features(test)
        out["global"].append(auroc(y, det.decision_function(X_test)))
        own = features(unseen.images_train[unseen.groups_train == w])
        for k in ADAPT_ROWS:
            rows = own[: min(k, own.shape[0])]
            ml, prior = f"adapt {k}", f"adapt {k}, prior"
            if rows.shape[0] < 2:
                out[ml].append(out["global"][-1])
                out[prior].append(out["global"][-1])
                continue
            handle = det.adapt(rows)
            out[ml].append(auroc(y, det.decision_function(X_test, client=handle)))
            handle = map_adapted(det, rows, float(N_COMPONENTS))
            out[prior].append(auroc(y, det.decision_function(X_test, client=handle)))
    print(
        f"  seed {seed} unseen " + ", ".join(f"{k} {np.mean(v):.2f}" for k, v in out.items()),
        flush=True,
    )
    return out


def unseen_report(per_seed: list[dict[str, list[float]]], settings: Settings) -> str:
    means = {k: [float(np.mean(s[k])) for s in per_seed] for k in per_seed[0]}
    rows = [
        [k, mean_std(v, 2), *(f"{m:.2f}" for m in v), str(len(per_seed[0][k]))]
        for k, v in means.items()
    ]
    header = ["weights", "AUROC %", *(f"seed {s}" for s in settings.seeds), "writers per seed"]
    lines = []
    for suffix, kind in (("", "maximum likelihood"), (", prior", "prior of K pseudo-rows")):
        gaps = [
            m - g
            for k in ADAPT_ROWS
            for m, g in zip(means[f"adapt {k}{suffix}"], means["global"], strict=True)
        ]
        lines.append(
            f"- adapted by {kind}: smallest gap to the global weights over {list(ADAPT_ROWS)} "
            f"rows and the seeds {min(gaps):+.2f} points (target: never below, >= 0)"
        )
    return "\n".join(
        [
            f"## 4. Unseen writers (FedGMM on 80 % of {settings.n_writers} writers; mean "
            "per-writer AUROC % on the unseen writers' test rows, `transforms` novel set)",
            "",
            markdown_table(header, rows),
            "",
            "`adapt k`: `FedGMMDetector.adapt` on the first k rows (maximum-likelihood EM over "
            "the weights); `adapt k, prior`: MAP EM under a Dirichlet prior of K pseudo-rows "
            "centred on the global weights (M-step `(counts + K g) / (n + K)`).",
            "",
            *lines,
        ]
    )


# ----------------------------------------------------------------------------- figure
def figure(per_seed: list[dict], path: Path) -> None:
    """Left: FedGMM's AUROC by transform on each feature map; right: per-writer AUROC on
    the ``transforms`` set with global and personal weights."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [k[1] for k in per_seed[0]["transforms"] if k[1].startswith("FedGMM")]
    names = [n for n in names if n in ("FedGMM", "FedGMM (pixels)", "FedGMM-plain")]
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        means = [
            np.mean([s["transforms"][("transforms", name)][t] for s in per_seed]) for t in CYCLE
        ]
        left.bar(np.arange(len(CYCLE)) + i * width, means, width, label=name)
    left.axhline(50, color="grey", lw=0.8, ls=":")
    left.set_xticks(np.arange(len(CYCLE)) + width * (len(names) - 1) / 2, CYCLE)
    left.set_ylabel("AUROC % (pooled test rows)")
    left.set_ylim(0, 100)
    left.set_title("FEMNIST novel images by transform")
    left.legend(loc="lower right", fontsize=8)
    data = [
        np.concatenate([s["writers"]["transforms"][kind] for s in per_seed])
        for kind in ("global", "personal")
    ]
    right.hist(data, bins=np.linspace(0, 100, 21), label=["global weights", "personal weights"])
    right.set_title("FedGMM per writer, novel = transforms")
    right.set_xlabel("AUROC % on one writer's test rows")
    right.set_ylabel("writers x seeds")
    right.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser)
    parser.add_argument("--writers", type=int, default=100)
    add_seeds(parser)
    parser.add_argument("--joint-rounds", type=int, default=15)
    parser.add_argument("--pixels", action="store_true", help="add the pixel-feature rows")
    add_threads(parser)
    add_out(parser)
    parser.add_argument("--figure", type=Path, default=None)
    return parser.parse_args(argv)


#: Sections 1-2 on the seed's tasks; 3 and 4 on the seed's writers; 5 (the ablation, run
#: inside section 1 on its ``transforms`` task) comes last, after the tables.
TABLES = PaperTables(
    title="Novelty on FEMNIST writers",
    data=lambda settings, seed: make_femnist_federated(settings.n_writers, random_state=seed),
    experiments=(
        Experiment("pooled", "Covariate novelty", run_pooled, pooled_report, data=pooled_tasks),
        Experiment("labels", "Label novelty", run_labels, labels_report),
        Experiment("unseen", "Unseen writers", run_unseen, unseen_report),
    ),
)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = quick_seeds(args.seeds, args.quick)
    if args.quick:
        settings = Settings(8, seeds, ("FedGMM", "CentralGMM", "IForest"), 2, False, ablation=False)
    else:
        settings = Settings(args.writers, seeds, MIXTURES + PYOD, args.joint_rounds, args.pixels)
    command = command_line("femnist_novelty", argv)

    def after(results):  # the figure, then section 5 (from section 1's seeds)
        if args.figure is not None:
            figure(results["pooled"], args.figure)
        return [ablation_report(results["pooled"], settings)] if settings.ablation else []

    return run_paper_tables(TABLES, settings, "all", command, args.quick, args.out, after=after)


if __name__ == "__main__":
    main()
