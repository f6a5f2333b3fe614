"""Reproducible privacy noise for tests that compare two fits or pin a noisy figure.

A detector draws its privacy noise from fresh OS entropy and offers no seed (a seed would
void its guarantee). :func:`seeded_noise` patches ``fednovelty.federated.trust.noise.fresh_noise``
for the block, so every draw comes from a seeded stream in the order the fit asks.
"""

from __future__ import annotations

import itertools
from unittest import mock

from fednovelty.federated.trust import noise


def seeded_noise(seed: int = 7):
    """A context manager: within it every source of privacy noise is
    ``SeededNoise(seed, k)`` for the ``k``-th source asked for."""
    draws = itertools.count()
    return mock.patch.object(noise, "fresh_noise", lambda: noise.SeededNoise(seed, next(draws)))
