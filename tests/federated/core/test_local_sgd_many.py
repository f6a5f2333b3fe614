"""Batched local training (``local_sgd_many``) against ``torch.optim`` run one learner at a
time, written out here as the reference."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from fednovelty.federated.core.learners import (
    SGDTask,
    batch_rows,
    cnn_learner,
    initial_parameters,
    local_sgd,
    local_sgd_many,
    mlp_learner,
)


def reference_sgd(
    template,
    start,
    X,
    y,
    weight,
    generator,
    *,
    epochs=1,
    steps=None,
    learning_rate,
    batch_size,
    optimizer="sgd",
    momentum=0.0,
    mu_prox=0.0,
    offset=None,
):
    """Plain autograd and torch.optim, one batch at a time."""
    params = {k: v.detach().clone().requires_grad_(True) for k, v in start.items()}
    options = {"lr": learning_rate}
    if optimizer == "sgd" and momentum > 0:
        options["momentum"] = momentum
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[optimizer](params.values(), **options)
    n, done = X.shape[0], 0
    passes = epochs if steps is None else 10**6
    for _ in range(passes):
        order = torch.randperm(n, generator=generator)
        for begin in range(0, n, batch_size):
            b = order[begin : begin + batch_size]
            out = functional_call(template, params, (X[b],))
            if offset is not None:
                out = out + offset[b]
            losses = nn.functional.cross_entropy(out, y[b], reduction="none")
            loss = (losses if weight is None else weight[b] * losses).mean()
            if mu_prox > 0:
                loss = loss + 0.5 * mu_prox * sum(
                    (params[k] - start[k]).square().sum() for k in params
                )
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if steps is not None and done >= steps:
                return {k: v.detach() for k, v in params.items()}
    return {k: v.detach() for k, v in params.items()}


def close(a: dict, b: dict, rtol: float = 1e-9) -> bool:
    scale = max(float(v.abs().max()) for v in a.values())
    return all(float((a[k] - b[k]).abs().max()) <= rtol * max(1.0, scale) for k in a)


def clients(sizes, d=6, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        X = torch.randn(n, d, generator=g, dtype=torch.float64)
        y = torch.randint(0, classes, (n,), generator=g)
        w = torch.rand(n, generator=g, dtype=torch.float64)
        out.append((X, y, w))
    return out


@pytest.mark.parametrize(
    "options",
    [
        {"optimizer": "sgd", "epochs": 2},
        {"optimizer": "sgd", "momentum": 0.9, "epochs": 3},
        {"optimizer": "adam", "epochs": 2},
        {"optimizer": "sgd", "steps": 7, "mu_prox": 0.3},
        {"optimizer": "adam", "steps": 4},
    ],
)
def test_many_learners_of_unequal_clients_match_one_at_a_time(options):
    """Clients of 0 to 45 rows, two learners each sharing the client's generator: each
    task's result equals torch.optim's on its own, whatever the others' lengths."""
    template = mlp_learner(6, 3, hidden=5).double()
    starts = initial_parameters(lambda: mlp_learner(6, 3, hidden=5).double(), 2, 3)
    data = clients([45, 7, 0, 16, 30])
    tasks, expected = [], []
    for c, (X, y, w) in enumerate(data):
        g_many, g_ref = torch.Generator().manual_seed(c), torch.Generator().manual_seed(c)
        for m, start in enumerate(starts):
            weight = w * (m + 1) if m else None
            tasks.append(SGDTask(start, X, y, weight, g_many))
            expected.append(
                reference_sgd(
                    template,
                    start,
                    X,
                    y,
                    weight,
                    g_ref,
                    learning_rate=0.05,
                    batch_size=8,
                    **options,
                )
            )
    got = local_sgd_many(template, tasks, learning_rate=0.05, batch_size=8, **options)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert close(a, b), options
    moved = [not close(a, s) for a, s in zip(got[:2], starts, strict=True)]
    assert all(moved)  # the comparison is of trained weights, not of the starts


def test_tasks_in_chunks_match(monkeypatch):
    """More tasks than one stacked step holds are trained in chunks, with the same results."""
    from fednovelty.federated.core import learners

    template = mlp_learner(6, 3, hidden=5).double()
    starts = initial_parameters(lambda: mlp_learner(6, 3, hidden=5).double(), 3, 3)
    data = clients([12, 30, 5, 22, 17, 9, 26])

    def run():
        tasks = [
            SGDTask(starts[c % 3], X, y, w, torch.Generator().manual_seed(c))
            for c, (X, y, w) in enumerate(data)
        ]
        return local_sgd_many(template, tasks, learning_rate=0.1, batch_size=4, epochs=2)

    whole = run()
    monkeypatch.setattr(learners, "MAX_BATCH_ROWS", 9)  # 2 tasks a chunk
    chunked = run()
    for a, b, (X, y, w), c in zip(whole, chunked, data, range(7), strict=True):
        assert close(a, b)
        ref = reference_sgd(
            template,
            starts[c % 3],
            X,
            y,
            w,
            torch.Generator().manual_seed(c),
            learning_rate=0.1,
            batch_size=4,
            epochs=2,
        )
        assert close(b, ref)


def test_offsets_and_a_cnn_match():
    """Fixed logit offsets (an additive model's other half) and the paper's CNN."""
    template = cnn_learner(36, 4).double()
    (start,) = initial_parameters(lambda: cnn_learner(36, 4).double(), 1, 0)
    data = clients([9, 13], d=36, classes=4, seed=1)
    gen = torch.Generator().manual_seed(5)
    offsets = [torch.randn(X.shape[0], 4, generator=gen, dtype=torch.float64) for X, _, _ in data]
    tasks = [
        SGDTask(start, X, y, None, torch.Generator().manual_seed(i), offsets[i])
        for i, (X, y, _) in enumerate(data)
    ]
    got = local_sgd_many(template, tasks, learning_rate=0.1, batch_size=4, epochs=2)
    for i, (X, y, _) in enumerate(data):
        ref = reference_sgd(
            template,
            start,
            X,
            y,
            None,
            torch.Generator().manual_seed(i),
            learning_rate=0.1,
            batch_size=4,
            epochs=2,
            offset=offsets[i],
        )
        assert close(got[i], ref)


def test_single_task_float32_within_rounding():
    """``local_sgd`` (one task) in float32 against torch.optim, relative to the weights."""
    template = mlp_learner(6, 3).float()
    (start,) = initial_parameters(lambda: mlp_learner(6, 3).float(), 1, 0)
    X, y, w = clients([50])[0]
    X, w = X.float(), w.float()
    got = local_sgd(
        template,
        start,
        X,
        y,
        w,
        torch.Generator().manual_seed(0),
        learning_rate=0.1,
        batch_size=16,
        epochs=3,
    )
    ref = reference_sgd(
        template,
        start,
        X,
        y,
        w,
        torch.Generator().manual_seed(0),
        learning_rate=0.1,
        batch_size=16,
        epochs=3,
    )
    assert close(got, ref, rtol=1e-5)
    assert all(not v.requires_grad for v in got.values())
    assert all(
        torch.equal(start[k], initial_parameters(lambda: mlp_learner(6, 3).float(), 1, 0)[0][k])
        for k in start
    )  # start untouched


def test_batch_rows_draws_as_passes_over_the_rows():
    g, ref = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    rows, mask = batch_rows(g, 10, 4, epochs=2, steps=None)
    assert rows.shape == (6, 4) and float(mask.sum()) == 20
    first, second = torch.randperm(10, generator=ref), torch.randperm(10, generator=ref)
    assert torch.equal(rows[:3].flatten()[mask[:3].flatten() > 0], first)
    assert torch.equal(rows[3:].flatten()[mask[3:].flatten() > 0], second)
    rows, mask = batch_rows(torch.Generator(), 10, 4, epochs=1, steps=5)
    assert rows.shape == (5, 4) and float(mask.sum()) == 18
    rows, _ = batch_rows(torch.Generator(), 0, 4, epochs=3, steps=None)
    assert rows.shape == (0, 4)
