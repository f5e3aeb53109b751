"""A griffe extension for the API reference: annotations show public names, not private module aliases.

The package imports some modules under a private alias (``from mdl_jax.controller import decision as
_d``) and annotates with it (``-> _d.Decision``). A reader of the reference knows the type as
``Decision``, not the alias, so an annotation that is a private alias's attribute (``_x.Name``), alone
or inside a subscript, a union or a tuple, is rendered as the bare ``Name``. Loaded by mkdocstrings
through ``mkdocs.yml`` (``extensions:``); the package itself is not changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import griffe


def _public(expr: Any) -> Any:
    """``expr`` with every ``_alias.Name`` replaced by ``Name``; other parts kept as they are."""
    if isinstance(expr, griffe.ExprAttribute):
        first, *rest = expr.values
        if (len(rest) == 1 and isinstance(first, griffe.ExprName) and first.name.startswith("_")
                and isinstance(rest[0], griffe.ExprName)):
            return griffe.ExprName(rest[0].name, parent=first.parent)
        return expr
    if isinstance(expr, griffe.Expr):
        for field in dataclasses.fields(expr):
            value = getattr(expr, field.name)
            if isinstance(value, griffe.Expr):
                setattr(expr, field.name, _public(value))
            elif isinstance(value, list):
                setattr(expr, field.name, [_public(v) for v in value])
    return expr


class PublicNames(griffe.Extension):
    """Rewrites the return and parameter annotations of every function griffe loads."""

    def on_function(self, *, func: griffe.Function, **kwargs: Any) -> None:
        func.returns = _public(func.returns)
        for param in func.parameters:
            param.annotation = _public(param.annotation)
