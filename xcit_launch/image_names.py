"""The inputs and picture names of the inference tools (stdlib only: ``tools/infer.py`` and the
torch-free ``tools/deployment/infer_onnx.py`` name their files alike)."""
import os
from pathlib import Path
from typing import Iterator, List, Set


def list_inputs(inputs: List[str]) -> Iterator[str]:
    """Files as given; the files of a folder in name order (hidden ones skipped)."""
    for item in inputs:
        if os.path.isdir(item):
            yield from sorted(str(p) for p in Path(item).iterdir() if p.is_file()
                              and not p.name.startswith('.'))
        else:
            yield item


def picture_name(image_path: str, used: Set[str]) -> str:
    """The picture's file name for the image at ``image_path``, unique among ``used`` (which it joins)."""
    stem = Path(image_path).stem
    name, n = f'{stem}.png', 1
    while name in used:
        n += 1
        name = f'{stem}_{n}.png'
    used.add(name)
    return name
