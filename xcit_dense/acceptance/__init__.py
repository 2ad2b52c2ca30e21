"""Acceptance checks, not benchmark code: ``targets``, the limits the benchmark's measurements must
meet and their verdicts; ``gpu_check``, the prepared check of a GPU machine behind ``tools/gpu_check.py``."""
