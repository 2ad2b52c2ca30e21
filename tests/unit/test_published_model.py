"""The parts of xcit_dense/published.py that need no weights: finding the recipe a run's config derives
from, and model.json's overrides checked against the recipe's types before any is used."""
import pytest
from mmengine.config import Config

from xcit_dense.published import REPO_ROOT, PublishedModelError, apply_overrides, find_recipe

RECIPE = 'configs/xcit/sem_fpn_xcit_tiny_12_p16_80k_ade20k.py'


def test_the_recipe_is_the_first_config_of_configs_up_the_base_chain(tmp_path):
    """Two levels up, past a base outside configs/ and one under configs/_base_/ named first."""
    (tmp_path / 'middle.py').write_text(f"_base_ = ['{REPO_ROOT}/configs/_base_/default_runtime_seg.py', "
                                        f"'{REPO_ROOT / RECIPE}']\n")
    (tmp_path / 'run.py').write_text("_base_ = './middle.py'\nraise SystemExit('never executed')\n")
    recipe, how = find_recipe(str(tmp_path / 'run.py'))
    assert recipe == RECIPE and '2 level(s) up' in how
    assert find_recipe(str(REPO_ROOT / RECIPE))[0] == RECIPE
    (tmp_path / 'lonely.py').write_text("_base_ = ['mmseg::_base_/models/fpn_r50.py']\n")
    with pytest.raises(PublishedModelError, match='derives from no config of'):
        find_recipe(str(tmp_path / 'lonely.py'))


@pytest.mark.parametrize('overrides, message', [
    (dict(num_classes='4'), 'num_classes: a positive integer'),
    (dict(classes=['a', 2]), r'classes\[1\]'),
    (dict(classes=['a', 'b'], num_classes=3), '2 classes named, num_classes 3'),
    (dict(mean=[1, 2]), 'mean: a list of 3'),
    (dict(std=[1, 0, 1]), 'std: a list of 3 positive'),
    (dict(image_scale=[512, 'x']), 'image_scale'),
    (dict(model=dict(backbone=dict(type='ResNet'))), 'model.backbone.type: not changeable'),
    (dict(model=dict(decode_head=dict(channels='16'))), 'model.decode_head.channels: the recipe has a number'),
    (dict(model=dict(backbone=dict(patch_size=[16]))), 'the recipe has a number there'),
    (dict(model=dict(neck=dict(extra=dict(type='os.system')))), 'cannot name a class'),
    (dict(model=dict(neck=dict(in_channels=['a'] * 4))), 'list of numbers'),
    (dict(script='x'), 'an object with only'),
])
def test_a_bad_override_is_one_error_naming_it(overrides, message):
    cfg = Config.fromfile(str(REPO_ROOT / RECIPE))
    with pytest.raises(PublishedModelError, match=message):
        apply_overrides(cfg, overrides)


def test_good_overrides_reach_the_model_and_the_test_pipeline():
    cfg = Config.fromfile(str(REPO_ROOT / RECIPE))
    meta = apply_overrides(cfg, dict(classes=['a', 'b'], num_classes=2, palette=[[1, 2, 3], [4, 5, 6]],
                                     image_scale=[640, 320], mean=[1, 2, 3], std=[4, 5, 6],
                                     model=dict(backbone=dict(depth=4, norm_eval=True))))
    assert meta == dict(classes=('a', 'b'), palette=[(1, 2, 3), (4, 5, 6)])
    assert cfg.model.decode_head.num_classes == 2 and cfg.model.backbone.depth == 4
    assert cfg.model.backbone.init_cfg is None and cfg.model.data_preprocessor.std == [4.0, 5.0, 6.0]
    resize = [s for s in cfg.test_dataloader.dataset.pipeline if s.type == 'Resize']
    assert [s.scale for s in resize] == [(640, 320)]
    assert cfg.test_dataloader.dataset.metainfo.classes == ('a', 'b')
