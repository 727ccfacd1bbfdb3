"""Progress of a running step, read from the job's own step lines as they arrive.

While a training runs, the runner reads the tail of its log every few seconds and parses it with the same
parsers that judge the finished log (`alignflow.logs`), so what people watch is what is compared:
`gpu_train  step 12/30  lm_loss 4.99  3.7 s/step  ETA 1m05s`. The rate is measured by the controller between two
observations (the log's own step times are the framework's, and exclude data loading and checkpointing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alignflow.logs.formats import LogFormatSpec
    from alignflow.logs.parse import FormatChoice

SHOWN_METRICS = ("lm_loss", "grad_norm")


@dataclass(frozen=True, slots=True)
class StepProgress:
    """Where one step stands. `iteration`/`total` are training steps (None before the first step line)."""

    step: str
    host: str
    state: str  # "running", "waiting for a job slot", "exited(0)", ...
    elapsed_s: float
    iteration: int | None = None
    total: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    s_per_step: float | None = None
    eta_s: float | None = None
    note: str = ""  # why it waits (a scheduler's reason, the host's job slots)
    last_output: str = ""  # the job's last output line while no step line is there yet (the log shows it)

    def line(self) -> str:
        """One line for a log or a terminal that is not a tty."""
        parts = [self.step]
        if self.iteration is not None:
            parts.append(f"step {self.iteration}/{self.total}" if self.total else f"step {self.iteration}")
        parts += [f"{k} {v:.4g}" for k, v in self.metrics.items()]
        if self.s_per_step is not None:
            parts.append(f"{self.s_per_step:.2g} s/step")
        if self.eta_s is not None:
            parts.append(f"ETA {format_duration(self.eta_s)}")
        if self.iteration is None:
            parts.append(f"{self.state} for {format_duration(self.elapsed_s)}")
        parts += [text for text in (self.note, self.last_output) if text]
        return "  ".join(parts)


ProgressFn = Callable[[StepProgress], None]


def format_duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressTracker:
    """Turns successive log tails of one job into `StepProgress` values."""

    def __init__(self, step: str, host: str, *, total: int | None, log_format: FormatChoice | LogFormatSpec | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.step, self.host, self.total, self.log_format = step, host, total, log_format
        self._clock = clock
        self._started = clock()
        self._first: tuple[int, float] | None = None  # (iteration, time) when a step line was first seen
        self._last: StepProgress | None = None

    def update(self, state: str, tail: str, *, note: str = "") -> StepProgress:
        now = self._clock()
        iteration, metrics = self._read(tail)
        rate = eta = None
        if iteration is not None:
            if self._first is None:
                self._first = (iteration, now)
            done, since = iteration - self._first[0], now - self._first[1]
            if done > 0:
                rate = since / done
                if self.total:
                    eta = max(0, self.total - iteration) * rate
        elif self._last is not None and self._last.iteration is not None:  # the tail held no step line this time
            iteration, metrics = self._last.iteration, dict(self._last.metrics)
            rate, eta = self._last.s_per_step, self._last.eta_s
        self._last = StepProgress(self.step, self.host, state, now - self._started, iteration, self.total, metrics,
                                  rate, eta, note)
        return self._last

    def _read(self, tail: str) -> tuple[int | None, dict[str, float]]:
        lines = tail.splitlines()[1:]  # the first line of a tail may be cut
        if not lines or self.log_format is None:
            return None, {}
        from alignflow.logs.parse import parse_log  # pandas: once a training prints, not in a cached run

        try:
            frame = parse_log(lines, fmt=self.log_format).frame
        except Exception:  # progress is best effort: the finished log is parsed and judged strictly
            return None, {}
        if frame.empty:
            return None, {}
        last = frame.iloc[-1]
        shown = {k: float(last[k]) for k in SHOWN_METRICS if k in frame.columns and last[k] == last[k]}
        return int(frame.index[-1]), shown
