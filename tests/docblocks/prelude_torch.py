# What the README's PyTorch diff leaves out: imports, data (the bundled digits, offline), the model, evaluate().
import torch
import torch.nn.functional as F  # noqa: F401 (the docs use these names)
from torch.utils.data import DataLoader, TensorDataset  # noqa: F401 (the diff uses these names)

from hvdkit.examples.datasets import load_dataset

data = load_dataset("digits")
train_set = TensorDataset(torch.from_numpy(data.x_train).unsqueeze(1), torch.from_numpy(data.y_train))
test_set = TensorDataset(torch.from_numpy(data.x_test).unsqueeze(1), torch.from_numpy(data.y_test))
epochs = 2


def Net():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def evaluate(model, loader):
    with torch.no_grad():
        return sum((model(x).argmax(1) == y).sum().item() for x, y in loader) / len(loader.dataset)
