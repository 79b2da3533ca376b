import pytest
import torch

from tensorprobe.hooks import module_hooks


def test_hooks_run_and_are_removed_even_when_the_forward_raises():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    seen = []
    with module_hooks(model.named_modules(), pre=lambda p: (lambda m, a: seen.append(("pre", p))),
                      post=lambda p: (lambda m, a, o: seen.append(("post", p))), always_call=True):
        model(torch.zeros(1, 2))
    assert seen == [("pre", ""), ("pre", "0"), ("post", "0"), ("pre", "1"), ("post", "1"), ("post", "")]
    with pytest.raises(RuntimeError):
        with module_hooks(model.named_modules(), post=lambda p: (lambda m, a, o: seen.append(p))):
            model(torch.zeros(1, 3))  # wrong shape: the forward raises
    seen.clear()
    model(torch.zeros(1, 2))
    assert seen == []  # nothing left registered
