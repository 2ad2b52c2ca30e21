"""mmcv 2.1.0's ``masked_im2col_forward`` and ``masked_col2im_forward`` (MaskedConv2d, guided anchoring).

mmcv convolves the first image of the batch at the masked positions only: ``masked_im2col`` gathers,
for each masked (h, w), the kernel's window of every channel (zero outside the map) into column
``m`` of ``data_col`` (C * kh * kw rows, channel-major, then kernel row, then kernel column);
``masked_col2im`` writes column ``m`` of the convolved columns back at (h, w) of the first image.
Both only copy values, so every dtype is kept as it is.
"""
import torch
import torch.nn.functional as F
from torch import Tensor


def masked_im2col_forward(im: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, col: Tensor, kernel_h: int,
                          kernel_w: int, pad_h: int, pad_w: int) -> None:
    """Fill ``col`` (C * kernel_h * kernel_w, M) with the windows of ``im[0]`` at the M masked positions."""
    channels = im.size(1)
    # padded so that every window index is inside: top/left by the padding, bottom/right by the kernel
    padded = F.pad(im[0], (pad_w, kernel_w, pad_h, kernel_h))
    rows = mask_h_idx.long()[:, None] + torch.arange(kernel_h, device=im.device)  # (M, kh), padded coords
    cols = mask_w_idx.long()[:, None] + torch.arange(kernel_w, device=im.device)  # (M, kw)
    windows = padded[:, rows[:, :, None], cols[:, None, :]]  # (C, M, kh, kw)
    col.copy_(windows.permute(0, 2, 3, 1).reshape(channels * kernel_h * kernel_w, -1))


def masked_col2im_forward(col: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, im: Tensor, height: int,
                          width: int, channels: int) -> None:
    """Write column m of ``col`` (channels, M) at the m-th masked position of ``im[0]``."""
    im[0, :, mask_h_idx.long(), mask_w_idx.long()] = col.view(channels, -1).to(im.dtype)
