import pytest
import torch

import tensorprobe as tp
from tensorprobe import InputError


class Looped(torch.nn.Module):
    """A step module called several times, like an ODE solver's estimator."""

    def __init__(self):
        super().__init__()
        self.step = torch.nn.Linear(4, 4)
        self.out = torch.nn.Tanh()

    def forward(self, x):
        for _ in range(3):
            x = x + 0.1 * self.step(x)
        return self.out(x)


def test_module_level_names_and_call_index():
    b = tp.capture(Looped(), torch.randn(2, 4))
    names = [r.name for r in b]
    # weights first (state-dict names), then the model inputs, the module calls, and the model's own output
    assert names == ["step.weight", "step.bias", "input.0", "step", "step@1", "step@2", "out", "<root>", "output"]
    assert [b[n].kind for n in ("step.weight", "input.0", "step", "output")] == ["param", "model_input", "output",
                                                                                   "model_output"]
    assert [b[n].call for n in ("step", "step@1", "step@2")] == [0, 1, 2]
    assert b["step@2"].module == "step" and b["out"].op == "module:Tanh"


def test_op_level_records_ops_with_module_and_source():
    b = tp.capture(Looped(), torch.randn(2, 4), level="op")
    add = b["step@1/addmm.0"]
    assert add.op == "aten.addmm.default" and add.module == "step" and add.call == 1
    tanh = b["out/tanh.0"]
    assert tanh.source and "test_capture.py" in tanh.source
    # the op graph links ops: tanh consumed the last add of the root module
    assert tanh.inputs == ("<root>/add.2",)


def test_include_exclude():
    b = tp.capture(Looped(), torch.randn(2, 4), include=r"^step")
    # the filter applies to weights as to every record; model inputs and outputs are always kept
    assert [r.name for r in b] == ["step.weight", "step.bias", "input.0", "step", "step@1", "step@2", "output"]
    b = tp.capture(Looped(), torch.randn(2, 4), exclude=r"step")
    assert "step" not in b and "out" in b


def test_keep_full_stores_values_not_later_mutations(tmp_path):
    class InPlace(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            y.add_(100)  # mutates y after it was recorded
            return y

    b = tp.capture(InPlace(), torch.ones(3), level="op", keep="full", out=tmp_path / "b")
    assert torch.equal(b.tensor("<root>/mul.0"), torch.full((3,), 2.0))
    assert torch.equal(b.tensor("<root>/add_.0"), torch.full((3,), 102.0))


def test_random_ops_recorded_at_module_level():
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x + torch.randn_like(x))

    b = tp.capture(Noisy(), torch.zeros(2, 3))
    rng = [r for r in b if r.kind == "rng"]
    assert [r.name for r in rng] == ["<root>/randn_like.0"] and rng[0].has_tensor


def test_module_level_records_the_same_random_ops_as_op_level_and_restores_torch():
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            h = x + torch.randn_like(x)
            return self.drop(h * (1 + torch.empty(3).normal_(0.0, 0.1)))

    model = Noisy().train()
    originals = (torch.randn_like, torch.nn.functional.dropout)
    names = {}
    for level in ("module", "op"):
        torch.manual_seed(0)
        b = tp.capture(model, torch.zeros(2, 3), level=level)
        names[level] = [r.name for r in b if r.kind == "rng"]
    assert names["module"] == names["op"] == ["<root>/randn_like.0", "<root>/normal_.0", "drop/bernoulli_.float.0"]
    assert (torch.randn_like, torch.nn.functional.dropout) == originals
    assert "normal_" not in torch.Tensor.__dict__  # the inherited method is uncovered again


def test_module_level_says_when_the_model_drew_noise_it_could_not_record():
    draw = torch.randn  # bound before the capture: the module level cannot see this call

    class Hidden(torch.nn.Module):
        def forward(self, x):
            return x + draw(3)

    with pytest.warns(UserWarning, match="level='op'"):
        b = tp.capture(Hidden(), torch.zeros(3))
    assert "level='op'" in b.manifest["warnings"][0]
    from typer.testing import CliRunner
    from tensorprobe.cli import app
    shown = CliRunner().invoke(app, ["show", str(b.path)])
    assert shown.exit_code == 0 and "warning:" in shown.output and "level='op'" in shown.output
    assert not [r for r in b if r.kind == "rng"]
    assert [r.name for r in tp.capture(Hidden(), torch.zeros(3), level="op") if r.kind == "rng"] == ["<root>/randn.0"]


def test_context_manager_around_user_code():
    model = Looped()
    with tp.capture(model, level="module") as cap:
        model(torch.randn(1, 4))
        model(torch.randn(1, 4))
    names = [r.name for r in cap.bundle]
    assert "step@5" in names and "out@1" in names


def test_zero_element_int_and_angle_records():
    class Odd(torch.nn.Module):
        def forward(self, x):
            empty = x[:, :0] * 2
            idx = torch.argmax(x, dim=1)
            return torch.atan2(x, x + 1), empty, idx

    b = tp.capture(Odd(), torch.randn(2, 3), level="op")
    assert b["<root>/mul.0"].stats.numel == 0
    assert b["<root>/argmax.0"].stats.kind == "int"
    assert "angle" in b["<root>/atan2.0"].tags


class _Scalars(torch.nn.Module):
    """A learned 0-d gain, a 0-d model input, 0-d op outputs and a 0-d model output."""

    def __init__(self):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x, temperature):
        energy = (x * x).sum()                      # 0-d
        return energy * self.gain / temperature, x.mean(-1)


@pytest.mark.parametrize("level", ["module", "op"])
def test_0d_tensors_keep_their_shape(tmp_path, level):
    x, temperature = torch.randn(3, 4), torch.tensor(2.0)
    b = tp.capture(_Scalars(), x, temperature, level=level, keep="full", out=tmp_path / level)
    zero_d = {r.name for r in b if r.shape == ()}
    expected = {"gain", "input.1", "output.0"} | ({"<root>/sum.0", "<root>/mul.1", "<root>/div.0"} if level == "op"
                                                 else {"<root>:0"})
    assert zero_d == expected, zero_d
    assert all(b.numpy(n).shape == () for n in zero_d)
    assert b.numpy("output.0") == pytest.approx(float((x * x).sum() * 0.5 / 2.0))
    assert b.manifest["inputs"][1]["shape"] == [] and b["output.1"].shape == (3,)
    # a 0-d value is not a one-element vector: a bundle that says (1,) for it no longer pairs by shape
    assert tp.diff(b, b).passed


def test_bad_options():
    with pytest.raises(InputError, match="unknown capture level"):
        tp.capture(Looped(), torch.randn(1, 4), level="layer")
    with pytest.raises(InputError, match="invalid --include regex"):
        tp.capture(Looped(), torch.randn(1, 4), include="(")
    with pytest.raises(InputError, match="torch.nn.Module"):
        tp.capture(lambda x: x, torch.randn(1, 4))


def test_an_output_directory_that_cannot_be_written_is_named_before_anything_runs(tmp_path):
    """`capture ... -o /proc/forbidden` said "the model's forward raised FileNotFoundError". An output
    directory that cannot be created is bad input, named as such (exit 2), before the forward runs."""
    import pathlib
    import subprocess
    import sys

    from tensorprobe.errors import BundleError

    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(BundleError, match=r"cannot create the output directory .*a_file is not a directory"):
        tp.capture.check_output_dir(blocker / "bundle")
    with pytest.raises(BundleError, match="exists and is not a directory"):
        tp.capture.check_output_dir(blocker)
    tp.capture.check_output_dir(tmp_path / "new" / "deeper")          # creatable: fine, and nothing is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
    marker = tmp_path / "forward_ran"
    (tmp_path / "m.py").write_text(
        "import pathlib, torch\n"
        "class M(torch.nn.Module):\n"
        f"    def forward(self, x):\n        pathlib.Path({str(marker)!r}).write_text('ran')\n        return x\n"
        "def build():\n    return M(), (torch.ones(2),)\n")
    unwritable = [blocker / "bundle"] + ([pathlib.Path("/proc/forbidden")] if pathlib.Path("/proc").is_dir() else [])
    for out in unwritable:
        p = subprocess.run([sys.executable, "-m", "tensorprobe", "capture", f"{tmp_path / 'm.py'}:build", "-o",
                            str(out)], capture_output=True, text=True)
        assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
        assert "cannot " in p.stderr and str(out) in p.stderr and "forward raised" not in p.stderr
        assert not marker.exists()
    if pathlib.Path("/proc").is_dir():                                  # the library says the same
        with pytest.raises(BundleError, match="cannot write the bundle to /proc/forbidden"):
            tp.capture(Looped(), torch.randn(1, 4), out="/proc/forbidden")


def test_every_tensor_of_nested_inputs_is_recorded_by_key_and_a_changed_one_is_named(tmp_path):
    """A forward taking one dict (a batch) had no input record: a 1 % change of one input read "first
    divergence at a, cause own" (found by the accuracy work's new-user check)."""
    class DictNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)

        def forward(self, batch):
            return self.a(batch["x"]) * batch["extra"][0]

    torch.manual_seed(0)
    model, x, scale = DictNet().eval(), torch.randn(4, 8), torch.full((4, 1), 2.0)
    ref = tp.capture(model, {"x": x, "extra": [scale]}, level="op", out=tmp_path / "ref")
    assert "input.0.x" in ref and "input.0.extra.0" in ref and "input.0.x" in ref["a/addmm.0"].inputs
    same = tp.capture(model, {"x": x.clone(), "extra": [scale]}, level="op", out=tmp_path / "same")
    assert tp.diff(ref, same).verdict == "match"
    moved = tp.diff(ref, tp.capture(model, {"x": x * 1.01, "extra": [scale]}, out=tmp_path / "moved"))
    assert moved.first_divergence == "input.0.x" and "inputs already differ" in moved.summary
