"""xcit_dense/pictures.py: names unique per folder, boxes clipped to the picture, and a drawing that
fails reported instead of raised (tools/infer.py and tools/test.py --show-dir go on)."""
import numpy as np
import pytest
import torch
from mmengine.structures import InstanceData

from xcit_dense.pictures import clip_boxes, draw_picture, picture_name

pytestmark = pytest.mark.quick


def test_names_are_unique_per_folder():
    used = set()
    names = [picture_name(p, used) for p in ('a/voc.jpg', 'b/voc.png', 'voc', 'c/other.jpg', 'd/voc_2.jpg')]
    assert names == ['voc.png', 'voc_2.png', 'voc_3.png', 'other.png', 'voc_2_2.png']


def detection_sample(labels, boxes):
    from mmdet.structures import DetDataSample
    sample = DetDataSample()
    sample.pred_instances = InstanceData(bboxes=torch.tensor(boxes, dtype=torch.float32),
                                         labels=torch.tensor(labels), scores=torch.ones(len(labels)))
    return sample


def test_boxes_are_clipped_and_a_failed_drawing_is_reported(tmp_path):
    from mmdet.visualization import DetLocalVisualizer
    sample = detection_sample([0, 1], [[-5.0, 2.0, 70.0, 40.0], [10.0, -1.0, 20.0, 48.0]])
    clipped = clip_boxes(sample, 48, 64).pred_instances.bboxes
    assert clipped.tolist() == [[0.0, 2.0, 63.0, 40.0], [10.0, 0.0, 20.0, 47.0]]
    assert sample.pred_instances.bboxes[0, 0] == -5  # the given sample is unchanged
    visualizer = DetLocalVisualizer(name='test_pictures')
    visualizer.dataset_meta = dict(classes=('a', 'b', 'c'), palette=[(255, 0, 0), (0, 255, 0), (0, 0, 255)])
    image = np.zeros((48, 64, 3), np.uint8)
    assert draw_picture(visualizer, image, sample, str(tmp_path / 'ok.png'), draw_gt=False) is None
    assert (tmp_path / 'ok.png').stat().st_size > 0
    beyond = detection_sample([7], [[1.0, 1.0, 20.0, 20.0]])  # a class the 3 colours do not reach
    message = draw_picture(visualizer, image, beyond, str(tmp_path / 'beyond.png'), draw_gt=False)
    assert message.startswith(f'{tmp_path}/beyond.png: not drawn: AssertionError: The length of palette')
