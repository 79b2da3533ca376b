"""Module taps of an exported program (shared by the ExecuTorch and TVM adapters); plain torch.export."""

from dataclasses import replace

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
    assert info.names == ("a.0", "a.1", "a", "b.0", "a.1@1", "b", "<root>")
    # one output per tensor: the model's (also a.1@1, b and the root), a.0, a.1 (also a), b.0
    assert len(outs) == info.n_program_outputs == 4
    records = info.records()
    assert [name for _, name, _, _ in records] == list(info.names)   # execution order, every name once
    taps = {name: outs[i] for i, name, _, _ in records}
    assert taps["a"] is taps["a.1"] and taps["b"] is taps["a.1@1"] is taps["<root>"]
    with torch.no_grad():
        h = model.a[0](x)
        assert torch.equal(taps["a.1"], torch.nn.functional.leaky_relu(h, 0.2))
        assert torch.equal(taps["a.1@1"], torch.nn.functional.leaky_relu(model.b[0](taps["a"]), 0.2))
        assert torch.equal(taps["<root>"], model(x))


class _NoisyTap(torch.nn.Module):
    """A source module whose noise output the model drops (Kokoro's SourceModuleHnNSF with an unused
    noise branch): replacing its randn by zeros leaves the model output unchanged, not the tap."""

    def __init__(self):
        super().__init__()
        self.src = _Source()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        har, _noise = self.src(x)
        return self.lin(har)


class _Source(torch.nn.Module):
    def forward(self, x):
        noise = torch.randn_like(x) * 0.1
        return torch.tanh(x + noise * 0.0), noise   # the noise reaches the harmonic output, times zero


def test_outputs_computed_from_replaced_random_ops_are_tagged_and_not_compared(tmp_path):
    from tensorprobe import capture, diff
    from tensorprobe.bundle import BundleWriter
    from tensorprobe.record import TAG_RANDOM_REPLACED, Record
    from tensorprobe.runtimes.exported import TapInfo, check_equivalent, rewrite_for_import
    from tensorprobe.stats import compute_stats

    torch.manual_seed(0)
    model, x = _NoisyTap().eval(), torch.randn(2, 4)
    ep, info = export_tapped(model, (x,))
    rewritten, counts = rewrite_for_import(ep, random="zeros")
    assert counts.get("random_to_zeros") == 1
    # the model output does not change; of the taps, only the noise does (not src:0, which the noise
    # reaches in the graph, nor lin or the root)
    replaced = check_equivalent(ep, rewritten, (x,), n_outputs=info.n_outputs)
    assert [name for i, name, _, _ in info.records() if i in replaced] == ["src:1"]

    # a candidate bundle with the port's values, tagged as the adapters tag them
    with torch.no_grad():
        outs = rewritten.module()(x)
    info = replace(info, replaced=replaced)
    assert info.tags(replaced[0]) == (TAG_RANDOM_REPLACED,) and TapInfo.from_dict(info.to_dict()) == info
    with BundleWriter(tmp_path / "cand") as w:
        for order, (i, name, module, _) in enumerate(info.records()):
            t = outs[i]
            w.add(Record(name=name, module=module, op="port", order=order, shape=tuple(t.shape),
                         dtype="float32", stats=compute_stats(t), tags=info.tags(i)), t)
    ref = capture(model, x, level="module", keep="full", out=tmp_path / "ref")
    report = diff(ref, tmp_path / "cand")
    noise = report.pair("src:1")
    assert noise.status == "no_data" and "random" in noise.reasons[0]
    assert report.passed and report.first_divergence is None
