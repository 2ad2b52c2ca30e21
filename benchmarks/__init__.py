"""Speed and peak memory of XCiT and the backbones users would pick instead, against resolution.

The project's measurement code: run from a checkout (``python -m benchmarks``), not installed with
the ``xcit_dense`` package. ``catalogue``: the models measured; ``measure``: one measurement in a fresh process;
``runs``: the runs and their limits (the acceptance targets they are judged by are
``targets``); ``report``: the table, CSV and plot; ``linearity``: the time and
memory growth check against timm; ``profile_ops``: one block's time per sub-layer and operator;
``sizes``: square and non-square image sizes; ``cli``: the command line over them, which
``python -m benchmarks backbones`` runs. ``whole_model``: whole detectors and segmentors side by side
(``python -m benchmarks whole_models``); ``backward_ops`` and ``saved_activations``, scripts of their own:
the training step's backward per operator and what it keeps for it.
"""
