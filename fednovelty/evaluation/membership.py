"""Membership inference against released mixture statistics and trained detectors.

Three attacks:

- :func:`stats_attack`: the likelihood-ratio attack on ONE client's released summed statistics
  (counts ``n_k = sum_i r_ik``, first moments ``s_k = sum_i r_ik (x_i - c)``, the upper
  triangle of second moments ``S_k = sum_i r_ik (x_i - c)(x_i - c)^T``; rows clipped to the
  L2 ball of radius ``B`` around the public centre ``c``; responsibilities ``r`` from a public
  mixture, or one component). The adversary is the strongest natural one: it knows every row
  of the client but the target (``D_minus``), the target ``x*``, the clip bound, the
  responsibilities and the noise's spread, sees the release ``y = f(D) + noise`` of ``rounds``
  rounds, and scores ``log N(y; f(D_minus + {x*}), sigma^2) - log N(y; f(D_minus),
  sigma^2)`` (Neyman-Pearson: no test of "x* is in D" against "D = D_minus" does better at
  any false-positive rate). Members are trials where ``D = D_minus + {x*}``, non-members
  trials where ``D = D_minus``: the add/remove-one-row neighbours the sensitivities of
  :func:`fednovelty.federated.trust.dp_mechanism.stats_sensitivities` are taken over.
- :func:`gate_attack`: the same likelihood-ratio attack on what actually leaves a client
  through the real client gate (``algorithm.answer`` under the client's
  :class:`~fednovelty.federated.trust.dp.DPPolicy`), for one fixed pair of neighbours, over one
  or more releases; it also returns the released noise (each block's values minus the
  noiseless release of the same rows, about the origin) to check against the calibration
  ``z * BLOCK_SPLIT[block] * sensitivity``.
- :func:`score_attack`: the loss attack on a trained detector's log-densities
  (``score_samples``; higher = more typical = guessed member), and its calibrated form (the
  offline LiRA of Carlini et al. 2022 in its simplest global-threshold form: each row's score
  minus the mean score reference models trained without it give it, over their spread).

Their scores are measured by :mod:`fednovelty.evaluation.membership_audit` (the AUC, its
error, and the lower bound on epsilon they give) against the bounds differential privacy puts
on any such attack, :mod:`fednovelty.evaluation.membership_bounds`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fednovelty.evaluation.membership_audit import auc_interval, membership_auc
from fednovelty.evaluation.membership_bounds import gdp_auc_bound, gdp_mu
from fednovelty.federated.core.base import ClientContext
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import noise_std
from fednovelty.federated.trust.dp_mechanism import (
    clip_rows,
    gaussian_noise,
    recentre_stats,
    stats_sensitivities,
)
from fednovelty.federated.trust.dp_split import BLOCK_SPLIT, STAT_BLOCKS
from fednovelty.federated.trust.noise import SeededNoise
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.mixture import MixtureParams, predict_proba, stats_from_resp


# --------------------------------------------------------------------------- the stats attack
class _Trials:
    """What an attack's trials give (``scores``, ``members``, ``mu`` of its subclass)."""

    @property
    def auc(self) -> float:
        """:func:`membership_auc` over the trials."""
        return membership_auc(self.scores[self.members], self.scores[~self.members])

    @property
    def bound(self) -> float:
        """:func:`gdp_auc_bound` of :attr:`mu`."""
        return gdp_auc_bound(self.mu)

    def interval(self, n_boot: int = 1000, level: float = 0.95, seed: int = 0):
        """:func:`auc_interval` over the trials: ``(auc, low, high)``."""
        return auc_interval(
            self.scores[self.members], self.scores[~self.members], n_boot, level, seed
        )


@dataclass(frozen=True)
class StatsAttack(_Trials):
    """Per-trial results of :func:`stats_attack`.

    Attributes:
        scores: the log-likelihood ratio of each trial, shape (n_trials,) (higher = member).
        members: whether the target was in the released rows, shape (n_trials,), bool.
        signal: each trial's ``||f(D_minus + {x*}) - f(D_minus)|| / sigma`` over all blocks
            and rounds, shape (n_trials,): the ``mu`` of that trial's pair of hypotheses,
            at most :func:`gdp_mu` of the mechanism.
        noise_multiplier: ``z``; 0 means no noise (the scores are then the squared-distance
            difference ``||y - f0||^2 - ||y - f1||^2``, the noise-free limit of ``sigma^2``
            times the ratio).
        mu: :func:`gdp_mu` of the mechanism (``rounds``, the released blocks).
    """

    scores: np.ndarray
    members: np.ndarray
    signal: np.ndarray
    noise_multiplier: float
    mu: float


def _flat_stats(
    X: torch.Tensor, mixture: MixtureParams | None, centre: torch.Tensor, blocks: Sequence[str]
) -> list[torch.Tensor]:
    """The released blocks of rows ``X`` (n, d) (already clipped), each flattened: counts
    (K,), first moments (K*d,), second moments' upper triangles (K*d(d+1)/2,), summed by
    :func:`fednovelty.mixture.stats_from_resp` about ``centre``."""
    if mixture is None:
        resp = X.new_ones(X.shape[0], 1)
    else:
        resp = predict_proba(mixture, X)
    stats = stats_from_resp(X, resp, "full", centre)
    d = X.shape[1]
    rows, cols = torch.triu_indices(d, d)
    flat = {
        "counts": stats.counts,
        "sums": stats.sums.reshape(-1),
        "second": stats.second[:, rows, cols].reshape(-1),
    }
    return [flat[name] for name in blocks]


def _check_attack_args(population, n_rows, clip_bound, noise_multiplier, rounds, blocks):
    if population.ndim != 2 or population.shape[0] < n_rows + 1:
        raise ValueError(
            f"population must be (N, d) with N > n_rows = {n_rows} rows to draw clients and "
            f"targets from; got shape {tuple(population.shape)}."
        )
    if n_rows < 1:
        raise ValueError(
            f"n_rows must be >= 1 (the target plus the rows the adversary knows); got {n_rows!r}."
        )
    if not (math.isfinite(clip_bound) and clip_bound > 0):
        raise ValueError(f"clip_bound must be a positive finite L2 radius; got {clip_bound!r}.")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(
            f"noise_multiplier must be a finite number >= 0 (0 = no noise); got "
            f"{noise_multiplier!r}."
        )
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1; got {rounds!r}.")
    unknown = [name for name in blocks if name not in STAT_BLOCKS]
    if unknown or not blocks:
        raise ValueError(
            f"blocks must be a non-empty subset of {STAT_BLOCKS}; got {tuple(blocks)!r}."
        )


def stats_attack(
    population: np.ndarray,
    n_rows: int,
    clip_bound: float,
    noise_multiplier: float,
    *,
    n_trials: int = 2000,
    rounds: int = 1,
    blocks: Sequence[str] = STAT_BLOCKS,
    centre: np.ndarray | None = None,
    mixture: MixtureParams | None = None,
    target: np.ndarray | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> StatsAttack:
    """The likelihood-ratio membership attack on one client's released statistics (module
    docstring), repeated over ``n_trials`` trials, half of them members.

    Each trial draws the client's other ``n_rows - 1`` rows (``D_minus``, known to the
    adversary) and the target from ``population`` without replacement (or uses ``target``,
    e.g. a worst-case row at distance >= ``clip_bound`` from the centre along a feature axis,
    which moves every block by its full sensitivity), clips the rows
    (:func:`fednovelty.federated.trust.dp_mechanism.clip_rows`), releases ``blocks`` of ``f(D)``
    plus independent Gaussian noise of standard deviation ``noise_multiplier`` times the block's
    sensitivity (:func:`~fednovelty.federated.trust.dp_mechanism.stats_sensitivities`, on the second
    moments' upper triangle as :func:`~fednovelty.federated.trust.dp.symmetric_noise` does) in
    each of ``rounds`` rounds, and scores the summed Gaussian log-likelihood ratio of "target
    in D" against "D = D_minus".

    Args:
        population: rows (N, d), N > ``n_rows``, the clients' rows and targets are drawn from.
        n_rows: rows of the client when the target is a member.
        clip_bound: the L2 clip radius ``B`` around ``centre``.
        noise_multiplier: ``z`` (0: no noise);
            :func:`fednovelty.federated.trust.dp_calibration.calibrate_noise` gives the one that
            spends a budget.
        n_trials: trials in all; the first half (after a shuffle) are members.
        rounds: releases of the same statistics with fresh noise (a fixed public mixture).
        blocks: the released blocks, a subset of ``("counts", "sums", "second")``.
        centre: the public centre (d,); default the origin.
        mixture: the public mixture whose responsibilities weight the rows; default one
            component (every responsibility 1).
        target: a fixed target row (d,) for every trial; default a fresh row per trial.
        seed: seeds the draws and the noise.
        device: where the tensors are made (default CPU).

    Returns:
        :class:`StatsAttack` with the per-trial scores, membership and signal.

    Raises:
        ValueError: an argument outside the ranges above (the message names it).
    """
    population = np.asarray(population, dtype=float)
    blocks = tuple(blocks)
    _check_attack_args(population, n_rows, clip_bound, noise_multiplier, rounds, blocks)
    d = population.shape[1]
    device = torch.device(device or "cpu")
    as_tensor = lambda a: torch.as_tensor(np.asarray(a, dtype=float), device=device)  # noqa: E731
    centre_t = as_tensor(np.zeros(d) if centre is None else centre)
    if centre_t.shape != (d,):
        raise ValueError(f"centre must have shape ({d},); got {tuple(centre_t.shape)}.")
    target_t = None if target is None else as_tensor(target).reshape(1, -1)
    if target_t is not None and target_t.shape[1] != d:
        raise ValueError(f"target must have shape ({d},); got {tuple(np.shape(target))}.")
    rng = np.random.default_rng(seed)
    source = SeededNoise(int(rng.integers(2**31)))  # a simulation of the mechanism
    sens = stats_sensitivities(clip_bound)
    sigma = [noise_std(noise_multiplier, sens[name], "central") for name in blocks]
    members = rng.permutation(np.arange(n_trials) < n_trials // 2)
    scores, signal = np.empty(n_trials), np.empty(n_trials)
    for t in range(n_trials):
        picked = rng.choice(population.shape[0], n_rows, replace=False)
        rows = as_tensor(population[picked])
        x_star = rows[:1] if target_t is None else target_t
        others = clip_rows(rows[1:], centre_t, clip_bound)
        with_target = torch.cat([others, clip_rows(x_star, centre_t, clip_bound)])
        f0 = _flat_stats(others, mixture, centre_t, blocks)
        f1 = _flat_stats(with_target, mixture, centre_t, blocks)
        score, power = 0.0, 0.0
        for a, b, s in zip(f0, f1, sigma, strict=True):
            scale = s * s if s > 0 else 1.0
            power += float(((b - a) ** 2).sum()) / scale
            released = b if members[t] else a
            for _ in range(rounds):
                y = released + gaussian_noise(tuple(a.shape), s, a, source)
                score += float(((y - a) ** 2).sum() - ((y - b) ** 2).sum()) / (2 * scale)
        scores[t], signal[t] = (
            score,
            math.sqrt(power * rounds) if noise_multiplier > 0 else math.inf,
        )
    return StatsAttack(
        scores=scores,
        members=members,
        signal=signal,
        noise_multiplier=float(noise_multiplier),
        mu=gdp_mu(noise_multiplier, rounds, len(blocks)),
    )


# --------------------------------------------------------------------------- through the gate
@dataclass(frozen=True)
class GateAttack(_Trials):
    """Per-trial results of :func:`gate_attack`.

    Attributes:
        scores: each trial's log-likelihood ratio summed over its releases, shape
            (n_trials,) (higher = member).
        members: whether the target was among the client's rows, shape (n_trials,), bool.
        noise: each block's released values minus the noiseless release of the same rows,
            about the origin, by block name: shape (n_trials, releases, entries) (counts
            (K,), first moments (K*d,), second moments' upper triangles).
        sigma: each block's calibrated noise standard deviation, ``z * BLOCK_SPLIT[block]
            * sensitivity`` with ``z`` the client's own multiplier.
        signal: ``||f(D_minus + {x*}) - f(D_minus)|| / sigma`` over the blocks and
            releases: the ``mu`` of this pair of neighbours (``inf`` without noise).
        mu: :func:`gdp_mu` of the releases (three blocks, ``z`` split by
            :data:`~fednovelty.federated.trust.dp_split.BLOCK_SPLIT`, spends what three blocks of
            ``z`` do).
        releases: releases per trial.
    """

    scores: np.ndarray
    members: np.ndarray
    noise: dict[str, np.ndarray]
    sigma: dict[str, float]
    signal: float
    mu: float
    releases: int


def _released_blocks(
    reply: Any, shift: torch.Tensor, covariance_type: str
) -> dict[str, np.ndarray]:
    """A released stats reply's blocks about the origin (where the gate adds the noise),
    flattened: counts (K,), first moments (K*d,), second moments (the upper triangle of
    full and tied ones; diag and spherical as they are)."""
    t = reply.tensors
    counts = t["counts"].to(torch.float64)
    sums, second = recentre_stats(
        counts,
        t["sums"].to(torch.float64),
        t["second"].to(torch.float64),
        shift.to(torch.float64),
        covariance_type,
    )
    if covariance_type in ("full", "tied"):
        d = second.shape[-1]
        rows, cols = torch.triu_indices(d, d)
        second = second[..., rows, cols]
    return {
        "counts": counts.reshape(-1).cpu().numpy(),
        "sums": sums.reshape(-1).cpu().numpy(),
        "second": second.reshape(-1).cpu().numpy(),
    }


def gate_attack(
    algorithm: Any,
    message: Any,
    policy: PrivacyPolicy,
    others: np.ndarray,
    target: np.ndarray,
    *,
    n_trials: int = 2000,
    releases: int = 1,
    client_id: int = 0,
    seed: int = 0,
) -> GateAttack:
    """The likelihood-ratio membership attack on what leaves a client through the real
    client gate (``algorithm.answer``), for one fixed pair of add/remove neighbours.

    Each trial the client holds ``others`` (``D_minus``, known to the adversary) or
    ``others`` plus ``target`` (half the trials, shuffled) and answers ``message`` (a
    broadcast whose reply has the ``"stats"`` private form, e.g. an ``"em"`` round)
    ``releases`` times through ``algorithm.answer`` under ``policy`` (its
    :class:`~fednovelty.federated.trust.dp.DPPolicy` reseeded per trial, the releases of a trial
    counted in one client state as an engine does). The adversary knows everything but the
    noise: the noiseless releases ``f0 = f(D_minus)`` and ``f1 = f(D_minus + {x*})`` (the
    same gate with the policy's multiplier set to 0: the same views, clipping and
    statistics) and each block's noise spread ``sigma_b = z_client * BLOCK_SPLIT[b] *
    sensitivity_b``; it scores ``sum over releases and blocks of (||y - f0||^2 -
    ||y - f1||^2) / (2 sigma_b^2)`` on the blocks taken about the origin.

    Args:
        algorithm: a federated algorithm (e.g. ``FederatedEM(..., dp_mode="local",
            dp_noise_multiplier=z, dp_clip=B, bounds=...)``).
        message: the broadcast the client answers (``algorithm.configure(state)``).
        policy: the client's :class:`~fednovelty.federated.trust.privacy.PrivacyPolicy`, with
            ``dp`` set; its budget (``epsilon``) must allow ``releases``.
        others: the client's rows without the target, (n - 1, d).
        target: the target row, (d,).
        n_trials: trials in all (>= 2); ``releases``: releases per trial (>= 1).
        client_id: the client's id (the gate seeds the noise with it and the policy's seed).
        seed: seeds the membership draws and the policies' seeds.

    Returns:
        :class:`GateAttack` with the per-trial scores and the released noise.

    Raises:
        ValueError: no ``policy.dp``, a reply without the ``"stats"`` private form, a
            refused release (the reason is quoted), or arguments out of range.
    """
    if policy.dp is None:
        raise ValueError("policy.dp must be a DPPolicy: the gate adds noise only under one.")
    if n_trials < 2 or releases < 1:
        raise ValueError(f"n_trials must be >= 2 and releases >= 1; got {n_trials}, {releases}.")
    spec = algorithm.reply_spec(message.kind)
    if spec.private != "stats":
        raise ValueError(
            f"message kind {message.kind!r} has private form {spec.private!r}; the attack "
            "reads summed statistics (private form 'stats', e.g. an 'em' round)."
        )
    config = algorithm.config
    ct = getattr(config, "covariance_type", "full")
    dtype = getattr(config, "dtype", torch.float64)
    shift = message.tensors["shift"]
    without = torch.as_tensor(np.asarray(others, dtype=float), dtype=dtype)
    x_star = torch.as_tensor(np.asarray(target, dtype=float), dtype=dtype).reshape(1, -1)
    if without.ndim != 2 or x_star.shape[1] != without.shape[1]:
        raise ValueError(
            f"others must be (n - 1, d) and target (d,); got {tuple(without.shape)} and "
            f"{tuple(np.shape(target))}."
        )
    datasets = (without, torch.cat([without, x_star]))

    def answer(rows: torch.Tensor, context: ClientContext) -> dict:
        reply = gate.answer(algorithm, rows, message, context)
        if reply.scalars.get("skipped"):
            raise ValueError(f"the client refused the release: {reply.scalars.get('reason')}")
        return _released_blocks(reply, shift, ct)

    quiet = dataclasses.replace(policy, dp=dataclasses.replace(policy.dp, noise_multiplier=0.0))
    f0, f1 = (answer(rows, gate.client_context(client_id, {}, quiet)) for rows in datasets)
    z = policy.dp.client_noise
    sens = stats_sensitivities(policy.dp.clip_norm)
    sigma = {b: z * BLOCK_SPLIT[b] * sens[b] for b in STAT_BLOCKS}
    power = sum(float(((f1[b] - f0[b]) ** 2).sum()) / sigma[b] ** 2 for b in STAT_BLOCKS if z > 0)
    rng = np.random.default_rng(seed)
    members = rng.permutation(np.arange(n_trials) < n_trials // 2)
    seeds = rng.integers(2**31, size=n_trials)
    scores = np.zeros(n_trials)
    noise = {b: np.empty((n_trials, releases, f0[b].size)) for b in STAT_BLOCKS}
    for t in range(n_trials):
        trial_policy = dataclasses.replace(
            policy, dp=dataclasses.replace(policy.dp, insecure_seed=int(seeds[t]))
        )
        context = gate.client_context(client_id, {}, trial_policy)  # its ledger counts the releases
        truth = f1 if members[t] else f0
        for r in range(releases):
            y = answer(datasets[int(members[t])], context)
            for b in STAT_BLOCKS:
                noise[b][t, r] = y[b] - truth[b]
                scale = sigma[b] ** 2 if z > 0 else 1.0
                diff = ((y[b] - f0[b]) ** 2).sum() - ((y[b] - f1[b]) ** 2).sum()
                scores[t] += float(diff) / (2 * scale)
    return GateAttack(
        scores=scores,
        members=members,
        noise=noise,
        sigma=sigma,
        signal=math.sqrt(power * releases) if z > 0 else math.inf,
        mu=gdp_mu(z, releases, len(STAT_BLOCKS)),
        releases=releases,
    )


# --------------------------------------------------------------------------- the score attack
@dataclass(frozen=True)
class ScoreAttack:
    """Results of :func:`score_attack`.

    Attributes:
        member_scores, nonmember_scores: ``score_samples`` of the target model (log-density;
            higher = guessed member), shapes (n_members,) and (n_nonmembers,).
        member_calibrated, nonmember_calibrated: the scores minus the mean score of the
            reference models (none of which saw the row) over their standard deviation, or
            ``None`` without reference models.
    """

    member_scores: np.ndarray
    nonmember_scores: np.ndarray
    member_calibrated: np.ndarray | None = None
    nonmember_calibrated: np.ndarray | None = None

    @property
    def auc(self) -> float:
        """The loss attack's :func:`membership_auc`."""
        return membership_auc(self.member_scores, self.nonmember_scores)

    @property
    def calibrated_auc(self) -> float | None:
        """The calibrated (offline LiRA) attack's :func:`membership_auc`, or ``None``."""
        if self.member_calibrated is None:
            return None
        return membership_auc(self.member_calibrated, self.nonmember_calibrated)


def _scores(detector, X: np.ndarray) -> np.ndarray:
    return np.asarray(detector.score_samples(X), dtype=float).ravel()


def score_attack(
    detector_factory: Callable[[], object],
    X_members: np.ndarray,
    X_nonmembers: np.ndarray,
    X_reference: np.ndarray | None = None,
    n_reference: int = 4,
    fit_kwargs: dict | None = None,
    seed: int = 0,
) -> ScoreAttack:
    """The loss attack (and its calibrated form) on a detector fitted to ``X_members``.

    ``detector_factory()`` makes an unfitted detector (scikit-learn's ``GaussianMixture``, a
    :mod:`fednovelty.detectors` detector, ...); it is fitted with
    ``fit(X_members, **fit_kwargs)``, and its ``score_samples`` (log-density) of members and
    non-members are the attack's scores. With ``X_reference`` (rows of the same
    distribution, disjoint from both sets), ``n_reference`` reference detectors are each
    fitted to ``len(X_members)`` rows drawn from it; each row's calibrated score is its score
    minus the reference models' mean score of it, over their standard deviation (offline
    LiRA with a global threshold).

    Args:
        detector_factory: returns a fresh unfitted detector.
        X_members: (n_members, d) the training rows.
        X_nonmembers: (n_nonmembers, d) held-out rows of the same distribution.
        X_reference: (n_reference_rows, d) rows for the reference models, at least
            ``len(X_members)``; ``None`` skips the calibrated attack.
        n_reference: reference models (>= 2, for a standard deviation).
        fit_kwargs: extra keyword arguments of ``fit`` (e.g. ``groups``: then the reference
            models get the same group labels).
        seed: seeds the reference models' row draws.

    Raises:
        ValueError: sets with different feature counts, too few reference rows or models.
    """
    X_members, X_nonmembers = np.asarray(X_members, float), np.asarray(X_nonmembers, float)
    if X_members.ndim != 2 or X_nonmembers.ndim != 2 or X_members.shape[1] != X_nonmembers.shape[1]:
        raise ValueError(
            "X_members and X_nonmembers must be 2-D with the same feature count; got shapes "
            f"{X_members.shape} and {X_nonmembers.shape}."
        )
    fit_kwargs = dict(fit_kwargs or {})
    target = detector_factory().fit(X_members, **fit_kwargs)
    members, nonmembers = _scores(target, X_members), _scores(target, X_nonmembers)
    if X_reference is None:
        return ScoreAttack(members, nonmembers)
    X_reference = np.asarray(X_reference, float)
    if X_reference.ndim != 2 or X_reference.shape[0] < X_members.shape[0]:
        raise ValueError(
            f"X_reference must be (m, {X_members.shape[1]}) with m >= {X_members.shape[0]} "
            f"rows (one reference training set); got shape {X_reference.shape}."
        )
    if n_reference < 2:
        raise ValueError(f"n_reference must be >= 2 (a spread is taken); got {n_reference!r}.")
    rng = np.random.default_rng(seed)
    both = np.vstack([X_members, X_nonmembers])
    reference = np.empty((n_reference, both.shape[0]))
    for j in range(n_reference):
        rows = rng.choice(X_reference.shape[0], X_members.shape[0], replace=False)
        reference[j] = _scores(detector_factory().fit(X_reference[rows], **fit_kwargs), both)
    spread = reference.std(axis=0, ddof=1)
    spread = np.maximum(spread, 1e-12 * (1 + np.abs(reference).mean(axis=0)))
    calibrated = (np.r_[members, nonmembers] - reference.mean(axis=0)) / spread
    n = X_members.shape[0]
    return ScoreAttack(members, nonmembers, calibrated[:n], calibrated[n:])
