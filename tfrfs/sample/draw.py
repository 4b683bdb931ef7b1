"""The sample's pictures, drawn with Pillow from a seeded ``random.Random``: landscapes with
cats, dogs, birds and cars whose boxes are tight around each drawing (``draw_scene``), MNIST-like
handwritten digits drawn as strokes so no font is needed (``draw_digit``), the classes they show,
and the JPEG or PNG encoding of an image."""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from PIL import Image, ImageDraw

# (id, name, display name): ids start at 1, as the Object Detection API reserves 0 for background.
CLASSES: tuple[tuple[int, str, str], ...] = (
    (1, "cat", "Cat"),
    (2, "dog", "Dog"),
    (3, "bird", "Bird"),
    (4, "car", "Car"),
)
CLASS_ID = {name: cid for cid, name, _ in CLASSES}

MNIST_SIZE = 28
JPEG_QUALITY = 85


def encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpeg":
        img.save(buf, format="JPEG", quality=JPEG_QUALITY)
    else:
        img.save(buf, format="PNG")
    return buf.getvalue()


# --- scenes ----------------------------------------------------------------

@dataclass(frozen=True)
class Box:
    """A drawn object in pixels; ``x1`` and ``y1`` are exclusive."""

    cls: str
    x0: int
    y0: int
    x1: int
    y1: int

    def normalised(self, width: int, height: int) -> tuple[float, float, float, float]:
        """(xmin, ymin, xmax, ymax) in [0, 1], as the Object Detection API stores them."""
        return self.x0 / width, self.y0 / height, self.x1 / width, self.y1 / height


RGB = tuple[int, int, int]


def _jitter(rng: random.Random, colour: RGB, spread: int = 18) -> RGB:
    r, g, b = (min(255, max(0, c + rng.randint(-spread, spread))) for c in colour)
    return r, g, b


def _mix(a: RGB, b: RGB, t: float) -> RGB:
    return (round(a[0] + (b[0] - a[0]) * t), round(a[1] + (b[1] - a[1]) * t), round(a[2] + (b[2] - a[2]) * t))


_SKIES: tuple[tuple[RGB, RGB], ...] = (
    ((92, 148, 214), (196, 224, 246)),   # clear day
    ((250, 160, 96), (255, 222, 170)),   # sunset
    ((120, 130, 150), (196, 200, 210)),  # overcast
    ((70, 110, 190), (170, 205, 240)),
)
_GROUNDS: tuple[tuple[RGB, RGB], ...] = (
    ((96, 160, 72), (60, 118, 46)),      # grass
    ((214, 190, 140), (180, 150, 100)),  # sand
    ((110, 110, 116), (78, 78, 84)),     # asphalt
    ((140, 170, 90), (96, 130, 60)),
)


def draw_background(rng: random.Random, width: int, height: int) -> tuple[Image.Image, int]:
    """Sky and ground with a horizon; returns the image and the horizon's row."""
    img = Image.new("RGB", (width, height))
    draw = ImageDraw.Draw(img)
    horizon = rng.randint(int(height * 0.4), int(height * 0.6))
    sky_top, sky_low = (_jitter(rng, c) for c in rng.choice(_SKIES))
    near, far = (_jitter(rng, c) for c in rng.choice(_GROUNDS))
    for y in range(height):
        if y < horizon:
            colour = _mix(sky_top, sky_low, y / max(1, horizon - 1))
        else:
            colour = _mix(near, far, (y - horizon) / max(1, height - horizon - 1))
        draw.line([(0, y), (width - 1, y)], fill=colour)
    if rng.random() < 0.6:  # the sun
        r = max(3, width // 20)
        cx, cy = rng.randint(r, width - r), rng.randint(r, max(r, horizon // 2))
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(255, 236, 140))
    for _ in range(rng.randint(0, 2)):  # clouds: unlabelled, as real scenes have unlabelled things
        cw = rng.randint(width // 8, width // 4)
        cx, cy = rng.randint(0, width - cw), rng.randint(0, max(1, horizon // 2))
        for k in range(3):
            ox = cx + k * cw // 3
            draw.ellipse([ox, cy, ox + cw // 2, cy + cw // 4], fill=(246, 246, 250))
    return img, horizon


def _draw_cat(d: ImageDraw.ImageDraw, rng: random.Random, x0: int, y0: int, w: int, h: int) -> None:
    fur = _jitter(rng, rng.choice(((232, 140, 60), (120, 120, 124), (60, 52, 48), (236, 226, 210))), 10)
    dark = _mix(fur, (0, 0, 0), 0.45)
    d.line([(x0 + w * 0.08, y0 + h * 0.6), (x0, y0 + h * 0.3)], fill=dark, width=max(2, w // 14))  # tail
    d.ellipse([x0 + w * 0.05, y0 + h * 0.42, x0 + w * 0.72, y0 + h - 1], fill=fur)  # body
    hx0, hy0, hx1, hy1 = x0 + w * 0.5, y0 + h * 0.16, x0 + w - 1, y0 + h * 0.62
    for ex in (hx0 + (hx1 - hx0) * 0.12, hx0 + (hx1 - hx0) * 0.58):  # ears
        d.polygon([(ex, hy0 + 3), (ex + (hx1 - hx0) * 0.15, y0), (ex + (hx1 - hx0) * 0.3, hy0 + 3)], fill=fur)
    d.ellipse([hx0, hy0, hx1, hy1], fill=fur)
    eye = max(1, w // 24)
    for ex in (hx0 + (hx1 - hx0) * 0.32, hx0 + (hx1 - hx0) * 0.68):
        ey = hy0 + (hy1 - hy0) * 0.42
        d.ellipse([ex - eye, ey - eye, ex + eye, ey + eye], fill=(30, 110, 40))


def _draw_dog(d: ImageDraw.ImageDraw, rng: random.Random, x0: int, y0: int, w: int, h: int) -> None:
    fur = _jitter(rng, rng.choice(((150, 96, 52), (210, 180, 130), (70, 56, 44), (240, 240, 236))), 10)
    dark = _mix(fur, (0, 0, 0), 0.5)
    leg = max(2, w // 10)
    for lx in (x0 + w * 0.1, x0 + w * 0.25, x0 + w * 0.5, x0 + w * 0.62):  # legs
        d.rectangle([lx, y0 + h * 0.6, lx + leg, y0 + h - 1], fill=dark)
    d.line([(x0 + w * 0.08, y0 + h * 0.42), (x0, y0 + h * 0.2)], fill=fur, width=max(2, w // 14))  # tail
    d.rounded_rectangle([x0 + w * 0.05, y0 + h * 0.35, x0 + w * 0.75, y0 + h * 0.72], radius=max(2, h // 8), fill=fur)
    hx0, hy0, hx1, hy1 = x0 + w * 0.58, y0, x0 + w - 1, y0 + h * 0.5
    d.ellipse([hx0, hy0, hx1, hy1], fill=fur)
    d.ellipse([hx0 - 1, hy0 + 2, hx0 + (hx1 - hx0) * 0.35, hy1], fill=dark)  # floppy ear
    nose = max(1, w // 20)
    d.ellipse([hx1 - 2 * nose - 1, (hy0 + hy1) / 2 - nose, hx1 - 1, (hy0 + hy1) / 2 + nose], fill=(20, 20, 20))


def _draw_bird(d: ImageDraw.ImageDraw, rng: random.Random, x0: int, y0: int, w: int, h: int) -> None:
    body = _jitter(rng, rng.choice(((60, 110, 200), (210, 60, 50), (240, 200, 40), (90, 90, 96))), 10)
    d.ellipse([x0, y0 + h * 0.25, x0 + w * 0.8, y0 + h - 1], fill=body)
    d.ellipse([x0 + w * 0.5, y0, x0 + w * 0.88, y0 + h * 0.55], fill=body)  # head
    d.polygon([(x0 + w * 0.86, y0 + h * 0.2), (x0 + w - 1, y0 + h * 0.3), (x0 + w * 0.86, y0 + h * 0.4)],
              fill=(250, 170, 40))  # beak
    d.polygon([(x0 + w * 0.2, y0 + h * 0.5), (x0 + w * 0.45, y0 + h * 0.15), (x0 + w * 0.55, y0 + h * 0.55)],
              fill=_mix(body, (0, 0, 0), 0.35))  # wing
    d.point([(x0 + w * 0.72, y0 + h * 0.22)], fill=(0, 0, 0))


def _draw_car(d: ImageDraw.ImageDraw, rng: random.Random, x0: int, y0: int, w: int, h: int) -> None:
    paint = _jitter(rng, rng.choice(((200, 30, 40), (30, 80, 180), (240, 240, 240), (250, 200, 30), (40, 40, 44))), 10)
    d.polygon([(x0 + w * 0.22, y0 + h * 0.42), (x0 + w * 0.32, y0), (x0 + w * 0.68, y0), (x0 + w * 0.8, y0 + h * 0.42)],
              fill=paint)  # cabin
    d.polygon([(x0 + w * 0.3, y0 + h * 0.4), (x0 + w * 0.36, y0 + h * 0.1), (x0 + w * 0.64, y0 + h * 0.1),
               (x0 + w * 0.72, y0 + h * 0.4)], fill=(170, 210, 235))  # windows
    d.rounded_rectangle([x0, y0 + h * 0.38, x0 + w - 1, y0 + h * 0.82], radius=max(2, h // 8), fill=paint)
    r = h * 0.2
    for cx in (x0 + w * 0.25, x0 + w * 0.75):
        d.ellipse([cx - r, y0 + h - 1 - 2 * r, cx + r, y0 + h - 1], fill=(25, 25, 25))
        d.ellipse([cx - r / 2, y0 + h - 1 - 1.5 * r, cx + r / 2, y0 + h - 1 - 0.5 * r], fill=(150, 150, 150))


DRAWERS: dict[str, Callable[[ImageDraw.ImageDraw, random.Random, int, int, int, int], None]] = {
    "cat": _draw_cat, "dog": _draw_dog, "bird": _draw_bird, "car": _draw_car,
}
# (min width, max width, height / width) as fractions of the image width
_SHAPE: dict[str, tuple[float, float, float]] = {
    "cat": (0.18, 0.32, 0.8), "dog": (0.2, 0.36, 0.75), "bird": (0.1, 0.18, 0.7), "car": (0.26, 0.42, 0.55),
}


def place_object(rng: random.Random, cls: str, width: int, height: int, horizon: int) -> Box:
    lo, hi, aspect = _SHAPE[cls]
    w = max(6, round(width * rng.uniform(lo, hi)))
    h = max(5, min(height - 1, round(w * aspect)))
    x0 = rng.randint(0, width - w)
    if cls == "bird":  # birds fly
        y0 = rng.randint(0, max(0, horizon - h))
    else:  # everything else stands on the ground
        y1 = rng.randint(min(height, horizon + h // 3), height)
        y0 = max(0, y1 - h)
    return Box(cls, x0, y0, x0 + w, y0 + h)


def _overlap(a: Box, b: Box) -> float:
    """Intersection over the smaller box's area."""
    iw = min(a.x1, b.x1) - max(a.x0, b.x0)
    ih = min(a.y1, b.y1) - max(a.y0, b.y0)
    if iw <= 0 or ih <= 0:
        return 0.0
    smaller = min((a.x1 - a.x0) * (a.y1 - a.y0), (b.x1 - b.x0) * (b.y1 - b.y0))
    return iw * ih / smaller


def draw_scene(rng: random.Random, width: int, height: int, n_objects: int,
               classes: Sequence[str] | None = None) -> tuple[Image.Image, list[Box]]:
    """A landscape with ``n_objects`` labelled objects; boxes are tight around each drawing."""
    img, horizon = draw_background(rng, width, height)
    names = [name for _, name, _ in CLASSES]
    boxes: list[Box] = []
    for i in range(n_objects):
        cls = classes[i] if classes is not None else rng.choice(names)
        for _ in range(20):  # keep objects mostly apart, so each box shows its object
            box = place_object(rng, cls, width, height, horizon)
            if all(_overlap(box, other) < 0.25 for other in boxes):
                break
        boxes.append(box)
    # Farther objects (higher up) first, so nearer ones are drawn over them.
    boxes.sort(key=lambda b: (b.y1, b.x0))
    for box in boxes:
        flip = rng.random() < 0.5
        layer = Image.new("RGBA", (box.x1 - box.x0, box.y1 - box.y0), (0, 0, 0, 0))
        DRAWERS[box.cls](ImageDraw.Draw(layer), rng, 0, 0, box.x1 - box.x0, box.y1 - box.y0)
        if flip:
            layer = layer.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        img.paste(layer, (box.x0, box.y0), layer)
    return img, boxes


# --- digits ----------------------------------------------------------------

def _arc(cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int = 18) -> list[tuple[float, float]]:
    """Points along an ellipse from angle ``a0`` to ``a1`` (degrees; y grows downwards)."""
    return [(cx + rx * math.cos(math.radians(a0 + (a1 - a0) * k / n)),
             cy + ry * math.sin(math.radians(a0 + (a1 - a0) * k / n))) for k in range(n + 1)]


# Each digit as strokes in a unit square, like a pen would write it.
_DIGITS: dict[int, list[list[tuple[float, float]]]] = {
    0: [_arc(0.5, 0.5, 0.19, 0.31, -90, 270, 28)],
    1: [[(0.38, 0.3), (0.53, 0.18), (0.53, 0.82)]],
    2: [_arc(0.5, 0.36, 0.19, 0.18, 190, 400) + [(0.3, 0.82), (0.72, 0.82)]],
    3: [_arc(0.49, 0.33, 0.17, 0.15, 200, 450) + _arc(0.49, 0.65, 0.19, 0.17, -90, 160)],
    4: [[(0.58, 0.18), (0.28, 0.62), (0.74, 0.62)], [(0.6, 0.36), (0.6, 0.84)]],
    5: [[(0.7, 0.18), (0.37, 0.18), (0.34, 0.48)] + _arc(0.5, 0.63, 0.2, 0.19, 230, 510)],
    6: [[(0.66, 0.17), (0.5, 0.25), (0.38, 0.42)] + _arc(0.5, 0.66, 0.18, 0.17, 200, 560, 24)],
    7: [[(0.28, 0.2), (0.72, 0.2), (0.46, 0.84)]],
    8: [_arc(0.5, 0.33, 0.15, 0.15, 90, 450) + _arc(0.5, 0.66, 0.19, 0.18, -90, 270, 24)],
    9: [_arc(0.5, 0.36, 0.18, 0.17, 20, 380, 24) + [(0.68, 0.6), (0.6, 0.84)]],
}


def draw_digit(rng: random.Random, digit: int, size: int = MNIST_SIZE) -> Image.Image:
    """An MNIST-like gray digit: white strokes on black, slanted and jittered like handwriting."""
    scale = 4  # drawn large and scaled down, so strokes get MNIST's soft gray edges
    big = size * scale
    img = Image.new("L", (big, big), 0)
    d = ImageDraw.Draw(img)
    slant = rng.uniform(-0.3, 0.1)
    zoom = rng.uniform(0.85, 1.08)
    dx, dy = rng.uniform(-0.05, 0.05), rng.uniform(-0.04, 0.04)
    width = rng.randint(9, 13)

    def at(p: tuple[float, float]) -> tuple[float, float]:
        x = 0.5 + (p[0] - 0.5) * zoom - slant * (p[1] - 0.5) + dx
        y = 0.5 + (p[1] - 0.5) * zoom + dy
        return x * big, y * big

    for stroke in _DIGITS[digit]:
        pts = [at(p) for p in stroke]
        d.line(pts, fill=255, width=width, joint="curve")
        for x, y in (pts[0], pts[-1]):  # round pen ends
            d.ellipse([x - width / 2, y - width / 2, x + width / 2, y + width / 2], fill=255)
    return img.resize((size, size), Image.Resampling.BOX)
