"""Privacy: replace secrets and identities in a bundle with placeholders, and count them per kind.

What is replaced (design.md, "Privacy"), in argv, environment, log lines, paths and every other
string of a bundle:

=================  ==========================================================  ===============
kind               what                                                        placeholder
=================  ==========================================================  ===============
url_credentials    ``scheme://user:password@host``                             ``<credentials>``
authorization      ``Authorization: Bearer …`` / ``Basic …``, ``Bearer …``     ``<token>``
secret_flag        the value of ``--api-key``, ``--hf-token``/``-hft``,        ``<token>``
                   ``--token``, ``--password``… (any flag named *key/token/
                   secret/password*, except ``…-file``/``…-path``)
secret_env         the value of ``*_TOKEN``/``*_KEY``/``*_SECRET``/             ``<token>``
                   ``*_PASSWORD``… variables (``HF_TOKEN=…``, JSON ``"api_key": …``)
token              bare tokens: ``hf_…``, ``sk-…``, ``ghp_…``/``github_pat_…``,  ``<token>``
                   ``glpat-…``, ``xox?-…``, ``AKIA…``, ``nvapi-…``, JWTs
email              e-mail addresses                                            ``<email-N>``
home               home directories: ``/home/x``, ``/Users/x``, ``C:\\Users\\x``,  ``<home>``
                   ``C:/Users/x``, ``/mnt/c/Users/x`` (what follows is kept, so
                   model file names stay)
ip                 IPv4 and IPv6 addresses except loopback and unspecified    ``<ip-N>``
                   (``127.0.0.1``, ``0.0.0.0``, ``::1``); version-like strings
                   (``v1.2.3.4``, ``version 1.2.3.4``) are not addresses
user               this machine's user names (passed in), and the user of a    ``<user>``
                   shell prompt (``alice@box:~$``)
host               this machine's host names (passed in), a prompt's host,     ``<host>``
                   and the host field of journalctl/syslog lines
                   (``Jul 07 02:07:26 gpubox ollama[12]: …``)
=================  ==========================================================  ===============

Numbered placeholders are stable within one bundle: the same address gets the same ``<ip-N>``
everywhere. The counts (replacements per kind) go to ``bundle["redactions"]``.
:func:`find_secrets` is the server's second pass: where a bundle still holds something that looks
like a secret or an identity.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

SECRET_KINDS = ("url_credentials", "authorization", "secret_flag", "secret_env", "token")
IDENTITY_KINDS = ("email", "home", "ip", "user", "host")

_SECRET_WORD = r"(?:api[-_]?key|access[-_]?key|secret[-_]?key|private[-_]?key|token|secret|password|passwd|passphrase|credentials?|auth)"
_QUOTED_OR_WORD = r"(?:\"[^\"]*\"|'[^']*'|[^\s\"',;&]+)"

_URL_CREDS = re.compile(r"(?P<pre>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^\s/@:<>\"']+:[^\s/@<>\"']*|[^\s/@:<>\"']{8,})@")
# A name that ends with a secret word (hf_token, api-key, DB_PASSWORD), not one that merely contains
# it (max_tokens, tokenizer, api_key_file, --max-num-batched-tokens).
_SECRET_TAIL = (r"(?:api[-_]?key|access[-_]?key|secret[-_]?key|private[-_]?key|access[-_]?token|auth[-_]?token"
                r"|token|secret|password|passwd|passphrase|credentials?)")
_URL_QUERY = re.compile(r"(?P<pre>[?&](?:[\w-]*[_-])?(?:" + _SECRET_TAIL + r"|key|sig|signature)=)(?P<val>[^&\s\"'#]+)",
                        re.I)
_AUTH_HEADER = re.compile(r"(?P<pre>\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token|digest)\s+)?)(?P<val>[^\s\"',]+)", re.I)
_BEARER = re.compile(r"(?P<pre>\b(?:bearer|basic)\s+)(?P<val>[A-Za-z0-9._~+/=-]{8,})", re.I)
_SECRET_FLAG = re.compile(
    r"(?P<pre>(?<![\w-])--?(?:[\w-]*[-_])?" + _SECRET_TAIL + r"(?:\s*=\s*|\s+))(?P<val>" + _QUOTED_OR_WORD + r")", re.I)
_HFT_FLAG = re.compile(r"(?P<pre>(?<![\w-])-(?:hft|hfrt)(?:\s*=\s*|\s+))(?P<val>" + _QUOTED_OR_WORD + r")")
# Environment variables (upper case by convention): HF_TOKEN=, OPENAI_API_KEY=, AWS_SECRET_ACCESS_KEY=,
# TOKEN_2=; and lower-case assignments whose name ends with a secret word (hf_token=…, password: …).
_SECRET_ENV = re.compile(
    r"(?P<pre>(?<![\w$])(?:\$env:)?(?:[A-Z0-9]+_)*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|PASS|APIKEY)"
    r"(?:_[A-Z0-9]+)*=)(?P<val>" + _QUOTED_OR_WORD + r")")
_SECRET_ASSIGN = re.compile(
    r"(?P<pre>(?<![\w$.-])(?:[a-z0-9]+[_-])*" + _SECRET_TAIL + r"\s*[=:]\s*)"
    r"(?P<val>\"[^\"]+\"|'[^']+'|(?!\d+(?:\s|$))[^\s\"',;&]{6,})")  # not "BOS token = 1 '<s>'"
_JSON_SECRET = re.compile(
    r"(?P<pre>[\"'](?:[\w-]*[_-])?" + _SECRET_TAIL + r"[\"']\s*:\s*[\"'])(?P<val>[^\"']+)", re.I)
_TOKENS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"hf_[A-Za-z0-9]{10,}"
    r"|sk-(?:proj-|ant-|live-|test-)?[A-Za-z0-9_-]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{16,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}"
    r"|nvapi-[A-Za-z0-9_-]{16,}"
    r"|r8_[A-Za-z0-9]{20,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r")")
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])")
_HOME = re.compile(
    r"(?P<home>(?:/mnt/[a-zA-Z]/Users|[A-Za-z]:(?:\\\\|\\|/)Users|/Users|/home|/var/home|/export/home)"
    r"(?:\\\\|\\|/)(?P<name>[^\s/\\\"'<>:;,|*?]+))", re.I)
_PROMPT = re.compile(r"(?<![\w.@<>-])(?P<user>[A-Za-z_][\w.-]{0,31})@(?P<host>[A-Za-z0-9][\w.-]{0,62}):(?=[~/])")
# journalctl / syslog prefix: "Jul 07 02:07:26 gpubox ollama[1234]: ..." (the 4th field is the host)
_SYSLOG = re.compile(r"^(?P<pre>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )(?P<host>[^\s<>]+)(?= [\w.@/-]+(?:\[\d+\])?: )",
                     re.M)
_IPV4 = re.compile(r"(?<![\w.])(?P<ip>(?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3})(?![\w]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:.])(?P<ip>(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?:%[\w.]+)?)(?![\w:.])")
_VERSIONISH = re.compile(r"(?:\bv|\bversion[\s:=]*|\bver[\s:=]*|\bbuild[\s:=]*)$", re.I)
_LLAMA_TS_AFTER = re.compile(r" [IWEDT] ")
_KEEP_IPS = {"127.0.0.1", "0.0.0.0", "255.255.255.255", "::1", "::"}
_COMMON_NAMES = {
    # generic account and machine names: not identifying, and frequent words in engine logs, so
    # replacing them as bare words would corrupt the lines the analyzer reads ("host memory")
    "root", "user", "users", "admin", "administrator", "ubuntu", "debian", "fedora", "arch", "centos", "runner",
    "guest", "home", "host", "localhost", "local", "default", "nobody", "build", "test", "model", "models",
    "llama", "ollama", "vllm", "sglang", "server", "client", "main", "master", "worker", "node", "compute",
    "gpu", "cpu", "cuda", "rocm", "vulkan", "metal", "sycl", "memory", "device", "buffer", "cache", "context",
    "system", "linux", "windows", "darwin", "desktop", "laptop", "workstation", "docker", "container",
    "info", "warn", "error", "debug", "load", "none", "true", "false", "auto", "dev", "llm", "nvidia", "amd",
    "intel", "apple", "mac", "macbook", "jetson", "raspberrypi", "box", "pc", "lab", "ai", "ml", "app",
    "data", "work", "tmp", "var", "opt", "srv", "usr", "bin", "lib", "share", "root-pc", "kube", "pod",
}
_SECRET_KEY_NAME = re.compile(r"(?:^|[-_])" + _SECRET_WORD + r"(?:$|[-_])|^(?:hft|api_key|apikey|token)$", re.I)
_NOT_SECRET_KEY = re.compile(r"(?:file|path|dir|type|types|len|length|size|count|prefix|_k|_v)$", re.I)

_PLACEHOLDER = re.compile(r"^<[a-z_-]+(?:-\d+)?>$")


def is_secret_key(name: str) -> bool:
    """True when a variable / flag / JSON key name says its value is a secret (``HF_TOKEN``, ``api_key``)."""
    stripped = name.lstrip("-$").removeprefix("env:")
    return bool(_SECRET_KEY_NAME.search(stripped)) and not _NOT_SECRET_KEY.search(stripped)


class Redactor:
    """Replaces secrets and identities in strings and bundles; one instance per bundle.

    ``user_names`` and ``host_names`` are this machine's (see :meth:`for_this_machine`); names
    shorter than 3 characters or too common to be identifying ("root", "user"…) are not replaced
    as bare words (they still disappear inside home directories).
    """

    def __init__(self, user_names: Iterable[str] = (), host_names: Iterable[str] = ()):
        self.counts: Counter[str] = Counter()
        self._numbered: dict[str, dict[str, str]] = {"ip": {}, "email": {}}
        users = {u for u in user_names if u and len(u) >= 3 and u.lower() not in _COMMON_NAMES and not u.isdigit()}
        hosts = set()
        for h in host_names:
            if not h:
                continue
            hosts.add(h)
            short = h.split(".")[0]
            if short:
                hosts.add(short)
        hosts = {h for h in hosts if len(h) >= 3 and h.lower() not in _COMMON_NAMES and not h.isdigit()}
        self._user_re = _words_re(users)
        self._host_re = _words_re(hosts)

    @classmethod
    def for_this_machine(cls) -> Redactor:
        """A redactor that knows the current user name(s), home folder name and host name(s)."""
        import getpass
        import os
        import socket
        from pathlib import Path

        users: set[str] = set()
        for getter in (getpass.getuser, lambda: Path.home().name, lambda: os.environ.get("USER", ""),
                       lambda: os.environ.get("USERNAME", ""), lambda: os.environ.get("SUDO_USER", "")):
            try:
                users.add(getter())
            except Exception:  # noqa: BLE001 - no user name is fine
                pass
        hosts: set[str] = set()
        for getter in (socket.gethostname, lambda: os.environ.get("HOSTNAME", ""),
                       lambda: os.environ.get("COMPUTERNAME", "")):
            try:
                hosts.add(getter())
            except Exception:  # noqa: BLE001
                pass
        return cls(users, hosts)

    # -- strings ---------------------------------------------------------------------------------

    def _numbered_placeholder(self, kind: str, value: str) -> str:
        table = self._numbered[kind]
        if value not in table:
            table[value] = f"<{kind}-{len(table) + 1}>"
        return table[value]

    def _sub_value(self, regex: re.Pattern, kind: str, text: str, placeholder: str = "<token>") -> str:
        def repl(m: re.Match) -> str:
            val = m.group("val")
            bare = val.strip("\"'")
            if not bare or _PLACEHOLDER.match(bare) or _PLACEHOLDER.match(bare.split(">", 1)[0] + ">"):
                return m.group(0)
            self.counts[kind] += 1
            quote = val[0] if val[0] in "\"'" and val[-1:] == val[0] and len(val) > 1 else ""
            return m.group("pre") + f"{quote}{placeholder}{quote}"

        return regex.sub(repl, text)

    def redact_text(self, text: str) -> str:
        """``text`` with every secret and identity replaced (counts added to ``self.counts``)."""
        if not text:
            return text

        def creds(m: re.Match) -> str:
            if _PLACEHOLDER.match(m.group("cred")):
                return m.group(0)
            self.counts["url_credentials"] += 1
            return m.group("pre") + "<credentials>@"

        text = _URL_CREDS.sub(creds, text)
        text = self._sub_value(_URL_QUERY, "url_credentials", text)
        text = self._sub_value(_AUTH_HEADER, "authorization", text)
        text = self._sub_value(_BEARER, "authorization", text)
        text = self._sub_value(_SECRET_FLAG, "secret_flag", text)
        text = self._sub_value(_HFT_FLAG, "secret_flag", text)
        text = self._sub_value(_SECRET_ENV, "secret_env", text)
        text = self._sub_value(_JSON_SECRET, "secret_env", text)
        text = self._sub_value(_SECRET_ASSIGN, "secret_env", text)

        def token(m: re.Match) -> str:
            self.counts["token"] += 1
            return "<token>"

        text = _TOKENS.sub(token, text)

        def email(m: re.Match) -> str:
            self.counts["email"] += 1
            return self._numbered_placeholder("email", m.group(0).lower())

        text = _EMAIL.sub(email, text)

        def home(m: re.Match) -> str:
            if _PLACEHOLDER.match(m.group("name")) or m.group("name").startswith("<"):
                return m.group(0)
            self.counts["home"] += 1
            return "<home>"

        text = _HOME.sub(home, text)

        def prompt(m: re.Match) -> str:
            self.counts["user"] += 1
            self.counts["host"] += 1
            return "<user>@<host>:"

        text = _PROMPT.sub(prompt, text)

        def syslog(m: re.Match) -> str:
            self.counts["host"] += 1
            return m.group("pre") + "<host>"

        text = _SYSLOG.sub(syslog, text)
        text = self._redact_ips(text)
        if self._user_re is not None:
            text, n = self._user_re.subn("<user>", text)
            self.counts["user"] += n
        if self._host_re is not None:
            text, n = self._host_re.subn("<host>", text)
            self.counts["host"] += n
        return text

    def _redact_ips(self, text: str) -> str:
        def v4(m: re.Match) -> str:
            ip = m.group("ip")
            if ip in _KEEP_IPS or ip.startswith("127.") or _VERSIONISH.search(text[max(0, m.start() - 12):m.start()]):
                return ip
            # llama.cpp's log timestamps (M.SS.mmm.uuu then a level letter, kv-facts.md §1.1) and other
            # zero-padded dotted numbers are not addresses (an address has no leading zeros)
            if _LLAMA_TS_AFTER.match(text, m.end()) or any(len(o) > 1 and o[0] == "0" for o in ip.split(".")):
                return ip
            self.counts["ip"] += 1
            return self._numbered_placeholder("ip", ip)

        def v6(m: re.Match) -> str:
            raw = m.group("ip")
            addr = raw.split("%", 1)[0]
            if addr.count(":") < 2 or not any(c.isalnum() for c in addr):
                return raw
            try:
                parsed = ipaddress.IPv6Address(addr)
            except ValueError:
                return raw
            if parsed.is_loopback or parsed.is_unspecified:
                return raw
            if "::" not in addr and addr.count(":") < 7:
                return raw
            self.counts["ip"] += 1
            return self._numbered_placeholder("ip", parsed.compressed)

        if any(ch.isdigit() for ch in text):
            text = _IPV4.sub(v4, text)
        if ":" in text:
            text = _IPV6.sub(v6, text)
        return text

    # -- structures ------------------------------------------------------------------------------

    def redact_obj(self, obj: Any, key: str | None = None) -> Any:
        """A copy of a JSON-like value with every string redacted; values under secret keys become ``<token>``."""
        if isinstance(obj, str):
            if key is not None and is_secret_key(key) and obj and not _PLACEHOLDER.match(obj):
                self.counts["secret_env" if key.isupper() else "secret_flag"] += 1
                return "<token>"
            return self.redact_text(obj)
        if isinstance(obj, dict):
            return {k: self.redact_obj(v, k if isinstance(k, str) else None) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.redact_obj(v) for v in obj]
        if key is not None and is_secret_key(key) and isinstance(obj, (int, float)) and not isinstance(obj, bool):
            self.counts["secret_flag"] += 1
            return "<token>"
        return obj

    def redact_argv(self, argv: list[str]) -> list[str]:
        """Redact an argv: the word after a secret flag (``--api-key X``) becomes ``<token>``."""
        out: list[str] = []
        secret_next = False
        for word in argv:
            if secret_next and not word.startswith("-"):
                secret_next = False
                if not _PLACEHOLDER.match(word):
                    self.counts["secret_flag"] += 1
                    out.append("<token>")
                    continue
            secret_next = False
            if word.startswith("-") and "=" not in word and (is_secret_key(word) or word in ("-hft",)):
                secret_next = True
                out.append(word)
                continue
            if "=" in word and not word.startswith("-"):
                name, _, value = word.partition("=")
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and is_secret_key(name) and value and not _PLACEHOLDER.match(value):
                    self.counts["secret_env"] += 1
                    out.append(f"{name}=<token>")
                    continue
            out.append(self.redact_text(word))
        return out

    def redact_bundle(self, bundle: dict) -> dict:
        """A redacted copy of ``bundle`` with ``bundle["redactions"]`` = counts per kind (only kinds > 0).

        ``schema``, ``id``, ``created_at`` and ``collector`` are kept as they are; argv lists
        are redacted word by word (:meth:`redact_argv`), everything else string by string.
        """
        out: dict = {}
        for k, v in bundle.items():
            if k in ("schema", "id", "created_at", "collector", "redactions"):
                out[k] = v
            elif k == "command" and isinstance(v, dict):
                cmd = {}
                for ck, cv in v.items():
                    if ck in ("argv", "engine_argv") and isinstance(cv, list):
                        cmd[ck] = self.redact_argv([str(x) for x in cv])
                    else:
                        cmd[ck] = self.redact_obj(cv, None if ck in ("flags", "env") else ck)
                out[k] = cmd
            else:
                out[k] = self.redact_obj(v)
        previous = bundle.get("redactions") or {}
        merged = Counter({k: int(v) for k, v in previous.items() if isinstance(v, int)})
        merged.update({k: n for k, n in self.counts.items() if n})
        out["redactions"] = dict(sorted(merged.items()))
        return out


def _words_re(words: set[str]) -> re.Pattern | None:
    if not words:
        return None
    alts = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    return re.compile(r"(?<![A-Za-z0-9_<-])(?:" + alts + r")(?![A-Za-z0-9_>-])")


def find_secrets(obj: Any, kinds: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """Where ``obj`` (a bundle or any JSON value) still holds a secret or identity.

    Returns ``[(json path, kind)]`` with paths like ``command.argv[3]`` or ``log.lines[12][1]``,
    kinds from :data:`SECRET_KINDS` and ``email``/``home``/``ip`` (by default all of them; pass
    ``kinds=SECRET_KINDS`` for secrets only). Placeholders (``<token>``, ``<ip-1>``) are not
    reported. Used by the server as a second pass over uploaded bundles.
    """
    wanted = set(kinds) if kinds is not None else set(SECRET_KINDS) | {"email", "home", "ip"}
    found: list[tuple[str, str]] = []

    def visit(value: Any, path: str, key: str | None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                visit(v, f"{path}.{k}" if path else str(k), str(k))
        elif isinstance(value, (list, tuple)):
            prev = None
            for i, v in enumerate(value):
                visit(v, f"{path}[{i}]", None)
                if prev is not None and isinstance(v, str) and isinstance(prev, str) and prev.startswith("-") \
                        and "=" not in prev and (is_secret_key(prev) or prev == "-hft") \
                        and not _PLACEHOLDER.match(v) and "secret_flag" in wanted:
                    found.append((f"{path}[{i}]", "secret_flag"))
                prev = v
        elif isinstance(value, str):
            if key is not None and is_secret_key(key) and value and not _PLACEHOLDER.match(value):
                if "secret_env" in wanted:
                    found.append((path, "secret_env"))
                return
            probe = Redactor()
            probe.redact_text(value)
            for kind in sorted(k for k, n in probe.counts.items() if n and k in wanted):
                found.append((path, kind))

    visit(obj, "", None)
    return found
