"""Privacy: replace secrets and identities in a bundle with placeholders, and count them per kind.

What is replaced (design.md, "Privacy"), in argv, environment, log lines, paths and every other
string of a bundle:

=================  ==========================================================  ===============
kind               what                                                        placeholder
=================  ==========================================================  ===============
url_credentials    ``scheme://user:password@host``; secret query values        ``<credentials>``
                   (``?token=…``, ``&api_key=…``, ``?key=…``, ``&sig=…``)       / ``<token>``
authorization      ``Authorization: Bearer …`` / ``Basic …``, ``Bearer …``     ``<token>``
secret_flag        the value of a secret flag: ``--api-key``, ``--hf-token``/  ``<token>``
                   ``-hft``, ``--token``, ``--ssl-keyfile-password``… (the
                   flag's name is a secret name, below)
secret_env         the value of a secret name in an assignment: ``HF_TOKEN=…``, ``<token>``
                   ``OPENAI_API_KEY: …``, ``setenv GH_TOKEN …``, JSON
                   ``"api_key": "…"``, ``X-Api-Key: …``, ``hf_token='…'``
token              bare tokens: ``hf_…``, ``sk-…``/``sk-proj-…``, ``ghp_…``/   ``<token>``
                   ``gho_…``/``ghs_…``/``github_pat_…``, ``glpat-…``,
                   ``xox[abposr]-…``, ``AKIA…``, ``AIza…``, ``nvapi-…``,
                   ``r8_…``, ``gsk_…``, JWTs, PEM private-key blocks
email              e-mail addresses                                            ``<email-N>``
home               home directories: ``/home/x``, ``/Users/x``, ``C:\\Users\\x``,  ``<home>``
                   ``C:/Users/x``, ``/mnt/c/Users/x`` (what follows is kept, so
                   model file names stay)
ip                 IPv4 and IPv6 addresses except loopback and unspecified    ``<ip-N>``
                   (``127.0.0.1``, ``0.0.0.0``, ``::1``)
user               this machine's user names (passed in), and the user of a    ``<user>``
                   shell prompt (``alice@box:~$``)
host               this machine's host names (passed in), a prompt's host,     ``<host>``
                   and the host field of journalctl/syslog lines
                   (``Jul 07 02:07:26 gpubox ollama[12]: …``)
=================  ==========================================================  ===============

**Secret names** (:func:`is_secret_key`). A name is split into words (``_``, ``-``, ``.``,
camelCase); it is a secret name when its last word (ignoring a trailing number: ``TOKEN_2``) is
TOKEN, KEY, SECRET, PASSWORD/PASSWD/PASSPHRASE, PASS/PWD, CREDENTIAL(S) or PAT, or when it contains
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
``cuDNN 9.1.0.70``, ``libfoo-1.2.3.4``), llama.cpp timestamps (``0.00.032.078 I``), zero-padded
numbers, PCI ids (``0000:01:00.0``), times and MACs, C++ names (``vk::Device::allocateMemory``,
IPv6-looking strings without a digit).

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

# --- secret names ---------------------------------------------------------------------------------

_WORD_SPLIT = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_SECRET_LAST = {"token", "key", "secret", "secrets", "password", "passwd", "passphrase", "pass", "pwd",
                "credential", "credentials", "apikey", "pat"}
_NEEDS_PREFIX = {"key", "pass", "pwd", "pat"}  # too generic alone (--override-kv KEY=…, "pass 2")
_GLUED = ("apikey", "accesskey", "privatekey", "secretkey", "accesstoken", "authtoken", "apitoken",
          "password", "passwd", "passphrase", "secret", "hftoken")  # one word that ends like a secret
_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("client", "secret"),
          ("access", "token"), ("auth", "token"), ("refresh", "token"), ("api", "token")}
_CONTAINS = {"apikey", "accesskey", "privatekey", "secretkey", "password", "passwd", "passphrase"}
_NOT_SECRET_TAIL = {"file", "files", "filename", "path", "paths", "dir", "directory", "env", "var", "name",
                    "names", "header", "type", "types", "length", "len", "size", "count", "prefix", "suffix",
                    "format", "fmt", "mode", "source", "location", "cmd", "command", "helper", "required",
                    "enabled", "set", "hash", "url", "uri", "keyfile", "certfile", "id_path"}
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
                 "password", "passwd", "passphrase", "pass", "pwd", "credential", "credentials", "auth",
                 "authtoken", "accesstoken", "apitoken", "hf", "hftoken", "bearer", "client", "refresh", "bot",
                 "github", "gh", "gitlab", "openai", "anthropic", "huggingface", "hub", "aws", "azure", "ngrok",
                 "slack", "discord", "telegram", "pat", "ssh", "gpg", "pgp", "jwt", "oauth", "session"}


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.findall(name)]


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
        elif last.startswith("credential") and prev in _SETTING_WORDS:  # --cors-credentials (a switch)
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


_FLAG_WORD = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*")


def _is_secret_flag(word: str) -> bool:
    """``--api-key``, ``-hft``…: a flag whose value is a secret."""
    if not _FLAG_WORD.fullmatch(word):
        return False
    return word.lstrip("-") in ("hft", "hfrt") or is_secret_key(word)


_METAVARS = {"key", "keys", "token", "tokens", "secret", "password", "passwd", "value", "val", "fname", "file",
             "path", "str", "string", "text", "n", "type", "type:value", "api_key", "hf_token", "api_keys", "x"}
_NON_VALUES = {"true", "false", "yes", "no", "on", "off", "none", "null", "nil", "undefined", "unset", "enabled",
               "disabled", "redacted"}
_REFERENCE = re.compile(r"\$\{?[A-Za-z_]\w*(?::?[-=?+][^}]*)?\}?|\$\(.*\)|%[A-Za-z_]\w*%|\{\{.*\}\}|\$env:\w+", re.I)
_MASK = re.compile(r"[*xX.•…#_-]{3,}|\*+")
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
# ours, tokenizer tokens (<s>, </s>, <unk>, <|eot_id|>) and documentation placeholders (<your token>, <API_KEY>)
_ANY_PLACEHOLDER = re.compile(r"<(?:/?[A-Za-z]{1,4}|\|[^<>|]*\||[^<>]*(?:\s|your|token|key|secret|password|here)[^<>]*)>",
                              re.I)
_PLACEHOLDER = re.compile(r"^<(?:token|credentials|home|user|host|ip-\d+|email-\d+)>$")


def _not_a_secret(value: str, strength: int) -> bool:
    """Whether ``value`` (unquoted) under a secret name of ``strength`` is no secret (see the module docstring)."""
    v = value.strip()
    if not v or not _ANY_PLACEHOLDER.sub("", v).strip(",;:/ "):  # "<token>", "<token>,<token>"
        return True
    if v.lower() in _NON_VALUES or v.strip("[]").lower() in _METAVARS and v.strip("[]").isupper():
        return True
    if v.lower() in ("none", "null") or _REFERENCE.fullmatch(v) or _MASK.fullmatch(v):
        return True
    return strength < 2 and bool(_NUMBER.fullmatch(v))


# --- patterns ---------------------------------------------------------------------------------------

# a value: quoted (also \"…\" inside a logged JSON string), or one word that does not end with
# punctuation (the "," after "api_key=None," is not part of it)
_VAL = r"(?:\\\"[^\"\\\n]*\\\"|\"[^\"\n]*\"|'[^'\n]*'|[^\s\"'`;&]*[^\s\"'`;&,.:)\]}])"
_VAL_NO_DASH = r"(?:\\\"[^\"\\\n]*\\\"|\"[^\"\n]*\"|'[^'\n]*'|(?!-)[^\s\"'`;&]*[^\s\"'`;&,.:)\]}])"
_WRAP = r"(?:Some\(|SecretStr\(|\[|\()?"

_URL_CREDS = re.compile(r"(?P<pre>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^\s/@:<>\"']+:[^\s/@<>\"']*|[^\s/@:<>\"']{8,})@")
_URL_QUERY = re.compile(r"(?P<pre>[?&;](?P<name>[A-Za-z0-9_.-]+)=)(?=(?P<val>[^&\s\"'#<>]+))")
_URL_QUERY_NAMES = {"key", "sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
                    "auth", "access_token", "token", "code", "password", "pwd", "apikey", "secret"}
_AUTH_HEADER = re.compile(r"(?P<pre>\b(?:proxy-)?authorization\b\\?[\"']?\s*[:=]\s*\\?[\"']?"
                          r"(?:(?:bearer|basic|token|digest|negotiate)\s+)?)(?P<val>[^\s\"',\\]+)", re.I)
_PLAIN_WORD = re.compile(r"[A-Za-z][a-z]*")
_BEARER = re.compile(r"(?P<pre>\b(?:[Bb]earer|BEARER|Basic)\s+)(?P<val>[A-Za-z0-9._~+/=-]{8,})")
_FLAG = re.compile(r"(?<![\w-])(?P<pre>--?(?P<name>[A-Za-z][A-Za-z0-9_-]*)(?:[ \t]*=[ \t]*|[ \t]+)" + _WRAP + r")"
                   r"(?=(?P<val>" + _VAL_NO_DASH + r"))")
_ASSIGN = re.compile(
    r"(?<![\w$.@/\\])(?P<pre>(?P<q>\\?[\"'])?(?:\$env:)?(?P<name>[A-Za-z_][A-Za-z0-9_-]*)(?(q)(?P=q))"
    r"[ \t]*(?:=(?!=)|:(?![:/]))[ \t]*" + _WRAP + r")(?=(?P<val>" + _VAL + r"))", re.I)
# a list under a secret name: vLLM's Namespace(api_key=['k1', 'k2']), JSON "api_key": ["k1", "k2"]
_ASSIGN_LIST = re.compile(
    r"(?<![\w$.@/\\])(?P<q>\\?[\"'])?(?P<name>[A-Za-z_][A-Za-z0-9_-]*)(?(q)(?P=q))[ \t]*[=:][ \t]*"
    r"\[(?P<items>[^\[\]\n]*)\]")
_LIST_ITEM = re.compile(r"(?P<val>\\\"[^\"\\\n]*\\\"|\"[^\"\n]*\"|'[^'\n]*'|[^\s,\"']+)")
_SPACE_ASSIGN = re.compile(
    r"(?P<pre>(?:\bsetenv|\bset(?:[ \t]+-[A-Za-z]+)*|\bENV|\bARG)[ \t]+(?P<name>[A-Za-z_][A-Za-z0-9_]*)[ \t]+)"
    r"(?=(?P<val>" + _VAL_NO_DASH + r"))", re.M)
_SECRET_HINT = re.compile(r"token|key|secret|pass|pwd|credential|pat|-hf", re.I)
_TOKENS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
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
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r")")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----)?",
                  re.S)
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?P<tld>[A-Za-z]{2,})"
                    r"(?![\w-])")
_FILE_TLDS = {"gguf", "bin", "safetensors", "png", "jpg", "jpeg", "gif", "webp", "json", "txt", "log", "yaml", "yml",
              "py", "cpp", "cc", "hpp", "cu", "so", "dll", "dylib", "exe", "md", "pt", "pth", "onnx", "ggml", "zip",
              "gz", "tar", "whl", "sh", "js", "ts", "html", "css", "csv", "toml", "ini", "cfg", "svg", "wav", "mp3"}
_HOME = re.compile(
    r"(?P<home>(?:/mnt/[a-zA-Z]/Users|[A-Za-z]:(?:\\\\|\\|/)Users|/Users|/home|/var/home|/export/home)"
    r"(?:\\\\|\\|/)(?P<name>[^\s/\\\"'<>:;,|*?]+))", re.I)
_PROMPT = re.compile(r"(?<![\w.@<>-])(?P<user>[A-Za-z_][\w.-]{0,31})@(?P<host>[A-Za-z0-9][\w.-]{0,62}):(?=[~/])")
# journalctl / syslog prefix: "Jul 07 02:07:26 gpubox ollama[1234]: ..." (the 4th field is the host)
_SYSLOG = re.compile(r"^(?P<pre>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )(?P<host>[^\s<>]+)(?= [\w.@/-]+(?:\[\d+\])?: )",
                     re.M)
_IPV4 = re.compile(r"(?<![\w.])(?<![A-Za-z0-9]-)(?P<ip>(?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3})"
                   r"(?!\w|\.\d|[-+~]\w)")
_IPV6 = re.compile(r"(?<![\w:.])(?P<ip>(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?:%[\w.]+)?)(?![\w:.])")
# what precedes a dotted version that looks like an address: "version 10.0.0.1", "cudnn==9.1.0.70",
# "cuDNN 9.1.0.70", "driver: 1.2.3.4"
_VERSIONISH = re.compile(
    r"(?:\bv|version|\bver|\bbuild|\brelease|\brev|driver|\bfirmware|\bfw|\bvbios|\bbios|\bcudnn|\bcuda"
    r"|\bcublas|\bnccl|\btensorrt|\btrt|\brocm|\bhip|\bopenvino|\boneapi|\bopencl|\bvulkan|\btorch|\bpython"
    r"|\bsdk|\bpackage|\bkernel|\blibrary|\bruntime|\bnvcc|==|>=|<=|~=|!=)[\s:=(\[]*$",
    re.I)
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


def _looks_random(body: str) -> bool:
    """A token body that is not one ordinary word (``hf_transformers`` is a module, not a token)."""
    return len(body) >= 20 or any(c.isdigit() for c in body) or not (body.islower() or body.isupper())


def _unquote(val: str) -> tuple[str, str, str]:
    """``(opening quote, bare value, closing quote)``."""
    for q in ('\\"', '"', "'"):
        if len(val) >= 2 * len(q) and val.startswith(q) and val.endswith(q):
            return q, val[len(q):-len(q)], q
    return "", val, ""


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

    def _sub_value(self, regex: re.Pattern, kind: str, text: str, strength=None) -> str:
        """Replace group ``val`` of each match by ``<token>`` (quotes kept) when it is a secret. The
        patterns only look ahead at the value, so a value that is no secret can still be the name
        of the next assignment (``log_server_r: X-Api-Key: …``).

        ``strength(match) -> int`` says how strongly the match's name marks a secret (0: not at
        all, the match stays); by default every match is a strong one.
        """
        out: list[str] = []
        pos = 0
        for m in regex.finditer(text):
            if m.start() < pos:  # inside a value replaced already
                continue
            level = 2 if strength is None else strength(m)
            if not level:
                continue
            open_q, bare, close_q = _unquote(m.group("val"))
            if _not_a_secret(bare, level) or bare.startswith("<home>"):
                continue
            self.counts[kind] += 1
            start, end = m.span("val")
            out += [text[pos:start], f"{open_q}<token>{close_q}"]
            pos = end
        if not out:
            return text
        out.append(text[pos:])
        return "".join(out)

    def _redact_list(self, m: re.Match) -> str:
        level = secret_name_strength(m.group("name"))
        if not level:
            return m.group(0)

        def item(im: re.Match) -> str:
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

        def creds(m: re.Match) -> str:
            if _PLACEHOLDER.match(m.group("cred")):
                return m.group(0)
            self.counts["url_credentials"] += 1
            return m.group("pre") + "<credentials>@"

        text = _URL_CREDS.sub(creds, text)
        if "=" in text:
            text = self._sub_value(_URL_QUERY, "url_credentials", text, lambda m: 2 if (
                m.group("name").lower() in _URL_QUERY_NAMES or is_secret_key(m.group("name"))) else 0)
        text = self._sub_value(_AUTH_HEADER, "authorization", text)
        text = self._sub_value(_BEARER, "authorization", text,  # not "Bearer authentication"
                               lambda m: 0 if _PLAIN_WORD.fullmatch(m.group("val")) else 2)
        if _SECRET_HINT.search(text):
            text = self._sub_value(_FLAG, "secret_flag", text, lambda m: (
                2 if m.group("name") in ("hft", "hfrt") else secret_name_strength(m.group("name"))))
            text = self._sub_value(_SPACE_ASSIGN, "secret_env", text, lambda m: secret_name_strength(m.group("name")))
            if "[" in text:
                text = _ASSIGN_LIST.sub(self._redact_list, text)
            text = self._sub_value(_ASSIGN, "secret_env", text, lambda m: secret_name_strength(m.group("name")))

        def token(m: re.Match) -> str:
            value = m.group(0)
            if value.startswith("hf_") and not _looks_random(value[3:]):
                return value
            self.counts["token"] += 1
            return "<token>"

        text = _TOKENS.sub(token, text)
        if "-----BEGIN" in text:
            text, n = _PEM.subn("<token>", text)
            self.counts["token"] += n

        def email(m: re.Match) -> str:
            if m.group("tld").lower() in _FILE_TLDS or m.group(0).startswith(("git@", "hg@")):
                return m.group(0)
            self.counts["email"] += 1
            return self._numbered_placeholder("email", m.group(0).lower())

        if "@" in text:
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

        if "@" in text:
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
            if ip in _KEEP_IPS or ip.startswith("127.") or _VERSIONISH.search(text[max(0, m.start() - 24):m.start()]):
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
            return not _not_a_secret(_unquote(value)[1], level) and not _PLACEHOLDER.match(value)
        return False

    def redact_obj(self, obj: Any, key: str | None = None) -> Any:
        """A copy of a JSON-like value with every string redacted; values under secret keys become ``<token>``
        (also each item of a list under a secret key: vLLM's ``api_key: ["k1", "k2"]``)."""
        if key is not None and self._secret_value(key, obj):
            self.counts["secret_env" if key.isupper() else "secret_flag"] += 1
            return "<token>"
        if isinstance(obj, str):
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
        for word in argv:
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
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and self._secret_value(name, value):
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
    ``kinds=SECRET_KINDS`` for secrets only). Placeholders (``<token>``, ``<ip-1>``), numbers under
    weak names (``"n_tokens": 512``, ``token = 1``) and the other non-secret values of the module
    docstring are not reported. Used by the server as a second pass over uploaded bundles.
    """
    wanted = set(kinds) if kinds is not None else set(SECRET_KINDS) | {"email", "home", "ip"}
    found: list[tuple[str, str]] = []
    judge = Redactor()

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
            prev = None
            for i, v in enumerate(value):
                if isinstance(v, str) and isinstance(prev, str) and _is_secret_flag(prev) and not v.startswith("-") \
                        and judge._secret_value("--hf-token" if prev.lstrip("-") in ("hft", "hfrt") else prev, v):
                    if "secret_flag" in wanted:
                        found.append((f"{path}[{i}]", "secret_flag"))
                else:
                    visit(v, f"{path}[{i}]", inherit)
                prev = v
        elif isinstance(value, str):
            probe = Redactor()
            probe.redact_text(value)
            for kind in sorted(k for k, n in probe.counts.items() if n and k in wanted):
                found.append((path, kind))

    visit(obj, "", None)
    return found
