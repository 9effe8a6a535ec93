"""nndoctor's demo: a small image classifier with five classic, silent training bugs.

The data is generated here (coloured shapes drawn with numpy), so nothing is downloaded.
Each bug is marked with a BUG comment; `nndoctor demo` runs this script under the doctor.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

CLASSES = ("square", "disc", "cross", "stripes")


def draw(kind: int, rng: np.random.Generator) -> np.ndarray:
    """A 32×32 RGB uint8 image of one shape on a noisy background (0–255, H,W,C)."""
    img = rng.integers(0, 60, size=(32, 32, 3)).astype(np.float32)
    colour = rng.integers(120, 256, size=3)
    yy, xx = np.mgrid[:32, :32]
    cy, cx, r = rng.integers(10, 22), rng.integers(10, 22), rng.integers(5, 9)
    if kind == 0:
        mask = (abs(yy - cy) < r) & (abs(xx - cx) < r)
    elif kind == 1:
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
    elif kind == 2:
        mask = ((abs(yy - cy) < 2) & (abs(xx - cx) < r)) | ((abs(xx - cx) < 2) & (abs(yy - cy) < r))
    else:
        mask = (xx // 3) % 2 == 0
    img[mask] = colour
    return img.astype(np.uint8)


class Shapes(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, len(CLASSES), size=n)
        self.images = np.stack([draw(int(k), rng) for k in self.labels])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = torch.from_numpy(self.images[i]).permute(2, 0, 1).float()  # BUG: still 0-255
        return image, int(self.labels[i])


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(32, len(CLASSES)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.classifier(self.features(x)), dim=1)  # BUG: softmax before CE


def main() -> None:
    torch.manual_seed(0)
    train = DataLoader(Shapes(512, seed=1), batch_size=32, shuffle=True)
    val_set = Shapes(128, seed=2)
    val = DataLoader(val_set, batch_size=64)
    model = SmallNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(2):
        model.train()
        for images, labels in train:
            loss = criterion(model(images), labels)
            loss.backward()  # BUG: optimizer.zero_grad() is never called
            optimizer.step()
            losses.append(loss)  # BUG: keeps every graph alive; use loss.item()
        correct = 0
        with torch.no_grad():  # BUG: model.eval() forgotten
            for images, labels in val:
                correct += (model(images).argmax(1) == labels).sum().item()
        mean_loss = sum(x.item() for x in losses[-len(train):]) / len(train)
        print(f"epoch {epoch}: train loss {mean_loss:.3f}  val accuracy {correct / len(val_set):.1%}")


if __name__ == "__main__":
    main()
