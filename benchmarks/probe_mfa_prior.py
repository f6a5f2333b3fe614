"""Probe: FedMFADetector with the noise prior (n_features + 2 pseudo-rows at 4 x the pooled
variance), K = 10, on the scoreboard tasks (25 sets, seeds 0-1, both protocols).
Run: python benchmarks/probe_mfa_prior.py OUT.jsonl"""
import sys, json, time, warnings, numpy as np, torch
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
from sklearn.metrics import roc_auc_score
from fednovelty.datasets import list_adbench
from fednovelty.datasets.protocols import make_task
from fednovelty import FedMFADetector
out = open(sys.argv[1], "a")
variants = {
    "prior4": dict(prior_strength="auto", prior_scale=4.0),
}
for seed in [0, 1]:
    for proto in ["novelty", "outlier"]:
        for name in list_adbench():
            task = make_task(name, proto, n_clients=10, alpha=0.5, seed=seed, max_train=10000, max_test=10000)
            for v, kw in variants.items():
                t = time.time()
                try:
                    d = FedMFADetector(n_components=10, random_state=seed, **kw).fit(task.X_train, groups=task.groups_train)
                    a = roc_auc_score(task.y_test, d.decision_function(task.X_test))
                except Exception as e:
                    a = float("nan")
                out.write(json.dumps(dict(v=v, seed=seed, proto=proto, ds=name, auroc=a, t=time.time() - t)) + "\n"); out.flush()
