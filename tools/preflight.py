"""Check a launch before any worker starts: the config exists and loads, its data files exist.

Run by the launch scripts with the tool's arguments (their --cfg-options count); imports mmengine's
Config only (xcit_launch/preflight.py), so the check takes a second or two. Prints one message and
exits non-zero when the launch cannot work.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's xcit_launch, installed or not
from xcit_launch.entry_point import prepare_process

prepare_process()  # before mmengine is imported: its import emits one of the known warnings
from xcit_launch.preflight import main  # noqa: E402

if __name__ == '__main__':
    main()
