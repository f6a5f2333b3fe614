"""What issue 7's probe scripts share: the scoreboard's task and the table of means over seeds."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import torch

from fednovelty.datasets import list_adbench
from fednovelty.datasets.protocols import Task, make_task

N_CLIENTS = 10


def scoreboard_task(name: str, protocol: str, seed: int, data_dir=None) -> Task:
    """The README scoreboard's task: 10 clients, Dirichlet(0.5), at most 10,000 rows each way."""
    return make_task(
        name,
        protocol,
        n_clients=N_CLIENTS,
        alpha=0.5,
        seed=seed,
        data_dir=data_dir,
        max_train=10_000,
        max_test=10_000,
    )


def probe_parser(description: str, out: Path) -> argparse.ArgumentParser:
    """The options every probe takes: --protocol, --seeds, --datasets, --data-dir, --out."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--protocol", default="outlier", choices=("outlier", "novelty"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--datasets", nargs="+", default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, default=out)
    return parser


def probe_tasks(args: argparse.Namespace) -> Iterator[tuple[str, int, Task]]:
    """``(dataset, seed, task)`` for every seed and dataset of ``args`` (all ADBench sets when
    none are named), one torch thread, and a line with each seed's time."""
    torch.set_num_threads(1)
    datasets = args.datasets or list_adbench(args.data_dir)
    for seed in args.seeds:
        start = time.perf_counter()
        for name in datasets:
            yield name, seed, scoreboard_task(name, args.protocol, seed, args.data_dir)
        print(f"seed {seed}: {len(datasets)} datasets in {time.perf_counter() - start:.0f} s")


def print_seed_means(df: pd.DataFrame, key: str, protocol: str) -> pd.DataFrame:
    """Print and return the mean AUROC over datasets of every ``key`` value per seed, their
    mean, and (with several seeds) its standard error over seeds; rows in first-seen order."""
    means = df.groupby([key, "seed"])["auroc"].mean().unstack("seed")
    per_seed = means.copy()
    means["mean"] = per_seed.mean(axis=1)
    if per_seed.shape[1] > 1:  # the standard error of the mean over seeds
        means["s.e."] = per_seed.std(axis=1, ddof=1) / per_seed.shape[1] ** 0.5
    means = means.loc[list(dict.fromkeys(df[key]))]
    print(f"mean AUROC over {df['dataset'].nunique()} datasets ({protocol} protocol)")
    print(means.round(4).to_string())
    return means
