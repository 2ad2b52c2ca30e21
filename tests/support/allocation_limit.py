"""A segmentor that runs out of memory as torch's CPU allocator does above ``max_images`` images per batch
(per rank: a list indexed by rank, or one number for all), imported through a config's custom_imports:
the model of a run and of its ``--auto-fit`` probe alike."""
import torch.distributed as dist
from mmseg.models import EncoderDecoder
from mmseg.registry import MODELS

CPU_ALLOCATOR_MESSAGE = ('[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you '
                         "tried to allocate 1073741824 bytes. (can't allocate memory)")


@MODELS.register_module()
class AllocationLimitedSegmentor(EncoderDecoder):
    def __init__(self, max_images, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_images = max_images

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        rank = dist.get_rank() if dist.is_initialized() else 0
        limit = self.max_images[rank] if isinstance(self.max_images, (list, tuple)) else self.max_images
        if mode == 'loss' and len(inputs) > limit:
            raise RuntimeError(CPU_ALLOCATOR_MESSAGE)
        return super().forward(inputs, data_samples, mode)
