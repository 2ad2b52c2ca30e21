"""Run a segmentor exported by tools/deployment/export_onnx.py --whole on your own images, with onnxruntime,
numpy and OpenCV only (no torch, mmengine, mmcv, mmseg or mmdet: a server needs none of them).

As tools/infer.py does for segmentation: for each image (a file, or every file of a folder) a
picture of the label map over the image in the model's palette goes to OUT_DIR/<stem>.png
(<stem>_2.png, ... where names repeat), and its segments to OUT_DIR/results.json (docs/datasets.md;
``model`` names the file where tools/infer.py names the config and checkpoint). The resizing,
normalisation, classes and palette come from the file's metadata. A file that is missing, not an
image, over --max-bytes on disk or over --max-pixels is reported and skipped; the exit status is 1 if
any input failed. Nothing is written through a link.
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
    parser.add_argument('model', help='the .onnx file of tools/deployment/export_onnx.py --whole (a segmentor)')
    parser.add_argument('inputs', nargs='+', help='image files and/or folders of images')
    parser.add_argument('--out', default='work_dirs/infer_onnx', help='where pictures and results.json go')
    parser.add_argument('--limit', type=int, help='process at most this many images')
    parser.add_argument('--min-size', type=int, default=384,
                        help='pictures of smaller images are enlarged to this short side')
    parser.add_argument('--max-size', type=int, default=2048, help='... but never beyond this long side')
    parser.add_argument('--max-pixels', type=int, default=DEFAULT_MAX_PIXELS,
                        help="images whose header declares more pixels are refused by OpenCV's decoder")
    parser.add_argument('--max-bytes', type=int, default=DEFAULT_MAX_BYTES,
                        help='image files larger than this on disk are refused before they are opened')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    os.environ[OPENCV_LIMIT_VAR] = str(args.max_pixels)  # read once, when OpenCV loads (below)
    prepare_process()
    from xcit_launch.onnx_segmentation import SegmentationModel, overlay, png_bytes, read_image, segments

    if not os.path.isfile(args.model):
        sys.exit(f'error: model file not found: {args.model}')
    try:
        model = SegmentationModel(args.model)
    except ValueError as exc:
        sys.exit(f'error: {exc}')
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
        labels = model.predict(image)
        picture = str(out_dir / picture_name(path, used))
        try:
            write_bytes(picture, png_bytes(overlay(image, labels, model.meta['palette'], args.min_size,
                                                   args.max_size)))
            drawn, done = dict(picture=picture), done + 1
        except (UnsafeOutput, ValueError) as exc:  # its segments are kept
            print(f'error: {exc}', file=sys.stderr)
            drawn, failures = dict(error=str(exc)), failures + 1
        results.append(dict(image=path, height=image.shape[0], width=image.shape[1], **drawn,
                            segments=segments(labels, model.classes)))
    summary = dict(model=args.model, task='segmentation', classes=model.classes, images=results)
    try:
        write_bytes(out_dir / 'results.json', json.dumps(summary).encode())
    except UnsafeOutput as exc:
        sys.exit(f'error: {exc}')
    print(f'{done} of {len(inputs)} images done: pictures and results.json in {out_dir}')
    if failures:
        sys.exit(f'{failures} input(s) failed: see the errors above')


if __name__ == '__main__':
    main()
