"""MMEngine's checkpoint schemes, every one routed to the toolkit's checked reader or refused.

MMEngine reads a checkpoint path through the reader registered for its prefix (``CheckpointLoader``):
``load_from``, ``resume``, any model's ``init_cfg=dict(type='Pretrained', checkpoint=...)`` (a stock
mmdet ResNet's ``torchvision://resnet50`` too), mmdet's and mmseg's tools and inferencers. MMEngine's
own readers unpickle with ``torch.load``'s ``weights_only=False`` (the model-zoo names through
``torch.hub.load_state_dict_from_url``, bound at import, which takes any file in
``$TORCH_HOME/hub/checkpoints`` by its name alone): a planted file would run code. Every scheme is
replaced here:

- local paths and http(s) URLs: read weights only (``checkpoint.py``), URLs downloaded by
  ``download.py`` (https, digests, a cache keyed by the whole URL);
- ``torchvision://``, ``modelzoo://``, ``open-mmlab://``, ``openmmlab://``, ``mmcls://``: the name
  looked up in MMEngine's own tables; a file the user placed in ``$TORCH_HOME/hub/checkpoints`` under
  the URL's base name (the offline workflow) is read through the same checks, else the URL is
  downloaded by ``download.py``;
- ``pavi://``, ``s3://``, ``petrel://`` and any scheme another package registered before this module:
  refused, naming the scheme.

Checkpoints come back in this toolkit's layout (``weights.py``).
"""
import os
from typing import Any, Optional
from urllib.parse import urlparse

import torch
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

from ..checkpoint import CheckpointError, load_weights_only, local_checkpoint
from .weights import to_toolkit_layout

MODEL_ZOO_SCHEMES = ('torchvision://', 'modelzoo://', 'open-mmlab://', 'openmmlab://', 'mmcls://')
# MMEngine's remote stores, under the patterns it registers them with
REMOTE_STORES = ('pavi://', r'(\S+\:)?s3://', r'(\S+\:)?petrel://')


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


@CheckpointLoader.register_scheme(prefixes='', force=True)
def load_from_local(filename: str, map_location: Any = None) -> Any:
    """Local files (``load_from``, ``resume``, the stock inferencers): inspected, read weights only."""
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return to_toolkit_layout(load_weights_only(filename, map_location))


@CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), force=True)
def load_from_url(filename: str, map_location: Any = None, model_dir: Optional[str] = None) -> Any:
    """URLs: the checked download (download.py), then the weights-only read."""
    return to_toolkit_layout(load_weights_only(local_checkpoint(filename), map_location))


@CheckpointLoader.register_scheme(prefixes=MODEL_ZOO_SCHEMES, force=True)
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
    """Remote stores and unknown schemes: refused, since their readers unpickle with a bare
    ``torch.load`` this toolkit cannot check."""
    raise CheckpointError(f'{filename}: checkpoints are not read from this scheme (its reader is not '
                          f'checked); copy the file to a local path and pass that path')


def _refuse_the_rest() -> None:
    """Register the refusal for the remote stores and for any scheme registered by another package:
    after this, no path reaches a reader outside this module."""
    ours = (load_from_local, load_from_url, load_from_model_zoo)
    others = [prefix for prefix, loader in CheckpointLoader._schemes.items() if loader not in ours]
    CheckpointLoader.register_scheme(prefixes=list(REMOTE_STORES) + others, loader=load_from_remote_store,
                                     force=True)


_refuse_the_rest()

