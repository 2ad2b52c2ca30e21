"""The process group and what bounds it: its set-up with devices and the CUDA ops check, Slurm hosts,
the network, peers, collectives, wait and compile bounds, restarts, and the step-bound hook."""
from .step_bound_hook import StepBoundHook

__all__ = ['StepBoundHook']
