"""MMEngine's checkpoint schemes, every one routed to the toolkit's checked reader or refused.

MMEngine reads a checkpoint path through the reader registered for its prefix (``CheckpointLoader``):
``load_from``, ``resume``, any model's ``init_cfg=dict(type='Pretrained', checkpoint=...)`` (a stock
mmdet ResNet's ``torchvision://resnet50`` too), mmdet's and mmseg's tools and inferencers. MMEngine's
own readers unpickle with ``torch.load``'s ``weights_only=False`` (the model-zoo names through
``torch.hub.load_state_dict_from_url``, bound at import, which takes any file in
``$TORCH_HOME/hub/checkpoints`` by its name alone): a planted file would run code.
:func:`install_checked_schemes` replaces every scheme; importing this module changes nothing. The
toolkit's entry points install them (tools/, the inferencers it builds), and so does the opt-in
module ``xcit_dense.checked_loading`` that the toolkit's configs name in ``custom_imports`` (mmdet's
and mmseg's own tools on those configs then read checked too):

- local paths, http(s) URLs and ``hf-hub:`` names: read weights only (``checkpoint.py``; safetensors
  files by content), URLs downloaded by ``download.py`` (https, digests, a cache keyed by the whole
  URL), hub names resolved by ``hub.py`` (huggingface_hub's cache);
- ``torchvision://``, ``modelzoo://``, ``open-mmlab://``, ``openmmlab://``, ``mmcls://``: the name
  looked up in MMEngine's own tables; a file the user placed in ``$TORCH_HOME/hub/checkpoints`` under
  the URL's base name (the offline workflow) is read through the same checks, else the URL is
  downloaded by ``download.py``;
- ``s3://``, ``petrel://`` and any scheme another package registered before the install: the bytes
  fetched by the MMEngine file backend registered for the prefix (``mmengine.fileio.get_local_path``),
  then read by the checked reader; a prefix no file backend serves is refused, naming it;
- ``pavi://``: refused (MMEngine's reader for it unpickles a model object, not a file).

Checkpoints come back in this toolkit's layout (``weights.to_toolkit_layout``), which holds no config
text: MMEngine runs such a text as Python (``Runner.resume``, the inferencers given no config).
"""
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional
from urllib.parse import urlparse

import torch
from mmengine.fileio import get_file_backend, get_local_path
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

from .checkpoint import CheckpointError, load_weights_only, local_checkpoint
from .hub import PREFIX as HUB_PREFIX
from .weights import to_toolkit_layout

MODEL_ZOO_SCHEMES = ('torchvision://', 'modelzoo://', 'open-mmlab://', 'openmmlab://', 'mmcls://')
# MMEngine's remote stores, under the patterns it registers them with
REMOTE_STORES = (r'(\S+\:)?s3://', r'(\S+\:)?petrel://')
REFUSED = ('pavi://',)


def hub_cache_file(url: str) -> str:
    """Where torch.hub and MMEngine's ``load_url`` keep ``url``'s file: the hub's checkpoints folder,
    under the URL's base name."""
    return os.path.join(torch.hub.get_dir(), 'checkpoints', os.path.basename(urlparse(url).path))


def model_zoo_location(filename: str) -> str:
    """The URL (or, for some ``open-mmlab://`` names, the path under MMEngine's home) that MMEngine
    looks a model-zoo name up to."""
    scheme, name = filename.split('://', 1)
    if scheme in ('torchvision', 'modelzoo'):
        table = mmengine_checkpoint.get_torchvision_models()
    elif scheme == 'mmcls':
        table = mmengine_checkpoint.get_mmcls_models()
    else:
        table = mmengine_checkpoint.get_external_models()
        name = mmengine_checkpoint.get_deprecated_model_names().get(name, name)
    if name not in table:
        raise CheckpointError(f'{filename}: MMEngine knows no {scheme}:// checkpoint of that name')
    location = table[name]
    if location.startswith(('http://', 'https://')):
        return location
    return os.path.join(mmengine_checkpoint._get_mmengine_home(), location)


def read_name(name: str) -> str:
    """How MMEngine's reads name the checkpoint ``name``: a local path by its absolute path (``~`` expanded,
    as ``load_from_local`` does), a URL or any other scheme's name (``hf-hub:`` included) as it is."""
    if '://' in name or name.startswith(HUB_PREFIX):
        return name
    return os.path.abspath(os.path.expanduser(name))


@contextmanager
def handed_over(name: str, checkpoint: dict) -> Iterator[None]:
    """Within: the next read of the checkpoint ``name`` (a path, URL or other scheme's name) through MMEngine's
    checkpoint loader, where the checked readers are installed, returns ``checkpoint``, its contents already
    read by ``weights.read_checkpoint`` (checked, in this toolkit's layout: no config text), instead of
    reading it again (a run reads its checkpoint once). For the block every scheme's reader is wrapped by
    one that serves the contents to that read (and reads any other name as before); the installed
    readers after."""
    installed = dict(CheckpointLoader._schemes)
    if installed.get('') is not load_from_local:
        yield
        return
    handed = {read_name(name): checkpoint}

    def serving(reader: Callable[..., Any]) -> Callable[..., Any]:
        def read(filename: str, map_location: Any = None) -> Any:
            found = handed.pop(read_name(filename), None)
            return reader(filename, map_location) if found is None else found
        # MMEngine names the backend in its notice by the reader's name after 'load_from_' ("Loads checkpoint
        # by local backend ..."), the notice that xcit_launch.known_warnings drops: keep each reader's
        read.__name__ = reader.__name__
        return read

    for prefix, reader in installed.items():
        CheckpointLoader.register_scheme(prefixes=prefix, loader=serving(reader), force=True)
    try:
        yield
    finally:
        for prefix, reader in installed.items():
            CheckpointLoader.register_scheme(prefixes=prefix, loader=reader, force=True)


def load_from_local(filename: str, map_location: Any = None) -> Any:
    """Local files (``load_from``, ``resume``, the stock inferencers): inspected, read weights only."""
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return to_toolkit_layout(load_weights_only(filename, map_location))


def load_from_url(filename: str, map_location: Any = None, model_dir: Optional[str] = None) -> Any:
    """URLs and ``hf-hub:`` names: the checked download (download.py) or huggingface_hub's cache
    (hub.py), then the weights-only read."""
    return to_toolkit_layout(load_weights_only(local_checkpoint(filename), map_location))


def load_from_model_zoo(filename: str, map_location: Any = None) -> Any:
    """Model-zoo names: looked up as MMEngine does; a file placed in the hub cache under the URL's
    name, else the checked download; read weights only. ``mmcls://`` keeps the backbone's weights,
    as MMEngine's reader does."""
    location = model_zoo_location(filename)
    if '://' not in location:
        path = location
    elif os.path.isfile(hub_cache_file(location)):
        path = hub_cache_file(location)
    else:
        path = local_checkpoint(location)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'{path} ({filename}) can not be found.')
    checkpoint = to_toolkit_layout(load_weights_only(path, map_location))
    if filename.startswith('mmcls://'):
        checkpoint = mmengine_checkpoint._process_mmcls_checkpoint(checkpoint)
    return checkpoint


def load_from_remote_store(filename: str, map_location: Any = None) -> Any:
    """Object stores (``s3://``, ``petrel://``) and schemes other packages registered: the file
    fetched by the MMEngine file backend of its prefix, then read weights only."""
    try:
        get_file_backend(filename, enable_singleton=True)
    except KeyError as exc:  # mmengine.fileio has no backend for the prefix
        raise CheckpointError(f'{filename}: no MMEngine file backend serves this scheme; copy the file to a '
                              f'local path and pass that path') from exc
    with get_local_path(filename) as path:
        return to_toolkit_layout(load_weights_only(str(path), map_location))


def refuse(filename: str, map_location: Any = None) -> Any:
    """``pavi://``: refused, since MMEngine's reader for it unpickles whatever the service returns."""
    raise CheckpointError(f'{filename}: checkpoints are not read from this scheme (its reader is not '
                          f'checked); copy the file to a local path and pass that path')


CHECKED = {'': load_from_local, ('http://', 'https://', HUB_PREFIX): load_from_url,
           MODEL_ZOO_SCHEMES: load_from_model_zoo, REMOTE_STORES: load_from_remote_store, REFUSED: refuse}


def install_checked_schemes() -> None:
    """Route every MMEngine checkpoint scheme to this module's readers (idempotent): the toolkit's
    own, then any other package's registered so far through its file backend."""
    named = {prefix for prefixes in CHECKED for prefix in ((prefixes,) if isinstance(prefixes, str) else prefixes)}
    others = [prefix for prefix in CheckpointLoader._schemes if prefix not in named]
    for prefixes, loader in CHECKED.items():
        CheckpointLoader.register_scheme(prefixes=prefixes, loader=loader, force=True)
    if others:
        CheckpointLoader.register_scheme(prefixes=others, loader=load_from_remote_store, force=True)
