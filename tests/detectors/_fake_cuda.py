"""A CPU stand-in for a CUDA device, so that the CUDA lane's device discipline runs where no
GPU is.

Inside :func:`fake_cuda`, a tensor asked for on ``"cuda"`` (``device=`` of any torch function,
``.to``, ``.cuda``) is made on the CPU as a :class:`FakeCuda`, whose ``device`` reads
``cuda:0``; operations on it give ``FakeCuda`` tensors, ``.cpu()`` and ``.to("cpu")`` give
plain ones, and ``torch.cuda.is_available()`` is ``True``. So code that branches on the device
takes its CUDA branch, and what CUDA refuses is refused here (:class:`DeviceError`), by the
rules modelled:

- an operation mixing a cuda tensor with a CPU tensor of one or more dimensions (taken as
  CUDA takes them: a CPU 0-d tensor, a scalar, anywhere; CPU tensors in indexing, as the
  index or the value assigned; ``copy_`` between the devices; ``.data`` assignment);
- ``.numpy()`` / ``np.asarray`` of a cuda tensor;
- a CPU ``torch.Generator`` for a draw from cuda tensors or onto the cuda device.

A ``torch.func`` transform (``vmap``, ``grad``, ...) computes beneath torch's function modes
on wrapped tensors the stand-in cannot tell apart, so inside one nothing is checked (a device
asked for is still the CPU's); the transformed function's outputs are cuda tensors when one of
its tensor arguments is. ``torch.func``'s transforms and the names ``fednovelty``'s loaded
modules import them under are swapped for such wrappers while the stand-in is on.

Not modelled: the rules inside ``torch.func`` transforms; other operations CUDA lets take a
CPU tensor, and the few that refuse a 0-d one (both are rare); the
``cuda:1``, ... of more than one GPU; CUDA's arithmetic (numbers are the CPU's: the stand-in
checks devices, not CUDA's reductions, random streams or tie-breaking).
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.overrides import TorchFunctionMode
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
#: the ``torch.func`` transforms whose functions run unchecked (module docstring).
_TRANSFORMS = ("vmap", "grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian")


class DeviceError(RuntimeError):
    """What CUDA would refuse, refused by the stand-in."""


class FakeCuda(torch.Tensor):
    """A CPU tensor standing for one on ``cuda:0`` (its behaviour is the mode's)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __deepcopy__(self, memo):
        copied = copy.deepcopy(self.as_subclass(torch.Tensor), memo)
        return copied.as_subclass(FakeCuda)


def _name(func) -> str:
    return getattr(func, "__name__", None) or repr(func)


def _tensors(value, found: list | None = None) -> list[torch.Tensor]:
    """The tensors in ``value`` and its lists, tuples and dicts, depth first."""
    found = [] if found is None else found
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, list | tuple):
        for item in value:
            _tensors(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, found)
    return found


def _as_cuda(value):
    """``value`` with its plain tensors (in lists, tuples, dicts too) as :class:`FakeCuda`;
    other values, ``torch.Size`` included, as they are."""
    kind = type(value)
    if kind is torch.Tensor:
        return value.as_subclass(FakeCuda)
    if isinstance(value, tuple) and kind is not torch.Size and _tensors(value):
        items = [_as_cuda(item) for item in value]
        return kind(*items) if hasattr(value, "_fields") else kind(items)
    if kind is list and _tensors(value):
        return [_as_cuda(item) for item in value]
    if kind is dict and _tensors(value):
        return {key: _as_cuda(item) for key, item in value.items()}
    return value


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
        self.depth = 0  # how many torch.func transforms the running code is inside

    def transform(self, make):
        """``make`` (a ``torch.func`` transform) whose transformed functions run unchecked
        and give cuda outputs when a tensor argument is on cuda."""

        @functools.wraps(make)
        def transformed(func, *options, **named):
            inner = make(func, *options, **named)

            @functools.wraps(inner)
            def call(*args, **kwargs):
                cuda_in = any(self.on_cuda(t) for t in _tensors((args, kwargs)))
                self.depth += 1
                try:
                    out = inner(*args, **kwargs)
                finally:
                    self.depth -= 1
                return _as_cuda(out) if cuda_in and self.depth == 0 else out

            return call

        return transformed

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
        if self.depth:  # inside a torch.func transform: the CPU, unchecked
            return self._unchecked(func, args, kwargs)
        tensors = _tensors((args, kwargs))
        cuda_in = any(self.on_cuda(t) for t in tensors)
        if _name(func) == "__set__" and len(args) == 2 and isinstance(args[1], torch.Tensor):
            if self.on_cuda(args[1]):  # param.data = a cuda tensor (Module.to)
                self.moved[args[0]] = True
            else:
                self.moved.pop(args[0], None)
            return func(*args, **kwargs)
        if func in _TO_NUMPY and cuda_in:
            raise DeviceError("can't convert cuda:0 device type tensor to numpy; .cpu() first")
        if func is torch._C._nn._parse_to:  # reads .to's arguments (Module.to): no tensor made
            return func(*args, **kwargs)
        if func is torch.Tensor.copy_:  # across devices, as CUDA copies: the target stays
            func(*args, **kwargs)
            return args[0]
        if func is torch.Tensor.cpu:
            return args[0].as_subclass(torch.Tensor).clone() if cuda_in else func(*args, **kwargs)
        if func is torch.Tensor.cuda:
            return args[0] if cuda_in else args[0].clone().as_subclass(FakeCuda)
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

    @staticmethod
    def _unchecked(func, args, kwargs):
        """``func`` with every cuda device it names replaced by the CPU, unchecked."""
        cpu = [CPU if _device_of(a) is not None else a for a in args[1:]]
        if kwargs.get("device") is not None:
            kwargs["device"] = CPU
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            args = (args[0], *cpu)
        return func(*args, **kwargs)

    def _to(self, func, args, kwargs, cuda_in):
        """``Tensor.to``: onto cuda gives a :class:`FakeCuda`, onto the CPU a plain tensor
        (a copy when it crosses devices, the tensor itself when it stays), a dtype alone keeps
        the device."""
        like = next((a for a in args[1:] if isinstance(a, torch.Tensor)), None)
        named = [d for d in (*args[1:], kwargs.get("device")) if _device_of(d) is not None]
        if like is not None:  # .to(other): other's device and dtype
            target, rest = (CUDA if self.on_cuda(like) else CPU), [CPU, like.dtype, *args[2:]]
        elif named:
            target = _device_of(named[0])
            rest = [CPU if _device_of(a) is not None else a for a in args[1:]]
            if kwargs.get("device") is not None:
                kwargs["device"] = CPU
        else:
            out = func(*args, **kwargs)
            return _as_cuda(out) if cuda_in else out
        source = args[0].as_subclass(torch.Tensor) if isinstance(args[0], FakeCuda) else args[0]
        out = func(source, *rest, **kwargs)
        if out is source:
            if (target.type == "cuda") == self.on_cuda(args[0]):
                return args[0]  # already there: the tensor itself, as torch gives it
            out = out.clone()  # across devices: a copy
        return out.as_subclass(FakeCuda if target.type == "cuda" else torch.Tensor)


@contextmanager
def fake_cuda() -> Iterator[FakeCudaMode]:
    """The stand-in for the body of the ``with``: ``torch.cuda.is_available`` (``True``),
    ``synchronize`` and the ``torch.func`` transforms are patched while it lasts."""
    mode = FakeCudaMode()
    originals = {id(getattr(torch.func, name)) for name in _TRANSFORMS}
    modules = [torch.func] + [m for n, m in list(sys.modules.items()) if n.startswith("fednovelty")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        for module in modules:
            for attr, value in list(vars(module).items()):
                if id(value) in originals and callable(value):
                    patch.setattr(module, attr, mode.transform(value))
        with mode:
            yield mode
