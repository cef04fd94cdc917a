"""Privacy: replace secrets and identities in a bundle with placeholders, and count them per kind.

What is replaced (design.md, "Privacy"), in argv, environment, log lines, paths and every other
string of a bundle:

=================  ==========================================================  ===============
kind               what                                                        placeholder
=================  ==========================================================  ===============
url_credentials    ``scheme://user:password@host``, ``redis://:password@host``;   ``<credentials>``
                   secret query values (``?token=…``, ``&api_key=…``, ``&sig=…``);  / ``<token>``
                   ``curl``/``wget`` ``-u``/``--user``/``-U``/``--proxy-user user:pw``
authorization      ``Authorization: Bearer …`` / ``Basic …``, ``Bearer …``;    ``<token>``
                   ``Cookie:`` / ``Set-Cookie:`` values; passwords a command marks:
                   ``mysql -pPW`` (glued), ``sshpass -p PW``, ``docker``/``podman``/… ``login -p PW``
secret_flag        the value of a secret flag: ``--api-key``, ``--hf-token``/  ``<token>``
                   ``-hft``, ``--token``, ``--ssl-keyfile-password``… (the
                   flag's name is a secret name, below)
secret_env         the value of a secret name in an assignment: ``HF_TOKEN=…``, ``<token>``
                   ``OPENAI_API_KEY: …``, ``setenv GH_TOKEN …``, JSON
                   ``"api_key": "…"``, ``X-Api-Key: …``, ``hf_token='…'``
token              bare tokens: ``hf_…``, ``sk-…``/``sk-proj-…``, ``ghp_…``/   ``<token>``
                   ``gho_…``/``ghs_…``/``github_pat_…``, ``glpat-…``,
                   ``xox[abposr]-…``, ``AKIA…``, ``AIza…``, ``nvapi-…``,
                   ``r8_…``, ``gsk_…``, JWTs, PEM private-key blocks, AWS secret
                   access keys standing alone (40 characters of base64 mixing
                   upper case, lower case and digits, not starting with ``/`` nor
                   holding ``//``, with a ``/`` or ``+`` or after an ``AKIA…`` id)
email              e-mail addresses                                            ``<email-N>``
home               home directories: ``/home/x``, ``/Users/x``, ``C:\\Users\\x``,  ``<home>``
                   ``C:/Users/x``, ``/mnt/c/Users/x``, ``~x/`` (what follows is kept,
                   so model file names stay); a Windows profile name with spaces
                   (``C:\\Users\\Carol Danvers\\``), a Unix one only escaped or quoted
ip                 IPv4 and IPv6 addresses except loopback and unspecified    ``<ip-N>``
                   (``127.0.0.1``, ``0.0.0.0``, ``::1``)
user               this machine's user names (passed in), and the user of a    ``<user>``
                   shell prompt (``alice@box:~$``)
host               this machine's host names (passed in), a prompt's host,     ``<host>``
                   the host field of journalctl/syslog lines
                   (``Jul 07 02:07:26 gpubox ollama[12]: …``), and private host
                   names (:mod:`kvreport.hostnames`): a URL's host
                   (``http://gpubox:11434``), a host setting's value
                   (``OLLAMA_HOST=gpubox:11434``, ``--host gpubox``,
                   ``remote=db.acme.io``), a dotted name ending in a host TLD
                   (``gpubox.internal.acme.io``); public hosts stay
                   (``huggingface.co``, ``github.com``, ``registry.ollama.ai``…)
gpu_uuid           GPU UUIDs: NVIDIA's ``GPU-xxxxxxxx-xxxx-…`` and MIG's       ``<gpu-uuid-N>``
                   ``MIG-…`` (also cut short: ``GPU-5a1f2b3c…``), ROCm's
                   ``GPU-`` and 16 hex digits
=================  ==========================================================  ===============

**Secret names** (:func:`is_secret_key`). A name is split into words (``_``, ``-``, ``.``,
camelCase); it is a secret name when its last word (ignoring a trailing number: ``TOKEN_2``) is
TOKEN, KEY, SECRET, PASSWORD/PASSWD/PASSPHRASE, PASS/PWD, CREDENTIAL(S)/CRED(S) or PAT, or when it contains
API+KEY, ACCESS+KEY, PRIVATE+KEY, SECRET+KEY, CLIENT+SECRET, ACCESS/AUTH/REFRESH/API+TOKEN
(``AWS_ACCESS_KEY_ID``) and does not end in a word that makes it a file, path, type or size
(``api_key_file``, ``--ssl-key-file``, ``key_length``). Not secret names: words that merely contain
the word (``n_tokens``, ``max_tokens``, ``tokenizer``, ``keys``, ``kv_size``, ``type_k``,
``--max-total-tokens``), bare ``key``/``pass`` (``--override-kv KEY=…``), tokenizer tokens
(``bos_token``, ``eos_token``, ``pad_token``…) and data-structure keys (``cache_key``, ``sort_key``,
``public_key``…).

**Values that are not secrets**: empty values, placeholders (``<token>``, ``<s>``), booleans and
``None``/``null``, references (``$HF_TOKEN``, ``${X}``, ``%X%``), masks (``****``) and help-text
metavariables (``--api-key KEY``, ``--hf-token TOKEN``, ``[HF_TOKEN]``). Numbers are not secrets
under a weak name (a name whose only secret word is TOKEN or KEY, in lower case: ``token = 1``,
``"token": 5``), but they are under a strong one (``--api-key 1234``, ``DB_PASSWORD=123456``,
``HF_TOKEN=…``): people do use numeric API keys and PINs, and no fact lives under those names.

**Not addresses**: version strings (``version 10.0.0.1``, ``cudnn==9.1.0.70``,
``cuDNN 9.1.0.70``, ``libfoo-1.2.3.4``; a product name keeps a dotted quad only without a colon
and outside 192.168/16, 172.16/12, 169.254/16, 100.64/10: ``nccl: 172.16.5.4`` is an address), llama.cpp timestamps (``0.00.032.078 I``), zero-padded
numbers, PCI ids (``0000:01:00.0``), times and MACs, C++ names (``vk::Device::allocateMemory``,
IPv6-looking strings without a digit).

**Time**: every pattern is RE2 (:mod:`kvreport.linre`), linear in the text whatever it holds.

Numbered placeholders are stable within one bundle: the same address gets the same ``<ip-N>``
everywhere. The counts (replacements per kind) go to ``bundle["redactions"]``.
:func:`find_secrets` is the server's second pass: where a bundle still holds something that looks
like a secret or an identity.
"""

from __future__ import annotations

import functools
import ipaddress
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from typing import Any

from kvreport import linre
from kvreport.hostnames import HOST_TLDS, has_host_tld, is_host_setting, is_public
from kvreport.hostnames import METAVARS as _HOST_METAVARS

SECRET_KINDS = ("url_credentials", "authorization", "secret_flag", "secret_env", "token")
IDENTITY_KINDS = ("email", "home", "ip", "user", "host", "gpu_uuid")

# --- secret names ---------------------------------------------------------------------------------

_RUNS = linre.compile(r"[A-Z]+|[a-z]+|[0-9]+")
_SECRET_LAST = {"token", "key", "secret", "secrets", "password", "passwd", "passphrase", "pass", "pwd",
                "credential", "credentials", "cred", "creds", "apikey", "pat"}
_NEEDS_PREFIX = {"key", "pass", "pwd", "pat"}  # too generic alone (--override-kv KEY=…, "pass 2")
_GLUED = ("apikey", "accesskey", "privatekey", "secretkey", "accesstoken", "authtoken", "apitoken",
          "password", "passwd", "passphrase", "secret", "hftoken", "sshpass")  # one word that ends like a secret
_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("client", "secret"),
          ("access", "token"), ("auth", "token"), ("refresh", "token"), ("api", "token")}
_CONTAINS = {"apikey", "accesskey", "privatekey", "secretkey", "password", "passwd", "passphrase"}
_NOT_SECRET_TAIL = {"file", "files", "filename", "path", "paths", "dir", "directory", "env", "var", "name",
                    "names", "header", "type", "types", "length", "len", "size", "count", "prefix", "suffix",
                    "format", "fmt", "mode", "source", "location", "cmd", "command", "helper", "required",
                    "enabled", "set", "hash", "url", "uri", "keyfile", "certfile", "id_path", "stdin",
                    "stdout", "prompt"}
# "<word>_token" names of tokenizer tokens and counters: BOS/EOS/PAD tokens are vocabulary entries
_TOKENIZER_WORDS = {"bos", "eos", "pad", "unk", "sep", "cls", "mask", "eot", "eom", "eog", "fim", "pre", "suf",
                    "mid", "rep", "middle", "prefix", "suffix", "start", "end", "stop", "special", "control",
                    "image", "img", "audio", "video", "vision", "think", "next", "first", "last", "new", "max",
                    "min", "num", "n", "prompt", "gen", "output", "input", "draft", "bad", "decode", "added",
                    "sampled", "generate", "single", "tool", "boi", "eoi", "boa", "eoa", "nl", "newline", "im",
                    "default", "chat", "separator", "cur", "prev", "current", "previous", "per", "sot", "eod",
                    "bog", "pass"}
# "<word>_key" names of data-structure keys
_DATA_KEY_WORDS = {"cache", "sort", "primary", "foreign", "partition", "hash", "dict", "map", "lookup", "group",
                   "shard", "routing", "public", "pub", "row", "index", "idx", "kv", "rope", "attn", "attention",
                   "query", "value", "hot", "sub", "block", "object", "lora", "seed", "session", "idempotency",
                   "unique", "composite", "bucket", "entry", "registry", "config", "metadata", "meta", "model",
                   "layer", "tensor", "node", "cluster", "match", "dedup", "memo", "dim", "head", "short", "sk",
                   "override", "metric", "task", "job", "request", "prompt", "state", "result", "event"}
_SETTING_WORDS = {"cors", "allow", "with", "include", "use", "no", "require", "send"}
_STRONG_WORDS = {"api", "apikey", "access", "accesskey", "private", "privatekey", "secret", "secrets", "secretkey",
                 "password", "passwd", "passphrase", "pass", "pwd", "credential", "credentials", "cred", "creds",
                 "auth",
                 "authtoken", "accesstoken", "apitoken", "hf", "hftoken", "bearer", "client", "refresh", "bot",
                 "github", "gh", "gitlab", "openai", "anthropic", "huggingface", "hub", "aws", "azure", "ngrok",
                 "slack", "discord", "telegram", "pat", "ssh", "gpg", "pgp", "jwt", "oauth", "session"}


def _words(name: str) -> list[str]:
    """``HTTPServer_API-key2`` -> ``["http", "server", "api", "key", "2"]`` (camelCase, runs of capitals and digits)."""
    words: list[str] = []
    prev_end, prev_upper = -1, False
    for m in _RUNS.finditer(name):
        w = m.group()
        if prev_upper and w[0].islower() and m.start() == prev_end:  # "HTTPServer": the S starts "Server"
            upper = words.pop()
            if len(upper) > 1:
                words.append(upper[:-1])
            w = upper[-1] + w
        words.append(w)
        prev_end, prev_upper = m.end(), w.isupper()
    return [w.lower() for w in words]


@functools.lru_cache(maxsize=4096)
def secret_name_strength(name: str) -> int:
    """0 when ``name`` (a variable, flag, JSON key or header name) is not a secret name; 1 for a
    weak one (only the word TOKEN or KEY, in lower case: ``token``, ``mykey``: numbers under it are
    no secrets); 2 for a strong one (``HF_TOKEN``, ``--api-key``, ``db_password``)."""
    stripped = name.strip().strip("\"'").lstrip("-$")
    if stripped[:4].lower() == "env:":
        stripped = stripped[4:]
    words = _words(stripped)
    while words and words[-1].isdigit():  # TOKEN_2, key1
        words.pop()
    if not words or any(w.isdigit() for w in words[:1]):
        return 0
    last = words[-1]
    secret = False
    if last in _SECRET_LAST:
        prev = words[-2] if len(words) > 1 else None
        if last in _NEEDS_PREFIX and prev is None:
            secret = False
        elif last == "token" and prev in _TOKENIZER_WORDS:
            secret = False
        elif last == "key" and prev in _DATA_KEY_WORDS:
            secret = False
        elif last.startswith("cred") and prev in _SETTING_WORDS:  # --cors-credentials (a switch)
            secret = False
        else:
            secret = True
    elif any(last.endswith(g) for g in _GLUED):
        secret = True
    if not secret and last not in _NOT_SECRET_TAIL:
        joined = set(zip(words, words[1:], strict=False))
        secret = bool(joined & _PAIRS) or any(w in _CONTAINS for w in words)
    if not secret:
        return 0
    if last in ("token", "key") and not (set(words) & _STRONG_WORDS):
        letters = "".join(ch for ch in stripped if ch.isalpha())
        return 2 if letters.isupper() and len(letters) > 1 else 1
    return 2


def is_secret_key(name: str) -> bool:
    """True when a variable / flag / JSON key name says its value is a secret (``HF_TOKEN``,
    ``api_key``, ``--hf-token``), False for names that merely contain the word (``n_tokens``,
    ``api_key_file``, ``cache_type_k``); see the module docstring."""
    return secret_name_strength(name) > 0


_FLAG_WORD = linre.compile(r"--?[A-Za-z][A-Za-z0-9_-]*")


def _is_secret_flag(word: str) -> bool:
    """``--api-key``, ``-hft``…: a flag whose value is a secret."""
    if not _FLAG_WORD.fullmatch(word):
        return False
    return word.lstrip("-") in ("hft", "hfrt") or is_secret_key(word)


_METAVARS = {"key", "keys", "token", "tokens", "secret", "password", "passwd", "value", "val", "fname", "file",
             "path", "str", "string", "text", "n", "type", "type:value", "api_key", "hf_token", "api_keys", "x"}
_NON_VALUES = {"true", "false", "yes", "no", "on", "off", "none", "null", "nil", "undefined", "unset", "enabled",
               "disabled", "redacted"}
_REFERENCE = linre.compile(r"\$\{?[A-Za-z_][\w\x01]*(?::?[-=?+][^}]*)?\}?|\$\(.*\)|%[A-Za-z_][\w\x01]*%|\{\{.*\}\}"
                           r"|\$env:[\w\x01]+", "i")
_MASK_CHARS = frozenset("*xX.•…#_-")
_NUMBER = linre.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?")
# ours, tokenizer tokens (<s>, </s>, <unk>, <|eot_id|>) and documentation placeholders (<your token>, <API_KEY>)
_ANY_PLACEHOLDER = linre.compile(
    r"<(?:/?[A-Za-z]{1,4}|\|[^<>|]*\||[^<>]*(?:\s|your|token|key|secret|password|here)[^<>]*)>", "i")
_PLACEHOLDER = linre.compile(r"<(?:token|credentials|home|user|host|ip-[0-9]+|email-[0-9]+|gpu-uuid-[0-9]+)>")


def _is_mask(v: str) -> bool:
    """``****``, ``xxx``, ``…``: a masked value."""
    chars = set(v)
    return (len(v) >= 3 and chars <= _MASK_CHARS) or chars == {"*"}


def _not_a_secret(value: str, strength: int) -> bool:
    """Whether ``value`` (unquoted) under a secret name of ``strength`` is no secret (see the module docstring)."""
    v = value.strip()
    if not v or not _ANY_PLACEHOLDER.sub("", v).strip(",;:/ "):  # "<token>", "<token>,<token>"
        return True
    if v.lower() in _NON_VALUES or v.strip("[]").lower() in _METAVARS and v.strip("[]").isupper():
        return True
    if v.lower() in ("none", "null") or _REFERENCE.fullmatch(v) or _is_mask(v):
        return True
    return strength < 2 and bool(_NUMBER.fullmatch(v))


# --- patterns ---------------------------------------------------------------------------------------
#
# Every pattern here runs on untrusted text (a log line, an uploaded bundle), so every one is an RE2
# pattern (kvreport.linre): time linear in the text whatever it holds (issue 13, item 1). Python's
# look-behinds become linre's one-character ``before`` context, look-aheads its ``after`` context,
# and a look-ahead at the value of an assignment (which may be the name of the next one:
# ``log_server_r: X-Api-Key: …``) a match of the name alone, the value then read by :func:`_value_span`.

_W = r"\w\x01"  # a word character, as Python's Unicode \w (linre maps other word characters to \x01)
_NOT_WORD = r"^|[^\w\x01]"

# a value: quoted (also \"…\" inside a logged JSON string), or one word that does not end with
# punctuation (the "," after "api_key=None," is not part of it)
_VAL = linre.compile(r"\\\"[^\"\\\n]*\\\"|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'`;&]*[^\s\"'`;&,.:)\]}]")
_VAL_NO_DASH = linre.compile(r"\\\"[^\"\\\n]*\\\"|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'`;&-][^\s\"'`;&]*[^\s\"'`;&,.:)\]}]"
                             r"|[^\s\"'`;&,.:)\]}-]")
_VAL_RUN = linre.compile(r"[^\s\"'`;&]*")
_QUERY_VAL = linre.compile(r"[^&\s\"'#<>]+")
_VAL_CAP = 4096  # a value is judged on its first 4 KiB (a longer one that is replaced is replaced whole)
_WRAP = r"(?P<wrap>Some\(|SecretStr\(|\[|\()?"

_URL_CREDS = linre.compile(r"(?P<pre>[a-zA-Z][a-zA-Z0-9+.-]*://)"
                           r"(?P<cred>[^\s/@:<>\"']+:[^\s/@<>\"']*|:[^\s/@<>\"']+|[^\s/@:<>\"']{8,})@", before=_NOT_WORD)
_URL_QUERY = linre.compile(r"(?P<pre>[?&;](?P<name>[A-Za-z0-9_.-]+)=)")
_URL_QUERY_NAMES = {"key", "sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
                    "auth", "access_token", "token", "code", "password", "pwd", "apikey", "secret"}
_AUTH_HEADER = linre.compile(r"(?P<pre>(?:proxy-)?authorization\\?[\"']?\s*[:=]\s*\\?[\"']?"
                             r"(?:(?:bearer|basic|token|digest|negotiate)\s+)?)(?P<val>[^\s\"',\\]+)", "i",
                             before=_NOT_WORD)
# Cookie: / Set-Cookie: headers (also "Cookie": "…" in JSON): the whole value, up to a quote or the line's end
_COOKIE = linre.compile(r"(?P<pre>(?:set-)?cookie2?\\?[\"']?[ \t]*:[ \t]*\\?[\"']?)(?P<val>[^\n\"'\\]+)", "i",
                        before=r"^|[^\w\x01-]")
_PLAIN_WORD = linre.compile(r"[A-Za-z][a-z]*")
_BEARER = linre.compile(r"(?P<pre>(?:[Bb]earer|BEARER|Basic)\s+)(?P<val>[A-Za-z0-9._~+/=-]{8,})", before=_NOT_WORD)
_FLAG = linre.compile(r"(?P<pre>--?(?P<name>[A-Za-z][A-Za-z0-9_-]*)(?:[ \t]*=[ \t]*|[ \t]+)" + _WRAP + ")",
                      before=r"^|[^\w\x01-]")
_NAME_Q = r"(?P<q>\\?[\"'])?(?:\$env:)?(?P<name>[A-Za-z_][A-Za-z0-9_-]*)(?P<q2>\\?[\"'])?"
_ASSIGN_BEFORE = r"^|[^\w\x01$.@/\\]"
_ASSIGN = linre.compile(r"(?P<pre>" + _NAME_Q + r"[ \t]*(?P<sep>[=:])[ \t]*" + _WRAP + ")", "i", before=_ASSIGN_BEFORE)
# a list under a secret name: vLLM's Namespace(api_key=['k1', 'k2']), JSON "api_key": ["k1", "k2"]
_ASSIGN_LIST = linre.compile(_NAME_Q + r"[ \t]*[=:][ \t]*\[(?P<items>[^\[\]\n]*)\]", before=_ASSIGN_BEFORE)
_LIST_ITEM = linre.compile(r"(?P<val>\\\"[^\"\\\n]*\\\"|\"[^\"\n]*\"|'[^'\n]*'|[^\s,\"']+)")
_SPACE_ASSIGN = linre.compile(
    r"(?P<pre>(?:setenv|set(?:[ \t]+-[A-Za-z]+)*|ENV|ARG)[ \t]+(?P<name>[A-Za-z_][A-Za-z0-9_]*)[ \t]+)", "m",
    before=_NOT_WORD)
_SECRET_HINT = linre.compile(r"token|key|secret|pass|pwd|cred|pat|-hf", "i")
_ENV_NAME = linre.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Passwords that only the command around them marks (issue 13, item 9). A command's words are
# skipped lazily up to the flag, never across a pipe, ";" or "&" (so "docker login … && docker run -p
# 8080:80" keeps its port).
_CMD_VAL = r"(?P<val>\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'`;&|]+)"
_CMD_WORDS = r"(?:[ \t]+[^\s|;&]+)*?[ \t]+"
_PROGRAM_BEFORE = r"^|[^\w\x01.-]"
# curl/wget -u/--user/-U/--proxy-user user:password (a value without ":" makes curl ask for the password)
_CURL_USER = linre.compile(r"(?:curl|wget)" + _CMD_WORDS + r"(?:-[uU][ \t]*|--(?:proxy-)?user(?:[ \t]*=[ \t]*|[ \t]+))"
                           + _CMD_VAL, before=_PROGRAM_BEFORE)
# mysql -pPASSWORD (glued: "-p PASSWORD" makes mysql ask, and PASSWORD is the database)
_MYSQL_P = linre.compile(r"(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlcheck|mysqlsh|mysqlpump|mysqlslap|mariadb"
                         r"|mariadb-dump|mariadb-admin)" + _CMD_WORDS + r"-p" + _CMD_VAL, before=_PROGRAM_BEFORE)
# sshpass -p PASSWORD / -pPASSWORD, among sshpass's own options only (ssh's "-p 2222" after it is a port)
_SSHPASS_P = linre.compile(r"sshpass(?:[ \t]+-[A-Za-oq-z][^\s|;&]*)*[ \t]+-p[ \t]*" + _CMD_VAL, before=_PROGRAM_BEFORE)
# docker/podman/… login -p PASSWORD (--password is a secret flag already)
_LOGIN_P = linre.compile(r"(?:docker|podman|nerdctl|buildah|skopeo|oras|helm)" + _CMD_WORDS + r"login" + _CMD_WORDS
                         + r"-p(?:[ \t]*=[ \t]*|[ \t]*)" + _CMD_VAL, before=_PROGRAM_BEFORE)
_CMD_HINT = linre.compile(r"curl|wget|mysql|mariadb|sshpass|login", "i")
_CMD_WORDS_HINT = ("curl", "wget", "mysql", "mariadb", "sshpass", "login")
_SECRET_WORDS_HINT = ("token", "key", "secret", "pass", "pwd", "cred", "pat", "-hf")
# _AWS_SECRET's run of 40 characters of [A-Za-z0-9/+], as a gate without a pattern: the stand-in bytes
# the patterns read, those characters mapped to "a" and every other byte to " ", hold 40 "a" in a row
_AWS_CLASS = bytes(ord("a") if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "/+") else ord(" ")
                   for b in range(256))
_AWS_RUN = b"a" * 40


def _aws_run(text: str) -> bool:
    return _AWS_RUN in linre._subject(text).data.translate(_AWS_CLASS)  # the Subject _AWS_SECRET reuses


def _hinted(text: str, words: tuple[str, ...], regex: linre.Pattern) -> bool:
    """``regex.search(text)`` for a case-insensitive alternation of ``words``, as substring tests
    when the text is ASCII (RE2's case folding there is ``str.lower``'s); the pattern otherwise."""
    if text.isascii():
        low = text.lower()
        return any(w in low for w in words)
    return regex.search(text) is not None

_TOKENS = linre.compile(
    r"hf_[A-Za-z0-9]{10,}"
    r"|sk-(?:proj-|ant-|live-|test-|svcacct-|admin-)?[A-Za-z0-9_-]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{16,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|nvapi-[A-Za-z0-9_-]{16,}"
    r"|r8_[A-Za-z0-9]{20,}"
    r"|gsk_[A-Za-z0-9]{20,}"
    r"|pplx-[A-Za-z0-9]{20,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", before=r"^|[^A-Za-z0-9]")
# every alternative of _TOKENS starts with one of these (its gate in Redactor.redact_secrets)
_TOKEN_PREFIXES = ("hf_", "sk-", "gh", "glpat-", "xox", "AKIA", "ASIA", "AIza", "nvapi-", "r8_", "gsk_", "pplx-",
                   "eyJ")
_AWS_KEY_ID = linre.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}", before=r"^|[^A-Za-z0-9]", after=r"$|[^A-Za-z0-9]")
# an AWS secret access key: 40 characters of base64 standing alone (see _aws_secret)
_AWS_SECRET = linre.compile(r"[A-Za-z0-9/+]{40}", before=r"^|[^A-Za-z0-9/+=_.-]",
                            after=r"$|\.(?:$|[^A-Za-z0-9])|[^A-Za-z0-9/+=_.-]")
_PEM_BEGIN = linre.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = linre.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_EMAIL = linre.compile(r"[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?P<tld>[A-Za-z]{2,})",
                       before=r"^|[^\w\x01.+-]", after=r"$|[^\w\x01-]")
_FILE_TLDS = {"gguf", "bin", "safetensors", "png", "jpg", "jpeg", "gif", "webp", "json", "txt", "log", "yaml", "yml",
              "py", "cpp", "cc", "hpp", "cu", "so", "dll", "dylib", "exe", "md", "pt", "pth", "onnx", "ggml", "zip",
              "gz", "tar", "whl", "sh", "js", "ts", "html", "css", "csv", "toml", "ini", "cfg", "svg", "wav", "mp3"}
_HOME_NAME_CH = r"[^\s/\\\"'<>:;,|*?]"
_HOME = linre.compile(
    r"(?P<home>(?:(?P<win>/mnt/[a-zA-Z]/Users|[A-Za-z]:(?:\\\\|\\|/)Users)|/Users|/home|/var/home|/export/home)"
    r"(?P<sep>\\\\|\\|/)(?P<name>" + _HOME_NAME_CH + r"+))", "i")
_HOME_WORD = linre.compile(r" " + _HOME_NAME_CH + "+")            # one more word of a Windows profile name
_HOME_ESCAPED = linre.compile(r"(?:\\ " + _HOME_NAME_CH + "+)+")  # /home/carol\ danvers
_TILDE_HOME = linre.compile(r"~(?P<name>[A-Za-z_][A-Za-z0-9._-]{0,31})", before=r"^|[\s\"'=:(\[,;]", after=r"[/\\]")
_PROMPT = linre.compile(r"(?P<user>[A-Za-z_][\w\x01.-]{0,31})@(?P<host>[A-Za-z0-9][\w\x01.-]{0,62}):",
                        before=r"^|[^\w\x01.@<>-]", after=r"[~/]")
# journalctl / syslog prefix: "Jul 07 02:07:26 gpubox ollama[1234]: ..." (the 4th field is the host)
_SYSLOG = linre.compile(r"^(?P<pre>[A-Z][a-z]{2} [ 0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9] )(?P<host>[^\s<>]+)", "m",
                        after=r" [\w\x01.@/-]+(?:\[[0-9]+\])?: ")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])"
_IPV4 = linre.compile(r"(?P<ip>" + _OCTET + r"(?:\." + _OCTET + r"){3})",
                      before=r"^|[^\w\x01.-]|(?:^|[^A-Za-z0-9])-",
                      after=r"$|[^\w\x01.+~-]|\.(?:$|[^0-9\x01])|[-+~](?:$|[^\w\x01])")
_IPV6 = linre.compile(r"(?P<ip>(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?:%[\w\x01.]+)?)",
                      before=r"^|[^\w\x01:.]", after=r"$|[^\w\x01:.]")
# What precedes a dotted version that looks like an address, in the 24 characters before it.
# A word that says "version" keeps any dotted quad ("version 10.0.0.1", "cudnn==9.1.0.70",
# "Driver Version: 10.0.0.1"). A product name keeps it only with a space or "=" between them
# ("cuDNN 9.1.0.70", "TensorRT 10.0.1.6"), never after a colon ("nccl: 172.16.5.4",
# "driver: 192.168.7.7" are how tools print an address), and never when the quad is in a private
# or link-local range other than 10/8 (192.168/16, 172.16/12, 169.254/16, 100.64/10).
_VERSION_WORD = linre.compile(r"(?:\bv|version|\bver|\bbuild|\brelease|\brev|==|>=|<=|~=|!=)[\s:=(\[]*$", "i")
_PRODUCT_WORD = linre.compile(
    r"(?:driver|\bfirmware|\bfw|\bvbios|\bbios|\bcudnn|\bcuda|\bcublas|\bnccl|\btensorrt|\btrt|\brocm|\bhip"
    r"|\bopenvino|\boneapi|\bopencl|\bvulkan|\btorch|\bpython|\bsdk|\bpackage|\bkernel|\blibrary|\bruntime|\bnvcc"
    # the engines and their libraries, whose four-part versions look like addresses (vLLM 0.10.1.1, 0.9.0.1)
    r"|\bvllm|\bsglang|\blmdeploy|\bollama|\btransformers|\bflashinfer|\bxformers|\btriton)"
    r"[\s=(\[]*$", "i")


def _dotted_version(value: str) -> bool:
    """A version as engines write it in a version field: 0.10.1.1, 2.4.0, v0.8.5.post1 (two to five dotted numbers,
    the last one may carry a suffix), no address notation (no ":" or "/")."""
    parts = value.strip().removeprefix("v").split(".")
    if not 2 <= len(parts) <= 5 or not all(p.isdigit() and len(p) <= 6 for p in parts[:-1]):
        return False
    head = parts[-1][: len(parts[-1]) - len(parts[-1].lstrip("0123456789"))]
    return bool(head) and not any(c in parts[-1] for c in ":/")


_PRIVATE_NETS = tuple(ipaddress.ip_network(n) for n in ("192.168.0.0/16", "172.16.0.0/12", "169.254.0.0/16",
                                                        "100.64.0.0/10"))
# Host names (kvreport.hostnames). A name is the whole dotted run: it neither starts after a word
# character, "." or "-" nor ends before one (nor before "(": ``x.to(device)`` is a call), so a part of
# ``vllm.engine.llm_engine`` or ``libggml-cuda.so.1`` is never one. A path component (after "/") is no
# host, but the one after "//" is, and so is a UNC path's (``\\fs.corp.acme.com\share``), and one after
# a URL-encoded "/" or "@" (``?url=https%3A%2F%2Fdb.acme.io``).
# Labels are not bounded to 63 characters here: counted repetitions make RE2's automaton large and slow, and
# a longer "label" is no more identifying. The TLD alternation keeps the candidates to real host-like names.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
_HOST_END = r"$|[^\w\x01.(-]|\.(?:$|[^\w\x01-])"
_TLD_ALT = "|".join(sorted(HOST_TLDS, key=lambda t: (-len(t), t)))
_FQDN = linre.compile(r"(?P<host>" + _LABEL + r"(?:\." + _LABEL + r")*\.(?i:" + _TLD_ALT + "))",
                      before=r"^|[^\w\x01./\\%-]|//|\\\\|%2[Ff]|%40", after=_HOST_END)
# a URL's host, after the scheme and any user info (``https://<credentials>@proxy.acme.io:3128/``)
_URL_HOST = linre.compile(r"(?P<pre>[A-Za-z][A-Za-z0-9+.-]*://(?:[^\s/@\"'`]*@)?)(?P<host>" + _HOST_NAME + ")",
                          before=_NOT_WORD, after=_HOST_END)
# the value of a setting (``OLLAMA_HOST=``, ``"host": "``, ``--host ``, ``remote=``) whose name says it is a host
# (the name ends in one of these words; kvreport.hostnames.is_host_setting judges it)
_HOST_WORD = r"(?i:host|hostname|addr|remote)"
_HOST_SETTING = linre.compile(
    r"(?P<pre>(?:--(?P<flag>(?:[A-Za-z][A-Za-z0-9_-]*)?" + _HOST_WORD + r")(?:[ \t]*=[ \t]*|[ \t]+)"
    r"|(?P<name>(?:[A-Za-z_][A-Za-z0-9_]*)?" + _HOST_WORD + r")[\"']?[ \t]*[=:][ \t]*)[\"']?)"
    r"(?P<host>" + _HOST_NAME + ")",
    before=r"^|[^\w\x01-]", after=_HOST_END)
_HOST_VALUE = linre.compile(r"(?P<pre>[\"']?)(?P<host>" + _HOST_NAME + ")", after=_HOST_END)
_HOST_HINT = linre.compile(r"host|addr|remote", "i")
_HEX = linre.compile(r"[0-9a-f]+")
_HOST_WORDS_HINT = ("host", "addr", "remote")
# NVIDIA GPU and MIG UUIDs (nvidia-smi -L, CUDA_VISIBLE_DEVICES, Ollama's id=GPU-…), whole or cut short,
# and ROCm's GPU-<16 hex digits>
_GPU_UUID = linre.compile(r"(?:MIG-(?:GPU-)?|GPU-)[0-9A-Fa-f]{8}(?:[0-9A-Fa-f]{8})?(?:-[0-9A-Fa-f]{1,12}){0,4}",
                          before=r"^|[^\w\x01-]", after=r"$|[^\w\x01]")
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


def _looks_random(body: str) -> bool:
    """A token body that is not one ordinary word (``hf_transformers`` is a module, not a token)."""
    return len(body) >= 20 or any(c.isdigit() for c in body) or not (body.islower() or body.isupper())


def _unquote(val: str) -> tuple[str, str, str]:
    """``(opening quote, bare value, closing quote)``."""
    for q in ('\\"', '"', "'"):
        if len(val) >= 2 * len(q) and val.startswith(q) and val.endswith(q):
            return q, val[len(q):-len(q)], q
    return "", val, ""


def _quotes_pair(m: linre.Match) -> bool:
    """A quoted name ends with the quote it opened with (``"api_key":``); an opening quote alone
    leaves the name unquoted (``"api_key=…``); a closing one alone is no name."""
    q, q2 = m.group("q"), m.group("q2")
    return q2 is None or q == q2


def _assign_strength(m: linre.Match) -> int:
    """The strength of an ``_ASSIGN`` match's name; 0 for ``a==b``, ``x::y``, ``http://``."""
    if not _quotes_pair(m):
        return 0
    sep, after = m.group("sep"), m.string[m.end("sep"):m.end("sep") + 1]
    if (sep == "=" and after == "=") or (sep == ":" and after in (":", "/") and after):
        return 0
    return secret_name_strength(m.group("name"))


def _curl_user_strength(m: linre.Match) -> int:
    """``-u user:password`` is a secret; ``-u user`` (curl asks for the password) is not."""
    _user, colon, password = _unquote(m.group("val"))[1].partition(":")
    return 2 if colon and password and not _not_a_secret(password, 2) else 0


def _value_span(subj: linre.Subject, pos: int, regex: linre.Pattern) -> tuple[int, int] | None:
    """The span of the value that starts at ``pos`` (a bare one read up to ``_VAL_CAP`` characters)."""
    n = len(subj)
    end = min(n, pos + _VAL_CAP)
    m = regex.match(subj, pos, end)
    if end < n and subj.text[pos:pos + 1] in ("\"", "'", "\\") and (m is None or m.end() == end):
        m = regex.match(subj, pos)  # a quoted value longer than the window: up to its closing quote
    return None if m is None else m.span()


def _wrapped_value(subj: linre.Subject, m: linre.Match, regex: linre.Pattern) -> tuple[int, int] | None:
    """The value after ``m``'s ``pre``; inside ``Some(``/``[``/``(`` when it wraps one, else the wrapper onward."""
    span = _value_span(subj, m.end("pre"), regex)
    if span is None and m.start("wrap") >= 0:
        span = _value_span(subj, m.start("wrap"), regex)
    return span


def _trimmed_val(subj: linre.Subject, m: linre.Match) -> tuple[int, int]:
    start, end = m.span("val")
    while end > start and subj.text[end - 1] in " \t\r":
        end -= 1
    return start, end


def _bare_value_end(subj: linre.Subject, start: int, end: int) -> int:
    """Where a bare value judged on its first ``_VAL_CAP`` characters really ends."""
    run_end = _VAL_RUN.match(subj, start).end()
    while run_end > end and subj.text[run_end - 1] in ",.:)]}":
        run_end -= 1
    return max(end, run_end)


def _aws_secret(m: linre.Match, key_id_at: int | None) -> bool:
    """Whether a 40-character base64 word (``_AWS_SECRET``) is an AWS secret access key.

    It must mix upper case, lower case and digits (so no hex digest: a SHA-1 is 40 lower-case hex
    digits), not start with ``/`` nor hold ``//`` (paths), and either hold ``/`` or ``+`` (as three
    in four random keys do) or follow an AWS access key id (``AKIA…``/``ASIA…``) in the same text.
    Under a secret name (``aws_secret_access_key = …``) any value is replaced anyway.
    """
    v = m.group()
    if not (any(c.isupper() for c in v) and any(c.islower() for c in v) and any(c.isdigit() for c in v)):
        return False
    if v.startswith("/") or "//" in v:
        return False
    return "/" in v or "+" in v or (key_id_at is not None and key_id_at < m.start())


def _spaced_name_end(subj: linre.Subject, end: int, quote: str, windows: bool) -> int:
    """The end of a home folder's name that may go on with up to three more words after spaces."""
    text = subj.text
    best = pos = end
    for _ in range(3):
        word = _HOME_WORD.match(subj, pos)
        if word is None:
            break
        pos = word.end()
        following = text[pos:pos + 1]
        if following in ("\\", "/") or (quote and following == quote) or (windows and following == ">"):
            best = pos
    return best


def _version_before(text: str, start: int, ip: str) -> bool:
    """Whether the dotted quad at ``start`` is a version by the words before it (see _VERSION_WORD)."""
    window = text[max(0, start - 24):start]
    if _VERSION_WORD.search(window):
        return True
    if _PRODUCT_WORD.search(window):
        addr = ipaddress.IPv4Address(ip)
        return not any(addr in net for net in _PRIVATE_NETS)
    return False


def _private_authority(host: str) -> bool:
    """Whether the host of a URL or of a host setting is a private name (not an address, not public, not generic)."""
    name = host.rstrip(".")
    if not any(c.isalpha() for c in name) or name.lower() in _COMMON_NAMES or is_public(name):
        return False
    return True


def _private_dotted(host: str) -> bool:
    """Whether a dotted name found anywhere is a private host: a host TLD, a letter before it (``0.6.4.dev`` is a
    version), not public."""
    labels = host.rstrip(".").split(".")
    return has_host_tld(host) and any(c.isalpha() for label in labels[:-1] for c in label) and not is_public(host)


def _private_setting_value(host: str) -> bool:
    """A host setting's value is a private name: not a word that stands for one (``host:port``), not a number
    (``addr=0x215603fc8``, a Go panic's address)."""
    low = host.lower()
    if len(host) < 2 or low in _NON_VALUES or low in _HOST_METAVARS or (low.startswith("0x") and _HEX.fullmatch(low[2:])):
        return False
    return _private_authority(host)


def _private_setting(m: linre.Match, host: str) -> bool:
    """A host setting's value (``OLLAMA_HOST=gpubox``): the name says host, the value is a private name and not
    a URL's scheme (``OLLAMA_HOST:http://…``, whose host the URL rule judges)."""
    name = m.group("flag") or m.group("name")
    if not is_host_setting(_words(name)) or m.string[m.end("host"):m.end("host") + 3] == "://":
        return False
    return _private_setting_value(host)


_CURL_PROGS = {"curl", "wget"}
_MYSQL_PROGS = {"mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlcheck", "mysqlsh", "mysqlpump", "mysqlslap",
                "mariadb", "mariadb-dump", "mariadb-admin"}
_LOGIN_PROGS = {"docker", "podman", "nerdctl", "buildah", "skopeo", "oras", "helm"}
_SHELL_SEPARATORS = {"|", "||", "&&", ";", "&"}


def _program(word: str) -> str:
    base = word.replace("\\", "/").rsplit("/", 1)[-1].lower()
    return base[:-4] if base.endswith(".exe") else base


def _argv_context(argv: list[str]) -> dict[int, tuple[str, str]]:
    """Words of an argv that are passwords by the command around them (``curl -u user:pw``,
    ``mysql -pPW``, ``sshpass -p PW``, ``docker login -p PW``): ``{index: (kind, replacement)}``."""
    found: dict[int, tuple[str, str]] = {}
    prog: str | None = None
    login = skip = False
    take: tuple[str, str, bool] | None = None  # the next word is a secret: (kind, placeholder, needs user:pw)

    def secret(value: str, colon: bool) -> bool:
        bare = _unquote(value)[1]
        if colon:
            _user, sep, bare = bare.partition(":")
            if not sep:
                return False
        return bool(bare) and not _not_a_secret(bare, 2) and not _PLACEHOLDER.fullmatch(bare)

    for i, word in enumerate(argv):
        if take is not None:
            kind, placeholder, colon = take
            take = None
            if secret(word, colon):
                found[i] = (kind, placeholder)
            continue
        if skip:
            skip = False
            continue
        if word in _SHELL_SEPARATORS:
            prog, login = None, False
            continue
        name = _program(word)
        if name in _CURL_PROGS or name in _MYSQL_PROGS or name == "sshpass" or name in _LOGIN_PROGS:
            prog = "curl" if name in _CURL_PROGS else "mysql" if name in _MYSQL_PROGS else \
                "sshpass" if name == "sshpass" else "login"
            login = False
            continue
        glued = word[2:] if len(word) > 2 and word[0] == "-" and word[1] != "-" else None
        if prog == "curl":
            if word in ("-u", "-U", "--user", "--proxy-user"):
                take = ("url_credentials", "<credentials>", True)
            elif word.startswith(("--user=", "--proxy-user=")) and secret(word.partition("=")[2], True):
                found[i] = ("url_credentials", word.partition("=")[0] + "=<credentials>")
            elif word[:2] in ("-u", "-U") and glued and secret(glued, True):
                found[i] = ("url_credentials", word[:2] + "<credentials>")
        elif prog == "mysql":
            if word[:2] == "-p" and glued and secret(glued, False):
                found[i] = ("authorization", "-p<token>")
        elif prog == "sshpass":
            if word in ("-f", "-d", "-P"):
                skip = True
            elif word == "-p":
                take = ("authorization", "<token>", False)
            elif word[:2] == "-p" and glued and secret(glued, False):
                found[i] = ("authorization", "-p<token>")
            elif not word.startswith("-"):
                prog = None  # the command sshpass runs (its -p is a port)
        elif prog == "login":
            if word == "login":
                login = True
            elif login and word == "-p":
                take = ("authorization", "<token>", False)
            elif login and word[:2] == "-p" and glued:
                value = glued[1:] if glued.startswith("=") else glued
                if secret(value, False):
                    found[i] = ("authorization", "-p=<token>" if glued.startswith("=") else "-p<token>")
    return found


class Redactor:
    """Replaces secrets and identities in strings and bundles; one instance per bundle.

    ``user_names`` and ``host_names`` are this machine's (see :meth:`for_this_machine`); names
    shorter than 3 characters or too common to be identifying ("root", "user"…) are not replaced
    as bare words (they still disappear inside home directories).
    """

    def __init__(self, user_names: Iterable[str] = (), host_names: Iterable[str] = ()):
        self.counts: Counter[str] = Counter()
        self._numbered: dict[str, dict[str, str]] = {"ip": {}, "email": {}, "gpu-uuid": {}}
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

    def _sub_value(self, regex: linre.Pattern, kind: str, text: str, strength=None, value=None,
                   placeholder: str = "<token>") -> str:
        """Replace the value of each match by ``placeholder`` (quotes kept) when it is a secret. The
        patterns of assignments match the name only, so a value that is no secret can still be
        the name of the next assignment (``log_server_r: X-Api-Key: …``).

        ``strength(match) -> int`` says how strongly the match's name marks a secret (0: not at
        all, the match stays); by default every match is a strong one. ``value(subject, match)``
        gives the span of the value (``None``: there is none); by default the group ``val``.
        """
        subj = linre.Subject(text)
        out: list[str] = []
        pos = 0
        for m in regex.finditer(subj):
            if m.start() < pos:  # inside a value replaced already
                continue
            level = 2 if strength is None else strength(m)
            if not level:
                continue
            span = m.span("val") if value is None else value(subj, m)
            if span is None or span[0] < 0:
                continue
            start, end = span
            open_q, bare, close_q = _unquote(text[start:end])
            if _not_a_secret(bare, level) or bare.startswith("<home>"):
                continue
            if not open_q and end - start >= _VAL_CAP:  # judged on its start; replaced whole
                end = _bare_value_end(subj, start, end)
            self.counts[kind] += 1
            out += [text[pos:start], f"{open_q}{placeholder}{close_q}"]
            pos = end
        if not out:
            return text
        out.append(text[pos:])
        return "".join(out)

    def _redact_list(self, m: linre.Match) -> str:
        level = secret_name_strength(m.group("name")) if _quotes_pair(m) else 0
        if not level:
            return m.group(0)

        def item(im: linre.Match) -> str:
            open_q, bare, close_q = _unquote(im.group("val"))
            if _not_a_secret(bare, level):
                return im.group(0)
            self.counts["secret_env"] += 1
            return f"{open_q}<token>{close_q}"

        start, end = m.span("items")
        return m.group(0)[:start - m.start()] + _LIST_ITEM.sub(item, m.group("items")) + m.group(0)[end - m.start():]

    def redact_text(self, text: str) -> str:
        """``text`` with every secret and identity replaced (counts added to ``self.counts``)."""
        if not text:
            return text
        return self._redact_identities(self.redact_secrets(text))

    def redact_secrets(self, text: str) -> str:
        """The first half of :meth:`redact_text`: the secret kinds (:data:`SECRET_KINDS`) only.

        The identity passes (e-mail, home folders, IPs, user and host names) come after every secret
        pass and never change what a secret pass sees, so :func:`find_secrets` asked for secret kinds
        only (the server's second pass) stops here: the same findings for less work."""
        if not text:
            return text

        def creds(m: linre.Match) -> str:
            if _PLACEHOLDER.fullmatch(m.group("cred")):
                return m.group(0)
            self.counts["url_credentials"] += 1
            return m.group("pre") + "<credentials>@"

        # Literal gates: a pattern runs only when the text holds a literal every match of it must
        # hold ("@" for credentials in a URL, "authorization", "cookie", "bearer"/"basic", a token's
        # prefix, 40 characters for an AWS secret). Replacements only put placeholders ("<token>",
        # "<credentials>@") in, which never make such a literal, so the gates of the text as it came
        # in stay exact: a skipped pattern could not have matched. Most log lines skip them all.
        low = text.lower()
        if "@" in text:
            text = _URL_CREDS.sub(creds, text)
        if "=" in text and ("?" in text or "&" in text or ";" in text):  # (_URL_QUERY: [?&;]name=)
            text = self._sub_value(_URL_QUERY, "url_credentials", text, lambda m: 2 if (
                m.group("name").lower() in _URL_QUERY_NAMES or is_secret_key(m.group("name"))) else 0,
                lambda subj, m: _value_span(subj, m.end("pre"), _QUERY_VAL))
        if "authorization" in low:
            text = self._sub_value(_AUTH_HEADER, "authorization", text)
        if "cookie" in low:
            text = self._sub_value(_COOKIE, "authorization", text, value=_trimmed_val)
        if "bearer" in low or "basic" in low:
            text = self._sub_value(_BEARER, "authorization", text,  # not "Bearer authentication"
                                   lambda m: 0 if _PLAIN_WORD.fullmatch(m.group("val")) else 2)
        if _hinted(text, _CMD_WORDS_HINT, _CMD_HINT):
            text = self._sub_value(_CURL_USER, "url_credentials", text, _curl_user_strength,
                                   placeholder="<credentials>")
            for regex in (_MYSQL_P, _SSHPASS_P, _LOGIN_P):
                text = self._sub_value(regex, "authorization", text)
        if _hinted(text, _SECRET_WORDS_HINT, _SECRET_HINT):
            text = self._sub_value(_FLAG, "secret_flag", text, lambda m: (
                2 if m.group("name") in ("hft", "hfrt") else secret_name_strength(m.group("name"))),
                lambda subj, m: _wrapped_value(subj, m, _VAL_NO_DASH))
            text = self._sub_value(_SPACE_ASSIGN, "secret_env", text, lambda m: secret_name_strength(m.group("name")),
                                   lambda subj, m: _value_span(subj, m.end("pre"), _VAL_NO_DASH))
            if "[" in text:
                text = _ASSIGN_LIST.sub(self._redact_list, text)
            text = self._sub_value(_ASSIGN, "secret_env", text, _assign_strength,
                                   lambda subj, m: _wrapped_value(subj, m, _VAL))

        def aws_secret(m: linre.Match) -> str:
            if not _aws_secret(m, key_id_at):
                return m.group(0)
            self.counts["token"] += 1
            return "<token>"

        if len(text) >= 40 and _aws_run(text):
            key_id = _AWS_KEY_ID.search(text) if "AKIA" in text or "ASIA" in text else None
            key_id_at = key_id.start() if key_id else None
            text = _AWS_SECRET.sub(aws_secret, text)

        def token(m: linre.Match) -> str:
            value = m.group(0)
            if value.startswith("hf_") and not _looks_random(value[3:]):
                return value
            self.counts["token"] += 1
            return "<token>"

        if any(prefix in text for prefix in _TOKEN_PREFIXES):
            text = _TOKENS.sub(token, text)
        if "-----BEGIN" in text:
            text = self._redact_pem(text)
        return text

    def _redact_identities(self, text: str) -> str:
        """The second half of :meth:`redact_text`: e-mail addresses, home folders, prompts, syslog
        hosts, IP addresses, the user and host names."""

        def email(m: linre.Match) -> str:
            if m.group("tld").lower() in _FILE_TLDS or m.group(0).startswith(("git@", "hg@")):
                return m.group(0)
            self.counts["email"] += 1
            return self._numbered_placeholder("email", m.group(0).lower())

        if "@" in text:
            text = _EMAIL.sub(email, text)
        text = self._redact_homes(text)

        def prompt(m: linre.Match) -> str:
            self.counts["user"] += 1
            self.counts["host"] += 1
            return "<user>@<host>:"

        if "@" in text:
            text = _PROMPT.sub(prompt, text)

        def syslog(m: linre.Match) -> str:
            self.counts["host"] += 1
            return m.group("pre") + "<host>"

        text = _SYSLOG.sub(syslog, text)
        text = self._redact_ips(text)
        if "GPU-" in text or "MIG-" in text:
            text = _GPU_UUID.sub(self._gpu_uuid, text)
        text = self._redact_host_names(text)
        for regex, kind in ((self._user_re, "user"), (self._host_re, "host")):
            if regex is not None:
                text, n = _sub_words(regex, text, kind)
                self.counts[kind] += n
        return text

    def _gpu_uuid(self, m: linre.Match) -> str:
        self.counts["gpu_uuid"] += 1
        key = m.group().lower()
        return self._numbered_placeholder("gpu-uuid", key[4:] if key.startswith("mig-gpu-") else key)  # its GPU's

    def _sub_host(self, regex: linre.Pattern, text: str, private) -> str:
        """The group ``host`` of each match of ``regex`` replaced by ``<host>`` where ``private(match, host)``."""

        def repl(m: linre.Match) -> str:
            host = m.group("host")
            if not private(m, host):
                return m.group(0)
            self.counts["host"] += 1
            whole, start = m.group(0), m.start()
            return whole[:m.start("host") - start] + "<host>" + whole[m.end("host") - start:]

        return regex.sub(repl, text)

    def _redact_host_names(self, text: str) -> str:
        """Private host names (:mod:`kvreport.hostnames`): URL hosts, host settings' values, dotted names."""
        if "://" in text:
            text = self._sub_host(_URL_HOST, text, lambda m, host: _private_authority(host))
        if _hinted(text, _HOST_WORDS_HINT, _HOST_HINT):
            text = self._sub_host(_HOST_SETTING, text, _private_setting)
        if "." in text:
            text = self._sub_host(_FQDN, text, lambda m, host: _private_dotted(host))
        return text

    def redact_host_value(self, value: str) -> str:
        """The value of a host setting (``gpubox:11434``, ``db.acme.io``), its host replaced when private."""
        m = _HOST_VALUE.match(value)
        if m is None or value[m.end("host"):m.end("host") + 3] == "://" or not _private_setting_value(m.group("host")):
            return value
        self.counts["host"] += 1
        return value[:m.start("host")] + "<host>" + value[m.end("host"):]

    def _redact_pem(self, text: str) -> str:
        """PEM private-key blocks: from ``-----BEGIN … PRIVATE KEY-----`` to the next ``-----END …-----``
        (the header alone when no end follows)."""
        subj = linre.Subject(text)
        ends = [(m.start(), m.end()) for m in _PEM_END.finditer(subj)]
        starts = [s for s, _e in ends]
        out: list[str] = []
        pos = 0
        for m in _PEM_BEGIN.finditer(subj):
            if m.start() < pos:
                continue
            i = bisect_left(starts, m.end())
            end = ends[i][1] if i < len(ends) else m.end()
            out += [text[pos:m.start()], "<token>"]
            self.counts["token"] += 1
            pos = end
        if not out:
            return text
        out.append(text[pos:])
        return "".join(out)

    def _redact_homes(self, text: str) -> str:
        """Home folders (``/home/x``, ``C:\\Users\\Carol Danvers``, ``~carol/``) become ``<home>``.

        A Windows profile name may hold spaces (up to four words) when a path separator, ``>``
        (a PowerShell prompt) or a quote follows it; a Unix one only when its spaces are escaped
        (``/home/carol\\ danvers/``) or the path is quoted (``"/home/carol danvers/m.gguf"``): a
        space in an unquoted Unix path separates arguments."""
        subj = linre.Subject(text)
        out: list[str] = []
        pos = 0
        for m in _HOME.finditer(subj):
            name = m.group("name")
            if m.start() < pos:
                continue
            if _PLACEHOLDER.fullmatch(name) or name.startswith("<"):
                continue
            end = m.end()
            quote = text[m.start() - 1] if m.start() and text[m.start() - 1] in "\"'" else ""
            if m.group("win") is not None or m.group("sep") != "/" or quote:
                end = _spaced_name_end(subj, end, quote, windows=not quote or m.group("win") is not None)
            else:
                escaped = _HOME_ESCAPED.match(subj, end)
                if escaped is not None:
                    end = escaped.end()
            self.counts["home"] += 1
            out += [text[pos:m.start()], "<home>"]
            pos = end
        if out:
            out.append(text[pos:])
            text = "".join(out)
        if "~" in text:

            def tilde(m: linre.Match) -> str:
                self.counts["home"] += 1
                return "<home>"

            text = _TILDE_HOME.sub(tilde, text)
        return text

    def _redact_ips(self, text: str) -> str:
        def v4(m: linre.Match) -> str:
            ip = m.group("ip")
            if ip in _KEEP_IPS or ip.startswith("127.") or _version_before(text, m.start(), ip):
                return ip
            # llama.cpp's log timestamps (M.SS.mmm.uuu then a level letter, kv-facts.md §1.1) and other
            # zero-padded dotted numbers are not addresses (an address has no leading zeros)
            after = text[m.end():m.end() + 3]
            if (len(after) == 3 and after[0] == after[2] == " " and after[1] in "IWEDT") \
                    or any(len(o) > 1 and o[0] == "0" for o in ip.split(".")):
                return ip
            self.counts["ip"] += 1
            return self._numbered_placeholder("ip", ip)

        def v6(m: linre.Match) -> str:
            raw = m.group("ip")
            addr = raw.split("%", 1)[0]
            if addr.count(":") < 2 or not any(c.isdigit() for c in addr):
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
        if "::" in text or text.count(":") >= 7:
            text = _IPV6.sub(v6, text)
        return text

    # -- structures ------------------------------------------------------------------------------

    def _secret_value(self, key: str, value: Any) -> bool:
        """Whether ``value`` stored under the name ``key`` is a secret to replace."""
        level = secret_name_strength(key)
        if not level or isinstance(value, bool) or value is None:
            return False
        if isinstance(value, (int, float)):
            return level >= 2
        if isinstance(value, str):
            return not _not_a_secret(_unquote(value)[1], level) and not _PLACEHOLDER.fullmatch(value)
        return False

    def redact_obj(self, obj: Any, key: str | None = None) -> Any:
        """A copy of a JSON-like value with every string redacted; values under secret keys become ``<token>``
        (also each item of a list under a secret key: vLLM's ``api_key: ["k1", "k2"]``)."""
        if key is not None and self._secret_value(key, obj):
            self.counts["secret_env" if key.isupper() else "secret_flag"] += 1
            return "<token>"
        if isinstance(obj, str):
            if key is not None and key.lower().endswith("version") and _dotted_version(obj):
                return obj  # a version field's dotted version ({"version": "0.10.1.1"}) is no address
            if key is not None and is_host_setting(_words(key)):  # {"OLLAMA_HOST": "gpubox:11434"}
                obj = self.redact_host_value(obj)
            return self.redact_text(obj)
        if isinstance(obj, dict):
            return {k: self.redact_obj(v, k if isinstance(k, str) else None) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            inherit = key if key is not None and is_secret_key(key) else None
            return [self.redact_obj(v, inherit) for v in obj]
        return obj

    def redact_argv(self, argv: list[str]) -> list[str]:
        """Redact an argv: the word after a secret flag (``--api-key X``) becomes ``<token>``,
        ``NAME=value`` words with a secret NAME keep only the name."""
        out: list[str] = []
        secret_next: str | None = None
        context = _argv_context(argv)
        for i, word in enumerate(argv):
            if i and argv[i - 1].startswith("--") and is_host_setting(_words(argv[i - 1])):  # --host gpubox
                word = self.redact_host_value(word)
            if i in context:
                kind, replacement = context[i]
                self.counts[kind] += 1
                out.append(replacement)
                secret_next = None
                continue
            if secret_next is not None and not word.startswith("-"):
                flag, secret_next = secret_next, None
                if self._secret_value(flag if flag.lstrip("-") not in ("hft", "hfrt") else "--hf-token", word):
                    self.counts["secret_flag"] += 1
                    out.append("<token>")
                    continue
                out.append(self.redact_text(word))
                continue
            secret_next = None
            if _is_secret_flag(word):
                secret_next = word
                out.append(word)
                continue
            if "=" in word and not word.startswith("-"):
                name, _, value = word.partition("=")
                if _ENV_NAME.fullmatch(name) and self._secret_value(name, value):
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


def _literal(word: str) -> str:
    """An RE2 pattern for ``word`` as linre's patterns see it (non-ASCII as its stand-in)."""
    return "".join(c if (c.isascii() and c.isalnum()) or c == "_" else f"\\x{ord(c):02x}"
                   for c in linre.shadow(word).decode("ascii"))


def _words_re(words: set[str]) -> tuple[linre.Pattern, frozenset[str]] | None:
    if not words:
        return None
    alts = "|".join(_literal(w) for w in sorted(words, key=len, reverse=True))
    return linre.compile("(?:" + alts + ")", before=r"^|[^A-Za-z0-9_<-]", after=r"$|[^A-Za-z0-9_>-]"), frozenset(words)


def _sub_words(found: tuple[linre.Pattern, frozenset[str]], text: str, kind: str) -> tuple[str, int]:
    """Replace the names of ``found`` (from :func:`_words_re`) in ``text`` by ``<kind>``."""
    regex, names = found
    n = 0

    def repl(m: linre.Match) -> str:
        nonlocal n
        if m.group() not in names:  # the same stand-in, another non-ASCII letter
            return m.group()
        n += 1
        return f"<{kind}>"

    return regex.sub(repl, text), n


def find_secrets(obj: Any, kinds: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """Where ``obj`` (a bundle or any JSON value) still holds a secret or identity.

    Returns ``[(json path, kind)]`` with paths like ``command.argv[3]`` or ``log.lines[12][1]``,
    kinds from :data:`SECRET_KINDS` and ``email``/``home``/``ip`` (by default all of them; pass
    ``kinds=SECRET_KINDS`` for secrets only). Placeholders (``<token>``, ``<ip-1>``), numbers under
    weak names (``"n_tokens": 512``, ``token = 1``) and the other non-secret values of the module
    docstring are not reported. Used by the server as a second pass over uploaded bundles.
    """
    wanted = set(kinds) if kinds is not None else set(SECRET_KINDS) | {"email", "home", "ip", "host", "gpu_uuid"}
    found: list[tuple[str, str]] = []
    judge = Redactor()
    probe = Redactor()  # one for every string: only its counts are read, cleared before each string
    scan = probe.redact_secrets if wanted <= set(SECRET_KINDS) else probe.redact_text

    def visit(value: Any, path: str, key: str | None) -> None:
        if key is not None and judge._secret_value(key, value):
            if "secret_env" in wanted:
                found.append((path, "secret_env"))
            return
        if isinstance(value, dict):
            for k, v in value.items():
                if not path and k == "redactions":  # the counts per kind ("url_credentials": 2)
                    continue
                visit(v, f"{path}.{k}" if path else str(k), str(k))
        elif isinstance(value, (list, tuple)):
            inherit = key if key is not None and is_secret_key(key) else None
            context = _argv_context(list(value)) if all(isinstance(v, str) for v in value) else {}
            prev = None
            for i, v in enumerate(value):
                if i in context:
                    if context[i][0] in wanted:
                        found.append((f"{path}[{i}]", context[i][0]))
                elif isinstance(v, str) and isinstance(prev, str) and _is_secret_flag(prev) and not v.startswith("-") \
                        and judge._secret_value("--hf-token" if prev.lstrip("-") in ("hft", "hfrt") else prev, v):
                    if "secret_flag" in wanted:
                        found.append((f"{path}[{i}]", "secret_flag"))
                else:
                    visit(v, f"{path}[{i}]", inherit)
                prev = v
        elif isinstance(value, str):
            probe.counts.clear()
            scan(value)
            for kind in sorted(k for k, n in probe.counts.items() if n and k in wanted):
                found.append((path, kind))

    visit(obj, "", None)
    return found
