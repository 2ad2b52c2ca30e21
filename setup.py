"""xcit-dense: XCiT backbones and configs for detection and segmentation on OpenMMLab 2.0."""
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
# what openmim reads from an installed package's .mim folder: `mim search` the model index (with the
# metafile it imports), `mim train` / `mim test` the configs and tools/train.py, tools/test.py
MIM_FILES = ('model-index.yml', 'configs', 'tools')


class BuildWithMim(build_py):
    """build_py that also copies MIM_FILES into xcit_dense/.mim/, as OpenMMLab's packages ship them."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / 'xcit_dense' / '.mim'
        for name in MIM_FILES:
            source, dest = HERE / name, target / name
            if dest.exists():
                shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, dest, ignore=shutil.ignore_patterns('__pycache__'))
            else:
                shutil.copy2(source, dest)


def read_requirements(name: str) -> list[str]:
    lines = (HERE / 'requirements' / name).read_text().splitlines()
    return [line.split('#')[0].strip() for line in lines if line.split('#')[0].strip()]


setup(
    name='xcit-dense',
    version='0.1.0',
    description='XCiT backbones for mmdet and mmseg (Mask R-CNN, UperNet, Semantic FPN)',
    long_description=(HERE / 'README.md').read_text(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['xcit_dense', 'xcit_dense.*', 'xcit_launch']),
    package_data={'xcit_dense.acceptance': ['ops_goldens.pt']},  # compiled mmcv's outputs, for the GPU check
    python_requires='>=3.10',
    install_requires=read_requirements('runtime.txt') + read_requirements('mmcv.txt'),
    extras_require={'tests': read_requirements('tests.txt')},
    license='Apache-2.0',
    cmdclass={'build_py': BuildWithMim},
)
