"""Raw pixel arrays (SPEC 3.3) <-> PNG: the PNG a raw pixel array is shown as, and the pixels a
PNG written in its place stands for. Which values are raw pixel arrays is ``shown_as``'s to say.
"""

from __future__ import annotations

import io

from tfrfs.errors import Invalid
from tfrfs.format.shown_as import Shape

_PIXEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def encode_png(data: bytes, shape: Shape) -> bytes:
    """The PNG of raw pixel array ``data`` of ``shape``, the same bytes on every call."""
    if shape.channels not in _PIXEL_MODES or len(data) != shape.height * shape.width * shape.channels:
        raise ValueError(f"{len(data)} bytes are not a raw pixel array of shape {shape}")
    from PIL import Image   # Pillow loads when a raw image is first shown, not in every command
    image = Image.frombytes(_PIXEL_MODES[shape.channels], (shape.width, shape.height), data)
    buf = io.BytesIO()
    # No metadata chunks and a fixed zlib level keep the bytes the same on every render (stat
    # sizes must not change); level 1 because this runs when a user opens a record folder.
    image.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Pillow mode of a decoded PNG -> (mode to convert to, channels). Chosen so no sample is lost:
# bilevel becomes 0/255 gray; gray+alpha becomes RGBA (gray repeated) rather than dropping alpha;
# palette images expand to RGB, or RGBA when the palette carries transparency (decided below).
_PNG_MODES = {
    "L": ("L", 1),
    "RGB": ("RGB", 3),
    "RGBA": ("RGBA", 4),
    "1": ("L", 1),
    "LA": ("RGBA", 4),
    "PA": ("RGBA", 4),
    "P": ("RGB", 3),
}


def parse_raw_png(data: bytes) -> tuple[bytes, Shape]:
    """The raw uint8 pixels and Shape of a PNG written for a key shown as raw pixel arrays.

    16-bit PNGs are refused rather than cut to 8 bits: silently dropping precision from a
    dataset is worse than asking for an 8-bit save. A transparency key colour in a gray or
    RGB PNG (tRNS) is ignored, as 3.3 has no way to hold it. An animated PNG gives its first frame.
    """
    if not data.startswith(_PNG_MAGIC):
        raise Invalid("this key holds raw pixel arrays: the file must be a PNG image")
    # IHDR is always the first chunk; its bit depth byte sits at offset 24.
    if len(data) > 24 and data[12:16] == b"IHDR" and data[24] == 16:
        raise Invalid("16-bit PNG: raw pixel arrays hold 8-bit samples; save the image as 8-bit")
    try:
        from PIL import Image
        with Image.open(io.BytesIO(data), formats=["PNG"]) as image:
            image.load()
            mode = image.mode
            if mode not in _PNG_MODES:
                raise Invalid(f"PNG mode {mode} cannot be stored as 8-bit gray, RGB or RGBA pixels")
            target, channels = _PNG_MODES[mode]
            if mode == "P" and ("transparency" in image.info or image.palette.mode == "RGBA"):
                target, channels = "RGBA", 4
            if mode != target:
                image = image.convert(target)
            return image.tobytes(), Shape(image.height, image.width, channels)
    except Invalid:
        raise
    except Exception as exc:  # Pillow raises OSError, ValueError, SyntaxError, DecompressionBombError...
        raise Invalid(f"cannot decode the PNG: {exc}") from None
