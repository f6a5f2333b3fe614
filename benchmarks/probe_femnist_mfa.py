"""Probe: FedMFADetector (isotropic noise, q = 10) on FEMNIST writers, transforms set.

100 writers, seeds 0 1 2, the task's polar features (make_task("femnist:transforms")), K in
{10, 20, 40, 60}, 20 or 50 rounds of factor EM, against PyOD's KNN on the pooled rows.
Run: python benchmarks/probe_femnist_mfa.py
"""
import time
import warnings

import torch
from pyod.models.knn import KNN
from sklearn.metrics import roc_auc_score

from fednovelty import FedMFADetector
from fednovelty.datasets.protocols import make_task

warnings.simplefilter("ignore")
torch.set_num_threads(1)
for seed in (0, 1, 2):
    task = make_task("femnist:transforms", n_clients=100, alpha=None, seed=seed)
    knn = KNN().fit(task.X_train).decision_function(task.X_test)
    print(seed, "KNN", round(100 * roc_auc_score(task.y_test, knn), 2), flush=True)
    for k, rounds in ((10, 20), (20, 20), (40, 20), (60, 20), (40, 50), (60, 50)):
        started = time.time()
        det = FedMFADetector(n_components=k, max_iter=rounds, random_state=seed)
        det.fit(task.X_train, groups=task.groups_train)
        auc = 100 * roc_auc_score(task.y_test, det.decision_function(task.X_test))
        print(seed, f"K={k} rounds={rounds}", round(auc, 2), round(time.time() - started, 1))
