"""The protocol's models without a server (issue 29 item 5): finding one, its metadata, the compute precision
from the datatypes, and its request parameters read into the typed options (unknown ones refused, naming them).
"""

from __future__ import annotations

import numpy as np
import pytest

from service.dataplane.errors import Kind, ServiceError
from service.dataplane.inference import InferRequest
from service.dataplane.models import MODELS, find_model
from service.dataplane.models.base import option_fields, precision_of, validated
from service.dataplane.options import AttentionOptions

ATTENTION = find_model("attention")


def request(datatypes: dict[str, str], **parameters: object) -> InferRequest:
    return InferRequest(None, dict(parameters), {n: np.zeros(1) for n in datatypes}, datatypes)


@pytest.mark.parametrize(("name", "version"), [("nope", None), ("attention", "2")])
def test_an_unknown_model_or_version_is_not_found(name: str, version: str | None) -> None:
    with pytest.raises(ServiceError) as err:
        find_model(name, version)
    assert err.value.kind is Kind.NOT_FOUND


def test_every_model_describes_its_tensors() -> None:
    for model in MODELS.values():
        meta = model.metadata()
        assert meta["name"] == model.name and meta["versions"] == ["1"]
        for tensor in meta["inputs"] + meta["outputs"]:
            assert tensor["shape"] == [-1] * tensor["ranks"][-1] and tensor["datatype"] in tensor.get(
                "datatypes", [tensor["datatype"]]
            )


@pytest.mark.parametrize(
    ("types", "precision"),
    [({"FP32"}, "float32"), ({"FP16"}, "float32"), ({"FP16", "FP32"}, "float32"), ({"FP64"}, "float64")],
)
def test_the_precision_follows_the_datatypes(types: set[str], precision: str) -> None:
    names = ("query", "key", "value")
    datatypes = dict(zip(names, sorted(types) * 3, strict=False))
    assert precision_of(request(datatypes), names) == precision


def test_precisions_that_disagree_are_refused() -> None:
    with pytest.raises(ServiceError, match="must share one precision"):
        precision_of(request({"query": "FP32", "key": "FP64"}), ("query", "key"))


def test_parameters_become_options_and_a_typo_is_refused() -> None:
    fields = option_fields(request({}, temperature=0.5, binary_data_output=True), ATTENTION, ("temperature",))
    assert fields == {"temperature": 0.5}  # the protocol's own parameters are not options
    assert validated(AttentionOptions, fields, ATTENTION).temperature == 0.5
    with pytest.raises(ServiceError, match="model 'attention' has no parameter 'temprature'"):
        option_fields(request({}, temprature=0.5), ATTENTION, ("temperature",))
    with pytest.raises(ServiceError, match="parameter 'temperature': Input should be greater than 0"):
        validated(AttentionOptions, {"temperature": -1.0}, ATTENTION)
