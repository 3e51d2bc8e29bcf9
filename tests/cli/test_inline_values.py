"""Inline values as a user types them (issue 28, item 8): a list that starts with a negative number, and a list
longer than a file name may be, are numbers, not an option or a path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.__main__ import attach_negative_values
from tests.cli.test_commands import cli

pytestmark = pytest.mark.slow  # runs the command line in a process of its own


def test_a_list_that_starts_with_a_negative_number_is_the_options_value() -> None:
    result = cli("softmax", "--local", "--scores", "-5,2,1", "--json")
    assert result.returncode == 0, result.stderr
    expected = np.exp([-5.0, 2.0, 1.0]) / np.exp([-5.0, 2.0, 1.0]).sum()
    np.testing.assert_allclose(json.loads(result.stdout)["probabilities"], expected, rtol=1e-12)


def test_a_long_inline_list_is_numbers_not_a_path() -> None:
    values = [float(i % 7) for i in range(10_000)]  # 20,000 characters: longer than any file name
    result = cli("softmax", "--local", "--scores", ",".join(str(v) for v in values), "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    probabilities = np.array(json.loads(result.stdout)["probabilities"])
    np.testing.assert_allclose(probabilities, np.exp(values) / np.exp(values).sum(), rtol=1e-12)


def test_only_values_that_start_like_negative_numbers_are_attached() -> None:
    argv = ["softmax", "--scores", "-5,2", "--mask", "-.5;1", "--log", "--axis", "-1", "--json", "-", "--x", "-inf,0"]
    assert attach_negative_values(argv) == [
        "softmax",
        "--scores=-5,2",
        "--mask=-.5;1",
        "--log",
        "--axis=-1",
        "--json",
        "-",
        "--x=-inf,0",
    ]
    assert attach_negative_values(["--scores", "--local"]) == ["--scores", "--local"]
    assert attach_negative_values(["--scores=-5,2", "-1"]) == ["--scores=-5,2", "-1"]
