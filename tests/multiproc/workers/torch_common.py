"""Shared bits of the PyTorch test workers: tiny deterministic models and their digests."""

import hashlib

import torch
import torch.nn as nn


class SmallNet(nn.Module):
    """Conv + BatchNorm (so there are buffers) + linear; no dropout, so runs are deterministic."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def make_optimizer(name, params, lr=0.05):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr * 0.1, weight_decay=1e-4)
    raise ValueError(name)


def tensor_digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def optimizer_tensors(optimizer):
    out = []
    for pid in sorted(optimizer.state_dict()["state"]):
        for _key, value in sorted(optimizer.state_dict()["state"][pid].items()):
            out.append(value if torch.is_tensor(value) else torch.tensor(float(value)))
    return out
