"""How many clients the Train page holds out (app/fednovelty_app/holdout.py)."""

import numpy as np
import pandas as pd
import pytest
from fednovelty_app.holdout import (
    DEFAULT_HELD_OUT,
    MAX_HELD_OUT,
    MIN_TRAINING_CLIENTS,
    held_out_choice,
    one_client_message,
    split_clients,
    table_client_ids,
)


@pytest.mark.parametrize("n_clients", range(1, 13))
def test_held_out_choice_leaves_a_federation_of_two(n_clients):
    largest, default = held_out_choice(n_clients)
    assert 0 <= default <= largest <= MAX_HELD_OUT
    if n_clients <= MIN_TRAINING_CLIENTS:
        assert largest == 0  # nothing can be held out and still train on two
    else:
        assert n_clients - largest >= MIN_TRAINING_CLIENTS
        assert largest == min(MAX_HELD_OUT, n_clients - MIN_TRAINING_CLIENTS)  # no tighter
    assert default == min(DEFAULT_HELD_OUT, largest)


def test_held_out_choice_for_three_clients_and_for_drawn_clients():
    assert held_out_choice(3) == (1, 1)
    assert held_out_choice(2) == (0, 0)
    assert held_out_choice(None) == (MAX_HELD_OUT, DEFAULT_HELD_OUT)
    with pytest.raises(ValueError, match="n_clients must be >= 1"):
        held_out_choice(0)


def test_split_clients_holds_out_the_last_sorted_ids():
    train, held = split_clients(np.array(["c", "a", "b", "d"]), 1)
    assert list(train) == ["a", "b", "c"] and list(held) == ["d"]
    train, held = split_clients([3, 1, 2], 0)
    assert list(train) == [1, 2, 3] and held.size == 0
    with pytest.raises(ValueError, match="would leave none to train on"):
        split_clients(["a", "b"], 2)
    with pytest.raises(ValueError, match="n_unseen must be >= 0"):
        split_clients(["a", "b"], -1)


def test_one_client_message_names_the_clients_trained_on_and_held_out():
    assert one_client_message(["a", "b"], ["c"]) is None
    message = one_client_message(np.array(["alpha"]), np.array(["beta", "gamma"]))
    assert "one client only" in message
    assert "'alpha'" in message and "held out: 'beta', 'gamma'" in message
    assert "hold out fewer clients" in message
    alone = one_client_message([7], [])
    assert "7" in alone and "held out: none" in alone and "client column" in alone
    assert "no client" in one_client_message([], ["a"])
    assert one_client_message([1], [], remedy="raise alpha").endswith("raise alpha.")


def test_table_client_ids_are_the_distinct_values_of_the_column():
    frame = pd.DataFrame({"site": ["b", "a", "b", None], "x": [1.0, 2.0, 3.0, 4.0]})
    assert list(table_client_ids(frame, "site")) == ["a", "b"]  # empty cells left out
    assert table_client_ids(frame, "region") is None
    assert table_client_ids(frame.assign(site=None), "site") is None
    mixed = pd.DataFrame({"site": [1, "a", 1, "b"]})
    assert list(table_client_ids(mixed, "site")) == ["1", "a", "b"]
