"""What the global-batch workers share: float64 data, and the model with BatchNorm and Dropout (or an MLP).

    x, y = data(60)                  # after hk.init(): float64 from here on
    model = model_with_batchnorm()   # the same initial weights in every process
"""

import torch


def data(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` rows of 5 features and a class of 3, the same in every process; float64 from here on."""
    torch.set_default_dtype(torch.float64)
    g = torch.Generator().manual_seed(0)
    return torch.randn(samples, 5, generator=g), torch.randint(0, 3, (samples,), generator=g)


def model_with_batchnorm(mlp: bool = False) -> torch.nn.Module:
    torch.manual_seed(5)
    if mlp:          # no BatchNorm or Dropout: what one process's plain loop over whole steps can equal
        return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    # No bias before BatchNorm: its true gradient is 0, so Adam would step on rounding noise alone.
    return torch.nn.Sequential(torch.nn.Linear(5, 16, bias=False), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Dropout(0.3), torch.nn.Linear(16, 3))
