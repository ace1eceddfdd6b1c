"""A measure with something done around each of its calls (counting it, checking its device), that still
looks like the measure to its callers."""

from __future__ import annotations

__all__ = ["Observed"]

from collections.abc import Callable
from typing import Any


class Observed:
    """The measure ``m`` with ``before()`` run ahead of each call and ``after(m)`` once it returned (``joint``
    calls too). What callers read off a measure (info, calls...) is copied from ``m``; ``joint`` is there
    only when ``m`` has one."""

    joint: Callable[..., Any]

    def __init__(
        self, m: Any, before: Callable[[], None] | None = None, after: Callable[[Any], None] | None = None
    ) -> None:
        self.__dict__.update(getattr(m, "__dict__", {}))
        self._m, self._before, self._after = m, before, after
        if getattr(m, "joint", None) is not None:
            self.joint = self._joint

    def __call__(self, *a: Any, **kw: Any) -> Any:
        return self._around(self._m, *a, **kw)

    def _joint(self, *a: Any, **kw: Any) -> Any:
        return self._around(self._m.joint, *a, **kw)

    def _around(self, call: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        if self._before is not None:
            self._before()
        out = call(*a, **kw)
        if self._after is not None:
            self._after(self._m)
        return out
