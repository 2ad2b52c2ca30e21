"""``python -m benchmarks NAME [OPTIONS]``, from the checkout's root: the one entry point of the
benchmarks (``python -m benchmarks NAME --help`` gives a benchmark's options; without NAME, the list).
Each prints its table and writes its files where its options say; benchmarks/reports/ holds the
figures measured so far."""
import importlib
import sys
from typing import List, Optional

# name: (module with ``main(argv)``, what it measures)
BENCHMARKS = {
    'backbones': ('benchmarks.run_backbones', 'speed and peak memory of XCiT and the alternatives against image size'),
    'whole_models': ('benchmarks.run_whole_models', "the recipe's whole models beside the stock Swin-T ones"),
    'overhead': ('benchmarks.run_overhead', "the toolkit's own overhead per training iteration"),
    'data_pipeline': ('benchmarks.run_data_pipeline', "the COCO recipe's training pipeline per data worker"),
    'coco_eval': ('benchmarks.run_coco_eval', "COCO evaluation: the toolkit's metric against mmdet's"),
    'mmcv_ext': ('benchmarks.run_mmcv_ext', "the kernels behind mmcv._ext against a compiled mmcv's"),
    'onnx_runtime': ('benchmarks.run_onnx_runtime', "the demos' models in ONNX Runtime against PyTorch on the CPU"),
}


def usage() -> str:
    return 'usage: python -m benchmarks NAME [OPTIONS]\n\n' + '\n'.join(
        f'  {name:<14} {what}' for name, (_, what) in BENCHMARKS.items())


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (['-h'], ['--help']):
        print(usage())
        return 0
    if not argv:
        print(f'error: name a benchmark\n\n{usage()}', file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f'error: no benchmark named {name!r}\n\n{usage()}', file=sys.stderr)
        return 2
    status = importlib.import_module(BENCHMARKS[name][0]).main(rest)
    return int(status or 0)


if __name__ == '__main__':
    sys.exit(main())
