"""`kvscope bench` and `kvscope class-sim`: one module per benchmark (the grid, batching, dtypes with its
anchors, batch invariance, the simulated class) over one shared floor: clients.py records each request,
measure.py and baselines.py measure, report.py counts, judges, checks and writes; ratios, never absolute
timed assertions."""
