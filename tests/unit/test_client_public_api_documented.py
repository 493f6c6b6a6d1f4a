"""Issue 11's quality bar: every public name of ``oncelog.client`` and ``oncelog.client.aio`` has a
docstring and type hints.

"Public" is what the package exports (``__all__``) and, for a class, each method and property whose
name does not start with ``_`` and that the class defines itself.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

PACKAGES = ("oncelog.client", "oncelog.client.aio")


def _public_members(cls: type) -> list[tuple[str, object]]:
    out = []
    for name, attr in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(attr, (staticmethod, classmethod)):
            out.append((name, attr.__func__))
        elif isinstance(attr, property):
            out.append((name, attr.fget))
        elif inspect.isfunction(attr):
            out.append((name, attr))
    return out


def _public_names() -> list[tuple[str, object]]:
    names = []
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        for name in mod.__all__:
            obj = getattr(mod, name)
            names.append((f"{pkg}.{name}", obj))
            if inspect.isclass(obj):
                names.extend((f"{pkg}.{name}.{m}", f) for m, f in _public_members(obj))
    return names


def _undocumented(names: list[tuple[str, object]]) -> list[str]:
    return [n for n, obj in names if not (inspect.getdoc(obj) or "").strip()]


def _unannotated(names: list[tuple[str, object]]) -> list[str]:
    bad = []
    for n, obj in names:
        if not inspect.isfunction(obj):
            continue
        sig = inspect.signature(obj)
        skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        params = [p for p in sig.parameters.values()
                  if p.name not in ("self", "cls") and p.kind not in skip and p.annotation is inspect.Parameter.empty]
        if params or sig.return_annotation is inspect.Signature.empty:
            bad.append(n)
    return bad


def test_the_public_surface_is_not_empty() -> None:
    names = dict(_public_names())
    # the names other issues, the docs and users build on
    for expected in ("oncelog.client.Producer.produce", "oncelog.client.aio.Consumer.consume",
                     "oncelog.client.Admin", "oncelog.client.PreparedTxnState.from_string",
                     "oncelog.client.Consumer.seek", "oncelog.client.DeliveryFuture.result"):
        assert expected in names
    assert len(names) > 150


def test_every_public_name_has_a_docstring() -> None:
    assert _undocumented(_public_names()) == []


def test_every_public_function_has_type_hints() -> None:
    assert _unannotated(_public_names()) == []


def test_the_checks_can_fail() -> None:
    class Bare:
        def method(self, x):  # type: ignore[no-untyped-def]
            return x

    names = [("Bare", Bare), *((f"Bare.{m}", f) for m, f in _public_members(Bare))]
    assert _undocumented(names) == ["Bare", "Bare.method"]
    assert _unannotated(names) == ["Bare.method"]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
