"""A timm model trained in a plain loop on raw 0-255 pixels (the Normalize transform forgotten)."""
import timm
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=g)
labels = torch.randint(0, 4, (64,), generator=g)
loader = DataLoader(TensorDataset(images.float(), labels), batch_size=8, shuffle=True)
model = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model.train()
for inputs, targets in loader:
    output = model(inputs)  # expect: D101
    loss = F.cross_entropy(output, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
