"""Opt-in: importing this module routes every MMEngine checkpoint scheme to the toolkit's checked
reader (``io/checkpoint_schemes.py``).

The toolkit's configs name it in ``custom_imports``, so mmdet's and mmseg's own tools and
inferencers on those configs read checkpoints checked; the toolkit's tools import it first thing.
Importing ``xcit_dense`` alone leaves MMEngine's schemes as they are.
"""
from .io.checkpoint_schemes import install_checked_schemes

install_checked_schemes()
