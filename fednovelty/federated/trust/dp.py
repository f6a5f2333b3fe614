"""A client's differential-privacy policy: where the noise is added and where it is drawn from.

:class:`DPPolicy` holds a client's own settings (never read from a message): the clipping
radius, the noise multiplier, the budget and the mode. Where the noise is added is one switch
(:data:`MODES`): ``"central"`` (a trusted server adds it once to the sum), ``"local"`` (each
client adds all of it to its own statistics) or ``"distributed"`` (each of ``m`` clients adds
``1/m`` of the variance, so that the sum carries the central noise: meant for secure sums,
where the server sees only the sum); :func:`noise_std` is one party's share. Every noisy
release is charged to the client's ledger first (:func:`charge`) and draws from a stream of
its own (:func:`release_noise`; the trusted server's: :func:`server_noise`): fresh OS
entropy, a seed only in tests.

The mechanisms themselves sit beside it: clipping and the Gaussian mechanism
(:mod:`~fednovelty.federated.trust.dp_mechanism`), the split of a release's budget over its
blocks (:mod:`~fednovelty.federated.trust.dp_split`), post-processing
(:mod:`~fednovelty.federated.trust.dp_postprocess`) and the epsilon of a plan
(:mod:`~fednovelty.federated.trust.dp_calibration`).
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import Any

from fednovelty.federated.trust.ledger import PrivacyLedger, gaussian_cost, within_budget
from fednovelty.federated.trust.noise import NoiseSource, noise_source

#: where the noise is added (module docstring).
MODES = ("central", "local", "distributed")


def noise_std(noise_multiplier: float, sensitivity: float, mode: str, n_clients: int = 1) -> float:
    """The standard deviation of the noise one party adds to a block of L2 ``sensitivity``:
    ``noise_multiplier * sensitivity`` (``"central"``, ``"local"``), or that over
    ``sqrt(n_clients)`` for each of ``n_clients`` clients (``"distributed"``: the sum carries
    the central noise).

    Raises:
        ValueError: an unknown ``mode``, a negative multiplier or sensitivity, or fewer than
            one client.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}.")
    if noise_multiplier < 0 or sensitivity < 0:
        raise ValueError(
            f"noise_multiplier and sensitivity must be >= 0; got {noise_multiplier!r}, "
            f"{sensitivity!r}."
        )
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1; got {n_clients!r}.")
    std = float(noise_multiplier) * float(sensitivity)
    return std / math.sqrt(n_clients) if mode == "distributed" else std


@dataclass(frozen=True)
class DPPolicy:
    """A client's differential-privacy settings: its own, never read from a message.

    Every row a private round works on is clipped to the L2 ball of radius ``clip_norm``
    around the origin of the units the round works in (z-scores after a standardisation,
    the public box's units with ``bounds``); every released block of summed statistics gets
    Gaussian noise of ``noise_multiplier`` times its sensitivity (:func:`noise_std`), added
    by the client (``"local"``, ``"distributed"``) or by a trusted server (``"central"``),
    drawn from fresh OS entropy (:mod:`fednovelty.federated.trust.noise`). Every noisy release is
    charged to the client's own ledger (:mod:`fednovelty.federated.trust.ledger`) and refused when
    it would take the client past ``epsilon`` at ``delta``.

    Attributes:
        noise_multiplier: ``z`` >= 0 (0: clipping without noise, no guarantee).
        clip_norm: ``B`` > 0, the L2 radius rows are clipped to.
        mode: one of :data:`MODES`.
        n_clients: ``m`` >= 1, in ``"distributed"`` mode the fewest clients whose replies a
            round's sum holds: each adds ``z / sqrt(m)``, so a sum of ``m' >= m`` replies
            carries at least the noise ``z`` (a sum of fewer carries ``z sqrt(m' / m)``, and
            the fit's ``privacy_spent_`` reports it).
        epsilon: the client's budget (keyword-only; ``None``: no budget, every release
            allowed).
        delta: the budget's delta (keyword-only).
        insecure_seed: TESTING ONLY (keyword-only): draw the noise from this seed
            (:class:`~fednovelty.federated.trust.noise.SeededNoise`) so that two runs compare bit
            for bit. Whoever knows the seed re-draws the noise: such a client has no privacy
            guarantee. ``None`` (the default): fresh OS entropy.

    Raises:
        ValueError: a field out of range, naming it.
    """

    noise_multiplier: float
    clip_norm: float
    mode: str = "central"
    n_clients: int = 1
    _: KW_ONLY
    epsilon: float | None = None
    delta: float = 1e-5
    insecure_seed: int | None = None

    def __post_init__(self) -> None:
        z, bound = self.noise_multiplier, self.clip_norm
        if isinstance(z, bool) or not (isinstance(z, int | float) and math.isfinite(z) and z >= 0):
            raise ValueError(f"DPPolicy.noise_multiplier must be a finite number >= 0; got {z!r}.")
        if isinstance(bound, bool) or not (
            isinstance(bound, int | float) and math.isfinite(bound) and bound > 0
        ):
            raise ValueError(f"DPPolicy.clip_norm must be a positive finite number; got {bound!r}.")
        if self.mode not in MODES:
            raise ValueError(f"DPPolicy.mode must be one of {MODES}; got {self.mode!r}.")
        if (
            isinstance(self.n_clients, bool)
            or not isinstance(self.n_clients, int)
            or (self.n_clients < 1)
        ):
            raise ValueError(f"DPPolicy.n_clients must be an int >= 1; got {self.n_clients!r}.")
        eps = self.epsilon
        if eps is not None and (
            isinstance(eps, bool)
            or not isinstance(eps, int | float)
            or not (math.isfinite(eps) and eps > 0)
        ):
            raise ValueError(
                f"DPPolicy.epsilon must be a positive finite number or None; got {eps!r}."
            )
        if isinstance(self.delta, bool) or not (
            isinstance(self.delta, int | float) and 0 < self.delta < 1
        ):
            raise ValueError(f"DPPolicy.delta must be in (0, 1); got {self.delta!r}.")
        seed = self.insecure_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"DPPolicy.insecure_seed must be an int or None; got {seed!r}.")

    @property
    def client_noise(self) -> float:
        """The multiplier of the noise the client itself adds: ``z`` (local), ``z /
        sqrt(m)`` (distributed), 0 (central: the server adds it to the sum)."""
        if self.mode == "central":
            return 0.0
        return noise_std(self.noise_multiplier, 1.0, self.mode, self.n_clients)

    @property
    def sum_noise(self) -> float:
        """The multiplier of the noise on the sum of all clients' releases: ``z`` (central,
        distributed), ``z * sqrt(m)`` (local, each of ``m`` clients adds ``z``)."""
        if self.mode == "local":
            return self.noise_multiplier * math.sqrt(self.n_clients)
        return self.noise_multiplier


#: the streams of one release's draws: the gate's noise, and the client step's own
#: mechanisms (DP-SGD's samples and noise, a private fit's start, a noisy choice).
GATE_STREAM, STEP_STREAM = 0, 1


def release_noise(
    policy: DPPolicy, client_id: int, release: int, stream: int = GATE_STREAM
) -> NoiseSource:
    """Where one client's ``release``-th noisy release draws from: fresh OS entropy, or
    with the policy's ``insecure_seed`` (tests only) a :class:`SeededNoise` keyed by the
    client, the release and the ``stream`` (:data:`GATE_STREAM`, :data:`STEP_STREAM`), so
    that even a test seed never feeds two mechanisms one stream."""
    return noise_source(policy.insecure_seed, int(client_id), int(release), int(stream))


def charge(
    ledger: PrivacyLedger,
    policy: DPPolicy,
    blocks: float,
    sgd: tuple[float, float, int] | None = None,
) -> PrivacyLedger | None:
    """The client's ``ledger`` after one more noisy release of ``blocks`` Gaussian
    mechanisms of the policy's multiplier ``z`` (and DP-SGD steps ``sgd = (sigma, rate,
    steps)``), or ``None`` when that would take it past the policy's budget. The ledger
    itself is not changed: the caller keeps the result once the release leaves."""
    after = ledger.after(gaussian_cost(policy.noise_multiplier, blocks), sgd)
    return after if within_budget(after, policy.epsilon, policy.delta) else None


def server_noise(config: Any, rounds: int, stream: int = 0) -> NoiseSource:
    """The draws of the trusted server's ``"central"`` noise in the round after ``rounds``
    counted rounds: fresh OS entropy, or ``config.dp_insecure_seed``'s (tests only), one
    stream per mechanism of the round (``stream``: 0 the statistics, 1 a histogram)."""
    seed = getattr(config, "dp_insecure_seed", None)
    return noise_source(seed, 0xD1FF, int(rounds), int(stream))


__all__ = [
    "GATE_STREAM",
    "MODES",
    "STEP_STREAM",
    "DPPolicy",
    "charge",
    "noise_std",
    "release_noise",
    "server_noise",
]
