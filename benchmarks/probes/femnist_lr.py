"""Probe: FedGMM's FEMNIST accuracy against rounds, the paper's CNN at two learning rates.

One run per call: ``python -m benchmarks.probes.femnist_lr --lr 0.001 --writers 10 --rounds 100``.
The paper's setting otherwise (CNN, M1 = M2 = 3, one local epoch, batch 128); accuracy of each
writer's own weights on its test rows after the listed rounds. One thread, CPU.
"""

import argparse
import json
import time
import warnings

import torch

from benchmarks.common import personal_accuracy, shifted_writers, standardised
from benchmarks.fedgmm_femnist import PAPER_SCALE, Settings, make_model

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--writers", type=int, default=10)
parser.add_argument("--rounds", type=int, default=100)
parser.add_argument("--at", default="1,5,10,25,49,75,100,150,200")
parser.add_argument("--out", required=True)
args = parser.parse_args()
torch.set_num_threads(1)
settings = Settings(
    seeds=(0,),
    **{**PAPER_SCALE, "max_iter": 1, "n_writers": args.writers, "learning_rate": args.lr},
)
data = standardised(shifted_writers(args.writers, 0))
marks = [r for r in map(int, args.at.split(",")) if r <= args.rounds]
model = make_model("FedGMM", settings, 0)
started = time.perf_counter()
rows = []
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    model.fit(data.X_train, data.y_train, data.groups_train)
    done = 1
    for mark in marks:
        if mark > done:
            model.partial_fit(data.X_train, data.y_train, data.groups_train, rounds=mark - done)
            done = mark
        acc = personal_accuracy(model, data.X_test, data.y_test, data.groups_test)
        train = personal_accuracy(model, data.X_train, data.y_train, data.groups_train)
        rows.append(
            {"round": done, "test": acc, "train": train, "seconds": time.perf_counter() - started}
        )
        print(json.dumps(rows[-1]), flush=True)
        with open(args.out, "w") as f:
            json.dump({"lr": args.lr, "writers": args.writers, "rows": rows}, f, indent=1)
