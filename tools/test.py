"""Evaluate a checkpoint (COCO bbox/segm mAP or mIoU, as the config says); optionally save
the predictions (--out), draw them (--show-dir), or test with the config's test-time augmentation
(--tta: multi-scale and flip for the ADE20K configs). CONFIG CHECKPOINT may be replaced by a published
model alone (a folder of tools/model_converters/publish_model.py, or hf-hub:OWNER/NAME holding one:
xcit_dense/published.py)."""
import argparse
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import List, Optional

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.datasets.loaded_size import loader_color_type
from xcit_dense.datasets.problems import bad_sample_message
from xcit_dense.engine import process_group
from xcit_dense.engine.distributed.process_group import defer_to_node_leader, describe_topology
from xcit_dense.engine.planning.run_config import adapt_to_machine, check_samples, declare_hooks, open_tool_config
from xcit_dense.errors import ToolkitError
from xcit_dense.io.averaged_weights import select_weights
from xcit_dense.io.checkpoint import CheckpointError, local_checkpoint
from xcit_dense.io.checkpoint_schema import SchemaError, dataset_meta_of
from xcit_dense.io.hub import is_hub_name
from xcit_dense.io.output_files import writing
from xcit_dense.io.weights import check_matches_model, read_checkpoint
from xcit_dense.published import is_published_model, open_published
from xcit_dense.tasks import task_of_config


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('config', help='test config file, or a published model (a folder of '
                                       'tools/model_converters/publish_model.py, or hf-hub:OWNER/NAME holding one) '
                                       'given alone')
    parser.add_argument('checkpoint', nargs='?', help="checkpoint file (.pth, .safetensors), https URL or hf-hub:"
                                                      "OWNER/NAME (this toolkit's or the authors' released models)")
    parser.add_argument('--trust-config', action='store_true',
                        help="a published folder: build from its config.py (executed) instead of its recipe")
    parser.add_argument('--work-dir', help='where the evaluation log goes (default: work_dirs/<config>)')
    parser.add_argument('--out', help='save the raw predictions to this .pkl file')
    parser.add_argument('--show-dir', help='draw predictions (with ground truth) into this folder')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation: the config's tta_pipeline and tta_model")
    parser.add_argument('--raw-weights', action='store_true',
                        help='a checkpoint trained with --ema: evaluate the trained weights, not their average')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config values, e.g. test_dataloader.batch_size=2')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none')
    return parser.parse_args()


def configure_outputs(cfg: Config, out: Optional[str], show_dir: str) -> None:
    """Prediction dumping and drawing, in the way of the config's task (mmdet or mmseg)."""
    task = task_of_config(cfg)
    if out:
        dump = dict(type=task.dump_results, out_file_path=os.path.abspath(out))
        evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, list) else [cfg.test_evaluator]
        cfg.test_evaluator = [*evaluators, dump]
    if show_dir:  # the toolkit's hook: pictures named and drawn as tools/infer.py does, for both tasks
        score_thr = cfg.default_hooks.visualization.get('score_thr', 0.3) if task.draws_scores else None
        cfg.custom_hooks = [*(cfg.get('custom_hooks') or []), dict(
            type='ShowDirHook', out_dir=os.path.abspath(show_dir), score_thr=score_thr,
            color_type=loader_color_type(cfg.test_dataloader.dataset.pipeline))]


def use_tta(cfg: Config) -> None:
    """Test through the config's ``tta_model`` around its model, on its ``tta_pipeline``."""
    if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
        raise ValueError('--tta needs tta_model and tta_pipeline in the config (the ADE20K base '
                         'configs/_base_/datasets/ade20k_xcit.py has them)')
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.tta_model.module = cfg.model
    cfg.model = cfg.tta_model


def warn_other_classes(runner, checkpoint: str, loaded: dict) -> None:
    """Warn when the checkpoint names other classes than the test set (whose names the metrics use);
    SchemaError when its classes are not names."""
    try:
        saved = (dataset_meta_of(loaded.get('meta') or {}) or {}).get('classes')
    except SchemaError as exc:
        raise SchemaError(f'{checkpoint}: {exc}') from None
    tested = runner.test_dataloader.dataset.metainfo.get('classes')
    if saved and tested and tuple(saved) != tuple(tested):
        runner.logger.warning(f'{checkpoint} was trained on the classes {", ".join(saved[:5])}, ... '
                              f'({len(saved)}), the test set has {", ".join(tested[:5])}, ... ({len(tested)}): '
                              f'the metrics name the test set\'s')


def open_published_config(args: argparse.Namespace) -> Config:
    """The config of the published model ``args.config``; its checked weights file goes to
    ``args.checkpoint`` (xcit_dense.published)."""
    if args.checkpoint is not None:
        raise ValueError(f'{args.config} is a published model, which holds its weights: give no CHECKPOINT')
    published = open_published(args.config, args.trust_config, args.cfg_options)
    task_of_config(published.config).import_models()
    args.checkpoint = published.weights
    return published.config


def main() -> None:
    """The command line: the toolkit's errors become ``error: ...`` and status 1 (in a
    multi-process run ``process_group`` ends the process alike)."""
    args = parse_args()
    try:
        try:
            if is_published_model(args.config):
                cfg = open_published_config(args)
            elif args.checkpoint is None:
                sys.exit('error: give CONFIG CHECKPOINT, or a published model (folder or hf-hub: name) alone')
            elif args.trust_config:
                sys.exit('error: --trust-config is for a published model folder')
            else:
                cfg = open_tool_config(args.config, args.cfg_options)
            named = '://' in args.checkpoint or is_hub_name(args.checkpoint)  # a URL or hub name, not a path
            if not named and not os.path.isfile(args.checkpoint):
                sys.exit(f'error: checkpoint file not found: {args.checkpoint}')
            if args.tta:
                use_tta(cfg)
            args.checkpoint = local_checkpoint(args.checkpoint)  # a URL: downloaded once, digest logged; hf-hub: cached
            loaded = [read_checkpoint(args.checkpoint)]  # read once; evaluate takes it out (none kept here)
        except (ValueError, CheckpointError) as exc:
            defer_to_node_leader()
            sys.exit(f'error: {exc}')
        cfg.launcher = args.launcher
        with process_group(args.launcher) as backend:
            evaluate(cfg, args, backend, loaded)
    except ToolkitError as exc:
        sys.exit(f'error: {exc}')


def evaluate(cfg: Config, args: argparse.Namespace, backend: Optional[str], holder: List[dict]) -> None:
    """``run_test``, the --out pickle written through no link: in a private folder, renamed into place once
    the test ends (a link at its name refused before the test starts)."""
    if args.out and not args.out.endswith(('.pkl', '.pickle')):
        raise ToolkitError(f'--out must be a .pkl file, got {args.out}')
    with writing(os.path.abspath(args.out)) if args.out else nullcontext() as out:
        run_test(cfg, args, backend, holder, out)


def run_test(cfg: Config, args: argparse.Namespace, backend: Optional[str], holder: List[dict],
             out: Optional[str]) -> None:
    """Build the Runner and test on the checkpoint's contents, taken out of ``holder`` (dropped once the
    Runner has loaded them), its predictions dumped to ``out``; the Runner is garbage once this returns.
    Raises ToolkitError (inside the process group: no exit here, see ``main``)."""
    loaded = holder.pop()
    adapt_to_machine(cfg)
    configure_outputs(cfg, out, args.show_dir)
    declare_hooks(cfg, names=['eval_progress'])
    check_samples(cfg, ['test_dataloader'])
    cfg.work_dir = args.work_dir or cfg.get('work_dir') or str(Path('work_dirs') / Path(args.config).stem)
    cfg.load_from = args.checkpoint
    cfg.model.get('module', cfg.model).backbone.init_cfg = None  # the checkpoint holds every weight (--tta: inside)
    runner = RUNNERS.build(cfg)
    try:
        check_matches_model(runner.model, args.checkpoint, loaded)
        weights = select_weights(loaded, args.raw_weights, args.checkpoint)
        warn_other_classes(runner, args.checkpoint, loaded)
    except (CheckpointError, ValueError) as exc:
        raise ToolkitError(str(exc)) from exc
    runner.logger.info(weights)
    if hasattr(runner, 'hand_checkpoint'):
        runner.hand_checkpoint(args.checkpoint, loaded)
    del loaded  # the Runner's now: dropped once it has loaded it
    runner.logger.info(f'Test plan: {describe_topology(backend)}')
    try:
        runner.test()
    except Exception as exc:
        bad = bad_sample_message(exc)  # the metric would be over fewer images
        if bad is None:
            raise
        runner.logger.error(f'test stopped: {bad}')
        raise ToolkitError(f'test stopped: {bad}') from exc


if __name__ == '__main__':
    main()
