"""The launch layout (nodes, node rank, master, port) from the environment, for the launch scripts.

Run by tools/launch_common.sh before torchrun (see xcit_launch/launch_layout.py for the variables read
and their order); prints a log line and four values, or one error and exits 2. Standard library only.

Usage: python tools/launch_layout.py GPUS NODE_GPUS
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's xcit_launch, installed or not
from xcit_launch.launch_layout import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
