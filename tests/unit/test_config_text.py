"""The Runner's config is formatted once per content: MMEngine's text at each request, yapf run again
only after the config changed."""
import copy

import mmengine.config.config as mmengine_config
from helpers import ROOT, ToyModel
from mmengine.config import Config

from xcit_dense.engine.training.config_text import FormattedOnceConfig
from xcit_dense.engine.training.runner import ToolkitRunner

DEMO = ROOT / 'configs/demo/mask_rcnn_xcit_tiny_12_p16_demo.py'


def counting_formatter(monkeypatch) -> list:
    calls = []
    format_code = mmengine_config.FormatCode

    def counted(*args, **kwargs):
        calls.append(1)
        return format_code(*args, **kwargs)
    monkeypatch.setattr(mmengine_config, 'FormatCode', counted)
    return calls


def test_the_runner_formats_its_config_once_until_it_changes(tmp_path, monkeypatch):
    cfg = Config.fromfile(str(DEMO))
    expected = cfg.pretty_text
    calls = counting_formatter(monkeypatch)
    runner = ToolkitRunner(model=ToyModel(), work_dir=str(tmp_path / 'work'), cfg=cfg, experiment_name='text')
    assert isinstance(runner.cfg, FormattedOnceConfig)
    runner.dump_config()  # the log's header asked first, in __init__
    assert runner.cfg.pretty_text == expected and runner.cfg.pretty_text == expected
    assert (tmp_path / 'work' / DEMO.name).read_text() == expected
    assert len(calls) == 1
    runner.cfg.train_cfg.max_epochs = 7  # changed in place, as hooks and tools may
    changed = runner.cfg.pretty_text
    assert len(calls) == 2 and 'max_epochs=7' in changed and changed == Config(runner.cfg.to_dict()).pretty_text


def test_a_copy_keeps_its_class_and_contents():
    cfg = FormattedOnceConfig.of(Config(dict(a=1, b=dict(c=[1, 2]))))
    copied = Config(cfg.to_dict())
    again = copy.deepcopy(cfg)
    assert type(again) is FormattedOnceConfig and again.pretty_text == copied.pretty_text == cfg.pretty_text
