"""Label log-likelihoods of many clients' rows under shared learners
(``federated/core/label_tasks.py``), against log-softmax written out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fednovelty.federated.core import label_tasks
from fednovelty.federated.core.label_tasks import LabelTask, label_log_likelihoods_many
from fednovelty.federated.core.learners import train_together


class Counting(nn.Linear):
    """A linear learner that counts its forward passes."""

    calls = 0

    def forward(self, x):
        Counting.calls += 1
        return super().forward(x)


def by_hand(params, X, y):
    """log softmax(X W^T + b)[y] in numpy float64."""
    logits = X.numpy() @ params["weight"].numpy().T + params["bias"].numpy()
    logits = logits - logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return log_p[np.arange(len(y)), y.numpy()]


def learner(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(3, 4, dtype=torch.float64, generator=g),
        "bias": torch.randn(3, dtype=torch.float64, generator=g),
    }


def clients(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(n, 4, dtype=torch.float64, generator=g) for n in sizes]
    return [(X, torch.randint(0, 3, (len(X),), generator=g)) for X in rows]


def test_every_task_gets_its_own_rows_values(monkeypatch):
    monkeypatch.setattr(label_tasks, "FORWARD_ROWS", 7)  # passes that cut through clients
    module = Counting(4, 3).double()
    shared, own = learner(1), learner(2)
    data = clients([5, 0, 12, 3])
    tasks = [LabelTask(module, shared, X, y) for X, y in data]
    tasks.insert(2, LabelTask(module, own, *data[2]))  # a learner one client holds
    Counting.calls = 0
    values = label_log_likelihoods_many(tasks)
    # the shared learner's 20 rows in passes of 7 (3), the own learner's 12 rows (2)
    assert Counting.calls == 5
    expected = [by_hand(shared, X, y) for X, y in data]
    expected.insert(2, by_hand(own, *data[2]))
    assert [v.shape[0] for v in values] == [5, 0, 12, 12, 3]
    for value, reference in zip(values, expected, strict=True):
        np.testing.assert_allclose(value.numpy(), reference, rtol=1e-12, atol=1e-12)


def test_equal_values_in_other_tensors_are_another_group():
    """Grouping is by the parameter tensors themselves: a copy is evaluated on its own."""
    module = Counting(4, 3).double()
    shared = learner(1)
    copy = {k: v.clone() for k, v in shared.items()}
    data = clients([4, 4])
    Counting.calls = 0
    values = label_log_likelihoods_many(
        [LabelTask(module, shared, *data[0]), LabelTask(module, copy, *data[1])]
    )
    assert Counting.calls == 2
    np.testing.assert_allclose(values[1].numpy(), by_hand(shared, *data[1]), rtol=1e-12)
    assert label_log_likelihoods_many([]) == []


def test_rounds_that_ask_for_labels_and_trainings_get_each_answer():
    module = nn.Linear(4, 3).double()
    shared = learner(3)
    data = clients([6, 2, 9], seed=4)
    trained_marker = {"weight": torch.zeros(1)}

    def client_round(X, y):
        log_py = yield [LabelTask(module, shared, X, y)]
        trained = yield [object()]  # any other task goes to ``train``
        return float(log_py[0].sum()), trained[0] is trained_marker

    def train(tasks):
        return [trained_marker for _ in tasks]

    replies = train_together([client_round(X, y) for X, y in data], train)
    for (total, got_training), (X, y) in zip(replies, data, strict=True):
        assert got_training
        assert total == pytest.approx(by_hand(shared, X, y).sum(), rel=1e-12)
