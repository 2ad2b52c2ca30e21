"""Acceptance checks, not benchmark code: ``targets``, the limits the benchmark's measurements must
meet and their verdicts (the GPU check is gpu_check/ in the checkout)."""
