"""Clustered additive mixtures for novelty against FedGMM's personal
weights and FedGenGMM, on cluster-structured federations.

Run ``python -m benchmarks.clustered_mixtures`` (seeds 0 1 2) or ``--quick`` (a smoke run);
``--seeds``, ``--out FILE``, ``--figure FILE``.

1. **MVTec-AD** (ADBench's ResNet-18 embeddings of the 15 categories): each category's
   normal images are split 70 / 30 into training and test rows; its training rows go to
   ``clients_per_category`` clients (the category is the clients' true cluster). Every
   client is tested on its share of its category's test rows plus its share of the
   category's defect images (the novel rows). Mixtures on 16 federated principal axes.
   Reported: per-client AUROC (mean over clients; each client scored with its own weights
   where the method has them), the adjusted Rand index of the found clusters against the
   categories, and the client-level anomaly score: the model is refitted on 12 categories
   (12 clusters), and new clients - 20 test rows of a trained category (normal) or of one
   of the 3 held-out categories (rogue) - are scored with ``client_score``; AUROC with the
   rogue clients as positives.
2. **ADBench sets, cluster-wise partition**: each set's inliers (70 % for training) are
   grouped by k-means (4 groups, on min-max-scaled features), and
   ``cluster_dirichlet_partition(groups, 12 clients, 4 clusters, alpha=0.1,
   client_alpha=10)`` (the Fed-CAM paper's cluster-wise Dirichlet) gives each cluster of
   clients its own mix of groups. Every client is tested on the held-out inliers of its
   own groups mix (each test row goes to the client whose training share of its group is
   largest) plus all anomalies. Per-client AUROC, mean over clients.

Methods (K = total components alike): ``ClusteredGMM-IFCA`` and ``ClusteredGMM-FeSEM``
(K_g global + C x K_c cluster components), ``FedGMM`` (personal weights, K_g + C K_c
components), ``FedGenGMM`` (K_g + C K_c global components; no personal weights: the global
model scores every client).

Targets: per-client AUROC >= FedGMM personal weights and >= FedGenGMM (mean over
datasets), ARI >= 0.9 on MVTec categories, client-level anomaly AUROC >= 0.95.
"""

from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score, roc_auc_score

from benchmarks.common import (
    add_out,
    add_quick,
    add_seeds,
    add_threads,
    check,
    command_line,
    emit_report,
    markdown_table,
    mean_std,
    quick_seeds,
    report_header,
)
from fednovelty import ClusteredFedGMMDetector, FedGenGMMDetector, FedGMMDetector
from fednovelty.datasets import load_adbench
from fednovelty.datasets.partition import cluster_dirichlet_partition, kmeans_groups
from fednovelty.federated import FederatedPCA
from fednovelty.runtime import run_simulation

CATEGORIES = (
    "bottle", "cable", "capsule", "carpet", "grid", "hazelnut", "leather", "metal_nut",
    "pill", "screw", "tile", "toothbrush", "transistor", "wood", "zipper",
)  # fmt: skip
ADBENCH = (
    "4_breastw", "29_Pima", "12_fault", "22_magic.gamma", "7_Cardiotocography", "27_PageBlocks",
)  # fmt: skip
METHODS = ("ClusteredGMM-IFCA", "ClusteredGMM-FeSEM", "FedGMM", "FedGenGMM")


@dataclass(frozen=True)
class Settings:
    seeds: tuple[int, ...]
    categories: tuple[str, ...]
    clients_per_category: int
    datasets: tuple[str, ...]
    global_components: int = 4
    cluster_components: int = 2
    axes: int = 16


def make(name: str, n_clusters: int, settings: Settings, seed: int):
    k_g, k_c = settings.global_components, settings.cluster_components
    total = k_g + n_clusters * k_c
    common = {"random_state": seed}
    if name.startswith("ClusteredGMM"):
        assignment = "likelihood" if name.endswith("IFCA") else "summary"
        return ClusteredFedGMMDetector(
            k_g, n_clusters=n_clusters, cluster_components=k_c, assignment=assignment, **common
        )
    if name == "FedGMM":
        return FedGMMDetector(total, **common)
    return FedGenGMMDetector(total, **common)


def client_scores(det, X, client) -> np.ndarray:
    """Each method's score of a client's test rows: its own weights where it has them."""
    if isinstance(det, FedGenGMMDetector):
        return det.decision_function(X)
    return det.decision_function(X, client=client)


def per_client_auroc(det, tests) -> float:
    """Mean AUROC over clients; tests: client -> (rows, is_novel)."""
    values = []
    for client, (X, novel) in tests.items():
        if 0 < novel.sum() < len(novel):
            values.append(roc_auc_score(novel, client_scores(det, X, client)))
    return float(np.mean(values))


# ---------------------------------------------------------------------- MVTec
def mvtec_federation(categories, per_category: int, seed: int):
    """Training rows and groups, per-client test sets, each client's category."""
    rng = np.random.default_rng(seed)
    X_train, groups, tests, truth, held = [], [], {}, [], {}
    client = 0
    for j, cat in enumerate(categories):
        X, y = load_adbench(f"MVTec-AD_{cat}")
        normal, defects = rng.permutation(np.flatnonzero(y == 0)), np.flatnonzero(y == 1)
        cut = int(0.7 * normal.size)
        train, test = normal[:cut], normal[cut:]
        held[cat] = X[test]
        for part, t_part, d_part in zip(
            np.array_split(train, per_category),
            np.array_split(test, per_category),
            np.array_split(rng.permutation(defects), per_category),
            strict=True,
        ):
            X_train.append(X[part])
            groups.append(np.full(part.size, client))
            rows = np.r_[X[t_part], X[d_part]]
            tests[client] = (rows, np.r_[np.zeros(t_part.size), np.ones(d_part.size)])
            truth.append(j)
            client += 1
    return np.vstack(X_train), np.concatenate(groups), tests, np.asarray(truth), held


def federated_pca(X: np.ndarray, groups: np.ndarray, axes: int):
    """The clients' federated PCA (summed moments, two rounds): rows -> (n, axes)."""
    clients = [torch.as_tensor(X[groups == c]) for c in np.unique(groups)]
    projection = run_simulation(FederatedPCA(axes), clients).state.projection
    return lambda rows: projection.transform(torch.as_tensor(rows)).numpy()


def run_mvtec(settings: Settings, seed: int) -> dict:
    cats = settings.categories
    X, groups, tests, truth, _ = mvtec_federation(cats, settings.clients_per_category, seed)
    project = federated_pca(X, groups, settings.axes)
    X = project(X)
    tests = {c: (project(rows), novel) for c, (rows, novel) in tests.items()}
    out = {}
    for name in METHODS:
        started = time.perf_counter()
        det = make(name, len(cats), settings, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            det.fit(X, groups=groups)
        row = {"auroc": per_client_auroc(det, tests), "seconds": time.perf_counter() - started}
        if name.startswith("ClusteredGMM"):
            row["ari"] = adjusted_rand_score(truth, det.client_clusters_)
            row["client_auroc"] = client_level(name, settings, seed)
        out[name] = row
        print(f"  MVTec seed {seed} {name:18s} " + " ".join(f"{k} {v:.3f}" for k, v in row.items()),
              flush=True)  # fmt: skip
    return out


def client_level(name: str, settings: Settings, seed: int) -> float:
    """Fit on all categories but the last 3; new clients of 20 test rows from the trained
    categories (normal) and from the held-out ones (rogue): AUROC of ``client_score``."""
    cats = settings.categories
    trained, held_out = cats[:-3], cats[-3:]
    X, groups, _, _, held = mvtec_federation(cats, settings.clients_per_category, seed)
    keep = groups < len(trained) * settings.clients_per_category
    project = federated_pca(X[keep], groups[keep], settings.axes)
    det = make(name, len(trained), settings, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fit(project(X[keep]), groups=groups[keep])
    scores, rogue = [], []
    for cat in cats:
        rows = held[cat]
        for start in range(0, rows.shape[0] - 19, 20):
            scores.append(det.client_score(project(rows[start : start + 20])))
            rogue.append(cat in held_out)
    return float(roc_auc_score(rogue, scores))


# ---------------------------------------------------------------------- ADBench
def adbench_federation(name: str, seed: int, n_clients: int = 12, n_clusters: int = 4):
    X, y = load_adbench(name)
    rng = np.random.default_rng(seed)
    lo, hi = X.min(0), X.max(0)
    X = (X - lo) / np.where(hi > lo, hi - lo, 1.0)
    inliers = rng.permutation(np.flatnonzero(y == 0))
    cut = int(0.7 * inliers.size)
    train, test = inliers[:cut], inliers[cut:]
    kinds = kmeans_groups(X[inliers], 4, random_state=seed)
    train_groups, test_groups = kinds[:cut], kinds[cut:]
    parts, true_clusters = cluster_dirichlet_partition(
        train_groups, n_clients, n_clusters, 0.1, 10.0, random_state=seed, min_size=8
    )
    groups = np.empty(cut, dtype=np.int64)
    share = np.zeros((n_clients, 4))
    for c, part in enumerate(parts):
        groups[part] = c
        share[c] = np.bincount(train_groups[part], minlength=4) / max(part.size, 1)
    owner = {g: np.argsort(-share[:, g]) for g in range(4)}
    tests = {c: [] for c in range(n_clients)}
    for i, g in zip(test, test_groups, strict=True):
        # spread a group's test rows over the clients holding most of it
        top = owner[g][: max(1, int((share[:, g] > 0.2).sum()))]
        tests[int(top[rng.integers(top.size)])].append(i)
    anomalies = np.flatnonzero(y == 1)
    out = {}
    for c, rows in tests.items():
        if rows:
            idx = np.r_[np.asarray(rows, dtype=np.int64), anomalies]
            out[c] = (X[idx], np.r_[np.zeros(len(rows)), np.ones(anomalies.size)])
    return X[train], groups, out, true_clusters


def run_adbench(settings: Settings, seed: int) -> dict:
    out = {}
    for dataset in settings.datasets:
        X, groups, tests, _ = adbench_federation(dataset, seed)
        out[dataset] = {}
        for name in METHODS:
            det = make(name, 4, settings, seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                det.fit(X, groups=groups)
            out[dataset][name] = per_client_auroc(det, tests)
        text = " ".join(f"{n} {v:.3f}" for n, v in out[dataset].items())
        print(f"  {dataset} seed {seed} {text}", flush=True)
    return out


# ---------------------------------------------------------------------- report
def report(mvtec: list[dict], adbench: list[dict], settings: Settings) -> str:
    lines = [
        f"## 1. MVTec-AD categories as clusters ({len(settings.categories)} categories x "
        f"{settings.clients_per_category} clients, {settings.axes} federated principal axes, "
        f"K_g={settings.global_components}, K_c={settings.cluster_components}, seeds "
        f"{list(settings.seeds)})",
        "",
    ]
    rows = []
    for name in METHODS:
        runs = [r[name] for r in mvtec]
        rows.append([
            name,
            mean_std([100 * r["auroc"] for r in runs], 2),
            mean_std([r["ari"] for r in runs], 3) if "ari" in runs[0] else "",
            mean_std([100 * r["client_auroc"] for r in runs], 2) if "ari" in runs[0] else "",
            mean_std([r["seconds"] for r in runs], 1),
        ])  # fmt: skip
    header = ["method", "per-client AUROC %", "ARI vs categories", "client-level AUROC %",
              "fit s"]  # fmt: skip
    lines += [markdown_table(header, rows), ""]
    lines += [
        "## 2. ADBench sets, cluster-wise Dirichlet(0.1, 10) (12 clients, 4 clusters), "
        "per-client AUROC %",
        "",
    ]
    rows = []
    for dataset in settings.datasets:
        rows.append([dataset] + [
            mean_std([100 * r[dataset][n] for r in adbench], 2) for n in METHODS
        ])  # fmt: skip
    means = {
        n: float(np.mean([r[d][n] for r in adbench for d in settings.datasets])) for n in METHODS
    }
    rows.append(["**mean**"] + [f"{100 * means[n]:.2f}" for n in METHODS])
    lines += [markdown_table(["dataset", *METHODS], rows), ""]
    mv = {n: float(np.mean([r[n]["auroc"] for r in mvtec])) for n in METHODS}
    overall = {n: (means[n] + mv[n]) / 2 for n in METHODS}
    for name in METHODS[:2]:
        lines.append(check(
            f"{name}: per-client AUROC >= FedGMM and >= FedGenGMM on the mean over datasets "
            f"(ADBench and MVTec: {100 * overall[name]:.2f} vs {100 * overall['FedGMM']:.2f}, "
            f"{100 * overall['FedGenGMM']:.2f})",
            overall[name] >= overall["FedGMM"] and overall[name] >= overall["FedGenGMM"],
        ))  # fmt: skip
        ari = float(np.mean([r[name]["ari"] for r in mvtec]))
        lines.append(check(f"{name}: ARI >= 0.9 on MVTec categories ({ari:.3f})", ari >= 0.9))
        cl = float(np.mean([r[name]["client_auroc"] for r in mvtec]))
        lines.append(check(
            f"{name}: client-level anomaly AUROC >= 0.95 ({100 * cl:.2f} %)", cl >= 0.95
        ))  # fmt: skip
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser)
    add_seeds(parser)
    add_threads(parser)
    add_out(parser)
    return parser.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = quick_seeds(args.seeds, args.quick)
    if args.quick:
        settings = Settings(seeds, CATEGORIES[:5], 2, ADBENCH[:1], 2, 1, 8)
    else:
        settings = Settings(seeds, CATEGORIES, 3, ADBENCH)
    command = command_line("clustered_mixtures", argv)
    started = time.perf_counter()
    mvtec = [run_mvtec(settings, s) for s in settings.seeds]
    adbench = [run_adbench(settings, s) for s in settings.seeds]
    elapsed = time.perf_counter() - started
    header = report_header("Clustered additive mixtures for novelty", command, args.quick, elapsed)
    return emit_report(header + "\n\n" + report(mvtec, adbench, settings) + "\n", args.out)


if __name__ == "__main__":
    main()
