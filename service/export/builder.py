"""A small, deterministic wrapper around ``onnx.helper`` for writing graphs by hand.

Every tensor name is either given explicitly or derived from a per-graph
counter, so building the same graph twice yields the same protobuf, byte for
byte (no timestamps, no random names, no dict-order surprises).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, overload

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 23
CONTRIB_DOMAIN = "com.microsoft"
"""ONNX Runtime's contributed operators (``MultiHeadAttention``), imported at version 1 by a graph that uses one."""
# onnx >= 1.23 writes IR version 14 by default, which onnxruntime 1.31 refuses to load.
IR_VERSION = 10
PRODUCER_NAME = "attention-service"
# Bumped by hand when the graphs change meaning; never derived from the package version,
# so that releasing the service does not change the bytes of unchanged graphs.
PRODUCER_VERSION = "1"

ONNX_DTYPES: dict[str, int] = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}


class GraphBuilder:
    """Accumulates nodes, initializers and value infos of one graph.

    ``op`` appends a node and returns its output name(s); ``const`` registers
    a named initializer once and returns its name.
    """

    def __init__(self, name: str, dtype: str, *, prefix: str = "") -> None:
        """``prefix`` starts every generated name (subgraphs must not shadow outer names)."""
        self.name = name
        self.prefix = prefix
        self.dtype = dtype
        self.np_dtype = np.dtype(dtype)
        self.onnx_dtype = ONNX_DTYPES[dtype]
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._consts: dict[str, str] = {}
        self._count = 0

    # ------------------------------------------------------------------ values
    def input(self, name: str, elem_type: int | None, shape: Sequence[str | int], doc: str = "") -> str:
        vi = helper.make_tensor_value_info(name, self.onnx_dtype if elem_type is None else elem_type, list(shape))
        vi.doc_string = doc
        self.inputs.append(vi)
        return name

    def output(self, name: str, shape: Sequence[str | int], doc: str = "", elem_type: int | None = None) -> None:
        vi = helper.make_tensor_value_info(name, self.onnx_dtype if elem_type is None else elem_type, list(shape))
        vi.doc_string = doc
        self.outputs.append(vi)

    def const(self, value: float | int | Sequence[int] | np.ndarray, dtype: np.dtype | type | str | None = None) -> str:
        """Name of an initializer holding ``value`` (scalar or 1-D); the graph dtype by default."""
        arr = np.asarray(value, dtype=self.np_dtype if dtype is None else dtype)
        key = f"{arr.dtype.str}|{arr.shape}|{arr.tobytes().hex()}"
        if key in self._consts:
            return self._consts[key]
        name = f"{self.prefix}const_{len(self._consts)}"
        self.initializers.append(numpy_helper.from_array(arr, name))
        self._consts[key] = name
        return name

    @contextmanager
    def computing_in(self, dtype: str) -> Iterator[None]:
        """Within the block, ``const``, ``op`` casts and value infos use ``dtype`` instead of the graph's."""
        saved = (self.dtype, self.np_dtype, self.onnx_dtype)
        self.dtype, self.np_dtype, self.onnx_dtype = dtype, np.dtype(dtype), ONNX_DTYPES[dtype]
        try:
            yield
        finally:
            self.dtype, self.np_dtype, self.onnx_dtype = saved

    # ------------------------------------------------------------------- nodes
    @overload
    def op(
        self, op_type: str, *inputs: str, out: str | None = None, n_out: Literal[1] = 1, domain: str = "", **attrs: Any
    ) -> str: ...
    @overload
    def op(
        self, op_type: str, *inputs: str, out: Sequence[str], n_out: int = 1, domain: str = "", **attrs: Any
    ) -> list[str]: ...
    @overload
    def op(
        self, op_type: str, *inputs: str, out: None = None, n_out: int, domain: str = "", **attrs: Any
    ) -> list[str]: ...
    def op(
        self,
        op_type: str,
        *inputs: str,
        out: str | Sequence[str] | None = None,
        n_out: int = 1,
        domain: str = "",
        **attrs: Any,  # ONNX attribute values (numbers, strings, tensors, graphs, lists): helper.make_attribute's job
    ) -> str | list[str]:
        """Append a node; returns its single output name, or the list when ``n_out > 1`` or ``out`` is a list."""
        self._count += 1
        if out is None:
            stem = f"{self.prefix}{op_type.lower()}_{self._count}"
            outs = [stem if n_out == 1 else f"{stem}_{i}" for i in range(n_out)]
        elif isinstance(out, str):
            outs = [out]
        else:
            outs = list(out)
        node = helper.make_node(
            op_type, list(inputs), outs, name=f"{self.prefix}n{self._count}_{op_type}", domain=domain, **attrs
        )
        self.nodes.append(node)
        return outs[0] if isinstance(out, str) or (out is None and n_out == 1) else outs

    def rename(self, old: str, new: str) -> None:
        """Rename tensor ``old`` to ``new`` wherever a node produces or consumes it."""
        for node in self.nodes:
            for names in (node.input, node.output):
                for i, name in enumerate(names):
                    if name == old:
                        names[i] = new

    # ------------------------------------------------------------------- model
    def model(self, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, initializer=self.initializers)
        graph.doc_string = doc
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)]
            + ([helper.make_opsetid(CONTRIB_DOMAIN, 1)] if any(n.domain == CONTRIB_DOMAIN for n in self.nodes) else []),
            producer_name=PRODUCER_NAME,
            producer_version=PRODUCER_VERSION,
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        model.model_version = int(PRODUCER_VERSION)
        return model


def serialize(model: onnx.ModelProto) -> bytes:
    """The model's bytes, with deterministic protobuf serialization."""
    data: bytes = model.SerializeToString(deterministic=True)
    return data
