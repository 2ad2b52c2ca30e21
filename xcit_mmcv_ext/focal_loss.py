"""mmcv 2.1.0's sigmoid and softmax focal losses (forward and backward), in torch, on every device.

mmcv 2.1.0 has these kernels for CUDA only; mmcv's ``FocalLoss`` calls them whenever the prediction
is on a GPU (RetinaNet, FCOS, ATSS, Deformable DETR, DINO). The formulas are mmcv's kernels', element
by element, with probabilities clamped to FLT_MIN before their logarithm:
- sigmoid: for class c of sample n with target t, ``-alpha (1-p)^gamma log p`` where ``t == c`` and
  ``-(1-alpha) p^gamma log(1-p)`` elsewhere (a target equal to the number of classes is background);
  its gradient with respect to the logit likewise; both times ``weight[t]`` when a weight is given;
- softmax: on the softmax mmcv's Python side computes, ``-alpha (1-p_t)^gamma log p_t`` per sample,
  0 for a negative target; the backward writes the per-sample factor into ``buff`` and the gradient
  with respect to the logits ``buff[n] * (onehot - softmax)``.
float16 and bfloat16 are computed in float32 and rounded once into mmcv's tensors.
"""
import torch
from torch import Tensor

from .precision import FLT_MIN, compute_dtype


def _class_weight(weight: Tensor, target: Tensor, num_classes: int, dtype: torch.dtype) -> Tensor:
    """``weight[target]``; a target outside the classes has no weight (mmcv's kernel reads past the end)."""
    if bool(((target < 0) | (target >= num_classes)).any()):
        raise ValueError(f'sigmoid_focal_loss: with a class weight every target must be a class in '
                         f'[0, {num_classes}); background targets ({num_classes}) have no weight')
    return weight.to(dtype)[target][:, None]


def _sigmoid_parts(input: Tensor, target: Tensor) -> tuple:
    dtype = compute_dtype(input.dtype)
    p = torch.sigmoid(input.to(dtype))
    positive = target[:, None] == torch.arange(input.size(1), device=input.device)
    return dtype, p, positive


def sigmoid_focal_loss_forward(input: Tensor, target: Tensor, weight: Tensor, output: Tensor, gamma: float,
                               alpha: float) -> None:
    """The loss of each logit of ``input`` (N, C), written into ``output`` (N, C)."""
    dtype, p, positive = _sigmoid_parts(input, target)
    term_p = (1 - p).pow(gamma) * p.clamp(min=FLT_MIN).log()
    term_n = p.pow(gamma) * (1 - p).clamp(min=FLT_MIN).log()
    loss = torch.where(positive, -alpha * term_p, -(1 - alpha) * term_n)
    if weight.numel():
        loss = loss * _class_weight(weight, target, input.size(1), dtype)
    output.copy_(loss)


def sigmoid_focal_loss_backward(input: Tensor, target: Tensor, weight: Tensor, grad_input: Tensor, gamma: float,
                                alpha: float) -> None:
    """The loss's derivative with respect to each logit, written into ``grad_input`` (N, C)."""
    dtype, p, positive = _sigmoid_parts(input, target)
    term_p = (1 - p).pow(gamma) * (1 - p - gamma * p * p.clamp(min=FLT_MIN).log())
    term_n = p.pow(gamma) * (gamma * (1 - p) * (1 - p).clamp(min=FLT_MIN).log() - p)
    grad = torch.where(positive, -alpha * term_p, -(1 - alpha) * term_n)
    if weight.numel():
        grad = grad * _class_weight(weight, target, input.size(1), dtype)
    grad_input.copy_(grad)


def _target_probability(softmax: Tensor, target: Tensor) -> tuple:
    dtype = compute_dtype(softmax.dtype)
    labelled = target >= 0
    label = target.clamp(min=0)
    pred = softmax.to(dtype).gather(1, label[:, None])[:, 0]
    return dtype, labelled, label, pred


def softmax_focal_loss_forward(softmax: Tensor, target: Tensor, weight: Tensor, output: Tensor, gamma: float,
                               alpha: float) -> None:
    """The loss of each sample of ``softmax`` (N, C), written into ``output`` (N,)."""
    dtype, labelled, label, pred = _target_probability(softmax, target)
    loss = -alpha * (1 - pred).pow(gamma) * pred.clamp(min=FLT_MIN).log()
    if weight.numel():
        loss = loss * weight.to(dtype)[label]
    output.copy_(torch.where(labelled, loss, torch.zeros_like(loss)))


def softmax_focal_loss_backward(softmax: Tensor, target: Tensor, weight: Tensor, buff: Tensor,
                                grad_input: Tensor, gamma: float, alpha: float) -> None:
    """The per-sample factor into ``buff`` (N,) and the gradient with respect to the logits into
    ``grad_input`` (N, C)."""
    dtype, labelled, label, pred = _target_probability(softmax, target)
    factor = alpha * (-(1 - pred).pow(gamma) + gamma * (1 - pred).pow(gamma - 1) * pred
                      * pred.clamp(min=FLT_MIN).log())
    if weight.numel():
        factor = factor * weight.to(dtype)[label]
    factor = torch.where(labelled, factor, torch.zeros_like(factor))
    buff.copy_(factor)
    onehot = label[:, None] == torch.arange(softmax.size(1), device=softmax.device)
    grad = factor[:, None] * (onehot.to(dtype) - softmax.to(dtype))
    grad_input.copy_(torch.where(labelled[:, None], grad, torch.zeros_like(grad)))
