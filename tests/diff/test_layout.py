"""`find_layout`: a reordering is claimed only where channels carry enough values to be told apart."""
import numpy as np

from tensorprobe.diff.layout import REORDERED, find_layout


def test_a_time_reversed_frame_is_no_reordering():
    """Any vector is a permutation of its sorted values: a reversed audio frame ([1, 512]) read as 512 channels
    reordered hid "the model inputs already differ" on the Silero port."""
    x = np.random.default_rng(0).normal(size=(1, 512)).astype(np.float32)
    assert find_layout(x, x[:, ::-1].copy(), 1e-4) is None


def test_channels_in_another_order_are_found_and_a_changed_channel_is_not():
    x = np.random.default_rng(1).normal(size=(1, 6, 40)).astype(np.float32)
    order = [2, 0, 1, 5, 3, 4]
    found = find_layout(x, x[:, order].copy(), 1e-4)
    assert found is not None and found.kind == REORDERED and found.axis == 1 and list(found.order) == order
    changed = x[:, order].copy()
    changed[0, 3] *= 1.1                    # truth changed: one channel's values differ too
    assert find_layout(x, changed, 1e-4) is None
