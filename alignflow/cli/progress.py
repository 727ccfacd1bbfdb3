"""The run's progress on the terminal: one live row per running step on a tty, a line every N seconds otherwise.

```
npu_reload_train  ascend  step 20/30  lm_loss 5.013  grad_norm 1.2  0.18 s/step  ETA 2s  14s
gpu_train         cuda    step 12/30  lm_loss 4.99  3.7 s/step  ETA 1m05s  45s
```
Each row is drawn from the last observation of its step (the runner reads the job's log every few seconds) and its
age: the elapsed time counts up and the ETA down between two observations, twice a second. A row keeps its step's
whole name, then what matters most while the terminal is wide enough: the step it reached of how many, the loss,
seconds per step and ETA (80 columns hold all of these), then the elapsed time, the host and the grad norm. Before
a training prints its first step line the row says what it waits for (`running`, `waiting for a job slot`,
`pending`), with the time, never the job's raw output (which the task's log keeps).

Each step that ends prints one line (`convert_bf16      cached  from run 5622de9be3ae`) above the live rows, and so
does every log record routed here (`log_line`: Prefect's console handler, flows/console.py), so nothing is
written over the rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.text import Text

from alignflow.once import WAITING
from alignflow.runner.progress import StepProgress, format_duration

PLAIN_EVERY_S = 30.0
_STYLE = {"ran": "green", "cached": "cyan", "failed": "bold red", "cancelled": "yellow"}
GAP = "  "


@dataclass(frozen=True, slots=True)
class _Field:
    text: str
    priority: int  # lower is kept first when the terminal is narrow


def row_fields(p: StepProgress, age_s: float) -> list[_Field]:
    """The fields of a step's row, in display order, `age_s` after the observation `p`."""
    fields = [_Field(p.host, 6)]
    if p.iteration is not None:
        fields.append(_Field(f"step {p.iteration}/{p.total}" if p.total else f"step {p.iteration}", 1))
        for i, (name, value) in enumerate(p.metrics.items()):
            fields.append(_Field(f"{name} {value:.4g}", 2 if i == 0 else 8))
        if p.s_per_step is not None:
            fields.append(_Field(f"{p.s_per_step:.2g} s/step", 3))
        if p.eta_s is not None:
            fields.append(_Field(f"ETA {format_duration(max(0.0, p.eta_s - age_s))}", 4))
        fields.append(_Field(format_duration(p.elapsed_s + age_s), 5))
    else:
        fields.append(_Field(p.state, 1))
        fields.append(_Field(format_duration(p.elapsed_s + age_s), 2))
        if p.note:
            fields.append(_Field(p.note, 7))
    return fields


def fit_row(name: str, name_width: int, fields: list[_Field], width: int) -> str:
    """The step's name, then as many fields as fit in `width` columns, most important first, in display order."""
    used = max(len(name), name_width)
    kept: set[int] = set()
    for index in sorted(range(len(fields)), key=lambda i: fields[i].priority):
        cost = len(GAP) + len(fields[index].text)
        if used + cost <= width:
            kept.add(index)
            used += cost
    return GAP.join([name.ljust(name_width), *(f.text for i, f in enumerate(fields) if i in kept)])


class _Rows:
    """The live rows, rendered from the display's observations when rich refreshes them."""

    def __init__(self, display: ConsoleProgress) -> None:
        self.display = display

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        now = self.display.clock()
        with self.display.lock:
            rows = list(self.display.rows.values())
        name_width = max((len(p.step) for p, _ in rows), default=0)
        for p, seen_at in rows:
            yield Text(fit_row(p.step, name_width, row_fields(p, now - seen_at), options.max_width), no_wrap=True,
                       overflow="crop")


class ConsoleProgress:
    """A `RunObserver` (see `tasks.progress`) that draws on a rich console. `verbose` also prints every message
    (staging, launches); by default only the outcome of each step and the live progress are shown."""

    def __init__(self, console: Console | None = None, *, verbose: bool = False, plain_every_s: float = PLAIN_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(stderr=True)
        self.verbose = verbose
        self.plain_every_s = plain_every_s
        self.clock = clock
        self.lock = threading.Lock()
        self.rows: dict[str, tuple[StepProgress, float]] = {}  # step -> (last observation, when it came)
        self._printed: dict[str, float] = {}
        self._live: Live | None = None

    def __enter__(self) -> ConsoleProgress:
        if self.console.is_terminal:
            self._live = Live(_Rows(self), console=self.console, refresh_per_second=2, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _print(self, text: str | Text) -> None:
        # never under `self.lock`: rich's refresh thread renders the rows (taking it) while it holds the console
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def message(self, text: str) -> None:
        if self.verbose or text.startswith(WAITING):  # a wait for another run says why nothing moves (issue 49)
            self._print(text)

    def log_line(self, text: str) -> None:
        """A log record's line, printed above the live rows."""
        self._print(text)

    def run_link(self, name: str, link: str | None) -> None:
        self._print(f"{name}: {link}" if link else name)

    def step_ended(self, step: str, status: str, detail: str) -> None:
        with self.lock:
            self.rows.pop(step, None)
        line = Text(f"{step:<17} ")
        line.append(status, style=_STYLE.get(status, ""))
        if detail:
            line.append(f"  {detail}")
        self._print(line)

    def progress(self, progress: StepProgress) -> None:
        now = self.clock()
        with self.lock:
            self.rows[progress.step] = (progress, now)
            due = self._live is None and now - self._printed.get(progress.step, -self.plain_every_s) >= \
                self.plain_every_s
            if due:
                self._printed[progress.step] = now
        if due:  # off a terminal: the row, once every `plain_every_s`
            self._print(fit_row(progress.step, len(progress.step), row_fields(progress, 0.0), self.console.width))
