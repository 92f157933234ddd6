# The names the docs' Python blocks take as given: hvdkit.torch at world size 1 (in the test process), a small
# model and optimizer, the digits data as a Dataset, tensors and loaders. Each page starts from a fresh copy.
import torch
import torch.nn.functional as F  # noqa: F401 (the docs use these names)
from torch.utils.data import TensorDataset

import hvdkit.torch as hk
from hvdkit.examples.datasets import load_dataset

ctx = hk.init(seed=0)
data = load_dataset("digits")
x_train, y_train = torch.from_numpy(data.x_train).unsqueeze(1), torch.from_numpy(data.y_train)
x_test, y_test = torch.from_numpy(data.x_test).unsqueeze(1), torch.from_numpy(data.y_test)
train_set, test_set = TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)
train_loader = hk.distributed_loader(train_set, 64, shuffle=True)
test_loader = hk.eval_loader(test_set, batch_size=256)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
optimizer = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=hk.scale_lr(0.01), momentum=0.9), model)
hk.broadcast_state(model, optimizer)
epochs, start_epoch, start_batch, start_sample, path = 1, 0, 0, 0, "ckpt.pt"
scheduler = hk.warmup_scheduler(optimizer, warmup_steps=10)
