"""hookledger's benchmarks: ``python -m bench`` (see ``python -m bench --help``).

Each path (receive, dispatch, reconcile) is measured side by side with a yardstick in the same
run, alternating, over several rounds; the command prints a table of medians and ratios and
regenerates ``bench/RESULTS.md``.
"""
