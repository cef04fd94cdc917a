"""Probes against fake tools (tests/fakebin) that print real-format captures (tests/data/probes).

PATH is set to tests/fakebin alone, and NVML is faked, so nothing installed here is seen.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from kvreport import probes
from kvreport.probes import _util, amd, apple, intel, llamacpp, nvidia_smi, nvml, ollama, pyengines, vulkan

ROOT = Path(__file__).resolve().parents[1]
FAKEBIN = ROOT / "tests" / "fakebin"
DATA = ROOT / "tests" / "data" / "probes"

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the fake tools are POSIX sh scripts")


@pytest.fixture
def fakepath(monkeypatch, tmp_path):
    """Only the fake tools on PATH, no FAKE_* behaviour set, NVML absent, cwd elsewhere."""
    monkeypatch.setenv("PATH", str(FAKEBIN))
    for key in list(os.environ):
        if key.startswith("FAKE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OLLAMA_HOST", "203.0.113.9:11434")  # not local: never contacted

    def no_nvml():
        raise _util.Absent("NVML Shared Library Not Found")

    monkeypatch.setattr(nvml, "_load", no_nvml)
    monkeypatch.chdir(tmp_path)
    return FAKEBIN


# --- safe lookup ---------------------------------------------------------------------------------


def test_which_ignores_current_directory(monkeypatch, tmp_path):
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho pwned\n")
    tool.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.pathsep.join([".", "", "relative/bin"]))
    assert _util.safe_path() == ""
    assert _util.which("nvidia-smi") is None
    assert _util.which("./nvidia-smi") is None
    with pytest.raises(_util.Absent):
        _util.run_named("nvidia-smi", [], 1.0)


def test_run_tool_timeout_kills(fakepath, monkeypatch):
    monkeypatch.setenv("FAKE_VULKANINFO", "hang")
    start = time.monotonic()
    with pytest.raises(_util.ProbeFailed, match="timed out after 0.3 s"):
        _util.run_named("vulkaninfo", [], 0.3)
    assert time.monotonic() - start < 2.0


# --- NVIDIA --------------------------------------------------------------------------------------


def test_nvidia_smi_parse(fakepath):
    result = nvidia_smi.probe(2.0)
    d0, d1 = result["devices"]
    assert d0["name"] == "NVIDIA GeForce RTX 3090" and d0["total_mib"] == 24576 and d0["free_mib"] == 23131
    assert d0["compute_capability"] == "8.6" and d0["driver_version"] == "550.54.14"
    assert d0["pci_bus_id"] == "00000000:01:00.0" and d0["uuid"].startswith("GPU-")
    assert d1["index"] == 1 and d1["used_mib"] == 9 and d1["source"] == "nvidia-smi"


def test_nvidia_smi_old_driver_retries_without_compute_cap(fakepath, monkeypatch):
    monkeypatch.setenv("FAKE_NVIDIA_SMI", "old")
    (dev,) = nvidia_smi.probe(2.0)["devices"]
    assert dev["name"] == "Tesla M40 24GB" and dev["free_mib"] == 169 and dev["compute_capability"] is None


@pytest.mark.parametrize("mode, reason", [("nodriver", "couldn't communicate"), ("garbage", "unexpected"),
                                          ("fail", "exit 3")])
def test_nvidia_smi_failures(fakepath, monkeypatch, mode, reason):
    monkeypatch.setenv("FAKE_NVIDIA_SMI", mode)
    with pytest.raises(_util.ProbeFailed, match=reason):
        nvidia_smi.probe(2.0)


class _FakeNVML:
    """The pynvml calls the probe makes, answering like a 1-GPU machine (bytes, as NVML does)."""

    class Mem:
        total, used, free = 25769803776, 1237319680, 24532484096

    class Pci:
        busId = b"00000000:01:00.0"

    class Proc:
        def __init__(self, pid, used):
            self.pid, self.usedGpuMemory = pid, used

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "550.54.14"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("h", i)

    def nvmlDeviceGetMemoryInfo(self, h):
        return self.Mem()

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA GeForce RTX 3090"

    def nvmlDeviceGetUUID(self, h):
        return "GPU-5f2b8c1e-0d4a-7e63-91b2-4c8d2a6f3e10"

    def nvmlDeviceGetPciInfo(self, h):
        return self.Pci()

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (8, 6)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [self.Proc(os.getpid(), 1073741824), self.Proc(999999999, None)]


def test_nvml_fake_module():
    result = nvml.probe(1.0, nvml_module=_FakeNVML())
    (dev,) = result["devices"]
    assert dev["total_mib"] == 24576.0 and dev["free_mib"] == 23396.0 and dev["used_mib"] == 1180.0
    assert dev["cuda_driver_version"] == "12.4" and dev["compute_capability"] == "8.6"
    assert dev["pci_bus_id"] == "00000000:01:00.0" and dev["source"] == "nvml"
    assert dev["processes"][0] == {"name": __import__("psutil").Process().name(), "used_mib": 1024.0}
    assert dev["processes"][1]["used_mib"] is None


def test_nvml_library_missing_is_absent():
    class Missing(Exception):
        pass

    Missing.__name__ = "NVMLError_LibraryNotFound"

    class NoLib(_FakeNVML):
        def nvmlInit(self):
            raise Missing("NVML Shared Library Not Found")

    with pytest.raises(_util.Absent):
        nvml.probe(1.0, nvml_module=NoLib())


# --- AMD, Intel, Vulkan, Apple -------------------------------------------------------------------


def test_rocm_smi(fakepath):
    d0, d1 = amd.probe(2.0)["devices"]
    assert d0["name"] == "Radeon RX 7900 XTX" and d0["gfx_version"] == "gfx1100"
    assert d0["total_mib"] == 24560.0 and d1["free_mib"] == round((25753026560 - 15216095232) / 2**20, 2)


def test_amd_smi_when_rocm_smi_fails(fakepath, monkeypatch):
    monkeypatch.setenv("FAKE_ROCM_SMI", "fail")
    (dev,) = amd.probe(2.0)["devices"]
    assert dev["source"] == "amd-smi" and dev["total_mib"] == 196592.0 and dev["free_mib"] == 196309.0


def test_intel(fakepath):
    devs = intel.probe(2.0)["devices"]
    assert devs[0] == {"backend": "sycl", "index": 0, "name": "Intel(R) Data Center GPU Max 1100",
                       "total_mib": 49152.0, "free_mib": None, "pci_bus_id": "0000:29:00.0", "source": "xpu-smi"}
    names = [d["name"] for d in devs[1:]]
    assert "Intel(R) Arc(TM) A770 Graphics" in names


def test_sycl_ls_formats():
    new = intel.parse_sycl_ls((DATA / "sycl-ls.txt").read_text())
    assert [(d["sycl_backend"], d["index"], d["name"]) for d in new if d["sycl_backend"] == "level_zero"] == [
        ("level_zero", 0, "Intel(R) Arc(TM) A770 Graphics"), ("level_zero", 1, "Intel(R) Arc(TM) A770 Graphics")]
    old = intel.parse_sycl_ls((DATA / "sycl-ls-old.txt").read_text())
    assert [(d["sycl_backend"], d["name"]) for d in old] == [("level_zero", "Intel(R) Arc(TM) Graphics")]


def test_vulkaninfo(fakepath):
    (dev,) = vulkan.probe(2.0)["devices"]  # llvmpipe (a CPU) is left out
    assert dev["name"] == "NVIDIA GeForce RTX 2060" and dev["device_type"] == "discrete_gpu"
    assert dev["total_mib"] == 6144.0 and dev["free_mib"] == 5645.0
    assert dev["max_alloc_mib"] == 4094.0  # 0xffe00000 bytes


def test_vulkaninfo_older_and_summary_layouts():
    older = ("Device Properties and Extensions :\n==================================\nGPU0\n"
             "VkPhysicalDeviceProperties:\n===========================\n"
             "        apiVersion     = 0x402085  (1.2.133)\n        deviceType     = DISCRETE_GPU\n"
             "        deviceName     = GeForce GTX 1060 with Max-Q Design\n")
    (dev,) = vulkan.parse(older)
    assert dev["name"] == "GeForce GTX 1060 with Max-Q Design" and dev["device_type"] == "discrete_gpu"
    assert dev["total_mib"] is None and dev["max_alloc_mib"] is None
    summary = ("Devices:\n========\nGPU0:\n\tapiVersion         = 1.3.280\n"
               "\tdeviceType         = PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU\n"
               "\tdeviceName         = AMD Radeon Graphics (RADV VANGOGH)\n"
               "GPU1:\n\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU\n\tdeviceName         = llvmpipe\n")
    assert [d["name"] for d in vulkan.parse(summary)] == ["AMD Radeon Graphics (RADV VANGOGH)"]


def test_apple(fakepath):
    result = apple.probe(2.0, platform="darwin")
    (dev,) = result["devices"]
    assert dev["name"] == "Apple M2 Max" and dev["gpu_cores"] == 38 and dev["backend"] == "metal"
    assert dev["total_mib"] == 65536.0 and dev["unified_memory"] is True
    assert result["host"]["unified_memory_mib"] == 65536.0
    with pytest.raises(_util.Absent):
        apple.probe(2.0, platform="linux")


# --- engines -------------------------------------------------------------------------------------


def test_llamacpp_version_and_devices(fakepath):
    eng = llamacpp.probe(2.0, program="./build/bin/llama-server")["engine"]
    assert eng["build_number"] == 8284 and eng["commit"] == "00de61534"
    assert eng["compiler"] == "GNU 13.3.0" and eng["target"] == "Linux x86_64"
    assert eng["binary"] == str(FAKEBIN / "llama-server")
    assert eng["list_devices"] == [
        {"name": "CUDA0", "description": "NVIDIA GeForce RTX 4060 Ti", "total_mib": 16379.0, "free_mib": 14900.0,
         "compute_capability": "8.9"},
        {"name": "CUDA1", "description": "NVIDIA GeForce RTX 3090", "total_mib": 24126.0, "free_mib": 23863.0,
         "compute_capability": "8.6"}]


def test_llamacpp_semver_build_and_cpu_only(fakepath, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA", "semver")
    eng = llamacpp.probe(2.0, program="llama-cli")["engine"]
    assert eng["version"] == "0.6.0-dev" and eng["build_number"] is None and eng["commit"] is None
    assert eng["compiler"] == "GNU 12.2.0" and eng["list_devices"] == []


def test_llamacpp_old_compiler_string():
    facts = llamacpp.parse_version((DATA / "llama-server-version-b3184.txt").read_text())
    assert facts == {"version": "b3184-9c77ec1d", "build_number": 3184, "commit": "9c77ec1d",
                     "compiler": "cc (Ubuntu 13.2.0-23ubuntu4) 13.2.0", "target": "x86_64-linux-gnu"}


def test_llamacpp_absent_and_garbage(fakepath, monkeypatch):
    with pytest.raises(_util.Absent):
        llamacpp.probe(2.0, program="llama-nonexistent")
    with pytest.raises(_util.Absent):
        llamacpp.probe(2.0, program=None)
    monkeypatch.setenv("FAKE_LLAMA", "garbage")
    with pytest.raises(_util.ProbeFailed, match="--version"):
        llamacpp.probe(2.0, program="llama-server")


def test_backend_of():
    assert [llamacpp.backend_of(n) for n in ("CUDA0", "ROCm1", "Vulkan0", "MTL0", "Metal", "SYCL0", "CPU")] == [
        "cuda", "rocm", "vulkan", "metal", "metal", "sycl", "cpu"]


class _OllamaHandler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = {"/api/version": {"version": "0.5.7"},
                "/api/ps": {"models": [{"name": "qwen2:72b", "model": "qwen2:72b", "size": 53687091200,
                                        "size_vram": 26843545600, "context_length": 8192}]}}.get(self.path)
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body or {}).encode())

    def log_message(self, *args):
        pass


def test_ollama_cli_and_local_api(fakepath, monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _OllamaHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{server.server_port}")
        facts = ollama.probe(2.0)["ollama"]
    finally:
        server.shutdown()
    assert facts["version"] == "0.5.7" and facts["server_version"] == "0.5.7"
    assert facts["loaded_models"] == [{"name": "qwen2:72b", "size_mib": 51200.0, "size_vram_mib": 25600.0,
                                       "context_length": 8192}]


def test_ollama_no_server(fakepath, monkeypatch):
    monkeypatch.setenv("FAKE_OLLAMA", "noserver")
    facts = ollama.probe(1.0)["ollama"]
    assert facts["version"] == "0.6.2" and facts["server_running"] is False


def test_ollama_base_url():
    assert ollama.base_url({}) == "http://127.0.0.1:11434"
    assert ollama.base_url({"OLLAMA_HOST": "0.0.0.0"}) == "http://127.0.0.1:11434"
    assert ollama.base_url({"OLLAMA_HOST": "http://localhost:8080"}) == "http://localhost:8080"
    assert ollama.base_url({"OLLAMA_HOST": "gpu-box.lan:11434"}) is None


def test_pyengines(monkeypatch):
    versions = {"vllm": "0.8.5", "torch": "2.6.0+cu124"}

    def fake_version(name):
        if name in versions:
            return versions[name]
        raise pyengines.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(pyengines.metadata, "version", fake_version)
    monkeypatch.setattr(pyengines, "_maybe_installed", lambda names: True)
    facts = pyengines.probe()["python_engines"]
    assert facts["vllm"] == "0.8.5" and facts["torch_cuda"] == "12.4"
    versions.clear()
    with pytest.raises(_util.Absent):
        pyengines.probe()


def test_pyengines_prefilter_reads_dist_info_names(tmp_path, monkeypatch):
    """The start-up shortcut: no engine's dist-info on sys.path is Absent; one is a maybe (metadata decides)."""
    (tmp_path / "requests-2.32.0.dist-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "missing")])
    assert pyengines._maybe_installed(pyengines.PACKAGES) is False
    with pytest.raises(_util.Absent):
        pyengines.probe()
    (tmp_path / "Flashinfer_Python-0.2.dist-info").mkdir()
    assert pyengines._maybe_installed(pyengines.PACKAGES) is True
    zipped = tmp_path / "deps.zip"
    zipped.write_bytes(b"PK")
    monkeypatch.setattr(sys, "path", [str(zipped)])
    assert pyengines._maybe_installed(("vllm",)) is True


def test_pyengines_asks_the_engines_interpreter(tmp_path):
    """A `vllm` console script in another environment: its shebang Python is asked (metadata only)."""
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nprint('vllm')\n")
    script.chmod(0o755)
    interp = pyengines.interpreter_of(str(script))
    assert interp == sys.executable
    assert pyengines.interpreter_of(sys.executable) == sys.executable
    assert pyengines.interpreter_of(str(tmp_path / "missing")) is None
    fake_python = tmp_path / "python3"
    fake_python.write_text('#!/bin/sh\nprintf \'{"python": "3.12.3", "vllm": "0.9.1", "torch": "2.7.0+cu128"}\\n\'\n')
    fake_python.chmod(0o755)
    facts = pyengines.probe(2.0, interpreter=str(fake_python))["python_engines"]
    assert facts == {"python": "3.12.3", "vllm": "0.9.1", "torch": "2.7.0+cu128", "interpreter": str(fake_python),
                     "torch_cuda": "12.8"}


# --- run_all -------------------------------------------------------------------------------------


def test_run_all_with_fake_tools(fakepath):
    result = probes.run_all(2.0, engine_program="llama-server", engine="llama.cpp")
    st = result["probes"]
    assert st["host"] == "ok" and st["nvml"] == "absent" and st["nvidia_smi"] == "ok"
    assert st["amd"] == st["intel"] == st["vulkan"] == st["llamacpp"] == "ok"
    assert st["apple"] == ("ok" if sys.platform == "darwin" else "absent")
    assert st["ollama"] == "absent"  # engine is llama.cpp
    backends = [d["backend"] for d in result["devices"]]
    assert backends.count("cuda") == 2 and backends.count("rocm") == 2 and "vulkan" in backends
    assert result["engine"]["build_number"] == 8284
    assert result["host"]["ram_total_mib"] > 0


def test_run_all_hanging_tool_times_out_rest_intact(fakepath, monkeypatch):
    monkeypatch.setenv("FAKE_VULKANINFO", "hang")
    monkeypatch.setenv("FAKE_ROCM_SMI", "garbage")
    monkeypatch.setenv("FAKE_AMD_SMI", "garbage")
    start = time.monotonic()
    result = probes.run_all(1.0, engine_program="llama-server")
    assert time.monotonic() - start < 4.0
    st = result["probes"]
    assert st["vulkan"].startswith("failed: ") and "timed out" in st["vulkan"]
    assert st["amd"].startswith("failed: ") and "JSON" in st["amd"]
    assert st["nvidia_smi"] == "ok" and st["host"] == "ok"
    assert any(d["source"] == "nvidia-smi" for d in result["devices"])


def test_run_all_nothing_installed(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("OLLAMA_HOST", "203.0.113.9:11434")
    monkeypatch.setattr(nvml, "_load", lambda: (_ for _ in ()).throw(_util.Absent("no nvml")))
    result = probes.run_all(1.0)
    assert result["devices"] == []
    assert all(v in ("ok", "absent") for v in result["probes"].values()), result["probes"]
    assert result["probes"]["llamacpp"] == "absent"


def test_run_all_never_raises_on_probe_bug(fakepath, monkeypatch):
    def boom(timeout=3.0):
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(vulkan, "probe", boom)
    result = probes.run_all(1.0)
    assert result["probes"]["vulkan"] == "failed: ZeroDivisionError: bug"


# --- parsers never raise on arbitrary text (only ProbeFailed, which run_all turns into a status) ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_junk = st.one_of(
    st.text(max_size=400),
    st.lists(st.sampled_from(["GPU0:", "\tdeviceName = X", "memoryHeaps[0]:", "\t\tsize   = 12",
                              "MEMORY_HEAP_DEVICE_LOCAL_BIT", "budget = 0x10", "maxMemoryAllocationSize = 0xzz",
                              "  CUDA0: NVIDIA (10 MiB, 5 MiB free)", "Available devices:", "version: 12 (ab)",
                              "built with x for y", "[level_zero:gpu][level_zero:0] A, B 1.3 [1]", "{", "}", "[",
                              '{"card0": {"VRAM Total Memory (B)": "x"}}', "0, a, b, c, 1, 2, 3, 4, 5",
                              '[{"gpu": 0, "mem_usage": {"total_vram": {"value": "a"}}}]', "", "\x00"]),
             max_size=30).map("\n".join),
)


@settings(max_examples=150, deadline=None)
@given(_junk)
def test_probe_parsers_never_raise_unexpectedly(text):
    for parse in (nvidia_smi.parse, amd.parse_rocm_smi, amd.parse_amd_smi, intel.parse_sycl_ls,
                  intel.parse_xpu_smi, vulkan.parse, apple.parse_displays):
        try:
            result = parse(text)
        except _util.ProbeFailed:
            continue
        assert isinstance(result, list)
    assert isinstance(llamacpp.parse_version(text), dict)
    assert isinstance(llamacpp.parse_list_devices(text, text), list)
    ollama.parse_version(text)
    try:
        ollama.parse_ps(json.loads(text))
    except ValueError:
        pass


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["card0", "gpu", "mem_usage", "total_vram", "used_vram", "free_vram", "value", "unit",
                         "device_list", "device_id", "memory_physical_size_byte", "SPDisplaysDataType",
                         "sppci_model", "spdisplays_vram", "models", "size", "size_vram", "VRAM Total Memory (B)",
                         "VRAM Total Used Memory (B)", "Card Series", "x"]), children, max_size=5),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(_json_values)
def test_json_parsers_take_any_json(value):
    text = json.dumps(value)
    for parse in (amd.parse_rocm_smi, amd.parse_amd_smi, intel.parse_xpu_smi, apple.parse_displays):
        try:
            assert isinstance(parse(text), list)
        except _util.ProbeFailed:
            pass
    assert isinstance(ollama.parse_ps(value), list)


# --- host memory limits (QA #7) --------------------------------------------------------------------


def test_cgroup_v2_limit_of_own_group(tmp_path):
    from kvreport.probes import host

    group = tmp_path / "system.slice" / "llm.service"
    group.mkdir(parents=True)
    (group / "memory.max").write_text("4294967296\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert host.cgroup_memory_limit_mib(str(tmp_path), "0::/system.slice/llm.service\n") == 4096.0
    assert host.cgroup_memory_limit_mib(str(tmp_path), "0::/\n") is None  # root: "max"
    (tmp_path / "memory.max").write_text("1073741824\n")  # inside a container: its own root
    assert host.cgroup_memory_limit_mib(str(tmp_path), "0::/\n") == 1024.0


def test_cgroup_v1_limit(tmp_path):
    from kvreport.probes import host

    mem = tmp_path / "memory"
    mem.mkdir()
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1 "no limit"
    v1 = "4:memory:/\n1:cpu:/\n0::/\n"
    assert host.cgroup_memory_limit_mib(str(tmp_path), v1) is None
    (mem / "memory.limit_in_bytes").write_text("2147483648\n")
    assert host.cgroup_memory_limit_mib(str(tmp_path), v1) == 2048.0
    assert host.cgroup_memory_limit_mib(str(tmp_path / "nothing"), v1) is None


def test_rlimits_recorded_by_the_host_probe(monkeypatch):
    import resource

    from kvreport.probes import host

    limits = {resource.RLIMIT_AS: (600000 * 1024, resource.RLIM_INFINITY),
              resource.RLIMIT_DATA: (resource.RLIM_INFINITY, resource.RLIM_INFINITY)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits.get(which, (resource.RLIM_INFINITY,) * 2))
    monkeypatch.setattr(host, "cgroup_memory_limit_mib", lambda *a, **k: 3072.0)
    facts = host.probe()["host"]
    assert facts["address_space_limit_mib"] == 585.94 and "data_limit_mib" not in facts
    if sys.platform.startswith("linux"):
        assert facts["memory_limit_mib"] == 3072.0
    from kvreport.bundle import new_bundle_id, validate_bundle  # the keys pass the bundle schema

    validate_bundle({"schema": "kvreport/bundle@1", "id": new_bundle_id(), "created_at": "2026-01-01T00:00:00Z",
                     "host": facts})
