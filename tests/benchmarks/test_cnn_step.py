"""The CNN step benchmark compares like with like: its old-head loss is the library's loss."""

import torch

from benchmarks.cnn_step import default_loss, points_head_loss
from benchmarks.conv_rnn import gpn_cnn


def test_points_head_loss_equals_the_library_loss():
    torch.manual_seed(0)
    model = gpn_cnn((1, 8, 8), (4, 8), 10, False, 100)
    x, y = torch.rand(5, 64), torch.randint(0, 10, (5,))
    torch.testing.assert_close(points_head_loss(model, x, y), default_loss(model, x, y))
