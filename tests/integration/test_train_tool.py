"""tools/train.py for real (one process): the plan line and gradient accumulation."""
import torch
from helpers import ROOT, run_tool_in_process, tiny_seg_config


def train(config, *runs):
    """tools/train.py run once per (work dir, arguments) in this process (run_tool_in_process: the
    weights are compared among these runs only, all under this process's threads); each run's output."""
    outputs = []
    for work_dir, *args in runs:
        proc = run_tool_in_process('tools/train.py', config, '--work-dir', work_dir, *args, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        outputs.append(proc.stdout + proc.stderr)
    return outputs


def final_weights(work_dir):
    last = (work_dir / 'last_checkpoint').read_text().strip()
    return torch.load(last, map_location='cpu', weights_only=False)['state_dict']


def test_accumulation_matches_a_bigger_batch_and_lr_scaling_and_amp_fall_back(tmp_path, seg_data):
    """4 optimizer steps of batch 4 == 4 optimizer steps of batch 2 with accumulation 2, both with
    --scale-lr (the same effective batch: the same LR) and --amp bf16, which falls back to fp32 on a CPU."""
    # plain SGD: unlike Adam, its steps are proportional to the gradient, so a wrongly
    # scaled accumulated gradient shows
    sgd = dict(optimizer=dict(_delete_=True, type='SGD', lr=0.05, momentum=0.9, weight_decay=0.0))
    config = tiny_seg_config(tmp_path, seg_data, optim_wrapper=sgd)
    scaled = ('--scale-lr', '--amp', 'bf16')
    # the check can fail: 4 steps of batch 2 without accumulation (at the LR scaled for batch 4) end elsewhere
    log_big, log_acc, _ = train(config, (tmp_path / 'big', *scaled, '--cfg-options', 'train_dataloader.batch_size=4'),
                                (tmp_path / 'acc', *scaled, '--accumulation', '2'),
                                (tmp_path / 'small', '--cfg-options', 'optim_wrapper.optimizer.lr=0.0125'))
    assert 'world size 1, 4 images per GPU, accumulation 1, effective batch 4' in log_big
    assert 'world size 1, 2 images per GPU, accumulation 2, effective batch 4' in log_acc
    for log in (log_big, log_acc):  # 0.05 x effective batch 4 / the recipe's reference batch 16
        assert 'effective batch 4 (reference 16), lr 0.0125 (scale x0.25)' in log
        assert 'no GPU: training in fp32' in log
    # the iteration loop counts micro-iterations: 8 of them make the recipe's 4 steps
    assert 'Iter(train) [8/8]' in log_acc and 'Iter(train) [4/4]' in log_big
    big, acc = final_weights(tmp_path / 'big'), final_weights(tmp_path / 'acc')
    for key, value in big.items():
        torch.testing.assert_close(acc[key], value, rtol=1e-4, atol=1e-6, msg=key)
    small = final_weights(tmp_path / 'small')
    assert max((small[k] - big[k]).abs().max().item() for k in big) > 1e-3


def test_train_then_test_with_outputs(tmp_path, tiny_seg_run):
    config, work_dir = tiny_seg_run  # trained once for the session by tools/train.py
    checkpoint = work_dir / 'iter_4.pth'
    proc = run_tool_in_process('tools/test.py', config, checkpoint, '--work-dir', tmp_path / 'eval',
                               '--out', tmp_path / 'preds.pkl', '--show-dir', tmp_path / 'show', cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'mIoU' in proc.stdout + proc.stderr
    # the weights named once: the toolkit's line, not MMEngine's bare "Loads checkpoint by local backend"
    assert f'weights: {checkpoint} (trained without an average)' in proc.stdout
    assert 'Loads checkpoint by' not in proc.stdout + proc.stderr
    assert (tmp_path / 'preds.pkl').stat().st_size > 0
    assert len(list((tmp_path / 'show').rglob('*.png'))) == 4


def test_test_tool_refuses_a_checkpoint_of_another_model(tmp_path, seg_data):
    config = tiny_seg_config(tmp_path, seg_data)
    torch.save({'state_dict': {'backbone.foo': torch.zeros(1)}}, tmp_path / 'other.pth')
    proc = run_tool_in_process('tools/test.py', config, tmp_path / 'other.pth', cwd=tmp_path)
    assert proc.returncode != 0 and 'saved from a different model' in proc.stderr
    assert 'Traceback' not in proc.stderr
