"""`kvreport run [collect options] -- CMD ARGS...`: run an engine, keep its log, explain a failure.

1. The probes record free memory per device immediately before launch (``memory_before_launch``;
   llama.cpp's own ``--list-devices`` view when the engine is a llama.cpp binary).
2. CMD runs without a shell. Its stdout and stderr go to the terminal as they arrive (byte for
   byte, progress dots included) and, merged in arrival order, into a bounded
   :class:`kvreport.excerpt.Excerpt` (key lines + tail), so a server that logs for days costs
   little memory. ``PYTHONUNBUFFERED=1`` is set for CMD so that Python engines (vLLM logs to stdout)
   do not hold their lines back in a pipe buffer. CMD's stdout is a pipe, not a terminal.
3. Signals: SIGTERM and SIGHUP sent to kvreport are forwarded to CMD. Ctrl-C at a terminal already
   reaches CMD (it shares kvreport's foreground process group), so it is not sent twice (llama-server
   treats a second SIGINT as "terminate now"); a SIGINT sent to kvreport alone (no terminal) is
   forwarded.
4. Fix confirmation (:mod:`kvreport.confirm`): when CMD shows it came up (its engine's ready line
   in the streamed output, or exit 0 of a one-shot llama.cpp program) and an earlier run of the same
   engine and model failed on this machine, kvreport names the change between the two commands,
   prints "this worked: ...", marks the failed bundle fixed in the local record and sends the
   outcome to a configured server. A failure's bundle is remembered there for that.
5. kvreport exits with CMD's status (128 + N when CMD was killed by signal N; 127 when CMD cannot be
   found, 126 when it cannot be executed). On failure (status != 0), or always with ``--always``,
   it collects a bundle from what CMD printed and finishes like ``kvreport collect``. When kvreport itself
   received a signal (Ctrl-C, SIGTERM, SIGHUP: the user stopped CMD) and CMD printed no failure, no
   bundle is written: a stopped server is not a report.

Since llama.cpp b9151 the model, context and KV size lines are printed only at verbosity 4
(shared/reference/kv-facts.md §1.1): for llama.cpp programs built on ``common`` (llama-server,
llama-cli, llama-completion…) ``run`` appends ``-lv 4`` unless the command already sets a
verbosity (``-lv``, ``--verbosity``, ``--log-verbosity``, ``-v``, ``LLAMA_ARG_LOG_VERBOSITY``), the
build is known to be older than b9151, or ``--keep-verbosity`` is given; it says so on stderr.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

import click

from kvreport.excerpt import Excerpt

VERBOSITY_FLAGS = {"-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose"}
LV_SINCE_BUILD = 9151
_COMMON_PROGRAMS = {
    "llama-server", "llama-cli", "llama-completion", "llama-mtmd-cli", "llama-fit-params", "llama-embedding",
    "llama-perplexity", "llama-speculative", "llama-speculative-simple", "llama-lookup", "llama-parallel",
    "llama-passkey", "llama-retrieval", "llama-imatrix", "llama-batched", "llama-save-load-state",
    "llama-eval-callback", "llama-tts", "llama-diffusion-cli", "llama-llava-cli", "llama-gemma3-cli",
    "llama-qwen2vl-cli", "llama-minicpmv-cli", "ik_llama-server",
}


def resolve_program(name: str) -> str | None:
    """Absolute path of CMD's program as the shell would find it (PATH for bare names), or None."""
    if os.sep in name or (os.altsep and os.altsep in name):
        return os.path.abspath(name) if os.path.exists(name) else None
    found = shutil.which(name)
    return os.path.abspath(found) if found else None


def wants_verbosity(cmd: list[str], parsed: dict, build_number: int | None,
                    environ: dict[str, str] | None = None) -> bool:
    """True when ``-lv 4`` should be appended to ``cmd`` (see the module docstring)."""
    environ = os.environ if environ is None else environ
    program = (parsed.get("program") or "").lower().removesuffix(".exe")
    if parsed.get("engine") != "llama.cpp" or program not in _COMMON_PROGRAMS:
        return False
    engine_argv = parsed.get("engine_argv") or []
    if not engine_argv or cmd[-len(engine_argv):] != engine_argv:
        return False  # the engine is inside bash -c '…' or similar: leave the command alone
    if any(a.split("=", 1)[0] in VERBOSITY_FLAGS for a in engine_argv[1:]):
        return False
    if "LLAMA_ARG_LOG_VERBOSITY" in environ or "LLAMA_ARG_LOG_VERBOSITY" in (parsed.get("env") or {}):
        return False
    if build_number is not None and build_number < LV_SINCE_BUILD:
        return False
    return True


class _Capture:
    """Splits the child's byte chunks into lines for the excerpt (thread-safe, arrival order);
    ``on_line`` sees every line too (the success watch of :class:`_SuccessWatch`)."""

    def __init__(self, excerpt: Excerpt, on_line=None):
        self.excerpt = excerpt
        self.on_line = on_line
        self.lock = threading.Lock()
        self.partial: dict[str, bytes] = {}

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        self.excerpt.feed(text)
        if self.on_line is not None:
            self.on_line(text)

    def feed(self, stream: str, data: bytes) -> None:
        with self.lock:
            buf = self.partial.get(stream, b"") + data
            *lines, rest = buf.split(b"\n")
            for raw in lines:
                self._line(raw)
            if len(rest) > 1 << 20:  # a line without end: keep it bounded
                self._line(rest)
                rest = b""
            self.partial[stream] = rest

    def close(self) -> None:
        with self.lock:
            for rest in self.partial.values():
                if rest:
                    self._line(rest)
            self.partial.clear()


class _SuccessWatch:
    """Confirms a fix (:mod:`kvreport.confirm`) once the engine shows it came up: its ready line in the
    streamed output (a server is confirmed while it keeps running), or exit 0 of a one-shot program.
    The confirmation runs in its own thread so that the output keeps flowing."""

    def __init__(self, command: dict, probe_result: dict, server: str | None, token: str | None):
        self.command = command
        self.host = probe_result.get("host") or {}
        self.devices = list(probe_result.get("devices") or [])
        self.server, self.token = server, token
        self.fired = threading.Event()
        self.thread: threading.Thread | None = None

    def on_line(self, line: str) -> None:
        from kvreport.confirm import ready_marker

        if not self.fired.is_set() and ready_marker(self.command.get("engine"), line):
            self._fire()

    def _fire(self) -> None:
        self.fired.set()
        self.thread = threading.Thread(target=self._confirm, daemon=True)
        self.thread.start()

    def _confirm(self) -> None:
        from kvreport import confirm

        try:
            confirm.confirm(self.command, self.host, self.devices, server=self.server, token=self.token)
        except Exception as exc:  # noqa: BLE001 - the engine's run matters more than the record
            from kvreport import strict

            strict.check()
            if os.environ.get("KVREPORT_DEBUG"):
                raise
            click.echo(f"kvreport: note: could not record the fix: {exc}", err=True)

    def finish(self, status: int) -> None:
        from kvreport.confirm import is_one_shot

        if not self.fired.is_set() and status == 0 and is_one_shot(self.command.get("program")):
            self._fire()
        if self.thread is not None:
            self.thread.join(timeout=120.0)


def _pump(pipe, out_stream, name: str, capture: _Capture) -> None:
    fd = pipe.fileno()
    target = getattr(out_stream, "buffer", None)
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        try:
            if target is not None:
                target.write(data)
                target.flush()
            else:
                out_stream.write(data.decode("utf-8", "replace"))
                out_stream.flush()
        except (OSError, ValueError):
            pass  # the terminal went away: keep capturing
        capture.feed(name, data)
    try:
        pipe.close()
    except OSError:
        pass


def execute(argv: list[str], excerpt: Excerpt, on_line=None, signals_seen: set | None = None) -> int:
    """Run ``argv`` (no shell), tee its output into ``excerpt`` (and each line to ``on_line``),
    forward signals (each one kvreport received is added to ``signals_seen``); return its status as a shell
    reports it (128 + N for signal N)."""
    # Python engines (vLLM logs to stdout) would block-buffer into a pipe: ask them not to
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, shell=False, env=env)
    capture = _Capture(excerpt, on_line)
    threads = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, "out", capture), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, "err", capture), daemon=True)]
    for t in threads:
        t.start()

    def same_foreground_group() -> bool:
        try:
            return sys.stdin.isatty() and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
        except (OSError, AttributeError, ValueError):
            return False

    def forward(signum, _frame):
        if signals_seen is not None:
            signals_seen.add(signum)
        if signum == signal.SIGINT and same_foreground_group():
            return  # the terminal sent it to the child as well
        try:
            proc.send_signal(signum)
        except (ProcessLookupError, OSError):
            pass

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                previous[sig] = signal.signal(sig, forward)
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handled by forward()
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for t in threads:
        t.join(timeout=5.0)
    capture.close()
    return 128 - rc if rc < 0 else rc


def _failed(excerpt: Excerpt) -> bool:
    """Whether the output kept so far holds a failure (kvreport's own analysis, phase other than none)."""
    from kvreport.analyze import analyze_text

    text = "\n".join(line for _n, line in excerpt.lines())
    return analyze_text(text)["failure"]["phase"] != "none"


def cli_run(cmd: list[str], log_path: str | None = None, command_line: str | None = None,
            model_path: str | None = None, output: str | None = None, upload: bool = False,
            server: str | None = None, token: str | None = None, show: bool = False, yes: bool = False,
            as_json: bool = False, probe_timeout: float = 3.0, keep_verbosity: bool = False,
            always: bool = False, **_ignored) -> int:
    """`kvreport run`: returns CMD's exit status (127 when CMD is not found, 126 when not executable)."""
    from kvreport import probes
    from kvreport.cmdline import parse_command, placement_env
    from kvreport.collect import build_bundle, engine_python, memory_snapshot, read_log
    from kvreport.commands.collect import finish

    cmd = list(cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        click.echo("kvreport: error: nothing to run: kvreport run [options] -- CMD ARGS...", err=True)
        return 2
    if command_line:
        click.echo("kvreport: note: --command is ignored by run (the command is CMD itself)", err=True)
    program = resolve_program(cmd[0])
    if program is None:
        click.echo(f"kvreport: error: {cmd[0]}: command not found", err=True)
        return 127
    if not os.access(program, os.X_OK) or os.path.isdir(program):
        click.echo(f"kvreport: error: {cmd[0]}: permission denied (not an executable file)", err=True)
        return 126
    parsed = parse_command(cmd)
    engine_binary = None
    if parsed.get("engine_argv") and parsed["engine_argv"][0] == cmd[0]:
        engine_binary = program
    elif parsed.get("program"):
        engine_binary = resolve_program(parsed["engine_argv"][0]) if parsed.get("engine_argv") else None
    first = (parsed.get("engine_argv") or [None])[0]
    python = engine_python(parsed, program if first == cmd[0] else (resolve_program(first) if first else None))
    before = probes.run_all(probe_timeout, engine_program=parsed.get("program"),
                            engine_binary=engine_binary if probes.is_llama_program(parsed.get("program")) else None,
                            engine=parsed.get("engine"), python=python)
    memory_before = memory_snapshot(before)
    run_argv = [program, *cmd[1:]]
    build = (before.get("engine") or {}).get("build_number")
    if not keep_verbosity and wants_verbosity(cmd, parsed, build):
        run_argv += ["-lv", "4"]
        click.echo("kvreport: added -lv 4 so that llama.cpp prints its model, context and KV sizes "
                   "(--keep-verbosity to run the command unchanged)", err=True)
    excerpt = Excerpt()
    from kvreport.collect import command_section

    watch = _SuccessWatch(command_section(cmd, placement_env()), before, server, token)
    stopped: set = set()
    try:
        status = execute(run_argv, excerpt, on_line=watch.on_line, signals_seen=stopped)
    except OSError as exc:
        click.echo(f"kvreport: error: {cmd[0]}: {exc.strerror or exc}", err=True)
        return 126
    watch.finish(status)
    if status == 0 and not always:
        return 0
    if stopped and not always and not log_path and not _failed(excerpt):
        names = ", ".join(sorted(signal.Signals(n).name for n in stopped))
        click.echo(f"kvreport: {cmd[0]} was stopped ({names}) and printed no failure: no bundle written "
                   "(--always writes one anyway)", err=True)
        return status
    if log_path:
        excerpt = read_log(log_path)
    try:
        bundle = build_bundle(None, cmd, model_path, probe_timeout, memory_before=memory_before,
                              log_source="kvreport run" if not log_path else "file", excerpt=excerpt,
                              engine_binary=engine_binary if probes.is_llama_program(parsed.get("program")) else None,
                              extra_env=placement_env(), python=python)
        bundle.setdefault("collector", {})["exit_status"] = status
        finish(bundle, output=output, upload=upload, server=server, token=token, show=show, yes=yes,
               as_json=as_json, confirm_success=False)
    except Exception as exc:  # noqa: BLE001 - the child's status matters more than the bundle
        if os.environ.get("KVREPORT_DEBUG"):
            raise
        click.echo(f"kvreport: error: could not collect a bundle: {exc}", err=True)
    return status
