"""Outcomes: what worked after a failure (kvreport.confirm on the client), and "what worked here" per cluster.

An outcome is posted to ``POST /api/v1/bundles/<id>/outcomes`` by the reporter's client when a later run of
the same engine and model worked on the same machine: ``{id, machine, worked, change, suggestion_ids, engine,
created_at}``. ``machine`` is a SHA-256 over a salt that never leaves the client and a few machine facts, so
the server can count distinct machines and nothing else. The outcome holds facts (what changed), not a
diagnosis; it is checked for secrets like a bundle (kvreport.redact) and is idempotent on its ``id``.

:func:`what_worked` gives, for one cluster, each suggestion id that outcomes confirmed with the number of
distinct machines that confirmed it, over the distinct machines of the cluster: ``reduce-ctx: confirmed on 7
of 9 machines``. The cluster's machines are those its bundles identify (``Cluster.machines``); an outcome's
machine is the salted hash of its client, a different name for the same machine, so when outcomes name more
machines than the bundles did (bundles without host facts) the larger number is the denominator.
"""

from __future__ import annotations

import hashlib
import json

from marshmallow import ValidationError
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kvreport_server.db import Database
from kvreport_server.errors import ApiError
from kvreport_server.models import Bundle, Cluster, Outcome, OutcomeSuggestion, utcnow
from kvreport_server.schemas import OutcomeSchema

EXAMPLES = 3


def load_outcome(data) -> dict:
    """The validated outcome (ApiError 422 naming the first bad field otherwise)."""
    if not isinstance(data, dict):
        raise ApiError(422, "an outcome is a JSON object", code="invalid")
    try:
        outcome = OutcomeSchema().load(data)
    except ValidationError as exc:
        field, problem = _first(exc.messages)
        raise ApiError(422, f"{field}: {problem}" if field else problem, code="invalid", field=field) from None
    outcome["suggestion_ids"] = list(dict.fromkeys(outcome["suggestion_ids"]))
    return outcome


def _first(messages, prefix: str = "") -> tuple[str | None, str]:
    if isinstance(messages, dict):
        for key, value in messages.items():
            return _first(value, f"{prefix}.{key}" if prefix else str(key))
    if isinstance(messages, list) and messages:
        return (prefix or None), str(messages[0])[:300]
    return (prefix or None), str(messages)[:300]


def check_secrets(outcome: dict) -> None:
    """The second redaction pass (kvreport.redact.find_secrets, secret kinds) over the change: refused."""
    from kvreport.redact import SECRET_KINDS, find_secrets

    found = find_secrets({"change": outcome.get("change") or {}}, kinds=SECRET_KINDS)
    if found:
        paths = ", ".join(sorted({str(p) for p, _k in found})[:10])
        kinds = ", ".join(sorted({str(k) for _p, k in found}))
        raise ApiError(422, f"the outcome still carries secrets ({kinds}) at {paths}; redact them (update kvreport) "
                            "and send it again", code="secrets_found", field=str(found[0][0]))


def _digest(outcome: dict, bundle_id: str) -> str:
    return hashlib.sha256(json.dumps([bundle_id, outcome], sort_keys=True, default=str).encode()).hexdigest()


def store(db: Database, bundle_id: str, outcome: dict, token_id: int | None = None) -> tuple[int, int]:
    """Store an outcome of ``bundle_id``: ``(201 | 200, cluster id)``; 404 when no such bundle, 409 when the id
    is stored with other content."""
    digest = _digest(outcome, bundle_id)
    try:
        with db.write_lock(), db.Session() as session, session.begin():
            cluster_id = session.execute(select(Bundle.cluster_id).where(Bundle.id == bundle_id)).scalar_one_or_none()
            if cluster_id is None:
                raise ApiError(404, f"no bundle {bundle_id}", code="not_found")
            existing = _existing(session, outcome["id"], digest)
            if existing is not None:
                return existing, cluster_id
            session.execute(insert(Outcome.__table__).values(
                id=outcome["id"], bundle_id=bundle_id, machine=outcome["machine"], worked=outcome["worked"],
                change=outcome["change"], suggestion_ids=outcome["suggestion_ids"], engine=outcome.get("engine"),
                created_at=outcome["created_at"], received_at=utcnow(), content_hash=digest, token_id=token_id))
            if outcome["suggestion_ids"]:
                session.execute(insert(OutcomeSuggestion.__table__), [
                    {"outcome_id": outcome["id"], "suggestion_id": sid, "bundle_id": bundle_id}
                    for sid in outcome["suggestion_ids"]])
        return 201, cluster_id
    except IntegrityError:  # the same id sent twice at once: the loser re-reads
        with db.Session() as session:
            status = _existing(session, outcome["id"], digest)
            cluster_id = session.execute(select(Bundle.cluster_id).where(Bundle.id == bundle_id)).scalar_one_or_none()
        if status is None or cluster_id is None:
            raise
        return status, cluster_id


def _existing(session: Session, outcome_id: str, digest: str) -> int | None:
    row = session.get(Outcome, outcome_id)
    if row is None:
        return None
    if row.content_hash != digest:
        raise ApiError(409, f"outcome {outcome_id} is already stored with different content", code="conflict",
                       field="id")
    return 200


def what_worked(session: Session, cluster: Cluster) -> list[dict]:
    """Per suggestion id, the distinct machines whose outcome confirmed it in ``cluster``, most first:
    ``[{id, machines, of, outcomes, text, examples}]`` (``examples``: up to three changes as typed)."""
    o, s, b = Outcome, OutcomeSuggestion, Bundle
    in_cluster = (o.bundle_id == b.id) & (b.cluster_id == cluster.id) & o.worked.is_(True)
    rows = session.execute(
        select(s.suggestion_id, func.count(func.distinct(o.machine)), func.count(func.distinct(o.id)))
        .select_from(s).join(o, o.id == s.outcome_id).join(b, in_cluster)
        .group_by(s.suggestion_id)).all()
    if not rows:
        return []
    confirming = session.execute(select(func.count(func.distinct(o.machine))).select_from(o).join(b, in_cluster)
                                 ).scalar_one()
    of = max(int(cluster.machines or 0), int(confirming))
    examples = _examples(session, cluster, [r[0] for r in rows])
    out = []
    for sid, machines, n in sorted(rows, key=lambda r: (-r[1], -r[2], r[0])):
        out.append({"id": sid, "machines": int(machines), "of": of, "outcomes": int(n),
                    "text": f"{sid}: confirmed on {machines} of {of} machine{'s' if of != 1 else ''}",
                    "examples": examples.get(sid, [])})
    return out


def _examples(session: Session, cluster: Cluster, ids: list[str]) -> dict[str, list[str]]:
    """The newest distinct changes (``-c 262144 -> 32768``) per suggestion id, from the last 200 outcomes."""
    from kvreport.confirm import describe_change

    o, b = Outcome, Bundle
    rows = session.execute(select(o.change, o.suggestion_ids).select_from(o)
                           .join(b, (o.bundle_id == b.id) & (b.cluster_id == cluster.id))
                           .where(o.worked.is_(True)).order_by(o.received_at.desc(), o.id.desc()).limit(200)).all()
    out: dict[str, list[str]] = {sid: [] for sid in ids}
    for change, sids in rows:
        text = describe_change(change or {}, [])
        for sid in sids or []:
            if sid in out and text not in out[sid] and len(out[sid]) < EXAMPLES:
                out[sid].append(text)
    return out


def rank_suggestions(facet: list[dict], worked: list[dict]) -> list[dict]:
    """The cluster's suggestion facet ranked by confirmations (machines), then by how often it was given;
    each entry gains ``confirmed`` (machines)."""
    confirmed = {w["id"]: w["machines"] for w in worked}
    ranked = [{**f, "confirmed": confirmed.get(f["value"], 0)} for f in facet]
    listed = {f["value"] for f in ranked}
    ranked += [{"value": sid, "count": 0, "confirmed": n} for sid, n in confirmed.items() if sid not in listed]
    return sorted(ranked, key=lambda f: (-f["confirmed"], -f["count"], f["value"]))

