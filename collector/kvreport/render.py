"""The short human summary of a diagnosis (what ``kvreport analyze`` / ``collect`` print)."""

from __future__ import annotations

from kvreport.units import fmt_mib as _mib
from kvreport.vocab import BACKEND_TITLE, free_words, what_failed


def format_change(change: dict) -> str:
    """A suggestion's ``change`` as the user would type it: a bare flag for ``True`` (``--no-kv-offload``),
    ``--swa-full (remove)`` for ``None``, ``NAME=value`` for environment variables (upper case), else
    ``--flag value`` / ``parameter value``."""
    parts = []
    for k, v in (change or {}).items():
        k = str(k)
        if v is True:
            parts.append(k)
        elif v is None or v is False:
            parts.append(f"{k} (remove)")
        elif k.isupper():
            parts.append(f"{k}={v}")
        else:
            parts.append(f"{k} {v}")
    return " ".join(parts)


def _failure_lines(f: dict, phase: str, findings: list | None = None) -> list[str]:
    """``failed:`` (where, MiB requested vs free, verdict), ``deepest:`` and ``final:``/``cause:``."""
    if phase == "none":
        return []
    out = []
    where = f.get("failing_device") or (BACKEND_TITLE.get(f["backend"], f["backend"])
                                        if f.get("backend") not in (None, "unknown") else None)
    parts = [f"on {where}"] if where else []
    if f.get("requested_mib") is not None:
        parts.append(f"{_mib(f['requested_mib'])} MiB requested")
    free = free_words({"failure": f, "findings": findings})
    if free:
        parts.append(free)
    if parts:
        out.append("  failed:   " + ", ".join(parts) + f"  [{f.get('verdict') or 'unknown'}]")
    if f.get("allocator_error"):
        out.append(f"  deepest:  {f['allocator_error'][:200]}")
    if f.get("final_error"):
        label = "cause:   " if phase == "unknown" else "final:   "
        out.append(f"  {label} {f['final_error'][:300]}")
    return out


def _kv_line(m: dict) -> list[str]:
    """``KV cache:`` (size, context, sequences, cache types, MiB per 1k tokens) when it is known."""
    if m.get("kv_required_mib") is None:
        return []
    inp = m.get("inputs") or {}
    line = f"  KV cache: {_mib(m['kv_required_mib'])} MiB"
    if inp.get("n_ctx"):
        line += f" for n_ctx {inp['n_ctx']} tokens"
        if inp.get("n_seq"):
            line += f", {inp['n_seq']} seq"
    if inp.get("cache_type_k"):
        line += f" ({inp.get('cache_type_k')}/{inp.get('cache_type_v')})"
    if m.get("kv_mib_per_1k_tokens") is not None:
        line += f"; {_mib(m['kv_mib_per_1k_tokens'])} MiB per 1k tokens"
    return [line]


def _memory_lines(m: dict) -> list[str]:
    """``KV cache:``, ``state:``, ``fits:`` and ``auto-fit:``."""
    out = _kv_line(m)
    if m.get("rs_required_mib"):
        out.append(f"  state:    {_mib(m['rs_required_mib'])} MiB recurrent state (does not grow with the context)")
    fits = m.get("max_ctx_fit")
    if fits and not any(fits.values()):
        seqs = (m.get("inputs") or {}).get("n_seq") or 1
        out.append("  fits:     no context fits in the memory left for the KV on the failing device"
                   + (f" (each of the {seqs} parallel slots needs at least 256 cells)" if seqs > 1 else ""))
    elif fits:
        seqs = (m.get("inputs") or {}).get("n_seq") or 1
        slots = f" (at least 256 cells for each of the {seqs} slots)" if seqs > 1 and not all(fits.values()) else ""
        out.append("  fits:     " + " · ".join(f"{t} {n:,} tokens" if n else f"{t} none" for t, n in fits.items())
                   + " (KV alone, in the memory left for it on the failing device)" + slots)
    fit = m.get("fit")
    if fit and fit.get("ran"):
        ch = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in (fit.get("changed") or {}).items())
        out.append(f"  auto-fit: {fit.get('status')}" + (f" ({ch})" if ch else ""))
    return out


def _suggestion_lines(sugg: list[dict], phase: str) -> list[str]:
    """The ranked fixes with their command lines, or why none applies."""
    if not sugg:
        return [] if phase == "none" else ["No memory fix applies: the cause line above says what the engine refused."]
    out = ["Fixes, most likely first:"]
    for i, s in enumerate(sugg, 1):
        out.append(f"  {i}. {s.get('title')}  [{s.get('id')}]")
        if s.get("command"):
            out.append(f"     $ {s['command']}")
        elif s.get("change"):
            out.append("     change: " + format_change(s["change"]))
        if s.get("expected"):
            out.append(f"     expected: {s['expected']}")
    return out


def _picture_lines(diagnosis: dict, bundle: dict | None, facts) -> list[str]:
    """The memory picture as text bars (:mod:`kvreport.picture`), when a bundle or parsed log facts are given."""
    if bundle is None and facts is None:
        return []
    from kvreport.picture import memory_picture, text_bars

    bars = text_bars(memory_picture(bundle, diagnosis, facts), indent="    ")
    return ["  memory:   " + bars[0].strip()] + bars[1:] if bars else []


def render_text(diagnosis: dict, bundle: dict | None = None, facts=None) -> str:
    """A few lines for a terminal: what failed (device, MiB requested vs free), the KV numbers,
    the largest contexts that fit, the memory picture per device (text bars, from ``bundle``'s log or
    the already parsed ``facts`` of a raw log), findings, then the ranked fixes with their command lines."""
    d = diagnosis or {}
    f = d.get("failure") or {}
    sig = d.get("signature") or {}
    phase = f.get("phase") or "unknown"
    out = [f"kvreport: {sig.get('title') or d.get('engine', 'unknown')}",
           f"  what:     {what_failed(d)}"]
    out += _failure_lines(f, phase, d.get("findings"))
    out += _memory_lines(d.get("memory") or {})
    out += _picture_lines(d, bundle, facts)
    out += [f"  note:     {fd.get('text')}" for fd in (d.get("findings") or [])[:6]]
    out += _suggestion_lines(d.get("suggestions") or [], phase)
    return "\n".join(out) + "\n"
