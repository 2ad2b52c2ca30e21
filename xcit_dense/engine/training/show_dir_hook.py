"""tools/test.py --show-dir: each test image drawn with its predictions and ground truth.

mmdet's and mmseg's visualization hooks name and place the pictures differently (mmdet: the
image's file name, mmseg: ``vis_data/vis_image/test_<file name>_0.png``), overwrite images of the
same name, decode the image with EXIF orientation applied whatever the pipeline does, and stop the
test when drawing fails. This hook draws both tasks the way tools/infer.py does
(``xcit_dense.pictures``): ``<stem>.png`` in one folder, on the image as the pipeline decoded it.
"""
import os
from typing import Optional, Sequence

import mmcv
from mmengine import fileio
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...pictures import draw_picture, picture_name


@HOOKS.register_module()
class ShowDirHook(Hook):
    """Draw every test sample into ``out_dir``; ``color_type`` is the test pipeline's loader's,
    ``score_thr`` the lowest score drawn (detection; None for segmentation). A picture that cannot
    be drawn is logged as a warning and the test goes on."""

    priority = 'LOW'

    def __init__(self, out_dir: str, color_type: str = 'color', score_thr: Optional[float] = None) -> None:
        self.out_dir, self.color_type, self.score_thr = out_dir, color_type, score_thr
        self._used: set = set()

    def before_test(self, runner) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        self._used = set()

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs: Optional[Sequence] = None) -> None:
        options = {} if self.score_thr is None else dict(pred_score_thr=self.score_thr)
        for sample in outputs or ():
            image = mmcv.imfrombytes(fileio.get(sample.img_path), flag=self.color_type, channel_order='rgb')
            out_file = os.path.join(self.out_dir, picture_name(sample.img_path, self._used))
            not_drawn = draw_picture(runner.visualizer, image, sample, out_file, **options)
            if not_drawn:
                runner.logger.warning(not_drawn)
