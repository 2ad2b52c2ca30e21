"""``checkpoint_due`` answers as MMEngine's CheckpointHook saves: iteration schedules after the
iteration, epoch schedules at their epoch's last batch, ``save_begin`` and ``save_last`` included."""
from types import SimpleNamespace

import pytest
from mmengine.hooks import CheckpointHook, Hook

from xcit_dense.engine.distributed.checkpoint_schedule import checkpoint_due

BATCHES = 4  # per epoch


def runner_at(hooks, iteration=0, epoch=0, max_iters=100, max_epochs=10):
    return SimpleNamespace(hooks=[Hook(), *hooks], iter=iteration, epoch=epoch, max_iters=max_iters,
                           max_epochs=max_epochs, train_dataloader=range(BATCHES))


@pytest.mark.parametrize('iteration, due', [(0, False), (2, True), (3, False), (5, True), (97, False)])
def test_an_iteration_schedule_saves_every_interval(iteration, due):
    runner = runner_at([CheckpointHook(interval=3, by_epoch=False, save_last=False)], iteration)
    assert checkpoint_due(runner, batch_idx=BATCHES - 1) is due  # (the epoch's end does not count)


@pytest.mark.parametrize('iteration, due', [(2, False), (4, True), (7, True), (8, False), (98, False), (99, True)])
def test_an_iteration_schedule_starts_at_save_begin_and_saves_last(iteration, due):
    runner = runner_at([CheckpointHook(interval=3, by_epoch=False, save_begin=5)], iteration)
    assert checkpoint_due(runner, batch_idx=0) is due


@pytest.mark.parametrize('epoch, batch_idx, due', [
    (3, BATCHES - 1, True), (3, 0, False), (0, BATCHES - 1, False), (2, BATCHES - 1, False),
    (7, BATCHES - 1, True), (8, BATCHES - 1, False), (9, BATCHES - 1, True), (9, BATCHES - 2, False)])
def test_an_epoch_schedule_saves_at_its_epochs_last_batch(epoch, batch_idx, due):
    runner = runner_at([CheckpointHook(interval=4, by_epoch=True)], iteration=epoch * BATCHES + batch_idx,
                       epoch=epoch)
    assert checkpoint_due(runner, batch_idx) is due


@pytest.mark.parametrize('epoch, due', [(0, False), (2, False), (3, True), (7, False), (8, True), (9, False)])
def test_an_epoch_schedule_starts_at_save_begin_without_save_last(epoch, due):
    runner = runner_at([CheckpointHook(interval=5, by_epoch=True, save_begin=4, save_last=False)], epoch=epoch)
    assert checkpoint_due(runner, batch_idx=BATCHES - 1) is due


def test_no_checkpoint_hook_saves_nothing():
    assert not checkpoint_due(runner_at([], iteration=99), batch_idx=BATCHES - 1)
