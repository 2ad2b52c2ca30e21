"""Convert an official XCiT ImageNet checkpoint (or a timm state dict) to this toolkit's layout.

The output holds ``{'state_dict': {'backbone.<key>': tensor}, 'meta': {...}}`` with only the
weights the dense backbone uses, and loads through ``init_cfg`` or ``load_from``. The input is
read with ``weights_only=True`` and checked against the preset before anything is written.
"""
import argparse
import os

import torch

from xcit_dense.checkpoint import read_checkpoint
from xcit_dense.models.checkpoint import load_backbone_weights, to_backbone_layout
from xcit_dense.models.presets import PATCH_SIZES, PRESETS
from xcit_dense.models.xcit import XCiT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('src', help='official .pth file (weights under "model") or timm state dict')
    parser.add_argument('dst', help='output .pth file')
    parser.add_argument('--arch', required=True, choices=list(PRESETS))
    parser.add_argument('--patch-size', type=int, required=True, choices=PATCH_SIZES)
    args = parser.parse_args()

    # Validates shapes and completeness against the preset; raises naming the keys otherwise.
    load_backbone_weights(XCiT(arch=args.arch, patch_size=args.patch_size), args.src,
                          allowed_missing=('fpn1.', 'fpn2.', 'fpn3.', 'fpn4.'))
    state, ignored = to_backbone_layout(read_checkpoint(args.src))
    out = {'state_dict': {f'backbone.{k}': v for k, v in state.items()},
           'meta': {'source': os.path.basename(args.src), 'arch': args.arch,
                    'patch_size': args.patch_size}}
    tmp = args.dst + '.tmp'
    torch.save(out, tmp)
    os.replace(tmp, args.dst)  # never leave a half-written file under the final name
    print(f'wrote {args.dst}: {len(state)} backbone tensors, {len(ignored)} keys dropped')


if __name__ == '__main__':
    main()
