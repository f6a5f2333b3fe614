"""Randomness for privacy: every draw of a differential-privacy mechanism (Gaussian noise,
DP-SGD's Poisson samples, a private fit's start, a noisy choice) comes from a
:class:`NoiseSource`, never from ``random_state``, a broadcast value or a short seed (noise
that someone can re-draw protects nothing).

- :class:`SystemNoise` (the default, :func:`fresh_noise`): every draw reads fresh bytes from
  the operating system's CSPRNG (``os.urandom``; 64 bits a uniform, 128 bits a pair of
  normals); no state is kept between draws.
- :class:`SeededNoise`: reproducible draws (numpy's Philox keyed by ``SeedSequence(seed,
  keys)``) for tests that compare two engines bit for bit; whoever knows the seed re-draws
  the noise, so it gives no privacy guarantee (:attr:`NoiseSource.reproducible`).

Floating point: a sampler mapping uniform doubles through a transform (Box-Muller here) does
not reach every double near its output, and the low-order bits of ``x + noise`` can tell
neighbours apart (Mironov 2012). :func:`add_gaussian` rounds every noisy value to a
power-of-two grid ``2^-GRID_BITS`` of the noise's standard deviation (post-processing): a
mitigation, not a proof; the discrete Gaussian on quantised statistics is not built
(``docs/differential_privacy.md``).
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod

import numpy as np
import torch
from torch import Tensor

#: the noisy value's grid, as a power of two below its noise's standard deviation.
GRID_BITS = 30


class NoiseSource(ABC):
    """Where a privacy mechanism's random draws come from (module docstring).

    Every method returns CPU float64 (``permutation``: int64) tensors; callers move them.
    """

    #: whether someone who knows the seed can re-draw the noise (no privacy guarantee).
    reproducible: bool = False

    @abstractmethod
    def bits(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit words, ``(n,)`` uint64."""

    def uniform(self, shape: tuple[int, ...]) -> Tensor:
        """Independent uniforms in ``(0, 1]`` of ``shape``: the top 53 bits of a word, plus
        one, over 2^53 (never 0, so a logarithm of one is finite)."""
        n = math.prod(shape)
        words = self.bits(n) >> np.uint64(11)
        values = (words.astype(np.float64) + 1.0) * 2.0**-53
        return torch.from_numpy(values).reshape(shape)

    def normal(self, shape: tuple[int, ...]) -> Tensor:
        """Independent standard normals of ``shape`` by Box-Muller on pairs of
        :meth:`uniform` draws (128 bits of the source per pair)."""
        n = math.prod(shape)
        pairs = (n + 1) // 2
        u = self.uniform((2, pairs))
        radius = torch.sqrt(-2.0 * torch.log(u[0]))
        angle = 2.0 * math.pi * u[1]
        values = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]
        return values.reshape(shape)

    def randint(self, high: int) -> int:
        """A uniform integer in ``[0, high)`` (the modulo bias is below ``high / 2^64``)."""
        if int(high) < 1:
            raise ValueError(f"randint needs high >= 1; got {high!r}.")
        return int(self.bits(1)[0] % np.uint64(int(high)))

    def permutation(self, n: int) -> Tensor:
        """A uniformly random permutation of ``range(n)`` (int64 ``(n,)``): the order of
        ``n`` random 64-bit keys (ties have probability below ``n^2 / 2^64``)."""
        keys = self.bits(n)
        return torch.from_numpy(np.argsort(keys, kind="stable").astype(np.int64))


class SystemNoise(NoiseSource):
    """Draws from the operating system's CSPRNG (``os.urandom``); keeps no state."""

    reproducible = False

    def bits(self, n: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * int(n)), dtype=np.uint64).copy()

    def __repr__(self) -> str:
        return "SystemNoise()"


class SeededNoise(NoiseSource):
    """Reproducible draws for tests: numpy's Philox keyed by ``SeedSequence(seed,
    spawn_key=keys)`` (independent streams for different keys, e.g. a client and its
    release index). Gives no privacy guarantee: whoever knows ``seed`` re-draws it.

    Raises:
        TypeError: ``seed`` or a key not an int.
    """

    reproducible = True

    def __init__(self, seed: int, *keys: int) -> None:
        for value in (seed, *keys):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(f"SeededNoise takes int seed and keys; got {value!r}.")
        sequence = np.random.SeedSequence(int(seed), spawn_key=tuple(int(k) for k in keys))
        self._generator = np.random.Generator(np.random.Philox(sequence))
        self.seed, self.keys = int(seed), tuple(int(k) for k in keys)

    def bits(self, n: int) -> np.ndarray:
        return self._generator.integers(0, 2**64, size=int(n), dtype=np.uint64)

    def __repr__(self) -> str:
        return f"SeededNoise({self.seed}, *{self.keys})"


def fresh_noise() -> SystemNoise:
    """A source of fresh OS entropy (:class:`SystemNoise`)."""
    return SystemNoise()


def noise_source(insecure_seed: int | None, *keys: int) -> NoiseSource:
    """The source of one mechanism's draws: fresh OS entropy, or with ``insecure_seed``
    (testing only) :class:`SeededNoise` keyed by ``keys`` (e.g. client id and release
    index)."""
    return fresh_noise() if insecure_seed is None else SeededNoise(int(insecure_seed), *keys)


def check_source(source: object) -> NoiseSource:
    """``source`` if it is a :class:`NoiseSource`, else a TypeError: a privacy mechanism
    never draws from a ``torch.Generator`` or a seed (module docstring)."""
    if not isinstance(source, NoiseSource):
        raise TypeError(
            "privacy noise is drawn from a NoiseSource (fednovelty.federated.trust.noise: "
            f"fresh_noise() or, in tests only, SeededNoise); got {type(source).__name__}."
        )
    return source


def grid_round(values: Tensor, std: float) -> Tensor:
    """``values`` rounded to the grid ``2^(floor(log2 std) - GRID_BITS)``: post-processing
    that discards the low-order bits of a noisy value (module docstring). ``std`` 0:
    ``values`` as they are."""
    if not std > 0:
        return values
    step = 2.0 ** (math.floor(math.log2(std)) - GRID_BITS)
    return torch.round(values / step) * step


def gaussian(shape: tuple[int, ...], std: float, like: Tensor, source: NoiseSource) -> Tensor:
    """Independent N(0, std^2) draws of ``shape`` from ``source``, in ``like``'s dtype and
    device."""
    noise = check_source(source).normal(tuple(shape)) * float(std)
    return noise.to(dtype=like.dtype, device=like.device)


def add_gaussian(
    value: Tensor, std: float, source: NoiseSource, *, symmetric: bool = False
) -> Tensor:
    """``value`` plus N(0, std^2) noise on each entry, rounded to the noise's grid
    (:func:`grid_round`). ``symmetric``: ``value`` is a stack of symmetric matrices (..., d,
    d); the upper triangle (diagonal included) gets independent noise, mirrored below, so
    the released triangle carries the Gaussian mechanism's noise."""
    if not std > 0:
        return value
    noise = gaussian(tuple(value.shape), std, value, source)
    if symmetric:
        upper = torch.triu(noise)
        noise = upper + upper.transpose(-1, -2) - torch.diag_embed(upper.diagonal(0, -2, -1))
    noisy = grid_round((value + noise).to(torch.float64), float(std))
    return noisy.to(dtype=value.dtype)


__all__ = [
    "GRID_BITS",
    "NoiseSource",
    "SeededNoise",
    "SystemNoise",
    "add_gaussian",
    "check_source",
    "fresh_noise",
    "gaussian",
    "grid_round",
    "noise_source",
]
