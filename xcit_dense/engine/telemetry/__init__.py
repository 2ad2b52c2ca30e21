"""What a run reports of itself: step times, each rank's memory and figures, the node's GPU and
network use, model FLOPs; and the hooks that log them (rank figures, throughput, evaluation progress)."""
from .eval_progress_hook import EvalProgressHook
from .rank_figures_hook import RankFiguresHook
from .throughput_hook import ThroughputHook

__all__ = ['EvalProgressHook', 'RankFiguresHook', 'ThroughputHook']
