"""A Flower grid whose nodes are ClientApp calls in this process, for engine tests that
compare a Flower run with the simulation without starting a deployment (imported by test
modules as ``_flower_grid``; ``tests/`` is on ``sys.path``, see ``_tolerance``)."""

from __future__ import annotations

import json

from flwr.app import Context, Error, RecordDict
from flwr.app import Message as FlowerMessage

from fednovelty.runtime.flower.client import make_client_app


class InProcessGrid:
    """A Flower ``Grid`` whose nodes are ClientApp calls in this process: every pushed
    message is answered at once by ``app(message, context)`` of its node (an exception
    becomes an error reply, as a SuperNode sends it); ``silent`` nodes never answer."""

    def __init__(self, app, contexts, silent=()):
        self.app, self.contexts, self.silent = app, contexts, set(silent)
        self.replies, self.sent = {}, []

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{len(self.sent)}-{i}"
            node = message.metadata.dst_node_id
            self.sent.append((node, message.metadata.message_type))
            ids.append(message.metadata.message_id)
            if node in self.silent:
                continue
            try:
                self.replies[ids[-1]] = self.app(message, self.contexts[node])
            except Exception as error:  # the SuperNode's behaviour
                self.replies[ids[-1]] = FlowerMessage(Error(0, repr(error)), reply_to=message)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def set_task_identity(monkeypatch) -> None:
    """Fix Flower's task identity (a run, node and task id) as a deployment would, so that
    messages can be built outside one; for a test module's fixture."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def make_grid(algorithm_name, params, parts, *, widths=None, silent=(), seed=0):
    """``(grid, run_config)``: one node per entry of ``parts`` (rows, or ``(X, y)`` tensors;
    node ids unrelated to the client ids), each answering as client ``c`` from ``parts[c]``
    (its first ``widths[c]`` columns where given)."""
    run_config = {"algorithm": algorithm_name, "algorithm-params": json.dumps(params), "seed": seed}
    nodes = {1000 + 7 * c: c for c in range(len(parts))}  # node ids unrelated to client ids

    def load(context):
        c = int(context.node_config["partition-id"])
        data = parts[c]
        if isinstance(data, tuple):
            return c, (data[0].numpy(), data[1].numpy())
        return c, data.numpy()[:, : (widths or {}).get(c, data.shape[1])]

    contexts = {
        node: Context(1, node, {"partition-id": c}, RecordDict(), run_config)
        for node, c in nodes.items()
    }
    return InProcessGrid(make_client_app(load), contexts, silent=silent), run_config
