"""``hf-hub:OWNER/NAME[@REVISION]`` checkpoint names: a model repository on the Hugging Face Hub.

The name is resolved by ``huggingface_hub`` as its users expect: its cache (``HF_HOME``,
``HF_HUB_CACHE``), its offline switch (``HF_HUB_OFFLINE=1``: the cache only), the token of its own
login, and the revision when the name gives one (a commit hash pins the files; a branch or tag
follows it). Of the repository's files, ``model.safetensors`` is preferred and timm's older
``pytorch_model.bin`` taken where there is none; the local file is then read like any other
checkpoint (``checkpoint.load_weights_only``: safetensors by content, else the checked unpickler).
"""
import os
from typing import Optional, Tuple

from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

PREFIX = 'hf-hub:'
# the repository's weights files, preferred first: timm's safetensors file, then its older pickle
WEIGHT_FILES = ('model.safetensors', 'pytorch_model.bin')


class HubError(RuntimeError):
    """An ``hf-hub:`` name that cannot be resolved to a local file; the message is one line."""


def is_hub_name(name: str) -> bool:
    """Whether ``name`` is an ``hf-hub:`` checkpoint name."""
    return name.startswith(PREFIX)


def parse_hub_name(name: str) -> Tuple[str, Optional[str]]:
    """(``OWNER/NAME``, revision or None) of ``hf-hub:OWNER/NAME[@REVISION]``."""
    repo, _, revision = name[len(PREFIX):].partition('@')
    if repo.count('/') != 1 or not all(repo.split('/')) or (_ and not revision):
        raise HubError(f'{name}: an hf-hub: name is hf-hub:OWNER/NAME or hf-hub:OWNER/NAME@REVISION')
    return repo, revision or None


def resolve_hub_file(name: str, filename: str) -> str:
    """The local file ``filename`` of the repository ``hf-hub:OWNER/NAME[@REVISION]`` (a published model's
    ``model.json``), from huggingface_hub's cache or downloaded into it. Raises :class:`HubError`."""
    repo, revision = parse_hub_name(name)
    try:
        return hf_hub_download(repo, filename, revision=revision)
    except (HfHubHTTPError, OSError, ValueError) as exc:  # EntryNotFoundError among them
        text = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise HubError(f'{name}: huggingface_hub could not fetch {filename} of {repo}: {text}') from exc


def resolve_hub_name(name: str) -> str:
    """The local file of ``hf-hub:OWNER/NAME[@REVISION]``: its first :data:`WEIGHT_FILES` entry the
    repository has, from huggingface_hub's cache or downloaded into it. Raises :class:`HubError`
    naming the repository, and, when nothing is cached offline, the cache folder and how to fill it."""
    repo, revision = parse_hub_name(name)
    for filename in WEIGHT_FILES:
        try:
            return hf_hub_download(repo, filename, revision=revision)
        except EntryNotFoundError:  # not in the repository, or (offline) not in the cache: the next one
            continue
        except (HfHubHTTPError, OSError, ValueError) as exc:
            text = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise HubError(f'{name}: huggingface_hub could not fetch {repo}: {text}') from exc
    folder = os.path.join(constants.HF_HUB_CACHE, 'models--' + repo.replace('/', '--'))
    at = f' --revision {revision}' if revision else ''
    where = 'offline (HF_HUB_OFFLINE), in the cache' if constants.HF_HUB_OFFLINE else 'in the repository nor the cache'
    raise HubError(f'{name}: no {" or ".join(WEIGHT_FILES)} of {repo} {where} {folder}; fetch it where the network '
                   f'is reachable (hf download {repo} {WEIGHT_FILES[0]}{at}) and copy that folder there')
