"""`tensorprobe diff` as a user runs it: exit codes 0/1/2, --json, --map/--rules, --html."""

import json
import subprocess
import sys

import pytest
import torch


def run(*args):
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "diff", *map(str, args)], capture_output=True,
                       text=True, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin", "HOME": "/tmp",
                                       "PYTHONWARNINGS": "ignore"})
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def pair(make_bundle):
    x = torch.randn(1, 4, 200)
    y = torch.tanh(x)
    ref = make_bundle([("enc", x, {"kind": "model_input"}), ("dec.conv", y, {"inputs": ("enc",)}),
                       ("dec.out", 2 * y, {"inputs": ("dec.conv",)})], "ref")
    y2 = y * (1 + 1e-2 * torch.sin(torch.arange(y.numel()).reshape(y.shape).float()))
    cand = make_bundle([("enc", x, {"kind": "model_input"}), ("dec.conv", y2, {"inputs": ("enc",)}),
                        ("dec.out", 2 * y2, {"inputs": ("dec.conv",)})], "cand")
    return ref.path, cand.path


def test_divergence_exits_1_and_names_the_first_divergence(pair):
    code, out, err = run(*pair)
    assert code == 1, err
    assert "DIVERGED" in out and "first divergence at dec.conv" in out


def test_identical_bundles_exit_0(pair):
    code, out, _ = run(pair[0], pair[0])
    assert code == 0 and "MATCH" in out


def test_loose_tolerance_passes(pair):
    code, _, _ = run(*pair, "--min-snr", "30")
    assert code == 0


def test_json_document(pair):
    code, out, _ = run(*pair, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["command"] == "diff" and doc["status"] == "finding"
    rep = doc["report"]
    assert rep["verdict"] == "diverged" and rep["first_divergence"] == "dec.conv"
    assert rep["criteria"]["rule"] == "noise" and rep["criteria"]["min_snr"] is None
    p = {q["name"]: q for q in rep["pairs"]}
    assert p["dec.conv"]["status"] == "fail" and p["dec.conv"]["gain"] == "inf"
    assert set(p["enc"]["metrics"]) >= {"max_abs_err", "mean_abs_err", "max_rel_err", "cosine", "pearson",
                                        "snr_db", "ref_finite_frac", "cand_finite_frac"}


def test_map_and_rules_file(make_bundle, tmp_path):
    x = torch.randn(64)
    ref = make_bundle([("decoder.generator.conv_post", x)], "r")
    cand = make_bundle([("gen/conv_post_out", x)], "c")
    code, out, _ = run(ref.path, cand.path, "--map", r"gen/(\w+)_out=decoder.generator.\1", "--json")
    assert code == 0 and json.loads(out)["report"]["pairs"][0]["match"] == "rule"
    rules = tmp_path / "rules.txt"
    rules.write_text(r"gen/(\w+)_out=decoder.generator.\1" + "\n")
    code, out, _ = run(ref.path, cand.path, "--rules", rules)
    assert code == 0
    code, out, _ = run(ref.path, cand.path)
    assert code == 1 and "reference-only" in out.replace("reference only", "reference-only")


@pytest.mark.parametrize("args,msg", [(("missing_dir", "missing_dir"), "no such bundle"),
                                      (("--map", "bad(=x"), "invalid regular expression"),
                                      (("--rules", "/nonexistent/rules.txt"), "can't read rules file"),
                                      (("--angle", "(["), "invalid regular expression"),
                                      (("--db", "dec.out=bogus"), "--db 'dec.out=bogus': unknown scale 'bogus'; "
                                                                  "choose one of auto, mag, power, ln, db")])
def test_bad_input_exits_2_with_one_line(pair, args, msg):
    full = args if args[0] == "missing_dir" else (*pair, *args)
    code, out, err = run(*full)
    assert code == 2 and msg in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("spec, scale", [("dec.out=ln", "ln"), ("dec.out", "ln"), ("dec.out=mag", "mag")])
def test_a_db_scale_that_exists_is_used(pair, spec, scale):
    """Before: a scale that names none (`=bogus`) was silently taken as part of the regex, and matched nothing."""
    code, out, _ = run(*pair, "--db", spec, "--json")
    p = {q["name"]: q for q in json.loads(out)["report"]["pairs"]}
    assert p["dec.out"]["db"]["scale"] == scale and p["dec.conv"]["db"] is None


def test_html_written(pair, tmp_path):
    out_html = tmp_path / "r.html"
    code, out, _ = run(*pair, "--html", out_html)
    assert code == 1 and out_html.exists()
    text = out_html.read_text()
    assert "dec.conv" in text and "DIVERGED" in text and "http" not in text.split("<body>")[1].lower()


@pytest.mark.parametrize("json_out", [False, True])
def test_a_reader_that_closes_early_leaves_the_exit_code_to_the_verdict(pair, json_out):
    """`tensorprobe diff ref cand | head`: the reader is gone before anything is written. Before: exit 1 ("a
    finding") on a match, from rich's broken-pipe handler; Python's own would print a traceback."""
    for cand, expected in ((pair[0], 0), (pair[1], 1)):
        p = subprocess.Popen([sys.executable, "-m", "tensorprobe", "diff", str(pair[0]), str(cand), "--all",
                              *(["--json"] if json_out else [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={"COLUMNS": "160", "PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONWARNINGS": "ignore"})
        p.stdout.close()
        _, err = p.communicate(timeout=300)
        assert p.returncode == expected and not err, err.decode()
