"""The search's cost as it runs: llama-bench calls counted in the study (config.toml's ``[cost]``, written by
:func:`tuner.study.record.SearchOutcome.cost`), and the cost of a past search of the same arch for the plan."""

from __future__ import annotations

__all__ = ["counted"]

from typing import Any

from tuner.study.state import StudyState


def counted(st: StudyState, factory: Any) -> Any:
    """``factory`` whose measures count each llama-bench call they make in the study (config.toml's
    ``[cost] llama_bench_calls``): one per ``measure`` or ``joint`` call, as the live measure runs one."""
    def make(build: Any) -> Any:
        m = factory(build)

        def measure(*a: Any, **kw: Any) -> Any:
            st.add_llama_bench_calls(1)
            return m(*a, **kw)

        measure.__dict__.update(getattr(m, "__dict__", {}))  # info, calls...: what callers read off a measure
        if getattr(m, "joint", None) is not None:
            def joint(*a: Any, **kw: Any) -> Any:
                st.add_llama_bench_calls(1)
                return m.joint(*a, **kw)

            measure.joint = joint  # type: ignore[attr-defined]
        return measure
    return make
