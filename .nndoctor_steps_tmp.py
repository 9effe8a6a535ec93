import sys, time, statistics, torch, torchvision, nndoctor
import torch.nn as nn
dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
def make():
    torch.manual_seed(0)
    if dev.type == "cuda":
        m = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last); B, S = 128, 224
    else:
        m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(128, 10)); B, S = 64, 32
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(B, 3, S, S, device=dev)
    y = torch.randint(0, 10, (B,), device=dev)
    if dev.type == "cuda": x = x.contiguous(memory_format=torch.channels_last)
    return m, opt, x, y
def sync():
    if dev.type == "cuda": torch.cuda.synchronize()
def run(select):
    m, opt, x, y = make(); times = []
    ctx = nndoctor.watch(select=select) if select is not None else None
    if ctx: ctx.__enter__()
    for i in range(97):
        sync(); t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = nn.functional.cross_entropy(m(x), y)
        loss.backward(); opt.step(); sync()
        times.append(time.perf_counter() - t)
    if ctx: ctx.__exit__(None, None, None)
    samp = [times[i] for i in (32, 64, 96)]
    rest = [times[i] for i in range(20, 97) if i % 32]
    return statistics.median(rest) * 1e3, statistics.mean(samp) * 1e3
MINE = "O104,O105,O106,O109,N101,N102,N103,N104,N105,B101,B102,B103,R101,R102,C104,C105"
configs = [("plain", None), ("R101 (hooks only)", ["R101"])] + [(c, c.split(",")) for c in sys.argv[2:]]
for name, sel in configs:
    run(sel)  # warm
    ns, s = run(sel)
    print(f"{name:40s} unsampled {ns:7.2f} ms  sampled {s:8.2f} ms", flush=True)
