"""The C heap helpers of the ONNX engine: reading glibc's huge-page tunable, the kernel's THP mode, and the
environment ``serve`` starts itself with (``service/engines/onnx_engine/heap.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.engines.onnx_engine import heap


def test_the_tunable_is_read_from_glibc_tunables_among_others() -> None:
    assert heap.tunable_value({}) is None
    assert heap.tunable_value({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is None
    assert heap.tunable_value({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"}) == "0"
    assert heap.tunable_value({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) == "1"
    assert heap.tunable_value({"GLIBC_TUNABLES": "glibc.malloc.hugetlbx=1"}) is None  # a whole name, not a prefix


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never\n", "always"),
        ("always madvise [never]", "never"),
    ],
)
def test_the_kernels_thp_mode_is_the_bracketed_one(tmp_path: Path, text: str, mode: str) -> None:
    setting = tmp_path / "enabled"
    setting.write_text(text)
    assert heap.transparent_huge_pages(str(setting)) == mode
    assert heap.transparent_huge_pages(str(tmp_path / "missing")) is None


def test_the_environment_gains_the_tunable_and_keeps_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "huge_pages_possible", lambda: True)
    assert heap.huge_pages_environment({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    added = heap.huge_pages_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert added == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    # an operator's own value stands, whatever it is: nothing to change
    assert heap.huge_pages_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert heap.huge_pages_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) is None


def test_with_tunable_sets_or_drops_the_one_tunable() -> None:
    others = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0:glibc.malloc.tcache_count=0"}
    assert heap.with_tunable(others, "1") == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1"
    }
    assert heap.with_tunable(others, None) == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0"}
    assert heap.with_tunable({}, None) == {"GLIBC_TUNABLES": ""}
    assert heap.with_tunable({"GLIBC_TUNABLES": "glibc.malloc.hugetlbx=1"}, "1") == {
        "GLIBC_TUNABLES": "glibc.malloc.hugetlbx=1:glibc.malloc.hugetlb=1"  # a whole name, not a prefix
    }


def test_no_change_where_huge_pages_cannot_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "glibc_version", lambda: (2, 36))
    monkeypatch.setattr(heap, "transparent_huge_pages", lambda: "never")
    assert not heap.huge_pages_possible()
    assert heap.huge_pages_environment({}) is None
    assert not heap.malloc_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    monkeypatch.setattr(heap, "glibc_version", lambda: (2, 34))  # the tunable came with glibc 2.35
    monkeypatch.setattr(heap, "transparent_huge_pages", lambda: "madvise")
    assert not heap.huge_pages_possible()
    monkeypatch.setattr(heap, "glibc_version", lambda: None)  # musl, macOS
    assert not heap.huge_pages_possible()
    monkeypatch.setattr(heap, "glibc_version", lambda: (2, 35))
    assert heap.huge_pages_possible()


def test_this_machines_glibc_is_read() -> None:
    version = heap.glibc_version()
    assert version is None or (version[0] == 2 and version[1] > 0)


def test_malloc_huge_pages_needs_the_tunable_set_to_one_or_two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "huge_pages_possible", lambda: True)
    assert heap.malloc_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert heap.malloc_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"})
    assert not heap.malloc_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert not heap.malloc_huge_pages({})
