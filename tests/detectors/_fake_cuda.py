"""A CPU stand-in for a CUDA device, so that the CUDA lane's device discipline runs where no
GPU is.

Inside :func:`fake_cuda`, a tensor asked for on ``"cuda"`` (``device=`` of any torch function,
``.to``, ``.cuda``) is made on the CPU as a :class:`FakeCuda`, whose ``device`` reads
``cuda:0``; operations on it give ``FakeCuda`` tensors, ``.cpu()`` and ``.to("cpu")`` give
plain ones, and ``torch.cuda.is_available()`` is ``True``. So code that branches on the device
takes its CUDA branch, and what CUDA refuses is refused here (:class:`DeviceError`), by the
rules modelled:

- an operation mixing a cuda tensor with a CPU tensor of one or more dimensions (CPU 0-d
  tensors are scalars; indexing and ``.data`` assignment take CPU tensors as CUDA does);
- ``.numpy()`` / ``np.asarray`` of a cuda tensor;
- a CPU ``torch.Generator`` for a draw from cuda tensors or onto the cuda device.

Not modelled: what ``torch.func`` transforms (``vmap``, ``grad``) compute runs beneath torch's
function modes, so their outputs (the stacked learners' gradients) are not seen as cuda
tensors; the methods that train learners that way are left to the lane on a GPU. Numbers are
the CPU's: the stand-in checks devices, not CUDA's arithmetic.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
_DEVICE = torch._C.TensorBase.device
_IS_CUDA = torch._C.TensorBase.is_cuda
#: operations that take CPU tensors beside cuda ones on a real GPU (indices are moved).
_MIXED_ALLOWED = {
    torch.Tensor.__getitem__,
    torch.Tensor.__setitem__,
    torch._has_compatible_shallow_copy_type,
}
_TO_NUMPY = {torch.Tensor.numpy, torch.Tensor.__array__}


class DeviceError(RuntimeError):
    """What CUDA would refuse, refused by the stand-in."""


class FakeCuda(torch.Tensor):
    """A CPU tensor standing for one on ``cuda:0`` (its behaviour is the mode's)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __deepcopy__(self, memo):
        copied = copy.deepcopy(self.as_subclass(torch.Tensor), memo)
        return copied.as_subclass(FakeCuda)


def _name(func) -> str:
    return getattr(func, "__name__", repr(func))


def _as_cuda(value):
    return tree_map(lambda t: t.as_subclass(FakeCuda) if type(t) is torch.Tensor else t, value)


def _device_of(value) -> torch.device | None:
    """The device an argument of ``.to`` names (a tensor: its device), else ``None``."""
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, str | torch.device):
        return torch.device(value)
    return None


class FakeCudaMode(TorchFunctionMode):
    """The torch function mode of :func:`fake_cuda` (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = WeakIdKeyDictionary()  # parameters whose .data was set to a cuda tensor

    def on_cuda(self, t) -> bool:
        return isinstance(t, FakeCuda) or (isinstance(t, torch.Tensor) and t in self.moved)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        owner = getattr(func, "__self__", None)
        if owner is _DEVICE:
            return CUDA if self.on_cuda(args[0]) else CPU
        if owner is _IS_CUDA:
            return self.on_cuda(args[0])
        if _name(func) == "__deepcopy__":  # its memo holds other tensors: no mixing
            return func(*args, **kwargs)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        cuda_in = any(self.on_cuda(t) for t in tensors)
        if _name(func) == "__set__" and len(args) == 2 and isinstance(args[1], torch.Tensor):
            if self.on_cuda(args[1]):  # param.data = a cuda tensor (Module.to)
                self.moved[args[0]] = True
            else:
                self.moved.pop(args[0], None)
            return func(*args, **kwargs)
        if func in _TO_NUMPY and cuda_in:
            raise DeviceError("can't convert cuda:0 device type tensor to numpy; .cpu() first")
        if func is torch.Tensor.cpu:
            return func(*args, **kwargs).as_subclass(torch.Tensor)
        if func is torch.Tensor.cuda:
            return args[0].as_subclass(torch.Tensor).clone().as_subclass(FakeCuda)
        if func is torch.Tensor.to:
            return self._to(func, args, kwargs, cuda_in)
        generator = kwargs.get("generator")
        if generator is not None and generator.device.type != "cuda":
            device = kwargs.get("device")
            if cuda_in or (device is not None and torch.device(device).type == "cuda"):
                raise DeviceError(f"{_name(func)}: a CPU generator for a draw on cuda")
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = CPU
            return _as_cuda(func(*args, **kwargs))
        if _name(func).endswith("_like") and cuda_in and device is None:
            return _as_cuda(func(*args, **kwargs))
        if cuda_in and func not in _MIXED_ALLOWED:
            mixed = [t for t in tensors if not self.on_cuda(t) and t.dim() > 0]
            if mixed:
                raise DeviceError(
                    f"{_name(func)}: a CPU tensor of shape {tuple(mixed[0].shape)} among "
                    "cuda tensors (Expected all tensors to be on the same device)"
                )
        out = func(*args, **kwargs)
        return _as_cuda(out) if cuda_in else out

    def _to(self, func, args, kwargs, cuda_in):
        """``Tensor.to``: onto cuda gives a :class:`FakeCuda`, onto the CPU a plain tensor,
        a dtype alone keeps the device."""
        named = [d for d in (*args[1:], kwargs.get("device")) if _device_of(d) is not None]
        like = [a for a in args[1:] if isinstance(a, torch.Tensor)]
        target = _device_of(named[0]) if named else None
        if like:
            target = CUDA if self.on_cuda(like[0]) else CPU
            kwargs.setdefault("dtype", like[0].dtype)
        if target is None:
            out = func(args[0], *[a for a in args[1:]], **kwargs)
            return _as_cuda(out) if cuda_in else out
        kwargs.pop("device", None)
        rest = [a for a in args[1:] if _device_of(a) is None and not isinstance(a, torch.Tensor)]
        source = args[0].as_subclass(torch.Tensor) if isinstance(args[0], FakeCuda) else args[0]
        out = torch.Tensor.to(source, *rest, **kwargs)
        if target.type == "cuda":
            if out is source:
                out = out.view_as(out)  # a new tensor object: the argument stays as it was
            return out.as_subclass(FakeCuda)
        return out.as_subclass(torch.Tensor) if out is not args[0] else out.detach()


@contextmanager
def fake_cuda(monkeypatch) -> Iterator[FakeCudaMode]:
    """The stand-in for the body of the ``with`` (``monkeypatch``: pytest's, which undoes
    ``torch.cuda.is_available`` and ``synchronize`` afterwards)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    with FakeCudaMode() as mode:
        yield mode
