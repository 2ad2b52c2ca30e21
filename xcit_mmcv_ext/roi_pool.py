"""mmcv 2.1.0's ``roi_pool_forward`` and ``roi_pool_backward`` (max pooling), in torch.

mmcv's rule, which torchvision's ``roi_pool`` does not follow (it rounds the RoI's corners to whole
pixels first): the RoI (batch index, x1, y1, x2, y2) is scaled as given, its far corner plus one
pixel, ``(x2 + 1) * spatial_scale``; bin (ph, pw) spans rows ``floor(y1 + ph * bin_h)`` to
``ceil(y1 + (ph + 1) * bin_h)`` (end excluded), clipped to the map. Its output is the largest value
(the first in row-major order among equal ones; NaNs never taken), 0 with argmax -1 for an empty
bin, -FLT_MAX with argmax -1 when no value exceeds -FLT_MAX. A RoI of zero or negative size is
skipped: its output and argmax stay as handed in, as mmcv's kernel leaves them. The backward adds
each output's gradient at its argmax. Coordinates and values are computed in float32 (float64 for
float64 input).
"""
import torch
from torch import Tensor

from .precision import FLT_MAX, compute_dtype

WINDOW_ELEMENTS = 2 ** 25  # gathered values per chunk of RoIs (memory bound of the forward)


def _bin_edges(start: Tensor, size: Tensor, bins: int, limit: int) -> tuple:
    """Each RoI's bins' first and past-the-end pixel along one axis, clipped to [0, limit]."""
    index = torch.arange(bins, dtype=start.dtype, device=start.device)
    bin_size = size[:, None] / bins
    first = torch.floor(index * bin_size + start[:, None]).clamp(0, limit).long()
    end = torch.ceil((index + 1) * bin_size + start[:, None]).clamp(0, limit).long()
    return first, end


def roi_pool_forward(input: Tensor, rois: Tensor, output: Tensor, argmax: Tensor, pooled_height: int,
                     pooled_width: int, spatial_scale: float) -> None:
    """Max-pool each RoI of ``input`` into ``output`` (K, C, ph, pw); ``argmax`` gets the flat
    position (h * W + w) of each maximum."""
    dtype = compute_dtype(input.dtype)
    channels, height, width = input.shape[1:]
    boxes = rois.to(dtype)
    scale = torch.tensor(spatial_scale, dtype=dtype).item()
    x1, y1 = boxes[:, 1] * scale, boxes[:, 2] * scale
    roi_w, roi_h = (boxes[:, 3] + 1) * scale - x1, (boxes[:, 4] + 1) * scale - y1
    kept = (~((roi_w <= 0) | (roi_h <= 0))).nonzero()[:, 0]
    if kept.numel() == 0:
        return
    col_first, col_end = _bin_edges(x1[kept], roi_w[kept], pooled_width, width)
    row_first, row_end = _bin_edges(y1[kept], roi_h[kept], pooled_height, height)
    batch = boxes[kept, 0].long()
    window_h = max(int((row_end - row_first).max()), 1)
    window_w = max(int((col_end - col_first).max()), 1)
    per_roi = channels * pooled_height * pooled_width * window_h * window_w
    step = max(1, WINDOW_ELEMENTS // per_roi)
    values, places = [], []
    for start in range(0, kept.numel(), step):
        part = slice(start, start + step)
        value, place = _pool(input, batch[part], row_first[part], row_end[part], col_first[part], col_end[part],
                             window_h, window_w, dtype)
        values.append(value)
        places.append(place)
    output[kept] = torch.cat(values).to(output.dtype)
    argmax[kept] = torch.cat(places).to(argmax.dtype)


def _pool(input: Tensor, batch: Tensor, row_first: Tensor, row_end: Tensor, col_first: Tensor, col_end: Tensor,
          window_h: int, window_w: int, dtype: torch.dtype) -> tuple:
    """The maxima and their flat positions for some RoIs, each bin read as a window of the largest
    bin's size, the pixels beyond its own bin masked."""
    height, width = input.shape[2:]
    rows = row_first[:, :, None] + torch.arange(window_h, device=input.device)  # (K, ph, wh)
    cols = col_first[:, :, None] + torch.arange(window_w, device=input.device)  # (K, pw, ww)
    row_in, col_in = rows < row_end[:, :, None], cols < col_end[:, :, None]
    rows, cols = rows.clamp(max=height - 1), cols.clamp(max=width - 1)
    channel = torch.arange(input.size(1), device=input.device)
    # (K, C, ph, pw, wh, ww)
    window = input[batch[:, None, None, None, None, None], channel[None, :, None, None, None, None],
                   rows[:, None, :, None, :, None], cols[:, None, None, :, None, :]].to(dtype)
    inside = row_in[:, None, :, None, :, None] & col_in[:, None, None, :, None, :]
    window = window.masked_fill(~inside | window.isnan(), float('-inf'))
    best, where = window.flatten(-2).max(-1)
    row = torch.gather(rows[:, None, :, None, :].expand(*best.shape, window_h), -1, (where // window_w)[..., None])
    col = torch.gather(cols[:, None, None, :, :].expand(*best.shape, window_w), -1, (where % window_w)[..., None])
    place = row[..., 0] * width + col[..., 0]
    empty = ((row_end <= row_first)[:, None, :, None]) | ((col_end <= col_first)[:, None, None, :])
    taken = best > -FLT_MAX
    value = torch.where(taken, best, torch.full_like(best, -FLT_MAX))
    value = value.masked_fill(empty, 0)
    place = place.masked_fill(empty | ~taken, -1)
    return value, place


def roi_pool_backward(grad_output: Tensor, rois: Tensor, argmax: Tensor, grad_input: Tensor, pooled_height: int,
                      pooled_width: int, spatial_scale: float) -> None:
    """Add each output's gradient into ``grad_input`` at its argmax (none where argmax is -1)."""
    batch, channels, height, width = grad_input.shape
    dtype = compute_dtype(grad_output.dtype)
    image = rois[:, 0].long()[:, None, None, None]
    channel = torch.arange(channels, device=grad_input.device)[None, :, None, None]
    positions = argmax.long()
    taken = positions != -1
    flat = (image * channels + channel) * (height * width) + positions
    total = torch.zeros(batch * channels * height * width, dtype=dtype, device=grad_input.device)
    total.index_add_(0, flat[taken], grad_output.to(dtype)[taken])
    grad_input.add_(total.view_as(grad_input).to(grad_input.dtype))
