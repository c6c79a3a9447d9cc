"""field_table.py: one spec per plain reading attribute, and each backend part naming something real
in a source the table was not written from (pynvml, the virtual GPU's C header, the DCGM fake written
from dcgm_fields.h)."""

from __future__ import annotations

import re

import pynvml
import pytest

from gpu_triage.exporter.backends.dcgm import fields as fid
from gpu_triage.exporter.backends.field_table import FIELDS, FieldSpec, Getter, NvmlField
from gpu_triage.exporter.backends.readings import READING_OF, Activity, check_field_table
from gpu_triage.exporter.metrics import families as f
from tests.conftest import REPO
from tests.dcgm_fake_fields import GPU_FIELDS
from tests.vgpu.test_vgpu_abi import ENTRY_POINTS

READINGS = (*READING_OF.values(), Activity)


def test_the_table_and_the_readings_agree() -> None:
    assert check_field_table(FIELDS, READINGS) == []


def _without(reading: str, attr: str) -> tuple[FieldSpec, ...]:
    return tuple(s for s in FIELDS if (s.reading, s.attr) != (reading, attr))


@pytest.mark.parametrize(
    ("specs", "problem"),
    [
        ((*FIELDS, FIELDS[0]), "declared twice"),
        (_without("Power", "limit_watts"), "Power.limit_watts: a number with no spec"),
        ((*FIELDS, FieldSpec("Power", "peak_watts", f.POWER, float)), "no such attribute"),
        ((*FIELDS, FieldSpec("Gauge", "x", f.POWER, float)), "no such reading"),
        (
            (*_without("Power", "limit_watts"), FieldSpec("Power", "limit_watts", f.POWER_LIMIT, int)),
            "a int here, `float | None` on the reading",
        ),
        (
            (*_without("Ecc", "enabled"), FieldSpec("Ecc", "enabled", f.ECC_ERRORS, bool)),
            "0 label values for nvidia_gpu_ecc_errors",
        ),
    ],
)
def test_each_disagreement_is_named(specs: tuple[FieldSpec, ...], problem: str) -> None:
    problems = check_field_table(specs, READINGS)
    assert any(problem in p for p in problems), problems


def _c_members() -> dict[str, str]:
    """Every member of the record's structs, name -> C type, from the headers the library is built from."""
    text = (REPO / "vgpu/state.h").read_text() + (REPO / "vgpu/scalars.h").read_text()
    return {name: ctype for ctype, name in re.findall(r"\b(u?int\d+_t|char|double) (\w+)(?:\[[^\]]*\])*;", text)}


def test_every_virtual_gpu_record_is_a_member_of_that_type() -> None:
    members = _c_members()
    for s in FIELDS:
        if s.vgpu is not None:
            assert members.get(s.vgpu.record) == s.vgpu.ctype, (s.reading, s.attr, s.vgpu)


def test_every_nvml_part_names_what_pynvml_has_and_the_virtual_gpu_serves() -> None:
    for s in FIELDS:
        if isinstance(s.nvml, Getter):
            assert callable(getattr(pynvml, s.nvml.function)), s
            assert s.nvml.function in ENTRY_POINTS, f"the virtual GPU does not export {s.nvml.function}"
            assert s.vgpu is not None, f"{s.attr}: read from NVML but no virtual GPU record answers it"
        elif isinstance(s.nvml, NvmlField):
            assert isinstance(getattr(pynvml, s.nvml.field), int), s
    names = [s.nvml.query for s in FIELDS if s.nvml is not None]
    assert len(names) == len(set(names)), "two fields would fail under one name"


def test_every_dcgm_part_is_a_field_of_that_collector_and_watched() -> None:
    collector = {cls.__name__: cls.collector for cls in READING_OF.values()}
    for s in FIELDS:
        if s.dcgm is not None:
            assert s.dcgm.field in fid.DEVICE, s
            _, fake_collector, _ = GPU_FIELDS[s.dcgm.field]
            assert fake_collector == collector[s.reading], (s.attr, s.dcgm.field)


def test_the_dcgm_parts_say_what_the_dcgm_exporter_mapping_says() -> None:
    """docs/dcgm-exporter.md was written from dcgm-exporter's counters and DCGM's documented units: where it
    maps a field the table reads, it names the same family and the same factor."""
    rows = {
        m[1]: m[2]
        for m in re.finditer(r"^\| `DCGM_FI_DEV_(\w+)`[^|]*\|(.*)$", (REPO / "docs/dcgm-exporter.md").read_text(), re.M)
    }
    checked = 0
    for s in FIELDS:
        if s.dcgm is None or s.dcgm.name not in rows:
            continue
        row = rows[s.dcgm.name]
        assert f"`{s.family.name}" in row, (s.dcgm.name, row)
        factor = re.search(r"\u00d7 ([0-9.e]+)", row)  # the multiplication sign
        assert factor and float(factor[1]) == s.dcgm.scale, (s.dcgm.name, row)
        checked += 1
    assert checked >= 10  # the mapping covers most of them
