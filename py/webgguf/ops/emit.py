"""One dispatch of a chosen kernel, recorded with its choice when the caller keeps a trace."""

from __future__ import annotations

from ..gpu.base import Dispatch
from ..pipelines import Pipelines, Target
from ..selection import Choice

Trace = list[tuple[Dispatch, Choice]]  # every dispatch a builder made, with the choice behind it


def emit(
    k: Pipelines,
    choice: Choice,
    label: str,
    groups: int,
    buffers: dict[str, Target],
    trace: Trace | None,
    **params: float,
) -> Dispatch:
    """A dispatch of `groups` workgroups of the chosen kernel, binding `buffers` by name."""
    step = k.dispatch(k.get(choice.kernel, **choice.defines), label, groups, buffers, **params)
    if trace is not None:
        trace.append((step, choice))
    return step
