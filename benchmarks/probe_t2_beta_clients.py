"""Probe (removed in the next commit): FedGMM Table 2 at the paper's scale, the Beta clients
one by one, from the run's cached fits (benchmarks/results/papers/checkpoints/
fedgmm_t2_reference_data): each Beta client's personal test accuracy per method beside the
share of its majority label, and the Beta rows' share of the training rows.

Run: python -m benchmarks.probe_t2_beta_clients
"""

import pickle

import numpy as np

from benchmarks.fedgmm_pfl import Settings, beta_clients, make_data

FOLDER = "benchmarks/results/papers/checkpoints/fedgmm_t2_reference_data"
settings = Settings(300, 200, (0, 1, 2), data="reference")
beta = beta_clients(settings)
constant = {m: 0 for m in ("FedGMM", "FedEM", "FedAvg")}
for seed in settings.seeds:
    data = make_data(settings, seed)
    share = np.isin(data.groups_train, beta).mean()
    print(f"seed {seed}: Beta rows {100 * share:.1f} % of {data.groups_train.size} training rows")
    for c in beta:
        y = data.y_test[data.groups_test == c]
        majority = 100 * max(np.mean(y == 0), np.mean(y == 1))
        acc = {}
        for m in ("FedGMM", "FedEM", "FedAvg", "Local"):
            with open(f"{FOLDER}/pfl-seed{seed}-{m}.pkl", "rb") as f:
                right, rows = pickle.load(f)["value"]["per_client"][int(c)]
            acc[m] = 100 * right / rows
            if m in constant and min(abs(acc[m] - majority), abs(acc[m] - 100 + majority)) < 1e-9:
                constant[m] += 1
        line = " ".join(f"{m} {v:5.1f}" for m, v in acc.items())
        print(f"  client {c}: train {int((data.groups_train == c).sum()):4d}, "
              f"majority {majority:5.1f}, {line}")
print("client-seeds whose accuracy is one label's share (of 30):", constant)
