"""`python -m benchmarks backbones`, tiny: its outputs are produced and well formed (no timings checked)."""
import csv
import json
import math
import sys

import pytest
import torch
from helpers import ROOT, randomize_, run

from benchmarks.measure import build
from benchmarks.report import CSV_COLUMNS, growth, markdown
from benchmarks.run_backbones import parse_args
from benchmarks.runs import job_spec, run_jobs
from benchmarks.sizes import Size, label, parse_size
from benchmarks.targets import TARGETS, compute_ratios, met
from xcit_dense.models.xcit import XCiT

NUMERIC = ('time_ms', 'time_min_ms', 'time_max_ms', 'peak_mem_mb', 'peak_tensor_mb', 'baseline_mem_mb')


def test_smoke_run_writes_table_csv_and_plot(tmp_path):
    out = tmp_path / 'bench'
    proc = run(
        [sys.executable, '-m', 'benchmarks', 'backbones', '--backbones', 'xcit_t12_p16', '--resolutions', '64',
         '--repeats', '1', '--warmup', '0', '--mode', 'both', '--threads', '1', '--device', 'cpu',
         '--out-dir', str(out)], cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    table = (out / 'benchmark.md').read_text()
    assert table in proc.stdout  # printed and saved
    assert '**Inference**' in table and '**Training step' in table
    assert table.count('| xcit_t12_p16 | ') == 2 and '| model | 64^2 |' in table

    with open(out / 'benchmark.csv', newline='') as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == CSV_COLUMNS
    assert sorted(r['mode'] for r in rows) == ['infer', 'train']
    for row in rows:
        assert (row['model'], row['kind'], row['resolution'], row['status']) == ('xcit_t12_p16', 'backbone', '64', 'ok')
        values = [float(row[k]) for k in NUMERIC]
        assert all(math.isfinite(v) for v in values)
        assert all(float(row[k]) > 0 for k in ('time_ms', 'peak_mem_mb', 'peak_tensor_mb', 'baseline_mem_mb'))
        assert float(row['time_min_ms']) <= float(row['time_ms']) <= float(row['time_max_ms'])
        assert row['note'] == ''  # the peak RSS could be reset, so the peak is the run's own

    png = (out / 'benchmark.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10_000
    from PIL import Image
    with Image.open(out / 'benchmark.png') as image:
        image.verify()


def test_a_run_over_the_memory_limit_is_killed_and_marked_skipped():
    args = parse_args(['--backbones', 'xcit_t12_p16', '--resolutions', '64', '--device', 'cpu',
                             '--max-mem-gb', '0.02', '--mode', 'infer'])
    jobs = [job_spec(args, 'xcit_t12_p16', r, 'infer') for r in (64, 96)]
    rows = run_jobs(args, jobs, log=lambda _: None)
    assert [r['status'] for r in rows] == ['skipped', 'skipped']
    assert rows[0]['note'] == 'skipped: over 0.02 GB'
    assert rows[1]['note'] == 'skipped: over 0.02 GB at 64'  # larger sizes are not attempted
    assert 'skipped (over 0.02 GB)' in markdown(rows, {}, 'header')


def test_timm_reference_shares_the_weights_and_pyramid():
    """The timm XCiT + plain-torch pyramid computes what this toolkit's backbone computes."""
    from mmengine.registry import MODELS

    import benchmarks.catalogue  # noqa: F401  (registers the reference models)
    ours = randomize_(XCiT(arch='tiny_12', patch_size=16), seed=1).eval()
    ref = MODELS.get('BenchTimmXCiTPyramid')('tiny_12', 16, source=ours).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        for a, b in zip(ours(x), ref(x)):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_ratios_summary_states_each_target():
    args = parse_args(['--backbones', 'xcit_s12_p16', 'vit_s16'])

    def row(model, res, mode, mem, tensors, with_cp=False):
        return dict(model=model, resolution=res, mode=mode, with_cp=with_cp, status='ok', time_ms=1.0,
                    peak_mem_mb=mem, peak_tensor_mb=tensors)
    rows = [row('xcit_s12_p16', 1024, 'infer', 1000, 400), row('xcit_s12_p16', 1600, 'infer', 2000, 960),
            row('vit_s16', 1024, 'infer', 1000, 500), row('vit_s16', 1600, 'infer', 5000, 3000),
            row('xcit_s12_p16', 1024, 'train', 10000, 8000),
            row('xcit_s12_p16', 1024, 'train', 5000, 4400, with_cp=True)]
    pairs = [(dict(pair='timm', model='xcit_s12_p16', resolution=512),
              dict(status='ok', times_ms=dict(ours=100, timm=98, ours_channels_last=90), ratio=100 / 98,
                   ratio_channels_last=90 / 98)),
             (dict(pair='timm', model='xcit_s12_p16', resolution=1024), dict(status='skipped', note='skipped: x')),
             (dict(pair='cp', model='xcit_s12_p16', resolution=1024),
              dict(status='ok', times_ms=dict(with_cp=140, plain=100), ratio=1.4))]
    ratios = compute_ratios(args, rows, pairs)
    text = '\n'.join(ratios['summary'])
    assert '**1.020** (target <= 1.05: met)' in text
    assert ('xcit_s12_p16 inference peak memory 1600^2 / 1024^2 (pixel ratio 2.44, target within 10%: '
            '2.20-2.69): added 2000 / 1000 MB = **2.00**, NOT met; tensors 960 / 400 MB = **2.40**, met') in text
    assert 'vit_s16 inference peak memory 1600^2 / 1024^2 (pixel ratio 2.44): added 5000 / 1000 MB = **5.00**' in text
    assert 'added 10000 -> 5000 MB, **50% less** (met); tensors 8000 -> 4400 MB, **45% less** (met)' in text
    assert '**+40%** (target <= +35%: NOT met)' in text
    assert ratios['with_cp']['peak_mem_mb']['cut'] == pytest.approx(0.5)
    assert 'Target ratios' in markdown(rows, ratios, 'header')


def test_verdicts_read_the_targets_given_as_data():
    """The same table meets or misses a target as the targets' limits say; the texts state those limits."""
    args = parse_args(['--backbones', 'xcit_s12_p16'])

    def row(res, mode, mem, with_cp=False):
        return dict(model='xcit_s12_p16', resolution=res, mode=mode, with_cp=with_cp, status='ok', time_ms=1.0,
                    peak_mem_mb=mem, peak_tensor_mb=None)
    rows = [row(1024, 'infer', 1000), row(1600, 'infer', 2000), row(1024, 'train', 10000),
            row(1024, 'train', 5500, with_cp=True)]
    pairs = [(dict(pair='timm', model='xcit_s12_p16', resolution=512),
              dict(status='ok', times_ms=dict(ours=103, timm=100, ours_channels_last=90), ratio=1.03,
                   ratio_channels_last=0.9)),
             (dict(pair='cp', model='xcit_s12_p16', resolution=1024),
              dict(status='ok', times_ms=dict(with_cp=130, plain=100), ratio=1.3))]
    text = '\n'.join(compute_ratios(args, rows, pairs)['summary'])
    assert '**1.030** (target <= 1.05: met)' in text
    assert '(pixel ratio 2.44, target within 10%: 2.20-2.69): added 2000 / 1000 MB = **2.00**, NOT met' in text
    assert 'with_cp (target >= 40% less memory): added 10000 -> 5500 MB, **45% less** (met)' in text
    assert '**+30%** (target <= +35%: met)' in text

    strict = dict(TARGETS, timm_time_ratio={'max': 1.02}, memory_over_pixel_ratio={'tolerance': 0.2},
                  with_cp_memory_cut={'min': 0.5}, with_cp_time_increase={'max': 0.25})
    text = '\n'.join(compute_ratios(args, rows, pairs, strict)['summary'])
    assert '**1.030** (target <= 1.02: NOT met)' in text
    assert '(pixel ratio 2.44, target within 20%: 1.95-2.93): added 2000 / 1000 MB = **2.00**, met' in text
    assert 'with_cp (target >= 50% less memory): added 10000 -> 5500 MB, **45% less** (NOT met)' in text
    assert '**+30%** (target <= +25%: NOT met)' in text


def test_a_target_bounds_a_value_by_min_max_or_tolerance():
    assert met({'max': 1.05}, 1.05) and not met({'max': 1.05}, 1.051)
    assert met({'min': 0.4}, 0.4) and not met({'min': 0.4}, 0.39)
    assert met({'tolerance': 0.1}, 0.95) and met({'tolerance': 0.1}, 1.08) and not met({'tolerance': 0.1}, 1.15)


def test_growth_between_consecutive_resolutions_beside_the_pixel_ratio():
    def row(model, res, time_ms, mem, status='ok'):
        return dict(model=model, resolution=res, mode='infer', with_cp=False, status=status, time_ms=time_ms,
                    peak_mem_mb=mem, peak_tensor_mb=None, note='' if status == 'ok' else 'skipped: over 1 GB')
    rows = [row('xcit', 256, 10, 100), row('xcit', 512, 45, 410), row('xcit', 1024, 200, 1700),
            row('vit', 256, 10, 100), row('vit', 512, 80, 900), row('vit', 1024, None, None, 'skipped')]
    steps = growth(rows)
    assert [(s['model'], s['low'], s['high']) for s in steps] == [('xcit', 256, 512), ('vit', 256, 512),
                                                                  ('xcit', 512, 1024)]
    assert steps[0]['pixel_ratio'] == 4 and steps[0]['time'] == pytest.approx(4.5)
    assert steps[0]['memory'] == pytest.approx(4.1)
    text = markdown(rows, {}, 'header')
    assert '| model | mode | 256^2 -> 512^2 (pixels x4.00) | 512^2 -> 1024^2 (pixels x4.00) |' in text
    assert '| xcit | infer | x4.50 / x4.10 | x4.44 / x4.15 |' in text
    assert '| vit | infer | x8.00 / x9.00 |  |' in text  # no factor to or from a skipped run
    assert 'Growth between' not in markdown(rows[:1], {}, 'header')  # one resolution: no section


def test_sizes_are_square_sides_or_width_by_height_and_order_by_pixels(capsys):
    assert parse_size('1024') == 1024 and isinstance(parse_size('1024'), int)
    assert parse_size('1333x800') == Size(height=800, width=1333) and str(parse_size('1333x800')) == '1333x800'
    assert parse_size('512x512') == 512  # a square written out is the square side
    for bad in ('0', '1333x', 'x800', '13x8x2', 'big'):
        with pytest.raises(ValueError, match=rf"^not a size: '{bad}' \(a side such as 1024, or WIDTHxHEIGHT"):
            parse_size(bad)
    args = parse_args(['--sizes', '1600', '1333x800', '1024', '--backbones', 'xcit_t12_p16'])
    assert sorted(args.resolutions) == [1024, Size(800, 1333), 1600]  # 1.07 Mpx between 1.05 and 2.56
    assert parse_args(['--resolutions', '64']).resolutions == [64]
    capsys.readouterr()
    with pytest.raises(SystemExit, match='^2$'):  # argparse's usage error, its message on stderr
        parse_args(['--sizes', '1333by800'])
    assert "argument --resolutions/--sizes: not a size: '1333by800'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match='^2$'):
        parse_args(['--profile-ops', '--sizes', '96x64'])
    assert 'error: --linearity and --profile-ops take square sizes only' in capsys.readouterr().err


def test_a_non_square_size_reaches_the_measured_model_and_the_table(monkeypatch):
    args = parse_args(['--backbones', 'xcit_t12_p16', '--sizes', '96x64', '--device', 'cpu', '--mode', 'infer'])
    spec = json.loads(json.dumps(job_spec(args, 'xcit_t12_p16', args.resolutions[0], 'infer')))  # as the child
    shapes = []
    original = XCiT.forward

    def spy(self, x):
        shapes.append(tuple(x.shape))
        return original(self, x)
    monkeypatch.setattr(XCiT, 'forward', spy)
    _, step = build(spec['model'], spec, torch.device('cpu'))
    step()
    assert shapes == [(1, 3, 64, 96)]  # height 64, width 96

    def row(res, time_ms, mem):
        return dict(model='xcit', resolution=res, mode='infer', with_cp=False, status='ok', time_ms=time_ms,
                    peak_mem_mb=mem, peak_tensor_mb=None, note='')
    rows = [row(1024, 100, 100), row(Size(800, 1333), 110, 105), row(512, 25, 30)]
    text = markdown(rows, {}, 'header')
    assert '| model | 512^2 | 1024^2 | 1333x800 |' in text
    assert '| 1024^2 -> 1333x800 (pixels x1.02) |' in text
    assert growth(rows)[-1]['pixel_ratio'] == pytest.approx(1333 * 800 / 1024 ** 2)
    assert label(Size(800, 1333)) == '1333x800'
