"""Convert an XCiT checkpoint to this toolkit's layout: an official ImageNet checkpoint (or a timm
state dict) to backbone weights, or one of the authors' released detectors / segmentors whole.

A backbone file becomes ``{'state_dict': {'backbone.<key>': tensor}, 'meta': {...}}`` with only the
weights the dense backbone uses, checked against ``--arch`` / ``--patch-size`` before anything is
written. A released Mask R-CNN, Semantic FPN or UperNet file (mmcv 1.3, ``backbone.pos_embeder.*``)
keeps every weight under this toolkit's names, its classes (and palette) as ``meta['dataset_meta']``,
and drops the optimizer and amp entries; each renamed key is printed. Inputs are read weights only; the
output is written atomically (a temporary file under a random name, renamed into place).
"""
import argparse
import os
import sys

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.io.checkpoint import CheckpointError, load_weights_only, write_checkpoint
from xcit_dense.io.weights import (
    backbone_signature,
    from_released_layout,
    is_released_layout,
    load_backbone_weights,
    read_checkpoint,
    to_backbone_layout,
)
from xcit_dense.models.presets import PATCH_SIZES, PRESETS
from xcit_dense.models.xcit import XCiT
from xcit_dense.tool_errors import exit_status, stop_on


def convert_released(raw: dict, src: str, dst: str) -> None:
    """A released detector / segmentor, whole, printing what was mapped and what was dropped."""
    out, renamed = from_released_layout(raw)
    for old, new in renamed:
        print(f'mapped {old} -> {new}')
    state = out['state_dict']
    dropped = [k for k in raw if k not in out]
    classes = out['meta'].get('dataset_meta', {}).get('classes', ())
    out['meta'] = dict(dataset_meta=out['meta'].get('dataset_meta', {}), source=os.path.basename(src))
    write_checkpoint(out, dst)
    print(f'wrote {dst}: {len(state)} tensors ({len(renamed)} renamed, {len(state) - len(renamed)} under '
          f'their own names), XCiT backbone of {backbone_signature(state)}, {len(classes)} classes; '
          f'dropped {", ".join(dropped) or "nothing"}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='official .pth file (weights under "model"), timm state dict, or '
                                    'a released maskrcnn_/sem_fpn_/upernet_xcit_* file')
    parser.add_argument('dst', help='output .pth file')
    parser.add_argument('--arch', choices=list(PRESETS), help='backbone files only')
    parser.add_argument('--patch-size', type=int, choices=PATCH_SIZES, help='backbone files only')
    args = parser.parse_args()
    with stop_on(CheckpointError):  # a file that cannot be read or does not fit: the reason, no traceback
        raw = load_weights_only(args.src)
        if isinstance(raw, dict) and is_released_layout(raw):
            convert_released(raw, args.src, args.dst)
            return
        if args.arch is None or args.patch_size is None:
            parser.error('--arch and --patch-size are needed for a backbone (ImageNet) checkpoint')
        # Validates shapes and completeness against the preset; raises naming the keys otherwise.
        load_backbone_weights(XCiT(arch=args.arch, patch_size=args.patch_size), args.src,
                              allowed_missing=('fpn1.', 'fpn2.', 'fpn3.', 'fpn4.'))
        state, ignored = to_backbone_layout(read_checkpoint(args.src))
        out = {'state_dict': {f'backbone.{k}': v for k, v in state.items()},
               'meta': {'source': os.path.basename(args.src), 'arch': args.arch,
                        'patch_size': args.patch_size}}
        write_checkpoint(out, args.dst)
        print(f'wrote {args.dst}: {len(state)} backbone tensors, {len(ignored)} keys dropped')


if __name__ == '__main__':
    sys.exit(exit_status(main))
