"""Generated images whose stats are known (tests/cli/test_stats.py, bench/stats_bench.py):
distinct smooth 'photos', and the variants a data set picks up by accident."""
import io

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter


def photo(seed, size=128, lookalike=None):
    """A distinct synthetic photo: a smooth random field (low frequencies, like most photos),
    a few discs, fine grain. `lookalike=k` keeps the palette and brightness of `seed` and draws
    other shapes: an unrelated picture that looks alike."""
    palette = np.random.default_rng(seed)
    amps, level = palette.uniform(20, 60, (6, 3)), palette.uniform(90, 160)
    disc_colours = palette.uniform(-80, 80, (4, 3))
    rng = np.random.default_rng(seed if lookalike is None else 10**6 + lookalike)
    h, w = (size, size) if isinstance(size, int) else size
    y, x = np.mgrid[0:h, 0:w]
    y, x = y / max(h, w), x / max(h, w)
    img = np.zeros((h, w, 3))
    for amp in amps:
        fx, fy = rng.uniform(-2.5, 2.5, 2)
        img += amp * np.sin(2 * np.pi * (fx * x + fy * y) + rng.uniform(0, 6.3))[..., None]
    for colour in disc_colours:
        cx, cy, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.25)
        img[((x - cx) ** 2 + (y - cy) ** 2) < r * r] += colour
    img = img - img.mean() + level + rng.normal(0, 6, (h, w, 1))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def jpeg(img, quality=90):
    b = io.BytesIO()
    img.save(b, "JPEG", quality=quality)
    return b.getvalue()


def reencoded(img):
    return Image.open(io.BytesIO(jpeg(img, 50))).convert("RGB")


def resized(img, f=0.9):
    return img.resize((round(img.width * f), round(img.height * f)), Image.BILINEAR)


def shifted(img, dx=2, dy=1):
    a = np.pad(np.asarray(img), ((dy, 0), (dx, 0), (0, 0)), mode="edge")
    return Image.fromarray(np.ascontiguousarray(a[:img.height, :img.width]))


def brighter(img, f=1.08):
    return ImageEnhance.Brightness(img).enhance(f)


def blurred(img, radius=3):
    return img.filter(ImageFilter.GaussianBlur(radius))


def dark(img):
    return Image.fromarray((np.asarray(img) * 0.08).astype(np.uint8))


def uniform(rgb=(120, 130, 140), size=128):
    return Image.new("RGB", (size, size), rgb)


PERTURBATIONS = {"reencoded": reencoded, "resized": resized, "shifted": shifted,
                 "brighter": brighter}
