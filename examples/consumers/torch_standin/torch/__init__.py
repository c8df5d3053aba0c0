"""A stand-in for torch, for running Megatron-Energon's tools without installing torch.

megatron-energon imports torch (and torchvision) at import time throughout, but `energon
prepare`, `energon info` and reading samples by key use none of it. With this directory on
PYTHONPATH, `import torch` gives a module whose every attribute, and every submodule
(torch.utils.data, torch.distributed, ...), is a harmless placeholder: a class that can be
subclassed, called, indexed and subscripted in type hints. Anything that really computes with
tensors fails loudly instead of giving wrong results. Used by the tests (tests/loader_index.rs)
and examples/consumers/read_energon.py; with real torch installed, leave it off PYTHONPATH.
"""

import importlib.abc
import importlib.machinery
import sys
import types

IS_STANDIN = True


class Placeholder:
    """Stands for any torch class, function or constant."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("torch is a stand-in here (examples/consumers/torch_standin)")

    def __getattr__(self, name):
        return Placeholder()

    def __class_getitem__(cls, item):
        return cls

    def __or__(self, other):
        return Placeholder

    def __ror__(self, other):
        return Placeholder

    def __mro_entries__(self, bases):
        return (Placeholder,)


# The few functions whose answer energon branches on outside any tensor work: no DataLoader
# worker process, no torch.distributed process group.
KNOWN = {
    "torch.utils.data": {"get_worker_info": lambda: None},
    "torch.distributed": {"is_available": lambda: False, "is_initialized": lambda: False},
}


def _attribute(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return Placeholder


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `import torch.anything` and `import torchvision...` give placeholder modules."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torch.") or fullname.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _attribute
        for name, value in KNOWN.get(spec.name, {}).items():
            setattr(module, name, value)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_Submodules())
__getattr__ = _attribute
