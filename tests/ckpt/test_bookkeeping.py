"""ckpt inspect summarises a Lightning checkpoint's loop/optimizer bookkeeping in a few lines."""

from __future__ import annotations

import io

import pytest

from nndoctor.commands.ckpt.bookkeeping import bookkeeping_lines


def test_groups_loops_callbacks_and_schedulers():
    entries = {"epoch": "1", "global_step": "3"}
    entries.update({f"loops.fit_loop.epoch_loop.batch_progress.total.{k}": "3"
                    for k in ("ready", "completed", "started", "processed")})
    entries["loops.fit_loop.epoch_progress.current.completed"] = "1"
    entries.update({f"callbacks.ModelCheckpoint{{'monitor': None}}.{k}": v for k, v in
                    (("best_model_path", "'a.ckpt'"), ("dirpath", "'ckpts'"), ("kth_value", "tensor"),
                     ("monitor", "None"))})
    entries.update({f"lr_schedulers.0.{k}": v for k, v in (("step_size", "1"), ("gamma", "0.1"),
                                                            ("last_epoch", "0"), ("_step_count", "1"))})
    assert bookkeeping_lines(entries) == [
        "epoch: 1",
        "global_step: 3",
        "loops: Lightning loop progress, 5 counters (fit epochs completed 1; training batches 3)",
        "callbacks.ModelCheckpoint: best_model_path='a.ckpt', dirpath='ckpts', kth_value=tensor, monitor=None",
        "lr_schedulers.0: step_size=1, gamma=0.1, last_epoch=0, _step_count=1",
    ]


def test_real_lightning_checkpoint_is_short(tmp_path):
    L = pytest.importorskip("lightning")
    import torch
    import torch.nn.functional as F

    from nndoctor.commands.ckpt.reader import read_checkpoint
    from nndoctor.commands.ckpt.render import print_inspect

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters())
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1)]

    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    trainer = L.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    out = io.StringIO()
    print_inspect(read_checkpoint(str(path)), out)
    lines = out.getvalue().splitlines()
    assert len(lines) < 25, "\n".join(lines)
    assert any(line.startswith("  loops: Lightning loop progress") for line in lines)
    assert not any(line.startswith("  loops.fit_loop") for line in lines)


def test_trainer_checkpoint_folder_shows_weights_and_one_line_per_file(tmp_path, capsys):
    import json

    import torch
    from safetensors.torch import save_file

    from nndoctor.cli import main

    folder = tmp_path / "checkpoint-500"
    folder.mkdir()
    model = torch.nn.Linear(4, 2)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    optimizer = torch.optim.AdamW(model.parameters())
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save({"last_epoch": 500}, folder / "scheduler.pt")
    (folder / "rng_state.pth").write_bytes(b"\x80\x04N.")
    (folder / "trainer_state.json").write_text(json.dumps(
        {"global_step": 500, "epoch": 1.5, "max_steps": 1000, "best_metric": None,
         "log_history": [{"loss": 2.5, "step": 250}, {"loss": 1.25, "step": 500}]}))
    assert main(["ckpt", "inspect", "--isolated", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "model.safetensors · safetensors" in out and "weight  [2, 4]  float32" in out
    assert ("trainer_state.json: global_step=500, epoch=1.5, max_steps=1000, log_history: 2 entries, "
            "last logged loss=1.25") in out
    assert "  optimizer.pt: optimizer state, " in out and "  scheduler.pt: learning-rate scheduler state" in out
    assert "rng_state.pth: random-number generator states" in out
    assert main(["ckpt", "inspect", "--isolated", "--json", "-", str(folder)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["extra"]["checkpoint"]["trainer_folder"][0].startswith("trainer_state.json: global_step=500")
