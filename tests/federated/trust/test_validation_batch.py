"""The server gate's batched checks give each reply the verdict the rule states.

``ReplyValidator.accept`` checks a round's statistics replies together (one stacked pass and
one batched Cholesky, ``batch_checks.batch_passes``) and checks alone only the replies the
batch cannot clear. The verdicts are compared here with the rule written out in NumPy:
counts add up to at most ``n (1 + rtol) + rtol``, and every ``G_k = n_k S_k - s_k s_k^T`` is
finite, symmetric within ``tau_k = rtol * (max|n_k S_k| + max_j s_kj^2)`` and has no
eigenvalue below ``-tau_k``. The replies sit on both sides of each threshold (a lowest
eigenvalue of ``-0.3 tau`` passes, ``-3 tau`` fails), with NaN, inf, negative counts and
sums that overflow among them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError, declare
from fednovelty.federated.mixtures.em import EM_REPLY
from fednovelty.federated.trust.batch_checks import batch_passes
from fednovelty.federated.trust.reply_form import check_reply
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.federated.trust.value_checks import RTOL, certainly_psd
from fednovelty.mixture.density import Workspace
from fednovelty.mixture.stats import e_step_stats

K, D = 3, 4


def broadcast() -> Message:
    return Message(
        "em",
        {"means": torch.zeros(K, D, dtype=torch.float64)},
        expect={"covariance_type": "full"},
    )


def honest_stats(seed: int, n: int = 40, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Statistics of ``n`` random rows with random responsibilities, about 0."""
    gen = np.random.default_rng(seed)
    X = gen.normal(size=(n, D)) * gen.uniform(0.5, 3.0, size=D) + gen.normal(size=D) * 5
    resp = gen.dirichlet(np.ones(K), size=n)
    counts = resp.sum(0)
    sums = resp.T @ X
    second = np.einsum("ik,ia,ib->kab", resp, X, X)
    tensors = {
        "counts": counts,
        "sums": sums,
        "second": second,
        "log_likelihood": np.array(-3.0 * n),
        "n_samples": np.array(float(n)),
    }
    return {name: torch.tensor(value, dtype=dtype) for name, value in tensors.items()}


def with_lowest_eigenvalue(t: dict, k: int, times_tau: float) -> dict:
    """``t`` with component ``k``'s second moment moved so that ``G_k``'s lowest
    eigenvalue is ``times_tau * tau_k`` (negative: below zero)."""
    t = {name: value.clone() for name, value in t.items()}
    n_k, s_k, S_k = (t[name][k].double().numpy() for name in ("counts", "sums", "second"))
    gram = n_k * S_k - np.outer(s_k, s_k)
    values, vectors = np.linalg.eigh(gram)
    tau = RTOL * (np.abs(n_k * S_k).max() + (s_k**2).max())
    values[0] = times_tau * tau
    gram = (vectors * values) @ vectors.T
    t["second"][k] = torch.tensor((gram + np.outer(s_k, s_k)) / n_k, dtype=t["second"].dtype)
    return t


def reference_verdict(t: dict) -> bool:
    """The rule of ``check_stats`` (and the values' checks), in NumPy."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _reference_verdict({name: value.double().numpy() for name, value in t.items()})


def _reference_verdict(arrays: dict[str, np.ndarray]) -> bool:
    if not all(np.isfinite(a).all() for a in arrays.values()):
        return False
    if (arrays["counts"] < 0).any() or arrays["n_samples"] < 0:
        return False
    counts, sums, second = arrays["counts"], arrays["sums"], arrays["second"]
    n = float(arrays["n_samples"])
    if counts.sum() > n * (1 + RTOL) + RTOL:
        return False
    for k in range(K):
        weighted = counts[k] * second[k]
        gram = weighted - np.outer(sums[k], sums[k])
        tau = RTOL * (np.abs(weighted).max() + (sums[k] ** 2).max()) + 1e-300
        if not np.isfinite(gram).all():
            return False
        symmetric = (gram + gram.T) / 2
        if np.abs(gram - symmetric).max() > tau:
            return False
        if np.linalg.eigvalsh(symmetric).min() < -tau:
            return False
    return True


def round_of_replies() -> tuple[dict[int, Message], set[int], set[int]]:
    """Replies of one round, honest and not, by client id; the ids the rule accepts, and
    those of the honest replies."""
    cases: list[dict] = []
    for seed in range(12):
        cases.append(honest_stats(seed))
    for seed, times_tau in enumerate([0.5, 0.3, -0.3, -0.8, -1.25, -3.0, -1e3]):
        cases.append(with_lowest_eigenvalue(honest_stats(100 + seed), seed % K, times_tau))
    asymmetric = honest_stats(200)
    tau = RTOL * float(
        (asymmetric["counts"][1] * asymmetric["second"][1]).abs().max()
        + asymmetric["sums"][1].square().max()
    )
    for offset in (0.5, 4.0):  # G_01 - G_10 = offset * tau (G is n_k S_k - s s^T)
        t = {name: value.clone() for name, value in asymmetric.items()}
        t["second"][1, 0, 2] += offset * tau / float(t["counts"][1])
        cases.append(t)
    nan, inf, negative, too_many = (honest_stats(300 + i) for i in range(4))
    nan["second"][0, 1, 1] = math.nan
    inf["sums"][2, 0] = math.inf
    negative["counts"][1] = -1e-3
    too_many["counts"] = too_many["counts"] * 1.01  # 1% more than the rows sent
    cases += [nan, inf, negative, too_many]
    overflow = honest_stats(400)
    overflow["second"] = overflow["second"] * 1e304  # finite, but n_k S_k overflows
    assert bool(torch.isfinite(overflow["second"]).all())
    huge = honest_stats(401)  # G + G^T overflows in the rule's symmetric part
    huge["second"] = huge["second"] * (torch.finfo(torch.float64).max / 2e4)
    large = honest_stats(402)  # large, and every product finite
    large["second"] = large["second"] * 1e280
    cases += [overflow, huge, large]
    replies = {cid: Message("em", t) for cid, t in enumerate(cases)}
    accepted = {cid for cid, t in enumerate(cases) if reference_verdict(t)}
    return replies, accepted, {*range(12), len(cases) - 1}


def validator() -> ReplyValidator:
    spec = declare(EM_REPLY)["em"]
    return ReplyValidator(n_features=D, specs=lambda kind: spec)


def test_the_batched_gate_gives_every_reply_the_rules_verdict() -> None:
    replies, accepted, _ = round_of_replies()
    assert 0 < len(accepted) < len(replies)  # both sides of the thresholds are covered
    valid, dropped = validator().accept(broadcast(), replies)
    assert set(valid) == accepted
    assert set(dropped) == set(replies) - accepted
    assert sorted(valid) == list(valid)  # by increasing client id


def test_a_dropped_reply_is_named_with_the_reason_it_gets_alone() -> None:
    replies, _, _ = round_of_replies()
    spec = declare(EM_REPLY)["em"]
    _, dropped = validator().accept(broadcast(), replies)
    for cid, reason in dropped.items():
        with pytest.raises(InvalidReplyError) as error:
            check_reply(replies[cid], broadcast(), D, spec)
        assert str(error.value) == reason


def test_the_batch_clears_honest_replies_and_no_reply_the_rule_refuses() -> None:
    replies, accepted, honest = round_of_replies()
    spec = declare(EM_REPLY)["em"]
    cleared = batch_passes(broadcast(), replies, D, spec)
    assert cleared <= accepted
    assert honest <= cleared  # the honest ones need no reply-by-reply check


def test_float32_replies_get_the_rules_verdict() -> None:
    replies = {c: Message("em", honest_stats(c, dtype=torch.float32)) for c in range(6)}
    bad = with_lowest_eigenvalue(honest_stats(50), 1, -1e4)
    replies[6] = Message("em", {k: v.float() for k, v in bad.items()})
    valid, dropped = validator().accept(broadcast(), replies)
    assert set(valid) == set(range(6)) and set(dropped) == {6}


@pytest.mark.parametrize("seed", range(4))
def test_cholesky_clears_only_matrices_eigvalsh_passes(seed: int) -> None:
    gen = np.random.default_rng(seed)
    for _ in range(150):
        d = int(gen.integers(1, 40))
        basis, _ = np.linalg.qr(gen.normal(size=(d, d)))
        scale = 10.0 ** gen.uniform(-6, 9)
        values = gen.uniform(0, 1, size=d) * scale
        tau = 1e-6 * scale
        values[0] = -tau * gen.uniform(0, 2)
        matrix = (basis * values) @ basis.T
        matrix = (matrix + matrix.T) / 2
        cleared = bool(certainly_psd(torch.tensor(matrix), torch.tensor(tau)))
        lowest = np.linalg.eigvalsh(matrix).min()
        if cleared:
            assert lowest >= -tau
        if values[0] >= -tau / 4:  # well inside: the cheap test decides
            assert cleared, (d, values[0] / tau)


def reference_e_step(X, log_weights, means, precisions_cholesky, shift):
    """Counts, sums and second moments about ``shift`` of a full-covariance E-step, NumPy."""
    X, means, prec = (np.asarray(a, dtype=np.float64) for a in (X, means, precisions_cholesky))
    log_det = np.log(np.diagonal(prec, axis1=1, axis2=2)).sum(1)
    y = np.einsum("nd,kde->nke", X, prec) - np.einsum("kd,kde->ke", means, prec)[None]
    log_prob = -0.5 * (X.shape[1] * np.log(2 * np.pi) + (y**2).sum(2)) + log_det
    weighted = log_prob + np.asarray(log_weights)
    resp = np.exp(weighted - weighted.max(1, keepdims=True))
    resp /= resp.sum(1, keepdims=True)
    c = X - np.asarray(shift)
    return resp.sum(0), resp.T @ c, np.einsum("nk,na,nb->kab", resp, c, c)


def test_a_workspace_keeps_the_density_only_while_the_parameters_are_the_same() -> None:
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(200, D, generator=gen, dtype=torch.float64) * 2
    means = torch.randn(K, D, generator=gen, dtype=torch.float64)
    factors = torch.randn(K, D, D, generator=gen, dtype=torch.float64) * 0.1
    prec = (
        torch.linalg.cholesky(torch.eye(D, dtype=torch.float64) + factors @ factors.transpose(1, 2))
        .transpose(1, 2)
        .contiguous()
    )  # upper-triangular factors of the precisions
    shift = X.mean(0)
    workspace = Workspace()
    for step in range(3):
        log_weights = torch.log(torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64))
        stats = e_step_stats(X, log_weights, means, prec, "full", shift, None, workspace)
        expected = reference_e_step(X, log_weights, means, prec, shift)
        for got, want in zip((stats.counts, stats.sums, stats.second), expected, strict=True):
            assert_close_scaled(got, want, rtol=1e-10, err_msg=f"step {step}")
        means.add_(0.5)  # in place: the next call must not reuse the old factors
        shift = shift.clone()
