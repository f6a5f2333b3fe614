"""How one private release's budget is split over counts, first and second moments: the fixed
split against the split that minimises the M-step's first-order error, and against a split
that spends a third of the budget on the counts.

A release of summed mixture statistics is three Gaussian mechanisms (counts, first moments,
second moments); block ``b`` gets noise of multiplier ``z * s_b`` with ``sum_b 1 / s_b^2 =
3``. The splits compared:

- ``fixed``: :data:`~fednovelty.federated.trust.dp_split.BLOCK_SPLIT` (8, 2.5, 0.595);
- ``derived``: :func:`~fednovelty.federated.trust.dp_split.stats_split` of the task's ``d``
  and ``K`` (the first-order expected KL of a noisy M-step, minimised in closed form; the row count
  cancels at first order, so it needs no size);
- ``size-aware``: from a public size hint (here the task's training rows over ``K``), the
  derived split where the covariances are resolved (:func:`noise_ratio` <= 1), else the
  fixed split with a count floor that shrinks noisy means (:func:`size_aware_split`);
- ``counts``: a third of the budget on the counts (``s_counts = 1``), the rest split between
  first and second moments as ``derived`` does: what "spend more on the counts" means.

The ``mean without 10_cover`` rows of the AUROC table average the small sets (their ``rows``
and ``d`` read 0). Three sections:

1. ``split``: each task's derived split and the first-order error of the fixed split over
   the derived one's (:func:`~fednovelty.federated.trust.dp_split.split_error`).
2. ``mstep``: the exact expected KL from the truth of one noisy M-step with the server's
   post-processing (:func:`~fednovelty.federated.trust.dp_mechanism.private_sum` then
   :func:`~fednovelty.federated.trust.dp_postprocess.plausible_stats` with the floors
   ``fednovelty.federated.init.combine.private_stats`` uses), by simulation on the row-free
   reference (``K`` components of ``n_k`` rows each, uniform centres in ``[-1, 1]^d``,
   covariance ``K^(-2/d) / 3`` per feature, clipping radius ``sqrt(d)``), for ``n_k`` from
   20 to 20,000 rows and the ``z`` of ``epsilon`` 1 and 8 over 44 releases.
3. ``auroc``: DEM-kmeans under central DP (the scoreboard's task: novelty protocol, 10
   clients of Dirichlet(0.5), 8 components, at most 20,000 training rows, ``Privacy.bounds``
   [0, 1], 3 Lloyd and 40 EM rounds) with each split. The split is swapped in the module's
   :data:`~fednovelty.federated.trust.dp_split.BLOCK_SPLIT` for the whole fit (every release's
   noise and the server's floors read it).

Run: ``python -m benchmarks.dp_split [--datasets ...] [--seeds 0 1 2] [--epsilons 1 8]
[--sections split mstep auroc] [--out FILE] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.common import (
    add_out,
    add_quick,
    add_seeds,
    command_line,
    emit_report,
    report_header,
)
from fednovelty.datasets.protocols import make_task
from fednovelty.detectors import Initialisation, Privacy
from fednovelty.evaluation import auroc
from fednovelty.federated.trust import dp_calibration, dp_mechanism, dp_postprocess, dp_split
from fednovelty.federated.trust.noise import SeededNoise
from fednovelty.methods import get_method
from fednovelty.mixture.stats import SufficientStats

#: the ADBench sets that lose more than 0.1 AUROC at epsilon 1 on the scoreboard, and
#: Covertype.
DATASETS = (
    "10_cover",
    "14_glass",
    "18_Ionosphere",
    "20_letter",
    "24_mnist",
    "25_musk",
    "26_optdigits",
    "35_SpamBase",
    "37_Stamps",
    "41_Waveform",
)
SPLITS = ("fixed", "size-aware", "derived", "counts")
RELEASES = 44  # 3 Lloyd + 40 EM + the moments round
#: the fixed split, kept before any fit swaps the module's.
FIXED = dict(dp_split.BLOCK_SPLIT)


def noise_ratio(n_features: int, n_components: int, rows_per_component: float, z: float) -> float:
    """``rho``: the noise's spectral norm on a component's covariance under the derived split
    (``2 z s_second B^2 sqrt(d) / n_k``, the server's covariance floor) over the row-free
    reference's variance (``B^2 K^(-2/d) / (3 d)``, :func:`~fednovelty.federated.trust.dp.
    split_coefficients`): ``6 z s_second d^1.5 K^(2/d) / n_k``. Below 1 the covariances are
    resolved and the first-order analysis holds."""
    d, k = n_features, n_components
    second = dp_split.stats_split(d, k)["second"]
    return 6 * z * second * d**1.5 * k ** (2 / d) / rows_per_component


def size_aware_split(
    n_features: int, n_components: int, rows_per_component: float, z: float
) -> dict[str, float]:
    """The derived split where the covariances are resolved (:func:`noise_ratio` <= 1);
    else the fixed split with the counts' share raised so that the server's floor on the
    counts (``2 z s_counts``) is the divisor that minimises a noisy mean's squared error,
    ``n_k + d (z s_sums B)^2 / (n_k |mu|^2)`` with ``|mu|^2 = B^2 / 3`` (James-Stein-like
    shrinkage towards the clipping centre): ``s_counts = max(8, 1.5 d z s_sums^2 / n_k)``.
    The counts' budget stays below 1.6 %, so the other blocks keep their noise."""
    d, n_k = n_features, rows_per_component
    if noise_ratio(d, n_components, n_k, z) <= 1:
        return dp_split.stats_split(d, n_components)
    counts = max(FIXED["counts"], 1.5 * d * z * FIXED["sums"] ** 2 / n_k)
    return dp_split.normalised_split({**FIXED, "counts": counts})


def split_for(
    name: str, n_features: int, n_components: int, rows_per_component: float, z: float
) -> dict[str, float]:
    """The split ``name`` (module docstring) of a task, with ``sum_b 1 / s_b^2 = 3``;
    ``rows_per_component`` (a public size hint) and ``z`` are read by ``"size-aware"`` only."""
    if name == "fixed":
        return dict(FIXED)
    derived = dp_split.stats_split(n_features, n_components)
    if name == "derived":
        return derived
    if name == "size-aware":
        return size_aware_split(n_features, n_components, rows_per_component, z)
    if name == "counts":  # s_counts = 1; sums and second keep derived's ratio in 2 of 3
        rest = 1 / derived["sums"] ** 2 + 1 / derived["second"] ** 2
        scale = math.sqrt(rest / 2)
        return {"counts": 1.0, "sums": derived["sums"] * scale, "second": derived["second"] * scale}
    if name.startswith("counts="):  # a diagnostic: counts at s_counts, sums as fixed
        share = float(name.split("=", 1)[1])
        return dp_split.normalised_split({"counts": share, "sums": 2.5, "second": FIXED["second"]})
    raise ValueError(f"split must be one of {SPLITS} or counts=<share>; got {name!r}.")


@contextlib.contextmanager
def using_split(split: Mapping[str, float]) -> Iterator[None]:
    """Every release and the server's floors read ``split`` inside the block (the module's
    :data:`~fednovelty.federated.trust.dp_split.BLOCK_SPLIT` is updated in place and restored)."""
    saved = dict(dp_split.BLOCK_SPLIT)
    dp_split.BLOCK_SPLIT.update(dp_split.normalised_split(split))
    try:
        yield
    finally:
        dp_split.BLOCK_SPLIT.update(saved)


# --------------------------------------------------------------------------- 1. split
def split_table(tasks: Mapping[str, tuple[int, int]], n_components: int, epsilons) -> pd.DataFrame:
    """Per task (``name -> (rows, d)``): the derived split, the first-order error of the
    fixed split over the derived one's, and ``rho`` (:func:`noise_ratio`) at each epsilon."""
    rows = []
    for name, (n_rows, d) in tasks.items():
        coefficients = dp_split.split_coefficients(d, n_components)
        derived = dp_split.stats_split(d, n_components)
        fixed = FIXED
        rows.append(
            {
                "dataset": name,
                "rows": n_rows,
                "d": d,
                "s_counts": derived["counts"],
                "s_sums": derived["sums"],
                "s_second": derived["second"],
                "fixed/derived error": dp_split.split_error(fixed, coefficients)
                / dp_split.split_error(derived, coefficients),
                **{
                    f"rho eps {eps:g}": noise_ratio(
                        d, n_components, n_rows / n_components,
                        dp_calibration.calibrate_noise(eps, 1e-5, RELEASES),
                    )
                    for eps in epsilons
                },
            }
        )  # fmt: skip
    return pd.DataFrame(rows).set_index("dataset").round(3)


# --------------------------------------------------------------------------- 2. mstep
def mstep_error(
    split: Mapping[str, float], d: int, k: int, n_k: float, z: float, reps: int, seed: int
) -> float:
    """The mean over ``reps`` draws of the KL from the reference mixture (module docstring)
    to the one a noisy M-step under ``split`` computes (the weights' KL plus the average
    component's)."""
    rng = np.random.default_rng(seed)
    source = SeededNoise(seed)  # a utility measurement: reproducible noise
    bound = math.sqrt(d)
    v = k ** (-2 / d) / 3
    eye = torch.eye(d, dtype=torch.float64)
    total = 0.0
    with using_split(split):
        share = dp_split.block_multipliers(z)
        for _ in range(reps):
            mu = torch.tensor(rng.uniform(-1, 1, (k, d)))
            n = torch.full((k,), float(n_k), dtype=torch.float64)
            second = n[:, None, None] * (v * eye + mu[:, :, None] * mu[:, None, :])
            stats = SufficientStats(
                counts=n,
                sums=n[:, None] * mu,
                second=second,
                shift=torch.zeros(d, dtype=torch.float64),
                log_likelihood=torch.zeros((), dtype=torch.float64),
                n_samples=n.sum(),
                covariance_type="full",
            )
            noisy = dp_mechanism.private_sum(stats, z, bound, source)
            kept = dp_postprocess.plausible_stats(  # the floors of init.combine.private_stats
                noisy, bound, max(1.0, 2 * share["counts"]), 1e-4 * bound**2,
                share["second"] * bound**2,
            )  # fmt: skip
            counts = kept.counts
            means = kept.sums / counts[:, None]
            covs = kept.second / counts[:, None, None] - means[:, :, None] * means[:, None, :]
            weights = counts / counts.sum()
            kl_weights = float(torch.sum(torch.log((1 / k) / weights)) / k)
            inv = torch.linalg.inv(covs)
            diff = means - mu
            kl = 0.5 * (
                v * inv.diagonal(dim1=-2, dim2=-1).sum(-1)
                + torch.einsum("ki,kij,kj->k", diff, inv, diff)
                - d
                + torch.linalg.slogdet(covs)[1]
                - d * math.log(v)
            )
            total += kl_weights + float(kl.mean())
    return total / reps


def mstep_table(dims, ratios, epsilon: float, k: int, reps: int, splits) -> pd.DataFrame:
    """The expected KL of one noisy M-step per (d, n_k / z) and split, at the ``z`` of
    ``epsilon`` over :data:`RELEASES` releases (the KL depends on ``n_k`` and ``z`` only
    through ``n_k / z``: everything the M-step divides by the count scales with it)."""
    z = dp_calibration.calibrate_noise(epsilon, 1e-5, RELEASES)
    rows = []
    for d, ratio in itertools.product(dims, ratios):
        n_k = ratio * z
        row = {"d": d, "n_k / z": ratio, "rho": round(noise_ratio(d, k, n_k, z), 3)}
        for name in splits:
            row[name] = mstep_error(split_for(name, d, k, n_k, z), d, k, n_k, z, reps, seed=0)
        rows.append(row)
        print(row, flush=True)
    return pd.DataFrame(rows).set_index(["d", "n_k / z", "rho"]).round(3)


# --------------------------------------------------------------------------- 3. auroc
def auroc_rows(args) -> pd.DataFrame:
    """One row per (dataset, seed, epsilon, split): the AUROC of DEM-kmeans fitted under
    central DP with the split (a fit is deterministic given its seed, so a split that equals
    one already fitted, as ``size-aware`` does, reuses its AUROC)."""
    rows = []
    method = get_method("DEM-kmeans")
    for dataset, seed in itertools.product(args.datasets, args.seeds):
        task = make_task(
            dataset, "novelty", n_clients=args.clients, alpha=0.5, seed=seed,
            max_train=args.max_train,
        )  # fmt: skip
        d = task.X_train.shape[1]
        bounds = (np.zeros(d), np.ones(d))
        base = method.shared_params(n_components=args.components, random_state=seed)
        done: dict[tuple, float] = {}
        for eps, name in itertools.product(args.epsilons, args.splits):
            z = dp_calibration.calibrate_noise(eps, 1e-5, RELEASES)
            split = split_for(name, d, args.components, len(task.X_train) / args.components, z)
            key = (eps, *(round(split[b], 12) for b in dp_split.STAT_BLOCKS))
            started = time.perf_counter()
            if key not in done:
                detector = method.build(
                    **base, max_iter=args.max_iter, progress=False,
                    privacy=Privacy(epsilon=eps, bounds=bounds, mode="central"),
                    initialisation=Initialisation(kmeans_rounds=args.kmeans_rounds),
                )  # fmt: skip
                with using_split(split):
                    detector.fit(task.X_train, groups=task.groups_train)
                    done[key] = auroc(task.y_test, detector.decision_function(task.X_test))
            rows.append(
                {
                    "dataset": dataset,
                    "rows": task.X_train.shape[0],
                    "d": d,
                    "seed": seed,
                    "epsilon": eps,
                    "split": name,
                    "rho": noise_ratio(d, args.components, len(task.X_train) / args.components, z),
                    "auroc": done[key],
                    "seconds": time.perf_counter() - started,
                }
            )
            print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def auroc_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC over seeds per (dataset, epsilon) and split, the derived split's gain over
    the fixed one, and the small sets' mean (every dataset but Covertype)."""
    table = frame.pivot_table(
        index=["dataset", "rows", "d", "epsilon"], columns="split", values="auroc", aggfunc="mean"
    )
    table = table[[s for s in SPLITS if s in table.columns]
                  + [s for s in table.columns if s not in SPLITS]]  # fmt: skip
    small = frame[frame.dataset != "10_cover"]
    if len(small):
        means = small.pivot_table(index="epsilon", columns="split", values="auroc", aggfunc="mean")
        for eps, row in means.iterrows():
            table.loc[("mean without 10_cover", 0, 0, eps), row.index] = row.values
    for name in ("size-aware", "derived"):
        if name in table and "fixed" in table:
            table[f"{name} - fixed"] = table[name] - table["fixed"]
    return table.round(3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    add_seeds(parser)
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 8.0])
    parser.add_argument(
        "--splits", nargs="+", default=list(SPLITS), help=f"of {SPLITS}, or counts=<share>"
    )
    parser.add_argument(
        "--sections", nargs="+", default=["split", "mstep", "auroc"],
        choices=["split", "mstep", "auroc"],
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--components", type=int, default=8)
    parser.add_argument("--max-iter", type=int, default=40)
    parser.add_argument("--kmeans-rounds", type=int, default=3)
    parser.add_argument("--max-train", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=40, help="draws per M-step cell")
    add_out(parser, "also write the report here")
    parser.add_argument("--rows-out", type=Path, default=None, help="per-run AUROC rows (CSV)")
    add_quick(parser, "smoke run: glass, one seed, epsilon 1, few draws")
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets, args.seeds, args.epsilons = ["14_glass"], [0], [1.0]
        args.max_iter, args.reps = 3, 2
    torch.set_num_threads(1)
    started = time.perf_counter()
    parts = []
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        if "split" in args.sections:
            tasks = {}
            for name in args.datasets:
                task = make_task(name, "novelty", n_clients=args.clients, alpha=0.5, seed=0,
                                 max_train=args.max_train)  # fmt: skip
                tasks[name] = task.X_train.shape
            table = split_table(tasks, args.components, args.epsilons)
            parts += [f"## Derived split per task (K = {args.components})", "",
                      "```text", table.to_string(), "```", ""]  # fmt: skip
        if "mstep" in args.sections:
            dims = (7, 10) if args.quick else (7, 10, 32)
            ratios = (4, 256) if args.quick else (4, 16, 64, 256, 1024, 4096)
            eps = args.epsilons[0]
            table = mstep_table(dims, ratios, eps, args.components, args.reps, args.splits)
            parts += [f"## One noisy M-step: expected KL from the truth ({args.reps} draws, "
                      f"z of epsilon {eps:g})", "",
                      "```text", table.to_string(), "```", ""]  # fmt: skip
        if "auroc" in args.sections:
            frame = auroc_rows(args)
            if args.rows_out:
                args.rows_out.parent.mkdir(parents=True, exist_ok=True)
                frame.to_csv(args.rows_out, index=False)
            table = auroc_table(frame)
            parts += [f"## AUROC, DEM-kmeans, central DP, mean over seeds {args.seeds}", "",
                      "```text", table.to_string(), "```", ""]  # fmt: skip
    command = command_line("dp_split", argv)
    header = report_header(
        "Splitting a private release's budget over its blocks (benchmarks/dp_split.py)",
        command, args.quick, time.perf_counter() - started,
    )  # fmt: skip
    emit_report("\n".join([header, "", *parts]), args.out)


if __name__ == "__main__":
    main()
