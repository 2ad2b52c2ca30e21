"""Print the parameter count of every XCiT preset (backbone with its pyramid adapter).

The paper counts the ImageNet classifier: the same patch embedding and blocks plus a class
token, two class-attention blocks and a 1000-class head. The "classifier" column builds timm's
XCiT of the same preset to give that figure beside this toolkit's dense backbone.
With ``--configs``, it counts the whole detectors and segmentors of the given config files.
"""
import argparse
import os

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import timm
import torch

import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.builder import build_model
from xcit_dense.models.presets import PATCH_SIZES, PRESETS
from xcit_dense.models.xcit import XCiT


def millions(module) -> float:
    return sum(p.numel() for p in module.parameters()) / 1e6


def count_configs(paths: list) -> None:
    """Parameters of each config's whole model (pretrained loading off) and its parts."""
    print('| config | total (M) | backbone (M) | neck (M) | heads (M) |')
    print('|---|---|---|---|---|')
    for path in paths:
        model = build_model(path, {'model.backbone.init_cfg': None}, init=False)
        backbone = millions(model.backbone)
        neck = millions(model.neck) if getattr(model, 'neck', None) is not None else 0.0
        total = millions(model)
        print(f'| {os.path.basename(path)} | {total:.2f} | {backbone:.2f} | {neck:.2f} '
              f'| {total - backbone - neck:.2f} |')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--arch', nargs='*', default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument('--patch-size', nargs='*', type=int, default=list(PATCH_SIZES), choices=PATCH_SIZES)
    parser.add_argument('--configs', nargs='+', metavar='CONFIG',
                        help='count the models of these config files instead of the presets')
    args = parser.parse_args()
    if args.configs:
        count_configs(args.configs)
        return
    print('| arch | patch | D | depth | heads | eta | dense backbone (M) | of which pyramid (M) '
          '| classifier, as in the paper (M) |')
    print('|---|---|---|---|---|---|---|---|---|')
    for arch in args.arch:
        for patch in args.patch_size:
            with torch.device('meta'):  # shapes only: no memory, no weight initialisation
                model = XCiT(arch=arch, patch_size=patch)
                classifier = millions(timm.create_model(f'xcit_{arch}_p{patch}_224', pretrained=False))
            pyramid = sum(millions(getattr(model, f'fpn{i}')) for i in range(1, 5))
            preset = PRESETS[arch]
            print(f'| {arch} | {patch} | {preset.embed_dims} | {preset.depth} | {preset.num_heads} '
                  f'| {preset.eta:g} | {millions(model):.2f} '
                  f'| {pyramid:.2f} | {classifier:.2f} |')


if __name__ == '__main__':
    main()
