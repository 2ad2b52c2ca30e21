"""ONNX Runtime against PyTorch on the CPU: the demos' Mask R-CNN and UperNet with random weights, per
image through tools/deployment/infer_onnx.py's path (xcit_launch: resize, normalise, the exported graph,
masks pasted or logits resized) and through tools/infer.py's (the stock inferencer's test pipeline and
model), the two called in turn on each image, their order swapped every round.

  python -m benchmarks onnx_runtime [--images 8] [--rounds 4] [--size 128]

Both runtimes use their default threads (all cores). Each model is exported first (minutes: not
timed). Prints a markdown table: per model the median seconds an image in each runtime, images per
second, and ONNX Runtime's ratio to PyTorch (the project's target: 1.3 or more on 2 cores).
"""
import argparse
import os
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

MODELS = {'Mask R-CNN (demo)': 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py',
          'UperNet (demo)': 'configs/demo/upernet_xcit_tiny_12_p16_demo.py'}
TARGET_RATIO = 1.3


def runtimes(config: str, size: int, folder: str) -> Dict[str, Callable[[np.ndarray], object]]:
    """The config's model with random weights, exported to ONNX and saved as a checkpoint: a BGR
    image's prediction by ONNX Runtime (infer_onnx.py's) and by PyTorch (infer.py's)."""
    from xcit_dense.analysis.onnx_export import export_config
    from xcit_dense.inference import build_inferencer, predict_image
    from xcit_launch.onnx_detection import open_exported
    path, weights = os.path.join(folder, 'model.onnx'), os.path.join(folder, 'model.pth')
    module = export_config(config, path, (size, size), whole=True)
    torch.save({'state_dict': module.model.state_dict()}, weights)
    inferencer = build_inferencer(config, weights, device='cpu')
    exported = open_exported(path)
    return {'PyTorch': lambda image: predict_image(inferencer, image), 'ONNX Runtime': exported.predict}


def measure(calls: Dict[str, Callable[[np.ndarray], object]], images: List[np.ndarray],
            rounds: int) -> Dict[str, float]:
    """The median seconds an image of each call, after one warm-up call each; the calls alternate per
    image, their order swapped every round."""
    for call in calls.values():
        call(images[0])
    times: Dict[str, List[float]] = {name: [] for name in calls}
    for number in range(rounds):
        order = list(calls) if number % 2 == 0 else list(calls)[::-1]
        for image in images:
            for name in order:
                start = time.perf_counter()
                calls[name](image)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--images', type=int, default=8, help='random images of the demo size')
    parser.add_argument('--rounds', type=int, default=4)
    parser.add_argument('--size', type=int, default=128, help="the images' side (the demos': 128)")
    args = parser.parse_args(argv)
    gen = np.random.default_rng(0)
    images = [gen.integers(0, 256, (args.size, args.size, 3), np.uint8) for _ in range(args.images)]
    rows = []
    for name, config in MODELS.items():
        with tempfile.TemporaryDirectory() as folder:
            seconds = measure(runtimes(config, args.size, folder), images, args.rounds)
        ratio = seconds['PyTorch'] / seconds['ONNX Runtime']
        rows.append(f"| {name} | {seconds['PyTorch']:.4f} | {1 / seconds['PyTorch']:.1f} | "
                    f"{seconds['ONNX Runtime']:.4f} | {1 / seconds['ONNX Runtime']:.1f} | {ratio:.2f} "
                    f"({'meets' if ratio >= TARGET_RATIO else 'below'} {TARGET_RATIO}) |")
    print(f'{args.images} images of {args.size}x{args.size}, {args.rounds} rounds, torch threads '
          f'{torch.get_num_threads()}\n')
    print('| model | PyTorch s/image | PyTorch images/s | ONNX Runtime s/image | ONNX Runtime images/s | ratio |')
    print('|---|---|---|---|---|---|')
    print('\n'.join(rows))
    return 0
