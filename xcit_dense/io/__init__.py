"""Checkpoint files: reading them checked, writing them atomically, downloading them, and mapping the
released models' weights onto the toolkit's; the toolkit's other output files, written without
following links.

- ``checked_unpickler.py``: what a checkpoint file may build, checked as it is built;
- ``torch_archive.py``: a checkpoint's zip layout, parsed strictly as torch's reader finds it;
- ``checkpoint.py``: ``CheckpointError``, the weights-only read of a file or URL, atomic writes (the
  ``atomic_local`` file backend);
- ``checkpoint_schema.py``: the types, ranges and shapes of the values read from a checkpoint, and a
  resume candidate judged whole;
- ``checkpoint_schemes.py``: every MMEngine checkpoint scheme (``torchvision://``, ``s3://``, ...)
  routed to the checked reader or refused;
- ``download.py``: checked downloads into a cache keyed by the whole URL;
- ``output_files.py``: what the toolkit writes in a work dir or output folder, never through a link;
- ``weights.py``: the authors', timm's and this toolkit's key layouts, fit checks.

Importing the package imports none of them; ``xcit_dense.checked_loading`` installs the schemes.
"""
