"""The two sets of weights of a checkpoint trained with ``--ema`` (MMEngine's ``EMAHook`` layout):
``state_dict`` holds the average, the weights every tool takes by default, and ``ema_state_dict`` the
averaging wrapper's state, whose ``module.``-prefixed entries are the trained weights."""
from typing import Dict, Optional

import torch

AVERAGE_KEY = 'ema_state_dict'


def trained_weights(checkpoint: dict) -> Optional[Dict[str, torch.Tensor]]:
    """The trained (not averaged) weights of an EMA checkpoint; None for a checkpoint without an average."""
    wrapper = checkpoint.get(AVERAGE_KEY)
    if not isinstance(wrapper, dict):
        return None
    return {key[len('module.'):]: value for key, value in wrapper.items() if key.startswith('module.')}


def select_weights(checkpoint: dict, raw: bool, name: str) -> str:
    """Put the weights a tool evaluates in ``checkpoint['state_dict']``: the average (as saved) or, with
    ``raw``, the trained ones; the log line that says which. Raises ValueError for ``raw`` without an average."""
    trained = trained_weights(checkpoint)
    if trained is None:
        if raw:
            raise ValueError(f'--raw-weights: {name} holds no average of the weights (it was not trained with '
                             f'--ema): its weights are the trained ones')
        return f'weights: {name} (trained without an average)'
    if raw:
        checkpoint['state_dict'] = dict(checkpoint['state_dict'], **trained)
        return f'weights: the trained weights of {name} (--raw-weights; its EMA average is not used)'
    return f'weights: the EMA average of {name} (--raw-weights for the trained ones)'
