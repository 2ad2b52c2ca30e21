"""Files the toolkit writes into a work dir or an output folder, against a link planted at their names
(by whoever may create names in a shared folder): the file the link points to, outside the folder,
stays as it was, and the tool says in one line which name it refused. Each tool runs in this process
(a refusal needs no process of its own); the trained work dir is the session's."""
import os
import time
from pathlib import Path

import pytest
from helpers import CAP_CHOWN, has_capability, require_capability, run_tool_in_process, tiny_seg_config

KEEP = 'keep me'


def victim(tmp_path: Path) -> Path:
    """A file outside every folder the tools write to, which no write may touch."""
    path = tmp_path / 'elsewhere' / 'victim.txt'
    path.parent.mkdir()
    path.write_text(KEEP)
    return path


def refused(proc, name: Path) -> None:
    """The tool's status and its one-line refusal of ``name``, without a traceback."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    assert f'error: {name} is a symbolic link: the toolkit never writes through one' in proc.stderr, \
        proc.stderr[-3000:]


def test_training_writes_no_config_dump_through_a_link(tmp_path, seg_data):
    config, target = tiny_seg_config(tmp_path, seg_data), victim(tmp_path)
    work_dir = tmp_path / 'run'
    work_dir.mkdir()
    (work_dir / config.name).symlink_to(target)  # MMEngine dumps the config under its file's name
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, cwd=tmp_path)
    assert target.read_text() == KEEP
    refused(proc, work_dir / config.name)
    assert not list(work_dir.glob('iter_*.pth'))  # refused before training


@pytest.mark.parametrize('planted', ['link', "another user's folder"])
def test_training_opens_no_log_in_a_planted_log_folder(tmp_path, seg_data, planted):
    """The log folders of the coming two minutes (MMEngine names it by the second the run starts)
    planted as links to a folder elsewhere, or as folders of another user: the run stops before its
    log opens, and nothing is written there."""
    if planted != 'link':
        require_capability('chown', has_capability(CAP_CHOWN), 'giving a folder to another user needs CAP_CHOWN')
    config = tiny_seg_config(tmp_path, seg_data)
    elsewhere = victim(tmp_path).parent
    work_dir = tmp_path / 'run'
    work_dir.mkdir()
    start = time.time()
    folders = [work_dir / time.strftime('%Y%m%d_%H%M%S', time.localtime(start + s)) for s in range(120)]
    for folder in folders:
        if planted == 'link':
            folder.symlink_to(elsewhere)
        else:
            folder.mkdir(mode=0o777)
            os.chown(folder, 65534, 65534)  # nobody's, and writable by all
    proc = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, cwd=tmp_path)
    assert sorted(p.name for p in elsewhere.iterdir()) == ['victim.txt']
    assert (elsewhere / 'victim.txt').read_text() == KEEP
    assert not [p for folder in folders if not folder.is_symlink() for p in folder.iterdir()]
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    reason = 'is a symbolic link: the toolkit never writes through one' if planted == 'link' else \
        'belongs to another user (uid 65534)'
    assert reason in proc.stderr, proc.stderr[-3000:]


def test_infer_writes_no_picture_nor_results_through_a_link(tmp_path, seg_data, tiny_seg_run):
    config, work_dir = tiny_seg_run
    target = victim(tmp_path)
    image = next(iter(sorted((seg_data / 'images/validation').iterdir())))
    out = tmp_path / 'out'
    out.mkdir()
    picture, results = out / f'{image.stem}.png', out / 'results.json'
    picture.symlink_to(target)
    results.symlink_to(target)
    proc = run_tool_in_process('tools/infer.py', config, work_dir / 'iter_4.pth', image, '--out-dir', out,
                               cwd=tmp_path)
    assert target.read_text() == KEEP
    refused(proc, picture)  # reported as the picture's failure; the tool goes on to results.json
    refused(proc, results)
    assert picture.is_symlink() and results.is_symlink()


def test_test_tool_dumps_no_predictions_through_a_link(tmp_path, tiny_seg_run):
    config, work_dir = tiny_seg_run
    target = victim(tmp_path)
    out = tmp_path / 'preds.pkl'
    out.symlink_to(target)
    proc = run_tool_in_process('tools/test.py', config, work_dir / 'iter_4.pth', '--work-dir', tmp_path / 'eval',
                               '--out', out, cwd=tmp_path)
    assert target.read_text() == KEEP
    refused(proc, out)  # before the test runs


def test_plot_logs_writes_no_plot_through_a_link(tmp_path, tiny_seg_run):
    _, work_dir = tiny_seg_run
    target = victim(tmp_path)
    (work_dir / 'curves.png').symlink_to(target)
    proc = run_tool_in_process('tools/analysis_tools/plot_logs.py', work_dir, cwd=tmp_path)
    assert target.read_text() == KEEP
    refused(proc, work_dir / 'curves.png')


def test_onnx_export_writes_through_no_link(tmp_path, seg_data):
    config, target = tiny_seg_config(tmp_path, seg_data), victim(tmp_path)
    out = tmp_path / 'backbone.onnx'
    out.symlink_to(target)
    proc = run_tool_in_process('tools/deployment/export_onnx.py', config, out, '--shape', '64', '64', cwd=tmp_path)
    assert target.read_text() == KEEP
    refused(proc, out)  # before the trace
