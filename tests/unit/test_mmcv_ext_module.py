"""How ``mmcv._ext`` is found without compiled mmcv: xcit_mmcv_ext's finder (installed by the
distribution's .pth file) in processes that never import xcit_dense, its errors when broken, and
the names it leaves out raising with the op's name and the install that has it."""
import importlib.metadata
import subprocess
import sys
import sysconfig
import textwrap

import pytest
import torch

from xcit_mmcv_ext import finder
from xcit_mmcv_ext.left_out import LEFT_OUT, left_out_op

LITE = any(dist.metadata['Name'] == 'mmcv-lite' for dist in importlib.metadata.distributions())
lite_only = pytest.mark.skipif(not LITE, reason='compiled mmcv installed (XCIT_MMCV=compiled): its own _ext serves')


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a launched interpreter importing mmdet: pays back the served ops' unit tests in the main stage
@lite_only
def test_a_process_without_the_toolkit_imports_every_mmcv_op_and_mmdet():
    """mmdet's and mmseg's own tools import mmcv's ops without xcit_dense. Planted: a .pth line that
    does not install the finder, or a module that lacks a name some mmcv.ops module lists."""
    result = python('''
        import pkgutil, sys
        import mmcv.ops
        for module in pkgutil.iter_modules(mmcv.ops.__path__):
            __import__(f'mmcv.ops.{module.name}')
        import mmdet.models
        from mmengine.utils.dl_utils import mmcv_full_available
        from mmcv.utils import collect_env
        import inspect, mmcv._ext
        inspect.getmodule(mmcv._ext.nms)
        print(mmcv_full_available(), mmcv._ext.__file__, 'xcit_dense' in sys.modules, collect_env()['MMCV Compiler'])
    ''')
    assert result.returncode == 0, result.stderr
    available, path, toolkit_imported, compiler = result.stdout.split(maxsplit=3)
    assert (available, toolkit_imported) == ('True', 'False')
    assert path.endswith('xcit_mmcv_ext/ext_module.py') and compiler.startswith('not compiled')


@lite_only
def test_a_broken_ext_says_what_failed_and_how_to_repair():
    """Planted: a loader that lets torchvision's ImportError through unexplained."""
    result = python('''
        import sys
        sys.modules['torchvision'] = None
        import mmcv.ops
    ''')
    assert result.returncode != 0
    assert 'mmcv._ext is served by xcit-dense' in result.stderr and 'bash tools/install.sh' in result.stderr


def test_the_pth_file_is_part_of_the_distribution():
    """pip uninstall xcit-dense removes what its RECORD lists; the finder goes with it."""
    installed = importlib.metadata.distributions(name='xcit-dense', path=[sysconfig.get_paths()['purelib']])
    assert any(str(path) == 'xcit_mmcv_ext.pth' for dist in installed for path in dist.files)


def test_the_finder_comes_after_pythons_path_finder_and_serves_mmcv_2_1_only(monkeypatch):
    """A compiled mmcv's own _ext is found first. Planted: a finder inserted at the front of
    sys.meta_path, or one serving any mmcv version, fails here."""
    finder.install()
    finder.install()
    ours = [i for i, f in enumerate(sys.meta_path) if isinstance(f, finder.MmcvExtFinder)]
    path_finder = sys.meta_path.index(importlib.machinery.PathFinder)
    assert len(ours) == 1 and ours[0] > path_finder
    assert finder.MmcvExtFinder().find_spec('mmcv.other', None) is None
    import mmcv
    monkeypatch.setattr(mmcv, '__version__', '2.2.0')
    with pytest.raises(ImportError, match=r'serves mmcv._ext for mmcv 2\.1\.x, but mmcv 2\.2\.0'):
        finder.MmcvExtFinder().find_spec('mmcv._ext', None)


def test_a_left_out_op_raises_naming_itself_its_stock_configs_and_the_compiled_install():
    """Planted: a stub that returns None, one that does not name its op or the configs that need it,
    or a served op still listed as left out."""
    from xcit_mmcv_ext.ext_module import SERVED
    assert len(set(LEFT_OUT)) == len(LEFT_OUT) and not set(SERVED) & set(LEFT_OUT)
    with pytest.raises(NotImplementedError, match=r"'upfirdn2d' needs compiled mmcv.*no mmdet 3.3.0 or mmseg "
                                                  r"1.2.2 config.*XCIT_MMCV=compiled bash tools/install.sh"):
        left_out_op('upfirdn2d')(torch.zeros(1))
    if LITE:
        from mmcv.ops import CARAFEPack
        with pytest.raises(NotImplementedError, match="'carafe_forward' needs compiled mmcv.*mmdet configs/carafe"):
            CARAFEPack(4, 2)(torch.zeros(1, 4, 4, 4))
