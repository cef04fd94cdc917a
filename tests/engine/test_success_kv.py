"""Successful real runs: kvreport's KV arithmetic equals the KV sizes llama.cpp printed.

Each scenario starts the real ``llama-server`` through ``kvreport run --always`` (so a bundle is
written although nothing failed), stops the server once it logs ``listening on http://``, and
checks, against the ``llama_kv_cache: size = X MiB`` lines of the same run (full + SWA caches):

* the diagnosis of the bundle (``kvreport analyze BUNDLE --json``): phase ``none`` and
  ``memory.kv_required_mib`` within 0.5 %;
* ``kvreport fit --model TINY.gguf`` with the equivalent explicit flags: ``kv_required_mib``
  within 0.5 % (for llama-server's automatic ``--parallel`` that is ``-np 4 --kv-unified``,
  llama-server's own choice: ``n_parallel is set to auto, using n_parallel = 4 and kv_unified = true``).
"""

from __future__ import annotations

import shlex

import pytest

from . import harness
from .harness import near, record

# (id, model, engine flags, equivalent `kvreport fit` flags, expected cells x streams per cache)
SCENARIOS = [
    ("dense-c4096-np-auto", "tiny-llama", ["-c", "4096"], ["-c", "4096", "-np", "4", "--kv-unified"],
     [(4096, 1)]),
    ("gqa-np1", "tiny-gqa8", ["-c", "8192", "-np", "1"], ["-c", "8192", "-np", "1"], [(8192, 1)]),
    ("gqa-np4-explicit-not-unified", "tiny-gqa8", ["-c", "8192", "-np", "4"],
     ["-c", "8192", "-np", "4", "--no-kv-unified"], [(2048, 4)]),
    ("gqa-np4-kv-unified", "tiny-gqa8", ["-c", "8192", "-np", "4", "--kv-unified"],
     ["-c", "8192", "-np", "4", "--kv-unified"], [(8192, 1)]),
    ("gqa-np64-no-kv-unified-inflated", "tiny-gqa8", ["-c", "4096", "-np", "64", "--no-kv-unified"],
     ["-c", "4096", "-np", "64", "--no-kv-unified"], [(256, 64)]),
    ("gqa-q8_0-kv-fa-on", "tiny-gqa8", ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"],
     ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"], [(8192, 1)]),
    ("gqa-q4_0-kv-fa-on", "tiny-gqa8", ["-c", "8192", "-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"],
     ["-c", "8192", "-ctk", "q4_0", "-ctv", "q4_0"], [(8192, 1)]),
    ("gqa-q8_0-k-only-fa-off", "tiny-gqa8", ["-c", "8192", "-ctk", "q8_0", "-fa", "off"],
     ["-c", "8192", "-ctk", "q8_0"], [(8192, 1)]),
    ("gqa-q8_0-kv-fa-auto", "tiny-gqa8", ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"],
     ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"], [(8192, 1)]),
    ("gqa-f32-kv", "tiny-gqa8", ["-c", "8192", "-ctk", "f32", "-ctv", "f32"],
     ["-c", "8192", "-ctk", "f32", "-ctv", "f32"], [(8192, 1)]),
    ("gqa-fit-off", "tiny-gqa8", ["-c", "8192", "--fit", "off"], ["-c", "8192"], [(8192, 1)]),
    ("swa-gemma2-np-auto", "tiny-gemma2-swa", ["-c", "8192"], ["-c", "8192", "-np", "4", "--kv-unified"],
     [(8192, 1), (2560, 1)]),
    ("swa-gemma2-np4-no-kv-unified", "tiny-gemma2-swa", ["-c", "8192", "-np", "4", "--no-kv-unified"],
     ["-c", "8192", "-np", "4", "--no-kv-unified"], [(2048, 4), (1024, 4)]),
    ("swa-gemma3-np-auto", "tiny-gemma3-swa", ["-c", "8192"], ["-c", "8192", "-np", "4", "--kv-unified"],
     [(8192, 1), (2560, 1)]),
    ("swa-gemma3-np2-no-kv-unified-q8_0", "tiny-gemma3-swa",
     ["-c", "8192", "-np", "2", "--no-kv-unified", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"],
     ["-c", "8192", "-np", "2", "--no-kv-unified", "-ctk", "q8_0", "-ctv", "q8_0"], [(4096, 2), (1024, 2)]),
    ("swa-gemma2-swa-full", "tiny-gemma2-swa", ["-c", "8192", "--swa-full"],
     ["-c", "8192", "-np", "4", "--kv-unified", "--swa-full"], [(8192, 1), (8192, 1)]),
]


def _check_fit(d: dict, flags: list[str], printed) -> None:
    """memory.fit reports what llama.cpp's auto-fit step did: nothing with --fit off; with the default
    --fit on, a fit that ran and approved the parameters unchanged (these contexts fit easily)."""
    fit = d["memory"].get("fit")
    if "--fit" in flags and flags[flags.index("--fit") + 1] == "off":
        assert not printed.fit_ran
        assert fit is None or fit.get("ran") is False, fit
    else:
        assert printed.fit_ran and printed.fit_ok
        assert fit and fit["ran"] is True and fit["status"] in ("no_change", "fitted"), fit
        assert not (fit.get("changed") or {}).get("n_ctx"), fit


def _said(d: dict | None) -> str:
    if not d:
        return "no diagnosis"
    f, m = d.get("failure") or {}, d.get("memory") or {}
    fit = m.get("fit")
    fit_s = f", fit {fit.get('status')} {fit.get('changed') or ''}" if fit else ""
    return f"phase {f.get('phase')}, kv_required_mib {m.get('kv_required_mib')}{fit_s}"


@pytest.mark.parametrize("sid,model,flags,fit_flags,cells", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_log_and_fit_match_printed(kv, tiny_models, sid, model, flags, fit_flags, cells):
    """The engine run by itself; `kvreport analyze LOG --command CMD` and `kvreport fit` vs its size lines."""
    cmd = kv.server_cmd(tiny_models[model], *flags, "-lv", "4")
    run, log = kv.raw(cmd, name=sid)
    assert run.came_up and run.returncode == 0, f"llama-server did not come up (exit {run.returncode}):\n{run.tail()}"
    printed = harness.printed_facts(run.output)
    # the run itself (a check of the scenario and of the harness, not of kvreport)
    assert [(s["cells"], s["streams"]) for s in printed.kv_sizes] == cells, printed.kv_sizes
    printed_mib = printed.kv_total_mib

    fit = kv.fit(tiny_models[model], *fit_flags)
    rc, d = kv.analyze(log, command=shlex.join(cmd))
    record(f"ok/{sid}", shlex.join(["llama-server", "-m", f"{model}.gguf", *flags]),
           "exit 0; KV " + " + ".join(f"{s['total']:g} MiB ({s['cells']}c x{s['streams']}s {s['type_k']}/{s['type_v']})"
                                      for s in printed.kv_sizes),
           f"analyze: {_said(d)}; fit {' '.join(fit_flags)}: {fit.get('kv_required_mib')} MiB")

    assert near(fit.get("kv_required_mib"), printed_mib), (
        f"kvreport fit {' '.join(fit_flags)}: kv_required_mib {fit.get('kv_required_mib')} != printed {printed_mib}")
    assert d["failure"]["phase"] == "none", d["failure"]
    assert rc == 1, "kvreport analyze must exit 1 when the log holds no failure"
    _check_fit(d, flags, printed)
    assert near(d["memory"]["kv_required_mib"], printed_mib), (
        f"diagnosis memory.kv_required_mib {d['memory']['kv_required_mib']} != printed {printed_mib} "
        f"(inputs {d['memory'].get('inputs')})")


@pytest.mark.parametrize("sid,model,flags,fit_flags,cells", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_run_bundle_matches_printed(kv, tiny_models, sid, model, flags, fit_flags, cells):
    """The same command through `kvreport run --always`: the bundle's diagnosis vs the run's size lines."""
    cmd = kv.server_cmd(tiny_models[model], *flags, "-lv", "4")
    res = kv.run(cmd, always=True, name=sid)
    run, printed = res.run, res.printed
    assert run.came_up and run.returncode == 0, f"llama-server did not come up (exit {run.returncode}):\n{run.tail()}"
    assert [(s["cells"], s["streams"]) for s in printed.kv_sizes] == cells, printed.kv_sizes
    d = res.diagnosis
    assert res.bundle is not None, f"kvreport run --always wrote no bundle:\n{run.tail()}"
    assert d is not None
    assert d["failure"]["phase"] == "none", d["failure"]
    _check_fit(d, flags, printed)
    assert near(d["memory"]["kv_required_mib"], printed.kv_total_mib), (
        f"diagnosis memory.kv_required_mib {d['memory']['kv_required_mib']} != printed {printed.kv_total_mib} "
        f"(inputs {d['memory'].get('inputs')})")


def test_llama_completion_single_sequence(kv, tiny_models):
    """llama-completion (n_seq_max 1, exits by itself after -n 1): KV printed == kvreport's."""
    cmd = ["llama-completion", "-m", str(tiny_models["tiny-llama"]), "-c", "4096", "-p", "hello world",
           "-n", "1", "-no-cnv", "-lv", "4"]
    res = kv.run(cmd, always=True, name="completion")
    assert res.run.returncode == 0, res.run.tail()
    assert [(s["cells"], s["streams"], s["seqs"]) for s in res.printed.kv_sizes] == [(4096, 1, 1)]
    printed_mib = res.printed.kv_total_mib
    d = res.diagnosis
    record("ok/llama-completion", "kvreport run --always -- llama-completion -m tiny-llama.gguf -c 4096 -p 'hello world' -n 1 -no-cnv",
           f"exit 0; KV {printed_mib:g} MiB (4096c x1s, 1/1 seqs)", _said(d))
    assert d is not None, f"kvreport run --always wrote no bundle:\n{res.run.tail()}"
    assert d["failure"]["phase"] == "none", d["failure"]
    assert near(d["memory"]["kv_required_mib"], printed_mib), d["memory"]


def test_fit_reduces_default_context(kv, tiny_models):
    """No -c: llama.cpp's auto-fit shrinks the 131072-token default to meet a -fitt margin set close to
    the host's total memory; kvreport reports what the fit did (memory.fit) and the KV really allocated."""
    from .harness import host_memory_kib

    total_kib, _ = host_memory_kib()
    # the fit compares against total physical memory (CPU "free" = total); keep ~700 MiB for the run so
    # that the 1 GiB KV of the default context must shrink
    target = total_kib // 1024 - 700
    cmd = kv.server_cmd(tiny_models["tiny-gqa8"], "-fitt", str(target), "-lv", "4")
    res = kv.run(cmd, always=True, name="fit-reduces")
    run, printed = res.run, res.printed
    assert run.came_up and run.returncode == 0, run.tail()
    assert printed.fit_reduced is not None, f"the fit did not reduce the context:\n{run.tail(60)}"
    frm, to = printed.fit_reduced
    assert frm == 131072 and to < frm
    assert printed.n_ctx[-1] == to
    d = res.diagnosis
    record("ok/fit-reduces-default-ctx", f"kvreport run --always -- llama-server -m tiny-gqa8.gguf -fitt {target}",
           f"exit 0; 'context size reduced from {frm} to {to}'; KV {printed.kv_total_mib:g} MiB", _said(d))
    assert d is not None, run.tail()
    fit = d["memory"].get("fit")
    assert fit and fit["ran"] is True, d["memory"]
    assert fit["changed"].get("n_ctx") == [frm, to], fit
    # llama.cpp printed "common_fit_params: successfully fit params to free device memory"
    assert fit["status"] not in ("started", "unknown") and not str(fit["status"]).startswith("failed"), (
        f"the fit succeeded (it printed 'successfully fit params to free device memory'), memory.fit says {fit}")
    assert near(d["memory"]["kv_required_mib"], printed.kv_total_mib), d["memory"]
    assert any(f.get("kind") == "fit_changed_ctx" for f in d.get("findings", [])), d.get("findings")


def test_run_adds_verbosity(kv, tiny_models):
    """Without -lv, this llama.cpp prints no size lines (verbosity 3); `kvreport run` adds -lv 4 by itself."""
    cmd = kv.server_cmd(tiny_models["tiny-llama"], "-c", "4096")
    res = kv.run(cmd, always=True, name="verbosity")
    assert res.run.came_up, res.run.tail()
    assert res.printed.kv_sizes, "kvreport run did not make llama.cpp print its KV size lines (-lv 4)"
    assert res.diagnosis and near(res.diagnosis["memory"]["kv_required_mib"], res.printed.kv_total_mib)
