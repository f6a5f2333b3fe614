"""A released log-likelihood sum of many clients at once, winsorised as one client's.

:func:`~fednovelty.federated.trust.contrast.winsorised_row_values` (with its one power) gives
the per-row values a client sums into the log-likelihood it releases and the effective rows
behind that sum (:func:`~fednovelty.federated.trust.contrast.clipped_deviations`: the values
as they are where the deviations from their median back the sum, else every deviation
clipped to the ``min_rows``-th largest). :func:`winsorised_sums_many` does the same for the
per-row values of ``G`` clients held padded in one (G, m) tensor, each client with its own
row count and floor: the same selections (lower median, ``k``-th largest deviation, by
sorting each row) and the same elementwise arithmetic, with sums over a padded row, which
equal one client's sums to round-off. The batched E-step
(:mod:`~fednovelty.federated.mixtures.batched_e_step`) reads it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fednovelty.federated.trust.backing import backed, effective_rows

__all__ = ["deviation_rows_many", "winsorised_sums_many"]


def _lower_median(values: Tensor, real: Tensor, lengths: Tensor) -> Tensor:
    """Each row's lower median (``torch.median`` of a 1-D tensor) of its real entries:
    (G, 1). ``values`` (G, m), ``real`` (G, m) bool, ``lengths`` (G,) int64 >= 1."""
    padded = torch.where(real, values, torch.inf)
    position = ((lengths - 1) // 2).unsqueeze(1).to(values.device)
    return padded.sort(1).values.gather(1, position)


def deviation_rows_many(values: Tensor, real: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`~fednovelty.federated.trust.backing.deviation_rows` of each row's real entries.

    Args:
        values: (G, m) per-row values, row ``g``'s in its first ``lengths[g]`` entries.
        real: (G, m) bool, the real entries; lengths: (G,) int64, each >= 1.

    Returns:
        ``(rows, median)``: (G,) the effective rows behind each row's sum, (G, 1) its
        lower median.
    """
    median = _lower_median(values, real, lengths)
    deviation = torch.where(real, (values - median).abs(), 0.0)
    rows = effective_rows(deviation.sum(1), deviation.square().sum(1))
    count = lengths.to(device=values.device, dtype=values.dtype)
    return torch.where(deviation.amax(1) == 0, count, rows), median


def winsorised_sums_many(
    per_row: Tensor, lengths: Tensor, min_rows: Tensor
) -> tuple[Tensor, Tensor]:
    """What each of ``G`` clients releases as the sum of its per-row values (a
    log-likelihood) under :func:`~fednovelty.federated.trust.contrast.winsorised_row_values`
    (power 1), and the effective rows behind it.

    Args:
        per_row: (G, m) each client's per-row values in its first ``lengths[g]`` entries
            (the rest is not read).
        lengths: (G,) int64 row counts, each >= 1.
        min_rows: (G,) int64 each client's floor.

    Returns:
        ``(sums, rows)``, each (G,): ``n_g`` times the mean of the values client ``g`` sums
        (as one client's reply forms its log-likelihood), and the effective rows behind
        them (``n_g`` where ``min_rows[g] <= 1``).
    """
    m = per_row.shape[1]
    device = per_row.device
    lengths = lengths.to(device)
    min_rows = min_rows.to(device)
    real = torch.arange(m, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    values = torch.where(real, per_row, 0.0)
    rows, median = deviation_rows_many(values, real, lengths)
    kept = backed(rows, min_rows) | (min_rows <= 1)
    deviation = values - median
    k = torch.minimum(min_rows, lengths).clamp_min(1)
    magnitude = torch.where(real, deviation.abs(), -1.0)
    c = magnitude.sort(1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
    clipped = torch.where(real, median + torch.clamp(deviation, -c, c), 0.0)
    clipped_rows, _ = deviation_rows_many(clipped, real, lengths)
    count = lengths.to(per_row.dtype)
    released = torch.where(kept.unsqueeze(1), values, clipped)
    sums = released.sum(1) / count * count
    rows = torch.where(min_rows <= 1, count, torch.where(kept, rows, clipped_rows))
    return sums, rows
