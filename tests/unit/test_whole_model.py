"""The whole-model benchmark's measuring code on a tiny Mask R-CNN at 64x96: per-part forward and
backward times, and peak tensor memory, come out with the parts and the sizes they should have."""
import pytest
import torch

from benchmarks import whole_model
from benchmarks.whole_model import PartTimer, WholeModel, backward_aten_seconds, backward_node_seconds, side_by_side

C = 32  # channels of the tiny model's neck and heads
TINY = {'model.backbone.depth': 4, 'model.backbone.out_indices': [0, 1, 2, 3],
        'model.neck.out_channels': C, 'model.rpn_head.in_channels': C, 'model.rpn_head.feat_channels': C,
        'model.roi_head.bbox_roi_extractor.out_channels': C, 'model.roi_head.bbox_head.in_channels': C,
        'model.roi_head.bbox_head.fc_out_channels': 64, 'model.roi_head.mask_roi_extractor.out_channels': C,
        'model.roi_head.mask_head.in_channels': C, 'model.roi_head.mask_head.conv_out_channels': C,
        'model.train_cfg.rcnn.sampler.num': 64, 'model.train_cfg.rpn_proposal.max_per_img': 100}


@pytest.fixture(scope='module')
def detector():
    return WholeModel('mask_rcnn_xcit_t12_p16', (64, 96), 1, instances=2, options=TINY)


def test_a_part_run_inside_another_counts_only_in_the_inner_one(monkeypatch):
    now = [100.0]  # the timer's clock, advanced by hand
    monkeypatch.setattr(whole_model.time, 'perf_counter', lambda: now[0])
    timer = PartTimer()
    with timer.part('outer'):
        now[0] += 2
        with timer.part('inner'):
            now[0] += 5
        now[0] += 1
    assert timer.seconds == {'outer': 3, 'inner': 5}


def test_training_step_and_inference_are_timed_per_part(detector):
    assert detector.model.backbone.depth == 4 and tuple(detector.inputs.shape) == (1, 3, 64, 96)
    train = side_by_side([detector], 'train', rounds=1, warmup=0, log=lambda _: None)[detector.name]
    assert set(train) == {'backbone', 'neck', 'rpn_head', 'loss', 'roi_head', 'backward', 'optimizer', 'other',
                          'total'}
    assert all(train[k] > 0 for k in train if k != 'other')
    assert sum(v for k, v in train.items() if k != 'total') == pytest.approx(train['total'], rel=1e-6)
    assert train['other'] >= 0  # the parts lie inside the step (their shares are timings: the benchmark's)
    infer = detector.step('infer')
    assert set(infer) == {'backbone', 'neck', 'rpn_head', 'roi_head', 'other', 'total'}


def test_backward_is_split_where_the_forward_built_it(detector):
    backward = detector.backward_parts()
    assert {'backbone', 'neck', 'rpn_head', 'roi_head', 'loss'} <= set(backward) <= {
        'backbone', 'neck', 'rpn_head', 'roi_head', 'loss', 'other'}
    assert all(v >= 0 for v in backward.values())
    assert backward['backbone'] > 0 and backward['neck'] > 0  # each part's nodes found (shares: timings)


def test_backward_per_node_and_operator(detector):
    """benchmarks/backward_ops.py's two views of one profiled step: nodes named by their forward
    operator in the part that built them (XCiT's MLP node in the backbone), and the ATen kernels
    inside the backward only (not the pyramid's forward max pooling)."""
    prof = detector.profiled_step()
    nodes = backward_node_seconds(prof.profiler.kineto_results.events())
    assert ('backbone', 'GeluLinearBackward') in nodes and ('neck', 'ConvolutionBackward0') in nodes
    assert not any(node.startswith('aten::') for _, node in nodes)
    kinds = {part: {node for p, node in nodes if p == part} for part in ('backbone', 'neck')}
    assert len(kinds['backbone']) > len(kinds['neck'])  # counted node kinds: XCiT's blocks against the FPN
    aten = backward_aten_seconds(prof.events())
    assert 'aten::convolution_backward' in aten and 'aten::max_pool2d_with_indices' not in aten
    assert sum(aten.values()) > 0  # how they compare with the nodes' times is a timing, not checked here


def test_peak_tensor_memory_of_a_step(detector):
    train = detector.peak_tensor_bytes('train')
    assert 1e6 < train < 2e9
    assert detector.state_bytes() == 16 * detector.params


def test_fixed_proposals_make_the_positive_rois_independent_of_the_weights(detector):
    counts = []
    detector.fixed_proposals = True
    for seed in (0, 1):
        torch.manual_seed(seed)
        for p in detector.model.rpn_head.parameters():
            torch.nn.init.normal_(p, std=0.5)
        detector.step('loss')
        counts.append(detector.positive_rois)
    detector.fixed_proposals = False
    assert counts == [16, 16]  # the sampler's cap: a quarter of its 64 RoIs


def test_fixed_proposals_reach_the_roi_heads_at_inference(detector, monkeypatch):
    seen = []
    predict = detector.model.roi_head.predict_bbox
    monkeypatch.setattr(detector.model.roi_head, 'predict_bbox', lambda x, metas, proposals, *args, **kwargs:
                        seen.append(proposals) or predict(x, metas, proposals, *args, **kwargs))
    detector.fixed_proposals = True
    try:
        detector.step('infer')
    finally:
        detector.fixed_proposals = False
    detector.model.eval()
    want = detector._fixed(seen[0][0], 0)
    assert len(want) == detector.model.test_cfg.rpn.max_per_img
    torch.testing.assert_close(seen[0][0].bboxes, want.bboxes)


def test_batches_are_padded_as_the_data_preprocessor_pads_them():
    odd = WholeModel('mask_rcnn_xcit_t12_p16', (50, 70), 1, instances=2, options=TINY)
    assert odd.inputs.shape[-2:] == (64, 96)  # DetDataPreprocessor's pad_size_divisor=32
    assert odd.samples[0].img_shape == (50, 70) and odd.samples[0].batch_input_shape == (64, 96)
    assert odd.samples[0].gt_instances.masks.masks.shape[-2:] == (64, 96)
