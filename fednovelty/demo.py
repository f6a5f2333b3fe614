"""The main job on the embedded engine: federated novelty detection on a real dataset.

``fednovelty demo`` (``make demo``) builds one benchmark task
(:func:`~fednovelty.datasets.protocols.make_task`) from an ADBench dataset in ``../shared/data``
(Forest Covertype, ``10_cover``, by default): the FedGenGMM paper's *novelty* protocol (the
anomalies never reach training), the training inliers split among heterogeneous clients
(Dirichlet(alpha) over k-means clusters: feature-distribution skew), features min-max scaled
with the range merged from the clients' own minima and maxima. It trains the registry's
methods of ``DEMO_METHODS`` (:mod:`fednovelty.methods`) and prints AUROC / AUC-PR / rounds /
bytes against centralized EM on the pooled rows (the papers' "ideal") and PyOD's IForest.

Without the data folder (a package installed from a wheel has no ``../shared``) the demo runs
on scikit-learn's bundled handwritten digits (``make_task("digits")``: digit 0 the novel class,
clients by Dirichlet(alpha) over the other digits), which ship inside scikit-learn, and says so.
"""

from __future__ import annotations

import time

import pandas as pd

from fednovelty.datasets.loaders import data_dir as find_data_dir
from fednovelty.datasets.protocols import BUNDLED_DIGITS, DIGITS_NOVEL, make_task
from fednovelty.evaluation import aupr_out, auroc
from fednovelty.methods import get_method
from fednovelty.runtime.progress import progress_bar, show_progress

#: The demo's methods (registry names) and their labels in the table.
DEMO_METHODS: tuple[tuple[str, str], ...] = (
    ("FedGenGMM", "FedGenGMM"),
    ("DEM-kmeans", "DEM-kmeans (global weights)"),
    ("FedGMM", "FedGMM (personal weights)"),
    ("Local", "Local (mixture of client GMMs)"),
    ("CentralGMM", "CentralGMM (pooled data)"),
    ("IForest", "IForest (pooled data, PyOD)"),
)


#: The demo's dataset when the data folder is there.
DEFAULT_DATASET = "10_cover"


def demo_dataset(dataset: str | None, data_dir=None) -> tuple[str, str]:
    """The dataset the demo runs and, when it is not the one asked for, why.

    ``dataset`` None means the default: ``DEFAULT_DATASET`` when the data folder exists, else
    the bundled digits (the reason names the folder that was not found). A dataset given by
    name, or any dataset with an explicit ``data_dir``, is returned as it is (a missing folder
    then stops the run with the loader's error).
    """
    if dataset is not None:
        return dataset, ""
    if data_dir is not None:
        return DEFAULT_DATASET, ""
    try:
        find_data_dir(data_dir)
    except FileNotFoundError as missing:
        return BUNDLED_DIGITS, (
            f"{missing} Running on scikit-learn's bundled handwritten digits instead "
            "(1,797 8x8 images shipped with scikit-learn; --dataset names another)."
        )
    return DEFAULT_DATASET, ""


def demo_settings(dataset: str) -> dict:
    """Default clients and components of the demo for ``dataset``, and how its header
    describes the client split (a format string with ``{alpha}``) and the novel rows."""
    if dataset.partition(":")[0] == "femnist":
        return {
            "n_clients": 20,
            "n_components": 15,
            "split": "its writers (each writer a client)",
            "novel": "half of the writers' test images, scaled, rotated or flipped",
        }
    if dataset.partition(":")[0] == BUNDLED_DIGITS:
        return {
            "n_clients": 10,
            "n_components": 5,
            "split": "Dirichlet({alpha}) over digits",
            "novel": f"every image of digit {DIGITS_NOVEL}",
        }
    return {
        "n_clients": 20,
        "n_components": 15,
        "split": "Dirichlet({alpha}) over k-means clusters",
        "novel": "ADBench anomalies",
    }


def run_demo(
    dataset: str = "10_cover",
    *,
    n_clients: int = 20,
    alpha: float = 0.5,
    n_components: int = 15,
    random_state: int = 0,
    data_dir=None,
    max_train: int | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Train every method of ``DEMO_METHODS`` on one novelty task and return the results table.

    The task is :func:`~fednovelty.datasets.protocols.make_task`'s novelty protocol with a
    Dirichlet(``alpha``) partition over k-means clusters; ``random_state`` seeds the task and
    the methods. Columns: method, AUROC, AUC-PR (novel = positive class), rounds, MB up
    (clients -> server, all rounds), MB down, fit seconds. Pooled rows have no rounds or bytes.
    """
    task = make_task(
        dataset,
        "novelty",
        n_clients=n_clients,
        alpha=alpha,
        seed=random_state,
        data_dir=data_dir,
        max_train=max_train,
    )
    rows = []
    bar = progress_bar(total=len(DEMO_METHODS), desc="demo", unit="method", enabled=progress)
    progress = show_progress(progress)
    for name, label in DEMO_METHODS:
        bar.set_postfix_str(label)
        method = get_method(name)
        shown = {"progress": progress} if "progress" in method.parameters() else {}
        detector = method.build(
            **method.shared_params(n_components=n_components, random_state=random_state), **shown
        )
        started = time.perf_counter()
        if method.fits_clients:
            detector.fit(task.X_train, groups=task.groups_train)
        else:  # one holder of every row: a mixture's EM on the pooled data
            detector.fit(task.X_train)
        seconds = time.perf_counter() - started
        scores = detector.decision_function(task.X_test)
        traffic = (
            (detector.n_rounds_, detector.bytes_up_, detector.bytes_down_)
            if method.fits_clients
            else (0, 0, 0)
        )
        rows.append(_row(label, task.y_test, scores, *traffic, seconds))
        bar.update(1)
    bar.close()
    return pd.DataFrame(rows)


def _row(name, y, scores, rounds, up, down, seconds) -> dict:
    return {
        "method": name,
        "AUROC": auroc(y, scores),
        "AUC-PR": aupr_out(y, scores),
        "rounds": rounds,
        "MB up": up / 1e6,
        "MB down": down / 1e6,
        "fit s": seconds,
    }


def format_table(table: pd.DataFrame) -> str:
    """Plain-text table with fixed decimals."""
    return table.to_string(
        index=False,
        formatters={
            "AUROC": "{:.4f}".format,
            "AUC-PR": "{:.4f}".format,
            "MB up": "{:.3f}".format,
            "MB down": "{:.3f}".format,
            "fit s": "{:.1f}".format,
        },
    )
