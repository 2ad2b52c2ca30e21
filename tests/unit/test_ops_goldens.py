"""The golden outputs of compiled mmcv's ops (gpu_check/ops_goldens.py): the shipped file
against the installed ops on this CPU, the maker and the comparison, and planted mismatches."""
import pytest
import torch

from gpu_check import ops_goldens

# compiled mmcv's CPU RoIAlign reads a channels_last map as if it were contiguous (data_ptr): known,
# and exactly what the goldens are there to catch on a GPU
COMPILED_MMCV_WRONG = {'roi_align from channels_last features'}


def test_the_installed_ops_give_compiled_mmcvs_outputs_on_this_cpu():
    """With mmcv-lite these are the toolkit's torchvision-backed ops: equal to compiled mmcv 2.1.0's
    outputs (NMS indices exactly, RoIAlign forward and backward within 1e-4)."""
    goldens = ops_goldens.load_goldens()
    assert goldens['made_with'].startswith('mmcv 2.1.0 (compiled)')
    result = ops_goldens.compare(goldens, 'cpu')
    failed = {row['op'] for row in result['rows'] if not row['ok']}
    assert failed == (COMPILED_MMCV_WRONG if ops_goldens.compiled_mmcv() else set()), ops_goldens.failures(result)
    # compare()'s rows: 3 of NMS, RoIAlign forward and backward per variant, 2 channels_last, mask targets,
    # no RoIs, no boxes, and RoIAlign forward and backward of fp16 inputs (18 with the 4 variants)
    assert len(result['rows']) == 3 + 2 * len(ops_goldens.ROI_VARIANTS) + 2 + 3 + 2
    assert result['deterministic'] == 'same gradient twice'


def test_the_comparison_flags_a_planted_mismatch_and_keeps_ties_unjudged(tmp_path):
    goldens = ops_goldens.make_goldens(tmp_path / 'goldens.pt', require_compiled=False)
    assert goldens['made_with'].endswith('torch ' + torch.__version__ + ', CPU')
    expected_wrong = COMPILED_MMCV_WRONG if ops_goldens.compiled_mmcv() else set()
    result = ops_goldens.compare(ops_goldens.load_goldens(tmp_path / 'goldens.pt'), 'cpu')
    assert {row['op'] for row in result['rows'] if not row['ok']} == expected_wrong
    out = goldens['outputs']
    out['nms_keep'] = out['nms_keep'].flip(0)  # the same set in another order: an exact comparison fails
    out['roi_align_grad_False_2'] = out['roi_align_grad_False_2'] * (1 + 2e-4)
    out['roi_align_True_2'] = out['roi_align_True_2'] * (1 + 5e-5)  # within the tolerance
    out['nms_tied_keep'] = out['nms_tied_keep'][1:]  # ties are recorded, never judged
    result = ops_goldens.compare(goldens, 'cpu')
    failed = {row['op'] for row in result['rows'] if not row['ok']} - COMPILED_MMCV_WRONG
    assert failed == {'nms kept indices (unique scores)', 'roi_align backward aligned=False sampling=2'}
    assert not result['all_ok']
    assert any(f.startswith('nms kept indices (unique scores):') for f in ops_goldens.failures(result))


def test_goldens_are_made_from_compiled_mmcv_only(tmp_path):
    if ops_goldens.compiled_mmcv():
        pytest.skip('compiled mmcv is installed: the refusal is for mmcv-lite')
    with pytest.raises(RuntimeError, match='install it first'):
        ops_goldens.make_goldens(tmp_path / 'goldens.pt')
    assert not (tmp_path / 'goldens.pt').exists()


def test_nms_pairs_at_the_threshold_are_left_out_of_the_inputs():
    boxes = torch.tensor([[0., 0., 2., 1.], [0., 0., 1., 1.],         # IoU exactly 0.5
                          [10., 10., 12., 11.], [10., 10., 11.01, 11.],  # IoU 0.505
                          [20., 20., 21., 21.]])
    assert ops_goldens.clear_of_threshold(boxes, 0.5).tolist() == [False, False, True, True, True]
    assert ops_goldens.clear_of_threshold(boxes, 0.505, margin=1e-3).tolist() == [True, True, False, False, True]


def test_a_wrong_half_kernel_fails_the_rows_of_half_inputs_only(monkeypatch):
    """RoIAlign's fp16 kernel fed fp16 inputs, 5% off (beyond FP16_TOLERANCE): its rows fail, the
    float32 rows pass, and the report names NMS as compared in float32 only."""
    import mmcv.ops
    real = mmcv.ops.roi_align

    def wrong_in_half(feats, *args, **kwargs):
        out = real(feats, *args, **kwargs)
        return out * 1.05 if feats.dtype == torch.float16 else out

    monkeypatch.setattr(mmcv.ops, 'roi_align', wrong_in_half)
    result = ops_goldens.compare(ops_goldens.load_goldens(), 'cpu')
    failed = {row['op'] for row in result['rows'] if not row['ok']} - COMPILED_MMCV_WRONG
    assert failed == {'roi_align of fp16 inputs', 'roi_align backward of fp16 inputs'}
    assert {row['inputs'] for row in result['rows'] if row['op'].startswith('nms')} == {'float32'}
    assert 'nms' in result['float_only']
