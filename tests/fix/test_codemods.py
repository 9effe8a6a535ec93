"""Each codemod on small real-looking scripts: the exact text after, comments kept, and refusals.

No training runs here: a codemod reads only the source and the finding's line (the line marked
``# expect: CODE``), so these tests are pure and fast. The end-to-end tests
(test_fix_e2e.py) run the scripts.
"""

from __future__ import annotations

import textwrap

import pytest

from nndoctor.commands.fix.codemods import CODEMODS, codemod_for
from nndoctor.commands.fix.syntax import FixContext, Uncertain
from nndoctor.core.findings import Finding, Location, Severity
from tests.conftest import expected_lines

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
TRAIN_HEAD = HEAD + ("model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n"
                     "optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n")


def propose(code: str, source: str, evidence: dict | None = None) -> str:
    source = textwrap.dedent(source)
    line = min(expected_lines_of(source)[code])
    finding = Finding(code, "x", Severity.WARNING, "m", "f", Location("train.py", line), evidence or {})
    module = codemod_for(code)
    assert module is not None
    new, title = module.propose(FixContext(source, line, finding, "train.py"))
    assert title
    return new


def expected_lines_of(source: str) -> dict[str, set[int]]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(source)
    return expected_lines(handle.name)


# (code, before, after): ``before`` is a script, ``after`` what the codemod must make of it.
CASES = [
    ("D101", TRAIN_HEAD + """\
images = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
for i in range(0, 64, 16):
    x = images[i:i + 16].float()  # pixels
    logits = model(x)  # expect: D101
""", TRAIN_HEAD + """\
images = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8)
for i in range(0, 64, 16):
    x = images[i:i + 16].float() / 255  # pixels
    logits = model(x)  # expect: D101
"""),
    ("D101", TRAIN_HEAD + """\
for i in range(4):
    batch = {"pixel_values": images[i].float(), "mask": masks[i]}
    out = model(**batch)  # expect: D101
""", TRAIN_HEAD + """\
for i in range(4):
    batch = {"pixel_values": images[i].float() / 255, "mask": masks[i]}
    out = model(**batch)  # expect: D101
"""),
    ("D105", TRAIN_HEAD + """\
loader = DataLoader(
    dataset,
    batch_size=16,
)
for x, y in loader:  # expect: D105
    pass
""", TRAIN_HEAD + """\
loader = DataLoader(
    dataset,
    batch_size=16,
    shuffle=True,
)
for x, y in loader:  # expect: D105
    pass
"""),
    ("D105", TRAIN_HEAD + """\
loader = DataLoader(dataset, batch_size=16, shuffle=False)
for step, (x, y) in enumerate(loader):  # expect: D105
    pass
""", TRAIN_HEAD + """\
loader = DataLoader(dataset, batch_size=16, shuffle=True)
for step, (x, y) in enumerate(loader):  # expect: D105
    pass
"""),
    ("L101", TRAIN_HEAD + """\
model = nn.Sequential(
    nn.Linear(8, 4),
    nn.Softmax(dim=1),  # probabilities
)
loss = nn.CrossEntropyLoss()(model(x), y)  # expect: L101
""", TRAIN_HEAD + """\
model = nn.Sequential(
    nn.Linear(8, 4),  # probabilities
)
loss = nn.CrossEntropyLoss()(model(x), y)  # expect: L101
"""),
    ("L101", TRAIN_HEAD + """\
with torch.no_grad():
    probs = model(x).softmax(dim=1)
    val_loss = F.cross_entropy(probs, y)  # expect: L101
""", TRAIN_HEAD + """\
with torch.no_grad():
    probs = model(x)
    val_loss = F.cross_entropy(probs, y)  # expect: L101
"""),
    # pytorch/examples mnist's shape: the forward names its output, the loss gets a name that
    # holds the model's output, the model is a parameter of train()/test(); argmax elsewhere.
    ("L101", HEAD + """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        x = self.fc(torch.flatten(x, 1))
        output = F.softmax(x, dim=1)
        return output


def train(model, loader, optimizer):
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)  # expect: L101
        loss.backward()
        optimizer.step()


def test(model, loader):
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            pred = output.argmax(dim=1, keepdim=True)


model = Net().to(device)
""", HEAD + """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        x = self.fc(torch.flatten(x, 1))
        output = x
        return output


def train(model, loader, optimizer):
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)  # expect: L101
        loss.backward()
        optimizer.step()


def test(model, loader):
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            pred = output.argmax(dim=1, keepdim=True)


model = Net().to(device)
"""),
    # x = softmax(x); return x: the line goes.
    ("L101", HEAD + """\
class Net(nn.Module):
    def forward(self, x):
        x = self.fc(x)
        x = torch.softmax(x, dim=-1)
        return x


net = Net()
logits = net(batch)
loss = nn.CrossEntropyLoss()(logits, labels)  # expect: L101
""", HEAD + """\
class Net(nn.Module):
    def forward(self, x):
        x = self.fc(x)
        return x


net = Net()
logits = net(batch)
loss = nn.CrossEntropyLoss()(logits, labels)  # expect: L101
"""),
    ("L101", TRAIN_HEAD + """\
loss = F.cross_entropy(F.softmax(model(x), dim=-1), y)  # expect: L101
""", TRAIN_HEAD + """\
loss = F.cross_entropy(model(x), y)  # expect: L101
"""),
    # A softmax at the end of a submodule the forward returns (as in a public ViT fine-tuning script).
    ("L101", HEAD + """\
class Model(nn.Module):
    def __init__(self, base_model):
        super(Model, self).__init__()
        self.base = base_model
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.0),
            nn.Linear(in_features=768, out_features=10),
            nn.Softmax(dim=1))

    def forward(self, x):
        return self.classifier(self.base(x))


model = Model(base).to(device)
loss = nn.CrossEntropyLoss()(model(x), y)  # expect: L101
""", HEAD + """\
class Model(nn.Module):
    def __init__(self, base_model):
        super(Model, self).__init__()
        self.base = base_model
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.0),
            nn.Linear(in_features=768, out_features=10))

    def forward(self, x):
        return self.classifier(self.base(x))


model = Model(base).to(device)
loss = nn.CrossEntropyLoss()(model(x), y)  # expect: L101
"""),
    ("L102", TRAIN_HEAD + """\
criterion = nn.BCEWithLogitsLoss()
prob = torch.sigmoid(model(x))
loss = criterion(prob, y)  # expect: L102
""", TRAIN_HEAD + """\
criterion = nn.BCEWithLogitsLoss()
prob = model(x)
loss = criterion(prob, y)  # expect: L102
"""),
    ("L103", TRAIN_HEAD + """\
loss = F.nll_loss(model(x), y, ignore_index=-1)  # expect: L103
""", TRAIN_HEAD + """\
loss = F.cross_entropy(model(x), y, ignore_index=-1)  # expect: L103
"""),
    ("L103", TRAIN_HEAD + """\
criterion = nn.NLLLoss(weight=w)
loss = criterion(model(x), y)  # expect: L103
""", TRAIN_HEAD + """\
criterion = nn.CrossEntropyLoss(weight=w)
loss = criterion(model(x), y)  # expect: L103
"""),
    ("O101", TRAIN_HEAD + """\
for x, y in loader:
    # forward
    loss = F.cross_entropy(model(x), y)
    loss.backward()  # expect: O101
    optimizer.step()
""", TRAIN_HEAD + """\
for x, y in loader:
    optimizer.zero_grad()
    # forward
    loss = F.cross_entropy(model(x), y)
    loss.backward()  # expect: O101
    optimizer.step()
"""),
    ("O102", TRAIN_HEAD + """\
for step in range(5):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()  # expect: O102
""", TRAIN_HEAD + """\
for step in range(5):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()  # expect: O102
"""),
    # Hand-written update loops (no torch.optim): the model's zero_grad() at the start of the step
    # when the update runs every pass over model.parameters(), as in pytorch/examples' regression.
    ("O101", HEAD + """\
fc = torch.nn.Linear(4, 1)
for batch_idx in range(1, 20):
    # Get data
    batch_x, batch_y = get_batch()
    output = F.smooth_l1_loss(fc(batch_x), batch_y)
    output.backward()  # expect: O101
    # plain SGD
    for param in fc.parameters():
        param.data.add_(-0.1 * param.grad)
""", HEAD + """\
fc = torch.nn.Linear(4, 1)
for batch_idx in range(1, 20):
    fc.zero_grad()
    # Get data
    batch_x, batch_y = get_batch()
    output = F.smooth_l1_loss(fc(batch_x), batch_y)
    output.backward()  # expect: O101
    # plain SGD
    for param in fc.parameters():
        param.data.add_(-0.1 * param.grad)
"""),
    ("O101", HEAD + """\
model = nn.Linear(8, 1)
for x, y in loader:
    loss = F.mse_loss(model(x), y)
    loss.backward()  # expect: O101
    with torch.no_grad():
        for name, p in model.named_parameters():
            p -= lr * p.grad
""", HEAD + """\
model = nn.Linear(8, 1)
for x, y in loader:
    model.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()  # expect: O101
    with torch.no_grad():
        for name, p in model.named_parameters():
            p -= lr * p.grad
"""),
    # Not a model's parameters: clear each gradient right after its update.
    ("O101", HEAD + """\
params = [w, b]
for x, y in loader:
    loss = F.mse_loss(x @ w + b, y)
    loss.backward()  # expect: O101
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad  # SGD
""", HEAD + """\
params = [w, b]
for x, y in loader:
    loss = F.mse_loss(x @ w + b, y)
    loss.backward()  # expect: O101
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad  # SGD
            p.grad = None
"""),
    # The update runs every 4 passes (accumulation): clearing at each pass's start would undo it.
    ("O101", HEAD + """\
for i, (x, y) in enumerate(loader):
    loss = F.mse_loss(model(x), y) / 4
    loss.backward()  # expect: O101
    if (i + 1) % 4 == 0:
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
""", HEAD + """\
for i, (x, y) in enumerate(loader):
    loss = F.mse_loss(model(x), y) / 4
    loss.backward()  # expect: O101
    if (i + 1) % 4 == 0:
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
            p.grad = None
"""),
    ("O102", HEAD + """\
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
for step in range(8):
    loss = F.mse_loss(model(x), y)  # expect: O102
    loss.backward()
    model.zero_grad(set_to_none=False)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
""", HEAD + """\
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
for step in range(8):
    model.zero_grad(set_to_none=False)
    loss = F.mse_loss(model(x), y)  # expect: O102
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
"""),
    ("O108", TRAIN_HEAD + """\
for i, (x, y) in enumerate(loader):
    loss = F.cross_entropy(model(x), y)
    loss.backward()  # expect: O108
    if (i + 1) % cfg.accumulate == 0:
        optimizer.step()
        optimizer.zero_grad()
""", TRAIN_HEAD + """\
for i, (x, y) in enumerate(loader):
    loss = F.cross_entropy(model(x), y)
    (loss / cfg.accumulate).backward()  # expect: O108
    if (i + 1) % cfg.accumulate == 0:
        optimizer.step()
        optimizer.zero_grad()
"""),
    ("M101", TRAIN_HEAD + """\
for epoch in range(2):
    train_one_epoch(model, optimizer)
    # validation
    with torch.no_grad():
        val_loss = F.cross_entropy(model(xv), yv)  # expect: M101
    print(val_loss)
""", TRAIN_HEAD + """\
for epoch in range(2):
    train_one_epoch(model, optimizer)
    # validation
    model.eval()
    with torch.no_grad():
        val_loss = F.cross_entropy(model(xv), yv)  # expect: M101
    model.train()
    print(val_loss)
"""),
    ("M102", TRAIN_HEAD + """\
for epoch in range(3):
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)  # expect: M102
        loss.backward()
    model.eval()
    evaluate(model)
""", TRAIN_HEAD + """\
for epoch in range(3):
    model.train()
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)  # expect: M102
        loss.backward()
    model.eval()
    evaluate(model)
"""),
    ("B101", HEAD + """\
model = nn.Sequential(
    nn.Linear(8, 16),
    nn.BatchNorm1d(16, momentum=0.99),  # expect: B101
)
""", HEAD + """\
model = nn.Sequential(
    nn.Linear(8, 16),
    nn.BatchNorm1d(16, momentum=0.01),  # expect: B101
)
"""),
    ("C103", TRAIN_HEAD + """\
torch.save(model, "model.pt")  # expect: C103
""", TRAIN_HEAD + """\
torch.save(model.state_dict(), "model.pt")  # expect: C103
"""),
    ("C104", TRAIN_HEAD + """\
state = torch.load("ckpt.pt", map_location="cpu", weights_only=False)  # expect: C104
""", TRAIN_HEAD + """\
state = torch.load("ckpt.pt", map_location="cpu", weights_only=True)  # expect: C104
"""),
    ("O109", HEAD + """\
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.01)  # expect: O109
""", HEAD + """\
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)  # expect: O109
"""),
    ("R101", '"""Train."""\nimport torch\nimport torch.nn as nn\n\nmodel = nn.Linear(2, 2)  # expect: R101\n',
     '"""Train."""\nimport torch\nimport torch.nn as nn\ntorch.manual_seed(0)\n\nmodel = nn.Linear(2, 2)  # expect: R101\n'),
    # the seed goes before the first use of the framework, not after a late import
    ("R101", "import torch as T\nimport os\nos.environ['X'] = '1'\nnet = T.nn.Linear(2, 2)  # expect: R101\nimport json\n",
     "import torch as T\nimport os\nT.manual_seed(0)\nos.environ['X'] = '1'\nnet = T.nn.Linear(2, 2)  # expect: R101\nimport json\n"),
    ("P108", TRAIN_HEAD + """\
losses = []
for x, y in loader:
    loss = F.cross_entropy(model(x), y)  # expect: P108
    losses.append(loss)
""", TRAIN_HEAD + """\
losses = []
for x, y in loader:
    loss = F.cross_entropy(model(x), y)  # expect: P108
    losses.append(loss.detach())
"""),
    ("P108", TRAIN_HEAD + """\
for x, y in loader:
    loss = F.cross_entropy(model(x), y)
    total += loss  # expect: P108
""", TRAIN_HEAD + """\
for x, y in loader:
    loss = F.cross_entropy(model(x), y)
    total += loss.detach()  # expect: P108
"""),
    ("K101", """\
import keras
model.compile(optimizer="adam",
              loss=keras.losses.CategoricalCrossentropy(from_logits=True))  # expect: K101
""", """\
import keras
model.compile(optimizer="adam",
              loss=keras.losses.CategoricalCrossentropy(from_logits=False))  # expect: K101
"""),
    ("D105", "import keras\nmodel.fit(x, y, epochs=2, shuffle=False)  # expect: D105\n",
     "import keras\nmodel.fit(x, y, epochs=2, shuffle=True)  # expect: D105\n"),
]


@pytest.mark.parametrize(("code", "before", "after"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_codemod_before_after(code, before, after):
    assert propose(code, before) == after


def test_c101_uses_the_prefix_the_run_saw():
    before = TRAIN_HEAD + 'model = torch.compile(model)\ntorch.save(model.state_dict(), "ckpt.pt")  # expect: C101\n'
    after = propose("C101", before, {"prefix": "_orig_mod."})
    assert 'torch.save(model._orig_mod.state_dict(), "ckpt.pt")' in after
    dp = TRAIN_HEAD + 'model = nn.DataParallel(model)\ntorch.save(model.state_dict(), "ckpt.pt")  # expect: C101\n'
    assert "model.module.state_dict()" in propose("C101", dp, {"prefix": "module."})

    # Already the inner model, and still the prefix: it comes from another wrapper inside.
    inner = TRAIN_HEAD + "torch.save(model.module.state_dict(), 'ckpt.pt')  # expect: C101\n"
    with pytest.raises(Uncertain, match="already saving"):
        propose("C101", inner, {"prefix": "module."})


UNCERTAIN = [
    # two optimizers step in the loop: whose gradients to clear?
    ("O101", TRAIN_HEAD + "for x in loader:\n    loss.backward()  # expect: O101\n    g_opt.step()\n    d_opt.step()\n"
     "g_opt = torch.optim.SGD(g.parameters())\nd_opt = torch.optim.SGD(d.parameters())\n", "optimizers"),
    # the probabilities are also used for something else
    ("L101", TRAIN_HEAD + "probs = model(x).softmax(1)\nloss = F.cross_entropy(probs, y)  # expect: L101\n"
     "confidence = probs.max(1)\n", "also used"),
    # the model's probabilities are read elsewhere (not only through argmax)
    ("L101", TRAIN_HEAD + "model = nn.Sequential(nn.Linear(8, 4), nn.Softmax(1))\n"
     "loss = F.cross_entropy(model(x), y)  # expect: L101\nprint(model(x)[0])\n", "also used"),
    # the output held in a name is also read as probabilities
    ("L101", HEAD + "model = nn.Sequential(nn.Linear(8, 4), nn.Softmax(1))\nout = model(x)\n"
     "loss = F.cross_entropy(out, y)  # expect: L101\nconfidence = out.max(1).values\n", "also used at line 8"),
    # the model is a parameter and the file builds two models under that name
    ("L101", HEAD + "def step(model, x, y):\n    out = model(x)\n    return F.cross_entropy(out, y)  # expect: L101\n"
     "model = nn.Sequential(nn.Linear(8, 4), nn.Softmax(1))\nmodel = nn.Sequential(nn.Linear(8, 2), nn.Softmax(1))\n",
     "not built in this file"),
    # the forward's probabilities are also kept on the module
    ("L101", HEAD + "class Net(nn.Module):\n    def forward(self, x):\n        out = F.softmax(self.fc(x), 1)\n"
     "        self.last_probs = out\n        return out\n\n\nnet = Net()\nloss = F.cross_entropy(net(x), y)  # expect: L101\n",
     "also used at line 8 in Net.forward"),
    # a sampler decides the order
    ("D105", TRAIN_HEAD + "loader = DataLoader(ds, sampler=s)\nfor x in loader:  # expect: D105\n    pass\n", "sampler"),
    # the model is called twice: scaling one input gives it two ranges
    ("D101", TRAIN_HEAD + "for x, y in loader:\n    out = model(x)  # expect: D101\nval = model(xv)\n", "also called"),
    # the whole model saved, and a load in the same file expects it
    ("C103", TRAIN_HEAD + "torch.save(model, 'm.pt')  # expect: C103\nm = torch.load('m.pt')\n", "torch.load"),
    # Adam imported by name: the import must change too
    ("O109", HEAD + "from torch.optim import Adam\nopt = Adam(p, weight_decay=0.1)  # expect: O109\n", "imported"),
    # hand-written updates: two models updated by hand in one loop
    ("O101", HEAD + "for x in loader:\n    loss.backward()  # expect: O101\n"
     "    for p in g.parameters():\n        p.data.add_(-lr * p.grad)\n"
     "    for p in d.parameters():\n        p.data.add_(-lr * p.grad)\n", "2 hand-written updates"),
    # the update comes first in the loop (it uses the previous pass's gradients)
    ("O101", HEAD + "for x in loader:\n    for p in model.parameters():\n        p.data.add_(-lr * p.grad)\n"
     "    loss = model(x).sum()\n    loss.backward()  # expect: O101\n", "before backward"),
    # the update is in a helper function: nothing in the loop writes the parameters
    ("O101", HEAD + "for x in loader:\n    loss = model(x).sum()\n    loss.backward()  # expect: O101\n"
     "    sgd_update(model, lr)\n", "no hand-written update"),
    # the gradients are read again after the update (p.grad = None would break the logging)
    ("O101", HEAD + "for x in loader:\n    loss = model(x).sum()\n    loss.backward()  # expect: O101\n"
     "    for p in params:\n        p.data.add_(-lr * p.grad)\n    log(params[0].grad.norm())\n", "read again"),
    # the update can skip its end: p.grad = None there would not always run
    ("O101", HEAD + "for x in loader:\n    loss = model(x).sum()\n    loss.backward()  # expect: O101\n"
     "    for p in params:\n        if p.grad is None:\n            continue\n        p -= lr * p.grad\n",
     "continue/break"),
    # some gradients are already cleared: which are left is not clear from the code
    ("O101", HEAD + "for x in loader:\n    loss = model(x).sum()\n    loss.backward()  # expect: O101\n"
     "    for p in params:\n        p.data.add_(-lr * p.grad)\n    head.zero_grad()\n", "already clears"),
    # O102 by hand: the update is in a helper, so the loop shows no update after zero_grad()
    ("O102", HEAD + "for step in range(8):\n    loss = model(x).sum()  # expect: O102\n    loss.backward()\n"
     "    model.zero_grad(set_to_none=False)\n    sgd_update(model)\n", "no hand-written update"),
    # O102 by hand: two zero_grad() calls before the update
    ("O102", HEAD + "for step in range(8):\n    model.zero_grad()\n    loss = model(x).sum()  # expect: O102\n"
     "    loss.backward()\n    model.zero_grad(set_to_none=False)\n"
     "    for p in model.parameters():\n        p.data.add_(-lr * p.grad)\n", "not between one backward"),
    # the sigmoid's output is also thresholded for the accuracy
    ("L102", TRAIN_HEAD + "probs = torch.sigmoid(model(x))\n"
     "loss = F.binary_cross_entropy_with_logits(probs, y)  # expect: L102\nacc = ((probs > 0.5) == y).float().mean()\n",
     "also used"),
    # nll_loss imported by name: the import must change too
    ("L103", TRAIN_HEAD + "from torch.nn.functional import nll_loss\nloss = nll_loss(model(x), y)  # expect: L103\n",
     "imported by name"),
    # the evaluation is not in a no_grad block: where it starts is not marked
    ("M101", TRAIN_HEAD + "for x, y in val_loader:\n    out = model(x)  # expect: M101\n", "no_grad"),
    # two models are put in eval mode in the loop: which one trains?
    ("M102", HEAD + "g_opt = torch.optim.Adam(gen.parameters())\nd_opt = torch.optim.Adam(disc.parameters())\n"
     "for epoch in range(3):\n    for x in loader:\n        loss = disc(gen(x)).sum()  # expect: M102\n"
     "    gen.eval()\n    disc.eval()\n", "more than one model"),
    # the momentum is a variable: its value is not written here
    ("B101", TRAIN_HEAD + "bn = nn.BatchNorm1d(16, momentum=keras_momentum)  # expect: B101\n", "not a number"),
    # no prefix seen and no wrapper built in this file: which attribute holds the inner model?
    ("C101", TRAIN_HEAD + "model = wrap(model)\ntorch.save(model.state_dict(), 'ckpt.pt')  # expect: C101\n",
     "neither DataParallel"),
    # weights_only computed at run time
    ("C104", TRAIN_HEAD + "state = torch.load('ckpt.pt', weights_only=trusted)  # expect: C104\n", "computed here"),
    # only `from torch import nn`: no `torch` name to call manual_seed on (adding an import is not minimal)
    ("R101", "from torch import nn\nmodel = nn.Linear(4, 2)  # expect: R101\n", "not imported at the top"),
    # the loss goes into a helper: where it is kept is not in this file
    ("P108", TRAIN_HEAD + "for x in loader:\n    loss = model(x).sum()  # expect: P108\n    tracker.update(loss)\n",
     "does not show"),
    # two losses with from_logits=True on the line: which one gets the probabilities?
    ("K101", "import keras\nlosses = [keras.losses.BinaryCrossentropy(from_logits=True), "
     "keras.losses.CategoricalCrossentropy(from_logits=True)]  # expect: K101\n", "2 from_logits"),
    # no accumulation test to take the count from
    ("O108", TRAIN_HEAD + "for x in loader:\n    loss.backward()  # expect: O108\n", "accumulation"),
]


@pytest.mark.parametrize(("code", "source", "reason"), UNCERTAIN, ids=[f"{c[0]}-{i}" for i, c in enumerate(UNCERTAIN)])
def test_uncertain_edit_is_refused_with_its_reason(code, source, reason):
    with pytest.raises(Uncertain, match=reason):
        propose(code, source)


def test_every_listed_code_has_a_codemod_with_safety_declared():
    for code in CODEMODS:
        module = codemod_for(code)
        assert module is not None and module.CODE == code
        assert isinstance(module.SAFE, bool)
        if not module.SAFE:
            assert module.UNSAFE_REASON
    assert not codemod_for("O109").SAFE and not codemod_for("R101").SAFE
