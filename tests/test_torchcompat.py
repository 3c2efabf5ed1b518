"""The guard around oneDNN's AVX2 weight-gradient kernel."""

from __future__ import annotations

import torch
from torch import nn

from hpcnb.torchcompat import onednn_backward_unsafe, safe_backward


def test_safe_backward_turns_onednn_off_only_where_it_faults():
    before = torch.backends.mkldnn.enabled
    with safe_backward():
        inside = torch.backends.mkldnn.enabled
    assert torch.backends.mkldnn.enabled == before  # restored
    assert inside == (before and not onednn_backward_unsafe())


def test_safe_backward_gives_the_gradients_of_a_plain_backward():
    # the case that faults: 1x1, stride 2, channels not multiples of 8
    torch.manual_seed(0)
    conv = nn.Conv2d(5, 11, 1, stride=2, bias=False).double()
    x = torch.randn(8, 5, 8, 8, dtype=torch.float64)
    with safe_backward():
        conv(x).square().sum().backward()
    guarded = conv.weight.grad.clone()
    conv.weight.grad = None
    out = nn.functional.conv2d(x, conv.weight, stride=2)
    (expected,) = torch.autograd.grad(out.square().sum(), conv.weight)
    torch.testing.assert_close(guarded, expected)
