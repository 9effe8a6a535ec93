"""A timm model in a plain loop shaped like timm's train.py (train_one_epoch / validate).

A timm MobileNetV3 (timm's BatchNormAct2d, SqueezeExcite, hard-swish) built
without pretrained weights; ``create_optimizer_v2`` (AdamW, no decay on norms/biases), a
cosine ``create_scheduler_v2`` schedule updated per step with ``step_update`` and per epoch
with ``step``, label-smoothing cross-entropy, a model EMA, ``model.eval()`` + ``no_grad``
validation. Images are synthetic, in [0, 1], normalized with timm's ImageNet mean/std.
"""
import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
MEAN = torch.tensor(IMAGENET_DEFAULT_MEAN).view(3, 1, 1)
STD = torch.tensor(IMAGENET_DEFAULT_STD).view(3, 1, 1)


def quadrant_images(count, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (count,), generator=g)
    images = torch.rand(count, 3, 32, 32, generator=g) * 0.3
    for i, label in enumerate(labels.tolist()):
        row, col = divmod(label, 2)
        images[i, :, row * 16 + 4: row * 16 + 12, col * 16 + 4: col * 16 + 12] += 0.6
    return TensorDataset((images - MEAN) / STD, labels)


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, lr_scheduler, model_ema):
    model.train()
    num_updates = epoch * len(loader)
    for inputs, targets in loader:
        output = model(inputs)
        loss = loss_fn(output, targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        model_ema.update(model)
        num_updates += 1
        lr_scheduler.step_update(num_updates=num_updates)
    return loss.item()


def validate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for inputs, targets in loader:
            correct += (model(inputs).argmax(1) == targets).sum().item()
    return correct / len(loader.dataset)


train_loader = DataLoader(quadrant_images(64, 1), batch_size=8, shuffle=True)
val_loader = DataLoader(quadrant_images(16, 2), batch_size=16)
model = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=4)
model_ema = ModelEmaV3(model, decay=0.9)
optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
lr_scheduler, num_epochs = create_scheduler_v2(
    optimizer, sched="cosine", num_epochs=2, warmup_epochs=0, updates_per_epoch=len(train_loader))
loss_fn = LabelSmoothingCrossEntropy(smoothing=0.1)
for epoch in range(num_epochs):
    loss = train_one_epoch(epoch, model, train_loader, optimizer, loss_fn, lr_scheduler, model_ema)
    lr_scheduler.step(epoch + 1)
    print(f"epoch {epoch}: loss {loss:.3f} val acc {validate(model, val_loader):.2f} "
          f"ema acc {validate(model_ema.module, val_loader):.2f}")
