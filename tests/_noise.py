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


def assert_fresh_noise(fit) -> None:
    """``fit(**settings)`` -> a fitted detector with ``means_`` (``epsilon``: a private fit
    of that budget, else a plain one): under DP two fits with the
    same data and ``random_state`` (or after numpy's legacy global seed) release different
    noise, while two fits without DP stay identical (an adversary who knows the seed and
    every other row cannot replay a private fit)."""
    import numpy as np

    a, b = fit(epsilon=1.0, random_state=3), fit(epsilon=1.0, random_state=3)
    assert not np.array_equal(a.means_, b.means_)
    plain = [fit(random_state=3).means_ for _ in range(2)]
    np.testing.assert_array_equal(plain[0], plain[1])  # one computation, run twice
    np.random.seed(0)  # noqa: NPY002 - the legacy global seed is the scenario under test
    c = fit(epsilon=1.0, random_state=None)
    np.random.seed(0)  # noqa: NPY002
    d = fit(epsilon=1.0, random_state=None)
    assert not np.array_equal(c.means_, d.means_)
