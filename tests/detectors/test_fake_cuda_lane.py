"""The CUDA lane's device discipline on the CPU: the lane's harness with ``("cpu", "cuda")``
inside the stand-in of ``_fake_cuda.py``, for every lane method and the stream, and the
stand-in's own rules, each shown to refuse what CUDA refuses (and to let through what it
takes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _fake_cuda import DeviceError, FakeCuda, fake_cuda
from _lane import compare_method, compare_streams, lane_names


@pytest.mark.parametrize("name", lane_names())
def test_every_lane_method_scores_alike_on_the_stand_in(name):
    with fake_cuda():
        assert compare_method(name, ("cpu", "cuda")) == []


def test_the_streaming_detector_runs_window_after_window_on_the_stand_in():
    with fake_cuda():
        assert compare_streams(("cpu", "cuda")) == []


# ----------------------------------------------------------------------------- its rules
def test_a_tensor_asked_for_on_cuda_reads_cuda_and_cpu_gives_it_back():
    with fake_cuda():
        assert torch.cuda.is_available()
        x = torch.zeros(3, device="cuda")
        y = torch.ones(3).to("cuda") + x
        assert x.device.type == y.device.type == "cuda" and isinstance(y, FakeCuda)
        assert torch.zeros(2, device=y.device).is_cuda
        back = y.cpu()
        assert back.device.type == "cpu" and back.numpy().tolist() == [1.0, 1.0, 1.0]


def test_mixing_devices_is_refused_as_cuda_refuses_it():
    with fake_cuda():
        x = torch.ones(3, device="cuda")
        with pytest.raises(DeviceError, match="same device"):
            x + torch.ones(3)
        assert float((x * torch.tensor(2.0)).sum()) == 6.0  # a 0-d CPU tensor is a scalar
        assert x[torch.tensor([0, 2])].shape == (2,)  # CPU indices are moved
        x.copy_(torch.full((3,), 2.0))  # copy_ crosses devices
        assert isinstance(x, FakeCuda) and float(x.sum()) == 6.0
        cpu = torch.zeros(3)
        assert cpu.copy_(x) is cpu and not cpu.is_cuda


def test_numpy_of_a_cuda_tensor_is_refused():
    with fake_cuda():
        x = torch.ones(3, device="cuda")
        with pytest.raises(DeviceError, match="numpy"):
            np.asarray(x)


def test_a_cpu_generator_for_a_cuda_draw_is_refused():
    generator = torch.Generator().manual_seed(0)
    with fake_cuda():
        weights = torch.ones(4, device="cuda")
        with pytest.raises(DeviceError, match="generator"):
            torch.multinomial(weights, 2, generator=generator)
        with pytest.raises(DeviceError, match="generator"):
            torch.randn(3, device="cuda", generator=generator)
        drawn = torch.multinomial(weights.cpu(), 2, generator=generator).to(weights.device)
        assert drawn.is_cuda


def test_the_stand_in_ends_with_its_block():
    with fake_cuda():
        pass
    x = torch.ones(2)
    assert x.device.type == "cpu" and not isinstance(x + 1, FakeCuda)


def test_modules_and_to_move_as_on_cuda():
    """``Module.to`` moves the parameters (its ``_parse_to`` keeps the device it reads);
    ``.to(other)`` takes ``other``'s device; crossing devices copies."""
    with fake_cuda():
        for move in ({"device": "cuda", "dtype": torch.float64}, {"device": "cuda"}):
            layer = torch.nn.Linear(3, 2).to(**move)
            assert all(p.is_cuda for p in layer.parameters())
            assert layer(torch.ones(4, 3, device="cuda", dtype=layer.weight.dtype)).is_cuda
        with pytest.raises(DeviceError, match="same device"):
            torch.nn.Linear(3, 2)(torch.ones(4, 3, device="cuda"))
        x = torch.ones(2, device="cuda")
        assert torch.zeros(2).to(x).is_cuda and x.to("cuda") is x
        back = x.cpu()
        back += 1
        assert float(x.sum()) == 2.0  # a copy, as from a GPU


def test_torch_func_transforms_give_cuda_outputs_for_cuda_inputs():
    from torch.func import grad, vmap

    with fake_cuda():
        params = torch.ones(3, 2, device="cuda")
        gradients = torch.func.vmap(torch.func.grad(lambda p: (p * p).sum()))(params)
        assert isinstance(gradients, FakeCuda) and float(gradients.sum()) == 12.0
        with pytest.raises(DeviceError, match="same device"):
            gradients + torch.ones(3, 2)
    assert torch.func.vmap is vmap and torch.func.grad is grad  # undone after the block
