"""What two logs can answer: the steps a step_rel criterion is judged at, a relative statistic against a reference
that is 0, the gaps inside the compared range.

A criterion the logs cannot answer is "not evaluated" (with the reason), not failed: a log interval of 100 prints
no step 1, and a relative error against a reference of 0 is not defined. The verdict still fails when no
criterion at all could be evaluated (`comparison._reasons`).
"""

from __future__ import annotations

import math

from alignflow.compare.statistics import Pairs
from alignflow.config.criteria import Criterion
from alignflow.config.statistics import is_relative
from alignflow.logs.schema import ParsedLog, Resolution


def step_rel_steps(
    c: Criterion, p: Pairs, test: ParsedLog, reference: ParsedLog
) -> tuple[list[int], list[str], bool]:
    """The steps a step_rel criterion is evaluated at, notes on what was used, and whether it cannot be evaluated.

    `steps` unset: the first step both logs print (step 1 when both print it). Listed steps that neither log
    printed (a log interval of 100 prints no step 1) are not evaluated, which is no failure; a listed step that
    one log printed and the other did not is compared (and fails as missing).
    """
    def printed(step: int) -> str:
        sides = [side for side, parsed in (("test", test), ("reference", reference)) if step in parsed.frame.index]
        return "neither log" if not sides else f"only the {sides[0]} log" if len(sides) == 1 else "both logs"

    if c.steps is None:
        if not len(p.steps):
            return [], ["no step has the metric on both sides"], True
        first = int(p.steps[0])
        note = [] if first == 1 else [f"evaluated at step {first}, the first step both logs print with "
                                      f"{c.metric} (step 1: {printed(1)})"]
        return [first], note, False
    unprinted = [s for s in c.steps if s not in test.frame.index and s not in reference.frame.index]
    excluded = [s for s in c.steps if s in test.excluded_steps or s in reference.excluded_steps]
    notes = [f"step {s} not printed by either log: not evaluated there" for s in unprinted]
    notes += [f"step {s} excluded ({test.excluded_steps.get(s) or reference.excluded_steps.get(s)}): not evaluated "
              "there" for s in excluded]
    steps = [s for s in c.steps if s not in unprinted and s not in excluded]
    if not steps:
        hint = f"; the first step both logs print is {int(p.steps[0])}" if len(p.steps) else ""
        return [], [f"not evaluated (step {', '.join(map(str, c.steps))} not printed or excluded{hint})"], True
    return steps, notes, False


def zero_reference(c: Criterion, t: Resolution | None, r: Resolution | None, magnitude: float) -> str:
    """Why a relative statistic cannot be judged: the reference is 0 at its printed resolution."""
    if not is_relative(c.statistic) or not math.isfinite(magnitude):
        return ""
    quanta = [res.quantum(magnitude) for res in (t, r) if res is not None]
    if magnitude > 0 and magnitude >= max(quanta, default=0.0):
        return ""
    return (f"not evaluated: the reference {c.metric} is 0 at its printed resolution, where a relative error is "
            "not defined (judge it with an absolute statistic)")


def gaps_within(logs: dict[str, ParsedLog], first: int | None, last: int | None
                 ) -> dict[str, tuple[tuple[int, int], ...]]:
    """Each side's runs of missing steps that fall inside the compared range first..last."""
    if first is None or last is None:
        return {}
    out = {side: tuple((max(a, first), min(b, last)) for a, b in parsed.gaps if b >= first and a <= last)
           for side, parsed in logs.items()}
    return {side: gaps for side, gaps in out.items() if gaps}
