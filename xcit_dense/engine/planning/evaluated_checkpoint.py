"""The checkpoint tools/test.py evaluates: located and read once before the Runner exists (before the
process group forms, so that a file that cannot be read stops every rank alike), checked against the
model once it is built, and handed to it."""
from typing import Optional

from ...io.averaged_weights import select_weights
from ...io.checkpoint import local_checkpoint
from ...io.checkpoint_schema import SchemaError, dataset_meta_of
from ...io.weights import check_matches_model, read_checkpoint


class EvaluatedCheckpoint:
    """A checkpoint read for a test: ``path`` is the local file (a URL downloaded once, its digest logged;
    an hf-hub: name from the hub's cache); its contents are kept until ``hand_to`` gives them away."""

    def __init__(self, path: str, contents: dict, raw_weights: bool = False) -> None:
        self.path = path
        self.raw_weights = raw_weights
        self.contents: Optional[dict] = contents

    @classmethod
    def read(cls, name: str, raw_weights: bool = False) -> 'EvaluatedCheckpoint':
        """Locate and read the checkpoint ``name`` (path, https URL or hf-hub: name); ``raw_weights``: a
        checkpoint trained with --ema is tested on its trained weights, not their average. Raises
        CheckpointError for a file that cannot be read."""
        path = local_checkpoint(name)
        return cls(path, read_checkpoint(path), raw_weights)

    def hand_to(self, runner) -> None:
        """Check the contents against the Runner's model, put the tested weights in place (the average,
        or the trained ones), log which, warn when the checkpoint names other classes than the test set,
        and give the contents to the Runner: dropped here, the Runner's once it has loaded them (a Runner
        other than ToolkitRunner reads the file again). Raises CheckpointError for a checkpoint of
        another model or with classes that are not names, ValueError for --raw-weights without an average."""
        contents, self.contents = self.contents, None
        check_matches_model(runner.model, self.path, contents)
        weights = select_weights(contents, self.raw_weights, self.path)
        warn_other_classes(runner, self.path, contents)
        runner.logger.info(weights)
        if hasattr(runner, 'hand_checkpoint'):
            runner.hand_checkpoint(self.path, contents)


def warn_other_classes(runner, checkpoint: str, contents: dict) -> None:
    """Warn when the checkpoint names other classes than the test set (whose names the metrics use);
    SchemaError when its classes are not names."""
    try:
        saved = (dataset_meta_of(contents.get('meta') or {}) or {}).get('classes')
    except SchemaError as exc:
        raise SchemaError(f'{checkpoint}: {exc}') from None
    tested = runner.test_dataloader.dataset.metainfo.get('classes')
    if saved and tested and tuple(saved) != tuple(tested):
        runner.logger.warning(f'{checkpoint} was trained on the classes {", ".join(saved[:5])}, ... '
                              f'({len(saved)}), the test set has {", ".join(tested[:5])}, ... ({len(tested)}): '
                              f'the metrics name the test set\'s')
