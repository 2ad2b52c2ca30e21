"""Run a segmentor or Mask R-CNN exported by tools/deployment/export_onnx.py --whole on your own images, with
onnxruntime, numpy and OpenCV only (no torch, mmengine, mmcv, mmseg or mmdet: a server needs none of them).

As tools/infer.py does: for each image (a file, or every file of a folder) a picture goes to
OUT_DIR/<stem>.png (<stem>_2.png, ... where names repeat), the label map over the image in the model's
palette, or the detections scoring --score-thr or more (masks and boxes), and its segments or
instances (every detection) to OUT_DIR/results.json (docs/datasets.md; ``model`` names the file where
tools/infer.py names the config and checkpoint). The resizing, normalisation, classes, palette and
mask threshold come from the file's metadata. A file that is missing, not an image, over --max-bytes
on disk or over --max-pixels is reported and skipped; the exit status is 1 if any input failed.
Nothing is written through a link.
"""
import argparse
import json
import os
import sys
from pathlib import Path

from xcit_launch.entry_point import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, OPENCV_LIMIT_VAR, prepare_process
from xcit_launch.image_names import list_inputs, picture_name
from xcit_launch.linkless_writes import UnsafeOutput, write_bytes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('model', help='the .onnx file of tools/deployment/export_onnx.py --whole '
                                      '(a segmentor or Mask R-CNN)')
    parser.add_argument('inputs', nargs='+', help='image files and/or folders of images')
    parser.add_argument('--out', default='work_dirs/infer_onnx', help='where pictures and results.json go')
    parser.add_argument('--limit', type=int, help='process at most this many images')
    parser.add_argument('--min-size', type=int, default=384,
                        help='pictures of smaller images are enlarged to this short side')
    parser.add_argument('--max-size', type=int, default=2048, help='... but never beyond this long side')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections drawn from this score up (results.json keeps all)')
    parser.add_argument('--overlap-iou', type=float, default=0.7,  # tools/infer.py's (xcit_dense.inference)
                        help='of drawn boxes overlapping at a higher IoU, only the best scoring is drawn (1: all)')
    parser.add_argument('--max-pixels', type=int, default=DEFAULT_MAX_PIXELS,
                        help="images whose header declares more pixels are refused by OpenCV's decoder")
    parser.add_argument('--max-bytes', type=int, default=DEFAULT_MAX_BYTES,
                        help='image files larger than this on disk are refused before they are opened')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    os.environ[OPENCV_LIMIT_VAR] = str(args.max_pixels)  # read once, when OpenCV loads (below)
    prepare_process()
    from xcit_launch.onnx_detection import DetectionModel, draw_detections, drawn, instances, open_exported
    from xcit_launch.onnx_segmentation import overlay, png_bytes, read_image, segments

    if not os.path.isfile(args.model):
        sys.exit(f'error: model file not found: {args.model}')
    try:
        model = open_exported(args.model)
    except ValueError as exc:
        sys.exit(f'error: {exc}')
    detector = isinstance(model, DetectionModel)
    out_dir = Path(args.out)
    inputs = list(list_inputs(args.inputs))[:args.limit]
    results, used, done, failures = [], set(), 0, 0
    for path in inputs:
        try:
            image = read_image(path, args.max_bytes)
        except (FileNotFoundError, ValueError) as exc:
            print(f'error: {exc}', file=sys.stderr)
            results.append(dict(image=path, error=str(exc)))
            failures += 1
            continue
        prediction = model.predict(image)
        if detector:
            found = dict(instances=instances(prediction, model.classes))
            drawing = draw_detections(image, prediction, drawn(prediction, args.score_thr, args.overlap_iou),
                                      model.meta['palette'], args.min_size, args.max_size)
        else:
            found = dict(segments=segments(prediction, model.classes))
            drawing = overlay(image, prediction, model.meta['palette'], args.min_size, args.max_size)
        picture = str(out_dir / picture_name(path, used))
        try:
            write_bytes(picture, png_bytes(drawing))
            shown, done = dict(picture=picture), done + 1
        except (UnsafeOutput, ValueError) as exc:  # its predictions are kept
            print(f'error: {exc}', file=sys.stderr)
            shown, failures = dict(error=str(exc)), failures + 1
        results.append(dict(image=path, height=image.shape[0], width=image.shape[1], **shown, **found))
    summary = dict(model=args.model, task='detection' if detector else 'segmentation', classes=model.classes,
                   images=results)
    try:
        write_bytes(out_dir / 'results.json', json.dumps(summary).encode())
    except UnsafeOutput as exc:
        sys.exit(f'error: {exc}')
    print(f'{done} of {len(inputs)} images done: pictures and results.json in {out_dir}')
    if failures:
        sys.exit(f'{failures} input(s) failed: see the errors above')


if __name__ == '__main__':
    main()
