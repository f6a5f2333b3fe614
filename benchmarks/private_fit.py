"""DP-EM's cost in held-out log-likelihood: ``private_em`` against non-private EM.

For each client size n in {100, 1000, 10000} and each epsilon in {0.5, 1, 2, 4, 8, inf}
(delta = 1e-5, 10 iterations, full covariances), a client's rows are fitted by
``fednovelty.federated.mixtures.private_fit.private_em`` with the noise multiplier that
``calibrate_noise`` gives for (epsilon, delta, 10 iterations, 3 blocks) (what
``private_em_for_budget`` does; epsilon = inf: the same loop without noise, so clipping, the
public start and the fixed 10 iterations alone) and by scikit-learn's ``GaussianMixture``
(k-means start, its default stopping rule), and both are scored by the mean log-likelihood of
held-out rows of the same distribution. The last column runs the noiseless loop for 100
iterations from the same public starts (the cost of stopping after 10). Each private cell is
the median over ``--seeds`` noise seeds (the public start changes with the seed too), with the
worst seed beside it.

Data:
- synthetic: 4 Gaussians in 3-d (means drawn in [-3, 3]^3 at least 2.5 apart, std 0.6),
  public centre 0, clip radius 6;
- ADBench Covertype (``10_cover``, 10 features; inliers and outliers alike): min-max scaled to
  [0, 1] with the whole file's per-feature minimum and maximum standing in for public bounds, a
  client's share drawn at random, 20,000 other rows held out; 5 components, centre 0.5 in every
  feature, clip radius sqrt(10) / 2 (the half-diagonal of the unit cube: clips nothing),
  ``reg_covar`` 1e-4 for both fits (some features take few values).

FedGenGMM under DP (``--fedgengmm``): the demo task (``make_task("10_cover", "novelty",
n_clients=20, alpha=0.5, seed=s)``, features min-max scaled to [0, 1], so
``Privacy(bounds=(zeros, ones))``), ``get_method("FedGenGMM")`` with ``n_components=15`` and
``Privacy.epsilon`` in {0.5, 1, 2, 4, 8} (delta 1e-5, ``local_iterations`` 20, each client's K fixed
at 10, the largest of ``k_range``, clip ``"auto"``), against the non-private method (its
clients choose K by BIC) and the non-private fixed K=10 (``client_components=10``); test
AUROC (positive = novel) per seed.

Run: ``.venv/bin/python -m benchmarks.private_fit`` (about 2 minutes on 2 cores) writes
``benchmarks/private_fit.txt``; ``--quick`` (one seed, synthetic only; writes only with
``--out``) for a smoke run; ``--out FILE`` elsewhere. ``--fedgengmm --seeds 2`` prints the
FedGenGMM table and appends it to ``benchmarks/private_fit.txt`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from benchmarks.common import add_out, add_quick
from fednovelty.federated.mixtures.private_fit import private_em
from fednovelty.federated.trust.dp_calibration import calibrate_noise
from fednovelty.federated.trust.noise import SeededNoise
from fednovelty.mixture import score_samples

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
SIZES = (100, 1000, 10000)
DELTA = 1e-5
N_ITER = 10
LONG_ITER = 100
HERE = Path(__file__).resolve().parent
COVER = HERE.parent.parent / "shared" / "data" / "adbench" / "10_cover.npz"


def synthetic(rng: np.random.Generator):
    """A sampler of 4 separated Gaussians in 3-d and its public centre and clip radius."""
    while True:
        means = rng.uniform(-3, 3, (4, 3))
        gaps = np.linalg.norm(means[:, None] - means[None], axis=2)
        if gaps[np.triu_indices(4, 1)].min() > 2.5:
            break

    def draw(n: int) -> np.ndarray:
        return means[rng.integers(0, 4, n)] + rng.normal(0, 0.6, (n, 3))

    return draw, np.zeros(3), 6.0, 4, 1e-6


def covertype(rng: np.random.Generator):
    """A sampler of min-max scaled Covertype rows (without replacement), centre and radius."""
    X = np.load(COVER)["X"].astype(np.float64)
    low, high = X.min(0), X.max(0)
    X = (X - low) / np.where(high > low, high - low, 1.0)
    order = rng.permutation(len(X))
    position = [0]

    def draw(n: int) -> np.ndarray:
        rows = X[order[position[0] : position[0] + n]]
        position[0] += n
        return rows

    d = X.shape[1]
    return draw, np.full(d, 0.5), math.sqrt(d) / 2, 5, 1e-4


def sklearn_score(X: np.ndarray, held_out: np.ndarray, k: int, reg_covar: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = GaussianMixture(k, reg_covar=reg_covar, random_state=0).fit(X)
    return float(model.score(held_out))


def table(name: str, source, multipliers: dict[float, float], seeds: int) -> list[str]:
    """One data set's rows: per n, sklearn's score and DP-EM's median (worst) per epsilon."""
    rng = np.random.default_rng(0)
    draw, centre, radius, k, reg_covar = source(rng)
    held_out = draw(20000)
    held_out_t = torch.as_tensor(held_out)
    header = (
        f"{'n':>6} {'sklearn':>8} "
        + " ".join(f"{'eps=' + ('inf' if math.isinf(e) else f'{e:g}'):>16}" for e in EPSILONS)
        + f" {'inf, ' + str(LONG_ITER) + ' it':>16}"
    )
    lines = [f"{name}: K={k}, d={len(centre)}, clip radius {radius:.3g}", header]
    for n in SIZES:
        X = draw(n)
        reference = sklearn_score(X, held_out, k, reg_covar)
        cells = []
        for epsilon in EPSILONS:
            scores = []
            for seed in range(seeds):
                params, _ = private_em(
                    torch.as_tensor(X),
                    k,
                    noise_multiplier=multipliers[epsilon],
                    clip_norm=radius,
                    centre=torch.as_tensor(centre),
                    n_iter=N_ITER,
                    reg_covar=reg_covar,
                    source=SeededNoise(seed),  # a utility measurement: reproducible noise
                )
                scores.append(float(score_samples(params, held_out_t).mean()))
            cells.append(f"{np.median(scores):8.3f} ({min(scores):6.2f})")
        converged = []
        for seed in range(seeds):  # the same loop run long: what the 10 iterations leave
            params, _ = private_em(
                torch.as_tensor(X),
                k,
                noise_multiplier=0.0,
                clip_norm=radius,
                centre=torch.as_tensor(centre),
                n_iter=LONG_ITER,
                reg_covar=reg_covar,
                source=SeededNoise(seed),  # a utility measurement: reproducible noise
            )
            converged.append(float(score_samples(params, held_out_t).mean()))
        cells.append(f"{np.median(converged):8.3f} ({min(converged):6.2f})")
        lines.append(f"{n:>6} {reference:8.3f} " + " ".join(f"{c:>16}" for c in cells))
    return lines


def fedgengmm_table(seeds: int) -> list[str]:
    """Test AUROC of FedGenGMM on the demo task per epsilon and seed (module docstring)."""
    from sklearn.metrics import roc_auc_score

    from fednovelty.datasets.protocols import make_task
    from fednovelty.detectors import Privacy
    from fednovelty.methods import get_method

    method = get_method("FedGenGMM")
    columns = [f"eps={e:g}" for e in EPSILONS if not math.isinf(e)]
    columns += ["no DP, K=10", "no DP, BIC"]
    lines = [
        "FedGenGMM on ADBench Covertype (demo task: 20 clients, Dirichlet alpha 0.5, "
        "n_components 15): test AUROC; DP: delta 1e-5, 20 DP-EM iterations per client, "
        "client K fixed at 10, dp_bounds [0, 1]",
        f"{'seed':>4} {'rows/client':>11} " + " ".join(f"{c:>11}" for c in columns),
    ]
    for seed in range(seeds):
        task = make_task("10_cover", "novelty", n_clients=20, alpha=0.5, seed=seed)
        d = task.X_train.shape[1]
        shared = method.shared_params(n_components=15, random_state=seed)
        settings = [
            {"privacy": Privacy(epsilon=e, bounds=(np.zeros(d), np.ones(d)))}
            for e in EPSILONS
            if not math.isinf(e)
        ]
        settings += [{"client_components": 10}, {}]
        cells = []
        for extra in settings:
            detector = method.build(**shared, **extra)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                detector.fit(task.X_train, groups=task.groups_train)
            scores = detector.decision_function(task.X_test)
            cells.append(f"{roc_auc_score(task.y_test, scores):11.4f}")
        size = len(task.X_train) / 20
        lines.append(f"{seed:>4} {size:>11.0f} " + " ".join(cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick(parser, "one seed, synthetic data only")
    parser.add_argument("--seeds", type=int, default=5, help="noise seeds per cell (default 5)")
    add_out(parser, "default: private_fit.txt")
    parser.add_argument("--fedgengmm", action="store_true", help="FedGenGMM on Covertype")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.fedgengmm:
        start = time.perf_counter()
        lines = fedgengmm_table(args.seeds)
        lines.append(f"took {time.perf_counter() - start:.0f} s (torch threads 1)")
        text = "\n" + "\n".join(lines) + "\n"
        print(text, end="")
        with open(args.out or HERE / "private_fit.txt", "a") as handle:
            handle.write(text)
        return
    seeds = 1 if args.quick else args.seeds
    start = time.perf_counter()
    multipliers = {
        e: 0.0 if math.isinf(e) else calibrate_noise(e, DELTA, rounds=N_ITER, blocks=3)
        for e in EPSILONS
    }
    lines = [
        "Held-out mean log-likelihood per row (higher is better): scikit-learn's EM against "
        f"DP-EM (private_em), delta={DELTA:g}, {N_ITER} iterations, full covariances.",
        f"DP-EM cells: median over {seeds} noise seed(s) (worst in brackets). Noise multiplier "
        "per epsilon: "
        + ", ".join(f"{e:g}: {z:.3g}" for e, z in multipliers.items() if not math.isinf(e))
        + ".",
        "",
    ]
    lines += table("synthetic", synthetic, multipliers, seeds)
    if not args.quick and COVER.exists():
        lines += ["", *table("ADBench Covertype (min-max)", covertype, multipliers, seeds)]
    lines += ["", f"took {time.perf_counter() - start:.0f} s (torch threads 1)"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None or not args.quick:
        (args.out or HERE / "private_fit.txt").write_text(text)


if __name__ == "__main__":
    main()
