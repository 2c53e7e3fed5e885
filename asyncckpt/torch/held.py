"""What a segment of a stack holds while its backward runs, from its first pass: the bytes
autograd saves, the output nothing saves, the parameters' new gradients and the workspace a
layer's backward takes (by layer kind), as measured on the CPU."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["SegmentHeld", "backward_workspace"]

# A convolution's backward (torch's oneDNN kernels on the CPU) holds two buffers the size of
# its larger activation beside its input's gradient: the gradient and the input reordered to
# its blocked layout. Measured with 3x3 kernels over 4 MiB activations: 32 to 32 channels 8
# MiB, 32 to 64 with stride 2 8 MiB (twice the input), 3 to 32 channels 5.6 MiB (1.4 times the
# output), a 5-tap Conv1d 8 MiB; a 1x1 kernel nothing, nor Linear, ReLU, GELU, BatchNorm,
# LayerNorm or MaxPool (their input's gradient alone).
CONVOLUTION_WORKSPACE = 2


def backward_workspace(layer: Any, input_bytes: int, output_bytes: int) -> int:
    """The bytes ``layer``'s backward holds beyond what autograd saves, its output and the
    gradients of its input and output: for a convolution whose kernel covers more than one
    element (or a module holding one), :data:`CONVOLUTION_WORKSPACE` times its larger
    activation; else none."""
    if not isinstance(layer, torch.nn.Module):
        return 0
    for module in layer.modules():
        if isinstance(module, torch.nn.modules.conv._ConvNd) \
                and math.prod(module.kernel_size) > 1:
            return CONVOLUTION_WORKSPACE * max(input_bytes, output_bytes)
    return 0


class SegmentHeld:
    """The bytes a segment of layers ``begin`` to ``end`` (inclusive) holds at its backward's
    peak, beside the live state and the activation's gradients in and out.

    What autograd saves for its layers (their input apart: the live state), its last output
    (held as the backward's root, unless saved), the workspace of its layer that takes most,
    its parameters' gradients (one layer's parts, which autograd adds into ``.grad`` as the
    backward goes; and the new sum of each parameter more than one layer reaches, which may
    be summed across segments beside ``.grad``) and, in a segment of several layers, the
    gradient of its output (the backward's seed, held while the layers before the last take
    their gradients in and out).

    Parameters
    ----------
    layers
        The stack's layers.
    sizes
        The bytes of each layer's input, and of the last one's output.
    graph, ends, reached
        From the stack's first pass (:func:`~asyncckpt.torch.passes.meta_pass`): the bytes
        each layer saves, of those its input's and its output's, and the tensors needing a
        gradient it reaches.
    """

    def __init__(self, layers: Sequence[Any], sizes: Sequence[int], graph: Sequence[int],
                 ends: Sequence[tuple[int, int]],
                 reached: Sequence[Sequence[torch.Tensor]]) -> None:
        self.graph, self.ends, self.reached = list(graph), list(ends), reached
        self.sizes = list(sizes)
        self.workspace = [backward_workspace(layer, sizes[t], sizes[t + 1])
                          for t, layer in enumerate(layers)]
        self.parts = [sum({id(p): p.nbytes for p in ps}.values()) for ps in reached]
        layers_of: dict[int, int] = {}
        for ps in reached:
            for i in {id(p) for p in ps}:
                layers_of[i] = layers_of.get(i, 0) + 1
        self.shared = {i for i, count in layers_of.items() if count > 1}

    def __call__(self, begin: int, end: int) -> int:
        saved = sum(self.graph[begin:end + 1]) - self.ends[begin][0]
        output = self.sizes[end + 1] - self.ends[end][1]
        sums = sum({id(p): p.nbytes for t in range(begin, end + 1)
                    for p in self.reached[t] if id(p) in self.shared}.values())
        seed = self.sizes[end + 1] if end > begin else 0
        return (saved + output + seed + max(self.workspace[begin:end + 1]) + sums
                + max(self.parts[begin:end + 1]))

    def largest_layer(self) -> int:
        """What the segment of one layer that holds most holds."""
        return max(self(t, t) for t in range(len(self.graph)))
