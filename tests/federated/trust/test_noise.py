"""Randomness for privacy (``fednovelty.federated.trust.noise``): fresh OS entropy by default, a
reproducible stream only behind the test seed, Gaussian draws of the right law, and noisy
values rounded to the noise's grid."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fednovelty.federated.trust.noise import (
    GRID_BITS,
    SeededNoise,
    SystemNoise,
    add_gaussian,
    check_source,
    fresh_noise,
    grid_round,
    noise_source,
)


def test_system_noise_reads_fresh_os_entropy_every_draw(monkeypatch):
    """Each draw reads its own bytes from os.urandom (8 a word), keeps no state, and two
    sources (or two draws of one) never agree."""
    calls = []
    real = __import__("os").urandom

    def counting(n):
        calls.append(n)
        return real(n)

    monkeypatch.setattr("fednovelty.federated.trust.noise.os.urandom", counting)
    source = fresh_noise()
    first, second = source.normal((64,)), source.normal((64,))
    assert calls == [8 * 64, 8 * 64]  # two uniforms (128 bits) a pair of normals
    assert not torch.equal(first, second)
    assert not torch.equal(first, SystemNoise().normal((64,)))
    assert not source.reproducible and SeededNoise(0).reproducible


def test_normal_draws_follow_the_standard_normal_law():
    """Kolmogorov-Smirnov against scipy's normal, moments, and independence of neighbours
    (Box-Muller's two outputs of one pair are independent)."""
    draws = fresh_noise().normal((200_000,)).numpy()
    assert stats.kstest(draws, "norm").pvalue > 1e-4
    assert abs(draws.mean()) < 5 / math.sqrt(draws.size)
    assert abs(draws.std() - 1) < 5 / math.sqrt(2 * draws.size)
    assert abs(np.corrcoef(draws[:-1], draws[1:])[0, 1]) < 5 / math.sqrt(draws.size)
    uniform = fresh_noise().uniform((100_000,)).numpy()
    assert uniform.min() > 0 and uniform.max() <= 1
    assert stats.kstest(uniform, "uniform").pvalue > 1e-4


def test_a_test_seed_reproduces_its_stream_and_keys_separate_streams():
    assert torch.equal(SeededNoise(3, 1, 0).normal((5,)), SeededNoise(3, 1, 0).normal((5,)))
    assert not torch.equal(SeededNoise(3, 1, 0).normal((5,)), SeededNoise(3, 1, 1).normal((5,)))
    assert not torch.equal(SeededNoise(3, 1, 0).normal((5,)), SeededNoise(4, 1, 0).normal((5,)))
    assert isinstance(noise_source(None, 1, 2), SystemNoise)
    assert noise_source(7, 1, 2).keys == (1, 2)
    with pytest.raises(TypeError, match="int seed"):
        SeededNoise("7")


def test_integers_and_permutations_are_uniform():
    source = SeededNoise(11)
    counts = np.bincount([source.randint(3) for _ in range(6000)], minlength=3)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert sorted(source.permutation(10).tolist()) == list(range(10))
    firsts = np.bincount([int(source.permutation(4)[0]) for _ in range(4000)], minlength=4)
    assert stats.chisquare(firsts).pvalue > 1e-4
    with pytest.raises(ValueError, match="high >= 1"):
        source.randint(0)


def test_a_mechanism_refuses_a_torch_generator_or_a_seed():
    with pytest.raises(TypeError, match="NoiseSource"):
        check_source(torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="NoiseSource"):
        add_gaussian(torch.zeros(3), 1.0, 0)


def test_noisy_values_land_on_the_noise_grid_and_keep_their_spread():
    """The released value is a multiple of 2^(floor(log2 std) - GRID_BITS): rounding moves it
    by at most half a step, and the spread is the calibrated one."""
    std = 3.0
    step = 2.0 ** (math.floor(math.log2(std)) - GRID_BITS)
    value = torch.full((50_000,), 0.123456789, dtype=torch.float64)
    noisy = add_gaussian(value, std, SeededNoise(5))
    assert torch.equal(noisy, torch.round(noisy / step) * step)
    assert abs(float((noisy - value).std()) / std - 1) < 0.02
    raw = torch.tensor([1.0 + step / 3, -2.0 - step * 0.6], dtype=torch.float64)
    assert torch.equal(grid_round(raw, std), torch.tensor([1.0, -2.0 - step], dtype=torch.float64))
    assert torch.equal(grid_round(raw, 0.0), raw)  # no noise, no rounding
    assert torch.equal(add_gaussian(value, 0.0, SeededNoise(5)), value)


def test_symmetric_noise_mirrors_the_upper_triangle():
    noisy = add_gaussian(torch.zeros(2000, 3, 3), 0.5, SeededNoise(2), symmetric=True)
    assert torch.equal(noisy, noisy.transpose(-1, -2))
    upper = noisy[:, *np.triu_indices(3)]
    assert abs(float(upper.std()) / 0.5 - 1) < 0.03
