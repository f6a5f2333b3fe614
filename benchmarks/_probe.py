"""What issue 7's probe scripts share: the scoreboard's task and the table of means over seeds."""

from __future__ import annotations

import pandas as pd

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
