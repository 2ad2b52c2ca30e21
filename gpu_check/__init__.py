"""The prepared GPU check (dev/gpu-check.md), kept out of the installed package: it runs from a
checkout (``python tools/misc/gpu_check.py`` or ``python -m gpu_check``).

``machine_check``: the check's steps and report; ``ops_goldens``: compiled mmcv 2.1.0's outputs and their
comparison; ``toolkit_runs``: the toolkit's own commands the check runs and what their logs must
show; ``bundle``: the wheels a lent machine without network lacks; ``device_check``: the whole call
on that machine; ``bounded``: subprocesses under a time limit. ``bundle``, ``device_check`` and
``bounded`` use the standard library only (the device call starts before anything is installed).
"""
