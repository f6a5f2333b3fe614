"""The pFedEM paper's experiment on FEMNIST writers: digits (A) and letters (B) mixed by a
schedule that moves every round (Table I, Figs. 2-4), at a CPU scale or the paper's.

Run ``python -m benchmarks.pfedem_femnist`` (the CPU scale: 80 writers, 60 windows, 1 and 3
cycles, linear and cosine, seeds 0 1 2), ``--quick`` (a smoke run: 6 writers, 4 windows) or
``--paper-scale`` (the paper's Sec. IV-A for a GPU with ``--device cuda``: 80 writers, 200
rounds, 1 and 3 cycles, every method on the two-layer convolutional learner ``learner="cnn"``
at learning rate 0.01, J = 20 local iterations of batch 128: 20 local epochs of one batch of
the window's 50 rows). ``--writers``, ``--windows``, ``--cycles``, ``--seeds`` override the
scale's values; ``--out FILE``, ``--figure FILE``; ``--device cpu|cuda`` is where every model
trains and predicts (the report records it); ``--checkpoints DIR`` keeps each method's fit of
each schedule and seed, so that a stopped run resumes and runs of several pFedEM variants share
the baselines' fits.

pFedEM's algorithm: ours by default (each client's E-step from its own weights kept from the
last round, sub-models averaged with the hard counts ``|D_ik|``), or with
``--paper-algorithm`` the paper's as written (``PAPER_ALGORITHM``: Algorithm 1 line 5's
broadcast start and Eq. 5's ``p_i = |D_i| / sum_j |D_j|``; ``docs/papers/pfedem.md``).
``--gaussian-features input|backbone`` says what pFedEM's Gaussians model: the 24 federated
principal axes of the pixels (``input``, the default) or, as the paper, the features of
sub-model 0's layers before its class layer (``backbone``: ``gaussian_features="backbone"``,
no PCA). A linear learner has no such layers, so under ``backbone`` the CPU and quick scales
give every method the ``mlp`` learner (64 hidden units) with the same training; the paper
scale's ``cnn`` has 128 features. The report records both.

Data: ``writer_stream`` (``fednovelty.datasets.streams``): in window ``t`` every writer trains on
``rows`` of its own training images, a share ``schedule(t)`` of them digits (the paper's linear
cycle 0 -> 1 -> 0 or its cosine cycle), and is tested on ``test_rows`` of its own test images
mixed the same way. Images are standardised one by one (as ``fedgmm_femnist.py``). One window
is one communication round (the paper's round: ``partial_fit(..., rounds=1)``), after a first
window of both populations fitted for 3 rounds.

Methods (at the CPU and quick scales all linear learners, 2 local epochs of SGD at 0.2, batch
32; at every scale Gaussians on 24 federated principal axes of the pixels, where the paper's
model features of its backbone, diagonal covariances as the paper's, reg_covar 1e-4): pFedEM
(2 Gaussians and sub-models, the paper's Gaussian aggregation, Eq. 15), FedGMM (2 Gaussians,
2 learners), FedEM (2 learners), FedAvg. Reported, per schedule (linear and cosine, 1 and 3 cycles):
per-window test accuracy on two test sets (Fig. 3) - *matched* (each writer's test rows mixed as
its training window, predicted with its own weights) and *half* (a fixed set of half digits and
half letters, predicted with the global weights: the paper's Fig. 2 test set and Eq. 15
inference) - its standard deviation over the windows (Table I), the mean accuracy of the last
tenth of the windows on the half test set (Fig. 2), and pFedEM's mean weight on the digits'
Gaussian against the schedule (Fig. 4). The same settings serve every method at each scale.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from benchmarks.checkpoints import Checkpoints, settings_signature
from benchmarks.common import (
    Experiment,
    PaperTables,
    add_checkpoints,
    add_device,
    add_out,
    add_quick,
    add_seeds,
    add_threads,
    check,
    check_device,
    command_line,
    device_facts,
    markdown_table,
    mean_std,
    run_paper_tables,
    standardise_images,
    with_options,
)
from fednovelty import JointFedGMMDetector, PFedEMDetector
from fednovelty.datasets.femnist import make_femnist_federated
from fednovelty.datasets.streams import writer_stream
from fednovelty.federated.joint_models.pfedem import PAPER_ALGORITHM

METHODS = ("pFedEM", "FedGMM", "FedEM", "FedAvg")
KINDS = ("linear", "cosine")
#: pFedEM paper, Table I, EMNIST (standard deviation of per-round test accuracy, 3 cycles).
PAPER_TABLE1 = {
    "linear": {"FedAvg": 0.0318, "FedEM": 0.0316, "FedGMM": 0.0315, "pFedEM": 0.0296},
    "cosine": {"FedAvg": 0.0399, "FedEM": 0.0395, "FedGMM": 0.0393, "pFedEM": 0.0371},
}
COMMON = {
    "pca_components": 24,
    "covariance_type": "diag",
    "reg_covar": 1e-4,
    "max_iter": 3,
    "tol": 0.0,
    "dtype": "float32",
}
#: The learners' settings at each scale (``--paper-scale``: the paper's Sec. IV-A).
LEARNERS = {
    "cpu": {"learner": "linear", "local_epochs": 2, "learning_rate": 0.2, "batch_size": 32},
    "paper": {"learner": "cnn", "local_epochs": 20, "learning_rate": 0.01, "batch_size": 128},
}
#: (writers, windows, cycles) at each scale; rows per writer and window 50, test rows 20.
SCALES = {"quick": (6, 4, (1,)), "cpu": (80, 60, (1, 3)), "paper": (80, 200, (1, 3))}


@dataclass(frozen=True)
class Settings:
    n_writers: int
    n_windows: int
    cycles: tuple[int, ...]
    rows: int
    test_rows: int
    seeds: tuple[int, ...]
    scale: str = "cpu"
    device: str = "cpu"
    paper_algorithm: bool = False
    gaussian_features: str = "input"
    #: pFedEM's ``reg_covar`` (``--pfedem-reg-covar``; ``None``: the others', ``COMMON``'s).
    pfedem_reg_covar: float | None = None
    #: the folder of kept fits (``--checkpoints``; not part of the settings' signature).
    checkpoints: Path | None = None

    def options(self) -> dict:
        """Every method's detector settings at this scale and device (under ``backbone``
        features a linear learner becomes ``mlp``: it has no layers before its class layer)."""
        learners = dict(LEARNERS["paper" if self.scale == "paper" else "cpu"])
        if self.gaussian_features == "backbone" and learners["learner"] == "linear":
            learners["learner"] = "mlp"
        return {**COMMON, **learners, "device": self.device}


def make_model(name: str, seed: int, settings: Settings):
    options = with_options(settings.options())
    if name == "pFedEM":
        algorithm = PAPER_ALGORITHM if settings.paper_algorithm else {}
        if settings.gaussian_features == "backbone":  # the backbone's features, no PCA
            options = {**options, "pca_components": None, "gaussian_features": "backbone"}
        if settings.pfedem_reg_covar is not None:
            options = {**options, "reg_covar": settings.pfedem_reg_covar}
        return PFedEMDetector(2, random_state=seed, **options, **algorithm)
    sizes = {"FedGMM": (2, 2), "FedEM": (1, 2), "FedAvg": (1, 1)}[name]
    params = {**options, "n_components": sizes[0], "n_learners": sizes[1], "random_state": seed}
    return JointFedGMMDetector.pfl_baseline(name, **params)


def accuracy(det, window, personal: bool = True) -> float:
    """Share of ``window``'s rows predicted right: each writer with its own weights
    (``personal``) or every row with the global weights (the paper's Eq. 15 inference)."""
    X = standardise_images(window.X)
    if not personal:
        return float(np.mean(det.predict_y(X) == window.y))
    correct = sum(
        int((det.predict_y(X[window.groups == c], client=c) == window.y[window.groups == c]).sum())
        for c in np.unique(window.groups)
    )
    return correct / len(window.y)


def cells(settings: Settings, name: str) -> Checkpoints | None:
    """Where ``name``'s fits are kept (``--checkpoints``): pFedEM's under every setting, a
    baseline's under all but pFedEM's own (its algorithm and its Gaussians' features), so
    that runs of several pFedEM variants share the baselines' fits."""
    if settings.checkpoints is None:
        return None
    if name != "pFedEM":
        settings = dataclasses.replace(
            settings, paper_algorithm=False, gaussian_features="input", pfedem_reg_covar=None
        )
    fields = {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        # pFedEM's reg_covar unset is no setting (fits kept before it existed stay valid)
        if f.name != "checkpoints"
        and not (f.name == "pfedem_reg_covar" and getattr(settings, f.name) is None)
    }
    return Checkpoints(settings.checkpoints, settings_signature(fields))


def cell_key(kind: str, cycles: int, seed: int, name: str, settings: Settings) -> str:
    """A fit's checkpoint key: schedule, seed, method and learner; pFedEM's also names its
    Gaussians' features and its algorithm."""
    key = f"{kind}-x{cycles}-seed{seed}-{name}-{settings.options()['learner']}"
    if name == "pFedEM":
        key += f"-{settings.gaussian_features}-{'paper' if settings.paper_algorithm else 'ours'}"
        if settings.pfedem_reg_covar is not None:
            key += f"-reg{settings.pfedem_reg_covar:g}"
    return key


def run_method(name: str, stream: tuple, data, settings: Settings, seed: int) -> dict:
    """One method on the stream ``(first, train, test, half)``: its per-window accuracy on
    the window-matched test rows (own weights) and the half test set (global weights), and
    pFedEM's weight on the digits' Gaussian."""
    first, train, test, half = stream
    started = time.perf_counter()
    det = make_model(name, seed, settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 first-window rounds do not converge: expected
        det.fit(standardise_images(first.X), first.y, first.groups, classes=data.classes)
    digits = None
    if name == "pFedEM":
        comp = det.predict_components(standardise_images(first.X))
        share = [np.mean(first.y[comp == k] < 10) if (comp == k).any() else 0 for k in range(2)]
        digits = int(np.argmax(share))
    acc, acc_half, pi = [], [], []
    for w_train, w_test in zip(train, test, strict=True):
        det.partial_fit(standardise_images(w_train.X), w_train.y, w_train.groups, rounds=1)
        acc.append(accuracy(det, w_test))
        acc_half.append(accuracy(det, half, personal=False))
        if digits is not None:
            weights = np.diagonal(det.client_joint_weights_, axis1=1, axis2=2)
            pi.append(float(np.mean(weights[:, digits])))
    return {
        "acc": np.asarray(acc),
        "acc_half": np.asarray(acc_half),
        "pi": np.asarray(pi),
        "seconds": time.perf_counter() - started,
    }


def run(kind: str, cycles: int, data, settings: Settings, seed: int) -> dict:
    """Every method on one stream of the seed's writers ``data`` (:func:`run_method`); each
    method's fit read back from ``--checkpoints`` where it was kept (:func:`cells`)."""
    schedule = {"kind": kind, "cycles": cycles}
    train = writer_stream(
        data, settings.n_windows, **schedule, rows_per_window=settings.rows, random_state=seed
    )
    test = writer_stream(
        data,
        settings.n_windows,
        **schedule,
        rows_per_window=settings.test_rows,
        split="test",
        random_state=seed + 1,
    )
    first, half = (
        writer_stream(data, 1, kind="constant", constant=0.5, rows_per_window=n, split=split,
                      random_state=seed + offset)[0]
        for n, split, offset in ((settings.rows, "train", 2), (settings.test_rows, "test", 3))
    )  # fmt: skip
    out = {}
    for name in METHODS:
        compute = partial(run_method, name, (first, train, test, half), data, settings, seed)
        kept = cells(settings, name)
        key = cell_key(kind, cycles, seed, name, settings)
        out[name] = compute() if kept is None else kept.get(key, compute)
        print(f"  {kind} x{cycles} seed {seed} {name:7s} acc {np.mean(out[name]['acc']):.3f} "
              f"std {np.std(out[name]['acc']):.4f} | half {np.mean(out[name]['acc_half']):.3f} "
              f"std {np.std(out[name]['acc_half']):.4f} ({out[name]['seconds']:.0f} s)",
              flush=True)  # fmt: skip
    out["share"] = np.asarray([w.share for w in train])
    return out


def schedules(settings: Settings) -> list[tuple[str, int]]:
    return [(kind, cycles) for cycles in settings.cycles for kind in KINDS]


def fit_minutes(results: dict[str, list]) -> tuple[float, int]:
    """The fits' own minutes summed over every schedule, seed and method of ``results``
    (fits read back from ``--checkpoints`` with the seconds they took when they ran), and
    how many fits."""
    seconds = [
        run[name]["seconds"] for per_seed in results.values() for run in per_seed
        for name in METHODS if name in run
    ]  # fmt: skip
    return sum(seconds) / 60, len(seconds)


def intro(settings: Settings, results: dict[str, list] | None = None) -> str:
    """The section's heading, the run's learners and algorithm, the fits' own time (from
    ``results``, kept fits included: the header's total runtime is only this run's), what
    the tables show."""
    options = settings.options()
    backbone_width = {"mlp": "64 hidden units", "cnn": "128 dense units"}.get(options["learner"])
    algorithm = (
        "the paper's as written (Algorithm 1 line 5, Eq. 5's p_i: "
        + ", ".join(f"{k}={v!r}" for k, v in PAPER_ALGORITHM.items())
        + ")"
        if settings.paper_algorithm
        else "ours (estep_start='kept', submodel_weights='counts', gaussian_aggregation='paper')"
    )
    return "\n".join(
        [
            f"## Table I, Figs. 2-4 ({settings.n_writers} writers, {settings.n_windows} windows "
            f"of one round, {settings.rows} training rows per writer and window, seeds "
            f"{list(settings.seeds)})",
            "",
            f"- scale: {settings.scale}; device: {device_facts(settings.device)}",
            f"- learners: {options['learner']}, {options['local_epochs']} local epochs at "
            f"{options['learning_rate']}, batch {options['batch_size']}",
            f"- pFedEM's algorithm: {algorithm}",
            f"- pFedEM's Gaussians (--gaussian-features {settings.gaussian_features}): "
            + (
                f"the features of sub-model 0's layers before its class layer ({backbone_width})"
                if settings.gaussian_features == "backbone"
                else f"{COMMON['pca_components']} federated principal axes of the pixels"
            )
            + f"; the other methods' Gaussians: {COMMON['pca_components']} principal axes",
            f"- reg_covar: pFedEM {settings.pfedem_reg_covar or COMMON['reg_covar']:g}, the "
            f"others {COMMON['reg_covar']:g}",
            *(
                [
                    "- fit time: {:.1f} min over {} fits (each fit's own time, fits kept in "
                    "--checkpoints by earlier runs included)".format(*fit_minutes(results))
                ]
                if results
                else []
            ),
            "",
            "Standard deviation of the per-window test accuracy (Table I; the paper's EMNIST "
            "figures, for 3 cycles, beside) on two test sets: *matched*, each writer's test rows "
            "mixed as its training window, predicted with its own weights; *half*, a fixed test "
            "set of half digits and half letters predicted with the global weights (the paper's "
            "Fig. 2 test set and Eq. 15 inference). Final accuracy (Fig. 2): the half test set, "
            "mean of the last tenth of the windows.",
        ]
    )


def tail_of(settings: Settings) -> int:
    """Windows of the final accuracy: the last tenth (at least one)."""
    return max(1, settings.n_windows // 10)


def schedule_table(kind: str, cycles: int, runs: list[dict], settings: Settings) -> str:
    """One schedule's Table I rows and pFedEM's weight error (Fig. 4)."""
    tail = tail_of(settings)
    rows = []
    for name in METHODS:
        rows.append(
            [
                name,
                mean_std([float(np.std(r[name]["acc"])) for r in runs], 4),
                mean_std([float(np.std(r[name]["acc_half"])) for r in runs], 4),
                f"{PAPER_TABLE1[kind][name]:.4f}" if cycles == 3 else "",
                mean_std([100 * float(np.mean(r[name]["acc"])) for r in runs], 1),
                mean_std([100 * float(np.mean(r[name]["acc_half"][-tail:])) for r in runs], 1),
            ]
        )
    header = ["method", "std, matched", "std, half", "paper Table I", "mean acc % matched",
              "final acc % half"]  # fmt: skip
    pi_error = float(np.mean([np.abs(r["pFedEM"]["pi"] - r["share"]).mean() for r in runs]))
    return "\n".join(
        [f"**{kind}, {cycles} cycle(s)**", "", markdown_table(header, rows), "",
         f"pFedEM's mean weight on the digits' Gaussian vs the schedule (Fig. 4): mean "
         f"absolute error {pi_error:.3f}."]
    )  # fmt: skip


def schedule_checks(kind: str, cycles: int, runs: list[dict], settings: Settings) -> list[str]:
    """One schedule's checks: pFedEM the most stable on each test set, its final accuracy."""
    tail = tail_of(settings)
    checks = []
    for test, key in (("matched", "acc"), ("half", "acc_half")):
        std = {n: float(np.mean([np.std(r[n][key]) for r in runs])) for n in METHODS}
        checks.append(check(
            f"{kind} x{cycles}: pFedEM the most stable on the {test} test set (std "
            f"{std['pFedEM']:.4f} vs " + ", ".join(f"{n} {std[n]:.4f}" for n in METHODS[1:])
            + ")",
            all(std["pFedEM"] <= std[n] for n in METHODS[1:]),
        ))  # fmt: skip
    final = {n: float(np.mean([np.mean(r[n]["acc_half"][-tail:]) for r in runs])) for n in METHODS}
    checks.append(check(
        f"{kind} x{cycles}: pFedEM final accuracy >= the others ({100 * final['pFedEM']:.1f}"
        " vs " + ", ".join(f"{n} {100 * final[n]:.1f}" for n in METHODS[1:]) + ")",
        all(final["pFedEM"] >= final[n] for n in METHODS[1:]),
    ))  # fmt: skip
    return checks


def schedule_name(kind: str, cycles: int) -> str:
    return f"{kind} x{cycles}"


def tables(settings: Settings) -> PaperTables:
    """One experiment per schedule, all on the seed's writers."""
    return PaperTables(
        title="pFedEM on FEMNIST digits and letters",
        data=lambda settings, seed: make_femnist_federated(settings.n_writers, random_state=seed),
        experiments=tuple(
            Experiment(
                schedule_name(kind, cycles),
                f"{kind}, {cycles} cycle(s)",
                partial(run, kind, cycles),
                partial(schedule_table, kind, cycles),
            )
            for kind, cycles in schedules(settings)
        ),
    )


def by_schedule(results: dict[str, list], settings: Settings) -> dict[tuple[str, int], list]:
    return {key: results[schedule_name(*key)] for key in schedules(settings)}


def figure(results: dict[tuple[str, int], list[dict]], settings: Settings, path: Path) -> None:
    """Per schedule (columns): per-window accuracy on the matched test set (Fig. 3), on the
    half test set, and pFedEM's digit weight against the schedule (Fig. 4); seed 0's run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = schedules(settings)
    fig, axes = plt.subplots(3, len(cols), figsize=(4.2 * len(cols), 8), sharex=True, squeeze=False)
    for col, key in enumerate(cols):
        run = results[key][0]
        for name in METHODS:
            axes[0, col].plot(100 * run[name]["acc"], label=name, lw=1)
            axes[1, col].plot(100 * run[name]["acc_half"], label=name, lw=1)
        axes[0, col].set_title(f"{key[0]}, {key[1]} cycle(s), seed {settings.seeds[0]}")
        axes[2, col].plot(run["share"], "k:", label="true share of digits")
        axes[2, col].plot(run["pFedEM"]["pi"], label="pFedEM weight on the digits' Gaussian")
        axes[2, col].set_xlabel("window (= round)")
        axes[2, col].set_ylim(-0.02, 1.02)
    axes[0, 0].set_ylabel("accuracy %, matched test")
    axes[1, 0].set_ylabel("accuracy %, half test")
    axes[2, 0].set_ylabel("share of digits")
    axes[0, 0].legend(fontsize=8)
    axes[2, 0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    scale = parser.add_mutually_exclusive_group()
    add_quick(parser, group=scale)
    scale.add_argument(
        "--paper-scale",
        action="store_true",
        help="the paper's Sec. IV-A (80 writers, 200 rounds, CNN, lr 0.01, J = 20 iterations "
        "of batch 128): for a GPU with --device cuda",
    )
    parser.add_argument(
        "--paper-algorithm",
        action="store_true",
        help="pFedEM as the paper writes it (PAPER_ALGORITHM: Algorithm 1 line 5, Eq. 5)",
    )
    parser.add_argument(
        "--gaussian-features",
        choices=("input", "backbone"),
        default="input",
        help="what pFedEM's Gaussians model: the pixels' 24 principal axes (input) or the "
        "paper's backbone features (backbone: every method's learner mlp at the CPU and "
        "quick scales)",
    )
    add_device(parser)
    parser.add_argument("--writers", type=int, default=None, help="default: the scale's")
    parser.add_argument("--windows", type=int, default=None, help="default: the scale's")
    parser.add_argument("--cycles", type=int, nargs="+", default=None)
    add_seeds(parser)
    add_threads(parser)
    add_out(parser)
    parser.add_argument(
        "--pfedem-reg-covar",
        type=float,
        default=None,
        help="pFedEM's reg_covar alone (default: the others', 1e-4): the backbone's ReLU "
        "features need a floor at their own scale",
    )
    add_checkpoints(parser, help="keep each method's finished fit in DIR; a later run resumes")
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    args.scale = "quick" if args.quick else "paper" if args.paper_scale else "cpu"
    return args


def build_settings(args) -> Settings:
    """The run's :class:`Settings`: the scale's writers, windows and cycles
    (:data:`SCALES`) under the explicit flags; ``--quick`` keeps its own and one seed."""
    writers, windows, cycles = SCALES[args.scale]
    common = {
        "scale": args.scale,
        "device": args.device,
        "paper_algorithm": args.paper_algorithm,
        "gaussian_features": args.gaussian_features,
        "pfedem_reg_covar": args.pfedem_reg_covar,
        "checkpoints": args.checkpoints,
    }
    if args.quick:
        return Settings(writers, windows, cycles, 40, 10, (args.seeds[0],), **common)
    return Settings(
        writers if args.writers is None else args.writers,
        windows if args.windows is None else args.windows,
        cycles if args.cycles is None else tuple(args.cycles),
        50,
        20,
        tuple(args.seeds),
        **common,
    )


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = build_settings(args)
    command = command_line("pfedem_femnist", argv)

    def checks(results):  # the figure, then every schedule's checks
        runs = by_schedule(results, settings)
        if args.figure is not None:
            figure(runs, settings, args.figure)
        lines = [
            c for key, per_seed in runs.items() for c in schedule_checks(*key, per_seed, settings)
        ]
        return ["\n".join(lines)]

    return run_paper_tables(
        tables(settings),
        settings,
        "all",
        command,
        args.quick,
        args.out,
        intro=lambda results: intro(settings, results),
        after=checks,
    )


if __name__ == "__main__":
    main()
