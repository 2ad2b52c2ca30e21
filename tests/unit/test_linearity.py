"""The linearity check and the per-operator profile: their figures and verdicts (no timings checked)."""
import pytest

from benchmarks.linearity import linearity_check, summary, verdicts
from benchmarks.profile_ops import growth_markdown, make_blocks, module_times


def _result(low_ms: float, high_ms: float, timm_high_ms: float, low_mb: float, high_mb: float) -> dict:
    return dict(arch='small_12', patch_size=16, low=1024, high=1600, rounds=5, threads=2, load=[1.0, 1.2],
                times_ms={'ours@1024': low_ms, 'timm@1024': low_ms, 'ours@1600': high_ms, 'timm@1600': timm_high_ms},
                pixel_ratio=2.44140625, time_growth=high_ms / low_ms, timm_time_growth=timm_high_ms / low_ms,
                speedup=timm_high_ms / high_ms, memory_mb={1024: low_mb, 1600: high_mb},
                memory_growth=high_mb / low_mb)


def test_verdicts_and_summary_state_each_limit():
    good = _result(1000, 2600, 3200, 100, 250)
    assert verdicts(good) == dict(time_growth=True, speedup=True, memory_growth=True)
    text = summary(good)
    assert 'time growth 1024^2 -> 1600^2: x2.60 (timm x3.20); pixels x2.44, limit x2.69: met' in text
    assert 'speed-up over timm at 1600^2: 1.23x (target >= 1.20x): met' in text
    assert 'x2.50; within 10% of the pixel ratio: x2.20-x2.69: met' in text
    bad = _result(1000, 2700, 3000, 100, 300)
    assert verdicts(bad) == dict(time_growth=False, speedup=False, memory_growth=False)
    assert summary(bad).count('NOT met') == 3


def test_linearity_check_runs_at_tiny_sizes():
    result = linearity_check(low=32, high=48, rounds=1, threads=1)
    assert result['pixel_ratio'] == pytest.approx(2.25)
    assert set(result['times_ms']) == {'ours@32', 'timm@32', 'ours@48', 'timm@48'}
    assert result['memory_mb'][48] > result['memory_mb'][32] > 0
    assert set(verdicts(result)) == {'time_growth', 'speedup', 'memory_growth'}


def test_profile_tables_give_times_and_growth_beside_the_pixel_ratio():
    blocks = make_blocks(dims=32, heads=4)
    times = module_times(blocks, resolutions=(64, 128), rounds=1)
    assert set(times) == {'timm', 'ours'} and set(times['ours'][128]) == {'XCA', 'LPI', 'MLP', 'block'}
    text = growth_markdown({512: {'aten::gelu': 2.0, 'aten::tiny': 0.1}, 1024: {'aten::gelu': 9.0, 'aten::tiny': 0.2}},
                           'title')
    assert '| op | 512^2 (1024 tok) ms | 1024^2 (4096 tok) ms | x 512->1024 (pixels x4.00) |' in text
    assert '| aten::gelu | 2.0 | 9.0 | x4.50 |' in text and 'aten::tiny' not in text
