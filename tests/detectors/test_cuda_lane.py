"""The CUDA lane: every registry method fitted on the CPU and on CUDA scores alike.

The tests marked ``cuda`` (``make test-cuda``) fit each method of
``fednovelty.methods.METHODS`` that has a ``device`` (all but PyOD's baselines) once on
``"cpu"`` and once on ``"cuda"``, float64, same rows and seed, and compare what both say about
the same rows (``_lane.compare_method``); ``StreamingFedGMMDetector`` is compared window by
window over three windows (``_lane.compare_streams``). They are skipped where torch sees no
CUDA device. The other tests run everywhere: the harness on ``("cpu", "cpu")`` for a few
methods, its comparison on hand-made arrays, and the device discipline of the streaming code
with the ``meta`` device standing in for a second device.
"""

import traceback

import numpy as np
import pytest
import torch
from _lane import (
    RTOL,
    compare_method,
    compare_streams,
    fitted_on,
    lane_names,
    mismatches,
    stream_windows,
    tensor_devices,
)
from torch.overrides import TorchFunctionMode

from fednovelty.federated.trust.floors import suppress_components
from fednovelty.methods import METHODS
from fednovelty.mixture import SufficientStats

NO_CUDA = "no CUDA device: torch.cuda.is_available() is False (the lane runs on a GPU machine)"


def cuda(test):
    """Mark ``test`` as a CUDA lane test, skipped where torch sees no CUDA device."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
    return pytest.mark.cuda(skip(test))


# ----------------------------------------------------------------------------- the lane
@cuda
@pytest.mark.parametrize("name", lane_names())
def test_every_method_scores_alike_on_cuda(name):
    assert compare_method(name, ("cpu", "cuda")) == []


@cuda
def test_the_streaming_detector_runs_window_after_window_on_cuda():
    assert compare_streams(("cpu", "cuda")) == []


# ----------------------------------------------------------------------------- the harness
def test_the_lane_covers_every_method_with_a_device():
    names = lane_names()
    assert set(names) == {n for n, m in METHODS.items() if m.kind != "pyod"}
    assert {"streaming", "PFL-pFedEM", "PFL-IFCA-CAM", "FedVB", "KNN-markers"} <= set(names)
    assert {"Local", "PFL-VGM2-Local", "CentralGMM"} <= set(names)


@pytest.mark.parametrize("name", ["FedGMM", "FedVB", "KNN-markers", "PFL-FedEM", "PFL-IFCA"])
def test_the_harness_finds_two_cpu_fits_alike(name):
    """The lane's own code on ``("cpu", "cpu")``: fit, score, compare, device check."""
    assert compare_method(name, ("cpu", "cpu")) == []


def test_the_stream_harness_finds_two_cpu_runs_alike():
    detector, windows = stream_windows("cpu")
    assert len(windows) == 3 and len(windows[1]["births"]) == 0
    assert len(windows[2]["births"]) == 1  # the far rows of the third window re-bore one
    assert windows[1]["drift"].shape == (4, 4)
    np.testing.assert_allclose(windows[2]["client_weights"].sum(1), 1.0, rtol=0, atol=1e-12)
    assert tensor_devices(detector) == {"cpu"} and not fitted_on(detector, "meta")
    assert compare_streams(("cpu", "cpu")) == []


def test_mismatches_reports_what_departs_beyond_the_scale():
    a = {"s": np.array([1000.0, -2.0, np.inf]), "p": np.array([[0.2, 0.8]])}
    # within RTOL of the scale (1000): 1e-6 absolute passes, 1e-4 does not
    assert mismatches(a, {"s": a["s"] + [1e-6, 0, 0], "p": a["p"]}) == []
    [far] = mismatches(a, {"s": a["s"] + [0, 1e-4, 0], "p": a["p"]})
    assert far.startswith("s: max |a - b| = 0.0001 >")
    # values below 1 are held to RTOL itself
    assert mismatches(a, {**a, "p": a["p"] + 2 * RTOL}) != []
    assert mismatches(a, {**a, "p": a["p"] + 0.5 * RTOL}) == []
    assert mismatches(a, {**a, "s": np.array([1000.0, np.inf, np.inf])}) == [
        "s: non-finite values differ"
    ]
    assert mismatches(a, {**a, "s": np.array([1000.0, -2.0, -np.inf])}) == [
        "s: non-finite values differ"
    ]
    assert mismatches(a, {**a, "p": a["p"].T}) == ["p: shape (1, 2) against (2, 1)"]
    assert mismatches(a, {"s": a["s"]}) == ["p: only on the first device"]
    assert mismatches({"s": a["s"]}, a) == ["p: only on the second device"]


def test_tensor_devices_looks_into_attributes_and_containers():
    class Holder:
        def __init__(self):
            self.model_ = {"means": [torch.zeros(2, device="meta")]}
            self.net = torch.nn.Linear(2, 1)
            self.name = "x"
            self.values = np.zeros(3)

    assert tensor_devices(Holder()) == {"meta", "cpu"}
    assert tensor_devices({"a": [np.zeros(2), "b"]}) == set()


# ----------------------------------------------------------------------------- device discipline
def _stats(device: str) -> SufficientStats:
    """Two components, two features, ``full``: counts [2, 3], sums [[1, 2], [3, 4]], second
    moments 1 and 2 times the identity, on ``device``."""
    t = {"dtype": torch.float64, "device": device}
    return SufficientStats(
        counts=torch.tensor([2.0, 3.0], **t),
        sums=torch.tensor([[1.0, 2.0], [3.0, 4.0]], **t),
        second=torch.stack([torch.eye(2, **t), 2 * torch.eye(2, **t)]),
        shift=torch.zeros(2, **t),
        log_likelihood=torch.tensor(-5.0, **t),
        n_samples=torch.tensor(5.0, **t),
        covariance_type="full",
    )


def test_suppress_components_moves_its_mask_to_the_statistics_device():
    """``keep`` on the CPU, statistics elsewhere (``meta``: a device with no data, which torch
    refuses to mix with the CPU as it refuses CUDA): the mask follows the statistics."""
    keep = torch.tensor([True, False])
    moved = suppress_components(_stats("meta"), keep)
    devices = {moved.counts.device.type, moved.sums.device.type, moved.second.device.type}
    assert devices == {"meta"}
    kept = suppress_components(_stats("cpu"), keep)  # by hand: component 1 sent as zeros
    assert kept.counts.tolist() == [2.0, 0.0]
    assert kept.sums.tolist() == [[1.0, 2.0], [0.0, 0.0]]
    assert kept.second.tolist() == [[[1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]]
    assert float(kept.n_samples) == 5.0 and float(kept.log_likelihood) == -5.0


#: torch functions that make a tensor on the default device unless given ``device=``.
FACTORIES = (torch.tensor, torch.zeros, torch.ones, torch.full, torch.empty, torch.arange)
#: the modules whose tensors must follow the data's device (their data tensors' ``device``).
STREAM_MODULES = ("fednovelty/federated/streams/streaming.py", "fednovelty/mixture/streaming.py")


class DevicelessFactories(TorchFunctionMode):
    """Records ``(file, line)`` of each call of :data:`FACTORIES` without ``device=`` made
    directly from one of :data:`STREAM_MODULES`."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            caller = traceback.extract_stack(limit=2)[0]
            if caller.filename.replace("\\", "/").endswith(STREAM_MODULES):
                self.calls.append((caller.filename, caller.lineno))
        return func(*args, **kwargs)


def test_the_streaming_code_makes_no_tensor_off_the_data_device():
    """Over three windows (far rows suppressed in the second, a birth in the third), the
    streaming modules make every tensor with an explicit device or from a data tensor: a
    tensor made on the default device is on the CPU when the data is on CUDA."""
    mode = DevicelessFactories()
    with mode:
        stream_windows("cpu")
    assert mode.calls == []


def test_the_factory_recorder_sees_a_deviceless_call():
    """The recorder of the test above reports such a call (made here from a stand-in file)."""
    mode = DevicelessFactories()
    code = compile("torch.zeros(2, dtype=torch.bool)", STREAM_MODULES[0], "exec")
    with mode:
        exec(code, {"torch": torch})
        torch.zeros(2, device="cpu")
    assert mode.calls == [(STREAM_MODULES[0], 1)]
