"""FedGMM's joint model under differential privacy: classification and novelty against epsilon.

Data: federated MNIST as in ``fedgmm_mnist.py`` (``make_mnist_federated``, Dirichlet(0.4)
label skew; ``--clients`` x ``--rows`` training images, a fifth as many test images per
client), every image scaled to unit L2 norm, then projected on 24 orthonormal axes drawn
once from a seeded Gaussian matrix and scaled by ``sqrt(784 / 24)`` (a typical row then has
norm 1): a **public** projection (it reads no image), so each client applies it locally. The
public box is ``[-2, 2]`` per feature and the clipping radius ``Privacy.clip=1`` in the box's
units (rows of norm above 2 are clipped; by construction no row exceeds ``sqrt(784 / 24)``,
and on MNIST the largest is 1.5: both are public choices, not read from a client).
Novel rows: the test images shrunk by 0.5, rotated and flipped (the FedGMM paper's
composed transform), projected the same way.

Model: ``JointFedGMMDetector`` (10 Gaussians, 2 linear learners on the 24 projected
features, ``local_epochs=1``, ``learning_rate``, ``max_iter`` rounds after 3 Lloyd rounds)
fitted with ``Privacy.epsilon`` in ``--epsilons`` (``delta=1e-5``, central mode: a trusted
server adds the statistics' noise; each client runs DP-SGD with Poisson rate
``--sample-rate``, gradient clip 1 and half the budget, ``learner_share=0.5``) and
without differential privacy (``inf``, the same rounds). Reported: the accuracy of
``predict_y`` with the global weights, the AUROC of ``-log p(x)`` for the novel rows, the
noise multipliers (statistics ``z``, DP-SGD ``sigma``) and the fit's seconds; mean and
spread over ``--seeds``.

Run: ``python -m benchmarks.dp_learners [--seeds 0 1 2] [--quick]``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

from benchmarks.common import (
    add_out,
    add_quick,
    add_seeds,
    command_line,
    emit_report,
    report_header,
    with_options,
)
from benchmarks.fedgmm_mnist import COMPOSED, image_rows, unit_norm
from fednovelty.datasets.mnist import make_mnist_federated
from fednovelty.detectors import Initialisation, Privacy
from fednovelty.detectors.joint_fedgmm import JointFedGMMDetector
from fednovelty.evaluation.metrics import auroc

WIDTH = 24


def public_axes(n_pixels: int = 784, width: int = WIDTH, seed: int = 12345) -> np.ndarray:
    """``width`` orthogonal columns of norm ``sqrt(n_pixels / width)`` (n_pixels, width)
    drawn from a seeded Gaussian matrix: independent of every image, hence public."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(n_pixels, width)))
    return q * np.sqrt(n_pixels / width)


def fit_one(
    X, y, groups, seed: int, epsilon: float | None, args
) -> tuple[JointFedGMMDetector, float]:
    """The joint detector at ``epsilon`` (``None``: without DP); returns (detector, seconds)."""
    params = dict(
        n_components=10,
        n_learners=2,
        learner="linear",
        local_epochs=1,
        learning_rate=args.learning_rate,
        max_iter=args.rounds,
        initialisation=Initialisation(kmeans_rounds=3),
        tol=0.0,
        random_state=seed,
    )
    if epsilon is not None:
        params["privacy"] = Privacy(
            epsilon=epsilon,
            bounds=([-2.0] * WIDTH, [2.0] * WIDTH),
            clip=1.0,
            sample_rate=args.sample_rate,
        )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fixed number of rounds: non-convergence is expected
        det = JointFedGMMDetector(**with_options(params)).fit(X, y, groups)
    return det, time.perf_counter() - start


def run(args) -> list[dict]:
    axes = public_axes()
    rows = []
    for seed in args.seeds:
        data = make_mnist_federated(args.clients, args.rows, 0.4, random_state=seed)
        X = unit_norm(data.X_train) @ axes
        X_in = unit_norm(data.X_test) @ axes
        X_out = image_rows(data.images_test, COMPOSED) @ axes
        is_novel = np.r_[np.zeros(len(X_in)), np.ones(len(X_out))].astype(int)
        for epsilon in [*args.epsilons, None]:
            det, seconds = fit_one(X, data.y_train, data.groups_train, seed, epsilon, args)
            spent = getattr(det, "privacy_spent_", {})
            rows.append(
                {
                    "seed": seed,
                    "epsilon": "inf" if epsilon is None else epsilon,
                    "accuracy": float(np.mean(det.predict_y(X_in) == data.y_test)),
                    "auroc_px": auroc(is_novel, det.decision_function(np.vstack([X_in, X_out]))),
                    "z": spent.get("noise_multiplier", 0.0),
                    "sigma": spent.get("sgd_noise_multiplier", 0.0),
                    "spent": spent.get("epsilon", float("nan")),
                    "seconds": seconds,
                }
            )
            print(rows[-1], flush=True)
    return rows


def table(rows: list[dict], epsilons) -> str:
    lines = [
        "| epsilon | accuracy | AUROC -log p(x) | z | sigma | epsilon spent | fit s |",
        "|---|---|---|---|---|---|---|",
    ]
    for epsilon in [*epsilons, "inf"]:
        group = [r for r in rows if r["epsilon"] == epsilon]
        if not group:
            continue

        def stat(key, digits=3, group=group):
            values = np.array([r[key] for r in group], dtype=float)
            spread = f" ± {values.std(ddof=1):.{digits}f}" if len(values) > 1 else ""
            return f"{values.mean():.{digits}f}{spread}"

        lines.append(
            f"| {epsilon} | {stat('accuracy')} | {stat('auroc_px')} | {stat('z', 2)} | "
            f"{stat('sigma', 2)} | {stat('spent', 3)} | {stat('seconds', 1)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_seeds(parser)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 8.0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=2.0)
    parser.add_argument("--sample-rate", type=float, default=0.05)
    add_quick(parser, "a smoke run: 4 clients, 1 seed")
    add_out(parser, "the markdown report")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epsilons, args.clients, args.rows, args.rounds = [0], [4.0], 4, 300, 2
    torch.set_num_threads(1)
    start = time.perf_counter()
    rows = run(args)
    command = command_line("dp_learners", argv)
    title = "FedGMM's joint model under differential privacy (federated MNIST)"
    text = "\n".join(
        [
            report_header(title, command, args.quick, time.perf_counter() - start),
            "",
            f"{args.clients} clients x {args.rows} images (Dirichlet(0.4) label skew), a public "
            f"24-axis random projection of unit-norm pixels; {args.rounds} joint EM rounds after "
            f"3 Lloyd rounds; DP-SGD rate {args.sample_rate}, learning rate {args.learning_rate}; "
            f"seeds {args.seeds}; central mode, delta 1e-5.",
            "",
            table(rows, args.epsilons),
        ]
    )
    emit_report(text, args.out)


if __name__ == "__main__":
    main()
