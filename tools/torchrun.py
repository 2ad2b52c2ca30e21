"""torchrun for the launch scripts: a failed run ends with one line naming the first rank that
failed, not torchrun's traceback and report, so the worker's own error above stays the one to read."""
import logging
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run


def main() -> None:
    # its per-process notes on the tear-down ("closing signal", "failed (exitcode ...)")
    logging.getLogger('torch.distributed.elastic.multiprocessing.api').setLevel(logging.CRITICAL)
    try:
        run(parse_args(sys.argv[1:]))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        how = (f'signal {failure.signal_name()}' if failure.exitcode < 0
               else f'exit code {failure.exitcode}')
        sys.exit(f'error: rank {rank} (pid {failure.pid}) failed first ({how}); its error is above')


if __name__ == '__main__':
    main()
