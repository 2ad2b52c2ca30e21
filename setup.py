"""xcit-dense: XCiT backbones and configs for detection and segmentation on OpenMMLab 2.0."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def read_requirements(name: str) -> list[str]:
    lines = (HERE / 'requirements' / name).read_text().splitlines()
    return [line.split('#')[0].strip() for line in lines if line.split('#')[0].strip()]


setup(
    name='xcit-dense',
    version='0.1.0',
    description='XCiT backbones for mmdet and mmseg (Mask R-CNN, UperNet, Semantic FPN)',
    long_description=(HERE / 'README.md').read_text(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['xcit_dense', 'xcit_dense.*']),
    python_requires='>=3.10',
    install_requires=read_requirements('runtime.txt') + read_requirements('mmcv.txt'),
    extras_require={'tests': read_requirements('tests.txt')},
    license='Apache-2.0',
)
