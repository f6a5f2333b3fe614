"""The streaming detector's choice of drift test (``drift_test``) and its conformal test's
per-client state.

``drift_test="cusum"`` (the default) alarms on a CUSUM of the released surprise
(:mod:`fednovelty.mixture.drift`); ``"conformal"`` has each client test its window alone
(:mod:`fednovelty.federated.streams.conformal_drift`): the window's permutation p-value of
its mean ``-log p(x)`` against the client's latest ``drift_reference`` rows, an alarm when
``p <= false_alarm_rate`` (exact under exchangeability of the window's and the reference's
rows), and a conformal test martingale reported beside it (``martingale``,
``martingale_alarm``). The p-values stay in the clients' states, which the detector keeps
(as it keeps their weights) and records per client and window in ``drift_history_``.

Here: the parameters, the algorithm's settings, the record fields and the state's
persistence (tensors ``client_drift.<client>.<key>``).
"""

from __future__ import annotations

import math
from numbers import Integral

import torch
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._params import Param
from fednovelty.detectors.persistence import get_tensor
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.streams.conformal_drift import JUMPER_EPSILONS, OUTPUT_KEYS, STATE_KEYS

__all__ = [
    "DRIFT_PARAMS",
    "NO_CONFORMAL",
    "check_drift_params",
    "conformal_fields",
    "conformal_settings",
    "drift_tensors",
    "restore_drift_states",
]

DRIFT_PARAMS = (
    Param(
        "drift_test",
        "cusum",
        [StrOptions({"cusum", "conformal"})],
        '``"cusum"``: a CUSUM on the surprise, its threshold from Siegmund\'s approximation; '
        '``"conformal"``: each client\'s permutation p-value of the window against its own '
        "latest rows, an alarm when ``p <= false_alarm_rate`` (exact if the rows are "
        "exchangeable; docs/streaming.md).",
        "estimator",
    ),
    Param(
        "drift_reference",
        500,
        [Interval(Integral, 1, None, closed="left")],
        'rows whose scores each client keeps as its reference (``drift_test="conformal"``).',
        "estimator",
    ),
    Param(
        "drift_resamples",
        999,
        [Interval(Integral, 1, None, closed="left")],
        'pseudo-windows per p-value (``drift_test="conformal"``; >= 1 / false_alarm_rate - 1).',
        "estimator",
    ),
)

#: a record's conformal fields before (or without) a conformal test.
NO_CONFORMAL = {"p_value": float("nan"), "martingale": float("nan"), "martingale_alarm": False}


def check_drift_params(detector) -> None:
    """With ``drift_test="conformal"``, a ``ValueError`` naming ``drift_resamples`` and
    ``false_alarm_rate`` unless ``drift_resamples >= 1 / false_alarm_rate - 1``."""
    if detector.drift_test != "conformal":
        return
    least = math.ceil(1.0 / detector.false_alarm_rate - 1.0 - 1e-9)
    if detector.drift_resamples < least:
        raise ValueError(
            f"drift_resamples={detector.drift_resamples} cannot resolve false_alarm_rate="
            f"{detector.false_alarm_rate}: a window's p-value needs >= 1 / false_alarm_rate - 1 "
            f"= {least} pseudo-windows; raise drift_resamples or false_alarm_rate."
        )


def conformal_settings(detector) -> dict:
    """The streaming algorithm's settings of the clients' conformal test (none for the
    CUSUM)."""
    if detector.drift_test != "conformal":
        return {}
    return {
        "conformal_drift": True,
        "drift_alpha": float(detector.false_alarm_rate),
        "drift_reference": int(detector.drift_reference),
        "drift_resamples": int(detector.drift_resamples),
    }


def conformal_fields(detector, client: int) -> dict:
    """The record fields of the window client ``client`` (internal index) just tested
    (``p_value``, ``martingale``, ``martingale_alarm`` and ``alarm = p_value <=
    false_alarm_rate``), taken out of its state; ``{}`` if it tested nothing this window."""
    state = detector._client_state.get(client)
    if not state or OUTPUT_KEYS[0] not in state:
        return {}
    p_value, martingale, alarm = (float(state.pop(k)) for k in OUTPUT_KEYS)
    return {
        "p_value": p_value,
        "martingale": martingale,
        "martingale_alarm": alarm > 0.5,
        "alarm": p_value <= detector.false_alarm_rate,
    }


def drift_tensors(client_states: dict[int, dict]) -> dict[str, torch.Tensor]:
    """Every client's kept conformal state as named tensors (a reference of no rows is not
    written)."""
    out = {}
    for i, state in client_states.items():
        for key in STATE_KEYS:
            if key in state and state[key].numel() > 0:
                out[f"client_drift.{i}.{key}"] = state[key]
    return out


def restore_drift_states(tensors: dict, client_states: dict[int, dict], n_clients: int) -> None:
    """Put the saved conformal states (:func:`drift_tensors`) back into ``client_states``.

    Raises:
        ModelFormatError: a tensor of an unknown client or key, or of the wrong shape, a
            non-finite value, or a count of windows that is not a whole number >= 1.
    """
    shapes = {"drift_log_capital": (len(JUMPER_EPSILONS),), "drift_windows": ()}
    for name in tensors:
        if not name.startswith("client_drift."):
            continue
        _, client, key = [*name.split(".", 2), "", ""][:3]
        if not client.isdigit() or not int(client) < n_clients or key not in STATE_KEYS:
            raise ModelFormatError(
                f"the tensor {name!r} is not a client's drift state (client_drift.<client "
                f"below {n_clients}>.<one of {list(STATE_KEYS)}>)."
            )
        value = get_tensor(tensors, name, shapes.get(key)).to(torch.float64)
        if key == "drift_reference" and value.ndim != 1:
            raise ModelFormatError(f"the tensor {name!r} must be one row of scores.")
        if key == "drift_windows" and (float(value) < 1 or float(value) != round(float(value))):
            raise ModelFormatError(f"the tensor {name!r} must count >= 1 whole windows.")
        client_states.setdefault(int(client), {})[key] = value
