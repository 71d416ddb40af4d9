"""What a bench run covers: the grid (prompt lengths x output lengths x concurrent clients, repeated),
the cells it expands to, and which of them repeat and run the baselines."""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class Grid:
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    concurrency: tuple[int, ...]
    repeats: int


FULL = Grid(prompt_lens=(32, 128, 512, 2048), output_lens=(16, 64, 256), concurrency=(1, 2, 4), repeats=3)
QUICK = Grid(prompt_lens=(64, 1024), output_lens=(24,), concurrency=(1, 2), repeats=4)
QUICK_NOTE = "the short prompt repeats, with baselines; concurrency 2 and the long prompt run once each"
CACHE_OFF_TOKENS = {False: 24, True: 16}  # the no-cache probe's tokens (by --quick): enough to see steps grow


@dataclass(frozen=True)
class Cell:
    prompt: int
    output: int
    clients: int
    repeats: int
    baselines: bool  # run the bare loop and generate() beside the engine in each repetition


def cells_of(grid: Grid, quick: bool, baselines: bool) -> list[Cell]:
    """The grid's cells. Baselines run wherever there is one client. --quick keeps the repeats and
    the baselines to the shortest prompt with one client (where the ratios come from), runs its
    other concurrencies once, and runs the longer prompts once with one client: enough to show
    each trend in under 3 minutes on 2 cores."""
    cells = []
    for p, o, c in itertools.product(grid.prompt_lens, grid.output_lens, grid.concurrency):
        first = p == grid.prompt_lens[0]
        if quick and not first and c > 1:
            continue
        main = c == 1 and (first or not quick)
        cells.append(Cell(p, o, c, grid.repeats if main or not quick else 1, baselines and main))
    return cells
