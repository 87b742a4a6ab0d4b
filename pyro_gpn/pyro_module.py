"""The package's :class:`~pyro.nn.PyroModule`: a network computes with its own parameters.

A ``PyroModule`` keeps its parameters in Pyro's *global* param store under their attribute
names (``layers.0.weight``, ...), and on every access inside a model, guide or forward it reads
them back from there: when the store already holds a tensor under that name, the module takes
the store's tensor instead of its own (``PyroModule.__getattr__``, "Update PyroModule <---
ParamStore"). Two networks with the same layer names in one process therefore share whatever
was registered last. Fitting a second network silently changed the predictions of the first one
(a variational GPN on boston split 0: test log-likelihood -2.433 before, -2.846 after another
network of the same sizes was fitted), and a network fitted with
``fit_vgpn(..., clear_param_store=False)`` after another one trained tensors its forward no
longer used.

:class:`GPNModule`, the base of every ``PyroModule`` of the package, makes a network compute
with its own parameters, always: whenever it is entered from outside (a ``pyro_method`` such as
``model``, ``guide`` or ``hidden``, or ``forward``), it first drops from the global store every
entry that carries one of its parameter names but holds another tensor; the access then
registers its own. Pyro's inference is unchanged: :class:`~pyro.infer.SVI` still finds every
parameter in the store, and ``pyro.settings``' ``module_local_params`` mode (which keeps no
global entries) is left alone. The one Pyro idiom this rules out is loading parameters *into*
a network through the param store (``pyro.get_param_store().load(...)`` followed by a call):
load a network's state with ``load_state_dict`` (or :mod:`pyro_gpn.inference.checkpoint`).

The hook is Pyro's per-network call context (``PyroModule._pyro_context``, shared by all its
submodules), specialised here; ``tests/test_pyro_module.py`` fails if Pyro changes it.
"""

from __future__ import annotations

import pyro
from pyro.nn import PyroModule
from pyro.nn.module import _Context
from torch import nn

__all__ = ["GPNModule", "release_foreign_params", "store_names"]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def store_names(module: PyroModule) -> dict[str, nn.Parameter]:
    """The names under which ``module``'s parameters enter Pyro's global param store, each
    with the tensor ``module`` holds: a ``PyroParam``'s unconstrained tensor under its
    constrained name, any other parameter of a ``PyroModule`` under its own name, both prefixed
    by the module's path (the root's Pyro name, then the attribute path). Parameters of plain
    ``nn.Module`` children (heads) are reached by Pyro only through ``pyro.module`` under
    ``name$$$...`` names, which never replace a module's tensors, and are not listed."""
    root = getattr(module, "_pyro_name", "")
    names: dict[str, nn.Parameter] = {}
    for path, sub in module.named_modules():
        if not isinstance(sub, PyroModule):
            continue
        pyro_params = sub.__dict__.get("_pyro_params", {})
        for name, tensor in sub._parameters.items():
            if tensor is None:
                continue
            constrained = name.removesuffix("_unconstrained")
            if constrained != name and constrained not in pyro_params:
                constrained = name  # a plain parameter that happens to end in the suffix
            names[_join(_join(root, path), constrained)] = tensor
    return names


def release_foreign_params(module: PyroModule) -> list[str]:
    """Drop from Pyro's global param store every entry that carries one of ``module``'s
    parameter names (:func:`store_names`) but holds another tensor (another network's), so that
    ``module``'s next access registers and uses its own. Nothing happens in
    ``module_local_params`` mode or with an empty store.

    Returns:
        the names dropped.
    """
    store = pyro.get_param_store()
    if pyro.settings.get("module_local_params") or not len(store):
        return []
    held = dict(store.named_parameters())
    dropped = [
        name
        for name, tensor in store_names(module).items()
        if name in held and held[name] is not tensor
    ]
    for name in dropped:
        del store[name]
    return dropped


class _OwnParamsContext(_Context):
    """Pyro's call context of a network (shared by its submodules) that releases the network's
    names from the global store when the network is entered from outside."""

    def __init__(self, owner: PyroModule) -> None:
        super().__init__()
        self.owner = owner
        # Pyro gives a context its local store only when built in local mode; a network built
        # in global mode can then not be called under module_local_params=True (AttributeError)
        if not hasattr(self, "param_state"):
            self.param_state = {"params": {}, "constraints": {}}

    def __enter__(self) -> None:
        if not self.active:
            release_foreign_params(self.owner)
        super().__enter__()


class GPNModule(PyroModule):
    """A :class:`~pyro.nn.PyroModule` that computes with its own parameters whatever Pyro's
    global param store holds (see the module's docstring): the base of the package's layers,
    responses and networks. As a submodule of another ``PyroModule`` it shares that module's
    call context, as every ``PyroModule`` does; the package's networks release the names of
    their whole tree.

    Args:
        name: the root's Pyro name (the prefix of its parameters' store names; ignored for a
            submodule).
    """

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._pyro_context = _OwnParamsContext(self)
