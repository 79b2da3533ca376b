"""The ONNX backend test models that ship in the `onnx` wheel (simple, pytorch-operator, pytorch-converted: 140
models, none written for tensorprobe), each captured with its own test inputs.

Where plain ONNX Runtime runs a model, the capture's model outputs are ORT's, with ORT's shapes — a 0-d output
(`SequenceLength`) stays 0-d — and text inputs are taken from an `.npz` of fixed-width strings; where ORT cannot
run it (opset-6 kernels it no longer has, training ops, a missing locale), the capture fails the same way, as
one `TensorprobeError`, never a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import numpy_helper  # noqa: E402

from tensorprobe.errors import TensorprobeError  # noqa: E402
from tensorprobe.runtimes import get_runtime  # noqa: E402

pytestmark = pytest.mark.onnx

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
# the three model families the docstring names; onnx wheels before 1.23 also ship ~1,300 single-op `node` tests
CATEGORIES = ("simple", "pytorch-operator", "pytorch-converted")
MODELS = sorted(p.parent for c in CATEGORIES for p in (DATA / c).glob("*/model.onnx")
                if (p.parent / "test_data_set_0").is_dir())


def _read(path: Path) -> np.ndarray:
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def _data(model_dir: Path, kind: str) -> list[np.ndarray]:
    files = sorted((model_dir / "test_data_set_0").glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    return [_read(p) for p in files]


def _plain_ort(model_dir: Path, feeds: list[np.ndarray]) -> list[np.ndarray] | None:
    """What ONNX Runtime itself returns, or None when it cannot run the model."""
    try:
        sess = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        return sess.run(None, dict(zip(names, feeds)))
    except Exception:  # noqa: BLE001 - ORT's own refusal is the expected outcome then
        return None


def test_the_corpus_is_there():
    assert len(MODELS) == 140, len(MODELS)


@pytest.mark.parametrize("model_dir", MODELS, ids=[p.name for p in MODELS])
def test_a_backend_model_captures_as_onnx_runtime_runs_it(model_dir, tmp_path):
    feeds, expected = _data(model_dir, "input"), _data(model_dir, "output")
    plain = _plain_ort(model_dir, feeds)
    capture = get_runtime("onnxruntime").capture_artifact
    if plain is None:
        with pytest.raises(TensorprobeError, match="ONNX Runtime failed on this graph"):
            capture(model_dir / "model.onnx", feeds, tmp_path / "b", keep="full")
        return
    b = capture(model_dir / "model.onnx", feeds, tmp_path / "b", keep="full")
    outputs = [r for r in b if r.kind == "model_output"]
    numeric = [(p, e) for p, e in zip(plain, expected) if np.asarray(p).dtype.kind not in "OUS"]
    assert [r.shape for r in outputs] == [tuple(e.shape) for _, e in numeric]        # 0-d stays 0-d
    for r, (p, _) in zip(outputs, numeric):
        assert r.dtype == np.asarray(p).dtype.name
        np.testing.assert_array_equal(b.numpy(r.name), p)
    if len(numeric) < len(plain):       # text values run but are not records: the notes say which
        assert any("text value" in n for n in b.runtime.get("notes", []))


def test_sequence_length_is_a_0d_int64(tmp_path):
    model_dir = DATA / "simple" / "test_sequence_model6"
    feeds = _data(model_dir, "input")
    b = get_runtime("onnxruntime").capture_artifact(model_dir / "model.onnx", feeds, tmp_path / "b", keep="stats")
    out = b["output"]
    assert out.shape == () and out.dtype == "int64" and b.numpy("output").shape == ()
    assert int(b.numpy("output")) == int(_data(model_dir, "output")[0]) == 4      # 2 × 3 × 4 split into 4


# ---- text inputs through `capture --inputs` ----------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorprobe", *args], capture_output=True, text=True)


def _runnable_strnorm(tmp_path: Path) -> Path:
    """The backend's StringNormalizer model (text in, text out). Its kernel builds the en_US.UTF-8 locale,
    which minimal systems lack; there, the same model with locale C.UTF-8 (the only change)."""
    src = DATA / "simple" / "test_strnorm_model_monday_casesensintive_upper"
    if _plain_ort(src, _data(src, "input")) is not None:
        return src / "model.onnx"
    m = onnx.load(str(src / "model.onnx"))
    m.graph.node[0].attribute.append(onnx.helper.make_attribute("locale", "C.UTF-8"))
    onnx.save(m, str(tmp_path / "strnorm.onnx"))
    return tmp_path / "strnorm.onnx"


def _text_to_numbers(tmp_path: Path) -> Path:
    """Text in, numbers out: StringNormalizer (drops "monday", upper case) -> LabelEncoder -> Cast -> Mul."""
    h = onnx.helper
    nodes = [h.make_node("StringNormalizer", ["x"], ["norm"], case_change_action="UPPER", is_case_sensitive=1,
                         stopwords=["monday"], locale="C.UTF-8"),
             h.make_node("LabelEncoder", ["norm"], ["ids"], domain="ai.onnx.ml", keys_strings=["TUESDAY", "FRIDAY"],
                         values_int64s=[2, 5], default_int64=-1),
             h.make_node("Cast", ["ids"], ["f"], to=onnx.TensorProto.FLOAT),
             h.make_node("Mul", ["f", "w"], ["y"])]
    graph = h.make_graph(nodes, "text", [h.make_tensor_value_info("x", onnx.TensorProto.STRING, [None])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None])],
                         [numpy_helper.from_array(np.array([0.5], np.float32), "w")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.ml", 3)])
    onnx.save(model, str(tmp_path / "text.onnx"))
    return tmp_path / "text.onnx"


@pytest.mark.parametrize("dtype", [str, bytes])
def test_text_inputs_from_an_npz_of_fixed_width_strings(tmp_path, dtype):
    words = np.array(["monday", "tuesday", "friday", "sunday"], dtype=dtype)
    np.savez(tmp_path / "words.npz", x=words)
    # text to numbers: the numeric values downstream are records, equal to plain ORT's
    p = _cli("capture", str(_text_to_numbers(tmp_path)), "--inputs", str(tmp_path / "words.npz"), "-o",
             str(tmp_path / "b"), "--keep", "full", "--json")
    assert p.returncode == 0, p.stderr
    from tensorprobe import Bundle

    b = Bundle.open(tmp_path / "b")
    np.testing.assert_array_equal(b.numpy("output"), np.array([1.0, 2.5, -0.5], np.float32))
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert manifest["inputs"] == [{"name": "x", "shape": [4], "dtype": "str", "sha256": manifest["inputs"][0]["sha256"]}]
    assert any("text value(s)" in n and "x, norm" in n for n in manifest["runtime"]["notes"])
    # the backend's own text model: runs, records nothing numeric, says why
    p = _cli("capture", str(_runnable_strnorm(tmp_path)), "--inputs", str(tmp_path / "words.npz"), "-o",
             str(tmp_path / "s"), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["records"] == 0, p.stderr


def test_text_inputs_are_never_unpickled_and_a_wrong_kind_is_named(tmp_path):
    words = np.array(["monday", "tuesday"], dtype=object)
    np.savez(tmp_path / "objects.npz", x=words)                       # object arrays are stored pickled
    p = _cli("capture", str(_text_to_numbers(tmp_path)), "--inputs", str(tmp_path / "objects.npz"), "-o",
             str(tmp_path / "b"))
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "array 'x' holds Python objects" in p.stderr and "never unpickles" in p.stderr
    assert "dtype=str" in p.stderr and not (tmp_path / "b").exists()
    # numbers where the graph takes text, and text where it takes numbers
    np.savez(tmp_path / "numbers.npz", x=np.arange(3.0))
    p = _cli("capture", str(_text_to_numbers(tmp_path)), "--inputs", str(tmp_path / "numbers.npz"), "-o",
             str(tmp_path / "c"))
    assert p.returncode == 2 and "input 'x': got float64, the graph expects text" in p.stderr, p.stderr
    sq6 = DATA / "simple" / "test_sequence_model6" / "model.onnx"
    np.savez(tmp_path / "text_for_numbers.npz", X=np.array(["a"]))
    p = _cli("capture", str(sq6), "--inputs", str(tmp_path / "text_for_numbers.npz"), "-o", str(tmp_path / "d"))
    assert p.returncode == 2 and "input 'X': got text (<U1), the graph expects numbers" in p.stderr, p.stderr
