"""``python -m gpu_check``: the check (tools/misc/gpu_check.py)."""
import sys

from gpu_check.machine_check import main

sys.exit(main())
