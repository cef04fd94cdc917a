"""Which host names in a bundle are private (to become ``<host>``) and which are public (kept).

A host name names a machine of the reporter's network (``gpubox.internal.acme.io``,
``db.corp.example.com``): it is identifying, like an IP address. The hosts every report talks
about (Hugging Face, GitHub, PyPI, Ollama's registry, Docker Hub, NVIDIA's sites…) are kept: they
identify no one, and a reader needs them (``-hf`` downloads, ``pip`` errors).

**Public hosts** (:data:`PUBLIC_HOSTS`): a name equal to one of them or under one of them
(``cdn-lfs.huggingface.co``, ``objects.githubusercontent.com``). Hosting suffixes under which
a label names a user or a bucket (``alice.github.io``, ``bucket.s3.amazonaws.com``,
``demo.hf.space``) are not public.

**Where a name is a host name** (the patterns live in :mod:`kvreport.redact`):

* the host of a URL (``http://gpubox:11434/``, ``https://user@db.acme.io/x``): any name, dotted
  or not;
* the value of a host setting (``OLLAMA_HOST=gpubox:11434``, ``--host gpubox``,
  ``remote=db.acme.io:5432``, ``MASTER_ADDR: node7``): any name; see :func:`is_host_setting`;
* anywhere else, a dotted name whose last label is a top-level domain of :data:`HOST_TLDS`
  (``db.acme.io``, ``gpubox.lan``, ``login.corp.example.com``). That set holds the generic TLDs
  hosts use, the country codes, and the private-use names (``local``, ``lan``, ``internal``,
  ``corp``, ``home``…), but not the country codes that are file extensions or code words in engine
  logs (``ggml-cuda.cu``, ``libggml.so``, ``convert.py``, ``model.pt``, ``Makefile.in``,
  ``x.to(device)``), nor ``.name`` (GGUF's ``general.name``).

A single word (``gpubox``) outside these places is only replaced when it is this machine's name
(:class:`kvreport.redact.Redactor`'s ``host_names``).
"""

from __future__ import annotations

PUBLIC_HOSTS = frozenset({
    "localhost", "localhost.localdomain", "host.docker.internal", "gateway.docker.internal",
    "huggingface.co", "hf.co", "huggingface.com",
    "github.com", "githubusercontent.com", "githubassets.com", "ghcr.io", "gitlab.com",
    "pypi.org", "pythonhosted.org", "python.org", "pytorch.org", "anaconda.org", "anaconda.com", "conda.io",
    "ollama.com", "ollama.ai", "registry.ollama.ai",
    "docker.io", "docker.com", "quay.io", "gcr.io", "nvcr.io",
    "nvidia.com", "ngc.nvidia.com", "amd.com", "intel.com", "apple.com", "microsoft.com",
    "modelscope.cn", "modelscope.ai",
    "openai.com", "anthropic.com", "google.com", "googleapis.com", "kaggle.com",
    "ubuntu.com", "debian.org", "archlinux.org", "fedoraproject.org",
    "crates.io", "docs.rs", "rust-lang.org", "npmjs.org", "npmjs.com", "go.dev", "golang.org",
    # mirrors and the documentation that engines and their libraries print links to
    "hf-mirror.com", "gitee.com", "vllm.ai", "sglang.ai", "lmstudio.ai", "ggml.ai", "ray.io", "apache.org",
    "readthedocs.io", "readthedocs.org", "json-schema.org", "numpy.org", "llvm.org", "kernel.org", "gnu.org",
    "mozilla.org", "mozilla.ai", "stackoverflow.com", "wikipedia.org", "aka.ms", "mistral.ai", "deepseek.com",
    "z.ai",
})

# ISO 3166 country codes (and uk, eu, ac, su) that name a country's domain...
_CCTLDS = (
    "ad ae af ag ai al ao aq ar at au aw ax az ba bb bd be bf bg bh bi bj bm bn bo br bs bt bw by bz ca cd cf cg "
    "ch ci ck cm cn co cr cv cw cx cy cz de dj dk dm do dz ec ee eg er es et eu fi fj fk fm fo fr ga gd ge gf gg gh "
    "gi gl gm gn gp gq gr gs gt gu gw gy hk hm hn hr ht hu ie il im io iq ir is it je jm jo jp ke kg kh ki km kn kp "
    "kr kw ky kz lb lc li lk lr ls lt lu lv ly ma mc me mg mh mn mp mq mr mt mu mv mw mx my mz na nc ne nf ng ni "
    "nl no np nr nu nz om pa pe pf pg ph pk pn pr pw qa re ro ru rw sa sb sc sd se sg si sk sl sm sn sr ss st su "
    "sv sx sy sz tc td tg th tj tk tl tm tn tr tt tv tw tz ua ug uk us uy uz va vc ve vg vi vn vu wf ws ye yt za "
    "zm zw"
)
# ...less those that are file extensions or code words in engine logs (not in _CCTLDS above):
#   ac am cc cl cu id in la md mk ml mm mo ms name pl pm ps pt py rs sh so tf to
#   (configure.ac, Makefile.am/.in, ggml-cuda.cu, kernel.cl, x.id, libfoo.la, README.md, rules.mk, x.ml,
#   objc .mm, gettext .mo, x.ms, perl .pl/.pm, .ps, model.pt, convert.py, .rs, run.sh, libggml.so, .tf,
#   tensor.to(device)); nor .app (macOS bundles: Terminal.app, Ollama.app)
_GENERIC_TLDS = (
    "com net org edu gov mil int info biz pro xyz dev cloud tech online site space ai "
    # private-use names of home and corporate networks (mDNS .local, RFC 8375 home.arpa, ICANN .internal)
    "local lan home internal intranet corp localdomain private arpa"
)
HOST_TLDS = frozenset((_CCTLDS + " " + _GENERIC_TLDS).split())

_HOST_WORDS = frozenset({"host", "hostname", "addr", "remote"})
# what help texts write where a host goes (``--rpc SERVERS  list of RPC servers (host:port)``)
METAVARS = frozenset({"host", "hostname", "port", "addr", "address", "ip", "name", "server", "servers", "url"})


def is_public(name: str) -> bool:
    """``name`` is, or is under, one of :data:`PUBLIC_HOSTS` (case-insensitive, a final dot ignored)."""
    labels = name.lower().rstrip(".").split(".")
    return any(".".join(labels[i:]) in PUBLIC_HOSTS for i in range(len(labels)))


def has_host_tld(name: str) -> bool:
    """The last label of a dotted ``name`` is a top-level domain of :data:`HOST_TLDS`, written in one case
    (``io``/``IO``; ``x.Io`` is a code word)."""
    tld = name.rstrip(".").rsplit(".", 1)[-1]
    return (tld.islower() or tld.isupper()) and tld.lower() in HOST_TLDS


def is_host_setting(words: list[str]) -> bool:
    """The words of a setting's name (``OLLAMA_HOST`` -> ``["ollama", "host"]``) say its value is a host:
    the last word is host, hostname, addr or remote (``MASTER_ADDR``, ``--host``, ``remote``), and it is no
    switch (``--no-host``)."""
    return bool(words) and words[-1] in _HOST_WORDS and words[0] not in ("no", "use", "enable", "disable")
