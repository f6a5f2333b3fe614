"""What a fit does around its rounds, the same for every estimator.

- :func:`seed_from`: the fit's integer seed from ``random_state``;
- :func:`check_callbacks`: ``fit``'s per-round callbacks, checked;
- :func:`atomic_fit` (:func:`state_kept_on_error`): a method that sets fitted state
  (``fit``, ``partial_fit``) leaves the estimator as it was on any error: its state is
  deep-copied first and put back, the constructor arguments (option objects included) kept
  as the same objects;
- :func:`renumbered`: a callback fed round records numbered after the rounds a fit ran
  before (e.g. federated PCA's).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Iterable
from contextlib import contextmanager

import numpy as np
from sklearn.utils import check_random_state

from fednovelty.runtime import RoundRecord

__all__ = ["atomic_fit", "check_callbacks", "renumbered", "seed_from", "state_kept_on_error"]


def seed_from(random_state) -> int:
    """An integer seed from ``None``, an int or a ``numpy.random.RandomState``."""
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def check_callbacks(callbacks) -> tuple[Callable[[RoundRecord], None], ...]:
    """``fit``'s ``callbacks`` as a tuple of callables, or a TypeError that says what is wrong."""
    if (
        callable(callbacks)
        or isinstance(callbacks, str | bytes)
        or not isinstance(callbacks, Iterable)
    ):
        raise TypeError(
            f"callbacks must be a sequence of callables (e.g. callbacks=[print]); got "
            f"{type(callbacks).__name__}."
        )
    callbacks = tuple(callbacks)
    for index, callback in enumerate(callbacks):
        if not callable(callback):
            raise TypeError(
                f"callbacks[{index}] is not callable (a {type(callback).__name__}); callbacks "
                "must hold functions taking one RoundRecord."
            )
    return callbacks


@contextmanager
def state_kept_on_error(estimator):
    """Run the block; on any exception (``KeyboardInterrupt`` included) put ``estimator``'s
    attributes back as they were before it, then re-raise.

    Everything in ``estimator.__dict__`` but the constructor arguments is deep-copied first
    (fitted attributes ending in ``_`` and private fitted state alike; tensors, arrays,
    modules); the constructor arguments are kept as the same objects (a ``random_state``
    generator stays the caller's). A fitted estimator whose refit fails therefore keeps its
    previous model exactly, and an unfitted one stays unfitted.
    """
    params = {name: estimator.__dict__[name] for name in _init_names(estimator)}
    memo = {id(value): value for value in params.values()}
    saved = copy.deepcopy(estimator.__dict__, memo)
    try:
        yield
    except BaseException:
        estimator.__dict__.clear()
        estimator.__dict__.update(saved)
        raise


def atomic_fit(method):
    """Decorate a method that sets fitted state (``fit``, ``partial_fit``): on any error the
    estimator keeps the state it had before the call (:func:`state_kept_on_error`)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with state_kept_on_error(self):
            return method(self, *args, **kwargs)

    return call


def _init_names(estimator) -> list[str]:
    """The constructor arguments ``estimator`` stores under their own names."""
    return [n for n in estimator._get_param_names() if n in estimator.__dict__]


def renumbered(callback, offset: int) -> Callable[[RoundRecord], None]:
    """``callback`` fed records whose ``round`` is shifted by ``offset``."""

    def call(record: RoundRecord) -> None:
        callback(dataclasses.replace(record, round=record.round + offset))

    return call
