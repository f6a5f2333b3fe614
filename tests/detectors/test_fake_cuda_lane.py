"""The CUDA lane's device discipline on the CPU: the lane's harness with ``("cpu", "cuda")``
inside the stand-in of ``_fake_cuda.py``, for the registry's methods whose fit the stand-in
models (not those training stacked learners through ``torch.func``: the lane on a GPU covers
them), and the stand-in's own rules, each shown to refuse what CUDA refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _fake_cuda import DeviceError, FakeCuda, fake_cuda
from _lane import compare_method, compare_streams, lane_names

#: every lane method whose fit the stand-in models: the mixtures, VB, the kNN markers and the
#: VGM2 variants that train no stacked learners.
MODELLED = [
    n for n in lane_names()
    if not n.startswith("PFL-") or n in ("PFL-VGM2", "PFL-VGM2-Local", "PFL-VGM2-Prototype")
]  # fmt: skip


def test_the_modelled_methods_are_most_of_the_lane():
    assert {"FedGMM", "DEM-kmeans", "CentralGMM", "streaming", "FedVB", "PFL-VGM2"} <= set(MODELLED)
    assert len(MODELLED) >= 20


@pytest.mark.parametrize("name", MODELLED)
def test_every_modelled_method_scores_alike_on_the_stand_in(name, monkeypatch):
    with fake_cuda(monkeypatch):
        assert compare_method(name, ("cpu", "cuda")) == []


def test_the_streaming_detector_runs_window_after_window_on_the_stand_in(monkeypatch):
    with fake_cuda(monkeypatch):
        assert compare_streams(("cpu", "cuda")) == []


# ----------------------------------------------------------------------------- its rules
def test_a_tensor_asked_for_on_cuda_reads_cuda_and_cpu_gives_it_back(monkeypatch):
    with fake_cuda(monkeypatch):
        assert torch.cuda.is_available()
        x = torch.zeros(3, device="cuda")
        y = torch.ones(3).to("cuda") + x
        assert x.device.type == y.device.type == "cuda" and isinstance(y, FakeCuda)
        assert torch.zeros(2, device=y.device).is_cuda
        back = y.cpu()
        assert back.device.type == "cpu" and back.numpy().tolist() == [1.0, 1.0, 1.0]


def test_mixing_devices_is_refused_as_cuda_refuses_it(monkeypatch):
    with fake_cuda(monkeypatch):
        x = torch.ones(3, device="cuda")
        with pytest.raises(DeviceError, match="same device"):
            x + torch.ones(3)
        assert float((x * torch.tensor(2.0)).sum()) == 6.0  # a 0-d CPU tensor is a scalar
        assert x[torch.tensor([0, 2])].shape == (2,)  # CPU indices are moved


def test_numpy_of_a_cuda_tensor_is_refused(monkeypatch):
    with fake_cuda(monkeypatch):
        x = torch.ones(3, device="cuda")
        with pytest.raises(DeviceError, match="numpy"):
            np.asarray(x)


def test_a_cpu_generator_for_a_cuda_draw_is_refused(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    with fake_cuda(monkeypatch):
        weights = torch.ones(4, device="cuda")
        with pytest.raises(DeviceError, match="generator"):
            torch.multinomial(weights, 2, generator=generator)
        with pytest.raises(DeviceError, match="generator"):
            torch.randn(3, device="cuda", generator=generator)
        drawn = torch.multinomial(weights.cpu(), 2, generator=generator).to(weights.device)
        assert drawn.is_cuda


def test_the_stand_in_ends_with_its_block(monkeypatch):
    with fake_cuda(monkeypatch):
        pass
    x = torch.ones(2)
    assert x.device.type == "cpu" and not isinstance(x + 1, FakeCuda)
