"""Check a config's training and validation data before a run: images found and missing,
annotations, classes against the annotation file, images without annotations, image sizes, and
the bad data (annotations the dataset drops, samples training would skip) counted by kind.
Exits 1 naming what is wrong."""
import sys

from xcit_launch.entry_point import prepare_process

prepare_process()  # first: OpenCV's pixel limit and the known-warning filters, before the stack loads
import xcit_dense.checked_loading  # noqa: E402,F401  (registers the toolkit; checkpoints read checked)
from xcit_dense.dataset_tool_config import config_parser, open_config
from xcit_dense.datasets.check import check_dataset
from xcit_dense.tool_errors import exit_status


def main() -> None:
    cfg = open_config(config_parser(__doc__).parse_args())
    reports = check_dataset(cfg)
    for report in reports:
        print('\n'.join(report.lines()))
    problems = [f'{r.split}: {p}' for r in reports for p in r.problems]
    if problems:  # what the check found, not an error of the tool: every problem on its line
        sys.exit('error: ' + '\nerror: '.join(problems))
    print('the data is complete')


if __name__ == '__main__':
    sys.exit(exit_status(main))
