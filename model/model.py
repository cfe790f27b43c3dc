"""The sample models `config.json` can name in `model.name`; their keyword arguments are the config's `args`.

Add a model by writing a function here that returns a Module, decorated with ``@register("model")``; with
``example=(args, sample shape, input kind)`` beside it (``model/registry.py``), every export route is checked on it.
"""

from __future__ import annotations

from model.modules.activations import Activation
from model.modules.attention import MultiHeadAttention
from model.modules.branches import Branches, Heads
from model.modules.conv import Conv2d, ConvTranspose2d
from model.modules.dropout import Dropout
from model.modules.flatten import Flatten
from model.modules.linear import Linear
from model.modules.module import Lambda, Module, check_size, check_sizes
from model.modules.normalization import BatchNorm, LayerNorm
from model.modules.pooling import GlobalAvgPool, MaxPool2d
from model.modules.residual import Residual
from model.modules.sequential import Sequential
from model.modules.transformer import TransformerClassifier, TransformerLM
from model.registry import register


def convnext_block(dim: int, kernel_size: int = 7, mlp_ratio: int = 4) -> Module:
    """ConvNeXt block: depthwise conv -> LayerNorm -> pointwise MLP with GELU, added to the input."""
    return Residual(
        Sequential(
            {
                "dwconv": Conv2d(dim, kernel_size, groups=dim),
                "norm": LayerNorm(eps=1e-6),
                "fc1": Linear(mlp_ratio * dim),
                "act": Activation("gelu"),
                "fc2": Linear(dim),
            }
        )
    )


@register("model", example=({"dims": (8, 16), "depths": (1, 1), "dropout": 0.1}, (28, 28, 1), "normal"))
def mnist_convnext(
    num_classes: int = 10,
    dims: tuple = (32, 64),
    depths: tuple = (2, 2),
    kernel_size: int = 7,
    mlp_ratio: int = 4,
    dropout: float = 0.0,
) -> Module:
    """A small ConvNeXt for 28x28 images: a stride-2 stem, stages of ConvNeXt blocks joined by stride-2
    downsampling (LayerNorm + 2x2 conv), global average pooling, LayerNorm and a linear classifier."""
    check_size(num_classes, "num_classes")
    check_sizes(dims, "dims", nonempty=True)
    check_sizes(depths, "depths", minimum=0)
    check_size(kernel_size, "kernel_size")
    check_size(mlp_ratio, "mlp_ratio")
    if len(dims) != len(depths):
        raise ValueError(f"dims {list(dims)} and depths {list(depths)} must have the same length")
    layers = {"stem": Sequential({"conv": Conv2d(dims[0], 4, stride=2), "norm": LayerNorm(eps=1e-6)})}
    for i, (dim, depth) in enumerate(zip(dims, depths)):
        if i > 0:
            layers[f"down{i}"] = Sequential({"norm": LayerNorm(eps=1e-6), "conv": Conv2d(dim, 2, stride=2)})
        layers[f"stage{i}"] = Sequential([convnext_block(dim, kernel_size, mlp_ratio) for _ in range(depth)])
    layers["pool"] = GlobalAvgPool()
    layers["norm"] = LayerNorm(eps=1e-6)
    if dropout:
        layers["dropout"] = Dropout(dropout)
    layers["head"] = Linear(num_classes)
    return Sequential(layers)


def cnn_body(channels: tuple, hidden: int) -> dict:
    """The layers mnist_cnn and mnist_multitask share, by name: [conv3x3 -> ReLU -> 2x2 max pool] per entry of
    `channels`, then a hidden dense layer and its ReLU."""
    layers = {}
    for i, c in enumerate(channels):
        layers[f"conv{i}"] = Conv2d(c, 3)
        layers[f"relu{i}"] = Activation("relu")
        layers[f"pool{i}"] = MaxPool2d(2)
    layers["flatten"] = Flatten()
    layers["fc"] = Linear(hidden)
    layers["relu"] = Activation("relu")
    return layers


@register("model", example=({"channels": (4, 8), "hidden": 16, "dropout": 0.1}, (28, 28, 1), "normal"))
def mnist_cnn(num_classes: int = 10, channels: tuple = (32, 64), hidden: int = 128, dropout: float = 0.0) -> Module:
    """The classic CNN: [conv3x3 -> ReLU -> 2x2 max pool] per entry of `channels`, then a hidden dense layer."""
    check_size(num_classes, "num_classes")
    check_sizes(channels, "channels")
    check_size(hidden, "hidden")
    layers = cnn_body(channels, hidden)
    if dropout:
        layers["dropout"] = Dropout(dropout)
    layers["head"] = Linear(num_classes)
    return Sequential(layers)


@register("model", example=({"channels": (4, 8), "hidden": 16}, (28, 28, 1), "normal"))
def mnist_multitask(num_classes: int = 10, channels: tuple = (16, 32), hidden: int = 64) -> Module:
    """Two outputs of one CNN body ([conv3x3 -> ReLU -> 2x2 max pool] per entry of `channels`, a hidden dense
    layer): ``digit``, the class logits (B, num_classes), and ``ink``, one value per image (B, 1), the regression
    head of the multi-task sample `mnist_multitask`."""
    check_size(num_classes, "num_classes")
    check_sizes(channels, "channels")
    check_size(hidden, "hidden")
    layers = cnn_body(channels, hidden)
    layers["heads"] = Heads({"digit": Linear(num_classes), "ink": Linear(1)})
    return Sequential(layers)


@register("model", example=({"hidden": (16, 8), "activation": "gelu", "dropout": 0.1}, (28, 28, 1), "normal"))
def mlp(num_classes: int = 10, hidden: tuple = (256, 128), activation: str = "relu", dropout: float = 0.0) -> Module:
    """Flatten, then Linear -> activation (-> dropout) per hidden width, then the classifier."""
    check_size(num_classes, "num_classes")
    check_sizes(hidden, "hidden")
    layers = {"flatten": Flatten()}
    for i, width in enumerate(hidden):
        layers[f"fc{i}"] = Linear(width)
        layers[f"act{i}"] = Activation(activation)
        if dropout:
            layers[f"dropout{i}"] = Dropout(dropout)
    layers["head"] = Linear(num_classes)
    return Sequential(layers)


@register("model", example=({"dim": 8, "num_heads": 2}, (28, 28, 1), "normal"))
def mnist_attention(
    num_classes: int = 10, dim: int = 32, num_heads: int = 4, depth: int = 1, mlp_ratio: int = 2, dropout: float = 0.1
) -> Module:
    """A small conv + transformer hybrid: a stride-2 conv stem with BatchNorm, exact GELU and 2x2 max pooling turns
    28x28 images into 7x7 = 49 tokens; `depth` pre-norm blocks of self-attention and a GELU MLP; mean over tokens,
    LayerNorm, dropout and a linear classifier."""
    for name, size in (("num_classes", num_classes), ("dim", dim), ("num_heads", num_heads), ("mlp_ratio", mlp_ratio)):
        check_size(size, name)
    check_size(depth, "depth", minimum=0)
    if dim % num_heads:
        raise ValueError(f"dim: {dim} is not divisible by num_heads {num_heads}")
    layers = {
        "stem": Sequential(
            {"conv": Conv2d(dim, 3, stride=2), "bn": BatchNorm(), "act": Activation("gelu"), "pool": MaxPool2d(2)}
        ),
        "tokens": Lambda(lambda x: x.reshape(x.shape[0], -1, x.shape[-1]), "to_tokens"),
    }
    for i in range(depth):
        layers[f"block{i}"] = Sequential(
            {
                "attn": Residual(Sequential({"norm": LayerNorm(), "mha": MultiHeadAttention(num_heads)})),
                "mlp": Residual(
                    Sequential(
                        {
                            "norm": LayerNorm(),
                            "fc1": Linear(mlp_ratio * dim),
                            "act": Activation("gelu"),
                            "fc2": Linear(dim),
                        }
                    )
                ),
            }
        )
    layers["pool"] = Lambda(lambda x: x.mean(axis=1), "mean_over_tokens")
    layers["norm"] = LayerNorm()
    if dropout:
        layers["dropout"] = Dropout(dropout)
    layers["head"] = Linear(num_classes)
    return Sequential(layers)


@register("model", example=({"channels": (4, 8)}, (28, 28, 1), "normal"))
def mnist_segmenter(channels: tuple = (16, 32), out_channels: int = 1) -> Module:
    """A small fully-convolutional encoder-decoder: per-pixel logits (B, H, W, out_channels) for images of even H, W.

    Two 3x3 convs at full resolution; a stride-2 conv down to half resolution, two 3x3 convs there, and a 2x2
    stride-2 transposed conv back up, added to the full-resolution features (a U-Net skip written as a Residual, so
    edges lost at half resolution come back); a 3x3 conv and a 1x1 conv to the logits.
    """
    check_sizes(channels, "channels")
    if len(channels) != 2:
        raise ValueError(f"channels must be (full resolution, half resolution) widths, got {list(channels)}")
    check_size(out_channels, "out_channels")
    full, half = channels
    return Sequential(
        {
            "enc": Sequential(
                {
                    "conv0": Conv2d(full, 3),
                    "act0": Activation("relu"),
                    "conv1": Conv2d(full, 3),
                    "act1": Activation("relu"),
                }
            ),
            "skip": Residual(
                Sequential(
                    {
                        "down": Conv2d(half, 2, stride=2),
                        "act0": Activation("relu"),
                        "conv0": Conv2d(half, 3),
                        "act1": Activation("relu"),
                        "conv1": Conv2d(half, 3),
                        "act2": Activation("relu"),
                        "up": ConvTranspose2d(full, 2, stride=2),
                    }
                )
            ),
            "act": Activation("relu"),
            "dec": Conv2d(full, 3),
            "dec_act": Activation("relu"),
            "head": Conv2d(out_channels, 1),
        }
    )


@register("model", example=({"vocab_size": 11, "context": 8, "dim": 16, "depth": 2, "num_heads": 2}, (8,), "ids"))
def char_transformer(
    vocab_size: int,
    context: int,
    dim: int = 128,
    depth: int = 4,
    num_heads: int = 4,
    mlp_ratio: int = 4,
    dropout: float = 0.0,
    tie_weights: bool = True,
    use_bias: bool = False,
    attention: str = "auto",
) -> Module:
    """A decoder-only transformer language model (nanoGPT's architecture): token ids (B, T) -> next-token logits
    (B, T, vocab_size), T <= context; learned positions, causal pre-norm blocks, the head tied to the token
    embedding unless ``tie_weights`` is false. ``attention``: "auto" (cuDNN's fused kernel on a GPU where it can
    run, else the plain math), "fused" or "plain"."""
    return TransformerLM(
        vocab_size, context, dim, depth, num_heads, mlp_ratio, dropout, tie_weights, use_bias, attention
    )


@register(
    "model",
    example=({"vocab_size": 11, "num_classes": 3, "context": 8, "dim": 8, "depth": 1, "num_heads": 2}, (8,), "ids"),
)
def text_transformer(
    vocab_size: int,
    num_classes: int,
    context: int,
    dim: int = 64,
    depth: int = 2,
    num_heads: int = 4,
    mlp_ratio: int = 4,
    dropout: float = 0.0,
) -> Module:
    """A transformer encoder classifying padded token sequences: ids (B, T) and the batch's mask (B, T), zero on
    padding -> class logits (B, num_classes); the padding changes nothing."""
    return TransformerClassifier(vocab_size, num_classes, context, dim, depth, num_heads, mlp_ratio, dropout)


def resnet_block(width: int, stride: int = 1, project: bool = False) -> Module:
    """A ResNet basic block: relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x)); the shortcut is the identity,
    or a strided 1x1 convolution with batch norm where the width or resolution changes (``project``)."""
    body = Sequential(
        {
            "conv1": Conv2d(width, 3, stride=stride, use_bias=False),
            "bn1": BatchNorm(),
            "relu": Activation("relu"),
            "conv2": Conv2d(width, 3, use_bias=False),
            "bn2": BatchNorm(),
        }
    )
    shortcut = (
        Sequential({"conv": Conv2d(width, 1, stride=stride, use_bias=False), "bn": BatchNorm()}) if project else None
    )
    return Sequential({"residual": Residual(body, shortcut), "relu": Activation("relu")})


@register("model", example=({"depth": 8, "widths": (4, 8)}, (8, 8, 3), "normal"))
def cifar_resnet(num_classes: int = 10, depth: int = 20, widths: tuple = (16, 32, 64)) -> Module:
    """The CIFAR ResNet of He et al. (2016): a 3x3 stem, then per entry of ``widths`` a stage of (depth - 2) / 6
    basic blocks, each stage after the first halving the resolution; global average pooling and a linear
    classifier. depth 20, 32, 44, 56, 110 give ResNet-20 ... -110 (ResNet-20: 0.27 M parameters). Shortcuts that
    change shape are 1x1 convolutions with batch norm (the paper's option B)."""
    check_size(num_classes, "num_classes")
    check_sizes(widths, "widths", nonempty=True)
    check_size(depth, "depth", minimum=8)
    if (depth - 2) % 6:
        raise ValueError(f"depth: must be 6 n + 2 (20, 32, 44, 56, 110, ...), got {depth}")
    blocks = (depth - 2) // 6
    layers = {
        "stem": Sequential(
            {"conv": Conv2d(widths[0], 3, use_bias=False), "bn": BatchNorm(), "relu": Activation("relu")}
        )
    }
    previous = widths[0]
    for i, width in enumerate(widths):
        stride = 1 if i == 0 else 2
        layers[f"stage{i}"] = Sequential(
            [
                resnet_block(width, stride if b == 0 else 1, project=b == 0 and (stride != 1 or width != previous))
                for b in range(blocks)
            ]
        )
        previous = width
    layers["pool"] = GlobalAvgPool()
    layers["head"] = Linear(num_classes)
    return Sequential(layers)


@register(
    "model",
    example=(
        {"num_classes": 3, "channels": (4,), "hidden": 8, "width": 8},
        {"image": (8, 8, 4), "features": (5,)},
        "normal",
    ),
)
def image_and_features(num_classes: int = 10, channels: tuple = (16, 32), hidden: int = 32, width: int = 64) -> Module:
    """A model of two named inputs, {"image": (B, H, W, C), "features": (B, F)} (e.g. the arrays loader with
    "input": {"image": ..., "features": ...}): conv3x3 -> ReLU -> 2x2 max pool per entry of `channels` and global
    average pooling on the image, a dense layer of `hidden` on the features; both joined, then a dense layer of
    `width` and the classifier."""
    check_size(num_classes, "num_classes")
    check_sizes(channels, "channels", nonempty=True)
    check_size(hidden, "hidden")
    check_size(width, "width")
    image = {}
    for i, c in enumerate(channels):
        image.update({f"conv{i}": Conv2d(c, 3), f"relu{i}": Activation("relu"), f"pool{i}": MaxPool2d(2)})
    image["pool"] = GlobalAvgPool()
    features = Sequential({"fc": Linear(hidden), "relu": Activation("relu")})
    return Sequential(
        {
            "branches": Branches({"image": Sequential(image), "features": features}),
            "fc": Linear(width),
            "relu": Activation("relu"),
            "head": Linear(num_classes),
        }
    )
