"""The op vocabulary every producer's records share: which ops alias, draw random numbers, make angles,
cannot create NaN; and `canonical_op`, which names any producer's op in one vocabulary.

Records carry the op as their producer calls it: `aten.rsqrt.default` (PyTorch), `Sqrt` (ONNX),
`InstanceNormalization` (ONNX), `aten::native_layer_norm` (ExecuTorch), a TVM kernel name, or
`module:InstanceNorm1d` (a module-level record). Rules (NaN diagnosis, op families) ask
`canonical_op(record.op)` and see aten's base names (`rsqrt`, `sqrt`, `instance_norm`) for all of them.

    >>> canonical_op("aten.rsqrt.default"), canonical_op("Sqrt"), canonical_op("InstanceNormalization")
    ('rsqrt', 'sqrt', 'instance_norm')
    >>> canonical_op("module:InstanceNorm1d")
    'InstanceNorm1d'
"""

from __future__ import annotations

import functools
import re

# Ops whose output aliases an input with the same elements: recording them would only repeat data.
ALIAS_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand",
    "alias", "detach", "lift_fresh", "view_as_real", "view_as_complex", "_reshape_alias", "flatten",
    "unflatten", "movedim", "contiguous", "clone", "numpy_T", "expand_as", "view_as",
})
# Ops that draw from a random generator.
RNG_OPS = frozenset({
    "randn", "randn_like", "rand", "rand_like", "randint", "randint_like", "randperm", "normal", "normal_",
    "uniform_", "bernoulli", "bernoulli_", "multinomial", "native_dropout", "exponential_", "geometric_",
    "cauchy_", "log_normal_", "random_", "poisson", "rrelu_with_noise", "_standard_gamma", "binomial",
})
# Ops whose outputs are angles (compared modulo 2π by diff).
ANGLE_OPS = frozenset({"atan2", "angle"})
# Ops that never carry numerical information worth a record.
SKIP_OPS = frozenset({"_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "copy_", "set_", "empty",
                      "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_", "is_same_size",
                      "_has_compatible_shallow_copy_type", "is_nonzero"})
# Ops that cannot make NaN or Inf from finite inputs (a product of finite values overflows only to Inf,
# which `mul` of two huge values can: it is not listed among those that make NaN only).
NAN_FREE_OPS = frozenset({
    "mul", "add", "sub", "rsub", "addcmul", "cat", "stack", "clone", "copy", "_to_copy", "view", "view_copy",
    "reshape", "permute", "permute_copy", "expand", "expand_copy", "repeat", "squeeze", "squeeze_copy",
    "unsqueeze", "unsqueeze_copy", "transpose", "t", "slice", "slice_copy", "select", "select_copy", "index",
    "gather", "index_select", "relu", "leaky_relu", "hardtanh", "sigmoid", "tanh", "gelu", "silu", "elu", "abs",
    "neg", "sin", "cos", "constant_pad_nd", "reflection_pad1d", "replication_pad1d", "upsample_nearest1d",
    "max_pool1d", "max_pool2d", "where", "clamp"})

# ONNX operator types whose aten name is not their snake_case spelling.
_ONNX_TO_ATEN = {
    "InstanceNormalization": "instance_norm", "LayerNormalization": "layer_norm", "BatchNormalization": "batch_norm",
    "GroupNormalization": "group_norm", "Gemm": "addmm", "MatMul": "matmul", "CumSum": "cumsum", "Conv": "convolution", "ConvTranspose": "convolution",
    "ReduceMean": "mean", "ReduceSum": "sum", "ReduceL2": "norm", "Concat": "cat", "Identity": "clone",
    "Transpose": "permute", "Tile": "repeat", "Pad": "constant_pad_nd", "Clip": "clamp", "Sum": "add",
    "LeakyRelu": "leaky_relu", "LogSoftmax": "_log_softmax", "Softmax": "softmax", "RandomNormal": "randn",
    "RandomNormalLike": "randn_like", "RandomUniform": "rand", "RandomUniformLike": "rand_like",
}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


@functools.lru_cache(maxsize=4096)
def canonical_op(op: str) -> str:
    """The base name of `op` in aten's vocabulary, whatever produced it (see the module docstring).

    A module-level record (`module:X`) keeps its class name; an unknown name comes back snake_cased.
    """
    if op.startswith("module:"):
        return op.removeprefix("module:")
    for prefix in ("aten.", "aten::", "aten_", "prims.", "quantized."):
        if op.startswith(prefix):
            return op[len(prefix):].split(".")[0].removesuffix("_out")
    if op in _ONNX_TO_ATEN:
        return _ONNX_TO_ATEN[op]
    return _CAMEL.sub("_", op).lower() if op[:1].isupper() else op


__all__ = ["ALIAS_OPS", "ANGLE_OPS", "NAN_FREE_OPS", "RNG_OPS", "SKIP_OPS", "canonical_op"]
