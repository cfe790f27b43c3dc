"""Formulations of the convolution and the dense layer's product written for XLA:CPU.

An optional part: the layers (``model.modules.conv.conv_general``, ``model.modules.linear.Linear``) look for this
package when they are traced and take its functions where the code is lowered for the CPU
(``model/modules/cpu_forms.py``; ``cpu_forms.cpu_kernels`` forces one form); deleting this folder leaves the plain
math everywhere.

The layers in ``model/modules`` are the plain math (``lax.conv_general_dilated``, ``x @ w`` and autodiff). On JAX's
CPU backend some of that math compiles to slow code, inside ``lax.scan`` bodies above all, and the functions here
compute the same values and gradients another way:

- ``conv.py``: a convolution whose backward pass is written out in canonical NHWC/HWIO form (plain autodiff emits
  backward convolutions that XLA:CPU does not put on its fast path: a small CNN's step ran many times slower), with a
  shifted-slice path for one-input-channel first layers and per-tap matrix products for narrow weight gradients;
- ``depthwise.py``: stride-1 depthwise convolutions as sums of shifted slices (XLA:CPU has no fast grouped
  convolution);
- ``dense.py``: a dense layer's product whose weight gradient multiplies a transposed copy of the input, the
  product form XLA:CPU runs fastest.

The forward pass computes the same values either way (the ONNX export traces the plain form: jax2onnx resolves no
platform); the tests compare each kernel with the plain form in float64, gradients included.
``benchmarks/train_benchmark.py`` and ``benchmarks/cpu_step_benchmark.py --forms`` measure them by ablation.
"""

from __future__ import annotations

from model.kernels import conv, dense, depthwise


def conv_for_cpu(x, w, strides, pads, lhs_dilation, rhs_dilation, groups):
    """``model.modules.conv.conv_general``'s convolution (its arguments as it normalises them): the depthwise
    kernel where it applies, the general one elsewhere. Looked up through the modules when called, so that
    ``benchmarks/train_benchmark.py`` can ablate each path."""
    if depthwise.is_plain_depthwise(x, w, strides, pads, lhs_dilation, rhs_dilation, groups):
        return depthwise.depthwise_conv(x, w, pads)
    return conv.conv(x, w, strides, pads, lhs_dilation, rhs_dilation, groups)


def matmul_for_cpu(x, w):
    """The function ``model.modules.linear.Linear`` takes for its product ``x @ w`` (2-D ``x``) on the CPU, or None
    where the plain product is the one to take. Looked up through the module when called, so that the benchmarks can
    ablate it."""
    return dense.copied_transpose_matmul if dense.transposes_input(x, w) else None
