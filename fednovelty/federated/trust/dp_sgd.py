"""Differentially private SGD for the learners, and its accounting beside the statistics'.

A learner trained on a client's rows and sent to the server reveals them as much as its
gradients do. DP-SGD (Abadi et al., CCS 2016) bounds that per row (:func:`private_sgd`):
each step draws a Poisson sample of the rows (rate ``q``, from the client's fresh entropy),
takes each sampled row's gradient (``torch.func``: ``vmap`` of ``grad``), clips it to L2 norm
``C`` over all the learners' parameters together, adds Gaussian noise ``sigma * C`` to the
sum and divides by the expected sample ``q * n``. A step is a Poisson-subsampled Gaussian
mechanism; the trained weights are post-processing.

A row's loss is ``sum_m w(m) CE(y, f_m(x))`` with responsibilities summing to at most 1
(``row_loss`` replaces the cross-entropy), so one clipped gradient bounds what a row changes
in all ``M`` learners: one mechanism a step, not ``M``. A loss of pairs of rows
(``pairs=True``) puts each step's sample in a random cycle, each row one unit with its
successor (:func:`pair_units`), each unit clipped to ``C / 3`` (:func:`pair_settings`):
adding a row adds its unit and changes its predecessor's, at most ``C`` in all, so the
accounting is the same (the argument in ``docs/differential_privacy.md``).

Accounting (:func:`learning_epsilon`): the statistics' releases compose into one Gaussian
mechanism, the steps into a self-composed Poisson-subsampled Gaussian, and dp-accounting's
PLD accountant composes the two. :func:`calibrate_learning` finds the statistics' ``z`` and
the steps' ``sigma`` that spend a budget together, splitting it by ``share`` of ``mu**2`` in
Gaussian differential privacy (the steps' ``mu`` from Bu et al.'s central-limit
approximation, used only to pick the split: the accountant of record decides).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, replace

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fednovelty.federated.trust.dp_calibration import MAX_EPSILON, _gdp_mu
from fednovelty.federated.trust.dp_split import STAT_BLOCKS
from fednovelty.federated.trust.ledger import gaussian_cost, ledger_epsilon
from fednovelty.federated.trust.noise import NoiseSource, add_gaussian, check_source

#: the noise on a released histogram of responsibilities (e.g. joint counts), as a multiple
#: of the release's multiplier ``z``: the counts' share of a release (one row moves a
#: histogram by at most 1 in L2); the block costs ``1 / 8**2`` of a Gaussian mechanism of
#: multiplier ``z`` (:func:`histogram_blocks`).
HISTOGRAM_SHARE = 8.0
#: the most rows whose gradients are held at once (memory: rows x parameters).
GRADIENT_CHUNK = 256
#: how many times a pair unit's clip one row can move a step's sum (:func:`pair_settings`).
PAIR_SENSITIVITY = 3.0

#: a row's loss ``row_loss(params, x, label, w) -> 0-d``: the ``M`` parameter dicts, one
#: row of ``X`` and of ``y`` and the row's weights (M,).
RowLoss = Callable[[Sequence[dict[str, Tensor]], Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class DPSGDSettings:
    """One client's DP-SGD: its own settings (``PrivacyPolicy.dp_sgd``), never read from a
    message or from the run's settings.

    Attributes:
        noise_multiplier: ``sigma`` >= 0, the noise on a step's summed clipped gradients in
            units of ``clip_norm`` (0: clipping without noise, no guarantee).
        clip_norm: ``C`` > 0, the L2 bound of one row's gradient (all learners together).
        sample_rate: ``q`` in (0, 1], each row's chance to be in a step's sample.
        steps: the most steps of one round (>= 0); a round runs exactly these.
        expected_batch: the public divisor of a step's noisy gradient sum (keyword-only,
            > 0): the sample size the client's settings plan for. Never the client's row
            count or its sample's size, which the accountant does not cover.

    Raises:
        ValueError: a field out of range, naming it.
    """

    noise_multiplier: float
    clip_norm: float
    sample_rate: float
    steps: int
    _: KW_ONLY
    expected_batch: float = 32.0

    def __post_init__(self) -> None:
        for name, low in (
            ("noise_multiplier", 0.0),
            ("clip_norm", None),
            ("expected_batch", None),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not (
                isinstance(value, int | float)
                and math.isfinite(value)
                and (value >= low if low is not None else value > 0)
            ):
                raise ValueError(
                    f"DPSGDSettings.{name} must be a finite number "
                    f"{'>= 0' if low is not None else '> 0'}; got {value!r}."
                )
        q = self.sample_rate
        if isinstance(q, bool) or not (isinstance(q, int | float) and 0 < q <= 1):
            raise ValueError(f"DPSGDSettings.sample_rate must be in (0, 1]; got {q!r}.")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"DPSGDSettings.steps must be an int >= 0; got {self.steps!r}.")


def steps_for_epochs(epochs: int, sample_rate: float) -> int:
    """The Poisson-sampled steps that visit each row ``epochs`` times in expectation:
    ``ceil(epochs / q)``."""
    return math.ceil(int(epochs) / float(sample_rate) - 1e-9) if epochs > 0 else 0


# --------------------------------------------------------------------------- gradients
def per_row_gradients(
    template: nn.Module,
    params: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    weight: Tensor,
    offset: Tensor | None = None,
    row_loss: RowLoss | None = None,
) -> list[dict[str, Tensor]]:
    """Each row's gradient of its loss: by default ``sum_m weight[i, m] CE(y_i, f_m(x_i) +
    offset_i)``, else ``row_loss(params, X[i], y[i], weight[i])``.

    Args:
        template: the learners' module (evaluated with each of ``params``).
        params: ``M`` dicts of parameter tensors.
        X: rows (n, ...); y: labels (n, ...); weight: (n, M).
        offset: logits added to every learner's, (n, n_classes), or ``None`` (the default
            loss only).
        row_loss: a row's loss (:data:`RowLoss`, traced by ``torch.func``: no
            data-dependent Python branches), or ``None`` for the cross-entropy.

    Returns:
        ``M`` dicts of per-row gradients, each tensor (n, *parameter shape).

    Raises:
        ValueError: both ``offset`` and ``row_loss``.
    """
    if row_loss is not None and offset is not None:
        raise ValueError("offset belongs to the default cross-entropy; fold it into row_loss.")

    def cross_entropy(ps, x, label, w, off):
        total = x.new_zeros(())
        for m, p in enumerate(ps):
            out = functional_call(template, p, (x.unsqueeze(0),))
            if off is not None:
                out = out + off.unsqueeze(0)
            total = total + w[m] * nn.functional.cross_entropy(out, label.unsqueeze(0))
        return total

    def custom(ps, x, label, w, off):
        return row_loss(ps, x, label, w)

    loss = cross_entropy if row_loss is None else custom
    dims = (None, 0, 0, 0, None if offset is None else 0)
    return vmap(grad(loss), in_dims=dims)(list(params), X, y, weight, offset)


def clipped_gradient_sum(
    grads: Sequence[dict[str, Tensor]], clip_norm: float
) -> tuple[list[dict[str, Tensor]], Tensor]:
    """The sum over rows of per-row gradients each scaled to L2 norm at most ``clip_norm``
    over all the learners' parameters together.

    Args:
        grads: ``M`` dicts of per-row gradients, each (n, *shape).

    Returns:
        ``(sums, norms)``: ``M`` dicts of (*shape) sums, and the rows' norms before
        clipping (n,).
    """
    flat = [g.flatten(1) for d in grads for g in d.values()]
    norms = torch.cat(flat, dim=1).norm(dim=1)
    scale = (clip_norm / norms.clamp_min(1e-300)).clamp(max=1.0)
    sums = [
        {k: torch.einsum("n,n...->...", scale.to(g.dtype), g) for k, g in d.items()} for d in grads
    ]
    return sums, norms


def private_gradient(
    template: nn.Module,
    params: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    weight: Tensor,
    rows: Tensor,
    settings: DPSGDSettings,
    source: NoiseSource,
    offset: Tensor | None = None,
    row_loss: RowLoss | None = None,
) -> list[dict[str, Tensor]]:
    """One DP-SGD step's gradient: the clipped per-row gradients of the sampled ``rows``
    summed, Gaussian noise of ``sigma * C`` added to every coordinate, divided by the public
    constant ``settings.expected_batch`` (neither the sample's size nor the client's row
    count is read: dividing by either would release a value the accountant never saw).

    Args:
        rows: the indices of the step's Poisson sample, (b,).
        row_loss: a row's loss (:func:`per_row_gradients`), ``None``: the cross-entropy.

    Returns:
        ``M`` dicts of (*shape) noisy mean gradients.
    """
    total: list[dict[str, Tensor]] = [
        {k: torch.zeros_like(v) for k, v in p.items()} for p in params
    ]
    detached = [{k: v.detach() for k, v in p.items()} for p in params]
    for begin in range(0, int(rows.numel()), GRADIENT_CHUNK):
        chunk = rows[begin : begin + GRADIENT_CHUNK]
        part = None if offset is None else offset[chunk]
        grads = per_row_gradients(
            template, detached, X[chunk], y[chunk], weight[chunk], part, row_loss
        )
        sums, _ = clipped_gradient_sum(grads, settings.clip_norm)
        for acc, piece in zip(total, sums, strict=True):
            for k in acc:
                acc[k] += piece[k]
    spread = settings.noise_multiplier * settings.clip_norm
    expected = float(settings.expected_batch)
    out = []
    for acc in total:
        noisy = {}
        for k, v in acc.items():
            noisy[k] = add_gaussian(v, spread, source) / expected
        out.append(noisy)
    return out


def private_sgd(
    template: nn.Module,
    starts: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    weight: Tensor,
    settings: DPSGDSettings,
    source: NoiseSource,
    *,
    learning_rate: float,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    mu_prox: float = 0.0,
    offset: Tensor | None = None,
    row_loss: RowLoss | None = None,
    pairs: bool = False,
) -> list[dict[str, Tensor]]:
    """``settings.steps`` DP-SGD steps of the ``M`` learners ``starts`` together on
    ``mean_i sum_m weight[i, m] CE(y_i, f_m(x_i) + offset_i)`` (module docstring), or on
    the mean of ``row_loss``.

    Each step samples every row with probability ``q`` from ``source`` (the client's
    fresh entropy, :mod:`fednovelty.federated.trust.noise`: a server that knew the sample would
    undo its amplification), takes :func:`private_gradient` and hands it to the optimiser
    (``"sgd"`` with ``momentum``, or ``"adam"``: both post-process the noisy gradient).
    The proximal term ``mu_prox / 2 ||theta - start||^2`` reads no row, so its gradient is
    added without noise.

    Args:
        template: the learners' module; starts: ``M`` parameter dicts, not modified.
        X: rows (n, n_features); y: labels (n,); weight: (n, M), rows summing to <= 1.
        settings: the client's :class:`DPSGDSettings`.
        source: the draws of the samples and the noise
            (:func:`~fednovelty.federated.trust.dp.release_noise`).
        offset: fixed logits added to every learner's, (n, n_classes), or ``None``.
        row_loss: a row's loss (:func:`per_row_gradients`); with ``pairs`` a unit's, whose
            ``x`` (2, ...) and ``label`` (2, ...) stack the row and its partner.
        pairs: the loss is one of pairs of rows: each step's units are
            :func:`pair_units` of its sample, clipped and noised by :func:`pair_settings`
            (module docstring); a unit's weights are its first row's (0 for a row alone in
            its sample).

    Returns:
        ``M`` dicts of trained (detached) parameters.

    Raises:
        ValueError: ``weight`` not (n, M) with values in [0, 1] and rows summing to <= 1;
            ``pairs`` without ``row_loss`` or with ``offset``.
    """
    from fednovelty.federated.core.learners import OPTIMIZERS

    n, m = X.shape[0], len(starts)
    if tuple(weight.shape) != (n, m):
        raise ValueError(f"weight must have shape ({n}, {m}); got {tuple(weight.shape)}.")
    if bool((weight < 0).any()) or bool((weight.sum(1) > 1 + 1e-6).any()):
        raise ValueError(
            "DP-SGD's per-row bound needs responsibilities in [0, 1] summing to at most 1 "
            "over the learners; normalise the weights."
        )
    if pairs and (row_loss is None or offset is not None):
        raise ValueError("pairs=True needs a row_loss of a pair of rows and no offset.")
    params = [{k: v.detach().clone().requires_grad_(True) for k, v in p.items()} for p in starts]
    options = {"lr": learning_rate}
    if optimizer == "sgd" and momentum > 0:
        options["momentum"] = momentum
    flat = [v for p in params for v in p.values()]
    step = OPTIMIZERS[optimizer](flat, **options)
    if n == 0:
        return [{k: v.detach() for k, v in p.items()} for p in params]
    for _ in range(settings.steps):
        keep = check_source(source).uniform((n,)) < settings.sample_rate
        rows = keep.nonzero().flatten().to(X.device)
        if pairs:
            first, second = pair_units(rows, source)
            alone = (first == second).to(weight.dtype).unsqueeze(1)
            noisy = private_gradient(
                template,
                params,
                torch.stack([X[first], X[second]], dim=1),
                torch.stack([y[first], y[second]], dim=1),
                weight[first] * (1 - alone),
                torch.arange(first.numel(), device=X.device),
                pair_settings(settings),
                source,
                row_loss=row_loss,
            )
        else:
            noisy = private_gradient(
                template, params, X, y, weight, rows, settings, source, offset, row_loss
            )
        step.zero_grad()
        for p, g, start in zip(params, noisy, starts, strict=True):
            for k, v in p.items():
                prox = mu_prox * (v.detach() - start[k]) if mu_prox > 0 else 0.0
                v.grad = g[k] + prox
        step.step()
    return [{k: v.detach() for k, v in p.items()} for p in params]


def pair_units(rows: Tensor, source: NoiseSource) -> tuple[Tensor, Tensor]:
    """A step's pair units: the sampled ``rows`` (b,) in a uniformly random cyclic order
    drawn from ``source``, each with its successor. Returns ``(first, second)``, both
    (b,); a single row is its own successor (a unit of weight 0 in :func:`private_sgd`)."""
    order = rows[source.permutation(rows.numel()).to(rows.device)]
    return order, order.roll(-1)


def pair_settings(settings: DPSGDSettings) -> DPSGDSettings:
    """The clip and multiplier of pair units that spend what ``settings`` spends on rows:
    units clipped to ``C / 3`` (one row moves a step's sum by at most ``C``: module
    docstring), noise ``3 sigma`` times that clip, i.e. ``sigma * C``."""
    return replace(
        settings,
        clip_norm=settings.clip_norm / PAIR_SENSITIVITY,
        noise_multiplier=settings.noise_multiplier * PAIR_SENSITIVITY,
    )


# --------------------------------------------------------------------------- accounting
def histogram_blocks(count: int = 1) -> float:
    """What ``count`` released histograms (noise ``HISTOGRAM_SHARE * z``, sensitivity 1)
    add to a release's blocks: ``count / HISTOGRAM_SHARE**2`` Gaussian mechanisms of
    multiplier ``z``."""
    return count / HISTOGRAM_SHARE**2


def learning_epsilon(
    noise_multiplier: float,
    stat_blocks: float,
    sgd_noise: float,
    sample_rate: float,
    sgd_steps: int,
    delta: float,
    resolution: float = 1e-4,
) -> float:
    """The epsilon at ``delta`` of ``stat_blocks`` Gaussian mechanisms of multiplier
    ``noise_multiplier`` (the statistics' releases: 3 per release, plus
    :func:`histogram_blocks`) composed with ``sgd_steps`` Poisson-subsampled Gaussian
    mechanisms (rate ``sample_rate``, multiplier ``sgd_noise``), read from dp-accounting's
    privacy-loss-distribution accountant. ``inf`` when a part has no noise.

    Raises:
        ValueError: negative counts, ``sample_rate`` outside (0, 1] or ``delta`` outside
            (0, 1).
    """
    if stat_blocks < 0 or sgd_steps < 0:
        raise ValueError(f"stat_blocks and sgd_steps must be >= 0; got {stat_blocks}, {sgd_steps}.")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1]; got {sample_rate!r}.")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1); got {delta!r}.")
    if (stat_blocks > 0 and noise_multiplier <= 0) or (sgd_steps > 0 and sgd_noise <= 0):
        return math.inf
    steps = (((float(sgd_noise), float(sample_rate)), int(sgd_steps)),) if sgd_steps > 0 else ()
    return ledger_epsilon(gaussian_cost(noise_multiplier, stat_blocks), steps, delta, resolution)


def sgd_mu(sgd_noise: float, sample_rate: float, sgd_steps: int) -> float:
    """Bu et al.'s central-limit ``mu`` of ``sgd_steps`` Poisson-subsampled Gaussian
    mechanisms: ``q sqrt(T (exp(1 / sigma**2) - 1))`` (an approximation, used to split a
    budget, never to account for it)."""
    return sample_rate * math.sqrt(sgd_steps * math.expm1(1.0 / sgd_noise**2))


def calibrate_learning(
    epsilon: float,
    delta: float,
    stat_blocks: float,
    sgd_steps: int,
    sample_rate: float,
    share: float = 0.5,
    tolerance: float = 2e-3,
) -> tuple[float, float]:
    """The statistics' multiplier ``z`` and the steps' ``sigma`` that together spend at
    most ``epsilon`` at ``delta`` (:func:`learning_epsilon`).

    The split: in Gaussian differential privacy the budget is one ``mu`` (Balle and Wang's
    analytic calibration); the statistics get ``share * mu**2`` and the steps the rest, the
    steps' ``sigma`` solving :func:`sgd_mu`. Both are then scaled by one factor, found by
    bisection on the accountant of record.

    Returns:
        ``(z, sigma)``.

    Raises:
        ValueError: ``epsilon`` outside ``(0, MAX_EPSILON]``, ``share`` outside (0, 1), or
            nothing to calibrate.
    """
    if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_EPSILON):
        raise ValueError(f"epsilon must be in (0, {MAX_EPSILON:g}]; got {epsilon!r}.")
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1); got {share!r}.")
    if stat_blocks <= 0 or sgd_steps <= 0:
        raise ValueError(
            f"calibrate_learning needs statistics and steps (stat_blocks={stat_blocks}, "
            f"sgd_steps={sgd_steps}); use dp_calibration.calibrate_noise for statistics alone."
        )
    mu = _gdp_mu(epsilon, delta)
    z0 = math.sqrt(stat_blocks) / (mu * math.sqrt(share))
    target = mu * math.sqrt(1 - share) / sample_rate
    sigma0 = 1.0 / math.sqrt(math.log1p(target**2 / sgd_steps))

    def spent(t: float, resolution: float = 1e-3) -> float:
        return learning_epsilon(
            z0 * t, stat_blocks, sigma0 * t, sample_rate, sgd_steps, delta, resolution
        )

    low, high = 0.9, 1.1
    while spent(high) > epsilon:
        low, high = high, high * 1.5
    while spent(low) <= epsilon and low > 1e-3:
        high, low = low, low / 1.5
    while high - low > tolerance * high:
        middle = (low + high) / 2
        low, high = (middle, high) if spent(middle) > epsilon else (low, middle)
    while spent(high, 1e-4) > epsilon:  # the accountant of record
        high *= 1 + tolerance
    return z0 * high, sigma0 * high


def release_blocks(releases: int, histograms: int = 0) -> float:
    """The Gaussian mechanisms of multiplier ``z`` that ``releases`` releases of summed
    statistics (:data:`~fednovelty.federated.trust.dp_split.STAT_BLOCKS`) and ``histograms``
    released histograms amount to."""
    return len(STAT_BLOCKS) * releases + histogram_blocks(histograms)


__all__ = [
    "GRADIENT_CHUNK",
    "HISTOGRAM_SHARE",
    "PAIR_SENSITIVITY",
    "DPSGDSettings",
    "RowLoss",
    "calibrate_learning",
    "clipped_gradient_sum",
    "histogram_blocks",
    "learning_epsilon",
    "pair_settings",
    "pair_units",
    "per_row_gradients",
    "private_gradient",
    "private_sgd",
    "release_blocks",
    "sgd_mu",
    "steps_for_epochs",
]
