"""A lying client's replies, drawn by hypothesis: shared by the liar property tests
(imported as ``_liars``; ``tests/`` is on ``sys.path``, see ``_tolerance``)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from fednovelty.federated.base import Message
from fednovelty.federated.robust import EXTENSIVE

LIES = (
    "scale",
    "nan",
    "inf",
    "wrong_shape",
    "missing",
    "extra",
    "non_psd",
    "other_kind",
    "huge_rows",
    "random",
    "claim_rows",
)
#: what a consistent liar scales to claim more rows than it has: every sum over rows it
#: sends (counts, sums, second moments, row counts, ...), means and parameters unchanged.
SUMS_OVER_ROWS = (*EXTENSIVE, "n", "sum")


@st.composite
def lies(draw) -> dict:
    """What the liar does: a lie, the tensor it picks (by position), a factor, the rounds."""
    return {
        "lie": draw(st.sampled_from(LIES)),
        "pick": draw(st.integers(0, 7)),
        "factor": draw(st.sampled_from([1e300, 1e10, -1.0, 1e-300, 0.0, -1e300])),
        "every_round": draw(st.booleans()),
        "first_round": draw(st.integers(0, 3)),
        "seed": draw(st.integers(0, 2**16)),
    }


def lie(reply: Message, how: dict) -> Message:
    """``reply`` as the liar sends it (see :data:`LIES`)."""
    tensors = {name: t.clone() for name, t in reply.tensors.items()}
    names = sorted(tensors)
    g = torch.Generator().manual_seed(how["seed"])
    lie_kind = how["lie"]
    if lie_kind == "other_kind":
        return Message("em" if reply.kind != "em" else "moments", tensors, dict(reply.scalars))
    if lie_kind == "claim_rows":
        factor = abs(how["factor"]) or 1e3
        scaled = {n: (v * factor if n in SUMS_OVER_ROWS else v) for n, v in tensors.items()}
        return Message(reply.kind, scaled, dict(reply.scalars))
    if lie_kind == "extra" or not names:
        tensors["extra"] = torch.ones(3, dtype=torch.float64)
        return Message(reply.kind, tensors, dict(reply.scalars))
    name = names[how["pick"] % len(names)]
    t = tensors[name]
    floating = t.is_floating_point()
    if lie_kind == "scale" and floating:
        tensors[name] = t * how["factor"]
    elif lie_kind == "scale":  # every float tensor, as a consistent liar would
        tensors = {
            n: (v * how["factor"] if v.is_floating_point() else v) for n, v in tensors.items()
        }
    elif lie_kind in ("nan", "inf") and floating and t.numel():
        flat = t.reshape(-1).clone()
        flat[int(torch.randint(flat.numel(), (1,), generator=g))] = (
            float("nan") if lie_kind == "nan" else float("inf")
        )
        tensors[name] = flat.reshape(t.shape)
    elif lie_kind == "wrong_shape":
        tensors[name] = torch.zeros(*[s + 1 for s in t.shape], 2, dtype=t.dtype)
    elif lie_kind == "missing":
        del tensors[name]
    elif lie_kind == "non_psd" and "second" in tensors:
        tensors["second"] = -tensors["second"]
    elif lie_kind == "huge_rows":
        for key in ("n_samples", "n"):
            if key in tensors:
                tensors[key] = tensors[key] * 1e200
    elif floating:  # random: any values of the right shape
        tensors[name] = torch.randn(t.shape, dtype=t.dtype, generator=g) * how["factor"]
    return Message(reply.kind, tensors, dict(reply.scalars))
