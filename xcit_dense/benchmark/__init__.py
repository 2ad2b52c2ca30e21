"""Speed and peak memory of XCiT and the backbones users would pick instead, against resolution.

``catalogue``: the models measured; ``measure``: one measurement in a fresh process;
``runner``: the runs and their limits; ``targets``: the acceptance targets and their verdicts;
``report``: the table, CSV and plot; ``linearity``: the time and memory growth check against timm;
``profile_ops``: one block's time per sub-layer and operator; ``sizes``: square and non-square image sizes;
``cli``: the command line over them, which ``tools/benchmark.py`` runs.
"""
