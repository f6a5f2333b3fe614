"""The default covariance prior on small data: scikit-learn's wine (13 features), 3 clients,
``FedGMMDetector`` with K = 1, 3, 5, 8, the defaults against ``Prior(strength=None)`` (plain)
and ``Prior(standardize=False)``. Novelty protocol: one class novel, 100 training rows of the
other two (fewer where they hold fewer), the test set their remaining rows and the novel
class; 5 seeds x 3 novel classes. Prints the mean AUROC (standard error over the 15 tasks) and
the components backed by at least one training row (``effective_n_components_``).

    python -m benchmarks.small_data_prior
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.datasets import load_wine
from sklearn.metrics import roc_auc_score

from fednovelty import FedGMMDetector, Prior

VARIANTS = {
    "default": {},
    "plain": {"prior": Prior(strength=None)},
    "no-std": {"prior": Prior(standardize=False)},
}


def task(X, y, seed: int, novel: int):
    """Training rows (n, 13), their 3 clients' ids (n,), test rows and their 0/1 labels."""
    rng = np.random.default_rng(seed)
    normal = rng.permutation(np.where(y != novel)[0])
    n_train = min(100, len(normal) - 10)
    test = np.r_[normal[n_train:], np.where(y == novel)[0]]
    labels = np.r_[np.zeros(len(normal) - n_train), np.ones(int((y == novel).sum()))]
    groups = np.array(["a", "b", "c"])[rng.integers(0, 3, n_train)]
    return X[normal[:n_train]], groups, X[test], labels


def main() -> None:
    warnings.simplefilter("ignore")
    X, y = load_wine(return_X_y=True)
    cells: dict[tuple[int, str], list[tuple[float, int]]] = {}
    for seed in range(5):
        for novel in range(3):
            train, groups, test, labels = task(X, y, seed, novel)
            for k in (1, 3, 5, 8):
                for name, params in VARIANTS.items():
                    if k == 1 and name != "default":
                        continue
                    det = FedGMMDetector(k, random_state=seed, **params).fit(train, groups=groups)
                    auroc = roc_auc_score(labels, det.decision_function(test))
                    cells.setdefault((k, name), []).append((auroc, det.effective_n_components_))
    print("K  prior    AUROC (s.e.)     components kept: mean [min-max]")
    for (k, name), values in sorted(cells.items()):
        a = np.array(values)
        se = a[:, 0].std(ddof=1) / np.sqrt(len(a))
        kept = f"{a[:, 1].mean():.2f} [{int(a[:, 1].min())}-{int(a[:, 1].max())}]"
        print(f"{k}  {name:8s} {a[:, 0].mean():.3f} ({se:.3f})    {kept}")


if __name__ == "__main__":
    main()
