"""FedGMM personalised classification and unseen-client adaptation on the paper's synthetic data.

Run ``python -m benchmarks.fedgmm_pfl`` (all seeds, both experiments) or ``--quick`` (a smoke
run: 8 clients, 5 rounds, one seed).
``--experiment pfl|unseen|all`` picks the experiments, ``--seeds 0 1 2`` the seeds,
``--clients N`` the number of clients, ``--out FILE`` also writes the markdown report.

Data: ``make_fedgmm_synthetic(n_clients, random_state=seed)`` (FedGMM paper, Sec. 4.1: three
Gaussian components in d = 32, each with its own linear labelling rule, client weights from
Dir(0.4); the constants of the paper's reference code, see that module's docstring). The same
seed draws the data, the client split and the model's randomness.

Shared settings of every method (all built by
``JointFedGMMDetector.pfl_baseline(name, ...)``):
``max_iter=50`` EM rounds with ``tol=0`` (every round runs), learners are multinomial logistic
regressions trained by 5 local epochs of SGD (``Training(local_epochs=5, learning_rate=0.5,
batch_size=32)``) per round, float64. FedGMM has ``n_components=3`` Gaussians and
``n_learners=3`` learners; FedEM 1 Gaussian and 3 learners; FedAvg, FedProx
(``Training.mu_prox=0.01``) and Local 1 Gaussian and 1 learner (Local never aggregates its
learner).

1. PFL classification (the paper's Table 2). Every method trains on all clients' training
   rows; each client's test rows are classified with that client's personal weights,
   ``predict_y(X_test_c, client=c)`` (Local: the client's own learner). Accuracy is
   sample-weighted over clients (total correct / total test rows). Also reported: rounds
   (including the federated k-means initialisation), megabytes sent up and down, fit seconds.
   Reference: Table 2's synthetic row (300 clients, ~3000 rows each in the text, 200 rounds,
   learning rate grid-searched), and FedGMM 77.0% from the paper's reference code at 30 clients
   and 50 rounds, as reported for that code (not re-run here). Targets: FedGMM > FedEM > FedAvg
   (mean accuracy over seeds), FedGMM >= 77%, every FedGMM fit under 2 minutes.
2. Unseen clients (the paper's Table 5 protocol, Sec. 4.6). A seeded random 80% of the
   clients train (their training rows only). Each held-out client's training and test rows are
   pooled and split 50/50 (seeded) into adaptation and evaluation rows. On the evaluation rows:
   FedGMM with the global weights (``client=None``), after ``adapt(X_adapt, y_adapt)``
   (labelled: the E-step uses ``N(x) P(y | x)``) and after ``adapt(X_adapt)`` (x-only); FedEM
   with the global weights and after labelled adaptation (one Gaussian, so only the learner
   weights move; x-only adaptation would change nothing); FedAvg (one global model, nothing to
   adapt). Sanity column: the same FedGMM on the training clients' test rows with their own
   weights. Accuracy is sample-weighted over the held-out clients. The paper's Table 5 has
   FEMNIST and CIFAR numbers only, no synthetic ones, so no reference is printed.

Tables give mean ± standard deviation (ddof=1) over seeds. Nothing is tuned per seed.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.common import (
    Experiment,
    PaperTables,
    add_experiment,
    add_out,
    add_quick,
    add_seeds,
    add_threads,
    check,
    command_line,
    markdown_table,
    mean_std,
    personal_accuracy,
    pooled_accuracy,
    quick_seeds,
    run_paper_tables,
    with_options,
)
from fednovelty.datasets.synthetic import FederatedSplit, make_fedgmm_synthetic
from fednovelty.detectors.joint_fedgmm import JointFedGMMDetector

METHODS = ("Local", "FedAvg", "FedProx", "FedEM", "FedGMM")
#: FedGMM paper, Table 2, row "Synthetic" (average test accuracy, %).
PAPER_TABLE2 = {
    "Local": 57.52,
    "FedAvg": 53.21,
    "FedProx": 52.70,
    "FedEM": 65.61,
    "FedGMM": 72.02,
}
#: FedGMM in the paper's reference code at 30 clients and 50 rounds (reported, not re-run here).
REFERENCE_CODE_FEDGMM = 77.0
TARGET_FEDGMM_ACCURACY = 77.0
TARGET_FIT_SECONDS = 120.0
TRAIN_CLIENT_SHARE = 0.8


@dataclass(frozen=True)
class Settings:
    """What one run uses; ``--quick`` shrinks clients and rounds."""

    n_clients: int
    max_iter: int
    seeds: tuple[int, ...]

    def model_params(self, seed: int) -> dict:
        return with_options(
            {
                "n_components": 3,
                "n_learners": 3,
                "max_iter": self.max_iter,
                "tol": 0.0,
                "learning_rate": 0.5,
                "local_epochs": 5,
                "batch_size": 32,
                "dtype": "float64",
                "random_state": seed,
            }
        )


# ----------------------------------------------------------------------------- helpers
def make_model(name: str, settings: Settings, seed: int) -> JointFedGMMDetector:
    return JointFedGMMDetector.pfl_baseline(name, **settings.model_params(seed))


def timed_fit(model: JointFedGMMDetector, X, y, groups) -> float:
    start = time.perf_counter()
    model.fit(X, y, groups=groups)
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- experiment 1
def run_pfl_seed(data: FederatedSplit, settings: Settings, seed: int) -> dict[str, dict]:
    """Fit every method on all clients; personal test accuracy and costs per method."""
    results = {}
    for name in METHODS:
        model = make_model(name, settings, seed)
        seconds = timed_fit(model, data.X_train, data.y_train, data.groups_train)
        results[name] = {
            "accuracy": personal_accuracy(model, data.X_test, data.y_test, data.groups_test),
            "rounds": model.n_rounds_,
            "mb_up": model.bytes_up_ / 1e6,
            "mb_down": model.bytes_down_ / 1e6,
            "seconds": seconds,
        }
        print(f"  seed {seed} {name:8s} acc {results[name]['accuracy']:5.1f}%  {seconds:5.1f} s")
    return results


def pfl_report(per_seed: list[dict[str, dict]], settings: Settings) -> str:
    def column(name: str, key: str) -> list[float]:
        return [result[name][key] for result in per_seed]

    rows = [
        [
            name,
            mean_std(column(name, "accuracy")),
            f"{PAPER_TABLE2[name]:.2f}",
            mean_std(column(name, "rounds"), 0),
            mean_std(column(name, "mb_up"), 2),
            mean_std(column(name, "mb_down"), 2),
            mean_std(column(name, "seconds")),
        ]
        for name in METHODS
    ]
    header = [
        "method",
        "accuracy % (ours)",
        "paper Table 2 %",
        "rounds",
        "MB up",
        "MB down",
        "fit s",
    ]
    acc = {name: float(np.mean(column(name, "accuracy"))) for name in METHODS}
    slowest = max(column("FedGMM", "seconds"))
    checks = [
        check(
            f"FedGMM > FedEM > FedAvg ({acc['FedGMM']:.1f} > {acc['FedEM']:.1f} > "
            f"{acc['FedAvg']:.1f}, mean over seeds)",
            acc["FedGMM"] > acc["FedEM"] > acc["FedAvg"],
        ),
        check(
            f"FedGMM accuracy >= {TARGET_FEDGMM_ACCURACY:.0f}% ({acc['FedGMM']:.1f}%, mean)",
            acc["FedGMM"] >= TARGET_FEDGMM_ACCURACY,
        ),
        check(
            f"FedGMM fit < {TARGET_FIT_SECONDS:.0f} s ({slowest:.1f} s, slowest seed)",
            slowest < TARGET_FIT_SECONDS,
        ),
    ]
    return "\n".join(
        [
            f"## 1. PFL classification ({settings.n_clients} clients, {settings.max_iter} "
            f"rounds, seeds {list(settings.seeds)})",
            "",
            "Personal test accuracy, sample-weighted over clients; mean ± std over seeds. "
            "Rounds include the federated k-means initialisation.",
            "",
            markdown_table(header, rows),
            "",
            "Paper Table 2 (synthetic row): 300 clients, 200 rounds, learning rate "
            "grid-searched; its other baselines: FedAvg+ 53.41, ClusteredFL 53.12, pFedMe 53.91. "
            f"Paper's reference code, 30 clients / 50 rounds: FedGMM {REFERENCE_CODE_FEDGMM:.1f}% "
            "(reported for that code, not re-run here).",
            "",
            *checks,
        ]
    )


# ----------------------------------------------------------------------------- experiment 2
def split_unseen(data: FederatedSplit, seed: int):
    """Training clients (a seeded 80%) and, per held-out client, adaptation/evaluation rows.

    Returns ``(train_clients, held_out)`` with ``held_out[c] = (X_adapt, y_adapt, X_eval,
    y_eval)`` from the client's pooled training and test rows, split 50/50.
    """
    rng = np.random.default_rng(seed)
    clients = np.unique(data.groups_train)
    n_train = round(TRAIN_CLIENT_SHARE * len(clients))
    order = rng.permutation(clients)
    train_clients, unseen = np.sort(order[:n_train]), np.sort(order[n_train:])
    held_out = {}
    for c in unseen:
        train, test = data.groups_train == c, data.groups_test == c
        X = np.vstack([data.X_train[train], data.X_test[test]])
        y = np.concatenate([data.y_train[train], data.y_test[test]])
        rows = rng.permutation(len(y))
        adapt, evaluate = rows[: len(y) // 2], rows[len(y) // 2 :]
        held_out[int(c)] = (X[adapt], y[adapt], X[evaluate], y[evaluate])
    return train_clients, held_out


def run_unseen_seed(data: FederatedSplit, settings: Settings, seed: int) -> dict[str, float]:
    train_clients, held_out = split_unseen(data, seed)
    train = np.isin(data.groups_train, train_clients)
    test = np.isin(data.groups_test, train_clients)
    models = {}
    for name in ("FedGMM", "FedEM", "FedAvg"):
        models[name] = make_model(name, settings, seed)
        timed_fit(models[name], data.X_train[train], data.y_train[train], data.groups_train[train])
    gmm, fedem, fedavg = models["FedGMM"], models["FedEM"], models["FedAvg"]
    predictions: dict[str, list] = {key: [] for key in UNSEEN_COLUMNS}
    for X_adapt, y_adapt, X_eval, y_eval in held_out.values():
        labelled = gmm.adapt(X_adapt, y_adapt)
        x_only = gmm.adapt(X_adapt)
        fedem_adapted = fedem.adapt(X_adapt, y_adapt)
        for key, pred in (
            ("FedGMM global", gmm.predict_y(X_eval)),
            ("FedGMM adapted (x, y)", gmm.predict_y(X_eval, client=labelled)),
            ("FedGMM adapted (x only)", gmm.predict_y(X_eval, client=x_only)),
            ("FedEM global", fedem.predict_y(X_eval)),
            ("FedEM adapted (x, y)", fedem.predict_y(X_eval, client=fedem_adapted)),
            ("FedAvg", fedavg.predict_y(X_eval)),
        ):
            predictions[key].append((pred, y_eval))
    result = {key: pooled_accuracy(parts) for key, parts in predictions.items()}
    result["FedGMM seen clients"] = personal_accuracy(
        gmm, data.X_test[test], data.y_test[test], data.groups_test[test]
    )
    summary = ", ".join(f"{k} {v:.1f}" for k, v in result.items())
    print(f"  seed {seed} ({len(train_clients)} train / {len(held_out)} unseen): {summary}")
    return result


UNSEEN_COLUMNS = (
    "FedGMM global",
    "FedGMM adapted (x, y)",
    "FedGMM adapted (x only)",
    "FedEM global",
    "FedEM adapted (x, y)",
    "FedAvg",
)


def unseen_report(per_seed: list[dict[str, float]], settings: Settings) -> str:
    keys = [*UNSEEN_COLUMNS, "FedGMM seen clients"]
    rows = [[key, mean_std([result[key] for result in per_seed])] for key in keys]
    n_train = round(TRAIN_CLIENT_SHARE * settings.n_clients)
    return "\n".join(
        [
            f"## 2. Unseen clients ({n_train} of {settings.n_clients} clients train, "
            f"{settings.max_iter} rounds, seeds {list(settings.seeds)})",
            "",
            "Accuracy % on the held-out clients' evaluation rows (50% of each one's rows; the "
            "other 50% adapt), sample-weighted; mean ± std over seeds. Last row (sanity): the "
            "same FedGMM on the training clients' test rows with their own weights.",
            "",
            markdown_table(["model / weights", "accuracy %"], rows),
            "",
            "Paper Table 5 reports FEMNIST and CIFAR-10/100 only (FedAvg / FedAvg+ / FedEM / "
            "FedGMM, e.g. FEMNIST 74.50 / 51.00 / 72.00 / 78.51); it has no synthetic numbers, "
            "so none are shown.",
        ]
    )


# ----------------------------------------------------------------------------- main
#: the script's two experiments on the seed's synthetic federation.
TABLES = PaperTables(
    title="FedGMM PFL benchmark (synthetic data)",
    data=lambda settings, seed: make_fedgmm_synthetic(settings.n_clients, random_state=seed),
    experiments=(
        Experiment("pfl", "PFL classification", run_pfl_seed, pfl_report),
        Experiment("unseen", "Unseen clients", run_unseen_seed, unseen_report),
    ),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_experiment(parser, TABLES)
    add_seeds(parser)
    parser.add_argument("--clients", type=int, default=30, help="number of clients (30)")
    parser.add_argument("--rounds", type=int, default=50, help="EM rounds, max_iter (50)")
    add_quick(parser, "8 clients, 5 rounds, 1 seed")
    add_threads(parser, help="torch threads (1)")
    add_out(parser, "also write the markdown report here")
    return parser.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = quick_seeds(args.seeds, args.quick)
    settings = Settings(8, 5, seeds) if args.quick else Settings(args.clients, args.rounds, seeds)
    command = command_line("fedgmm_pfl", argv)
    return run_paper_tables(TABLES, settings, args.experiment, command, args.quick, args.out)


if __name__ == "__main__":
    main()
