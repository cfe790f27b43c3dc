from model import kernels  # noqa: F401 [feature: kernels] the convolution written for XLA:CPU
