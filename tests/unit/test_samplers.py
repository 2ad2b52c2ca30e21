"""The toolkit's samplers: started at a batch they give the uninterrupted pass's later batches
(mmdet's aspect-ratio grouping kept) without producing the earlier ones, and each sample's
augmentation follows from the seed, the epoch and the sample whichever worker or rank loads it."""
import hashlib
import itertools
import multiprocessing

import numpy as np
import pytest
import torch
from mmdet.datasets.samplers import AspectRatioBatchSampler
from mmengine.runner import Runner
from torch.utils.data import Dataset

from xcit_dense.datasets.aspect_ratio import ResumableAspectRatioBatchSampler
from xcit_dense.datasets.samplers import ResumableInfiniteSampler, ResumableSampler


class Sizes(Dataset):
    """Images known by their sizes alone (what aspect-ratio grouping reads); loading one fails."""

    def __init__(self, count: int) -> None:
        rng = np.random.default_rng(0)
        self.infos = [dict(width=int(w), height=int(h)) for w, h in rng.integers(32, 96, (count, 2))]

    def __len__(self) -> int:
        return len(self.infos)

    def get_data_info(self, index: int) -> dict:
        return self.infos[index]

    def __getitem__(self, index: int):
        raise AssertionError('a batch sampler must not load samples')


@pytest.mark.parametrize('epoch', [0, 3])
def test_aspect_ratio_batches_from_any_start_are_the_uninterrupted_ones(epoch):
    sampler = ResumableSampler(Sizes(23), seed=5)
    sampler.set_epoch(epoch)
    whole = [list(map(int, batch)) for batch in AspectRatioBatchSampler(sampler, batch_size=3)]
    assert len({tuple(sorted(b)) for b in whole}) == len(whole) == 8  # (some groups mixed at the end)
    batches = ResumableAspectRatioBatchSampler(sampler, batch_size=3)
    next(iter(batches))  # a pass abandoned after its first batch leaves nothing behind
    for start in range(len(whole) + 1):
        batches.start_at(start)
        resumed = [[(int(i), i.epoch) for i in batch] for batch in batches]
        assert resumed == [[(i, epoch) for i in batch] for batch in whole[start:]], start
    assert len(batches) == len(whole)  # the loops number an epoch's batches by it


def test_the_endless_stream_is_dealt_to_the_ranks_and_starts_anywhere():
    def stream(rank: int, world: int, start: int = 0, count: int = 30):
        sampler = ResumableInfiniteSampler(Sizes(7), seed=3)
        sampler.rank, sampler.world_size = rank, world  # (what get_dist_info gives a rank of a group)
        sampler.start_at(start)
        return [(int(i), i.epoch) for i in itertools.islice(sampler, count)]
    single = stream(0, 1, count=120)
    assert [sorted(i for i, _ in single[p * 7:p * 7 + 7]) for p in range(8)] == [list(range(7))] * 8
    assert single[:7] != single[7:14]  # each pass shuffled anew
    dealt = [x for pair in zip(stream(0, 2), stream(1, 2)) for x in pair]
    assert dealt == single[:60]
    for start in (0, 5, 11):  # each rank's samples of the stream taken so far
        assert stream(1, 2, start) == single[start * 2 + 1::2][:30]


PIPELINE = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'),
            dict(type='RandomResize', scale=(64, 64), ratio_range=(0.5, 2.0), keep_ratio=True),
            dict(type='RandomCrop', crop_size=(40, 40)), dict(type='RandomFlip', prob=0.5),
            dict(type='PhotoMetricDistortion'), dict(type='PackSegInputs')]


def augmentations(seg_data, workers: int, epochs: int = 2) -> dict:
    """{(epoch, image): a digest of its augmented pixels and labels} over ``epochs`` epochs of a
    ResumableSampler loader in this process's rank."""
    loader = Runner.build_dataloader(dict(
        batch_size=2, num_workers=workers, persistent_workers=workers > 0,
        sampler=dict(type='ResumableSampler', shuffle=True),
        dataset=dict(type='BaseSegDataset', data_root=str(seg_data), img_suffix='.jpg', seg_map_suffix='.png',
                     data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
                     pipeline=PIPELINE)), seed=11)
    seen = {}
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            for inputs, sample in zip(batch['inputs'], batch['data_samples']):
                digest = hashlib.sha1(inputs.numpy().tobytes() + sample.gt_sem_seg.data.numpy().tobytes())
                seen[epoch, sample.img_path.rsplit('/', 1)[-1]] = digest.hexdigest()
    return seen


def _rank(rank: int, seg_data, rendezvous: str, results) -> None:
    """One of two processes of a gloo group: its share of the samples, loaded in the process."""
    torch.distributed.init_process_group('gloo', init_method=f'file://{rendezvous}', rank=rank, world_size=2)
    try:
        results.put(augmentations(seg_data, workers=0))
    finally:
        torch.distributed.destroy_process_group()


def test_a_sample_is_augmented_alike_by_any_worker_and_rank(seg_data, tmp_path):
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    single = augmentations(seg_data, workers=0)
    assert len(single) == 16 and len(set(single.values())) == 16  # every sample and epoch its own
    assert augmentations(seg_data, workers=2) == single
    context = multiprocessing.get_context('fork')  # two real ranks, this process's imports shared
    results = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, seg_data, str(tmp_path / 'rendezvous'), results))
             for r in range(2)]
    for process in ranks:
        process.start()
    try:
        shares = [results.get(timeout=120) for _ in ranks]
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert [len(share) for share in shares] == [8, 8] and {**shares[0], **shares[1]} == single
