"""Checkpoint faults, provoked for real: truncation, a kill while saving, crafted pickles, a full
or read-only disk. Nothing that was saved before may be lost."""
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoint_attacks import PLANTED_MISFITS, PLANTED_VALUES, key_of, planted, with_config_texts, zip_of
from helpers import (
    ROOT,
    can_chattr,
    hide_payload,
    hooked_config,
    launch_env,
    pause_hook,
    require_capability,
    run,
    run_together,
    run_tool_in_process,
    spawned,
    tiny_seg_config,
    train_cmd,
    wait_for,
)
from PIL import Image

from xcit_dense.io.checkpoint import read_checkpoint_file
from xcit_dense.io.weights import read_checkpoint


@pytest.fixture
def trained(tmp_path, seg_data, tiny_seg_run):
    """A copy of the session's trained work dir (checkpoints at iterations 2 and 4) for one test to
    damage, and its config extended to 6 iterations."""
    _, work_dir = tiny_seg_run
    return hooked_config(tmp_path, seg_data, max_iters=6, interval=2), work_dir


def refused_in_process(config, work_dir, *args):
    """tools/train.py --resume ARGS on work_dir, in this process (its refusals come before a Runner is
    built): the exit status and stderr, which must hold no traceback."""
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, '--resume', *args,
                               cwd=work_dir.parent)
    assert proc.returncode != 0
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize('cut', ['zero', 'random'])
def test_resume_from_a_truncated_file_names_it(trained, cut):
    config, work_dir = trained
    path = work_dir / 'iter_4.pth'
    data = path.read_bytes()
    path.write_bytes(b'' if cut == 'zero' else data[:random.Random(0).randrange(1, len(data) - 1)])
    proc = refused_in_process(config, work_dir, path)
    assert 'cannot resume' in proc.stderr and 'iter_4.pth' in proc.stderr


def test_auto_resume_falls_back_to_the_newest_checkpoint_that_loads(trained):
    config, work_dir = trained
    (work_dir / 'iter_4.pth').write_bytes((work_dir / 'iter_4.pth').read_bytes()[:1000])
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, '--resume',  # its status and
                               cwd=work_dir.parent)  # log tell: no process of its own
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = proc.stdout + proc.stderr
    assert 'cannot read checkpoint' in log and 'iter_4.pth' in log
    assert 'resuming from' in log and 'iter_2.pth, the newest checkpoint that loads' in log
    assert 'resumed epoch: 0, iter: 2' in log and 'Iter(train) [6/6]' in log


def test_a_checkpoint_written_before_rng_states_still_resumes(trained):
    """Checkpoints hold one RNG state per rank, readable weights-only; one without them resumes."""
    config, work_dir = trained
    path = work_dir / 'iter_4.pth'
    states = read_checkpoint(str(path))['meta']['rng_states']
    assert len(states) == 1 and set(states[0]) >= {'python', 'numpy', 'torch'}
    old = torch.load(path, weights_only=False)
    del old['meta']['rng_states']
    torch.save(old, path)
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, '--resume', path,  # its status
                               cwd=work_dir.parent)  # and log tell: no process of its own
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = proc.stdout + proc.stderr
    assert log.count('RNG state was not in the checkpoint') == 1 and 'Iter(train) [6/6]' in log


def test_auto_resume_never_starts_from_scratch_when_all_are_broken(trained):
    config, work_dir = trained
    for path in work_dir.glob('iter_*.pth'):
        path.write_bytes(b'')
    proc = refused_in_process(config, work_dir)
    assert 'no checkpoint in' in proc.stderr and 'can be loaded' in proc.stderr


def test_kill_while_saving_keeps_the_previous_checkpoint(tmp_path, seg_data):
    """Killed while it saves iter_4.pth (its fsync stalls until then), the run leaves iter_2.pth whole
    and pointed at, no iter_4.pth, and resumes from it."""
    config = tiny_seg_config(
        tmp_path, seg_data,
        custom_imports=dict(imports=['xcit_dense', 'launch_hooks'], allow_failed_imports=False),
        custom_hooks=[dict(type='StallFsyncHook', from_iter=3)],  # the second save only
        train_cfg=dict(max_iters=4, val_interval=4),
        default_hooks=dict(checkpoint=dict(interval=2), logger=dict(interval=1), visualization=dict(draw=False)))
    work_dir = tmp_path / 'run'
    with spawned(train_cmd(config, work_dir), env=launch_env(), stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL) as proc:
        wait_for(work_dir / 'fsync_stalled', proc)  # the second save is under way
        assert list(work_dir.glob('iter_4.pth.tmp-*'))
    assert not (work_dir / 'iter_4.pth').exists()
    assert (work_dir / 'last_checkpoint').read_text().strip() == str(work_dir / 'iter_2.pth')
    state = torch.load(work_dir / 'iter_2.pth', weights_only=False)
    assert state['meta']['iter'] == 2
    resumed = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, '--resume',  # saves at speed
                                  '--cfg-options', 'custom_hooks=[]', cwd=tmp_path)  # no process of its own
    assert resumed.returncode == 0 and 'resumed epoch: 0, iter: 2' in resumed.stdout + resumed.stderr


def test_crafted_checkpoint_never_runs_code_in_any_tool(tmp_path, trained_tiny_seg):
    """The payload hides in the meta of a real trained checkpoint (the getattr chain that the old
    allow-list let through); every tool refuses the file before any of it is unpickled."""
    config, source = trained_tiny_seg
    marker = tmp_path / 'pwned'
    evil = hide_payload(source / 'iter_4.pth', marker, tmp_path / 'evil.pth')
    planted = tmp_path / 'planted'
    planted.mkdir()
    hide_payload(source / 'iter_4.pth', marker, planted / 'iter_9.pth')
    pretrained = tmp_path / 'pretrained.py'
    pretrained.write_text(f"_base_ = ['{config}']\nmodel = dict(backbone=dict(init_cfg=dict("
                          f"_delete_=True, type='Pretrained', checkpoint='{evil}')))\n")
    # the refusals before a Runner is built run in this process; those after it, as processes
    in_process = {
        'train --resume FILE': ('tools/train.py', config, '--work-dir', tmp_path / 'run', '--resume', evil),
        'train --resume (a planted iter_9.pth)': ('tools/train.py', config, '--work-dir', planted, '--resume'),
        'convert': ('tools/model_converters/convert_xcit_checkpoint.py', evil, tmp_path / 'out.pth',
                    '--arch', 'tiny_12',
                    '--patch-size', '16'),
    }
    commands = {
        'test.py': [sys.executable, str(ROOT / 'tools/test.py'), str(config), str(evil)],
        'pretrained init': train_cmd(pretrained, tmp_path / 'run2'),
    }
    results = {name: run_tool_in_process(*args, cwd=tmp_path) for name, args in in_process.items()}
    launched = run_together(*(dict(args=cmd, cwd=tmp_path) for cmd in commands.values()))  # independent
    results.update(zip(commands, launched))
    for name, proc in results.items():
        assert proc.returncode != 0, name
        assert 'could run code' in proc.stderr, (name, proc.stderr[-1500:])
        assert 'evil.pth' in proc.stderr or 'iter_9.pth' in proc.stderr, name
        assert 'Traceback' not in proc.stderr, (name, proc.stderr[-1500:])
        assert not marker.exists(), name


def test_a_config_text_in_the_resumed_checkpoint_never_runs_nor_spreads(tmp_path, seg_data, tiny_seg_run):
    """Issue 63: Python in the meta['config'] of the file --resume names (MMEngine's Runner.resume ran
    it), in its meta['cfg'] and in its message hub's runtime_info['cfg'] (which a resume copied into the
    run's message hub, so into every later checkpoint): the run resumes, nothing runs, and the
    checkpoint it saves holds the run's own config text only."""
    _, work_dir = tiny_seg_run
    config = hooked_config(tmp_path, seg_data, max_iters=5, interval=2)
    marker = tmp_path / 'pwned'
    torch.save(with_config_texts(read_checkpoint_file(str(work_dir / 'iter_4.pth')), marker), tmp_path / 'c.pth')
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, '--resume', tmp_path / 'c.pth',
                               cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert not marker.exists()
    assert 'resumed epoch: 0, iter: 4' in log and 'Iter(train) [5/5]' in log, log[-3000:]
    saved = read_checkpoint_file(str(work_dir / 'iter_5.pth'))
    own = [saved['meta']['cfg'], saved['message_hub']['runtime_info']['cfg']]  # MMEngine writes the run's text
    assert all('pwned' not in text and 'max_iters=5' in text for text in own) and 'config' not in saved['meta']


def test_a_planted_newest_checkpoint_with_a_config_text_resumes_without_running_it(tmp_path, tiny_seg_run):
    """The same file planted in the work dir as the newest checkpoint, beside the good iter_2.pth: a bare
    --resume picks it, and resumes from it (at the end of the run's 4 iterations) without running it.
    Newer still, issue 63's planted values (a seed of 'x' or 2**70, a message hub that is a string, an
    optimizer without groups, a weight named backbone.blocks.x.y, a tensor in the meta, a torch RNG state of 'x'
    or of 65536 bytes), each in the real
    checkpoint's meta and message hub: each was chosen and ended the run with a traceback; now each is
    named with its key and skipped. So are plain values that do not fit the run (PLANTED_MISFITS: a weight
    or an optimizer state of another shape, NaN weights, a parameter group fewer, a scheduler the config
    does not have), which were chosen and ended the run."""
    config, work_dir = tiny_seg_run
    marker = tmp_path / 'pwned'
    real = read_checkpoint_file(str(work_dir / 'iter_4.pth'))
    torch.save(with_config_texts(real, marker), work_dir / 'iter_4.pth')
    cases = {**PLANTED_VALUES, **PLANTED_MISFITS}
    for number, case in enumerate(cases, start=10):  # (4.5 MB each)
        torch.save(planted(dict(real, meta=dict(real['meta'], iter=number)), case), work_dir / f'iter_{number}.pth')
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, '--resume', cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert not marker.exists()
    assert 'resumed epoch: 0, iter: 4' in log, log[-3000:]
    for number, (case, (_, reason)) in enumerate(cases.items(), start=10):
        named = [line for line in log.splitlines() if f'iter_{number}.pth' in line]
        assert any(reason in line for line in named), (case, named)


@pytest.fixture
def small_disk(tmp_path):
    """A small tmpfs: room for the first checkpoint, not for a second one next to it."""
    mount = tmp_path / 'disk'
    mount.mkdir()
    mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=6m', 'tmpfs', str(mount)], capture_output=True)
    require_capability('tmpfs', mounted.returncode == 0, 'cannot mount a tmpfs here (needs root)')
    yield mount
    subprocess.run(['umount', '-l', str(mount)], capture_output=True)


def test_disk_full_at_save_time(tmp_path, seg_data, small_disk):
    config = hooked_config(tmp_path, seg_data, max_iters=8, interval=2)
    work_dir = small_disk / 'run'
    proc = run(train_cmd(config, work_dir))
    assert proc.returncode != 0
    assert 'cannot write' in proc.stderr and 'No space left on device' in proc.stderr
    assert 'Traceback' not in proc.stderr.split('error:')[-1]
    pointer = (work_dir / 'last_checkpoint').read_text().strip()
    good = torch.load(pointer, weights_only=False)  # the last good checkpoint is whole
    assert good['meta']['iter'] >= 2


def test_unwritable_work_dir_at_save_time(tmp_path, seg_data):
    """The work dir becomes immutable mid-run (chattr +i: root ignores permission bits), while the run
    waits after its first checkpoint; its second save fails with the reason, the first one kept."""
    require_capability('chattr', can_chattr(), 'chattr +i needs CAP_LINUX_IMMUTABLE, chattr and a file system '
                                               'with file attributes')
    pause = pause_hook(tmp_path, after_iter=2)
    config = hooked_config(tmp_path, seg_data, max_iters=4, interval=2, hooks=[pause])
    work_dir = tmp_path / 'run'
    with spawned(train_cmd(config, work_dir), env=launch_env(), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True) as proc:
        wait_for(Path(pause['ready']), proc)
        try:
            chattr = subprocess.run(['chattr', '+i', str(work_dir)], capture_output=True, text=True)
            assert chattr.returncode == 0, chattr.stderr
            Path(pause['go']).touch()
            _, err = proc.communicate(timeout=600)
        finally:
            subprocess.run(['chattr', '-i', str(work_dir)], capture_output=True)
    assert proc.returncode != 0
    assert 'cannot write' in err and 'Operation not permitted' in err
    assert torch.load(work_dir / 'iter_2.pth', weights_only=False)['meta']['iter'] == 2
    assert (work_dir / 'last_checkpoint').read_text().strip() == str(work_dir / 'iter_2.pth')


@pytest.mark.slow
def test_a_planted_newest_checkpoint_is_skipped_by_a_resume_and_refused_by_infer(tmp_path, trained):
    """Issue 47: a 200 KB file whose deep dict key crashed the process (SIGSEGV) when hashed, planted as
    the newest checkpoint of the work dir: the auto-resume names it and continues from iter_4.pth;
    tools/infer.py refuses it with a short message naming it."""
    config, work_dir = trained
    planted = zip_of(work_dir / 'iter_9.pth', key_of(pickle.EMPTY_TUPLE + pickle.TUPLE1 * 200_000))
    proc = run(train_cmd(config, work_dir, '--resume'))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert 'iter_9.pth' in log and 'nested more than 64 deep' in log, log[-3000:]
    assert 'iter_4.pth, the newest checkpoint that loads' in log and 'Iter(train) [6/6]' in log
    image = tmp_path / 'image.png'
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    infer = run([sys.executable, str(ROOT / 'tools/infer.py'), str(config), str(planted), str(image),
                 '--out-dir', str(tmp_path / 'out'), '--device', 'cpu'], cwd=tmp_path)
    assert infer.returncode == 1, (infer.returncode, infer.stderr[-2000:])  # a signal: negative
    error = infer.stderr.strip().splitlines()[-1]
    assert error.startswith('error: ') and 'iter_9.pth' in error and 'nested more than 64 deep' in error, error
    assert len(error) < 1000
