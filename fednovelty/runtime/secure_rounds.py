"""Rounds whose server sees only the secure sum of the clients' replies.

A round of a kind whose declared private form is additive (``ReplySpec.private`` in
:data:`ADDITIVE`) is combined before the server step: the clients' replies, each released by
its client gate (clipped rows, the client's noise), are summed by SecAgg
(:func:`fednovelty.federated.trust.secure.secure_sum`) and the server step runs on one combined
reply, ``{COMBINED_ID: combined}``. With ``dp_mode="distributed"`` each of ``m`` clients adds
``1/m`` of the noise variance, so the only value the server reads carries the central noise.

Each kind is first put in a form whose sum is the combined reply's (:func:`encode`,
:func:`decode`): summed statistics (``"stats"``) are moved about the clipping centre, the
origin (exact algebra, :func:`~fednovelty.federated.trust.dp_mechanism.recentre_stats`), so that
their range is public; feature moments (``"moments"``: count, mean, sum of squared deviations)
become ``(n, sum of rows, sum of squares)`` and a scatter (``"scatter"``) ``(n, sum of rows, sum of
outer products)``, the algebra of :func:`~fednovelty.federated.trust.dp_mechanism.noisy_moments` and
:func:`~fednovelty.federated.trust.dp_mechanism.noisy_scatter`. Decoding the sum gives the exact
merge of the replies (what the server's merge of per-client replies computes), to within the
quantisation error.

The clipping range of each tensor is public (:func:`clip_ranges`): rows clipped to the
radius ``B = dp_clip`` around the origin and at most ``N`` rows a client (``max_rows``) put
counts in ``[0, N]``, sums in ``[-N B, N B]`` and second moments in ``[-N B^2, N B^2]``; the
clients' noise widens each by ``noise_margin`` standard deviations of the noise a client adds
at most (``dp_noise_multiplier`` times the block's share and sensitivity; none in
``"central"`` mode). A value outside the range raises (naming the client and the range).

Refused, each with its reason (:func:`check_secure_algorithm`, :func:`additive_release`):
an algorithm without ``dp_mode`` (its rows are not clipped, so no range is public, and its
replies carry a log-likelihood with no bound), ``dp_mode="local"`` (the server's
post-processing reads the number of replies, which a secure sum hides; local noise needs no
secure sum), personal mixture weights (the server reads each client's counts), and any
round of a kind without an additive private form (``None``, ``"fit"``).

Nothing the server or the data decides protects a client: ``N`` is the caller's public
bound (``SecureSum.max_rows``, required, never a client's row count), and the stochastic
rounding comes from fresh OS entropy (``SecureSum.insecure_seed`` seeds it for tests only).
In ``dp_mode="distributed"`` without a secure sum the server reads each reply, which carries
``1/m`` of the noise variance: the in-process engine warns
(:class:`~fednovelty.runtime.simulation.UnsummedDistributedWarning`) and a Flower node in that
mode refuses such rounds.

What the engine simulates of the protocol's dropouts (:class:`SecureSum`): a share
``dropped`` of each round's senders goes away after sharing keys (left out of the sum) and a
share ``unresponsive`` after sending its masked vector (kept in the sum), at most ``m - t`` of
them, the most the protocol survives (:func:`secure_round` with more raises: the round's
sum cannot be unmasked); the draws come from the run's ``random_state``, like its other
simulated failures. Skipped replies take no part. A round needs at least two contributing
replies (the secure sum of one reply is the reply): the in-process engine raises
``min_clients`` to 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.core.base import FederatedAlgorithm, Message, Scalar
from fednovelty.federated.trust.dp_mechanism import recentre_stats
from fednovelty.federated.trust.dp_split import block_multipliers
from fednovelty.federated.trust.noise import NoiseSource
from fednovelty.federated.trust.reply_form import is_skipped
from fednovelty.federated.trust.secure import (
    SecureSumReport,
    check_prg,
    check_range,
    dequantize_sum,
    quantize,
    secure_sum,
)

__all__ = [
    "ADDITIVE",
    "COMBINED_ID",
    "SecureRounds",
    "SecureSum",
    "additive_release",
    "as_settings",
    "check_secure_algorithm",
    "clip_ranges",
    "decode",
    "dequantize_encoded",
    "encode",
    "n_components_of",
    "quantize_encoded",
    "round_clips",
    "round_metrics",
    "secure_round",
    "senders_threshold",
]

#: the private forms whose replies add up once encoded (module docstring).
ADDITIVE: tuple[str, ...] = ("stats", "moments", "scatter")
#: the client id the server step sees the combined reply under.
COMBINED_ID = -1


@dataclass(frozen=True)
class SecureSum:
    """How the rounds' secure sums run.

    Attributes:
        threshold: the share of a round's senders whose secret shares unmask the sum: ``t =
            max(2, floor(threshold * m) + 1)`` of ``m`` (the default, a majority); up to
            ``m - t`` may drop.
        bits: the ring ``Z mod 2**bits`` (16 to 62). The error of a summed value is below
            ``2 m^2 c / 2**bits`` for a clipping range ``c``: 48 bits keep it near 1e-12 of
            the range for 20 clients, at 6 bytes a value instead of float64's 8.
        max_rows: the public bound ``N`` on any client's rows (the clipping ranges' scale),
            stated before the first round; required (:class:`SecureRounds` refuses
            ``None``): never taken from the data, which would tell of one client.
        noise_margin: standard deviations of a client's noise added to each clipping range.
        dropped: the share of each round's senders that drop after sharing keys, before
            sending their masked vector (simulated; left out of the sum).
        unresponsive: the share that send their masked vector and then stay silent
            (simulated; kept in the sum).
        insecure_seed: TESTING ONLY: seeds the stochastic rounding, so that two runs
            compare bit for bit; whoever knows it re-draws the rounding. ``None`` (the
            default): fresh OS entropy for every client and round.
        prg: the mask generator (:data:`fednovelty.federated.trust.secure.PRGS`: AES-256-CTR).

    Raises:
        ValueError: a field out of range, naming it;
            :class:`~fednovelty.federated.trust.secure.InsecurePRGError` for a refused ``prg``.
    """

    threshold: float = 0.5
    bits: int = 48
    max_rows: int | None = None
    noise_margin: float = 10.0
    dropped: float = 0.0
    unresponsive: float = 0.0
    insecure_seed: int | None = None
    prg: str = "aes-ctr"

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, int | float) and 0 < self.threshold < 1):
            raise ValueError(f"SecureSum.threshold must be in (0, 1); got {self.threshold!r}.")
        if (
            isinstance(self.bits, bool)
            or not isinstance(self.bits, int)
            or not (16 <= self.bits <= 62)
        ):
            raise ValueError(f"SecureSum.bits must be an int in [16, 62]; got {self.bits!r}.")
        if self.max_rows is not None and (
            isinstance(self.max_rows, bool)
            or not isinstance(self.max_rows, int)
            or self.max_rows < 1
        ):
            raise ValueError(
                f"SecureSum.max_rows must be an int >= 1 or None; got {self.max_rows!r}."
            )
        if not (isinstance(self.noise_margin, int | float) and self.noise_margin >= 0):
            raise ValueError(
                f"SecureSum.noise_margin must be a number >= 0; got {self.noise_margin!r}."
            )
        for name in ("dropped", "unresponsive"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 <= value < 1):
                raise ValueError(f"SecureSum.{name} must be in [0, 1); got {value!r}.")
        if self.dropped + self.unresponsive >= 1:
            raise ValueError(
                "SecureSum.dropped + SecureSum.unresponsive must be below 1 (some senders "
                f"must reveal shares); got {self.dropped} + {self.unresponsive}."
            )
        seed = self.insecure_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"SecureSum.insecure_seed must be an int or None; got {seed!r}.")
        try:
            check_prg(self.prg)
        except ValueError as error:  # InsecurePRGError stays one
            raise type(error)(f"SecureSum.prg: {error}") from None


def senders_threshold(threshold: float, n_senders: int) -> int:
    """The protocol's ``t`` for ``n_senders`` clients: ``max(2, floor(threshold * m) + 1)``,
    at most ``m``."""
    return min(n_senders, max(2, math.floor(threshold * n_senders) + 1))


# --------------------------------------------------------------------------- refusals
def check_secure_algorithm(algorithm: FederatedAlgorithm) -> None:
    """Refuse an algorithm whose rounds a secure sum cannot carry (module docstring).

    Raises:
        ValueError: no ``dp_mode``, ``dp_mode="local"``, or personal mixture weights; the
            message says why and what to do.
    """
    config = getattr(algorithm, "config", None)
    name = type(algorithm).__name__
    mode = getattr(config, "dp_mode", None)
    if mode is None:
        raise ValueError(
            f"secure sums need {name} with dp_mode set: without differential privacy its "
            "replies have no private form (rows not clipped to a public radius dp_clip, a "
            "log-likelihood without bound), so no clipping range for the secure sum is "
            'public; use dp_mode="distributed" (or "central"), or run without secure_sum.'
        )
    if mode == "local":
        raise ValueError(
            'secure sums are not run with dp_mode="local": the server post-processes the '
            "sum by the number of replies (local noise grows with sqrt(m)), which a secure "
            'sum hides, and local noise already protects each reply; use dp_mode="distributed".'
        )
    if getattr(config, "mixture_weights", None) == "personal":
        raise ValueError(
            f'secure sums are refused for {name} with mixture_weights="personal": its server '
            "step reads each client's counts (its personal weights), which a secure sum "
            'hides; use mixture_weights="global".'
        )


def additive_release(algorithm: FederatedAlgorithm, kind: str) -> str:
    """The additive private form (:data:`ADDITIVE`) of replies of ``kind``.

    Raises:
        ValueError: the kind's declaration states no private form, or one that does not add
            up (``"fit"``: a model fitted by one client).
    """
    private = algorithm.reply_spec(kind).private
    if private not in ADDITIVE:
        why = (
            "no private form"
            if private is None
            else f"the private form {private!r}, which is not a sum over rows"
        )
        raise ValueError(
            f"round of kind {kind!r} cannot go through a secure sum: its declaration states "
            f"{why}; secure sums carry the additive forms {ADDITIVE} only. Run "
            f"{type(algorithm).__name__} without secure_sum."
        )
    return private


# --------------------------------------------------------------------------- encodings
def encode(
    release: str, tensors: Mapping[str, Tensor], broadcast: Message, covariance_type: str | None
) -> dict[str, Tensor]:
    """A reply's tensors in the form whose sum over clients is the combined reply's.

    ``"stats"``: ``counts`` (K,), ``sums`` (K, d), ``second`` (by ``covariance_type``),
    ``n_samples`` (), ``log_likelihood`` () about the broadcast ``shift`` (d,) -> the same
    names about the origin. ``"moments"``: ``n_samples`` (), ``mean`` (d,), ``m2`` (d,) ->
    ``n_samples``, ``total`` (d,) = n mean, ``squares`` (d,) = m2 + n mean^2. ``"scatter"``:
    ``n_samples``, ``mean`` (d,), ``scatter`` (d, d) -> ``n_samples``, ``total``, ``outer``
    (d, d) = scatter + n mean mean^T."""
    if release == "stats":
        shift = broadcast.tensors["shift"].to(tensors["sums"].device, tensors["sums"].dtype)
        sums, second = recentre_stats(
            tensors["counts"], tensors["sums"], tensors["second"], shift, covariance_type
        )
        return {
            "counts": tensors["counts"],
            "sums": sums,
            "second": second,
            "n_samples": tensors["n_samples"],
            "log_likelihood": tensors["log_likelihood"],
        }
    n, mean = tensors["n_samples"], tensors["mean"]
    if release == "moments":
        return {"n_samples": n, "total": n * mean, "squares": tensors["m2"] + n * mean.square()}
    if release == "scatter":
        return {
            "n_samples": n,
            "total": n * mean,
            "outer": tensors["scatter"] + n * torch.outer(mean, mean),
        }
    raise ValueError(f"release must be one of {ADDITIVE}; got {release!r}.")


def decode(
    release: str, sums: Mapping[str, Tensor], broadcast: Message, covariance_type: str | None
) -> dict[str, Tensor]:
    """The combined reply's tensors from the sum of :func:`encode`'s forms: statistics moved
    back about the broadcast ``shift``; moments and scatter rebuilt about the pooled mean
    ``total / n`` (a count of 0 gives a zero mean)."""
    if release == "stats":
        shift = broadcast.tensors["shift"].to(sums["sums"].device, sums["sums"].dtype)
        moved, second = recentre_stats(
            sums["counts"], sums["sums"], sums["second"], -shift, covariance_type
        )
        return {**sums, "sums": moved, "second": second}
    n, total = sums["n_samples"], sums["total"]
    mean = total / n if float(n) != 0 else torch.zeros_like(total)
    if release == "moments":
        return {"n_samples": n, "mean": mean, "m2": sums["squares"] - n * mean.square()}
    if release == "scatter":
        return {
            "n_samples": n,
            "mean": mean,
            "scatter": sums["outer"] - n * torch.outer(mean, mean),
        }
    raise ValueError(f"release must be one of {ADDITIVE}; got {release!r}.")


def clip_ranges(
    release: str,
    n_components: int,
    *,
    max_rows: int,
    bound: float,
    noise_multiplier: float,
    margin: float,
) -> dict[str, float]:
    """The public clipping range of each encoded tensor (module docstring): rows in the L2
    ball of radius ``bound`` around the origin, at most ``max_rows`` a client, and a
    client's noise at most ``noise_multiplier`` times each block's share and sensitivity,
    widened by ``margin`` standard deviations. ``n_components``: K of a ``"stats"`` reply
    (its row count is the sum of K noisy counts)."""
    z = block_multipliers(noise_multiplier)
    n, b = float(max_rows), float(bound)
    count = n + margin * z["counts"]
    first = n * b + margin * z["sums"] * b
    second = (n + margin * z["second"]) * b**2
    if release == "stats":
        rows = n + margin * z["counts"] * math.sqrt(n_components)
        # the log-likelihood is withheld under DP (0): any positive range carries it
        return {"counts": count, "sums": first, "second": second, "n_samples": rows,
                "log_likelihood": 1.0}  # fmt: skip
    if release == "moments":
        return {"n_samples": count, "total": first, "squares": second}
    if release == "scatter":
        return {"n_samples": count, "total": first, "outer": second}
    raise ValueError(f"release must be one of {ADDITIVE}; got {release!r}.")


def n_components_of(release: str, tensors: Mapping[str, Tensor]) -> int:
    """``K`` of a ``"stats"`` reply (the length of its ``counts``, encoded or not); 1 for
    the other forms and for no tensors (where :func:`clip_ranges` does not read it)."""
    if release == "stats" and "counts" in tensors:
        return int(tensors["counts"].shape[0])
    return 1


def round_clips(
    algorithm: FederatedAlgorithm,
    release: str,
    n_components: int,
    *,
    max_rows: int,
    noise_margin: float,
) -> dict[str, float]:
    """The public clipping ranges of a round's encoded tensors for ``algorithm``'s DP
    settings (:func:`clip_ranges` with ``dp_clip`` as the bound and ``dp_noise_multiplier``
    as a client's noise, none in ``"central"`` mode): what the clients and the server of
    every engine compute alike, each from the same settings."""
    config = algorithm.config
    return clip_ranges(
        release,
        n_components,
        max_rows=max_rows,
        bound=config.dp_clip,
        noise_multiplier=0.0 if config.dp_mode == "central" else config.dp_noise_multiplier,
        margin=noise_margin,
    )


def quantize_encoded(
    client: int,
    encoded: Mapping[str, Tensor],
    clips: Mapping[str, float],
    levels: int,
    source: NoiseSource,
) -> np.ndarray:
    """One client's encoded tensors as the integer vector it masks: each tensor, in the
    mapping's order, flattened, checked against its range and quantised with the rounding
    of ``source`` (:mod:`fednovelty.federated.trust.noise`)
    (:func:`~fednovelty.federated.trust.secure.check_range`,
    :func:`~fednovelty.federated.trust.secure.quantize`), then concatenated: (n_values,) uint64.

    Raises:
        ValueError: a value outside its range (naming ``client`` and the tensor), or a
            tensor without a range.
    """
    missing = [name for name in encoded if name not in clips]
    if missing:
        raise ValueError(f"clips has no range for tensors {missing}; give one per tensor.")
    pieces = []
    for name, tensor in encoded.items():
        values = tensor.detach().to("cpu", torch.float64).numpy().reshape(-1)
        check_range(client, name, values, clips[name])
        pieces.append(quantize(values, clips[name], levels, source))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint64)


def dequantize_encoded(
    total: np.ndarray,
    layout: Mapping[str, tuple[int, ...]],
    clips: Mapping[str, float],
    levels: int,
    n_inputs: int,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> dict[str, Tensor]:
    """The float sums of ``n_inputs`` clients' encoded tensors from the sum ``total``
    (n_values,) uint64 of their :func:`quantize_encoded` vectors: cut by ``layout`` (name
    -> shape, the vectors' order) and dequantised in each tensor's range
    (:func:`~fednovelty.federated.trust.secure.dequantize_sum`).

    Raises:
        ValueError: ``total``'s length is not the layout's.
    """
    sizes = {name: math.prod(shape) for name, shape in layout.items()}
    if total.shape != (sum(sizes.values()),):
        raise ValueError(
            f"total has shape {total.shape}; the layout {dict(layout)} holds "
            f"{sum(sizes.values())} values."
        )
    sums, offset = {}, 0
    for name, shape in layout.items():
        piece = total[offset : offset + sizes[name]]
        values = dequantize_sum(piece, clips[name], levels, n_inputs)
        sums[name] = torch.as_tensor(values, dtype=dtype, device=device).reshape(shape)
        offset += sizes[name]
    return sums


# --------------------------------------------------------------------------- one round
def secure_round(
    release: str,
    broadcast: Message,
    replies: Mapping[int, Message],
    clips: Mapping[str, float],
    *,
    covariance_type: str | None = None,
    threshold: float = 0.5,
    bits: int = 48,
    dropped: set[int] = frozenset(),
    unresponsive: set[int] = frozenset(),
    insecure_seed: int | None = None,
    prg: str = "aes-ctr",
) -> tuple[Message, SecureSumReport]:
    """One round's combined reply: the clients' ``replies`` (client id -> released reply of
    ``broadcast``'s kind, none skipped, at least two) encoded (:func:`encode`), securely
    summed in the public ``clips`` (encoded name -> range) and decoded (:func:`decode`).
    ``dropped`` / ``unresponsive``: senders that go away before / after sending their masked
    vector; ``insecure_seed`` (tests only) seeds the rounding
    (:func:`~fednovelty.federated.trust.secure.secure_sum`).

    Returns:
        ``(combined reply of broadcast's kind, the secure sum's report)``; the report's error
        bounds are per encoded tensor.

    Raises:
        ValueError: fewer than two replies, a skipped one, a value outside its range, or
            more drops than the threshold leaves room for.
    """
    if len(replies) < 2:
        raise ValueError(
            f"a secure round needs the replies of at least 2 clients; got {len(replies)} (the "
            "secure sum of one reply is the reply). Raise min_clients to 2."
        )
    skipped = sorted(c for c, reply in replies.items() if is_skipped(reply))
    if skipped:
        raise ValueError(f"skipped replies of clients {skipped} take no part in a secure sum.")
    encoded = {
        c: encode(release, reply.tensors, broadcast, covariance_type)
        for c, reply in replies.items()
    }
    sums, report = secure_sum(
        encoded,
        clip_range=dict(clips),
        threshold=senders_threshold(threshold, len(replies)),
        bits=bits,
        dropped=set(dropped),
        unresponsive=set(unresponsive),
        insecure_seed=insecure_seed,
        prg=prg,
    )
    return Message(broadcast.kind, decode(release, sums, broadcast, covariance_type)), report


def round_metrics(report: SecureSumReport) -> dict[str, Scalar]:
    """A round's secure-sum figures for its ``RoundRecord.metrics``: ``secure_seconds``
    (every party's work), ``secure_bytes_up`` / ``secure_bytes_down`` (all clients, every
    step), ``secure_senders``, ``secure_dropped``, ``secure_unresponsive``, and per encoded
    tensor ``secure_clip_<name>`` and ``secure_bound_<name>`` (its quantisation error
    bound)."""
    metrics: dict[str, Scalar] = {
        "secure_seconds": float(sum(report.seconds.values())),
        "secure_bytes_up": int(sum(sum(s.values()) for s in report.bytes_up.values())),
        "secure_bytes_down": int(sum(sum(s.values()) for s in report.bytes_down.values())),
        "secure_senders": len(report.senders),
        "secure_dropped": len(report.dropped),
        "secure_unresponsive": len(report.unresponsive),
    }
    for name, clip in report.clip_range.items():
        metrics[f"secure_clip_{name}"] = clip
        metrics[f"secure_bound_{name}"] = report.error_bound[name]
    return metrics


class SecureRounds:
    """The round loop's ``combine`` hook (:func:`fednovelty.runtime.loop.run_rounds`): each
    round's valid replies -> ``({COMBINED_ID: combined reply}, secure-sum metrics)``.

    Args:
        algorithm: checked by :func:`check_secure_algorithm`.
        settings: the :class:`SecureSum`, with its public ``max_rows``.
        random_state: seeds the simulated drops (``settings.dropped``,
            ``settings.unresponsive``), the run's other simulated failures' seed.

    Raises:
        ValueError: the refusals of :func:`check_secure_algorithm`, ``settings.max_rows``
            not given; at a round, those of :func:`additive_release` and
            :func:`secure_round`.
    """

    def __init__(
        self, algorithm: FederatedAlgorithm, settings: SecureSum, random_state: int = 0
    ) -> None:
        check_secure_algorithm(algorithm)
        if settings.max_rows is None:
            raise ValueError(
                "secure sums need SecureSum.max_rows, the public bound on any client's rows "
                "stated before the first round (it scales the public clipping ranges); it is "
                "never taken from the clients' data. Pass SecureSum(max_rows=N) with N at "
                "least the largest client's row count."
            )
        self.algorithm, self.settings = algorithm, settings
        self.max_rows, self.random_state = int(settings.max_rows), int(random_state)
        self.rounds = 0

    def __call__(
        self, message: Message, valid: Mapping[int, Message]
    ) -> tuple[dict[int, Message], dict[str, Scalar]]:
        release = additive_release(self.algorithm, message.kind)
        config, settings = self.algorithm.config, self.settings
        replies = {c: r for c, r in sorted(valid.items()) if not is_skipped(r)}
        self.rounds += 1
        first = next(iter(replies.values())).tensors if replies else {}
        clips = round_clips(
            self.algorithm,
            release,
            n_components_of(release, first),
            max_rows=self.max_rows,
            noise_margin=settings.noise_margin,
        )
        dropped, unresponsive = self._drops(list(replies))
        seed = settings.insecure_seed
        combined, report = secure_round(
            release,
            message,
            replies,
            clips,
            covariance_type=getattr(config, "covariance_type", None),
            threshold=settings.threshold,
            bits=settings.bits,
            dropped=dropped,
            unresponsive=unresponsive,
            insecure_seed=None if seed is None else _round_seed(seed, self.rounds),
            prg=settings.prg,
        )
        return {COMBINED_ID: combined}, round_metrics(report)

    def _drops(self, senders: list[int]) -> tuple[set[int], set[int]]:
        """This round's simulated drops: each sender independently drops (before masking)
        with probability ``dropped`` or goes silent (after masking) with ``unresponsive``;
        at most ``m - t`` go (those of the smallest draws), the most the protocol survives."""
        settings = self.settings
        if settings.dropped == 0 and settings.unresponsive == 0:
            return set(), set()
        stream = np.random.SeedSequence([self.random_state, self.rounds])
        draws = np.random.default_rng(stream).random(len(senders))
        room = len(senders) - senders_threshold(settings.threshold, len(senders))
        going = sorted(
            (u, c)
            for c, u in zip(senders, draws, strict=True)
            if u < settings.dropped + settings.unresponsive
        )[:room]
        dropped = {c for u, c in going if u < settings.dropped}
        return dropped, {c for _, c in going} - dropped


def _round_seed(seed: int, round_: int) -> int:
    """A test's rounding seed for one round (``insecure_seed`` only)."""
    return int(np.random.SeedSequence([seed, round_]).generate_state(1)[0])


def as_settings(secure_sum: SecureSum | bool | None) -> SecureSum | None:
    """``run_simulation``'s ``secure_sum`` argument as settings: ``True`` -> ``SecureSum()``,
    ``None``/``False`` -> ``None``.

    Raises:
        TypeError: anything else.
    """
    if secure_sum is None or secure_sum is False:
        return None
    if secure_sum is True:
        return SecureSum()
    if isinstance(secure_sum, SecureSum):
        return secure_sum
    raise TypeError(
        f"secure_sum must be a SecureSum, True or None; got {type(secure_sum).__name__}."
    )
