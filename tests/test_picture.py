"""The memory picture (kvreport.picture): per device what it had, what the engine placed there and the request
that failed, from real cases; its text bars in ``kvreport analyze`` and in the GitHub issue body."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from markdown_it import MarkdownIt

from kvreport.analyze import analyze, analyze_text
from kvreport.cli import main
from kvreport.logs import parse_log
from kvreport.markdown import issue_body
from kvreport.picture import bar_parts, home_device, memory_picture, placed_memory, text_bars
from kvreport.render import render_text
from tests.helpers import minimal_bundle
from tests.paths import CASE_DIR, case_dirs

TWO_GPUS = CASE_DIR / "pub-021-koboldcpp-cuda-2gpu-150k-ctx-compute-buffer"
ELEVEN_GPUS = CASE_DIR / "pub-018-ikllama-cuda-280gb-compute-buffer-pipeline"
CPU_CASE = CASE_DIR / "loc-17-fail-huge-ctx-verbose"
_KV_LINE = re.compile(r"\s(\w+) KV buffer size =\s*([\d.]+) MiB")


def _picture(case, **sections):
    bundle = minimal_bundle((case / "log.txt").read_text(errors="replace"), **sections)
    return memory_picture(bundle, analyze(bundle)), bundle


def _by_device(picture):
    return {d["device"]: d for d in picture["devices"]}


def _kinds(entry):
    return {s["kind"]: s["mib"] for s in entry["segments"]}


def test_two_gpus_show_the_kv_each_one_got_and_the_request_on_the_failing_one():
    pic, _ = _picture(TWO_GPUS)
    printed = {dev: float(mib) for dev, mib in _KV_LINE.findall((TWO_GPUS / "log.txt").read_text())}
    assert printed == {"CUDA0": 9979.0, "CUDA1": 13501.0}
    devs = _by_device(pic)
    assert list(devs) == ["CUDA0", "CUDA1"]
    for name, mib in printed.items():
        assert _kinds(devs[name]) == {"kv": mib}
    assert devs["CUDA0"]["failing"] and not devs["CUDA1"]["failing"]
    assert devs["CUDA0"]["request"] == {"mib": pytest.approx(12710.31), "label": "compute buffer"}
    assert devs["CUDA1"]["request"] is None
    # the log gives no device size: nothing is invented
    assert all(d["total_mib"] is None and d["free_mib"] is None and d["short_mib"] is None for d in devs.values())
    # one scale for both GPUs, so that their bars compare: CUDA0's stack (KV + request) is the longest
    assert devs["CUDA0"]["scale_mib"] == devs["CUDA1"]["scale_mib"] == pytest.approx(9979.0 + 12710.31)


def test_eleven_gpus_in_device_order_with_the_host_buffer_on_cpu():
    pic, _ = _picture(ELEVEN_GPUS)
    devs = _by_device(pic)
    assert list(devs) == [f"CUDA{i}" for i in range(11)] + ["CPU"]
    printed = {dev: float(mib) for dev, mib in _KV_LINE.findall((ELEVEN_GPUS / "log.txt").read_text())}
    assert {d: _kinds(e).get("kv") for d, e in devs.items() if d != "CPU"} == printed
    assert _kinds(devs["CPU"]) == {"other": 0.99}  # "CUDA_Host output buffer size = 0.99 MiB" is host RAM
    assert devs["CUDA0"]["request"]["mib"] == pytest.approx(279356.51)
    assert devs["CPU"]["scale_mib"] != devs["CUDA0"]["scale_mib"]  # host RAM has its own scale


def test_cpu_case_has_the_size_the_log_printed_and_the_shortfall():
    pic, _ = _picture(CPU_CASE)
    (cpu,) = pic["devices"]
    log = (CPU_CASE / "log.txt").read_text()
    assert "CPU     : AMD EPYC (24105 MiB, 24105 MiB free)" in log
    assert (cpu["device"], cpu["name"], cpu["total_mib"], cpu["free_mib"], cpu["free_source"]) == \
        ("CPU", "AMD EPYC", 24105.0, 24105.0, "log")
    # the real attempt's buffers only: the auto-fit dry run (0.00 MiB lines, a 160.64 MiB compute buffer) is left out
    assert "CPU_Mapped model buffer size =    34.42 MiB" in log and "CPU compute buffer size =   160.64 MiB" in log
    assert _kinds(cpu) == {"weights": 34.42}
    assert cpu["request"] == {"mib": 65536.0, "label": "KV cache"}
    assert cpu["in_use_mib"] == 0.0 and cpu["capacity_mib"] == 24105.0
    assert cpu["room_mib"] == pytest.approx(24105.0 - 34.42)
    assert cpu["short_mib"] == pytest.approx(65536.0 - (24105.0 - 34.42))
    assert cpu["over_mib"] == pytest.approx(cpu["short_mib"])
    parts = bar_parts(cpu)
    assert [p["kind"] for p in parts] == ["weights", "request"]  # nothing left free


def test_free_memory_measured_before_launch_and_probed_sizes_fill_what_the_log_lacks():
    before = [{"device": "CUDA0", "name": "NVIDIA GeForce RTX 4090", "backend": "cuda", "free_mib": 20000.0,
               "total_mib": 24564.0, "source": "nvml"}]
    probed = [{"backend": "cuda", "index": 1, "name": "NVIDIA GeForce RTX 4090", "total_mib": 24564.0,
               "free_mib": 24000.0, "source": "nvml"}]
    pic, _ = _picture(TWO_GPUS, memory_before_launch=before, devices=probed)
    devs = _by_device(pic)
    cuda0, cuda1 = devs["CUDA0"], devs["CUDA1"]
    assert (cuda0["total_mib"], cuda0["free_mib"], cuda0["free_source"]) == (24564.0, 20000.0, "before_launch")
    assert cuda0["in_use_mib"] == 4564.0  # held by others before the engine started
    assert cuda0["room_mib"] == 20000.0 - 9979.0
    assert cuda0["short_mib"] == pytest.approx(12710.31 - (20000.0 - 9979.0))
    assert cuda0["over_mib"] == pytest.approx(cuda0["short_mib"])
    # a probe taken when the bundle was collected (after the crash) gives the size, never the free memory
    assert (cuda1["total_mib"], cuda1["total_source"], cuda1["free_mib"]) == (24564.0, "probe", None)
    assert [p["kind"] for p in bar_parts(cuda1)] == ["kv", "rest"]
    bars = "\n".join(text_bars(pic))
    assert re.search(r"CUDA0 \[u+K+X+\]X+ <- failed", bars), bars  # the request runs past the device's size
    assert re.search(r"CUDA1 \[K+-+\]", bars), bars


def test_only_the_last_load_counts_and_host_buffer_types_are_host_ram():
    log = "\n".join([
        "load_tensors:   CPU_Mapped model buffer size =  4000.00 MiB",
        "load_tensors:        CUDA0 model buffer size =  9000.00 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =  2048.00 MiB",
        # the same program loads again (a server reloading the model): the first load is gone
        "load_tensors:   CPU_Mapped model buffer size =   500.00 MiB",
        "load_tensors:   CPU_REPACK model buffer size =   100.00 MiB",
        "load_tensors:        CUDA0 model buffer size =  8000.00 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB",
        "llama_context:  CUDA_Host  output buffer size =     0.50 MiB",
        "sched_reserve:      CUDA0 compute buffer size =   300.00 MiB",
        "sched_reserve:  CUDA_Host compute buffer size =    20.00 MiB",
    ])
    assert placed_memory(parse_log(log.splitlines())) == {
        "CPU": {"weights": 600.0, "other": 0.5, "compute": 20.0},
        "CUDA0": {"weights": 8000.0, "kv": 1024.0, "compute": 300.0},
    }
    assert [home_device(n) for n in ("CUDA_Host", "CPU_REPACK", "MTL0_Mapped", "Metal_Mapped", "ROCm1", "AMX")] == \
        ["CPU", "CPU", "MTL0", "Metal", "ROCm1", "CPU"]


def test_ollama_memory_layout_lines_place_the_memory_when_llamacpp_lines_are_absent():
    # Ollama's own layout lines (ml backend, 0.12+): one per device and kind, then the total
    log = "\n".join([
        'time=2025-10-01T10:00:00.000Z level=INFO source=types.go:42 msg="inference compute" id=GPU-1 library=CUDA '
        'name=CUDA0 description="NVIDIA GeForce RTX 3060" total="12.0 GiB" available="11.0 GiB"',
        'time=2025-10-01T10:00:01.000Z level=INFO source=device.go:212 msg="model weights" device=CUDA0 size="7.5 GiB"',
        'time=2025-10-01T10:00:01.000Z level=INFO source=device.go:217 msg="model weights" device=CPU size="300.0 MiB"',
        'time=2025-10-01T10:00:01.000Z level=INFO source=device.go:223 msg="kv cache" device=CUDA0 size="4.0 GiB"',
        'time=2025-10-01T10:00:01.000Z level=INFO source=device.go:234 msg="compute graph" device=CUDA0 size="1.0 GiB"',
        'time=2025-10-01T10:00:01.000Z level=INFO source=device.go:244 msg="total memory" size="12.8 GiB"',
        'time=2025-10-01T10:00:01.000Z level=ERROR source=server.go:1 msg="memory layout cannot be allocated"',
    ])
    facts = parse_log(log.splitlines())
    pic = memory_picture(None, analyze_text(log), facts)
    devs = _by_device(pic)
    assert _kinds(devs["CUDA0"]) == {"weights": 7680.0, "kv": 4096.0, "compute": 1024.0}
    assert _kinds(devs["CPU"]) == {"weights": 300.0}
    gpu = devs["CUDA0"]
    assert (gpu["total_mib"], gpu["free_mib"], gpu["name"]) == (12288.0, 11264.0, "NVIDIA GeForce RTX 3060")
    # what Ollama wanted to place does not fit: the stack runs past the card's size
    assert gpu["over_mib"] == pytest.approx(1024.0 + 7680.0 + 4096.0 + 1024.0 - 12288.0)


@pytest.mark.parametrize("case", case_dirs(), ids=[c.name for c in case_dirs()])
def test_every_real_case_draws_its_failed_request_once(case):
    text = (case / "log.txt").read_text(errors="replace")
    facts = parse_log(text.splitlines())
    d = analyze_text(text)
    pic = memory_picture(None, d, facts)
    req = d["failure"]["requested_mib"]
    with_request = [x for x in pic["devices"] if x["request"]]
    if req is None or d["failure"]["phase"] == "none":
        assert with_request == []
    else:
        assert len(with_request) == 1 and with_request[0]["request"]["mib"] == req
    for dev in pic["devices"]:
        assert all(s["mib"] > 0 for s in dev["segments"])
        assert dev["placed_mib"] == pytest.approx(sum(s["mib"] for s in dev["segments"]), abs=0.02)
        if dev["short_mib"] is not None:
            assert dev["short_mib"] > 0 and dev["request"]
    lines = text_bars(pic)
    assert (lines == []) == (not any(bar_parts(x) for x in pic["devices"]))


def test_render_text_shows_the_bars_for_a_bundle_and_for_raw_log_facts():
    pic_bundle = minimal_bundle((CPU_CASE / "log.txt").read_text())
    d = analyze(pic_bundle)
    out = render_text(d, pic_bundle)
    assert "  memory:   MiB per device: W weights  X failed request  (] marks the device's size)" in out
    bar = next(x for x in out.splitlines() if x.startswith("    CPU ["))
    assert bar.endswith(" <- failed") and re.fullmatch(r"    CPU \[W+X+\]X+ <- failed", bar), bar
    # the size line falls where 24,105 MiB is on a bar of 34.42 + 65,536 MiB (48 cells)
    assert bar.index("]") - bar.index("[") - 1 == round(24105 / (65536 + 34.42) * 48)
    assert "total 24,105, free 24,105 at load; weights 34.42; failed: KV cache 65,536, 41,465 MiB more than was left" in out
    assert render_text(d) == render_text(d, None, None)  # no bundle and no facts: no picture
    assert "memory:" not in render_text(d)


def test_kvreport_analyze_prints_the_bars_of_a_multi_gpu_log():
    result = CliRunner().invoke(main, ["analyze", str(TWO_GPUS / "log.txt")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    i = next(n for n, x in enumerate(lines) if x.startswith("  memory:"))
    assert re.fullmatch(r"    CUDA0 \[K+X+ <- failed", lines[i + 1])
    assert lines[i + 2].strip() == "size not in the log; KV cache 9,979; failed: compute buffer 12,710"
    assert re.fullmatch(r"    CUDA1 \[K+", lines[i + 3])
    # one scale: CUDA1's 13,501 MiB bar is shorter than CUDA0's 9,979 + 12,710 MiB one
    assert len(lines[i + 3]) < len(lines[i + 1].replace(" <- failed", ""))


def _fences(body: str) -> list:
    return [t for t in MarkdownIt("commonmark").parse(body) if t.type == "fence"]


def test_issue_body_holds_the_bars_in_a_code_block():
    bundle = minimal_bundle((TWO_GPUS / "log.txt").read_text())
    body = issue_body(bundle, analyze(bundle))
    assert "### Memory per device\n\n```\nMiB per device: K KV cache  X failed request\n" in body
    block = next(t.content for t in _fences(body) if t.content.startswith("MiB per device"))
    assert "CUDA0 [K" in block and "<- failed" in block and "CUDA1 [K" in block
    assert body.index("### Memory per device") < body.index("### Suggested fixes")


def test_a_hostile_device_name_stays_inside_the_bars_code_block():
    evil = "`````` ### Maintainer note <img src=x> [a](https://evil.example)"
    log = (f'time=2025-10-01T10:00:01.000Z level=INFO source=device.go:223 msg="kv cache" device="{evil}" '
           'size="4.0 GiB"\n'
           'time=2025-10-01T10:00:01.000Z level=ERROR source=server.go:1 msg="memory layout cannot be allocated"')
    bundle = minimal_bundle(log)
    body = issue_body(bundle, analyze(bundle))
    assert "`````` ###" in body  # the name (cut to 24 characters) is in the bars
    block = next(t for t in _fences(body) if t.content.startswith("MiB per device"))
    assert "``````" in block.content and len(block.markup) > 6
    tokens = MarkdownIt("commonmark").parse(body)
    assert not [t for i, t in enumerate(tokens) if t.type == "heading_open" and "Maintainer" in tokens[i + 1].content]
    assert not [t for t in tokens if t.type in ("html_block", "html_inline") and "<img" in t.content]


def test_a_request_that_fit_the_memory_left_is_drawn_inside_the_device():
    case = CASE_DIR / "loc-23-fail-ulimit-compute-after-kv-800000"
    pic, _ = _picture(case)
    (cpu,) = pic["devices"]
    assert _kinds(cpu) == {"weights": 34.2, "kv": 512.0}
    assert cpu["request"] == {"mib": 78.02, "label": "compute buffer"}
    assert cpu["short_mib"] is None and cpu["over_mib"] is None
    assert cpu["room_mib"] == pytest.approx(24105.0 - 34.2 - 512.0)
    assert [p["kind"] for p in bar_parts(cpu)] == ["weights", "kv", "request", "free"]
    bars = text_bars(pic)
    assert re.fullmatch(r"CPU \[WK+X\.+\] <- failed", bars[1]), bars
    assert bars[2].endswith("failed: compute buffer 78.02, fit the 23,559 MiB left yet failed")
