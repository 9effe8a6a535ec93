"""CI smoke test for a framework-free install: draw a small class-folder dataset with Pillow, one
image of it grayscale among RGB ones (F102), for `nndoctor data FOLDER`."""
import sys
from pathlib import Path

from PIL import Image, ImageDraw

root = Path(sys.argv[1])
for label, colour in (("circle", (200, 40, 40)), ("square", (40, 40, 200))):
    folder = root / "train" / label
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(12):
        image = Image.new("RGB", (48, 48), (10 * i, 120, 60))
        draw = ImageDraw.Draw(image)
        box = (8 + i, 8, 36 + i, 36)
        (draw.ellipse if label == "circle" else draw.rectangle)(box, fill=colour)
        if label == "square" and i == 5:
            image = image.convert("L")
        image.save(folder / f"{label}_{i:02d}.png")
