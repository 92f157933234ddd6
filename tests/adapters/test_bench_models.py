"""hvdkit bench's models: ResNet-50 as torchvision builds it, and the example's convnet (torch, no processes)."""

import importlib.util
import math

import pytest
import torch

from hvdkit.bench.models import MnistNet, ResNet50, resnet50_shapes
from tests.conftest import ROOT

pytestmark = pytest.mark.adapters


def test_resnet50_matches_torchvision_and_mnist_net_matches_the_example():
    shapes = resnet50_shapes()
    assert len(shapes) == 161 and sum(math.prod(s) for s in shapes) == 25_557_032
    assert ResNet50()(torch.zeros(1, 3, 64, 64)).shape == (1, 1000)
    spec = importlib.util.spec_from_file_location("example", ROOT / "examples" / "pytorch_mnist.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ours = [(n, tuple(p.shape)) for n, p in MnistNet().named_parameters()]
    assert ours == [(n, tuple(p.shape)) for n, p in example.Net().named_parameters()]
