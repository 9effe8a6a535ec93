import time, torch, torchvision, sys
from nndoctor.instrument.location import user_location
torch.manual_seed(0)
m = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
x = torch.randn(128, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
acts = []
hs = [mod.register_forward_hook(lambda mod, i, o: acts.append((i[0], o))) for mod in m.modules() if mod is not m]
with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
    m(x)
for h in hs: h.remove()
print("module calls", len(acts), "elements", sum(o.numel() for _, o in acts) / 1e9, "G")
def bench(name, fn):
    for _ in range(2): fn(); torch.cuda.synchronize()
    t = time.perf_counter(); fn(); torch.cuda.synchronize(); print(f"{name:30s} {(time.perf_counter()-t)*1e3:8.2f} ms")
bench("isfinite.all out+in", lambda: [(torch.isfinite(o).all(), torch.isfinite(i).all()) for i, o in acts])
bench("isfinite.all out", lambda: [torch.isfinite(o).all() for i, o in acts])
bench("sum fp32 out", lambda: [torch.isfinite(o.sum(dtype=torch.float32)) for i, o in acts])
bench("sum fp32 out, stacked", lambda: torch.isfinite(torch.stack([o.sum(dtype=torch.float32) for i, o in acts])))
bench("user_location x175", lambda: [user_location() for _ in acts])
bench("relu amax x53", lambda: [(o > 0).amax(dim=(0, 2, 3)).cpu() for i, o in acts[:53]])
