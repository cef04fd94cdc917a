"""What `kvreport collect` does, as plain functions: build a redacted bundle from the probes, a log,
a command line and a model file (:func:`build_bundle`), diagnose it, write it atomically. Printing,
the upload prompt and click live in the command layer (:mod:`kvreport.commands.collect`).

The bundle follows ``kvreport.bundle`` (schema ``kvreport/bundle@1``) and is validated with
:func:`kvreport.bundle.validate_bundle` before anything is written or sent. Redaction
(:mod:`kvreport.redact`) happens before validation, display, writing and upload: nothing
unredacted leaves memory. ``kvreport run`` (``kvreport.runner``) builds its bundle with the same
:func:`build_bundle` and finishes with the same :func:`kvreport.commands.collect.finish`.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shlex
import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvreport import __version__
from kvreport.bundle import SCHEMA_ID, BundleError, new_bundle_id, validate_bundle
from kvreport.errors import InputError, KvreportError
from kvreport.excerpt import Excerpt
from kvreport.logcheck import HEAD_BYTES, check_file, refuse
from kvreport.vocab import BACKEND_DEVICE_PREFIX, PYTHON_ENGINES

_DEVICE_PREFIX = BACKEND_DEVICE_PREFIX


def device_name(device: dict) -> str:
    """The llama.cpp-style name of a probed device (``CUDA0``, ``ROCm1``, ``Vulkan0``, ``MTL0``).

    The index is the probe's (NVML orders by PCI bus; CUDA's default order is fastest first, so
    with mixed GPUs ``CUDA0`` may differ: the entry also carries ``uuid`` / ``pci_bus_id``).
    """
    prefix = _DEVICE_PREFIX.get(str(device.get("backend")), str(device.get("backend") or "GPU"))
    return f"{prefix}{device.get('index') if device.get('index') is not None else 0}"


def memory_snapshot(probe_result: dict) -> list[dict]:
    """``memory_before_launch`` entries from a :func:`kvreport.probes.run_all` result.

    llama.cpp's own ``--list-devices`` view is used when the engine probe has one (its device
    names and free MiB are what llama.cpp itself sees); otherwise the device probes' entries.
    The host's RAM is always added as device ``CPU`` (llama.cpp's name for host buffers: CPU
    weights, CPU KV cache, the CPU backend), free = available RAM (psutil), in MiB.
    """
    engine = probe_result.get("engine") or {}
    listed = engine.get("list_devices") or []
    if listed:
        from kvreport.probes.llamacpp import backend_of

        entries = [{"device": d["name"], "name": d.get("description"), "backend": backend_of(d["name"]),
                    "free_mib": d.get("free_mib"), "total_mib": d.get("total_mib"),
                    "source": "llama.cpp --list-devices"} for d in listed]
    else:
        entries = [{"device": device_name(d), "name": d.get("name"), "backend": d.get("backend"),
                    "free_mib": d.get("free_mib"), "total_mib": d.get("total_mib"), "source": d.get("source")}
                   for d in probe_result.get("devices") or [] if d.get("free_mib") is not None or d.get("total_mib")]
    host = probe_result.get("host") or {}
    if host.get("ram_free_mib") is not None and not any(e["device"] == "CPU" for e in entries):
        entries.append({"device": "CPU", "name": host.get("cpu_model"), "backend": "cpu",
                        "free_mib": host.get("ram_free_mib"), "total_mib": host.get("ram_total_mib"),
                        "source": "psutil (available RAM)"})
    return entries


def model_section(model_path: str | None, command: dict) -> dict | None:
    """The bundle's ``model`` section for a GGUF path (or the command's ``-m`` when it names one), or None."""
    path = model_path
    from_command = False
    if not path:
        flag = (command.get("flags") or {}).get("model") if command else None
        if isinstance(flag, str) and flag.lower().endswith(".gguf"):
            path, from_command = flag, True
    if not path:
        return None
    expanded = os.path.expanduser(path)
    section: dict[str, Any] = {"path": path, "file_name": os.path.basename(path.replace("\\", "/"))}
    if from_command and not os.path.isfile(expanded):
        section["error"] = "not found on this machine (named in the command)"
        return section
    try:
        section["size_bytes"] = os.path.getsize(expanded)
    except OSError:
        pass
    try:
        from kvreport.gguf_meta import gguf_summary, read_gguf_metadata

        section["gguf"] = gguf_summary(read_gguf_metadata(expanded))
    except KvreportError as exc:
        section["error"] = str(exc)
    except ImportError as exc:  # pragma: no cover - the gguf helper is part of the package
        section["error"] = f"GGUF reader unavailable: {exc}"
    except Exception as exc:  # noqa: BLE001 - a model file must never stop a bundle
        section["error"] = f"cannot read GGUF metadata: {type(exc).__name__}: {exc}"
    return section


def _engine_section(command: dict, probe_result: dict, log_engine: str | None) -> dict:
    name = command.get("engine") or log_engine
    engine: dict = {}
    if name in (None, "llama.cpp") and probe_result.get("engine"):
        engine = dict(probe_result["engine"])
    elif name == "ollama" and probe_result.get("ollama"):
        engine = dict(probe_result["ollama"])
    elif name in PYTHON_ENGINES and probe_result.get("python_engines"):
        py = probe_result["python_engines"]
        engine = {"version": py.get({"vllm": "vllm", "sglang": "sglang"}.get(name, "text-generation-server")),
                  "packages": py}
    if name:
        engine["name"] = name
    elif engine.get("name") is None:
        engine.pop("name", None)
    if command.get("program") and not engine.get("program"):
        engine["program"] = command["program"]
    return engine


def engine_python(command: dict, program_path: str | None = None) -> str | None:
    """The Python interpreter of a vLLM / SGLang / TGI command (to ask it for package versions).

    ``program_path``: the resolved first word of the engine invocation when ``kvreport run`` is about
    to execute it; otherwise an absolute path typed in the command, or the name looked up on the
    PATH without ``.`` (a program in the current folder is never run).
    """
    if command.get("engine") not in PYTHON_ENGINES:
        return None
    engine_argv = command.get("engine_argv") or []
    if not engine_argv:
        return None
    from kvreport.probes._util import which
    from kvreport.probes.pyengines import interpreter_of

    first = engine_argv[0]
    path = program_path
    if path is None:
        path = first if os.path.isabs(first) and os.path.isfile(first) else which(os.path.basename(first))
    return interpreter_of(path)


def _log_facts(excerpt: Excerpt | None):
    """:class:`kvreport.logs.LogFacts` of the captured excerpt (parsed once), or None."""
    if excerpt is None or not excerpt.line_count:
        return None
    try:
        from kvreport.logs import parse_log

        return parse_log(text for _n, text in excerpt.lines())
    except Exception:  # noqa: BLE001 - the log's facts are a courtesy here; analyze re-reads the log
        return None


def _log_engine(facts) -> str | None:
    if facts is None:
        return None
    try:
        from kvreport.logs import decide_engine

        return decide_engine(facts)
    except Exception:  # noqa: BLE001 - engine naming is a courtesy
        return None


def _log_version(facts, engine_name: str | None) -> dict:
    """Version facts the log printed: llama.cpp ``build: 6895 (4341dc8bc)`` / ``version: 6895 (…)``
    (common/common.cpp, kvreport.logs.llamacpp), vLLM ``vLLM API server version 0.9.1``, Ollama
    ``version=0.12.6``. ``{"version", "build_number", "commit"}``, only what is known."""
    if facts is None:
        return {}
    if engine_name in ("ollama", *PYTHON_ENGINES):
        # an Ollama log also carries the llama.cpp lines of its runner: that build is not Ollama's
        sub = getattr(facts, engine_name, None)
        version = sub.get("version") if isinstance(sub, dict) else None
        return {"version": str(version)} if version else {}
    out: dict = {}
    if facts.build == 0:  # a local build without git: "build 0 (unknown)" names no release
        return {}
    if facts.version:
        out["version"] = str(facts.version)
    if facts.build is not None:
        out["build_number"] = int(facts.build)
    if facts.commit:
        out["commit"] = str(facts.commit)
    return out


def command_section(command_line: str | list[str] | None, extra_env: dict[str, str] | None = None) -> dict:
    """The bundle's ``command`` section: :func:`kvreport.cmdline.parse_command` of the line, with the
    settings the engine also read from the environment it ran in (``extra_env``: LLAMA_ARG_*,
    OLLAMA_*), parsed as if they were env prefixes (the command line still wins); ``line`` as typed."""
    from kvreport.cmdline import parse_command, quote_problem

    command = parse_command(command_line) if command_line else {}
    problem = quote_problem(command_line) if isinstance(command_line, str) else None
    if problem:  # stored as typed all the same (design.md: collect never fails on a command it cannot parse)
        command["split_error"] = problem
    if extra_env and command_line:
        prefix = [f"{k}={v}" for k, v in extra_env.items()]
        if isinstance(command_line, str):
            with_env = parse_command(" ".join(shlex.quote(p) for p in prefix) + " " + command_line)
        else:
            with_env = parse_command(prefix + list(command_line))
        if with_env.get("engine") == command.get("engine"):
            command["flags"] = with_env.get("flags") or command.get("flags") or {}
        command["env"] = {**extra_env, **(command.get("env") or {})}
    return command


def build_bundle(log_lines: Iterable[str] | None = None, command_line: str | list[str] | None = None,
                 model_path: str | None = None, probe_timeout: float = 3.0,
                 memory_before: list[dict] | None = None, log_source: str = "file", *,
                 excerpt: Excerpt | None = None, probe_result: dict | None = None,
                 engine_binary: str | None = None, extra_env: dict[str, str] | None = None,
                 python: str | None = None, redactor=None) -> dict:
    """A validated, redacted bundle dict (nothing is written).

    ``log_lines``: the engine log, any iterable of lines (or pass a filled ``excerpt``);
    ``command_line``: the command as typed (a shell line or an argv list; never fails to parse);
    ``model_path``: a GGUF file whose header is read (a bad file gives ``model.error``; without it
    the ``-m`` file of the command is read when it exists here); ``probe_timeout``: seconds per
    probe; ``memory_before``: ``memory_before_launch`` entries (``kvreport run``); ``probe_result``:
    a :func:`kvreport.probes.run_all` result to reuse; ``extra_env``: placement variables of the
    environment the engine ran in (``kvreport run``). Raises ``BundleError`` only on a bug.
    """
    from kvreport import probes
    from kvreport.redact import Redactor

    if excerpt is None and log_lines is not None:
        excerpt = Excerpt()
        for line in log_lines:
            excerpt.feed(line)
    command = command_section(command_line, extra_env)
    log_facts = _log_facts(excerpt)
    log_engine = _log_engine(log_facts)
    if probe_result is None:
        probe_result = probes.run_all(probe_timeout, engine_program=command.get("program"),
                                      engine_binary=engine_binary, engine=command.get("engine") or log_engine,
                                      python=python or engine_python(command))
    engine = _engine_section(command, probe_result, log_engine)
    if not engine.get("version") and engine.get("build_number") is None:
        from_log = _log_version(log_facts, engine.get("name") or log_engine)
        if from_log:
            engine.update(from_log)
            engine["version_source"] = "log"
    # devices[] holds what the probes measured, nothing else: the devices the log names (and their
    # load-time free MiB) are facts of the log, which the analysis reads from the log itself
    devices = list(probe_result.get("devices") or [])
    bundle = {
        "schema": SCHEMA_ID,
        "id": new_bundle_id(),
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "collector": {"name": "kvreport", "version": __version__, "probe_seconds": probe_result.get("seconds")},
        "host": probe_result.get("host") or {},
        "devices": devices[:64],
        "probes": probe_result.get("probes") or {},
        "engine": engine,
        "command": command,
        "model": model_section(model_path, command),
        "log": excerpt.to_log(log_source) if excerpt is not None else None,
        "memory_before_launch": (memory_before or [])[:64],
        "redactions": {},
    }
    redactor = redactor or Redactor.for_this_machine()
    bundle = redactor.redact_bundle(bundle)
    return validate_bundle(json.loads(json.dumps(bundle, allow_nan=False, default=str)))


def read_log(path: str) -> Excerpt:
    """Feed the log file at ``path`` ('-' = stdin) through an :class:`Excerpt` (bounded memory).

    A file is read by :func:`kvreport.excerpt_fast.read_excerpt` (the analyzer's grep prefilter;
    the same excerpt as feeding every line, about 20x faster on a 200 MB log).

    Raises :class:`InputError` (one line) when it cannot be read, or when it is empty or binary data
    (:mod:`kvreport.logcheck`: the same line as ``kvreport analyze``).
    """
    try:
        if path == "-":
            return _read_stdin_log()
        if os.path.isdir(path):
            raise InputError(f"cannot read log {path}: it is a directory")
        from kvreport.excerpt_fast import read_excerpt

        check_file(path)
        return read_excerpt(path)  # grep prefilter + newline count + tail read from the end
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"cannot read log {path}: {exc.strerror or exc}") from None


def _read_stdin_log() -> Excerpt:
    """Standard input through an :class:`Excerpt`, its first bytes (to the end of a line) judged first."""
    excerpt = Excerpt()
    stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None
    if stream is None:  # a text stream without bytes under it
        text = sys.stdin.read(HEAD_BYTES)
        text += sys.stdin.readline() if text and not text.endswith("\n") else ""
        refuse(text.encode("utf-8", "replace"), "standard input")
        for line in itertools.chain(io.StringIO(text), sys.stdin):
            excerpt.feed(line)
        return excerpt
    head = stream.read(HEAD_BYTES)
    head += stream.readline() if head and not head.endswith(b"\n") else b""
    refuse(head, "standard input")
    for raw in itertools.chain(io.BytesIO(head), stream):
        excerpt.feed(raw.decode("utf-8", "replace"))
    return excerpt


def redaction_summary(bundle: dict) -> str:
    """One line: what was replaced and how often (``redacted: 2 home, 1 token``)."""
    counts = bundle.get("redactions") or {}
    if not counts:
        return "redacted: nothing needed redacting"
    return "redacted: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def diagnose_bundle(bundle: dict) -> tuple[dict | None, str | None]:
    """``(diagnosis, None)``, or ``(None, why)`` when the analysis is unavailable or failed (the bundle
    is still worth writing)."""
    try:
        from kvreport.analyze import analyze
    except ImportError as exc:
        return None, f"diagnosis unavailable in this installation ({exc})"
    try:
        return analyze(bundle), None
    except Exception as exc:  # noqa: BLE001 - the bundle is still worth writing
        return None, f"diagnosis failed: {type(exc).__name__}: {exc}"


def render_diagnosis(diagnosis: dict, bundle: dict) -> str:
    """The terminal summary of ``diagnosis`` (:func:`kvreport.render.render_text`), never raising."""
    try:
        from kvreport.render import render_text

        return render_text(diagnosis, bundle)
    except Exception as exc:  # noqa: BLE001
        return f"(cannot render the diagnosis: {exc}; use --json)"


def write_bundle(bundle: dict, output: str | None = None) -> Path:
    """Validate ``bundle`` and write it atomically to ``output`` (default ``./kvreport-<id>.json``); the path.

    Raises :class:`InputError` when the file cannot be written."""
    from kvreport.fsutil import write_json_atomic

    path = Path(output) if output else Path.cwd() / f"kvreport-{bundle['id']}.json"
    try:
        validate_bundle(bundle)
        write_json_atomic(path, bundle)
    except BundleError as exc:  # pragma: no cover - build_bundle validated it already
        raise KvreportError(f"internal error: the bundle is not valid: {exc}") from None
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
