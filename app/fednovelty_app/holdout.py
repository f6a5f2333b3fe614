"""How many clients the Train page holds out of training, and the warning when one trains.

A federation needs at least ``MIN_TRAINING_CLIENTS`` training clients. The synthetic,
ADBench, digits and FEMNIST sources draw the held-out clients on top of the training clients
the page asks for, so holding clients out never shrinks the federation there. An uploaded
table has the clients it has: every client held out is one fewer to train on, so for uploads
the number held out is bounded by :func:`held_out_choice` and the clients are split by
:func:`split_clients` (the same split the upload's bundle uses).

- :func:`held_out_choice`: the widget's largest value and its default for a number of
  clients (``None``: a source that draws held-out clients on top).
- :func:`table_client_ids`: the client ids of an uploaded table's client column.
- :func:`split_clients`: sorted client ids -> (training ids, held-out ids).
- :func:`one_client_message`: the words the page shows (``st.warning``) when fewer than
  ``MIN_TRAINING_CLIENTS`` clients train, naming the clients trained on and held out.
- :class:`OneTrainingClientWarning`: the warning category ``upload_bundle`` and
  ``synthetic_bundle`` issue in that case.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DEFAULT_HELD_OUT",
    "MAX_HELD_OUT",
    "MIN_TRAINING_CLIENTS",
    "OneTrainingClientWarning",
    "held_out_choice",
    "one_client_message",
    "split_clients",
    "table_client_ids",
]

#: Fewest training clients the page lets an upload keep (a federation of two or more).
MIN_TRAINING_CLIENTS = 2
#: The held-out widget's default and its largest value when the source draws extra clients.
DEFAULT_HELD_OUT = 2
MAX_HELD_OUT = 5


class OneTrainingClientWarning(UserWarning):
    """Fewer than ``MIN_TRAINING_CLIENTS`` clients train: the "federation" is one client."""


def held_out_choice(n_clients: int | None) -> tuple[int, int]:
    """``(largest, default)`` number of clients to hold out.

    Args:
        n_clients: clients in an uploaded table, or None for a source that draws the
            held-out clients on top of its training clients.

    Returns:
        ``(MAX_HELD_OUT, DEFAULT_HELD_OUT)`` for None; else the largest number that leaves
        ``MIN_TRAINING_CLIENTS`` training (at most ``MAX_HELD_OUT``, at least 0) and the
        default ``min(DEFAULT_HELD_OUT, largest)``: 3 clients -> (1, 1), 2 -> (0, 0),
        4 -> (2, 2), 10 -> (5, 2).

    Raises:
        ValueError: ``n_clients`` below 1.
    """
    if n_clients is None:
        return MAX_HELD_OUT, DEFAULT_HELD_OUT
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1 (clients in the table); got {n_clients}.")
    largest = int(np.clip(n_clients - MIN_TRAINING_CLIENTS, 0, MAX_HELD_OUT))
    return largest, min(DEFAULT_HELD_OUT, largest)


def table_client_ids(frame, column) -> np.ndarray | None:
    """The distinct non-empty values of ``frame[column]``, sorted as ``np.unique`` sorts
    them (as text when the values do not compare, e.g. numbers and text mixed); None when
    the table has no such column or no value in it (the upload's checks then say why).

    Args:
        frame: the uploaded table (a DataFrame); column: its client column's name.
    """
    if column not in frame.columns:
        return None
    values = frame[column].dropna().to_numpy()
    if values.size == 0:
        return None
    try:
        return np.unique(values)
    except TypeError:
        return np.unique(values.astype(str))


def split_clients(client_ids, n_unseen: int) -> tuple[np.ndarray, np.ndarray]:
    """``(training ids, held-out ids)``: the last ``n_unseen`` of the sorted ids are held out.

    Args:
        client_ids: (n_clients,) the table's client ids, any order (sorted here, as
            ``np.unique`` sorts them).
        n_unseen: clients held out, 0 <= n_unseen < n_clients.

    Raises:
        ValueError: ``n_unseen`` negative, or not below the number of clients (none would
            train).
    """
    ids = np.unique(np.asarray(client_ids))
    if n_unseen < 0:
        raise ValueError(f"n_unseen must be >= 0; got {n_unseen}.")
    if n_unseen >= ids.size:
        raise ValueError(
            f"the data have {ids.size} client(s); holding out {n_unseen} would leave none to "
            "train on. Hold out fewer clients."
        )
    cut = ids.size - n_unseen
    return ids[:cut], ids[cut:]


def _listed(ids) -> str:
    shown = [repr(i.item() if isinstance(i, np.generic) else i) for i in list(ids)[:8]]
    return ", ".join(shown) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "") or "none"


def one_client_message(training_ids, held_out_ids, remedy: str | None = None) -> str | None:
    """What the page says when fewer than ``MIN_TRAINING_CLIENTS`` clients train, else None.

    Args:
        training_ids: (n_train,) the clients trained on; held_out_ids: (n_held,) the clients
            held out of training.
        remedy: what to do, ending the message (None: hold out fewer clients when some are
            held out, else choose a client column with more clients).

    Returns:
        e.g. ``"Training on one client only: 'a' (held out: 'b', 'c'). ..."``, naming both
        groups and what to do, or None when the federation has two or more clients.
    """
    training_ids, held_out_ids = list(training_ids), list(held_out_ids)
    if len(training_ids) >= MIN_TRAINING_CLIENTS:
        return None
    count = "no client" if not training_ids else "one client only"
    if remedy is None:
        remedy = (
            "hold out fewer clients" if held_out_ids else "choose a client column with more clients"
        )
    return (
        f"Training on {count}: {_listed(training_ids)} (held out: {_listed(held_out_ids)}). "
        "Federated methods then fit a single client's rows: there is no federation. To train "
        f"on {MIN_TRAINING_CLIENTS} or more clients, {remedy}."
    )
