"""torchrun, as the launch scripts run it (see xcit_launch/torchrun.py for its three additions).

Usage: python tools/torchrun.py [torchrun arguments] SCRIPT [script arguments]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's xcit_launch, installed or not
from xcit_launch.torchrun import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
