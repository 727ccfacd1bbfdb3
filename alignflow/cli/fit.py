"""Tables that fit an 80-column terminal (issue 47): no token split, no column lost.

rich shrinks every column of a table wider than the terminal in proportion, folding a criterion such as
`|me(lm_loss)| < 0.001` mid-token, and when the columns' minimum widths add up to more than the terminal it lets
the table run past the right edge, where the terminal cuts its last column and border. So a text column's minimum
width is its longest token (it wraps between words, never inside one) and a number's its widest cell; what is
still too wide is said shorter, with a legend: long metric names abbreviated (`abbreviations`), a table of several
logs printed as one table per log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.table import Table

# A metric name longer than this is abbreviated in a narrow terminal (load_balancing_loss: 19 characters).
LONGEST_NAME = 12


def longest_token(cells: Iterable[str]) -> int:
    """The widest whitespace-separated word of `cells` (0 for none)."""
    return max((len(word) for cell in cells for word in cell.split()), default=0)


def add_columns(table: Table, header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool],
                width: int) -> None:
    """The table's columns, sized for a terminal `width` wide: each at least its longest word (a number: its widest
    cell), the space left shared in proportion to what each column's longest cell still needs. rich's own sizing
    shrinks the widest columns first and then widens a column back to its minimum, past the terminal's edge."""
    lows, highs = [], []
    for i, name in enumerate(header):
        cells = [row[i] for row in rows]
        lows.append(max(max(map(len, cells), default=0) if numeric[i] else longest_token(cells),
                        longest_token([name])))
        highs.append(max([len(name), *map(len, cells)]))
    spare = width - (len(header) + 1) - 2 * len(header) - sum(lows)  # borders, one space each side of a cell
    need = [high - low for low, high in zip(lows, highs, strict=True)]
    if spare >= sum(need):
        sizes = list(highs)
    elif spare >= 0:
        sizes = [low + spare * n // sum(need) for low, n in zip(lows, need, strict=True)]
        for i in sorted(range(len(header)), key=lambda i: need[i], reverse=True)[:sum(lows) + spare - sum(sizes)]:
            sizes[i] += 1
    else:  # not even the longest words fit: the widest text column alone gives up what is missing, and folds
        sizes = list(lows)
        widest = max((i for i in range(len(header)) if not numeric[i]), key=lambda i: lows[i], default=0)
        sizes[widest] = max(1, sizes[widest] + spare)
    for name, number, size in zip(header, numeric, sizes, strict=True):
        table.add_column(name, justify="right" if number else "left", overflow="fold", width=size)


def abbreviations(names: Iterable[str]) -> dict[str, str]:
    """Short forms of the names longer than `LONGEST_NAME`: the initials of every `_` part but the last, which is
    kept (`load_balancing_loss` -> `lb_loss`); a short form that would be ambiguous is not used."""
    short = {}
    for name in dict.fromkeys(names):
        parts = name.split("_")
        if len(name) > LONGEST_NAME and len(parts) > 1:
            short[name] = "".join(p[:1] for p in parts[:-1]) + "_" + parts[-1]
    taken = list(short.values())
    return {name: s for name, s in short.items() if taken.count(s) == 1}


def legend(short: dict[str, str]) -> str:
    """`lb_loss = load_balancing_loss` for each abbreviation in use."""
    return "; ".join(f"{s} = {name}" for name, s in short.items())
