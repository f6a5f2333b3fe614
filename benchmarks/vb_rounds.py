"""Federated VB in few rounds: the one-shot start, then exact VB rounds.

Data (novelty protocol, novel = positive):

- ``blobs``: :func:`~fednovelty.datasets.synthetic.make_fedgmm_synthetic` with 6 components
  in 16 features (means in [-1, 1]^16, standard deviation 16^-1/4 = 0.5 per feature, about
  6.5 standard deviations between means), Dirichlet(0.4) client shares, data seed = seed:
  the clients train on the rows of components 0-4 (five blobs); the test rows of those five
  are the inliers and the test rows of component 5, a sixth blob, the novel rows.
- ``cover``: ``make_task("10_cover", "novelty", alpha=0.5, seed=seed, max_train=5000,
  max_test=5000)`` (Covertype, 10 min-max scaled features; its anomalies are novel).

Each with 3 and 10 clients, seeds 0-2; ``FederatedVB`` with K = 10 (an upper bound), full
covariances, scikit-learn's default priors and stopping rule (``tol`` = 1e-3 on the summed
ELBO, ``max_iter`` = 100), in-process, under the clients' default privacy floor (5 rows
behind every released value: a component that few rows of a client back is sent as zeros)
and without one (``min_rows`` = 1, the exact rounds then being scikit-learn's path):

- (a) ``kmeans``: today's start (federated k-means, a ``vb_init`` round) and VB rounds;
- (b) ``oneshot``: ``init_params="oneshot"``: one round of local posteriors, matched,
  combined (``posterior_aggregation``) and refined on the server, then VB rounds;
- (c) ``start``: (b)'s posterior after the one-shot round alone; ``c0``: the one-shot
  posterior without the server refinement (``FederatedVBOneShot``, ``refine_iter=0``);
- ``sklearn``: centralized ``BayesianGaussianMixture`` (k-means start, ``max_iter`` 1000) on
  the pooled rows: the independent reference.

ELBO per row: the ELBO of each posterior at its own optimal responsibilities, computed here
from the pooled rows for every fit alike, ``(sum_i log sum_k exp(E[log pi_k] + E[log N(x_i |
k)]) - KL(q || prior)) / n`` (all constants kept; scikit-learn's ``lower_bound_`` drops
constants and lags one E-step; ``bound`` is a run's last such bound per row, which the server
computes from the statistics the clients released). AUROC / AUC-PR of the posterior predictive
density; ``eff`` the components above 1 % expected weight. For (b)
every exact round's posterior is recorded: ``r_elbo`` is the first exact round whose ELBO per
row is within ``ELBO_TOL`` of (a)'s final one (or above it), ``r_auc`` the first within 0.002
AUROC of (a)'s (or above), ``r_both`` the first meeting both; 0 = the start already does;
``elbo_r1..5`` the ELBO per row after exact rounds 1-5 minus (a)'s final. For (a) the same
columns against its own final ELBO: ``r_elbo`` counts the VB rounds (0: the ``vb_init``
round) until it is within ``ELBO_TOL`` of where it ends.

Run: ``python -m benchmarks.vb_rounds [--seeds 0 1 2] [--clients 3 10] [--min-rows 5 1]
[--aggregation natural] [--out FILE] [--quick]`` (writes ``benchmarks/vb_rounds.txt`` unless
``--quick``; about 2 minutes of CPU).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np
import pandas as pd
import torch
from sklearn.mixture import BayesianGaussianMixture
from threadpoolctl import threadpool_limits

from benchmarks.common import REPO, add_out, add_quick, add_seeds, emit_report, report_header
from fednovelty.datasets.protocols import make_task
from fednovelty.datasets.synthetic import make_fedgmm_synthetic
from fednovelty.evaluation import aupr_out, auroc
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.variational import VBPosterior, vb_log_resp
from fednovelty.mixture.vb_aggregate import kl_posterior
from fednovelty.mixture.vb_predictive import vb_predictive_log_prob
from fednovelty.mixture.vb_prior import VBPrior, default_prior
from fednovelty.runtime import run_simulation

#: upper bound on the components.
K = 10
#: "within": ELBO per row (nats) and AUROC.
ELBO_TOL = 0.01
AUROC_TOL = 0.002


def recording(algorithm: FederatedVB) -> FederatedVB:
    """``algorithm`` keeping the posterior after the start and after every VB round in
    ``algorithm.path`` (its ``server_step`` wrapped on the instance: a subclass would join
    the registry of algorithms)."""
    algorithm.path = []
    server_step = algorithm.server_step

    def step(state, replies):
        state, metrics = server_step(state, replies)
        if metrics.get("phase") in ("vb_init", "vb_local", "vb"):
            algorithm.path.append(state.posterior)
        return state, metrics

    algorithm.server_step = step
    return algorithm


# ------------------------------------------------------------------------------ data
def blob_task(n_clients: int, seed: int) -> dict:
    data = make_fedgmm_synthetic(n_clients, n_components=6, n_features=16, random_state=seed)
    train = data.components_train < 5
    groups = data.groups_train[train]
    X = data.X_train[train]
    clients = [X[groups == c] for c in range(n_clients) if (groups == c).sum() > 0]
    return {
        "clients": clients,
        "X_test": data.X_test,
        "y_test": (data.components_test == 5).astype(np.int64),
    }


def cover_task(n_clients: int, seed: int) -> dict:
    task = make_task(
        "10_cover",
        "novelty",
        n_clients=n_clients,
        alpha=0.5,
        seed=seed,
        max_train=5000,
        max_test=5000,
    )
    clients = [task.X_train[task.groups_train == c] for c in range(n_clients)]
    return {"clients": clients, "X_test": task.X_test, "y_test": task.y_test}


TASKS = {"blobs": blob_task, "cover": cover_task}


# ------------------------------------------------------------------------------ figures
def prior_posterior(prior: VBPrior, k: int) -> VBPosterior:
    """The prior as a K-component posterior (what ``kl_posterior`` compares with)."""
    like = {"dtype": prior.mean.dtype}
    ones = torch.ones(k, **like)
    if prior.weight_concentration_prior_type == "dirichlet_process":
        concentration = torch.stack([ones, prior.weight_concentration * ones])
    else:
        concentration = prior.weight_concentration * ones
    dof = prior.degrees_of_freedom
    covariances = (prior.covariance / dof).expand(k, *prior.covariance.shape).clone()
    return VBPosterior(
        weight_concentration=concentration,
        mean_precision=prior.mean_precision * ones,
        means=prior.mean.expand(k, -1).clone(),
        degrees_of_freedom=dof * ones,
        covariances=covariances,
        precisions_cholesky=precisions_cholesky_from_covariances(covariances, "full"),
        covariance_type="full",
        weight_concentration_prior_type=prior.weight_concentration_prior_type,
    )


def elbo_per_row(X: torch.Tensor, posterior: VBPosterior, prior: VBPosterior) -> float:
    """The ELBO at the posterior's own responsibilities, per row (module docstring)."""
    data_term = vb_log_resp(X, posterior)[0].sum()
    return float(data_term - kl_posterior(posterior, prior)) / X.shape[0]


def figures(posterior: VBPosterior, X: torch.Tensor, prior: VBPosterior, task: dict) -> dict:
    scores = -vb_predictive_log_prob(torch.as_tensor(task["X_test"]), posterior).numpy()
    return {
        "elbo": elbo_per_row(X, posterior, prior),
        "auroc": auroc(task["y_test"], scores),
        "aupr": aupr_out(task["y_test"], scores),
        "eff": int((posterior.weights > 1e-2).sum()),
    }


def sklearn_posterior(model: BayesianGaussianMixture) -> VBPosterior:
    as_t = torch.as_tensor
    concentration = model.weight_concentration_
    if isinstance(concentration, tuple):
        concentration = np.stack(concentration)
    return VBPosterior(
        weight_concentration=as_t(concentration),
        mean_precision=as_t(model.mean_precision_),
        means=as_t(model.means_),
        degrees_of_freedom=as_t(model.degrees_of_freedom_),
        covariances=as_t(model.covariances_),
        precisions_cholesky=as_t(model.precisions_cholesky_),
        covariance_type="full",
        weight_concentration_prior_type="dirichlet_process",
    )


def first_round(values: list[dict], elbo: float, area: float) -> tuple[int | None, ...]:
    """First index of ``values`` within the tolerances of ``elbo`` / ``area``, or None."""

    def first(ok) -> int | None:
        return next((i for i, v in enumerate(values) if ok(v)), None)

    near_elbo = lambda v: v["elbo"] >= elbo - ELBO_TOL  # noqa: E731
    near_auc = lambda v: v["auroc"] >= area - AUROC_TOL  # noqa: E731
    return first(near_elbo), first(near_auc), first(lambda v: near_elbo(v) and near_auc(v))


def run_cell(
    name: str, n_clients: int, seed: int, aggregation: str, policy: PrivacyPolicy
) -> list[dict]:
    task = TASKS[name](n_clients, seed)
    clients = [torch.as_tensor(c) for c in task["clients"]]
    X = torch.cat(clients)
    n = X.shape[0]
    prior = prior_posterior(default_prior(X, K, "full"), K)
    cell = {"data": name, "clients": n_clients, "seed": seed, "n_train": n}
    rows = []

    started = time.perf_counter()
    kmeans = recording(FederatedVB(K, random_state=seed))
    result = run_simulation(kmeans, clients, privacy=policy)
    seconds = time.perf_counter() - started
    a = {
        **figures(result.state.posterior, X, prior, task),
        "vb_rounds": result.state.n_iter,
        "rounds": len(result.history),
        "converged": result.state.converged,
        "bound": result.state.lower_bounds[-1] / n,
    }
    # (a)'s own path: after the vb_init round and each VB round, against its final ELBO
    own = [elbo_per_row(X, p, prior) - a["elbo"] for p in kmeans.path]
    a_self = next(i for i, gap in enumerate(own) if gap >= -ELBO_TOL)
    rows.append(
        {
            **cell,
            "fit": "(a) kmeans",
            **a,
            "r_elbo": a_self,
            "elbo_r1..5": " ".join(f"{gap:+.3f}" for gap in own[1:6]),
            "seconds": seconds,
        }
    )

    started = time.perf_counter()
    oneshot = recording(
        FederatedVB(K, random_state=seed, init_params="oneshot", posterior_aggregation=aggregation)
    )
    result = run_simulation(oneshot, clients, privacy=policy)
    seconds = time.perf_counter() - started
    path = [figures(p, X, prior, task) for p in oneshot.path]
    r_elbo, r_auc, r_both = first_round(path, a["elbo"], a["auroc"])
    rows.append(
        {
            **cell,
            "fit": f"(b) oneshot {aggregation}",
            **path[-1],
            "vb_rounds": result.state.n_iter,
            "rounds": len(result.history),
            "converged": result.state.converged,
            "bound": result.state.lower_bounds[-1] / n,
            "seconds": seconds,
            "r_elbo": r_elbo,
            "r_auc": r_auc,
            "r_both": r_both,
            "elbo_r1..5": " ".join(f"{p['elbo'] - a['elbo']:+.3f}" for p in path[1:6]),
            "gaps": [p["elbo"] - a["elbo"] for p in path],
        }
    )
    rows.append({**cell, "fit": "(c) start", **path[0], "vb_rounds": 0, "rounds": 2})

    plain = FederatedVBOneShot(K, random_state=seed, posterior_aggregation=aggregation)
    state = run_simulation(plain, clients, privacy=policy).state
    rows.append(
        {**cell, "fit": "c0 no refine", **figures(state.posterior, X, prior, task), "rounds": 2}
    )

    started = time.perf_counter()
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BayesianGaussianMixture(n_components=K, max_iter=1000, random_state=seed)
        model.fit(X.numpy())
    rows.append(
        {
            **cell,
            "fit": "sklearn",
            **figures(sklearn_posterior(model), X, prior, task),
            "vb_rounds": model.n_iter_,
            "converged": model.converged_,
            "bound": model.lower_bound_ / n,
            "seconds": time.perf_counter() - started,
        }
    )
    for row in rows[1:]:
        row["elbo-a"] = row["elbo"] - a["elbo"]
        row["auroc-a"] = row["auroc"] - a["auroc"]
    return rows


def summary(table: pd.DataFrame) -> str:
    """Per data set and client count: the rounds (b) needs, and the fits' mean gaps."""
    lines = []
    b = table[table.fit.str.startswith("(b)")]
    for (name, clients), group in b.groupby(["data", "clients"], sort=False):
        both = group.r_both.tolist()
        met = sum(r is not None and not pd.isna(r) and r <= 5 for r in both)
        own = table[(table.data == name) & (table.clients == clients)]
        own = own[own.fit == "(a) kmeans"].r_elbo.astype(int).tolist()
        loose = {
            tol: [next((i for i, g in enumerate(gaps) if g >= -tol), None) for gaps in group.gaps]
            for tol in (0.05, 0.1)
        }
        lines.append(
            f"{name} {clients} clients: exact rounds after the start to reach (a) "
            f"(ELBO/row within {ELBO_TOL}, AUROC within {AUROC_TOL}): "
            f"{[None if pd.isna(r) else int(r) for r in both]}; <= 5 in {met} of {len(both)} "
            f"(ELBO alone: {[None if pd.isna(r) else int(r) for r in group.r_elbo]}); "
            f"(a)'s own VB rounds to within {ELBO_TOL} of its final ELBO: {own}; "
            f"ELBO alone within 0.05: {loose[0.05]}, within 0.1: {loose[0.1]}"
        )
    means = table.groupby(["data", "clients", "fit"], sort=False)[
        ["elbo-a", "auroc-a", "rounds"]
    ].mean()
    lines += ["", "mean over seeds, differences from (a) of the same seed:", means.to_string()]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_seeds(parser)
    parser.add_argument("--clients", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--data", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--aggregation", default="natural", choices=["natural", "moment"])
    parser.add_argument(
        "--min-rows", type=int, nargs="+", default=[5, 1], help="the clients' privacy floors"
    )
    add_out(parser)
    add_quick(parser, "seed 0, 3 clients, blobs, floor 5")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        args.seeds, args.clients, args.data, args.min_rows = [0], [3], ["blobs"], [5]
    out = args.out or (None if args.quick else REPO / "benchmarks" / "vb_rounds.txt")
    started, cpu = time.perf_counter(), time.process_time()
    sections = []
    for floor in args.min_rows:
        policy = PrivacyPolicy(min_rows=floor)
        rows = []
        for name in args.data:
            for n_clients in args.clients:
                for seed in args.seeds:
                    rows += run_cell(name, n_clients, seed, args.aggregation, policy)
                    print(f"floor {floor}: {name} {n_clients} clients seed {seed}", flush=True)
        sections.append((floor, pd.DataFrame(rows)))
    columns = [
        "data", "clients", "seed", "fit", "rounds", "vb_rounds", "converged", "elbo",
        "elbo-a", "bound", "auroc", "auroc-a", "aupr", "eff", "r_elbo", "r_auc", "r_both",
        "elbo_r1..5", "seconds",
    ]  # fmt: skip
    parts = [
        report_header(
            "Federated VB: one-shot start + exact rounds (benchmarks/vb_rounds.py)",
            "python " + " ".join(sys.argv),
            args.quick,
            time.perf_counter() - started,
        ),
        f"- CPU time of this process: {(time.process_time() - cpu) / 60:.1f} min "
        "(the wall time above includes waiting for the shared cores)",
        __doc__.split("\n\nRun:")[0],
    ]
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        for floor, table in sections:
            body = table.reindex(columns=columns).to_string(
                index=False, float_format=lambda v: f"{v:.4f}", na_rep=""
            )
            title = f"## clients' privacy floor min_rows = {floor}"
            parts += [title + (" (no floor)" if floor == 1 else ""), body, summary(table)]
    report = "\n\n".join(parts)
    emit_report(report, out)


if __name__ == "__main__":
    main()
