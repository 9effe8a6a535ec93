"""A timm model validated under no_grad without model.eval(): BatchNorm and Dropout stay in training mode."""
import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
mean, std = torch.tensor(IMAGENET_DEFAULT_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_DEFAULT_STD).view(3, 1, 1)
images = (torch.rand(80, 3, 32, 32, generator=g) - mean) / std
labels = torch.randint(0, 4, (80,), generator=g)
train_loader = DataLoader(TensorDataset(images[:64], labels[:64]), batch_size=8, shuffle=True)
val_loader = DataLoader(TensorDataset(images[64:], labels[64:]), batch_size=16)
model = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=4, drop_rate=0.2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = torch.nn.CrossEntropyLoss()
for epoch in range(2):
    model.train()
    for inputs, targets in train_loader:
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    correct = 0
    with torch.no_grad():  # model.eval() forgotten
        for inputs, targets in val_loader:
            correct += (model(inputs).argmax(1) == targets).sum().item()  # expect: M101
    print(f"epoch {epoch}: val accuracy {correct / 16:.2f}")
