"""kvreport.redact: placeholders for secrets and identities, counts, find_secrets."""

from __future__ import annotations

import json
import string

import pytest
from helpers import minimal_bundle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvreport.bundle import validate_bundle
from kvreport.redact import Redactor, find_secrets, is_secret_key


def R():
    return Redactor(user_names=["alice"], host_names=["gpubox.lab.example.org"])


@pytest.mark.parametrize("text, expected", [
    ("-m /home/alice/models/Llama-3-8B.Q4_K_M.gguf", "-m <home>/models/Llama-3-8B.Q4_K_M.gguf"),
    ("/Users/bob/llama.cpp/build/bin/llama-server", "<home>/llama.cpp/build/bin/llama-server"),
    (r"C:\Users\Carol\Downloads\qwen.gguf", r"<home>\Downloads\qwen.gguf"),
    ("C:/Users/carol/models/x.gguf", "<home>/models/x.gguf"),
    ("/mnt/c/Users/dave/models/x.gguf", "<home>/models/x.gguf"),
    ("--api-key sk-proj-abcdefghijklmnopqrstuvwx", "--api-key <token>"),
    ("--api-key=hunter2hunter2", "--api-key=<token>"),
    ("-hft hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "-hft <token>"),
    ("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 vllm serve m", "HF_TOKEN=<token> vllm serve m"),
    ("export OPENAI_API_KEY='sk-live-0123456789abcdefghij'", "export OPENAI_API_KEY='<token>'"),
    ("Authorization: Bearer abc.def-ghi_123456", "Authorization: Bearer <token>"),
    ("token ghp_0123456789abcdefghijABCDEFGHIJ012345 in log", "token <token> in log"),
    ("https://user:s3cret@proxy.example.com:3128/", "https://<credentials>@proxy.example.com:3128/"),
    ("mail alice.smith+x@example.co.uk now", "mail <email-1> now"),
    ("listening on http://192.168.1.20:8080", "listening on http://<ip-1>:8080"),
    ("addr fe80::1ff:fe23:4567:890a%eth0 ok", "addr <ip-1> ok"),
    ("main: server is listening on 127.0.0.1:8080 and 0.0.0.0 and ::1", None),
    ("compiled on gpubox.lab.example.org by alice", "compiled on <host> by <user>"),
    ("bob@workstation-7:~/llama.cpp$ ./llama-server -c 8192", "<user>@<host>:~/llama.cpp$ ./llama-server -c 8192"),
    ("root@3f2a9c1b7d4e:/app# python3 -m vllm", "<user>@<host>:/app# python3 -m vllm"),
    ("hf_token = hunter2isbad", "hf_token = <token>"),
    ("password: letmein42", "password: <token>"),
    ("GITHUB_TOKEN=abc123def AWS_SECRET_ACCESS_KEY=xyz", "GITHUB_TOKEN=<token> AWS_SECRET_ACCESS_KEY=<token>"),
    ("--token=abc --auth-token xyz", "--token=<token> --auth-token <token>"),
    ("https://h.example.com/x?access_token=abc&max_tokens=5", "https://h.example.com/x?access_token=<token>&max_tokens=5"),
    ("Jul 07 02:07:26 tower ollama[1234]: time=2024-07-07T02:07:26.000Z level=INFO",
     "Jul 07 02:07:26 <host> ollama[1234]: time=2024-07-07T02:07:26.000Z level=INFO"),
])
def test_redact_text(text, expected):
    r = R()
    out = r.redact_text(text)
    assert out == (text if expected is None else expected)


@pytest.mark.parametrize("text", [
    "llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB",
    "version: 3184 (9c77ec1d) built with cc (Ubuntu 13.2.0-23ubuntu4) 13.2.0 for x86_64-linux-gnu",
    "using device CUDA0 (NVIDIA GeForce RTX 4060 Ti) (0000:01:00.0) - 15221 MiB free",
    "NVIDIA-SMI 535.161.08  Driver Version: 535.161.08  CUDA Version: 12.2",
    "std::vector<float> at 12:34:56, mac aa:bb:cc:dd:ee:ff",
    "LLAMA_ARG_CACHE_TYPE_K=q8_0 OLLAMA_KEEP_ALIVE=5m --cache-type-k q8_0 --api-key-file keys.txt",
    "ROCm version v6.1.2.3 and version 10.0.0.1",
    "-m /models/tiny-fatkv.gguf",
    "vllm serve m --max-num-batched-tokens 8192 --max-model-len 4096",
    "text-generation-launcher --max-total-tokens 11000 --max-input-tokens 10000",
    "llama_context: worst-case: n_tokens = 4096, n_seqs = 1, n_outputs = 1",
    'config {"tokenizer": "meta-llama/Llama-3.1-8B", "max_tokens": 16}',
    "request max_tokens=512 &n_tokens=12",
    "--api-key-file keys.txt --ssl-key-file k.pem --cache-type-k q8_0",
    "0.00.015.413 I print_info: BOS token             = 0 '<s>'",
    "12.34.105.207 W llama_context: n_ctx_seq (4096) < n_ctx_train (131072)",
    "0.00.134.105 I slot launch_slot_: id  3 | task -1 | sampler params:",
    "print_info: EOT token        = 128009 '<|eot_id|>'",
    "print_info: PAD token        = 151643 '<|endoftext|>'",
])
def test_facts_survive(text):
    assert R().redact_text(text) == text


def test_placeholders_stable_and_counted():
    r = R()
    out = r.redact_text("a 10.0.0.5 b 10.0.0.6 c 10.0.0.5 x@example.com x@example.com")
    assert out == "a <ip-1> b <ip-2> c <ip-1> <email-1> <email-1>"
    assert r.counts["ip"] == 3 and r.counts["email"] == 2


def test_redact_bundle_sections_and_counts():
    bundle = minimal_bundle(
        "load: /home/alice/m.gguf\nerror: HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUv on 10.1.2.3\n",
        command={"line": "HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUv llama-server --api-key k3y-Value -m /home/alice/m.gguf",
                 "argv": ["HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUv", "llama-server", "--api-key", "k3y-Value", "-m",
                          "/home/alice/m.gguf"],
                 "flags": {"api_key": "k3y-Value", "model": "/home/alice/m.gguf", "n_ctx": 4096},
                 "env": {"HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUv", "CUDA_VISIBLE_DEVICES": "0"}},
        model={"path": "/home/alice/m.gguf", "file_name": "m.gguf"})
    out = R().redact_bundle(bundle)
    text = json.dumps(out)
    for secret in ("hf_AbCdEfGhIjKlMnOpQrStUv", "k3y-Value", "/home/alice", "10.1.2.3"):
        assert secret not in text
    assert out["command"]["flags"] == {"api_key": "<token>", "model": "<home>/m.gguf", "n_ctx": 4096}
    assert out["command"]["env"] == {"HF_TOKEN": "<token>", "CUDA_VISIBLE_DEVICES": "0"}
    assert out["model"]["file_name"] == "m.gguf"
    assert out["id"] == bundle["id"]
    assert out["redactions"]["home"] >= 3 and out["redactions"]["ip"] == 1
    validate_bundle(out)
    assert find_secrets(out) == []


def test_find_secrets_reports_paths_and_kinds():
    bundle = {"command": {"argv": ["llama-server", "--api-key", "abc123"], "env": {"HF_TOKEN": "zz"}},
              "log": {"lines": [[1, "ok"], [2, "using hf_AbCdEfGhIjKlMnOpQrStUv"], [3, "mail bob@example.org"]]}}
    found = find_secrets(bundle)
    assert ("command.argv[2]", "secret_flag") in found
    assert ("command.env.HF_TOKEN", "secret_env") in found
    assert ("log.lines[1][1]", "token") in found
    assert ("log.lines[2][1]", "email") in found
    assert find_secrets(bundle, kinds=("token",)) == [("log.lines[1][1]", "token")]


def test_is_secret_key():
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "api_key", "--api-key", "--hf-token", "AWS_SECRET_ACCESS_KEY",
                 "DB_PASSWORD", "hf_token", "token"):
        assert is_secret_key(name), name
    for name in ("cache_type_k", "api_key_file", "--ssl-key-file", "OLLAMA_KEEP_ALIVE", "n_ctx", "tokenizer_path",
                 "max_tokens", "LLAMA_ARG_CACHE_TYPE_K"):
        assert not is_secret_key(name), name


# --- property: planted secrets never survive in the written bundle --------------------------------

_secret = st.text(alphabet=string.ascii_letters + string.digits, min_size=20, max_size=40)
_name = st.text(alphabet=string.ascii_lowercase, min_size=4, max_size=12).filter(
    lambda s: s not in {"root", "user", "admin", "home", "test", "users", "guest", "model", "build", "llama"})
_ipv4 = st.tuples(st.integers(1, 223), st.integers(0, 255), st.integers(0, 255), st.integers(1, 254)).filter(
    lambda t: t[0] != 127).map(lambda t: ".".join(map(str, t)))
_ipv6 = st.tuples(*[st.integers(1, 0xFFFF)] * 4).map(lambda t: "2001:db8:" + ":".join(f"{x:x}" for x in t) + "::7")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(secret=_secret, user=_name, host=_name, ip=_ipv4, ip6=_ipv6, mailbox=_name, kind=st.sampled_from(
    ["hf", "sk", "ghp", "pat", "flag", "env", "bearer", "url"]))
def test_planted_secrets_never_survive(tmp_path_factory, secret, user, host, ip, ip6, mailbox, kind):
    from kvreport.collect import build_bundle

    token = {"hf": "hf_" + secret, "sk": "sk-" + secret, "ghp": "ghp_" + secret, "pat": "github_pat_" + secret,
             "flag": secret, "env": secret, "bearer": secret, "url": secret}[kind]
    email = f"{mailbox}@{host}.example.com"
    homes = [f"/home/{user}/models", f"/Users/{user}/m", f"C:\\Users\\{user}\\m", f"C:/Users/{user}/m",
             f"/mnt/c/Users/{user}/m"]
    line = (f"HF_TOKEN={token} CUDA_VISIBLE_DEVICES=0 llama-server -m {homes[0]}/x.gguf --api-key {token} "
            f"--hf-token={token} --host {ip} -c 4096")
    log = [
        f"main: loading model from {homes[1]}/x.gguf and {homes[2]}\\x.gguf",
        f"srv: Authorization: Bearer {token}",
        f"curl https://{user}:{token}@{host}.example.com/v1 from {ip6} by {email}",
        f"paths {homes[3]}/a {homes[4]}/b on {host} as {user}",
        f"config {{\"api_key\": \"{token}\"}} OPENAI_API_KEY={token}",
        "llama_kv_cache:        CPU KV buffer size =  1024.00 MiB",
    ]

    bundle = build_bundle(log, line, None, 0.5, probe_result={"host": {}, "devices": [], "probes": {}},
                          redactor=Redactor(user_names=[user], host_names=[host]))
    argv = ["env", f"HF_TOKEN={token}", "llama-server", "-m", f"{homes[3]}/x.gguf", "--api-key", token,
            "-hft", token, "--host", ip]
    bundle2 = build_bundle(log, argv, None, 0.5, probe_result={"host": {}, "devices": [], "probes": {}},
                           extra_env={"MY_SERVICE_PASSWORD": token, "CUDA_VISIBLE_DEVICES": "0"},
                           redactor=Redactor(user_names=[user], host_names=[host]))
    out = tmp_path_factory.mktemp("b") / "bundle.json"
    from kvreport.fsutil import write_json_atomic

    write_json_atomic(out, {"a": bundle, "b": bundle2})
    text = out.read_text()
    assert token not in text
    assert ip not in text and ip6 not in text and email not in text
    for h in homes:
        assert h not in text and h.replace("\\", "\\\\") not in text
    assert "1024.00 MiB" in text and "x.gguf" in text
    assert bundle["redactions"].get("home", 0) >= 5
    assert find_secrets(bundle, kinds=("token", "secret_flag", "secret_env", "authorization", "url_credentials",
                                       "email", "ip", "home")) == []


def test_real_case_logs_have_no_false_positives():
    """The 54 real logs (personal details already replaced by their curators) hold no secret, address
    or e-mail: redaction may only turn their placeholder home folders (/home/user) into <home>."""
    from tests.paths import case_dirs

    r = Redactor(user_names=["alice"], host_names=["gpubox"])
    for case in case_dirs():
        for path in [case / "log.txt", case / "command.txt"]:
            if path.is_file():
                r.redact_text(path.read_text(errors="replace"))
    assert set(r.counts) - {"home"} == {k for k, n in r.counts.items() if n == 0} - {"home"}, dict(r.counts)
