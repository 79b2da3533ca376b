"""The bundle: a directory that any framework can read.

    my_capture/
        manifest.json              format version, producer, model/runtime, input hashes, records
        tensors-00000.safetensors  tensor data (keep="full"), in shards of at most `shard_bytes`
        tensors-00001.safetensors
        records.jsonl              journal, present only while a capture is running
        .tensorprobe.lock          the writer's flock (one live capture per directory), and the reason a
                                   capture stopped when a full disk left no room for the manifest

`BundleWriter` streams: tensors are buffered up to one shard and flushed, so peak memory does not grow
with the number of captured tensors. Each record is appended to the journal as it is made; if the process
dies mid-capture the journal still yields a readable bundle marked incomplete. `close(error=...)` records
the exception of a forward that raised (often exactly what is being debugged).

`Bundle.open` reads a bundle directory lazily (shards are memory-mapped by safetensors), and also opens
a plain `.safetensors` or `.npz` file of named tensors, as dumped by a Swift/MLX/C++ port, computing
statistics on load. Reading needs NumPy and safetensors only: `Bundle.numpy(name)` never imports torch,
`Bundle.tensor(name)` gives a torch tensor.

- `format`  the layout's constants, atomic writes, safetensors headers
- `reader`  `Bundle`: open, validate, read (NumPy; torch on request)
- `writer`  `BundleWriter`: stream records and tensors from a capture (torch)
- `lock`    `WriterLock`: one live writer per directory; a crashed one never leaves it stuck

    >>> b = Bundle.open("my_capture")                         # doctest: +SKIP
    >>> [r.name for r in b if not r.stats.all_finite][:1]     # doctest: +SKIP
    ['decoder.generator.noise_res.0.adain1.0.norm/rsqrt.0']
"""

from __future__ import annotations

from typing import Any

from .format import (DEFAULT_SHARD_BYTES, FORMAT, FORMAT_VERSION, JOURNAL, MANIFEST, STATUS_COMPLETE,
                     STATUS_INCOMPLETE, STATUS_RUNNING, atomic_write_bytes, read_safetensors_header,
                     safetensors_header)
from .reader import Bundle

# The writer needs torch: imported when first asked for, so that reading a bundle never imports torch.
_WRITER_NAMES = ("BundleWriter", "describe_inputs", "populated_bytes", "producer_info", "release_buffers",
                 "tensor_sha256")


def __getattr__(name: str) -> Any:
    if name in _WRITER_NAMES:
        from . import writer

        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Bundle", "BundleWriter", "DEFAULT_SHARD_BYTES", "FORMAT", "FORMAT_VERSION", "JOURNAL", "MANIFEST",
           "STATUS_COMPLETE", "STATUS_INCOMPLETE", "STATUS_RUNNING", "atomic_write_bytes", "describe_inputs",
           "populated_bytes", "producer_info", "read_safetensors_header", "release_buffers", "safetensors_header",
           "tensor_sha256"]
