"""The pure arithmetic of `python -m benchmarks overhead` and `... data_pipeline` (no timing)."""
import json

import numpy as np
import pytest

from benchmarks.data_pipeline import instance_count
from benchmarks.overhead import (
    per_iteration,
    read_iteration_times,
    relative_cost,
    stamped_iteration_times,
    workers_per_gpu,
)


def test_workers_per_gpu():
    assert workers_per_gpu(2, 0.3, 20.0) == 1          # 6.7 images/s from a 20 images/s worker
    assert workers_per_gpu(2, 0.1, 6.0) == 4           # 20 images/s: 3.33 workers -> 4
    assert workers_per_gpu(2, 0.2, 5.0) == 2           # exactly 2 workers' worth: not 3
    assert workers_per_gpu(2, 0.3, 20.0, margin=4) == 2
    with pytest.raises(ValueError, match='images per step, step time, worker rate and margin must be positive'):
        workers_per_gpu(2, 0.0, 20.0)


def test_relative_cost_and_per_iteration():
    assert relative_cost([1.01, 1.02, 5.0], [1.0, 1.0, 0.5]) == pytest.approx(0.02)
    assert per_iteration(dict(iterations=4, totals={'hook/A': 0.4})) == {'hook/A': pytest.approx(0.1)}


def test_read_iteration_times_skips_first_and_non_training(tmp_path):
    log = tmp_path / '20260101_000000' / 'vis_data' / 'scalars.json'
    log.parent.mkdir(parents=True)
    records = [dict(iter=i, time=float(i), loss=1.0) for i in range(1, 6)] + [dict(step=1, coco=0.5)]
    log.write_text('\n'.join(json.dumps(r) for r in records))
    assert read_iteration_times(str(tmp_path), skip=2) == [3.0, 4.0, 5.0]


def test_stamped_iteration_times_are_the_gaps_between_iteration_ends():
    report = dict(ends=[10.0, 11.0, 13.0, 16.0, 20.0])  # iterations 1-5 ended at these moments
    assert stamped_iteration_times(report, skip=2) == [2.0, 3.0, 4.0]  # iterations 3, 4 and 5
    assert stamped_iteration_times(report, skip=0) == [1.0, 2.0, 3.0, 4.0]  # iteration 1 has no start


def test_instance_counts_are_coco_like():
    rng = np.random.default_rng(0)
    counts = [instance_count(rng) for _ in range(4000)]
    assert min(counts) >= 1 and max(counts) <= 60
    assert 6.5 < np.mean(counts) < 8.0 and max(counts) > 20
