"""BLD freeze schedules: exactly the selected params freeze at exactly the scheduled steps,
optimizer state included."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.train.config import TrainConfig
from hybridlab.train.freeze import FreezeSchedule
from hybridlab.train.loop import train

V, D = 9, 6


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixer = nn.Linear(D, D)  # stands in for a recurrent mixer
        self.norm = nn.LayerNorm(D)

    def forward(self, h):
        return h + torch.tanh(self.mixer(self.norm(h)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Block(), Block()])
        self.attn = nn.Linear(D, D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.layers:
            h = b(h)
        return self.lm_head(h + self.attn(h))


class Task:
    def loss(self, model, batch):
        return F.cross_entropy(model(batch[:, :-1]).reshape(-1, V), batch[:, 1:].reshape(-1)), {}

    def num_tokens(self, batch):
        return batch[:, 1:].numel()


DATA = [(torch.arange(6) * (i % 3 + 1) + i) % V for i in range(12)]
STEPS = 6


def snapshots(tmp_path, schedule, optimizer="adamw"):
    """Parameters and optimiser state before every update and after the last one."""
    torch.manual_seed(0)
    model = Model()
    snaps = []

    def record(step, m, opt):
        snaps.append(_snap(m, opt))

    opt_box = []
    c = TrainConfig(out_dir=str(tmp_path / optimizer), steps=STEPS, micro_batch_size=3, lr=1e-2,
                    weight_decay=0.5, optimizer=optimizer, progress=False)
    train(model, Task(), DATA, c, on_step_start=[schedule, record, lambda s, m, o: opt_box.append(o)])
    snaps.append(_snap(model, opt_box[-1]))
    return model, snaps


def _snap(model, opt):
    out = {}
    for n, p in model.named_parameters():
        st = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state_for(p).items()}
        out[n] = (p.detach().clone(), st)
    return out


def changed(snaps, name):
    """For each update s: did parameter `name` change during it?"""
    return [not torch.equal(snaps[s][name][0], snaps[s + 1][name][0]) for s in range(STEPS)]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_window_freezes_exactly_selected_params_at_exact_steps(tmp_path, optimizer):
    sched = FreezeSchedule(r"\.mixer\.", windows=[(2, 4)])
    model, snaps = snapshots(tmp_path, sched, optimizer)
    mixer = [n for n, _ in model.named_parameters() if ".mixer." in n]
    assert mixer == ["layers.0.mixer.weight", "layers.0.mixer.bias", "layers.1.mixer.weight", "layers.1.mixer.bias"]
    for n, _ in model.named_parameters():
        want = [s not in (2, 3) for s in range(STEPS)] if n in mixer else [True] * STEPS
        assert changed(snaps, n) == want, n
    # Optimiser state of frozen params does not advance while frozen (step count, moments, momentum).
    for n in mixer:
        frozen_states = [snaps[s][n][1] for s in (2, 3, 4)]  # before updates 2, 3 and after them
        for st in frozen_states[1:]:
            assert st.keys() == frozen_states[0].keys()
            for k in st:
                assert torch.equal(torch.as_tensor(st[k]), torch.as_tensor(frozen_states[0][k])), (n, k)
        if "step" in snaps[-1][n][1]:  # AdamW-managed: 4 real updates (0, 1, 4, 5)
            assert snaps[-1][n][1]["step"].item() == 4
    assert all(p.requires_grad for p in model.parameters())  # unfrozen after the window


def test_freeze_from_start_then_unfreeze_with_callable_selecting_whole_block(tmp_path):
    sched = FreezeSchedule(lambda n: n.startswith("layers.1."), windows=[(0, 3)])
    model, snaps = snapshots(tmp_path, sched)
    for n, _ in model.named_parameters():
        want = [s >= 3 for s in range(STEPS)] if n.startswith("layers.1.") else [True] * STEPS
        assert changed(snaps, n) == want, n
    assert snaps[3]["layers.1.norm.weight"][1] == {}  # never stepped while frozen
    assert snaps[-1]["layers.1.norm.weight"][1]["step"].item() == 3


def test_schedule_is_stateless_and_validates(tmp_path):
    s = FreezeSchedule(["attn.weight", "attn.bias"], windows=[(5, None), (1, 2)])
    assert [s.frozen_at(i) for i in range(8)] == [False, True, False, False, False, True, True, True]
    m = Model()
    m.attn.bias.requires_grad_(False)  # permanently frozen by the user: must stay frozen
    s.apply(1, m)
    assert not m.attn.weight.requires_grad and not m.attn.bias.requires_grad
    s.apply(3, m)
    assert m.attn.weight.requires_grad and not m.attn.bias.requires_grad
    with pytest.raises(HybridlabError, match="unknown parameters"):
        FreezeSchedule(["attn.nope"], [(0, 1)]).apply(0, m)
    with pytest.raises(HybridlabError, match="selects no parameter"):
        FreezeSchedule("mamba", [(0, 1)]).apply(0, m)
    with pytest.raises(HybridlabError, match="overlap"):
        FreezeSchedule("attn", [(0, 3), (2, 4)])
    with pytest.raises(HybridlabError, match="start < end"):
        FreezeSchedule("attn", [(3, 3)])
