"""What the NVML backend keeps between reads (nvml/kept.py), on the virtual GPU: a change there shows when the
rule says, and never a kept answer where the driver would now say something else."""

from __future__ import annotations

from typing import Any

from tests.vgpu.conftest import Worker, vs

KEEP_SECONDS = 60.0  # nvml/kept.py: the most a kept answer is used for


def max_mhz(nvml: Worker, gpu: int) -> dict[str, Any]:
    """The clocks read's maximum clocks in MHz, and its failed fields; or that the GPU is lost."""
    read = nvml.run(f"result = ops.read({gpu}, 'clocks')")
    if "lost" in read:
        return {"lost": True}
    return {"max": {d: hz / 1e6 for d, hz in read["reading"]["max_hz"].items()}, "failed": read["failed"]}


def h100_max(sm: int = 1980) -> dict[str, float]:
    return {"sm": sm, "memory": 2619, "graphics": 1980, "video": 1545}


def test_a_changed_maximum_clock_shows_once_the_kept_one_is_old(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    nvml.run("ops.start()")
    assert max_mhz(nvml, 0) == {"max": h100_max(), "failed": []}
    node[0].max_clocks_mhz = [1980, 1800, 2619, 1545]  # by nvmlClockType_t: graphics, SM, memory, video
    state.write(node)
    nvml.run(f"ops.advance({KEEP_SECONDS - 1})")
    assert max_mhz(nvml, 0)["max"] == h100_max()  # kept
    assert max_mhz(nvml, 1)["max"] == h100_max()  # another GPU's own, read at its first read
    nvml.run("ops.advance(1)")
    assert max_mhz(nvml, 0)["max"] == h100_max(sm=1800)


def test_a_current_clock_above_the_kept_maximum_has_the_maximum_asked_again(
    nvml: Worker, state: vs.StateWriter
) -> None:
    node = vs.h100_node()
    nvml.run("ops.start()")
    assert max_mhz(nvml, 2)["max"] == h100_max()
    node[2].max_clocks_mhz = [2100, 2100, 2619, 1545]
    node[2].clocks_mhz = [2100, 2050, 2619, 765]  # the SM clock now above the kept maximum
    state.write(node)
    assert max_mhz(nvml, 2)["max"] == {"sm": 2100, "memory": 2619, "graphics": 2100, "video": 1545}


def test_clocks_that_stop_answering_take_the_kept_maximum_with_them(nvml: Worker, state: vs.StateWriter) -> None:
    """A GPU whose clock calls now answer NOT_SUPPORTED has no maximum either: not the one kept from before."""
    node = vs.h100_node()
    nvml.run("ops.start()")
    assert max_mhz(nvml, 3)["max"] == h100_max()
    node[3].unsupported = node[3].unsupported | {vs.Query.CLOCKS}
    state.write(node)
    assert max_mhz(nvml, 3) == {"max": {}, "failed": []}
    node[3].unsupported = node[3].unsupported - {vs.Query.CLOCKS}
    node[3].max_clocks_mhz = [1980, 1700, 2619, 1545]
    state.write(node)
    assert max_mhz(nvml, 3)["max"] == h100_max(sm=1700)


def test_a_lost_gpu_or_a_reset_has_its_maximum_clocks_asked_again(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    nvml.run("ops.start()")
    assert max_mhz(nvml, 4)["max"] == h100_max()
    node[4].lost = True  # off the bus, then back with other maxima
    state.write(node)
    assert max_mhz(nvml, 4) == {"lost": True}
    node[4].lost = False
    node[4].max_clocks_mhz = [1980, 1600, 2619, 1545]
    state.write(node)
    assert max_mhz(nvml, 4)["max"] == h100_max(sm=1600)
    # A reset: the handle stops naming the GPU, and the slow poll looks it up again.
    node[4].invalid_handle = True
    state.write(node)
    assert max_mhz(nvml, 4) == {"lost": True}
    node[4].invalid_handle = False
    node[4].max_clocks_mhz = [1980, 1500, 2619, 1545]
    state.write(node)
    assert nvml.run("result = ops.read(4, 'inventory')")["failed"] == []
    assert max_mhz(nvml, 4)["max"] == h100_max(sm=1500)


def limits(nvml: Worker, gpu: int) -> dict[str, Any]:
    """The PCIe read's link generation and width, current and maximum, and the power read's limits; or lost."""
    pcie, power = (nvml.run(f"result = ops.read({gpu}, '{collector}')") for collector in ("pcie", "power"))
    if "lost" in pcie or "lost" in power:
        return {"lost": True}
    names = ("link_generation", "max_link_generation", "link_width", "max_link_width")
    return {
        **{name: pcie["reading"][name] for name in names},
        "limit_watts": power["reading"]["limit_watts"],
        "default_limit_watts": power["reading"]["default_limit_watts"],
        "failed": pcie["failed"] + power["failed"],
    }


def h100_limits(**changed: Any) -> dict[str, Any]:
    return {
        "link_generation": 5,
        "max_link_generation": 5,
        "link_width": 16,
        "max_link_width": 16,
        "limit_watts": 700.0,
        "default_limit_watts": 700.0,
        "failed": [],
    } | changed


def test_changed_board_limits_show_once_the_kept_ones_are_old(nvml: Worker, state: vs.StateWriter) -> None:
    """The maximum PCIe link and the default power limit are kept (nvml.h: fixed for the device and its slot, and
    the limit it boots with), as the maximum clocks are."""
    node = vs.h100_node()
    nvml.run("ops.start()")
    assert limits(nvml, 0) == h100_limits()
    node[0].pcie_link_gen, node[0].pcie_link_gen_max = 4, 4
    node[0].pcie_link_width, node[0].pcie_link_width_max = 8, 8
    node[0].power_limit_default_mw = 650_000
    state.write(node)
    nvml.run(f"ops.advance({KEEP_SECONDS - 1})")
    # kept, the current values read afresh
    assert limits(nvml, 0) == h100_limits(link_generation=4, link_width=8)
    assert limits(nvml, 1) == h100_limits()  # another GPU's own, read at its first read
    nvml.run("ops.advance(1)")
    new = {"link_generation": 4, "max_link_generation": 4, "link_width": 8, "max_link_width": 8}
    assert limits(nvml, 0) == h100_limits(**new, default_limit_watts=650.0)


def test_a_current_link_above_the_kept_maximum_has_the_maximum_asked_again(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    node[2].pcie_link_gen = node[2].pcie_link_gen_max = 4
    node[2].pcie_link_width = node[2].pcie_link_width_max = 8
    state.write(node)
    nvml.run("ops.start()")
    assert limits(nvml, 2) == h100_limits(link_generation=4, max_link_generation=4, link_width=8, max_link_width=8)
    node[2].pcie_link_gen = node[2].pcie_link_gen_max = 5  # the generation now above the kept maximum
    node[2].pcie_link_width_max = 16
    state.write(node)
    assert limits(nvml, 2) == h100_limits(link_width=8)  # the maxima asked again, both


def test_limits_whose_witnesses_stop_answering_are_not_kept(nvml: Worker, state: vs.StateWriter) -> None:
    """A GPU whose PCIe link or power limit calls now answer NOT_SUPPORTED has no maximum or default either: not
    the one kept from before; once they answer again, the limits they answer with."""
    node = vs.h100_node()
    nvml.run("ops.start()")
    assert limits(nvml, 3) == h100_limits()
    node[3].unsupported = node[3].unsupported | {vs.Query.PCIE_LINK, vs.Query.POWER_LIMIT}
    state.write(node)
    none = dict.fromkeys(h100_limits().keys() - {"failed"})
    assert limits(nvml, 3) == h100_limits(**none)
    node[3].unsupported = node[3].unsupported - {vs.Query.PCIE_LINK, vs.Query.POWER_LIMIT}
    node[3].pcie_link_width, node[3].pcie_link_width_max = 8, 8
    node[3].power_limit_default_mw = 600_000
    state.write(node)
    assert limits(nvml, 3) == h100_limits(link_width=8, max_link_width=8, default_limit_watts=600.0)


def test_a_lost_gpu_or_a_reset_has_its_board_limits_asked_again(nvml: Worker, state: vs.StateWriter) -> None:
    node = vs.h100_node()
    nvml.run("ops.start()")
    assert limits(nvml, 4) == h100_limits()
    node[4].lost = True  # off the bus, then back in another slot
    state.write(node)
    assert limits(nvml, 4) == {"lost": True}
    node[4].lost = False
    node[4].pcie_link_gen_max, node[4].power_limit_default_mw = 6, 650_000
    state.write(node)
    assert limits(nvml, 4) == h100_limits(max_link_generation=6, default_limit_watts=650.0)
    # A reset: the handle stops naming the GPU, and the slow poll looks it up again.
    node[4].invalid_handle = True
    state.write(node)
    assert limits(nvml, 4) == {"lost": True}
    node[4].invalid_handle = False
    node[4].pcie_link_width_max, node[4].power_limit_default_mw = 32, 600_000
    state.write(node)
    assert nvml.run("result = ops.read(4, 'inventory')")["failed"] == []
    assert limits(nvml, 4) == h100_limits(max_link_generation=6, max_link_width=32, default_limit_watts=600.0)
