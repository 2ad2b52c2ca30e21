"""Fine-tuning from a checkpoint's weights (``load_from``, a run that does not resume): the file read once,
checked against the Runner's model and handed to the Runner's load, as a resume's checkpoint is
(``ToolkitRunner.hand_checkpoint``)."""
from typing import List

from mmengine.runner import Runner

from ...io.weights import check_finetune_fits, read_checkpoint


def hand_load_from(runner: Runner, name: str) -> List[str]:
    """Read the checkpoint ``name`` (a path, https URL or hf-hub: name) once, check that it fits the Runner's
    model but for the class-dependent layers (``check_finetune_fits``), and give its contents to the
    Runner's load of ``name`` (a Runner other than ToolkitRunner reads the file again). Returns the layers
    left at their initial values. Raises CheckpointError or FileNotFoundError naming the file."""
    contents = read_checkpoint(name)
    reinitialised = check_finetune_fits(runner.model, name, contents)
    if hasattr(runner, 'hand_checkpoint'):
        runner.hand_checkpoint(name, contents)
    return reinitialised
