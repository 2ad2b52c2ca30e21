"""What the ranks agree on once per optimizer step, in one small collective: whether any rank
received a stop signal, and whether any rank's loss was NaN or infinite in that step."""
from typing import NamedTuple, Union

import torch

from ..distributed.collectives import agree_on_max
from ..distributed.process_wide import PROCESS


def note_signal(signum: int) -> None:
    """Called from a signal handler: remember the signal until the step's agreement (process-wide,
    as the handler is: ``process_wide``)."""
    PROCESS.signal = signum


def noted_signal() -> int:
    """The signal this process received since the last agreement (0: none)."""
    return PROCESS.signal


def clear_signal() -> None:
    """Forget a noted signal (at the start of a training run)."""
    note_signal(0)


class StepAgreement(NamedTuple):
    """The agreed outcome of one optimizer step."""
    signal: int  # the highest signal number any rank received, 0 for none
    nonfinite: bool  # any rank's loss was NaN/inf in one of the step's micro-batches


def agree_on_step(nonfinite: Union[bool, torch.Tensor]) -> StepAgreement:
    """Exchange this rank's signal and non-finite flag (a tensor stays on its device until here:
    this is the step's one host synchronisation) and return what the ranks agree on."""
    signal, bad = agree_on_max([float(PROCESS.signal), float(nonfinite)])
    return StepAgreement(int(signal), bool(bad))
