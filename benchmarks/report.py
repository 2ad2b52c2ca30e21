"""The benchmark's outputs: the markdown table, the CSV and the plot of time and memory against resolution."""
import csv
from pathlib import Path
from typing import List, Optional

from .catalogue import model_kind
from .sizes import label, pixels, side

CSV_COLUMNS = ['model', 'kind', 'resolution', 'mode', 'status', 'time_ms', 'time_min_ms', 'time_max_ms',
               'peak_mem_mb', 'peak_tensor_mb', 'baseline_mem_mb', 'dtype', 'with_cp', 'channels_last', 'compile',
               'batch', 'repeats', 'warmup', 'threads', 'device', 'note']
MEASURES = ('time_ms', 'time_min_ms', 'time_max_ms', 'peak_mem_mb', 'peak_tensor_mb', 'baseline_mem_mb')


def result_row(spec: dict, result: dict) -> dict:
    """One table and CSV row: the run's settings from ``spec``, its figures and status from ``result``."""
    row = {k: spec.get(k) for k in CSV_COLUMNS}
    row.update(kind=model_kind(spec['model']), status=result.get('status'), note=result.get('note', ''))
    for key in MEASURES:
        row[key] = result.get(key)
    return row


def _cell(row: Optional[dict]) -> str:
    if row is None:
        return ''
    if row['status'] != 'ok':
        return row['note'].replace('skipped: ', 'skipped (') + ')' if row['note'].startswith('skipped') \
            else f"{row['status']} (see CSV)"
    text = f"{row['time_ms']:.0f} ms / {_size(row['peak_mem_mb'])}"
    return text if row.get('peak_tensor_mb') is None else f"{text} ({_size(row['peak_tensor_mb'])})"


def _size(mb: float) -> str:
    return f'{mb / 1024:.2f} GB' if mb >= 1024 else f'{mb:.0f} MB'


def growth(rows: List[dict]) -> List[dict]:
    """Factors of time and peak memory from each resolution of the table to the next, beside their pixel ratio.

    They show how a model scales: a factor near the pixel ratio is linear in pixels. A step with
    a run that did not succeed has no entry; a memory factor over a non-positive peak is None.
    """
    main = [r for r in rows if not r.get('extra')]
    resolutions = sorted({r['resolution'] for r in main})
    done = {(r['model'], r['mode'], r['resolution']): r for r in main if r['status'] == 'ok'}
    steps = []
    for low, high in zip(resolutions, resolutions[1:]):
        for (model, mode, res), a in done.items():
            b = done.get((model, mode, high))
            if res == low and b:
                memory = b['peak_mem_mb'] / a['peak_mem_mb'] if a['peak_mem_mb'] > 0 else None
                steps.append(dict(model=model, mode=mode, low=low, high=high, pixel_ratio=pixels(high) / pixels(low),
                                  time=b['time_ms'] / a['time_ms'], memory=memory))
    return steps


def _factors(step: dict) -> str:
    return f"x{step['time']:.2f} / " + ('-' if step['memory'] is None else f"x{step['memory']:.2f}")


def _growth_table(steps: List[dict]) -> List[str]:
    spans = list(dict.fromkeys((s['low'], s['high']) for s in steps))
    lines = ['**Growth between consecutive resolutions**: factor of time / of peak memory added', '',
             '| model | mode | ' + ' | '.join(f'{label(lo)} -> {label(hi)} (pixels x{pixels(hi) / pixels(lo):.2f})'
                                              for lo, hi in spans)
             + ' |', '|---|---|' + '---|' * len(spans)]
    for model, mode in dict.fromkeys((s['model'], s['mode']) for s in steps):
        by_span = {(s['low'], s['high']): s for s in steps if (s['model'], s['mode']) == (model, mode)}
        cells = [_factors(by_span[span]) if span in by_span else '' for span in spans]
        lines.append(f'| {model} | {mode} | ' + ' | '.join(cells) + ' |')
    return lines + ['']


def markdown(rows: List[dict], ratios: dict, header: str) -> str:
    """One table per mode (a row per model, a column per resolution), then the growth, extra runs and targets."""
    lines = [header, '']
    main = [r for r in rows if not r.get('extra')]
    resolutions = sorted({r['resolution'] for r in main})
    for mode in ('infer', 'train'):
        mode_rows = [r for r in main if r['mode'] == mode]
        if not mode_rows:
            continue
        title = 'Inference' if mode == 'infer' else 'Training step (forward + backward)'
        lines += [f'**{title}**: time per image / peak memory added (peak tensor memory)', '',
                  '| model | ' + ' | '.join(label(r) for r in resolutions) + ' |',
                  '|---|' + '---|' * len(resolutions)]
        for model in dict.fromkeys(r['model'] for r in mode_rows):
            cells = [_cell(next((r for r in mode_rows if r['model'] == model and r['resolution'] == res), None))
                     for res in resolutions]
            lines.append(f'| {model} | ' + ' | '.join(cells) + ' |')
        lines.append('')
    steps = growth(rows)
    if steps:
        lines += _growth_table(steps)
    extra = [r for r in rows if r.get('extra')]
    if extra:
        lines += ['Extra measurements for the ratios:', '', '| model | mode | resolution | with_cp | result |',
                  '|---|---|---|---|---|']
        lines += [f"| {r['model']} | {r['mode']} | {r['resolution']} | {r['with_cp']} | {_cell(r)} |" for r in extra]
        lines.append('')
    if ratios:
        lines += ['**Target ratios** (measured in this run)', '']
        lines += [f'- {text}' for text in ratios.get('summary', [])]
        lines.append('')
    return '\n'.join(lines)


def write_csv(rows: List[dict], path: Path) -> None:
    """All rows, the columns of ``CSV_COLUMNS``, floats rounded to 3 decimals and missing figures empty."""
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction='ignore')
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ('' if row.get(k) is None else
                                 round(row[k], 3) if isinstance(row[k], float) else row[k]) for k in CSV_COLUMNS})


def plot(rows: List[dict], path: Path, title: str) -> None:
    """Time per image and peak memory against resolution, one line per model, a column per mode."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    main = [r for r in rows if not r.get('extra')]
    modes = [m for m in ('infer', 'train') if any(r['mode'] == m for r in main)] or ['infer']
    panels = [('time_ms', 'time per image', 'ms', 1), ('peak_mem_mb', 'peak memory added', 'GB', 1024)]
    if any(r.get('peak_tensor_mb') is not None for r in main):
        panels.append(('peak_tensor_mb', 'peak tensor memory', 'GB', 1024))
    fig, axes = plt.subplots(len(panels), len(modes), figsize=(6.5 * len(modes), 4 * len(panels)), squeeze=False)
    for col, mode in enumerate(modes):
        name = 'inference' if mode == 'infer' else 'training step'
        for row, (key, what, unit, scale) in enumerate(panels):
            ax = axes[row][col]
            for model in dict.fromkeys(r['model'] for r in main):
                points = sorted((side(r['resolution']), r[key] / scale) for r in main if r['model'] == model
                                and r['mode'] == mode and r['status'] == 'ok' and r.get(key) is not None)
                if points:
                    ax.plot(*zip(*points), marker='o', linestyle='-' if model.startswith('xcit') else '--',
                            label=model)
            ax.set(title=f'{name}: {what}', xlabel='resolution (side of a square of as many pixels)', ylabel=unit)
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
