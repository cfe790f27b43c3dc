"""An image file someone else made, opened for decoding: only a regular file (a FIFO would block the read), at most
MAX_PIXELS pixels by its header (a few kB of PNG can declare gigapixels), and 16-bit gray scaled to 8 bits, v * 255 /
65535 rounded, where Pillow's conversion to "L" or "RGB" would clip every value above 255 to white. 32-bit integer
and floating-point pixels have no range to scale from and are refused. ``inference/predict.py`` repeats these rules,
since it ships alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from files.reads import open_regular

# Past this an image is a decompression bomb, not a training image: refused from its header, before decoding.
# Pillow's own guard (DecompressionBombError, from twice its MAX_IMAGE_PIXELS) stops larger ones in Image.open.
MAX_PIXELS = 1 << 27


@contextmanager
def open_image(path: str | Path) -> Iterator:
    """The Pillow image of `path`, in a mode its "L"/"RGB" conversion reads correctly; ValueError naming the file
    for a file that is not regular, too many pixels, or pixels of 32 bits."""
    from PIL import Image

    with open_regular(path) as f, Image.open(f) as image:
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise ValueError(f"{path}: {width} x {height} pixels, more than the {MAX_PIXELS:,} an image may have")
        if image.mode.startswith("I;16") or image.mode == "I":
            pixels = np.asarray(image)
            if pixels.size and (pixels.min() < 0 or pixels.max() > 65535):
                raise ValueError(f"{path}: 32-bit integer pixels ({pixels.min()}..{pixels.max()}), not 8 or 16 bits")
            yield Image.fromarray(((pixels.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8), "L")
        elif image.mode == "F":
            raise ValueError(f"{path}: floating-point pixels have no range to scale to 8 bits; save it as 8 or 16 bits")
        else:
            yield image
