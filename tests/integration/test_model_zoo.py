"""The model zoo (configs/xcit/README.md, configs/xcit/metafile.yml, model-index.yml) against the
configs and against the paper's table, written here so that the two files cannot agree and both be wrong."""
import re

import yaml
from helpers import ROOT

ZOO = ROOT / 'configs' / 'xcit'
SIZES = {'T12': 'tiny_12', 'S12': 'small_12', 'S24': 'small_24', 'M24': 'medium_24'}
# the paper's results (COCO val2017 box / mask AP, ADE20K val single-scale mIoU), patch 16 then 8
PAPER_COCO = {'T12': ((42.7, 38.5), (44.5, 40.3)), 'S12': ((45.3, 40.8), (47.0, 42.3)),
              'S24': ((46.5, 41.8), (48.1, 43.0)), 'M24': ((46.7, 42.0), (48.5, 43.7))}
PAPER_SEM_FPN = {'T12': (38.1, 39.9), 'S12': (43.9, 44.2), 'S24': (44.6, 47.1), 'M24': (45.9, 46.9)}
PAPER_UPERNET = {'T12': (41.5, 43.5), 'S12': (45.9, 46.6), 'S24': (46.9, 48.1), 'M24': (47.6, 48.4)}


def paper() -> dict:
    """config name -> (metrics, released file URL)."""
    rows = {}
    for short, size in SIZES.items():
        for i, p in enumerate((16, 8)):
            box, mask = PAPER_COCO[short][i]
            rows[f'mask_rcnn_xcit_{size}_p{p}_3x_coco'] = (
                {'box AP': box, 'mask AP': mask},
                f'https://dl.fbaipublicfiles.com/xcit/coco/maskrcnn_xcit_{size}_p{p}.pth')
            rows[f'sem_fpn_xcit_{size}_p{p}_80k_ade20k'] = (
                {'mIoU': PAPER_SEM_FPN[short][i]}, f'https://dl.fbaipublicfiles.com/xcit/ade/sem_fpn_xcit_{size}_p{p}.pth')
            rows[f'upernet_xcit_{size}_p{p}_160k_ade20k'] = (
                {'mIoU': PAPER_UPERNET[short][i]}, f'https://dl.fbaipublicfiles.com/xcit/ade/upernet_xcit_{size}_p{p}.pth')
    return rows


def metafile_models() -> dict:
    return {m['Name']: m for m in yaml.safe_load((ZOO / 'metafile.yml').read_text())['Models']}


def test_metafile_lists_every_config_and_only_those():
    configs = {p.stem for p in ZOO.glob('*.py')}
    models = metafile_models()
    assert set(models) == configs
    for name, model in models.items():
        assert model['Config'] == f'configs/xcit/{name}.py' and (ROOT / model['Config']).is_file()
    assert yaml.safe_load((ROOT / 'model-index.yml').read_text()) == {'Import': ['configs/xcit/metafile.yml']}
    collections = {c['Name'] for c in yaml.safe_load((ZOO / 'metafile.yml').read_text())['Collections']}
    assert {m['In Collection'] for m in models.values()} == collections


def test_metafile_has_the_papers_results_and_weights():
    models = metafile_models()
    for name, (metrics, url) in paper().items():
        found = {k: v for result in models[name]['Results'] for k, v in result['Metrics'].items()}
        assert found == metrics, name
        assert models[name]['Weights'] == url


def test_readme_rows_have_the_papers_results_config_and_weights():
    text = (ZOO / 'README.md').read_text()
    rows = {}
    for line in text.splitlines():
        config = re.search(r'\[config\]\(([\w.]+)\.py\)', line)
        if config:
            cells = [c.strip() for c in line.strip('|').split('|')]
            numbers = [float(c) for c in cells if re.fullmatch(r'\d+\.\d', c)]
            rows[config.group(1)] = (numbers, re.search(r'\[model\]\((\S+)\)', line).group(1))
    expected = paper()
    assert set(rows) == set(expected)
    for name, (metrics, url) in expected.items():
        assert rows[name] == (list(metrics.values()), url), name
    assert '@article{el2021xcit' in text


def test_a_built_package_carries_what_openmim_reads(tmp_path):
    """setup.py's build_py puts model-index.yml, configs/ and tools/ under xcit_dense/.mim, where
    `mim search` / `mim train` / `mim test` look in an installed package (openmim not needed here)."""
    import subprocess
    import sys
    subprocess.run([sys.executable, 'setup.py', '-q', 'build_py', '--build-lib', str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)
    mim = tmp_path / 'xcit_dense' / '.mim'
    index = yaml.safe_load((mim / 'model-index.yml').read_text())
    models = [m for path in index['Import'] for m in yaml.safe_load((mim / path).read_text())['Models']]
    assert len(models) == len(paper())
    assert all((mim / m['Config']).is_file() for m in models)
    assert (mim / 'tools' / 'train.py').is_file() and (mim / 'tools' / 'test.py').is_file()
    assert (mim / 'configs' / '_base_' / 'datasets' / 'ade20k_xcit.py').is_file()
