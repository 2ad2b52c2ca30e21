"""The GPU check's fast-vs-plain step (gpu_check/fast_vs_plain.py) at its tiny size on the CPU: it trains
both models in both dtypes, finds them equal (a float16 first step that overflows left out), and finds a
fast layer that is off by 5%."""
import pytest
import torch

from gpu_check.fast_vs_plain import fast_vs_plain
from xcit_dense.models.fast import fast_layers

pytestmark = pytest.mark.slow  # it trains (four steps per model and dtype)


def test_fast_and_plain_agree_and_are_timed_an_overflowing_first_step_left_out():
    """The scaler's first scale, 2^17, overflows the tiny model's float16 gradients (2^16 does not, by
    a factor of two): that step is skipped, said so, and the next, at 2^16, compared."""
    result = fast_vs_plain(torch.device('cpu'), tiny=True, steps=2, init_scale=2.0 ** 17)
    assert result['failed_checks'] == []
    for name in ('bf16', 'fp16'):
        run = result[name]
        assert run['loss_fast'] > 0 and run['grad_difference'] < 2e-2, run
        assert run['step_s_fast'] > 0 and run['step_s_plain'] > 0 and run['peak_bytes_plain'] is None
        assert run['non_finite_gradients'] == []
    assert result['bf16']['skipped_steps'] == []
    assert result['fp16']['skipped_steps'] == [
        'loss scale 131072: plain, fast overflowed, step skipped and not compared']
    assert isinstance(result['fast_default'], bool)


def test_a_fast_layer_off_by_five_percent_fails(monkeypatch):
    forward = fast_layers.FastMlp.forward
    monkeypatch.setattr(fast_layers.FastMlp, 'forward', lambda self, *a, **k: 1.05 * forward(self, *a, **k))
    result = fast_vs_plain(torch.device('cpu'), tiny=True, steps=2)
    assert any('gradients differ' in reason for reason in result['failed_checks']), result
    assert result['fast_default'] is False
