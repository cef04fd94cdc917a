"""Real failures: the diagnosis of a failed run equals what the same run printed.

Each scenario is run twice: once by itself (its log then goes through
``kvreport analyze LOG --json --command CMD``) and once through ``kvreport run -o BUNDLE -- CMD``
(whose bundle goes through ``kvreport analyze BUNDLE --json``). Both diagnoses must name the phase,
backend (``cpu``), failing device (``CPU``), the size of the buffer that failed to the byte as the
run printed it (``ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size N``),
the verdict, and the KV cache that was asked for.

Memory safety: a request larger than the machine is refused by malloc at once only under the
kernel's heuristic overcommit and when it really exceeds RAM + swap. Where that is not certain
(``vm.overcommit_memory = 1``, or a machine with so much memory that the request might be granted
and then zeroed), the command runs under ``ulimit -v`` (4 GiB), which makes the same allocation fail
the same way (the cap is invisible in the log, see llama-cpp-local-runs.md §5).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import pytest

from . import harness
from .harness import near, record

MIB = 1 << 20
FATKV_BYTES_PER_TOKEN_F16 = 32 * 2 * 32 * 128 * 2  # tiny-fatkv: layers x (K+V) x kv heads x head dim x 2 B


def _capped(cmd: list[str], cap_kib: int) -> list[str]:
    return ["bash", "-c", f"ulimit -v {cap_kib}; exec {shlex.join(cmd)}"]


def _huge(cmd: list[str], request_bytes: int) -> list[str]:
    """``cmd`` as is when malloc will refuse ``request_bytes`` outright, else under ``ulimit -v 4 GiB``."""
    total_kib, _ = harness.host_memory_kib()
    if harness.overcommit_mode() == 1 or request_bytes < 1.5 * total_kib * 1024:
        return _capped(cmd, 4 * 1024 * 1024)
    return cmd


def _huge_ctx() -> int:
    """A -c for tiny-fatkv whose f16 KV is at least twice RAM + swap (131072 -> 64 GiB on 24 GiB)."""
    total_kib, _ = harness.host_memory_kib()
    need = -(-2 * total_kib * 1024 // FATKV_BYTES_PER_TOKEN_F16)
    return max(131072, -(-need // 256) * 256)


@dataclass
class Expect:
    phase: str
    verdicts: tuple[str, ...]
    kv_printed_from_buffer: bool = True  # the failed buffer is the whole KV cache (phase kv_cache)


def _said(d: dict) -> str:
    f, m = d["failure"], d["memory"]
    fit = m.get("fit")
    fit_s = f", fit {fit.get('status')}" if fit else ""
    return (f"phase {f['phase']}, {f['backend']}/{f['failing_device']}, requested {f['requested_mib']} MiB, "
            f"verdict {f['verdict']}, kv_required_mib {m.get('kv_required_mib')}{fit_s}")


def _check(d: dict, printed: harness.Printed, expect: Expect, kv_mib: float | None) -> None:
    f = d["failure"]
    assert d["engine"] == "llama.cpp"
    assert f["phase"] == expect.phase, f
    assert f["backend"] == "cpu", f
    assert f["failing_device"] == "CPU", f
    assert printed.failed_bytes, "the run printed no failed buffer"
    req_mib = printed.failed_bytes[-1] / MIB
    assert f["requested_mib"] is not None and abs(f["requested_mib"] - req_mib) <= 0.01, (
        f"requested_mib {f['requested_mib']} != printed {printed.failed_bytes[-1]} B = {req_mib} MiB")
    assert f["verdict"] in expect.verdicts, f
    if kv_mib is not None:
        assert near(d["memory"]["kv_required_mib"], kv_mib), (
            f"memory.kv_required_mib {d['memory']['kv_required_mib']} != {kv_mib} printed (inputs {d['memory'].get('inputs')})")


def _printed_whole(printed: harness.Printed, run, check_printed) -> bool:
    """Whether the engine's own output reached its failure lines (and the scenario's check of them)."""
    if not (printed.failed_bytes or printed.kv_failed or printed.compute_failed):
        return False
    if check_printed is None:
        return True
    try:
        check_printed(printed, run)
    except AssertionError:
        return False
    return True


def _scenario(kv, via: str, sid: str, cmd: list[str], expect: Expect, *, kv_mib=None, check_printed=None) -> dict:
    """Run ``cmd`` by itself and analyze its log (``via="log"``), or through ``kvreport run`` and analyze
    the bundle (``via="run"``); check what was printed and the diagnosis; return the diagnosis."""
    # llama.cpp's common_log prints from a worker thread; a tool that returns from main() on an error
    # can exit before that thread flushes its last lines (seen with llama-completion writing into a
    # pipe: the log stops before the allocator lines). Such a run printed no failure to compare
    # with, so it is repeated (at most 3 runs); what kvreport says is checked on a run that printed it.
    # The log can also stop between the allocator's lines and the KV cache's own failure line (seen in
    # CI under load), so "printed it" means the scenario's own check of the engine output passes.
    for attempt in range(3):
        if via == "log":
            run, log = kv.raw(cmd, name=sid)
        else:
            res = kv.run(cmd, name=sid)
            run = res.run
        assert run.returncode == 1, f"expected exit 1 (the child's status), got {run.returncode}:\n{run.tail()}"
        printed = harness.printed_facts(run.output)
        if _printed_whole(printed, run, check_printed) or attempt == 2:
            break
    if check_printed:
        check_printed(printed, run)
    want_kv = kv_mib(printed) if callable(kv_mib) else kv_mib
    if via == "log":
        rc, d = kv.analyze(log, command=shlex.join(cmd))
        record(f"fail/{sid}", shlex.join(cmd).replace(str(kv.workdir), "."),
               f"exit {run.returncode}; failed buffer {printed.failed_bytes[-1] if printed.failed_bytes else None} B; "
               f"kv failure line: {printed.kv_failed}; compute failure line: {printed.compute_failed}",
               _said(d))
        _check(d, printed, expect, want_kv)
        assert rc == 0, "kvreport analyze must exit 0 when it diagnosed a failure"
        return d
    assert res.bundle is not None, f"kvreport run wrote no bundle after a failure:\n{run.tail()}"
    try:
        _check(res.diagnosis, printed, expect, want_kv)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- diagnosis: {res.diagnosis.get('failure')}\n--- kvreport run printed:\n"
                             f"{run.tail(25)}") from None
    return res.diagnosis


VIA = pytest.mark.parametrize("via", ["log", "run"])


@VIA
def test_kv_huge_context_fit_off(kv, tiny_models, via):
    ctx = _huge_ctx()
    req = ctx * FATKV_BYTES_PER_TOKEN_F16
    cmd = _huge(kv.server_cmd(tiny_models["tiny-fatkv"], "-c", str(ctx), "--fit", "off", "-lv", "4"), req)

    def printed_ok(p, run):
        assert p.kv_failed and p.failed_bytes[-1] == req, run.tail()
        assert not p.fit_ran

    d = _scenario(kv, via, "kv-huge-ctx-fit-off", cmd, Expect("kv_cache", ("exceeds_free",)),
                  kv_mib=req / MIB, check_printed=printed_ok)
    fit = d["memory"].get("fit")
    assert fit is None or fit.get("ran") is False, fit
    assert d["suggestions"] and d["suggestions"][0]["id"] in ("reduce-ctx", "quantize-kv-cache"), d["suggestions"][:1]


@VIA
def test_kv_huge_context_fit_on(kv, tiny_models, via):
    """Default --fit on: the fit warns it cannot fit (a user-set -c is not changed), then the KV malloc fails."""
    ctx = _huge_ctx()
    req = ctx * FATKV_BYTES_PER_TOKEN_F16
    cmd = _huge(kv.server_cmd(tiny_models["tiny-fatkv"], "-c", str(ctx), "-lv", "4"), req)

    def printed_ok(p, run):
        assert p.kv_failed and p.failed_bytes[-1] == req, run.tail()
        assert p.fit_ran and p.fit_failed and p.fit_user_ctx == ctx, run.tail(60)

    d = _scenario(kv, via, "kv-huge-ctx-fit-on", cmd, Expect("kv_cache", ("exceeds_free",)),
                  kv_mib=req / MIB, check_printed=printed_ok)
    fit = d["memory"].get("fit")
    assert fit and fit["ran"] is True, d["memory"]
    assert str(fit["status"]).startswith("failed"), fit
    assert "n_ctx" not in (fit.get("changed") or {}), fit


@VIA
def test_kv_huge_context_q8_0_cache(kv, tiny_models, via):
    """Quantized K/V (q8_0, 34 B per 32 values) with flash attention: the failed buffer is the q8_0 KV."""
    ctx = _huge_ctx()
    req = ctx * FATKV_BYTES_PER_TOKEN_F16 * 34 // 64
    cmd = _huge(kv.server_cmd(tiny_models["tiny-fatkv"], "-c", str(ctx), "-ctk", "q8_0", "-ctv", "q8_0",
                              "-fa", "on", "--fit", "off", "-lv", "4"), req)

    def printed_ok(p, run):
        assert p.kv_failed and p.failed_bytes[-1] == req, run.tail()

    _scenario(kv, via, "kv-huge-ctx-q8_0", cmd, Expect("kv_cache", ("exceeds_free",)), kv_mib=req / MIB,
          check_printed=printed_ok)


@VIA
def test_kv_parallel_inflates_context(kv, tiny_models, via):
    """-c 4096 -np 256 --no-kv-unified: per-slot 16 tokens padded to 256 -> n_ctx 65536 (32 GiB here)."""
    req = 65536 * FATKV_BYTES_PER_TOKEN_F16
    cmd = _huge(kv.server_cmd(tiny_models["tiny-fatkv"], "-c", "4096", "-np", "256", "--no-kv-unified",
                              "--fit", "off", "-lv", "4"), req)

    def printed_ok(p, run):
        assert p.kv_failed and p.failed_bytes[-1] == req and p.n_ctx[-1] == 65536, run.tail()

    d = _scenario(kv, via, "kv-np256-inflated", cmd, Expect("kv_cache", ("exceeds_free",)),
                  kv_mib=req / MIB, check_printed=printed_ok)
    ids = [s["id"] for s in d["suggestions"]]
    assert "reduce-parallel" in ids or any("--kv-unified" in (s.get("command") or "") for s in d["suggestions"]), ids


# Under ``ulimit -v`` what fails first depends on the address space the process already holds
# (thread stacks, malloc arenas: both grow with the core count), so the thread counts are pinned and
# the caps sit far from both edges: 2 GB against a 4 GiB KV buffer, or against a 4.4 GiB compute buffer
# after a 64 MiB KV. The small models map in ~20 MB, so they always load.
CAP_KIB = 2_000_000
PIN = ("-t", "2", "-tb", "2", "--threads-http", "4")


@VIA
def test_kv_memory_cap_model_loads(kv, tiny_models, via):
    """ulimit -v 2000000 KiB: the model maps, the 4 GiB KV buffer does not. The log does not show the cap;
    4 GiB is far below the host's free memory, so the verdict must not be exceeds_free."""
    req = 524288 * 8 * 1024  # tiny-gqa8: 8 KiB of f16 KV per token
    cmd = _capped(kv.server_cmd(tiny_models["tiny-gqa8"], "-c", "524288", *PIN, "-lv", "4"), CAP_KIB)
    total_kib, _ = harness.host_memory_kib()
    verdicts = ("fits_but_failed", "exceeds_alloc_limit") if total_kib * 1024 > 2 * req else (
        "fits_but_failed", "exceeds_alloc_limit", "exceeds_free")

    def printed_ok(p, run):
        assert p.kv_failed and p.failed_bytes[-1] == req, run.tail()
        assert "load_tensors:   CPU_Mapped model buffer size" in run.output, "the model did not load"
        assert p.fit_ran and p.fit_ok, "the fit (which sees total memory, not the cap) approved"

    d = _scenario(kv, via, f"kv-ulimit-{CAP_KIB}", cmd, Expect("kv_cache", verdicts), kv_mib=req / MIB,
                  check_printed=printed_ok)
    fit = d["memory"].get("fit")
    assert fit and fit["ran"] is True and fit["status"] in ("no_change", "fitted"), fit


@VIA
def test_compute_buffer_after_kv_under_cap(kv, tiny_models, via):
    """ulimit -v 2000000 with -b/-ub 8192 and -fa off: the 64 MiB KV is allocated (its size lines printed),
    the ~4.4 GiB compute buffer fails: the phase is compute_buffer, not kv_cache, and the KV kvreport
    computes equals the printed one."""
    cmd = _capped(kv.server_cmd(tiny_models["tiny-gqa8"], "-c", "8192", "-b", "8192", "-ub", "8192", "-fa", "off",
                                *PIN, "-lv", "4"), CAP_KIB)

    def printed_ok(p, run):
        assert p.compute_failed and not p.kv_failed, run.tail()
        assert p.kv_total_mib == 64.0, p.kv_sizes

    _scenario(kv, via, f"compute-ulimit-{CAP_KIB}", cmd, Expect("compute_buffer", ("fits_but_failed", "exceeds_alloc_limit")),
              kv_mib=64.0, check_printed=printed_ok)


def _not_kv(d: dict) -> None:
    f = d["failure"]
    assert f["phase"] not in ("kv_cache", "compute_buffer", "kv_capacity", "memory_budget", "none"), f
    assert f["requested_mib"] is None, f
    assert "kv_cache" not in d["signature"]["key"], d["signature"]
    assert not any(s["id"] in ("reduce-ctx", "quantize-kv-cache") for s in d["suggestions"]), d["suggestions"]


NEGATIVES = [
    ("neg-missing-model", "neg-missing", []),
    ("neg-truncated-gguf", "neg-truncated", []),
    ("neg-not-gguf", "neg-not-gguf", []),
    ("config-quantized-v-fa-off", "tiny-gqa8", ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "off"]),
]


@VIA
@pytest.mark.parametrize("sid,model,flags", NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_not_a_kv_failure(kv, tiny_models, sid, model, flags, via):
    """A bad model file or a refused configuration is a failure, but not a memory one."""
    cmd = kv.server_cmd(tiny_models[model], "-c", "4096", *flags, "-lv", "4")
    if via == "run":
        res = kv.run(cmd, name=sid)
        assert res.run.returncode == 1, f"kvreport run must exit with the child's status 1:\n{res.run.tail()}"
        assert res.bundle is not None, f"kvreport run wrote no bundle after a failure:\n{res.run.tail()}"
        _not_kv(res.diagnosis)
        return
    run, log = kv.raw(cmd, name=sid)
    assert run.returncode == 1 and not run.came_up, run.tail()
    printed = harness.printed_facts(run.output)
    assert not printed.failed_bytes and not printed.kv_failed, run.tail()
    _, d = kv.analyze(log, command=shlex.join(cmd))
    errors = [ln for ln in run.lines if re.match(r"^\d+\.\d+\.\d+\.\d+ E ", ln)]
    first_error = errors[0].split(" E ", 1)[1].strip() if errors else ""
    record(f"neg/{sid}", shlex.join(["llama-server", "-m", tiny_models[model].name, "-c", "4096", *flags]),
           f"exit 1; first error: {first_error[:100]}", _said(d))
    _not_kv(d)


def _free_verdicts(via: str) -> tuple[str, ...]:
    """llama-completion / llama-bench with --fit off print no free memory at all: from their log alone the
    verdict may be unknown; `kvreport run` measured the host before launch, so it must say exceeds_free."""
    return ("exceeds_free", "unknown") if via == "log" else ("exceeds_free",)


@VIA
def test_kv_failure_other_tools(kv, tiny_models, via):
    """The same KV failure through llama-cli (an in-process llama-server thread) and llama-completion."""
    ctx = _huge_ctx()
    req = ctx * FATKV_BYTES_PER_TOKEN_F16
    m = str(tiny_models["tiny-fatkv"])
    for tool, extra in (("llama-cli", ["-st", "--simple-io"]), ("llama-completion", ["-no-cnv"])):
        cmd = _huge([tool, "-m", m, "-c", str(ctx), "-p", "hello", "-n", "1", *extra, "--fit", "off", "-lv", "4"], req)

        def printed_ok(p, run, tool=tool):
            assert p.kv_failed and p.failed_bytes[-1] == req, f"{tool}:\n{run.tail()}"

        _scenario(kv, via, f"kv-huge-ctx-{tool}", cmd, Expect("kv_cache", _free_verdicts(via)), kv_mib=req / MIB,
                  check_printed=printed_ok)


@VIA
def test_kv_failure_llama_bench(kv, tiny_models, via):
    """llama-bench -d 131072 -p 64 -n 16: n_ctx = 131072 + 64 + 16 padded to 256 -> 131328 cells; its
    log lines carry no prefix or timestamp."""
    cells = 131328
    req = cells * FATKV_BYTES_PER_TOKEN_F16
    cmd = _huge(["llama-bench", "-m", str(tiny_models["tiny-fatkv"]), "-p", "64", "-n", "16", "-d", "131072",
                 "-r", "1"], req)

    def printed_ok(p, run):
        assert p.kv_failed and p.failed_bytes[-1] == req, run.tail()

    _scenario(kv, via, "kv-huge-depth-llama-bench", cmd, Expect("kv_cache", _free_verdicts(via)), kv_mib=req / MIB,
              check_printed=printed_ok)


def test_kv_failure_default_verbosity_needs_the_model(kv, tiny_models):
    """At the default verbosity this llama.cpp prints no model parameters and no n_ctx, only the bytes
    that failed. `kvreport run --keep-verbosity` keeps it that way; kvreport must still size the KV
    from the GGUF header of the command's -m file (the bundle's model section) and the command's -c."""
    ctx = _huge_ctx()
    req = ctx * FATKV_BYTES_PER_TOKEN_F16
    cmd = _huge(kv.server_cmd(tiny_models["tiny-fatkv"], "-c", str(ctx), "--fit", "off"), req)
    res = kv.run(cmd, extra=("--keep-verbosity",), name="default-verbosity")
    assert res.run.returncode == 1, res.run.tail()
    p = res.printed
    assert p.kv_failed and p.failed_bytes[-1] == req and not p.n_ctx, "expected a default-verbosity log"
    assert res.bundle is not None, res.run.tail()
    d = res.diagnosis
    record("fail/default-verbosity-keep", f"kvreport run --keep-verbosity -- llama-server -m tiny-fatkv.gguf -c {ctx} --fit off",
           f"exit 1; only 'failed to allocate buffer of size {req}' (no n_ctx, no hparams)", _said(d))
    _check(d, p, Expect("kv_cache", ("exceeds_free",)), req / MIB)
    assert (res.bundle.get("model") or {}).get("gguf"), "the bundle holds no GGUF metadata of the -m file"


def test_verbose_log_dry_run_not_counted(kv, tiny_models):
    """With -v the fit's dry run prints its own KV lines ('CPU KV buffer size = 0.00 MiB' and the would-be
    'size = 65536.00 MiB'): the KV asked for is counted once."""
    ctx = _huge_ctx()
    req = ctx * FATKV_BYTES_PER_TOKEN_F16
    cmd = _huge(kv.server_cmd(tiny_models["tiny-fatkv"], "-c", str(ctx), "-v"), req)
    d = _scenario(kv, "log", "kv-huge-ctx-verbose", cmd, Expect("kv_cache", ("exceeds_free",)), kv_mib=req / MIB)
    assert d["memory"]["fit"]["ran"] is True


@VIA
def test_kv_failure_sliding_window_model(kv, tiny_models, via):
    """gemma2 iSWA, -c 16777216: the non-SWA cache (3 layers, 48 GiB) is created first and fails
    ('creating non-SWA KV cache, size = 16777216 cells'). The failed buffer is that cache alone; the KV
    asked for is both caches: 49152 MiB + the SWA cache of PAD(min(n_ctx, 512 x 4 + 512), 256) = 2560
    cells x 3 layers (7.5 MiB)."""
    ctx = 16777216
    req = ctx * 3 * 2 * 4 * 64 * 2  # full-attention layers x (K+V) x kv heads x head dim x 2 B
    cmd = _huge(kv.server_cmd(tiny_models["tiny-gemma2-swa"], "-c", str(ctx), "--fit", "off", "-lv", "4"), req)

    def printed_ok(p, run):
        assert p.kv_failed and p.failed_bytes[-1] == req, run.tail()
        assert f"creating non-SWA KV cache, size = {ctx} cells" in run.output

    _scenario(kv, via, "kv-huge-ctx-gemma2-swa", cmd, Expect("kv_cache", ("exceeds_free",)),
              kv_mib=req / MIB + 2560 * 3 * 2 * 4 * 64 * 2 / MIB, check_printed=printed_ok)
