"""xcit-dense: XCiT backbones and configs for detection and segmentation on OpenMMLab 2.0."""
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
# what openmim reads from an installed package's .mim folder: `mim search` the model index (with the
# metafile it imports), `mim train` / `mim test` the configs and tools/train.py, tools/test.py
MIM_FILES = ('model-index.yml', 'configs', 'tools')
# installs xcit_mmcv_ext's finder of mmcv._ext at interpreter start (xcit_mmcv_ext/finder.py says why)
PTH_FILE = HERE / 'xcit_mmcv_ext' / 'xcit_mmcv_ext.pth'


class BuildWithMim(build_py):
    """build_py that also copies MIM_FILES into xcit_dense/.mim/, as OpenMMLab's packages ship them,
    and PTH_FILE to the top of the install (site-packages), where Python runs it at start."""

    def run(self) -> None:
        super().run()
        # a wheel is made of build_lib; an editable one (pip install -e) of install_lib's folder
        top = self.get_finalized_command('install').install_lib if self.editable_mode else self.build_lib
        shutil.copy2(PTH_FILE, Path(top) / PTH_FILE.name)
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
    packages=find_packages(include=['xcit_dense', 'xcit_dense.*', 'xcit_launch', 'xcit_mmcv_ext']),
    python_requires='>=3.10',
    # mmcv is not required here: tools/install.sh installs mmcv-lite (mmcv._ext from xcit_mmcv_ext) or,
    # with XCIT_MMCV=compiled, mmcv built with its ops; two distributions of one folder, never both
    install_requires=read_requirements('runtime.txt'),
    extras_require={'tests': read_requirements('tests.txt')},
    license='Apache-2.0',
    cmdclass={'build_py': BuildWithMim},
)
