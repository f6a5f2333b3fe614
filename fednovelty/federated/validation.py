"""Checks of client replies on receipt, before any of them reaches a server step.

The server does not trust its clients: a reply can be malformed (another fednovelty version,
a bug) or hostile (a client that claims more rows than it has, sends a second moment no rows
could produce, or a local mixture with more components than the broadcast allowed). One NaN
or one impossible statistic in a sum would poison the whole model, so every engine passes
each round's replies through one :class:`ReplyValidator` and hands the server step only the
replies that pass. A reply that fails is dropped with a reason; the round goes on with the
others.

What a reply is checked against:

- **the broadcast**: its kind; every tensor the reply kind carries, with the shape the
  broadcast implies (:func:`expected_shapes`: statistics ``(K,)``, ``(K, d)``, second
  moments by covariance type; a local mixture has at most as many components as the
  largest candidate K; at most ``n_clusters`` centroids); floating tensors finite; counts,
  row counts and weights non-negative; a local mixture's weights sum to one and its
  precision factors have a positive diagonal; a clustered classifier's reply
  (``fednovelty.federated.cam``) holds the models it trained in the broadcast's shapes, a
  positive row count, a loss >= 0 and a cluster index the broadcast has.
- **the statistics themselves**: the second moments are those of some rows
  (``n_k S_k - s_k s_k^T`` positive semi-definite: the Cauchy-Schwarz inequality any
  weighted set of rows satisfies), components' counts add up to at most the row count,
  and a centroid round's counts to exactly it.
- **what the client declared before**: the row count is fixed by a client's first reply
  that carries one and may not change later; the row width is the federation's. After
  a ``moments`` round (the client's per-feature mean ``m`` and sum of squared deviations
  ``M2``), every row the client holds lies within ``|x_j - m_j| <= sqrt(M2_j)``, so every
  mean it sends (component means, centroids, ranges) must lie in that box, and the
  squared deviations about ``m`` that its statistics imply may not add up to more than
  ``M2``.

A client that lies consistently from its first reply on (a made-up data set) passes these
checks: that is what the robust aggregation options of the algorithms bound (a cap on one
client's weight, trimmed and median combinations; ``docs/robust.md``).

What the server expects of a reply beyond the broadcast's tensors (the covariance type of
statistics and mixtures, the most centroids or local components, the width of the rows the
round works on after a PCA projection) is the server's own setting, not something a client
is told in every message: the algorithm writes it into the broadcast's ``expect``
(:class:`~fednovelty.federated.base.Message`), which stays on the server.

A skipped reply (``scalars["skipped"]``: the client is below its privacy floor or refused
the round) carries no statistics and is passed on as it is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fednovelty.federated.base import Message, Scalar

#: reply tensors that must be >= 0 wherever they appear.
NON_NEGATIVE: tuple[str, ...] = (
    "counts",
    "n_samples",
    "joint_counts",
    "weights",
    "n",
    "m2",
    "far_counts",
    "hard_counts",
    "client_vars",
    "loss",
)
#: reply kinds of the clustered classification algorithms (``fednovelty.federated.cam``).
MODEL_KINDS: tuple[str, ...] = (
    "cam_ensemble",
    "cam_cluster",
    "cam_warmup_global",
    "cam_warmup_local",
)
#: reply kinds that carry summed Gaussian statistics.
STATS_KINDS: tuple[str, ...] = ("assign", "em", "joint_em", "vb_init", "vb")
#: relative slack of the consistency checks in float64 (round-off of sums over many rows);
#: float32 replies get ``1e3`` times their machine epsilon where that is larger.
RTOL = 1e-6


def relative_tolerance(dtype: torch.dtype) -> float:
    """Slack of the consistency checks for statistics computed in ``dtype``."""
    return max(RTOL, 1e3 * torch.finfo(dtype).eps) if dtype.is_floating_point else RTOL


Dim = int | str  # a fixed size, or a symbol every use of which in one reply must agree on
Shape = tuple[Dim, ...]


class InvalidReplyError(ValueError):
    """A client reply does not have the form the round asked for, or contradicts what the
    client declared before."""


def covariance_shape(covariance_type: str, k: Dim, d: int) -> Shape:
    """Shape of per-component second moments / precision factors by covariance type."""
    shapes = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    if covariance_type not in shapes:
        raise InvalidReplyError(f"unknown covariance_type {covariance_type!r}.")
    return shapes[covariance_type]


def _learner_count(broadcast: Message) -> int:
    return len({name.split(".")[1] for name in broadcast.tensors if name.startswith("learner.")})


def expectation(broadcast: Message, name: str) -> Scalar:
    """``broadcast.expect[name]``, or a ``ValueError`` (a server-side error: the algorithm
    did not say what replies to its round may hold)."""
    if name not in broadcast.expect:
        raise ValueError(
            f"a {broadcast.kind!r} broadcast must state expect[{name!r}] for its replies to be "
            "checked; the algorithm's configure sets it."
        )
    return broadcast.expect[name]


def round_width(broadcast: Message, n_features: int) -> int:
    """Width ``d`` of the rows a round works on: the federation's ``n_features``, or the
    broadcast's ``expect["n_features"]`` (e.g. a PCA projection's components)."""
    return int(broadcast.expect.get("n_features", n_features))


def is_skipped(reply: Message) -> bool:
    """Whether ``reply`` says the client did not take part (below its floor, refused)."""
    return bool(reply.scalars.get("skipped", False))


def expected_shapes(broadcast: Message, reply: Message, n_features: int) -> dict[str, Shape]:
    """Tensors a reply to ``broadcast`` must carry and their shapes.

    Args:
        broadcast: the round's message to the clients.
        reply: the client's reply (a skipped reply carries at most ``n_samples``).
        n_features: the width of the federation's rows (the round's ``d`` unless the
            broadcast's ``expect`` names another, :func:`round_width`).

    Returns:
        name -> shape; a string dimension (``"k"``) is free but equal wherever it appears.
        Unknown kinds return ``{}`` (only the value checks apply).
    """
    d, kind = round_width(broadcast, n_features), broadcast.kind
    if is_skipped(reply):
        return {}
    if kind in STATS_KINDS:
        centers = broadcast.tensors["centers" if kind == "assign" else "means"]
        k = int(centers.shape[0])
        shapes: dict[str, Shape] = {
            "counts": (k,),
            "sums": (k, d),
            "second": covariance_shape(str(expectation(broadcast, "covariance_type")), k, d),
            "log_likelihood": (),
            "n_samples": (),
        }
        if kind == "joint_em":
            shapes["joint_counts"] = (k, _learner_count(broadcast))
        return shapes
    if kind == "stream":
        return _stream_shapes(broadcast, d)
    if kind == "cluster_em":
        k = int(broadcast.tensors["means"].shape[0])
        ct = str(expectation(broadcast, "covariance_type"))
        c = int(broadcast.tensors["cluster_log_weights"].shape[0])
        return {
            "counts": (k,),
            "sums": (k, d),
            "second": covariance_shape(ct, k, d),
            "log_likelihood": (),
            "n_samples": (),
            "cluster_log_likelihood": (c,),
        }
    if kind == "pfedem":
        k = int(broadcast.tensors["means"].shape[0])
        shapes = {"hard_counts": (k,), "log_likelihood": (), "n_samples": ()}
        if expectation(broadcast, "gaussian_aggregation") == "exact":
            ct = str(expectation(broadcast, "covariance_type"))
            shapes.update(counts=(k,), sums=(k, d), second=covariance_shape(ct, k, d))
        else:
            shapes.update(client_means=(k, d), client_vars=(k, d))
        return shapes
    if kind in MODEL_KINDS:
        return _model_shapes(broadcast)
    if kind == "local_fit":
        return {
            "weights": ("k",),
            "means": ("k", d),
            "precisions_cholesky": covariance_shape(
                str(expectation(broadcast, "covariance_type")), "k", d
            ),
            "n_samples": (),
        }
    simple: dict[str, dict[str, Shape]] = {
        "centroids": {"centers": ("k", d), "counts": ("k",), "n_samples": ()},
        "range": {"min": (d,), "max": (d,), "n_samples": ()},
        "count": {"n_samples": ()},
        "subset": {"rows": ("r", d), "n_samples": ()},
        "moments": {"n_samples": (), "mean": (d,), "m2": (d,)},
        "moments_mean": {"n": (), "sum": (d,)},
        "moments_scatter": {"n": (), "scatter": (d, d)},
    }
    return dict(simple.get(kind, {}))


def _stream_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A streaming window's reply: weighted row counts (and drift values in the window's
    first round); with M-steps the statistics too, and in the first round the far rows'."""
    k = int(broadcast.tensors["means"].shape[0])
    ct = str(expectation(broadcast, "covariance_type"))
    first = int(broadcast.scalars.get("window_round", 0)) == 0
    shapes: dict[str, Shape] = {"counts": (k,), "n_samples": ()}
    if first:
        shapes["drift"] = (4,)
    if not bool(expectation(broadcast, "track_only")):
        shapes.update(sums=(k, d), second=covariance_shape(ct, k, d), log_likelihood=())
        if first and bool(expectation(broadcast, "far")):
            shapes.update(far_counts=(k,), far_sums=(k, d), far_second=covariance_shape(ct, k, d))
    return shapes


def _model_shapes(broadcast: Message) -> dict[str, Shape]:
    """A clustered round's reply: the models it trained, each of the broadcast's shapes
    (``cam_ensemble``: every member ``learner.{m}.*``; ``cam_cluster`` and
    ``cam_warmup_local``: one cluster model ``cluster.*`` shaped as ``learner.0.*``; the
    global model ``global.*`` where the round broadcast it), its row count and its loss."""
    shapes: dict[str, Shape] = {"n_samples": (), "loss": ()}
    for name, tensor in broadcast.tensors.items():
        if name.startswith("global.") or (
            broadcast.kind == "cam_ensemble" and name.startswith("learner.")
        ):
            shapes[name] = tuple(tensor.shape)
        elif broadcast.kind != "cam_ensemble" and name.startswith("learner.0."):
            shapes["cluster." + name.removeprefix("learner.0.")] = tuple(tensor.shape)
    return shapes


def _check_model_reply(reply: Message, broadcast: Message) -> None:
    """A clustered reply's row count is positive and a ``cam_cluster`` reply names one of
    the broadcast's clusters."""
    if not float(reply.tensors["n_samples"]) > 0:
        raise InvalidReplyError("a model reply must come from at least one row.")
    if broadcast.kind != "cam_cluster":
        return
    cluster, k = reply.scalars.get("cluster"), _learner_count(broadcast)
    if isinstance(cluster, bool) or not isinstance(cluster, int) or not 0 <= cluster < k:
        raise InvalidReplyError(
            f"scalar 'cluster' must be a cluster index in [0, {k}); got {cluster!r}."
        )


def _check_cluster_reply(reply: Message, broadcast: Message) -> None:
    """A clustered EM reply: a cluster of the broadcast, statistics only on the components
    that cluster's clients use, and statistics some rows could produce."""
    cluster = reply.scalars.get("cluster")
    n_clusters = int(broadcast.tensors["cluster_log_weights"].shape[0])
    if not isinstance(cluster, int) or isinstance(cluster, bool) or not 0 <= cluster < n_clusters:
        raise InvalidReplyError(f"cluster {cluster!r} is not one of the {n_clusters} clusters.")
    owners = broadcast.tensors["component_clusters"]
    foreign = (owners != -1) & (owners != cluster)
    if bool((reply.tensors["counts"][foreign] != 0).any()):
        raise InvalidReplyError(
            f"statistics on components of another cluster than the reply's ({cluster})."
        )
    _check_stats(reply, str(expectation(broadcast, "covariance_type")))


def _check_stream(reply: Message, broadcast: Message) -> None:
    """A streaming reply's values: drift values in range, counts within the rows, the
    statistics (and the far rows' statistics) those of some rows."""
    t = reply.tensors
    n = float(t["n_samples"])
    rtol = relative_tolerance(t["counts"].dtype)
    if not _close_or_below(float(t["counts"].sum()), n, rtol):
        total = float(t["counts"].sum())
        raise InvalidReplyError(f"component counts add up to {total:g}, more than the {n:g} rows.")
    if "drift" in t:
        _, variance, tv, new = (float(v) for v in t["drift"])
        if variance < 0 or not -rtol <= tv <= 1 + rtol or new not in (0.0, 1.0):
            raise InvalidReplyError(
                "drift values out of range (variance >= 0, total variation in [0, 1], new 0/1)."
            )
    if "sums" not in t:
        return
    ct = str(expectation(broadcast, "covariance_type"))
    _check_stats(reply, ct)
    if "far_counts" in t:
        slack = rtol * (t["counts"].abs() + 1.0)
        if bool((t["far_counts"] > t["counts"] + slack).any()):
            raise InvalidReplyError("a component has more far rows than rows.")
        far = Message(
            "far",
            {
                "counts": t["far_counts"],
                "sums": t["far_sums"],
                "second": t["far_second"],
                "n_samples": t["far_counts"].sum(),
            },
        )
        _check_stats(far, ct)


def _match_shape(name: str, actual: tuple[int, ...], shape: Shape, bound: dict[str, int]) -> None:
    ok = len(actual) == len(shape)
    for size, want in zip(actual, shape, strict=False):
        if isinstance(want, str):
            ok = ok and bound.setdefault(want, size) == size
        else:
            ok = ok and size == want
    if not ok:
        pretty = tuple(bound.get(s, s) if isinstance(s, str) else s for s in shape)
        raise InvalidReplyError(f"tensor {name!r} has shape {actual}; expected {pretty}.")


def max_local_components(broadcast: Message) -> int | None:
    """The largest K a ``local_fit`` broadcast lets a client fit (``None``: not stated)."""
    most = broadcast.expect.get("max_components")
    return None if most is None else int(most)


def check_reply(reply: Message, broadcast: Message, n_features: int) -> None:
    """Raise if ``reply`` is not a well-formed answer to ``broadcast`` (form and values;
    :class:`ReplyValidator` adds what the client declared before).

    Args:
        reply: a decoded client reply.
        broadcast: the round's message.
        n_features: ``d`` of the federation's rows.

    Raises:
        InvalidReplyError: wrong kind, missing or unexpected tensor, wrong shape, NaN/inf,
            a negative count / weight, or statistics no rows could produce.
    """
    if reply.kind != broadcast.kind:
        raise InvalidReplyError(f"reply of kind {reply.kind!r} to a {broadcast.kind!r} round.")
    shapes = expected_shapes(broadcast, reply, n_features)
    missing = sorted(set(shapes) - set(reply.tensors))
    if missing:
        raise InvalidReplyError(f"reply lacks tensor(s) {missing}.")
    if is_skipped(reply) and set(reply.tensors) - {"n_samples"}:
        raise InvalidReplyError("a skipped reply carries statistics.")
    _check_size(reply, broadcast)
    bound: dict[str, int] = {}
    for name, tensor in reply.tensors.items():
        if name in shapes:
            _match_shape(name, tuple(tensor.shape), shapes[name], bound)
        elif name in broadcast.tensors:
            _match_shape(name, tuple(tensor.shape), tuple(broadcast.tensors[name].shape), bound)
        elif shapes:
            raise InvalidReplyError(f"reply has unexpected tensor {name!r}.")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InvalidReplyError(f"tensor {name!r} has NaN or inf values.")
        if name in NON_NEGATIVE and tensor.numel() and bool((tensor < 0).any()):
            raise InvalidReplyError(f"tensor {name!r} has negative values.")
    if is_skipped(reply):
        return
    if broadcast.kind == "centroids":
        _check_centroids(reply, broadcast, bound.get("k", 0))
    elif broadcast.kind == "local_fit":
        _check_local_fit(reply, broadcast, bound.get("k", 0))
    elif broadcast.kind in STATS_KINDS:
        _check_stats(reply, str(expectation(broadcast, "covariance_type")))
    elif broadcast.kind == "stream":
        _check_stream(reply, broadcast)
    elif broadcast.kind == "cluster_em":
        _check_cluster_reply(reply, broadcast)
    elif broadcast.kind in MODEL_KINDS:
        _check_model_reply(reply, broadcast)
    elif broadcast.kind == "pfedem":
        n = float(reply.tensors["n_samples"])
        if not _close_or_below(float(reply.tensors["hard_counts"].sum()), n):
            raise InvalidReplyError("hard counts add up to more than the rows sent.")
        if "sums" in reply.tensors:
            _check_stats(reply, str(expectation(broadcast, "covariance_type")))


def _check_size(reply: Message, broadcast: Message) -> None:
    """The number of components or centroids against the broadcast's bound, before any
    value of a (possibly huge) tensor is read."""
    if broadcast.kind == "local_fit" and "weights" in reply.tensors:
        k, most = int(reply.tensors["weights"].shape[0]), max_local_components(broadcast)
        if most is not None and k > most:
            raise InvalidReplyError(f"local mixture has {k} components; the round allows {most}.")
    if broadcast.kind == "centroids" and "centers" in reply.tensors:
        k = int(reply.tensors["centers"].shape[0])
        asked = int(expectation(broadcast, "n_clusters"))
        if k > asked:
            raise InvalidReplyError(f"reply has {k} centroids; at most {asked} asked.")


def _close_or_below(value: float, limit: float, rtol: float = RTOL) -> bool:
    return value <= limit * (1 + rtol) + rtol


def _check_centroids(reply: Message, broadcast: Message, k: int) -> None:
    asked = int(expectation(broadcast, "n_clusters"))
    if k > asked:
        raise InvalidReplyError(f"reply has {k} centroids; at most {asked} asked.")
    total, n = float(reply.tensors["counts"].sum()), float(reply.tensors["n_samples"])
    if abs(total - n) > RTOL * max(n, 1.0):
        raise InvalidReplyError(f"centroid counts add up to {total:g}, not the {n:g} rows sent.")


def _check_local_fit(reply: Message, broadcast: Message, k: int) -> None:
    most = max_local_components(broadcast)
    if most is not None and k > most:
        raise InvalidReplyError(f"local mixture has {k} components; the round allows {most}.")
    weights = reply.tensors["weights"]
    if k == 0 or abs(float(weights.sum()) - 1.0) > relative_tolerance(weights.dtype):
        raise InvalidReplyError(f"local mixture weights add up to {float(weights.sum()):g}, not 1.")
    prec = reply.tensors["precisions_cholesky"]
    tied = expectation(broadcast, "covariance_type") == "tied"
    diagonal = prec if prec.ndim <= 2 and not tied else None
    if diagonal is None:
        diagonal = torch.diagonal(prec, dim1=-2, dim2=-1)
        if not bool(torch.equal(prec, prec.triu())):
            raise InvalidReplyError("precision factors are not upper triangular.")
    if not bool((diagonal > 0).all()):
        raise InvalidReplyError("precision factors have a non-positive diagonal.")


def _second_diagonal(second: Tensor, covariance_type: str, n_features: int) -> Tensor:
    """Per-component diagonal of second moments, (n_components, n_features); ``spherical``
    gives the per-component sum over features in column 0 (the rest zero), ``tied`` one row."""
    if covariance_type == "full":
        return torch.diagonal(second, dim1=1, dim2=2)
    if covariance_type == "tied":
        return torch.diagonal(second).unsqueeze(0)
    if covariance_type == "diag":
        return second
    out = second.new_zeros(second.shape[0], n_features)
    out[:, 0] = second
    return out


def _check_stats(reply: Message, covariance_type: str) -> None:
    """Statistics that some weighted rows could have produced: counts add up to at most the
    row count and ``n_k S_k - s_k s_k^T`` is positive semi-definite (per covariance type)."""
    t = reply.tensors
    counts, sums, second = t["counts"], t["sums"], t["second"]
    n, rtol = float(t["n_samples"]), relative_tolerance(sums.dtype)
    if not _close_or_below(float(counts.sum()), n, rtol):
        raise InvalidReplyError(
            f"component counts add up to {float(counts.sum()):g}, more than the {n:g} rows sent."
        )
    if covariance_type == "tied":  # one scatter of all rows: S - sum_k s_k s_k^T / n_k
        occupied = counts > 0
        if bool((~occupied & (sums.abs().amax(1) > 0)).any()):
            raise InvalidReplyError("a component with zero count has non-zero sums.")
        outer = sums[occupied].T @ (sums[occupied] / counts[occupied].unsqueeze(1))
        scale = second.abs().amax().reshape(1)
        _check_psd((second - outer).unsqueeze(0), scale, "second", rtol)
        return
    if covariance_type == "full":
        gram = counts[:, None, None] * second - sums.unsqueeze(2) * sums.unsqueeze(1)
        scale = (counts[:, None, None] * second).abs().amax((1, 2)) + sums.square().amax(1)
        _check_psd(gram, scale, "second", rtol)
        return
    norms = sums.square() if covariance_type == "diag" else sums.square().sum(1)
    excess = counts.reshape(-1, *[1] * (second.ndim - 1)) * second - norms
    scale = (counts.reshape(excess.shape[0], *[1] * (excess.ndim - 1)) * second).abs() + norms
    if bool((excess < -rtol * scale - 1e-300).any()):
        raise InvalidReplyError(
            "tensor 'second' is smaller than its sums allow: no rows have these statistics."
        )


def _check_psd(gram: Tensor, scale: Tensor, name: str, rtol: float) -> None:
    """Raise unless every matrix of ``gram`` (k, d, d) is PSD up to ``rtol`` of ``scale`` (k,)."""
    symmetric = (gram + gram.transpose(-1, -2)) / 2
    if bool(((gram - symmetric).abs().amax((-1, -2)) > rtol * scale + 1e-300).any()):
        raise InvalidReplyError(f"tensor {name!r} is not symmetric.")
    lowest = torch.linalg.eigvalsh(symmetric.double()).amin(-1)
    if bool((lowest < -rtol * scale - 1e-300).any()):
        raise InvalidReplyError(
            f"tensor {name!r} is not positive semi-definite about the component means: no "
            "rows have these statistics."
        )


@dataclass
class Declared:
    """What one client has declared so far.

    Attributes:
        n_samples: its row count (fixed by the first reply that carries one).
        mean, m2: per-feature mean and sum of squared deviations from a ``moments`` round,
            each (n_features,); ``None`` before one.
    """

    n_samples: float | None = None
    mean: Tensor | None = None
    m2: Tensor | None = None


@dataclass
class ReplyValidator:
    """One run's validation of client replies, used by every engine.

    Holds the federation's row width (given, or the most common width of the first round's
    replies) and what each client declared (:class:`Declared`).

    Attributes:
        n_features: the federation's ``d`` (``None`` until known).
        declared: client id -> :class:`Declared`.
    """

    n_features: int | None = None
    declared: dict[int, Declared] = field(default_factory=dict)

    def accept(
        self,
        broadcast: Message,
        replies: Mapping[int, Message],
        widths: Mapping[int, int] | None = None,
    ) -> tuple[dict[int, Message], dict[int, str]]:
        """Split one round's replies into those the server step may use and those dropped.

        Args:
            broadcast: the round's message.
            replies: client id -> decoded reply.
            widths: client id -> the row width the client reports (Flower's reply
                header); default the federation's width for every client.

        Returns:
            ``(valid, dropped)``: valid replies by increasing client id, and client id ->
            reason for every dropped one.
        """
        widths = dict(widths or {})
        if self.n_features is None:
            width = self._federation_width(broadcast, widths)
            if width is None:
                raise ValueError("the federation's row width is not known; pass widths.")
            self.n_features = width
        valid, dropped = {}, {}
        for cid in sorted(replies):
            reply = replies[cid]
            try:
                reported = widths.get(cid, self.n_features)
                if reported != self.n_features:
                    raise InvalidReplyError(
                        f"rows of {reported} features; the federation's have {self.n_features}."
                    )
                self.check(cid, reply, broadcast)
            except InvalidReplyError as error:
                dropped[cid] = str(error)
                continue
            self._record(cid, reply)
            valid[cid] = reply
        return valid, dropped

    def _federation_width(self, broadcast: Message, widths: Mapping[int, int]) -> int | None:
        for name in ("means", "centers", "shift", "offset"):
            if name in broadcast.tensors:
                return int(broadcast.tensors[name].shape[-1])
        if not widths:
            return None
        counts = Counter(widths.values())
        top = max(counts.values())
        return min(w for w, c in counts.items() if c == top)

    def check(self, client_id: int, reply: Message, broadcast: Message) -> None:
        """Raise :class:`InvalidReplyError` if the reply is malformed or contradicts what
        ``client_id`` declared before."""
        check_reply(reply, broadcast, self.n_features)
        if is_skipped(reply):
            return
        before = self.declared.get(client_id, Declared())
        n = reply.tensors.get("n_samples", reply.tensors.get("n"))
        if n is not None and before.n_samples is not None:
            if abs(float(n) - before.n_samples) > RTOL * max(before.n_samples, 1.0):
                raise InvalidReplyError(
                    f"reply claims {float(n):g} rows; the client declared {before.n_samples:g}."
                )
        if before.mean is not None:
            self._check_box(reply, broadcast, before)

    def _record(self, client_id: int, reply: Message) -> None:
        if is_skipped(reply):
            return
        declared = self.declared.setdefault(client_id, Declared())
        n = reply.tensors.get("n_samples", reply.tensors.get("n"))
        if n is not None and declared.n_samples is None:
            declared.n_samples = float(n)
        if reply.kind == "moments" and declared.mean is None:
            declared.mean = reply.tensors["mean"].double().cpu()
            declared.m2 = reply.tensors["m2"].double().cpu()

    def _check_box(self, reply: Message, broadcast: Message, before: Declared) -> None:
        """Every mean in ``reply`` within ``|x - m| <= sqrt(M2)`` of the declared moments,
        and the statistics' squared deviations about ``m`` at most ``M2`` (in the units
        the round works in: z-scores when the broadcast carries ``offset`` and ``scale``)."""
        center, radius, m2 = before.mean, before.m2.sqrt(), before.m2
        if "scale" in broadcast.tensors:
            offset = broadcast.tensors["offset"].double().cpu()
            scale = broadcast.tensors["scale"].double().cpu()
            center, radius, m2 = (center - offset) / scale, radius / scale, m2 / scale.square()
        rtol = relative_tolerance(reply.tensors[next(iter(reply.tensors))].dtype)
        slack = rtol * (radius + center.abs()) + 1e-12
        t = {k: v.double().cpu() for k, v in reply.tensors.items()}

        def inside(points: Tensor, what: str) -> None:
            if points.numel() and bool(((points - center).abs() > radius + slack).any()):
                raise InvalidReplyError(
                    f"{what} lie outside the range the client's declared moments allow."
                )

        if reply.kind == "centroids":
            inside(t["centers"], "centroids")
        elif reply.kind == "range":
            inside(torch.stack([t["min"], t["max"]]), "feature ranges")
        elif reply.kind in STATS_KINDS:
            shift = broadcast.tensors["shift"].double().cpu()
            counts, sums = t["counts"], t["sums"]
            occupied = counts > rtol * max(float(t["n_samples"]), 1.0)
            inside(shift + sums[occupied] / counts[occupied].unsqueeze(1), "component means")
            ct = str(expectation(broadcast, "covariance_type"))
            d = shift.shape[0]
            delta = shift - center  # sum_i r (x - m)^2 = S + 2 delta s + n delta^2
            deviations = _second_diagonal(t["second"], ct, d).sum(0)
            cross, square = 2 * delta * sums.sum(0), counts.sum() * delta.square()
            if ct == "spherical":  # traces: one number for all features
                deviations, cross, square, m2 = (
                    deviations[:1],
                    cross.sum().reshape(1),
                    square.sum().reshape(1),
                    m2.sum().reshape(1),
                )
            total = deviations + cross + square
            # the terms cancel when the shift is far from the client's mean: compare with
            # a slack relative to their size, not to the result's
            slack = rtol * (deviations.abs() + cross.abs() + square + m2) + 1e-300
            if bool((total > m2 + slack).any()):
                raise InvalidReplyError(
                    "statistics spread further than the client's declared moments allow."
                )
