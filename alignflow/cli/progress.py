"""The run's progress on the terminal: one live row per running step on a tty, a line every N seconds otherwise.

```
 gpu_train         cuda    step 12/30  lm_loss 4.99  3.7 s/step  ETA 1m05s
 npu_reload_train  ascend  step 20/30  lm_loss 5.01  2.9 s/step  ETA 29s
```
Each step that ends prints one line (`convert_bf16      cached  from run 5622de9be3ae`), above the live rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.table import Table

from alignflow.runner.progress import StepProgress

PLAIN_EVERY_S = 30.0
_STYLE = {"ran": "green", "cached": "cyan", "failed": "bold red", "cancelled": "yellow"}


class ConsoleProgress:
    """A `RunObserver` (see `tasks.progress`) that draws on a rich console. `verbose` also prints every message
    (staging, launches); by default only the outcome of each step and the live progress are shown."""

    def __init__(self, console: Console | None = None, *, verbose: bool = False, plain_every_s: float = PLAIN_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(stderr=True)
        self.verbose = verbose
        self.plain_every_s = plain_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: dict[str, StepProgress] = {}
        self._printed: dict[str, float] = {}
        self._live: Live | None = None

    def __enter__(self) -> ConsoleProgress:
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=2, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def message(self, text: str) -> None:
        if self.verbose:
            with self._lock:
                self.console.print(text, highlight=False, markup=False)

    def step_ended(self, step: str, status: str, detail: str) -> None:
        with self._lock:
            self._rows.pop(step, None)
            style = _STYLE.get(status, "")
            self.console.print(f"{step:<17} [{style}]{status}[/]" + (f"  {detail}" if detail else ""),
                               highlight=False)
            self._refresh()

    def progress(self, progress: StepProgress) -> None:
        with self._lock:
            self._rows[progress.step] = progress
            if self._live is None:
                now = self._clock()
                if now - self._printed.get(progress.step, -self.plain_every_s) >= self.plain_every_s:
                    self._printed[progress.step] = now
                    self.console.print(progress.line(), highlight=False, markup=False)
            self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())

    def _table(self) -> Table:
        table = Table.grid(padding=(0, 2))
        for _ in range(3):
            table.add_column(no_wrap=True)
        for p in self._rows.values():
            table.add_row(p.step, p.host, p.line().removeprefix(p.step).strip())
        return table
