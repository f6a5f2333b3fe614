"""Time per round and per run of every algorithm of the Flower app, at 3 and 10 nodes.

A SuperLink and ``n`` SuperNodes run on 127.0.0.1 (``fednovelty.runtime.flower.deploy.
LocalFederation``, insecure loopback; one federation per node count, reused by every
algorithm), and ``examples/flower`` (copied) is started with ``flwr run`` once per
algorithm. Data: ADBench Forest Covertype (``10_cover``, 10 features), its rows shuffled
(seed 0), the first ``n x ROWS`` min-max scaled over those rows and split into ``n``
contiguous blocks of ``ROWS`` rows (run config ``data-path``, node config ``partition-id``
and ``num-partitions``); ADBench's label (1 = anomaly, about 1 % of the rows) is the joint
model's class.

Algorithms (``K = 5`` full-covariance components; every iterative one from k-means with one
Lloyd round, ``kmeans_rounds = 1``, then ``MAX_ITER`` rounds of its own with ``tol = 0``):
``FederatedEM`` (k-means: a centroids round and an assign round, then EM), ``FedGenGMM``
(one round: local fits over ``k_range = [1, 5]``), ``FederatedVB`` (a prior-moments round,
k-means, the posterior's first round, then VB), ``FederatedVBOneShot`` (prior moments, then
one round of local VB fits), ``JointFedGMM`` (k-means, then joint EM rounds with linear
learners, 2 classes) and ``LocalGMMs`` (one round of local fits).

Columns: rounds run; seconds per round (the ServerApp's wall time of a round,
``RoundRecord.seconds``: the push, every node's ClientApp start and client step, the pull
and the server step; mean, min and max over the run's rounds); the run's total (``flwr run``
start to result, ``LocalFederation.run_app``) and its fixed part (total minus the rounds:
building and installing the app, starting the ServerApp, waiting for the nodes, writing the
result). Each node count's federation start (SuperLink ``/health`` and the SuperNodes
launched) and stop are timed apart. A run with other settings costs about fixed part +
rounds x seconds per round; Flower starts a ClientApp process for every message, so the
rounds, not the arithmetic, set the time.

Options: ``--quick`` (3 nodes of 500 rows, ``FederatedEM`` with ``max_iter = 1`` and
``FedGenGMM``; a smoke run of about 2 minutes), ``--nodes`` (node counts, default 3 10),
``--rows`` (rows per node, default 3,000), ``--max-iter`` (default 1), ``--few-rounds``
(only :data:`FEW_ROUNDS`, the one-shot start with SQUAREM rounds; default report
``benchmarks/flower_few_rounds.txt``), ``--preload`` (``off``: Flower's own ClientApp and
ServerApp executables, the default; ``on``: ``LocalFederation(preload=True)``, each started
by forking a process that imported Flower, torch and fednovelty once; ``both``: each node
count twice, with a table of the two side by side and their ratios, including the CPU
seconds the whole machine spent during each run, from ``/proc/stat``), ``--out`` (default
``benchmarks/flower_rounds.txt``; a quick run writes no file unless given one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import add_quick, emit_report, report_header
from fednovelty.runtime.flower.deploy import LocalFederation

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "flower"
DATA = ROOT.parent / "shared" / "data" / "adbench" / "10_cover.npz"
OUT = Path(__file__).resolve().parent / "flower_rounds.txt"
K = 5
ROWS = 3_000
MAX_ITER = 1
QUICK_ALGORITHMS = ("FederatedEM", "FedGenGMM")
#: the few-round fits (``--few-rounds``): federated EM from the one-shot start with SQUAREM
#: on the server, the registry's DEM-oneshot settings (standardisation, covariance prior of
#: d + 2 = 12 pseudo-rows, global weights), 1 and 2 EM rounds.
DEM_ONESHOT = {
    "n_components": K,
    "mixture_weights": "global",
    "init_params": "oneshot",
    "acceleration": "squarem",
    "standardize": True,
    "prior_strength": 12.0,
    "prior_scale": 4.0,
    "tol": 0.0,
}
FEW_ROUNDS = {
    f"FederatedEM:DEM-oneshot, {rounds} EM": {**DEM_ONESHOT, "max_iter": rounds}
    for rounds in (1, 2)
}


def algorithm_params(max_iter: int) -> dict[str, dict]:
    """Registry name -> ``algorithm-params`` of every algorithm benchmarked."""
    kmeans = {"init_params": "kmeans", "kmeans_rounds": 1, "max_iter": max_iter, "tol": 0.0}
    return {
        "FederatedEM": {"n_components": K, **kmeans},
        "FedGenGMM": {"n_components": K, "k_range": [1, K]},
        "FederatedVB": {"n_components": K, **kmeans},
        "FederatedVBOneShot": {"n_components": K},
        "JointFedGMM": {"n_components": K, "n_learners": K, "n_classes": 2, **kmeans},
        "LocalGMMs": {"n_components": K, "k_range": [1, K]},
    }


#: algorithms whose nodes read labelled rows (``.npz`` with ``X`` and ``y``).
LABELLED = {"JointFedGMM"}


@dataclass(frozen=True)
class Run:
    """One ``flwr run``: algorithm, nodes, the rounds' kinds and seconds, the total."""

    algorithm: str
    nodes: int
    kinds: tuple[str, ...]
    round_seconds: tuple[float, ...]
    total: float
    preload: bool = False
    cpu: float = float("nan")  # busy CPU seconds of the whole machine during the run

    @property
    def fixed(self) -> float:
        return self.total - sum(self.round_seconds)


def covertype(n_rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n_rows`` shuffled Covertype rows, min-max scaled over themselves, (n_rows, 10), and
    their ADBench labels (n_rows,) int64."""
    with np.load(DATA) as archive:
        X, y = archive["X"].astype(np.float64), archive["y"].astype(np.int64)
    if n_rows > len(X):
        raise ValueError(f"rows: {n_rows} asked, Covertype has {len(X)}; lower --rows.")
    pick = np.random.default_rng(seed).permutation(len(X))[:n_rows]
    X, y = X[pick], y[pick]
    low, span = X.min(axis=0), np.ptp(X, axis=0)
    return (X - low) / np.where(span > 0, span, 1.0), y


def uptime() -> str:
    """``uptime``'s line (the load averages over 1, 5 and 15 minutes)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "(uptime not available)"


def busy_cpu_seconds() -> float:
    """CPU seconds the machine has spent busy since boot (all cores; ``/proc/stat``: user,
    nice, system, irq and softirq), NaN where there is no ``/proc/stat``."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return float("nan")
    user, nice, system, _, _, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run_nodes(
    n_nodes: int,
    rows: int,
    params: dict[str, dict],
    work: Path,
    log: list[str],
    preload: bool = False,
) -> list[Run]:
    """Start ``n_nodes`` nodes (``preload``: :class:`LocalFederation`'s), run every algorithm
    of ``params`` once, stop them; the runs. Start, stop and the load are appended to
    ``log``."""
    X, y = covertype(n_nodes * rows)
    unlabelled, labelled = work / "rows.npy", work / "rows.npz"
    np.save(unlabelled, X)
    np.savez(labelled, X=X, y=y)
    app = work / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    configs = [{"partition-id": i, "num-partitions": n_nodes} for i in range(n_nodes)]
    federation = LocalFederation(configs, workdir=work / "deployment", preload=preload)
    label = f"{n_nodes} nodes{', preload' if preload else ''}"
    log.append(f"- {label}, before: `{uptime()}`")
    runs: list[Run] = []
    started = time.perf_counter()
    try:
        federation.start()
        log.append(f"- {label}: federation start {time.perf_counter() - started:.1f} s")
        for name, settings in params.items():
            data = labelled if name in LABELLED else unlabelled
            run_config = {
                "algorithm": name.split(":")[0],  # "Algorithm:label" names a setting
                "algorithm-params": json.dumps(settings),
                "num-nodes": n_nodes,
                "min-clients": n_nodes,
                "data-path": str(data),
            }
            began, cpu = time.perf_counter(), busy_cpu_seconds()
            result = federation.run_app(app, run_config, timeout=1800)
            total, cpu = time.perf_counter() - began, busy_cpu_seconds() - cpu
            history = [r for r in result.history if not r.failed]
            runs.append(
                Run(
                    name,
                    n_nodes,
                    tuple(r.kind for r in history),
                    tuple(r.seconds for r in result.history),
                    total,
                    preload,
                    cpu,
                )
            )
            print(row(runs[-1]), flush=True)
    finally:
        stopping = time.perf_counter()
        federation.stop()
        log.append(f"- {label}: stop {time.perf_counter() - stopping:.1f} s")
        log.append(f"- {label}, after: `{uptime()}`")
    return runs


HEADER = (
    "| algorithm | nodes | preload | rounds | s per round (mean) | min-max | fixed s | total s | "
    "machine CPU s | rounds' kinds |\n|---|---|---|---|---|---|---|---|---|---|"
)
COMPARISON = (
    "| algorithm | nodes | s per round: Flower's | preload | ratio | total s: Flower's | "
    "preload | ratio | machine CPU s: Flower's | preload | ratio |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(run: Run) -> str:
    """One markdown table row of ``run``."""
    seconds = np.asarray(run.round_seconds)
    kinds = ", ".join(f"{k} x{run.kinds.count(k)}" for k in dict.fromkeys(run.kinds))
    return (
        f"| {run.algorithm} | {run.nodes} | {'on' if run.preload else 'off'} | {len(seconds)} | "
        f"{seconds.mean():.1f} | {seconds.min():.1f}-{seconds.max():.1f} | {run.fixed:.1f} | "
        f"{run.total:.1f} | {run.cpu:.0f} | {kinds} |"
    )


def comparison(runs: list[Run]) -> str:
    """The runs with Flower's executables beside those with preload, with the ratios
    (preload / Flower's); empty when the runs hold only one of the two."""
    pairs = {(r.algorithm, r.nodes, r.preload): r for r in runs}
    rows = []
    for (name, nodes, preload), plain in pairs.items():
        fast = pairs.get((name, nodes, True))
        if preload or fast is None:
            continue
        a, b = np.mean(plain.round_seconds), np.mean(fast.round_seconds)
        rows.append(
            f"| {name} | {nodes} | {a:.1f} | {b:.1f} | {b / a:.2f} | {plain.total:.1f} | "
            f"{fast.total:.1f} | {fast.total / plain.total:.2f} | {plain.cpu:.0f} | "
            f"{fast.cpu:.0f} | {fast.cpu / plain.cpu:.2f} |"
        )
    return "\n".join([COMPARISON, *rows]) if rows else ""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick(parser, "3 nodes, 500 rows, 2 algorithms")
    parser.add_argument("--nodes", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--rows", type=int, default=ROWS, help="rows per node")
    parser.add_argument("--max-iter", type=int, default=MAX_ITER)
    parser.add_argument(
        "--few-rounds", action="store_true", help="only the few-round fit (FEW_ROUNDS)"
    )
    parser.add_argument(
        "--preload",
        choices=("off", "on", "both"),
        default="off",
        help="Flower's own ClientApp starts, forks of a preloaded process, or both",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"report file (default {OUT.name}; none with --quick)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(1)
    nodes, rows, max_iter = args.nodes, args.rows, args.max_iter
    params = algorithm_params(max_iter)
    if args.quick:
        nodes, rows, max_iter = [3], 500, 1
        params = {n: p for n, p in algorithm_params(max_iter).items() if n in QUICK_ALGORITHMS}
    if args.few_rounds:
        params = FEW_ROUNDS
    start = time.perf_counter()
    log: list[str] = [f"- start: `{uptime()}`"]
    print(HEADER, flush=True)
    runs: list[Run] = []
    modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.preload]
    with tempfile.TemporaryDirectory(prefix="flower_rounds_") as folder:
        for n in nodes:
            for preload in modes:
                work = Path(folder) / f"nodes{n}{'-preload' if preload else ''}"
                work.mkdir()
                runs += run_nodes(n, rows, params, work, log, preload)
    command = "python -m benchmarks.flower_rounds" + (" --quick" if args.quick else "")
    command += f" --preload {args.preload}" if args.preload != "off" else ""
    notes = (
        f"flwr 1.41 on 127.0.0.1 (insecure loopback), ADBench Covertype, {rows} rows of 10 "
        f"features per node, K = {K} full-covariance components; "
        + (
            "the one-shot start (moments and local-fit rounds), then 1 or 2 EM rounds with "
            "SQUAREM (tol = 0). "
            if args.few_rounds
            else f"iterative algorithms: k-means init with 1 Lloyd round, then max_iter = "
            f"{max_iter} rounds (tol = 0). "
        )
        + "'s per round': the ServerApp's wall time per round (RoundRecord.seconds); "
        "'fixed s': the run's total minus its rounds (app build and install, ServerApp "
        "start, waiting for the nodes, writing the result); 'total s': flwr run start to "
        "the result file. Every message starts a ClientApp process on its node, so the "
        "time per round grows with the nodes sharing the machine's cores."
    )
    report = "\n\n".join(
        [
            report_header(
                "Flower: time per round and per run",
                command,
                args.quick,
                time.perf_counter() - start,
            ),
            "\n".join(log),
            notes,
            "\n".join([HEADER, *(row(r) for r in runs)]),
            comparison(runs),
        ]
    )
    out = args.out if args.out is not None or args.quick else OUT
    if args.few_rounds and args.out is None:
        out = OUT.with_name("flower_few_rounds.txt")
    return emit_report(report + "\n", out)


if __name__ == "__main__":
    main()
