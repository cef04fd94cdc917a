"""What a cluster has in common: facet values over-represented in it against all bundles.

Socorro's "correlations" are the model: for each facet value (GPU, driver, backend, engine build,
OS, model family, cache type, a flag such as ``-fa on`` or ``--no-kv-unified``, verdict) the share
of the cluster's bundles that have it is compared with its share over every bundle on the server.
Both shares come from counters the upload transaction keeps (``cluster_facets`` per cluster and
``facet_totals`` over all bundles, see ``store.py``); nothing here reads the bundles table.

A value is shown when it has at least ``MIN_SUPPORT`` bundles in the cluster, its share in the
cluster is at least ``MIN_SHARE``, and the cluster share exceeds the overall share (with the
cluster's own bundles removed from "overall", the "rest of the server", so that a cluster holding
most bundles can still stand out) by a margin. Ranked by the difference of the two shares.
"""

from __future__ import annotations

import re

from sqlalchemy import func, select
from sqlalchemy.orm import Session

CORRELATION_KINDS = ("gpu", "driver", "backend", "engine_version", "os", "model_family", "cache_type", "flag",
                     "verdict")
KIND_TITLE = {"gpu": "GPU", "driver": "driver", "backend": "backend", "engine_version": "engine build",
              "os": "OS", "model_family": "model family", "cache_type": "KV cache type", "flag": "flag",
              "verdict": "verdict"}
MIN_SUPPORT = 3          # bundles in the cluster with the value: fewer is no trend
MIN_SHARE = 0.2          # of the cluster's bundles
MIN_RATIO = 1.5          # cluster share over the share in the rest of the server
MAX_ITEMS = 20

# -- the facet values a bundle adds (beyond analysis.facets' original kinds) ------------------------

_FLAG_SKIP = {"model", "host", "port", "prompt", "alias", "mmproj", "api_key", "path", "file", "chat_template",
              "cache_type_k", "cache_type_v", "override_tensor", "tensor_split", "lora", "grammar", "log_file",
              "slot_save_path", "system_prompt", "verbose", "verbosity", "log_verbosity", "jinja", "warmup",
              "model_url", "hf_repo", "hf_file", "served_model_name", "tokenizer", "download_dir"}
_SHORT_VALUE = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]{0,15}$")
_ARCH_LINES = (
    re.compile(r"(?:print_info|llm_load_print_meta):\s+arch\s*=\s*([A-Za-z0-9_.-]+)"),
    re.compile(r"general\.architecture\s+(?:str\s+)?=\s*([A-Za-z0-9_.-]+)"),
    re.compile(r"architectures?=\[?'?\"?([A-Za-z0-9_]+?)(?:ForCausalLM|ForConditionalGeneration|Model)?['\"\],]"),
    re.compile(r"[Rr]esolved architecture:\s*([A-Za-z0-9_]+?)(?:ForCausalLM|ForConditionalGeneration)?\b"),
)


def flag_text(name: str, value) -> str | None:
    """A command-line flag as people write it: ``kv_unified=False`` -> ``--no-kv-unified``,
    ``flash_attn="on"`` -> ``-fa on``, ``mmap=False`` -> ``--no-mmap``; None for values that are
    paths, numbers or free text (those are not a "flag setting")."""
    key = str(name).strip().lower()
    if not key or key in _FLAG_SKIP or key.startswith(("n_", "ctx", "max_", "num_")) or len(key) > 40:
        return None
    dashed = "--" + key.replace("_", "-")
    if key == "flash_attn":
        if isinstance(value, bool):
            return "-fa" if value else "-fa off"
        return f"-fa {value}" if isinstance(value, str) and _SHORT_VALUE.match(value) else None
    if isinstance(value, bool):
        return dashed if value else "--no-" + key.replace("_", "-")
    if isinstance(value, str) and _SHORT_VALUE.match(value):
        return f"{dashed} {value}"
    return None


def _model_family(bundle: dict) -> str | None:
    model = bundle.get("model") or {}
    gguf = model.get("gguf") if isinstance(model, dict) else None
    if isinstance(gguf, dict):
        arch = gguf.get("general.architecture") or gguf.get("arch") or gguf.get("architecture")
        if isinstance(arch, str) and arch.strip():
            return arch.strip().lower()
    for item in ((bundle.get("log") or {}).get("lines") or [])[:4000]:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            continue
        text = str(item[1])
        if "arch" not in text:
            continue
        for rx in _ARCH_LINES:
            m = rx.search(text)
            if m and m.group(1):
                return m.group(1).lower()
    return None


def _os(bundle: dict) -> str | None:
    host = bundle.get("host") or {}
    name = str(host.get("os_release") or host.get("os") or "").strip()
    if not name:
        return None
    if host.get("wsl") and "wsl" not in name.lower():
        name += " (WSL)"
    return name


def _cache_type(bundle: dict, diagnosis: dict) -> str | None:
    flags = ((bundle.get("command") or {}).get("flags") or {})
    inputs = ((diagnosis.get("memory") or {}).get("inputs") or {})
    k = flags.get("cache_type_k") or inputs.get("cache_type_k")
    v = flags.get("cache_type_v") or inputs.get("cache_type_v")
    if not k and not v:
        return None
    k, v = str(k or v), str(v or k)
    return k if k == v else f"K {k} / V {v}"


def extra_facets(bundle: dict, diagnosis: dict, devices: list[dict], is_gpu) -> set[tuple[str, str]]:
    """The (kind, value) pairs of the correlation kinds that ``analysis.facets`` did not count
    before migration 0004: driver, OS, model family, KV cache type, flags."""
    out: set[tuple[str, str]] = set()
    for d in devices:
        driver = str(d.get("driver_version") or "").strip()
        if driver and is_gpu(d):
            backend = str(d.get("backend") or "").strip().lower()
            out.add(("driver", f"{backend} {driver}".strip()[:200]))
    for kind, value in (("os", _os(bundle)), ("model_family", _model_family(bundle)),
                        ("cache_type", _cache_type(bundle, diagnosis))):
        if value and str(value).strip() and str(value) != "unknown":
            out.add((kind, str(value).strip()[:200]))
    flags = ((bundle.get("command") or {}).get("flags") or {})
    if isinstance(flags, dict):
        for name, value in flags.items():
            text = flag_text(name, value)
            if text:
                out.add(("flag", text[:200]))
    return out


# -- the correlation query ------------------------------------------------------------------------

def correlations(session: Session, cluster_id: int, cluster_count: int, *, min_support: int = MIN_SUPPORT,
                 limit: int = MAX_ITEMS, skip: set[tuple[str, str]] = frozenset()) -> dict:
    """``{"total_bundles", "cluster_bundles", "min_support", "items": [...]}`` where each item is
    ``{kind, kind_title, value, cluster_count, cluster_share, overall_count, overall_share,
    rest_share, ratio}``, the most over-represented first."""
    from kvreport_server.models import Cluster, ClusterFacet, FacetTotal

    total = int(session.execute(select(func.coalesce(func.sum(Cluster.count), 0))).scalar_one())
    out = {"total_bundles": total, "cluster_bundles": cluster_count, "min_support": min_support,
           "min_share": MIN_SHARE, "min_ratio": MIN_RATIO, "items": []}
    if cluster_count < min_support or total <= 0:
        return out
    f, t = ClusterFacet, FacetTotal
    rows = session.execute(
        select(f.kind, f.value, f.count, t.count)
        .join(t, (t.kind == f.kind) & (t.value == f.value))
        .where(f.cluster_id == cluster_id, f.kind.in_(CORRELATION_KINDS), f.count >= min_support)).all()
    rest_total = total - cluster_count
    items = []
    for kind, value, n_cluster, n_all in rows:
        if (kind, value) in skip or value == "unknown":
            continue
        share = n_cluster / cluster_count
        overall = n_all / total
        rest = (n_all - n_cluster) / rest_total if rest_total > 0 else 0.0
        if share < MIN_SHARE or share <= overall:
            continue
        ratio = share / rest if rest > 0 else None
        if ratio is not None and ratio < MIN_RATIO:
            continue
        items.append({"kind": kind, "kind_title": KIND_TITLE.get(kind, kind), "value": value,
                      "cluster_count": int(n_cluster), "cluster_share": round(share, 4),
                      "overall_count": int(n_all), "overall_share": round(overall, 4),
                      "rest_share": round(rest, 4), "ratio": round(ratio, 2) if ratio is not None else None})
    items.sort(key=lambda i: (-(i["cluster_share"] - i["rest_share"]), -i["cluster_count"], i["kind"], i["value"]))
    out["items"] = items[:limit]
    return out
