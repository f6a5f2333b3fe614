"""The learners' machinery shared by the classification algorithms (algorithm layer).

A *learner* is a torch module from a factory ``(n_features, n_classes) -> nn.Module``
(:data:`LEARNERS` by their JSON names ``linear``, ``mlp`` and ``cnn``, or a custom one);
what crosses the wire and what the server keeps is a dict of its parameter tensors, and the
module itself is only a *template* evaluated with ``torch.func.functional_call``. FedGMM's
joint model (:mod:`fednovelty.federated.joint_models.joint`), pFedEM and the clustered
algorithms (:mod:`fednovelty.federated.clustered.cam_algorithm`) all train their learners with
:func:`local_sgd` and start them with :func:`initial_parameters`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fednovelty.federated.core.label_tasks import LabelTask, label_log_likelihoods_many

#: the local optimisers by their settings name (a fresh state every round: optimiser state
#: never crosses the wire); :func:`local_sgd_many` writes their steps out as these classes
#: define them.
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}

LearnerFactory = Callable[[int, int], nn.Module]


def linear_learner(n_features: int, n_classes: int) -> nn.Module:
    """Multinomial logistic regression (the default learner)."""
    return nn.Linear(n_features, n_classes)


def mlp_learner(n_features: int, n_classes: int, hidden: int = 64) -> nn.Module:
    """A small two-layer perceptron."""
    return nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


def cnn_learner(n_features: int, n_classes: int) -> nn.Module:
    """The FedGMM paper's FEMNIST encoder for square one-channel images flattened to
    ``n_features = side * side`` (side >= 6): two 3x3 convolutions (32 and 64 channels,
    ReLU), 2x2 max pooling, a 128-unit dense layer (ReLU) and the class layer. The paper's
    dropout is left out: the learners' local training draws no randomness but its batches'.

    Raises:
        ValueError: ``n_features`` is not the square of a side of at least 6.
    """
    side = math.isqrt(max(int(n_features), 0))
    if side * side != n_features or side < 6:
        raise ValueError(
            f"learner='cnn' needs square images flattened to side * side features with side "
            f">= 6 (784 for 28 x 28); got n_features={n_features}. Use 'linear' or 'mlp' for "
            "other rows."
        )
    pooled = (side - 4) // 2
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * pooled * pooled, 128),
        nn.ReLU(),
        nn.Linear(128, n_classes),
    )


#: learner factories by their JSON name.
LEARNERS: dict[str, LearnerFactory] = {
    "linear": linear_learner,
    "mlp": mlp_learner,
    "cnn": cnn_learner,
}


def as_learner(value: Any) -> LearnerFactory:
    """A learner factory from a callable or its JSON name, or a ``ValueError`` naming
    ``'learner'``."""
    if isinstance(value, str):
        if value not in LEARNERS:
            raise ValueError(
                f"'learner' must be one of {sorted(LEARNERS)} (a custom factory is code, which "
                f"a JSON setting cannot carry); got {value!r}."
            )
        return LEARNERS[value]
    if not callable(value):
        raise ValueError(
            f"'learner' must be a factory (n_features, n_classes) -> nn.Module or one of "
            f"{sorted(LEARNERS)}; got {value!r}."
        )
    return value


def learner_template(
    factory: Callable[[int, int], nn.Module],
    n_features: int,
    n_classes: int,
    device: torch.device,
    dtype: torch.dtype,
) -> nn.Module:
    """The module ``factory(n_features, n_classes)`` in ``dtype`` on ``device``."""
    return factory(n_features, n_classes).to(device=device, dtype=dtype)


def parameters_of(module: nn.Module) -> dict[str, Tensor]:
    """A detached copy of ``module``'s parameters by name."""
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def initial_parameters(
    make: Callable[[], nn.Module], count: int, random_state: int
) -> list[dict[str, Tensor]]:
    """``count`` parameter dicts of fresh modules ``make()``, drawn one after the other from
    torch's global generator seeded with ``random_state`` (restored afterwards): distinct
    random initialisations, the same on every machine."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(random_state)
        return [parameters_of(make()) for _ in range(count)]


def logits(module: nn.Module, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """``module``'s output with parameters ``params`` on rows ``X``, (n_samples, n_classes)."""
    return functional_call(module, params, (X,))


@dataclass(frozen=True)
class SGDTask:
    """One learner's local training, as :func:`local_sgd_many` runs it.

    Attributes:
        start: the learner's starting parameters by name (not modified).
        X: rows (n_samples, n_features); y: labels (n_samples,) int64.
        weight: per-row weights (n_samples,); ``None``: every row 1.
        generator: the batches' randomness (tasks may share one: they draw from it in
            the order they are listed, as one-after-the-other training would).
        offset: logits (n_samples, n_classes) added to the learner's, held fixed.
        mu_prox: this task's proximal coefficient (``None``: the call's ``mu_prox``).
    """

    start: dict[str, Tensor]
    X: Tensor
    y: Tensor
    weight: Tensor | None
    generator: torch.Generator
    offset: Tensor | None = None
    mu_prox: float | None = None


#: one client's round written as a generator: it yields its learners' trainings (lists of
#: :class:`SGDTask`) or its rows' label log-likelihoods under learners (lists of
#: :class:`~fednovelty.federated.core.label_tasks.LabelTask`), receives each list's results
#: (trained parameters, (n,) log-likelihoods) in the same order, and returns its reply (any
#: object: the algorithm's message).
ClientRound = Generator[list[SGDTask | LabelTask], list[Any], Any]


def _answer(
    tasks: list[SGDTask | LabelTask],
    train: Callable[[list[SGDTask]], list[dict[str, Tensor]]],
    evaluate: Callable[[list[LabelTask]], list[Tensor]],
) -> list[Any]:
    """Each task's result in order: the :class:`LabelTask` objects evaluated in one call of
    ``evaluate``, the others (:class:`SGDTask`) trained in one call of ``train``."""
    out: list[Any] = [None] * len(tasks)
    labels = [isinstance(task, LabelTask) for task in tasks]
    for wanted, run in ((False, train), (True, evaluate)):
        index = [i for i, label in enumerate(labels) if label == wanted]
        if index:
            for i, result in zip(index, run([tasks[i] for i in index]), strict=True):
                out[i] = result
    return out


def train_together(
    rounds: Sequence[ClientRound],
    train: Callable[[list[SGDTask]], list[dict[str, Tensor]]],
    evaluate: Callable[[list[LabelTask]], list[Tensor]] = label_log_likelihoods_many,
) -> list[Any]:
    """Run several clients' rounds, the trainings they ask for at the same point trained in
    one call ``train`` (e.g. :func:`local_sgd_many` under the algorithm's settings) and the
    label log-likelihoods in one call ``evaluate`` (rows of a shared learner in few passes:
    :func:`~fednovelty.federated.core.label_tasks.label_log_likelihoods_many`).

    Each pass advances every round still running to its next ``yield``, answers all the
    tasks asked for and sends each round its own results; a round that returns
    (it skips, has trained by its own DP-SGD, or is done) keeps its reply. A round with one
    client is the same code: a step is written once for one client (a Flower node) and for
    many (the simulation).

    Returns:
        Each round's reply, in the order of ``rounds``.
    """
    replies: list[Any] = [None] * len(rounds)
    results: dict[int, list[dict[str, Tensor]] | None] = dict.fromkeys(range(len(rounds)))
    while results:
        asked: list[tuple[int, list[SGDTask]]] = []
        for i, sent in results.items():
            try:
                tasks = rounds[i].send(sent)
            except StopIteration as done:
                replies[i] = done.value
            else:
                asked.append((i, list(tasks)))
        flat = [task for _, tasks in asked for task in tasks]
        answered = iter(_answer(flat, train, evaluate))
        results = {i: [next(answered) for _ in tasks] for i, tasks in asked}
    return replies


class LearnerRounds:
    """A step's client half written as :data:`ClientRound` generators (mixed into a
    :class:`~fednovelty.federated.core.steps.Step` before it): :meth:`client_round` for one
    client, :meth:`train_many` for the tasks of any clients. ``client_steps`` runs several
    clients' rounds with their trainings batched (:func:`train_together`) and
    ``client_step`` is one client's, the same code."""

    batched = True

    def client_round(self, data: Any, message: Any, context: Any) -> ClientRound:
        raise NotImplementedError

    def train_many(self, tasks: list[SGDTask]) -> list[dict[str, Tensor]]:
        raise NotImplementedError

    def client_step(self, data: Any, message: Any, context: Any) -> Any:
        return self.client_steps([(data, context)], message)[0]

    def client_steps(self, items: Sequence[tuple[Any, Any]], message: Any) -> list[Any]:
        rounds = [self.client_round(data, message, context) for data, context in items]
        return train_together(rounds, self.train_many)


def batch_rows(
    generator: torch.Generator, n: int, batch_size: int, epochs: int, steps: int | None
) -> tuple[Tensor, Tensor]:
    """The mini-batches of one learner's training, drawn as :func:`local_sgd` visits them.

    Each pass over the rows is ``torch.randperm(n, generator)`` cut into batches of
    ``batch_size`` (the last one shorter); ``epochs`` passes, or with ``steps`` exactly
    that many batches, the rows reshuffled whenever a pass ends.

    Returns:
        ``(rows, mask)``: row indices (n_steps, batch_size) int64, padded with 0, and the
        float mask (n_steps, batch_size) of real entries. No steps for ``n == 0`` or
        ``steps <= 0``.
    """
    per_pass = -(-n // batch_size) if n > 0 else 0
    total = 0 if per_pass == 0 else (epochs * per_pass if steps is None else max(steps, 0))
    if total == 0:
        return torch.zeros(0, batch_size, dtype=torch.long), torch.zeros(0, batch_size)
    passes = -(-total // per_pass)
    rows = torch.zeros(passes, per_pass * batch_size, dtype=torch.long)
    mask = torch.zeros(passes, per_pass * batch_size)
    for p in range(passes):
        rows[p, :n] = torch.randperm(n, generator=generator)
        mask[p, :n] = 1.0
    return rows.view(-1, batch_size)[:total], mask.view(-1, batch_size)[:total]


def _stacked(tensors: list[Tensor], width: int) -> Tensor:
    """Tensors (n_i, ...) zero-padded along their first axis to ``width`` and stacked:
    (len(tensors), width, ...)."""
    out = tensors[0].new_zeros((len(tensors), width, *tensors[0].shape[1:]))
    for i, t in enumerate(tensors):
        out[i, : t.shape[0]] = t
    return out


def _distinct(tasks: list[SGDTask]) -> tuple[list[SGDTask], Tensor]:
    """One task for each distinct ``(X, y)`` pair of ``tasks`` (by identity) and each
    task's index among them."""
    seen: dict[tuple[int, int], int] = {}
    index = [seen.setdefault((id(t.X), id(t.y)), len(seen)) for t in tasks]
    unique = list({(id(t.X), id(t.y)): t for t in tasks}.values())
    return unique, torch.tensor(index, dtype=torch.long)


#: most rows (tasks x batch size) one stacked step trains at once: more tasks are trained
#: in chunks of ``MAX_BATCH_ROWS // batch_size`` (bounds the activations a large federation
#: holds on a GPU: 539 writers' CNNs at batch 128 go in 4 chunks).
MAX_BATCH_ROWS = 65536


def local_sgd_many(
    template: nn.Module,
    tasks: list[SGDTask],
    *,
    epochs: int = 1,
    steps: int | None = None,
    learning_rate: float,
    batch_size: int,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    mu_prox: float = 0.0,
) -> list[dict[str, Tensor]]:
    """Several learners' :func:`local_sgd`, run as one batched computation.

    Every task trains a copy of ``template`` from its own ``start`` on its own rows; the
    copies are stacked and each step is one ``torch.func.vmap`` of the loss gradient over
    them (``functional_call``), so many clients' small models cost a few large kernels
    instead of many small ones. The tasks' batches are drawn first, from their generators
    in task order (:func:`batch_rows`), so each task sees the batches it would alone. The
    optimiser steps are written out (SGD with heavy-ball momentum and Adam as
    ``torch.optim`` defines them, a fresh state per task); a task whose batches are done
    stops moving. Rows of different tasks never mix: each copy's gradient is of its own
    rows. At most :data:`MAX_BATCH_ROWS` rows are stacked in one step (tasks in chunks).

    Args:
        template: the learners' module (its own parameters are not used).
        tasks: the trainings (:class:`SGDTask`); tasks may share ``X``, ``y`` tensors.
        epochs, steps, learning_rate, batch_size, optimizer, momentum, mu_prox: as
            :func:`local_sgd`'s, the same for every task.

    Returns:
        Each task's trained parameters (detached), in task order.
    """
    if not tasks:
        return []
    batches = [batch_rows(t.generator, t.X.shape[0], batch_size, epochs, steps) for t in tasks]
    lengths = torch.tensor([rows.shape[0] for rows, _ in batches])
    order = torch.argsort(lengths, descending=True, stable=True)
    tasks = [tasks[i] for i in order.tolist()]
    batches = [batches[i] for i in order.tolist()]
    lengths = lengths[order]
    names = list(tasks[0].start)
    per_chunk = max(1, MAX_BATCH_ROWS // batch_size)
    trained: dict[str, list[Tensor]] = {k: [] for k in names}
    for begin in range(0, len(tasks), per_chunk):
        chunk = slice(begin, begin + per_chunk)
        params = {k: torch.stack([t.start[k].detach() for t in tasks[chunk]]) for k in names}
        params = _train_stacked(
            template,
            tasks[chunk],
            batches[chunk],
            lengths[chunk],
            params,
            learning_rate=learning_rate,
            optimizer=optimizer,
            momentum=momentum,
            mu_prox=mu_prox,
        )
        for k in names:
            trained[k].extend(params[k].unbind(0))
    results: list[dict[str, Tensor]] = [{}] * len(tasks)
    for row, i in enumerate(order.tolist()):
        results[i] = {k: trained[k][row].clone() for k in names}
    return results


def _train_stacked(
    template: nn.Module,
    tasks: list[SGDTask],
    batches: list[tuple[Tensor, Tensor]],
    lengths: Tensor,
    params: dict[str, Tensor],
    *,
    learning_rate: float,
    optimizer: str,
    momentum: float,
    mu_prox: float,
) -> dict[str, Tensor]:
    """The steps of :func:`local_sgd_many` on tasks sorted by decreasing step count
    ``lengths`` (n_tasks,): step ``s`` moves the first ``sum(lengths > s)`` copies of the
    stacked ``params`` (n_tasks, ...) in place; returns them."""
    n_steps = int(lengths[0]) if len(lengths) else 0
    if n_steps == 0:
        return params
    first = tasks[0].X
    device, dtype = first.device, params[next(iter(params))].dtype
    width = max(t.X.shape[0] for t in tasks)
    sources, source = _distinct(tasks)
    X = _stacked([t.X for t in sources], width)  # (n_sources, width, n_features)
    Y = _stacked([t.y for t in sources], width)
    source = source.to(device)
    W = _stacked(
        [t.weight if t.weight is not None else t.X.new_ones(t.X.shape[0]) for t in tasks], width
    ).to(dtype)
    offsets = None
    given = [t.offset for t in tasks if t.offset is not None]
    if given:  # a task without an offset adds zeros
        classes = given[0].shape[1]
        offsets = _stacked(
            [t.X.new_zeros(t.X.shape[0], classes) if t.offset is None else t.offset for t in tasks],
            width,
        )
    mus = torch.tensor(
        [mu_prox if t.mu_prox is None else float(t.mu_prox) for t in tasks], dtype=dtype
    ).to(device)
    prox = bool((mus > 0).any())
    rows = torch.zeros(len(tasks), n_steps, batches[0][0].shape[1], dtype=torch.long)
    mask = torch.zeros(rows.shape, dtype=dtype)
    for i, (r, m) in enumerate(batches):
        rows[i, : r.shape[0]], mask[i, : m.shape[0]] = r, m
    rows, mask = rows.to(device), mask.to(device)
    starts = {k: v.clone() for k, v in params.items()} if prox else params

    def loss(p, xb, yb, wb, mb, ob):
        out = functional_call(template, p, (xb,))
        if ob is not None:
            out = out + ob
        ce = nn.functional.cross_entropy(out, yb, reduction="none")
        return (wb * mb * ce).sum() / mb.sum().clamp_min(1.0)

    batched = vmap(grad(loss), in_dims=(0, 0, 0, 0, 0, None if offsets is None else 0))

    def gradient(p, xb, yb, wb, mb, ob):
        if xb.shape[0] > 1:
            return batched(p, xb, yb, wb, mb, ob)
        # one task: plain autograd, without vmap's per-call cost
        leaves = {k: v[0].detach().requires_grad_(True) for k, v in p.items()}
        with torch.enable_grad():
            value = loss(
                leaves,
                xb[0],
                yb[0],
                wb[0],
                mb[0],
                None if ob is None else ob[0],
            )
            grads = torch.autograd.grad(value, list(leaves.values()))
        return {k: g.unsqueeze(0) for k, g in zip(leaves, grads, strict=True)}

    moving = optimizer == "adam" or momentum > 0  # optimiser state to keep
    state = {k: torch.zeros_like(v) for k, v in params.items()} if moving else {}
    second = {k: torch.zeros_like(v) for k, v in params.items()} if optimizer == "adam" else {}
    for s in range(n_steps):
        a = int((lengths > s).sum())
        r, m = rows[:a, s], mask[:a, s]  # (a, batch)
        pick = torch.arange(a, device=device).unsqueeze(1)
        xb = X[source[:a].unsqueeze(1), r]
        yb = Y[source[:a].unsqueeze(1), r]
        ob = None if offsets is None else offsets[pick, r]
        g = gradient(
            {k: v[:a] for k, v in params.items()},
            xb,
            yb,
            W[pick, r],
            m,
            ob,
        )
        with torch.no_grad():
            for k in params:
                if prox:  # the gradient of mu / 2 ||theta - start||^2, added in closed form
                    shape = (a, *[1] * (params[k].ndim - 1))
                    g[k] = g[k] + mus[:a].view(shape) * (params[k][:a] - starts[k][:a])
                _optimiser_step(
                    params[k][:a],
                    g[k],
                    state[k][:a] if state else None,
                    second[k][:a] if second else None,
                    s + 1,
                    learning_rate=learning_rate,
                    momentum=momentum,
                )
    return params


#: Adam's coefficients (``torch.optim.Adam``'s defaults).
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


def _optimiser_step(
    param: Tensor,
    g: Tensor,
    first: Tensor | None,
    second: Tensor | None,
    step: int,
    *,
    learning_rate: float,
    momentum: float,
) -> None:
    """One optimiser step on stacked ``param`` in place: SGD (``second`` None; heavy-ball
    ``momentum`` with its buffer in ``first``, set to the gradient on step 1 as
    ``torch.optim.SGD`` does) or Adam (moments ``first``, ``second``; bias-corrected by
    ``step``, 1-based)."""
    if second is None:
        if momentum > 0 and first is not None:
            if step == 1:
                first.copy_(g)
            else:
                first.mul_(momentum).add_(g)
            g = first
        param.add_(g, alpha=-learning_rate)
        return
    b1, b2 = ADAM_BETAS
    first.mul_(b1).add_(g, alpha=1 - b1)
    second.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (second.sqrt() / math.sqrt(1 - b2**step)).add_(ADAM_EPS)
    param.addcdiv_(first, denom, value=-learning_rate / (1 - b1**step))


def local_sgd(
    template: nn.Module,
    start: dict[str, Tensor],
    X: Tensor,
    y: Tensor,
    weight: Tensor | None,
    generator: torch.Generator,
    *,
    epochs: int = 1,
    steps: int | None = None,
    learning_rate: float,
    batch_size: int,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    mu_prox: float = 0.0,
    offset: Tensor | None = None,
) -> dict[str, Tensor]:
    """Mini-batch training of the learner from ``start`` on ``mean_i w_i CE(y_i, z_i)``,
    where ``z_i`` are the learner's logits plus ``offset_i``: one task of
    :func:`local_sgd_many`.

    Each epoch visits the rows once in the order of ``torch.randperm(n, generator)``, in
    batches of ``batch_size``.

    Args:
        template: the learner's module; start: its parameters, not modified.
        X: rows (n_samples, n_features); y: labels (n_samples,).
        weight: per-row weights (n_samples,); ``None``: every row 1.
        generator: the batches' randomness.
        epochs: passes over the rows (used when ``steps`` is None).
        steps: exactly this many mini-batch steps, the rows reshuffled whenever a pass
            ends (``None``: ``epochs`` passes).
        learning_rate, batch_size: the steps'.
        optimizer: ``"sgd"`` or ``"adam"`` (:data:`OPTIMIZERS`).
        momentum: SGD's heavy-ball momentum (0: plain SGD; not used by Adam).
        mu_prox: proximal coefficient: ``mu / 2 ||theta - start||^2`` is added to the loss
            (FedProx; FeSEM's pull towards the cluster centre).
        offset: logits (n_samples, n_classes) added to the learner's, held fixed (the
            other half of an additive model, e.g. Fed-CAM's global or cluster model).

    Returns:
        The trained parameters (detached).
    """
    task = SGDTask(start, X, y, weight, generator, offset)
    return local_sgd_many(
        template,
        [task],
        epochs=epochs,
        steps=steps,
        learning_rate=learning_rate,
        batch_size=batch_size,
        optimizer=optimizer,
        momentum=momentum,
        mu_prox=mu_prox,
    )[0]
