"""Speed and peak memory of XCiT and the backbones users would pick instead, against resolution.

``catalogue``: the models measured; ``measure``: one measurement in a fresh process;
``runs``: the runs and their limits (the acceptance targets they are judged by are
``xcit_dense.acceptance.targets``); ``report``: the table, CSV and plot; ``linearity``: the time and
memory growth check against timm; ``profile_ops``: one block's time per sub-layer and operator;
``sizes``: square and non-square image sizes; ``cli``: the command line over them, which
``tools/benchmark.py`` runs.
"""
