"""Probe (issue 21; removed after its commit, findings in docs/streaming.md): can the
streaming detector track each FEMNIST writer's share of digits within 0.05, and what bounds it?

Per seed: 200 writers, 120 of them train a federated backbone (FedAvg, MLP 784-256-62, 40
rounds of 2 local epochs, SGD 0.2, on images standardised one by one), the other 80 form the
stream (linear schedule, 3 cycles, 60 windows, 50 rows per writer and window). Features:
``pixels`` (standardised images) or ``backbone`` (the MLP's 256 hidden units), both on 24
principal axes of a first window with share 1/2. StreamingFedGMMDetector (K=10, rho 0.9,
rounds 1, full covariances, reg_covar 1e-3) fitted on the first window and fed the stream.
Read-outs of a client's share of digits from its weights pi_c: ``simple`` sum_k pi_ck P(A|k),
``bbse`` the projection of pi_c on the line between the digits' and letters' mean
responsibilities (black-box shift estimation, Lipton et al. 2018), both from the labelled first
window; compared with the schedule and with each writer's realised share. ``oracle``: a
logistic regression trained on the first window's digit/letter labels, BBSE-corrected, per
writer and window: what a supervised read-out of the same features reaches. ``K=2 purity``:
share of digits in each of two diagonal Gaussians fitted on the first window (pFedEM's
Gaussians). MAE over the windows after the first cycle.
"""

import sys
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import torch
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.mixture import GaussianMixture

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.fedgmm_femnist import standardise_images  # noqa: E402
from fednovelty import JointFedGMMDetector, StreamingFedGMMDetector  # noqa: E402
from fednovelty.datasets.femnist import make_femnist_federated, split_writers  # noqa: E402
from fednovelty.datasets.streams import writer_stream  # noqa: E402
from fednovelty.federated.config import mlp_learner  # noqa: E402


def backbone(bb, classes, seed):
    det = JointFedGMMDetector.pfl_baseline(
        "FedAvg", learner=partial(mlp_learner, hidden=256), local_epochs=2,
        learning_rate=0.2, batch_size=32, max_iter=40, tol=0.0, covariance_type="diag",
        dtype="float32", random_state=seed, pca_components=8,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fit(standardise_images(bb.X_train), bb.y_train, bb.groups_train, classes=classes)
    p = det.joint_state_.learners[0]
    W, b = p["0.weight"].double().numpy(), p["0.bias"].double().numpy()
    return det, lambda X: np.maximum(standardise_images(X) @ W.T + b, 0.0)


def track(st, f, seed):
    train = writer_stream(st, 60, kind="linear", cycles=3, rows_per_window=50, random_state=seed)
    first = writer_stream(st, 1, kind="constant", constant=0.5, rows_per_window=50,
                          random_state=seed + 2)[0]  # fmt: skip
    pca = PCA(24, random_state=0).fit(f(first.X))
    g = lambda X: pca.transform(f(X))  # noqa: E731
    z0, a = g(first.X), first.from_a
    det = StreamingFedGMMDetector(10, rho=0.9, rounds=1, reg_covar=1e-3, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fit(z0, groups=first.groups)
    resp = det.responsibilities(z0)
    w_a, w_b, p_a = resp[a].mean(0), resp[~a].mean(0), resp[a].sum(0) / resp.sum(0)
    lr = LogisticRegression(max_iter=3000).fit(z0, a)
    q0 = lr.predict_proba(z0)[:, 1]
    tpr, fpr = q0[a].mean(), q0[~a].mean()
    k2 = GaussianMixture(2, covariance_type="diag", random_state=seed).fit(z0).predict(z0)
    purity = sorted(float(a[k2 == k].mean()) for k in range(2))
    err = {k: [] for k in ("simple", "bbse", "bbse_real", "oracle_real", "real_vs_schedule")}
    d = w_a - w_b
    for t, w in enumerate(train):
        det.partial_fit(g(w.X), groups=w.groups)
        pi = det.client_weights_
        if t < 20:
            continue
        clients = range(st.n_writers)
        real = np.array([w.from_a[w.groups == c].mean() for c in clients])
        q = lr.predict_proba(g(w.X))[:, 1]
        oracle = np.clip([(q[w.groups == c].mean() - fpr) / (tpr - fpr) for c in clients], 0, 1)
        bbse = np.clip((pi - w_b) @ d / (d @ d), 0, 1)
        err["simple"].append(np.abs(pi @ p_a - w.share).mean())
        err["bbse"].append(np.abs(bbse - w.share).mean())
        err["bbse_real"].append(np.abs(bbse - real).mean())
        err["oracle_real"].append(np.abs(oracle - real).mean())
        err["real_vs_schedule"].append(np.abs(real - w.share).mean())
    out = {k: float(np.mean(v)) for k, v in err.items()}
    out["lr_acc"] = float(lr.score(z0, a))
    out["k2_purity"] = purity
    return out


def main():
    torch.set_num_threads(1)
    for seed in [int(s) for s in sys.argv[1:]] or [0, 1, 2]:
        t0 = time.perf_counter()
        data = make_femnist_federated(200, random_state=seed)
        bb, st = split_writers(data, unseen=0.4, random_state=seed)
        det, f = backbone(bb, data.classes, seed)
        acc = float(np.mean(det.predict_y(standardise_images(st.X_test)) == st.y_test))
        for name, feats in (("pixels", standardise_images), ("backbone", f)):
            r = track(st, feats, seed)
            print(f"seed {seed} {name:8s} backbone-acc {acc:.3f} digit/letter LR acc "
                  f"{r['lr_acc']:.3f} | MAE vs schedule: simple {r['simple']:.3f} bbse "
                  f"{r['bbse']:.3f} | vs realised: bbse {r['bbse_real']:.3f} oracle "
                  f"{r['oracle_real']:.3f} | realised vs schedule {r['real_vs_schedule']:.3f} "
                  f"| K=2 purity {r['k2_purity'][0]:.2f}/{r['k2_purity'][1]:.2f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
