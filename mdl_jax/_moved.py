"""Deprecated aliases of the modules that moved to the reproduction (``mdl_repro``, the ``mdl-jax-repro``
distribution in ``repro/``), kept for one release so that a user's ``import mdl_jax.pipeline.systems`` keeps
working (with a DeprecationWarning) where the reproduction is installed.

This is the only place the library names the reproduction, and it imports it only when a user imports
one of the old names: nothing in the library does (``tests/test_layers.py``). The alias maps the old
name and every submodule under it onto the moved module objects themselves, not copies, so classes and
module state are shared (``mdl_jax.pipeline.data.DataError is mdl_repro.pipeline.data.DataError``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

# old name -> new name
MOVED = {
    "mdl_jax.pipeline": "mdl_repro.pipeline",
    "mdl_jax.analysis": "mdl_repro.analysis",
    "mdl_jax.serving.model_server": "mdl_repro.model_server",
    "mdl_jax.serve": "mdl_repro.serve",
}
INSTALL = "pip install -e ./repro from the repository's root (the mdl-jax-repro distribution)"


def _target(name: str) -> str | None:
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


def import_moved(new: str, old: str):
    try:
        return importlib.import_module(new)
    except ModuleNotFoundError as e:
        if e.name is not None and (e.name == "mdl_repro" or new.startswith(e.name + ".") or e.name == new):
            raise ModuleNotFoundError(f"{old} moved to {new}, in the paper's reproduction, which is not "
                                      f"installed: {INSTALL}", name=old) from None
        raise


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new
        self.spec = None

    def create_module(self, spec):
        module = import_moved(self.new, spec.name)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # The moved module ran already, under its new name. The import system has just set its
        # __spec__ to the alias's; give it back its own, so reload, pickling and tools see the module
        # as what it is.
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves a submodule of an old name (``mdl_jax.pipeline.systems``) to the moved module object."""

    def find_spec(self, fullname, path, target=None):
        new = _target(fullname)
        if new is None or fullname in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def alias(old: str) -> None:
    """Make the module being imported as ``old`` the moved module, and its submodules theirs.

    Called by the old module's one-line stub when, and only when, a user imports the old name.

    Raises:
      ModuleNotFoundError: the reproduction is not installed (the message says how to install it).
    """
    new = MOVED[old]
    warnings.warn(f"{old} moved to {new} (the mdl-jax-repro distribution); the old name goes in the "
                  "next release", DeprecationWarning, stacklevel=3)
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        # first, so that a submodule is found as the moved module, never loaded a second time from the
        # moved package's folder under the old name
        sys.meta_path.insert(0, _AliasFinder())
    sys.modules[old] = import_moved(new, old)


def run_as_main(old: str) -> int:
    """``python -m OLD`` for a moved module: a one-line warning, then the moved module's ``main()``; without
    the reproduction installed, one error line naming the install and exit status 2."""
    new = MOVED[old]
    print(f"mdl-jax: warning: python -m {old} is deprecated; use python -m {new}", file=sys.stderr)
    try:
        module = import_moved(new, old)
    except ModuleNotFoundError as e:
        if e.name != old:
            raise
        print(f"mdl-jax: error: {e}", file=sys.stderr)
        return 2
    return module.main()
