"""Smoke run: build Mask R-CNN and UperNet on an XCiT backbone and run one image through each."""
import argparse
import time
from pathlib import Path

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import torch
from mmengine.logging import MMLogger

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.builder import build_model
from xcit_dense.inference import predict

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ['configs/_base_/models/mask_rcnn_xcit_p16.py', 'configs/_base_/models/upernet_xcit_p16.py']


def describe_prediction(result) -> str:
    if 'pred_instances' in result:
        inst = result.pred_instances
        return f'{len(inst)} detections, masks {tuple(inst.masks.shape)}'
    seg = result.pred_sem_seg.data
    return f'segmentation map {tuple(seg.shape)}, {seg.unique().numel()} classes present'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--size', type=int, nargs=2, default=(256, 320), metavar=('H', 'W'))
    parser.add_argument('--work-dir', default=str(ROOT / 'work_dirs' / 'smoke'),
                        help='where the log with the per-parameter init report goes')
    args = parser.parse_args()
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    MMLogger.get_instance('smoke', log_file=str(Path(args.work_dir) / 'smoke.log'))
    torch.manual_seed(0)
    image = torch.randint(0, 256, (3, *args.size), dtype=torch.uint8)
    for config in CONFIGS:
        start = time.perf_counter()
        model = build_model(str(ROOT / config)).eval()
        summary = describe_prediction(predict(model, image))
        print(f'[smoke] {config}: XCiT-{model.backbone.arch}/{model.backbone.patch_size} -> {summary} '
              f'({time.perf_counter() - start:.1f} s)')
    print('[smoke] OK')


if __name__ == '__main__':
    main()
