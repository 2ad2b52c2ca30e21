"""How the tools stop (xcit_dense/tool_errors.py): a library error turned into the line a tool prints and its
exit status; and tools/test.py's run assembled as training's is (the work dir rule, outputs, TTA)."""
import argparse
import signal

import pytest
from helpers import ROOT
from mmengine.config import Config

from xcit_dense import tool_errors
from xcit_dense.datasets.problems import BadSample
from xcit_dense.engine.distributed import process_group
from xcit_dense.engine.planning.evaluated_checkpoint import EvaluatedCheckpoint
from xcit_dense.engine.planning.out_of_memory import OutOfMemoryAdvice
from xcit_dense.engine.planning.run_config import EvaluationRun, assemble_testing, use_tta
from xcit_dense.errors import Preempted, ToolkitError
from xcit_dense.io.checkpoint import CheckpointError
from xcit_dense.io.checkpoint_schema import SchemaError
from xcit_dense.tool_errors import ToolStop, exit_status, how_it_stops, stop_on, stop_on_bad_samples

pytestmark = pytest.mark.quick

SEG = str(ROOT / 'configs/xcit/upernet_xcit_small_12_p16_160k_ade20k.py')


def raising(exc: BaseException):
    def main():
        raise exc
    return main


def test_exit_status_prints_the_toolkits_errors_and_gives_their_status(capsys):
    assert exit_status(lambda: None) == 0
    assert exit_status(raising(ToolkitError('the input is wrong'))) == 1
    assert capsys.readouterr().err == 'error: the input is wrong\n'
    assert exit_status(raising(OutOfMemoryAdvice('out of memory on rank 0'))) == 3  # its own status
    assert capsys.readouterr().err == 'error: out of memory on rank 0\n'
    assert exit_status(raising(ToolStop('bad key', heading='error in my.py'))) == 1
    assert capsys.readouterr().err == 'error in my.py: bad key\n'
    assert exit_status(raising(Preempted(signal.SIGTERM))) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == ''  # silent
    with pytest.raises(KeyError):  # a bug: its traceback
        exit_status(raising(KeyError('x')))


class Ended(BaseException):
    """What the stand-in for ``os._exit`` raises: the status the process would have ended with."""


@pytest.mark.parametrize('exc', [ToolkitError('the input is wrong'), OutOfMemoryAdvice('out of memory on rank 0'),
                                 ToolStop('bad key', heading='error in my.py'), Preempted(signal.SIGTERM)],
                         ids=['toolkit', 'own-status', 'heading', 'preempted'])
def test_a_multi_process_run_ends_with_the_tools_line_and_status(monkeypatch, capsys, exc):
    """``process_group``'s ending (``_exit_now``) prints the line and gives the status that ``exit_status``
    does, for every kind of the toolkit's stops (one mapping: ``how_it_stops``)."""
    assert exit_status(raising(exc)) == how_it_stops(exc)[1]
    printed = capsys.readouterr().err
    monkeypatch.setattr(process_group.logging, 'shutdown', lambda: None)  # (the test's logging stays open)

    def ended(code):
        raise Ended(code)
    monkeypatch.setattr(process_group.os, '_exit', ended)
    with pytest.raises(Ended) as status:
        process_group._exit_now(exc)
    assert (status.value.args[0], capsys.readouterr().err) == (how_it_stops(exc)[1], printed)


def test_stop_on_turns_the_named_errors_into_the_tools_stop():
    logged = []
    with pytest.raises(ToolStop, match=r'^cannot resume: damaged$') as stop:
        with stop_on(CheckpointError, prefix='cannot resume: ', log=logged.append):
            raise CheckpointError('damaged')
    assert isinstance(stop.value.__cause__, CheckpointError) and logged == ['cannot resume: damaged']
    with pytest.raises(KeyError):  # not named: passes as it is
        with stop_on(CheckpointError):
            raise KeyError('x')
    advice = OutOfMemoryAdvice('out of memory: try --auto-fit')
    with pytest.raises(OutOfMemoryAdvice) as kept:  # the toolkit's own: as it is (its status), logged
        with stop_on(CheckpointError, log=logged.append):
            raise advice
    assert kept.value is advice and logged[-1] == 'out of memory: try --auto-fit'


def test_the_inner_block_names_an_error_of_both_kinds():
    """tools/train.py's order: a SchemaError (a CheckpointError and a ValueError) is a resume's."""
    with pytest.raises(ToolStop, match=r'^cannot resume: wrong type$'):
        with stop_on(ValueError), stop_on(CheckpointError, prefix='cannot resume: '):
            raise SchemaError('wrong type')
    with pytest.raises(ToolStop, match=r'^no such plan$'):
        with stop_on(ValueError), stop_on(CheckpointError, prefix='cannot resume: '):
            raise ValueError('no such plan')


@pytest.mark.parametrize('local_rank, waits', [('0', []), ('1', [30.0])])
def test_an_error_every_rank_meets_is_printed_by_the_node_leader(monkeypatch, local_rank, waits):
    monkeypatch.setenv('LOCAL_RANK', local_rank)
    waited = []
    monkeypatch.setattr(tool_errors.time, 'sleep', waited.append)
    with pytest.raises(ToolStop):
        with stop_on(ValueError, every_rank_alike=True):
            raise ValueError('bad config')
    assert waited == waits
    with pytest.raises(ToolStop):
        with stop_on(ValueError):
            raise ValueError('bad config')
    assert waited == waits  # only where asked


def test_a_bad_sample_stops_the_loop_naming_it():
    logged = []
    with pytest.raises(ToolStop, match=r'^test stopped: a.png: unreadable images: truncated$'):
        with stop_on_bad_samples('test', logged.append):
            raise BadSample('unreadable images', 'a.png', 'truncated')
    # a DataLoader worker's: torch raises it again as text, the last line naming the exception
    worker = RuntimeError('Caught BadSample in DataLoader worker process 0.\nTraceback ...\n'
                          f'{BadSample.__module__}.BadSample: b.png: unreadable images: truncated')
    with pytest.raises(ToolStop, match=r'^validation stopped: b.png: unreadable images: truncated$'):
        with stop_on_bad_samples('validation', logged.append):
            raise worker
    assert logged == ['test stopped: a.png: unreadable images: truncated',
                      'validation stopped: b.png: unreadable images: truncated']
    with pytest.raises(RuntimeError, match='other'):
        with stop_on_bad_samples('test', logged.append):
            raise RuntimeError('other')


def assembled(tmp_path, tta=False, own_work_dir=None, **args):
    """The upernet recipe's test run (with ``own_work_dir`` as its config's) assembled with these
    tools/test.py arguments."""
    cfg = Config.fromfile(SEG)
    cfg.work_dir = own_work_dir
    if tta:
        use_tta(cfg)
    run = EvaluationRun(cfg, EvaluatedCheckpoint(str(tmp_path / 'iter_4.pth'), {}))
    out = args.pop('out', None)
    assemble_testing(run, argparse.Namespace(**{**dict(config=SEG, work_dir=None, launcher='none', show_dir=None),
                                                **args}), out)
    return cfg


def test_assemble_testing_takes_trainings_work_dir_rule_and_the_outputs(tmp_path):
    cfg = assembled(tmp_path, tta=True, out=str(tmp_path / 'preds.pkl'), show_dir=str(tmp_path / 'show'))
    assert cfg.work_dir == 'work_dirs/upernet_xcit_small_12_p16_160k_ade20k'
    assert cfg.load_from == str(tmp_path / 'iter_4.pth') and cfg.model.type == 'SegTTAModel'
    assert cfg.model.module.backbone.init_cfg is None  # the checkpoint holds every weight
    assert cfg.test_evaluator[-1].out_file_path == str(tmp_path / 'preds.pkl')
    assert cfg.custom_hooks[-1].type == 'ShowDirHook' and cfg.test_dataloader.dataset.type == 'StopOnBadSamples'
    assert assembled(tmp_path, own_work_dir='mine').work_dir == 'mine'
    assert assembled(tmp_path, own_work_dir='mine', work_dir='given').work_dir == 'given'
