"""Module taps of an exported program (shared by the ExecuTorch and TVM adapters); plain torch.export."""

import torch

from tensorprobe.runtimes.exported import export_tapped


class _SharedAct(torch.nn.Module):
    """Two blocks calling one activation object, as Kokoro's AdainResBlk1d blocks share a LeakyReLU."""

    def __init__(self):
        super().__init__()
        act = torch.nn.LeakyReLU(0.2)
        self.a = torch.nn.Sequential(torch.nn.Linear(4, 6), act)
        self.b = torch.nn.Sequential(torch.nn.Linear(6, 3), act)

    def forward(self, x):
        return self.b(self.a(x))


def test_taps_of_a_shared_module_line_up_with_the_program_outputs():
    torch.manual_seed(0)
    model, x = _SharedAct().eval(), torch.randn(2, 4)
    ep, info = export_tapped(model, (x,))
    with torch.no_grad():
        outs = ep.module()(x)
    assert len(outs) == info.n_outputs + len(info.names)
    assert info.names == ("a.0", "a.1", "a", "b.0", "a.1@1", "b", "<root>")
    taps = dict(zip(info.names, outs[info.n_outputs:]))
    with torch.no_grad():
        h = model.a[0](x)
        assert torch.equal(taps["a.1"], torch.nn.functional.leaky_relu(h, 0.2))
        assert torch.equal(taps["a.1@1"], torch.nn.functional.leaky_relu(model.b[0](taps["a"]), 0.2))
        assert torch.equal(taps["<root>"], model(x))
