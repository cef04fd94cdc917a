"""Pages: clusters (/), a cluster (/clusters/<id>), a bundle (/bundles/<id>, .json, .md), sign-in."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote, urlsplit

from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from marshmallow import ValidationError
from sqlalchemy import text

from kvreport.units import MIB, fmt_mib
from kvreport_server import analysis, auth
from kvreport_server.api.bundles import is_bundle_id
from kvreport_server.db import get_db, get_session
from kvreport_server.errors import ApiError
from kvreport_server.limits import ascii_int
from kvreport_server.models import CLUSTER_STATUSES, Bundle, Cluster
from kvreport_server.queries import cluster_detail, filter_choices, iso, list_clusters
from kvreport_server.schemas import ClusterDetailSchema, ClusterListSchema, ClusterQuerySchema
from kvreport_server.service import update_cluster
from kvreport_server.store import merge_clusters, unmerge_cluster
from kvreport_server.urls import bundle_url, cluster_url, facet_filter_path
from kvreport_server.web import words
from kvreport_server.web.forms import ClusterForm, LoginForm, MergeForm, UnmergeForm
from kvreport_server.web.render import fold_log, markdown_html, memory_section, new_issue_url, sparkline_svg

bp = Blueprint("web", __name__)

FILTERS = ("engine", "backend", "phase", "verdict", "version", "gpu", "status", "q", "facet", "sort")


@bp.app_context_processor
def _helpers():
    return {"sparkline_svg": sparkline_svg, "markdown_html": markdown_html, "is_maintainer": auth.is_maintainer,
            "facet_link": facet_filter_path, "w": words}


def _json(body: dict) -> Response:
    return Response(json.dumps(body, ensure_ascii=False, indent=1), mimetype="application/json")


# one copy of the units for the pages too (globals: the macros of _macros.html see them when imported)
bp.add_app_template_global(fmt_mib, "fmt_mib")
bp.add_app_template_global(MIB, "MIB")


@bp.get("/healthz")
def healthz():
    # a private server tells an anonymous caller its status and nothing else
    detail = not current_app.config.get("PRIVATE") or auth.can_read_quietly()
    try:
        with get_db().engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any database failure is "unavailable"
        current_app.logger.warning("healthz: database unavailable: %s", exc)
        return ({"status": "unavailable", "database": "error"} if detail else {"status": "unavailable"}), 503
    if not detail:
        return {"status": "ok"}
    return {"status": "ok", "database": "ok", "analyzer_version": analysis.analyzer_version()}


def _list_page():
    raw = {k: v for k, v in request.args.items() if k in (*FILTERS, "page", "per_page") and v != ""}
    try:
        args = ClusterQuerySchema().load(raw)
    except ValidationError as exc:
        raise ApiError(400, "bad filter: " + "; ".join(f"{k}: {v[0]}" for k, v in exc.messages.items()),
                       code="bad_request") from None
    per_page = args.pop("per_page", None) or current_app.config["PAGE_SIZE"]
    page = args.pop("page", 1)
    items, total = list_clusters(get_session(), page=page, per_page=per_page, db=get_db(), **args)
    return raw, items, total, page, per_page


@bp.get("/.json")
def index_json():
    """The clusters list as JSON (the same answer as GET /api/v1/clusters with the same filters)."""
    _raw, items, total, page, per_page = _list_page()
    for item in items:
        item["url"] = cluster_url(item["id"])
    return _json(ClusterListSchema().dump({"items": items, "page": page, "per_page": per_page, "total": total}))


@bp.get("/")
def index():
    raw, items, total, page, per_page = _list_page()
    pages = max(1, -(-total // per_page))
    active = {k: v for k, v in raw.items() if k in FILTERS}
    return render_template("index.html", items=items, total=total, page=page, pages=pages, per_page=per_page,
                           filters=active, statuses=CLUSTER_STATUSES, choices=filter_choices(get_session()))


def _cluster_or_404(raw: str) -> Cluster:
    cluster_id = ascii_int(raw, max_digits=9)  # ASCII digits only (werkzeug's int takes "٣")
    c = get_session().get(Cluster, cluster_id) if cluster_id is not None else None
    if c is None:
        abort(404)
    return c


@bp.route("/clusters/<string:cluster_id>", methods=["GET", "POST"])
def cluster(cluster_id: str):
    session = get_session()
    raw_id, _, ext = cluster_id.partition(".")
    if ext and (ext != "json" or request.method != "GET"):
        abort(404)
    c = _cluster_or_404(raw_id)
    cluster_id = c.id
    if ext == "json":
        from kvreport_server.api.clusters import with_urls

        return _json(ClusterDetailSchema().dump(with_urls(cluster_detail(session, cluster_id))))
    form = ClusterForm(obj=c) if request.method == "GET" else ClusterForm()
    if request.method == "POST":
        if not auth.is_maintainer():
            abort(403)
        if form.validate_on_submit():
            update_cluster(get_db(), cluster_id, {"known_fix": form.known_fix.data or "",
                                                  "issue_url": form.issue_url.data or "",
                                                  "status": form.status.data})
            flash("Cluster updated.")
            return redirect(url_for("web.cluster", cluster_id=cluster_id))
    session.expire_all()
    detail = cluster_detail(session, cluster_id)
    return render_template("cluster.html", c=detail, form=form, statuses=CLUSTER_STATUSES,
                           merge_form=MergeForm(formdata=None), unmerge_form=UnmergeForm(formdata=None))


@bp.post("/clusters/<string:cluster_id>/merge")
def cluster_merge(cluster_id: str):
    """A maintainer merges this cluster into another (CSRF-checked form of the cluster page)."""
    c = _cluster_or_404(cluster_id)
    if not auth.is_maintainer():
        abort(403)
    form = MergeForm()
    if not form.validate_on_submit():
        flash("Not merged: " + "; ".join(e for errs in form.errors.values() for e in errs))
        return redirect(url_for("web.cluster", cluster_id=c.id))
    try:
        result = merge_clusters(get_db(), c.id, form.into.data)
    except ApiError as exc:
        flash(f"Not merged: {exc.message}")
        return redirect(url_for("web.cluster", cluster_id=c.id))
    flash(f"Cluster {c.id} merged into this one: {result['moved']} bundle(s) moved. "
          "Its signature now counts here; unmerge it from its own page.")
    return redirect(url_for("web.cluster", cluster_id=result["into"]))


@bp.post("/clusters/<string:cluster_id>/unmerge")
def cluster_unmerge(cluster_id: str):
    c = _cluster_or_404(cluster_id)
    if not auth.is_maintainer():
        abort(403)
    if not UnmergeForm().validate_on_submit():
        abort(400)
    try:
        result = unmerge_cluster(get_db(), c.id)
    except ApiError as exc:
        flash(f"Not unmerged: {exc.message}")
        return redirect(url_for("web.cluster", cluster_id=c.id))
    flash(f"Unmerged: {result['moved']} bundle(s) moved back from cluster {result['from']}.")
    return redirect(url_for("web.cluster", cluster_id=c.id))


def _bundle_or_404(bundle_id: str) -> Bundle:
    row = get_session().get(Bundle, bundle_id) if is_bundle_id(bundle_id) else None
    if row is None:
        abort(404)
    return row


def _demo_note(data: dict) -> str | None:
    """What is real and what is invented in a demo bundle (``kvreport serve --demo``); None otherwise."""
    collector = data.get("collector")
    if not isinstance(collector, dict):
        return None
    note, case = collector.get("demo"), collector.get("example_of")
    if isinstance(note, str) and note.strip():
        return note.strip()[:500]
    if note or case:
        return f"the real case {case} as kvreport ships it (log and facts unchanged)" if case else "a demo bundle"
    return None


@bp.get("/bundles/<string:name>")
def bundle(name: str):
    bundle_id, _, ext = name.partition(".")
    row = _bundle_or_404(bundle_id)
    url = bundle_url(row.id)
    if ext == "json":
        body = {"id": row.id, "url": url, "cluster_id": row.cluster_id, "bundle": row.data, "diagnosis": row.diagnosis}
        return _json(body)
    if ext == "md":
        md = analysis.issue_markdown(row.data, row.diagnosis, url)
        return Response(md, mimetype="text/markdown", headers={"Content-Disposition": "inline"})
    if ext:
        abort(404)
    diag = row.diagnosis or {}
    failure = diag.get("failure") or {}
    marks = {str(failure.get(k)).strip() for k in ("allocator_error", "final_error") if failure.get(k)}
    md = analysis.issue_markdown(row.data, diag, url)
    title = analysis.issue_title(row.data, diag)
    c = get_session().get(Cluster, row.cluster_id)
    demo = _demo_note(row.data)
    return render_template("bundle.html", b=row, data=row.data, diag=diag, failure=failure, cluster=c,
                           page_title=title, received_at=iso(row.received_at), demo=demo,
                           devices=analysis.all_devices(row.data), explain=analysis.explain(row.data),
                           memory=memory_section(analysis.memory_picture(row.data, diag)),
                           blocks=fold_log((row.data.get("log") or {}).get("lines"), marks), issue_md=md,
                           issue_url=new_issue_url(current_app.config.get("ISSUE_REPO"), title, md), url=url)


_UNSAFE_NEXT = re.compile(r"[\x00-\x1f\x7f\\]")


def safe_next(target: str | None) -> str | None:
    """``target`` when it is a path on this site, else None (the caller goes to ``/``).

    A same-site path starts with one ``/`` (not ``//`` or ``/\\``), and neither it nor its unquoted
    form holds a backslash, a control character, a tab, CR or LF (browsers drop tabs and newlines,
    so ``/\t/evil.example`` would become ``//evil.example``), and it names no scheme or host.
    """
    if not target or len(target) > 2000:
        return None
    for form in (target, unquote(target)):
        if not form.startswith("/") or form.startswith("//") or _UNSAFE_NEXT.search(form):
            return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None
    return target


@bp.route("/login", methods=["GET", "POST"])
def login():
    form = LoginForm()
    if form.validate_on_submit():
        if auth.auth_throttled():
            raise ApiError(429, "too many failed sign-ins from this address; wait and try again",
                           code="rate_limited", headers={"Retry-After": "60"})
        user = auth.check_login(get_session(), form.username.data, form.password.data)
        if user is not None:
            auth.start_session(user)
            return redirect(safe_next(request.args.get("next")) or url_for("web.index"))
        auth.count_auth_failure()
        flash("Wrong user name or password.")
    return render_template("login.html", form=form)


@bp.post("/logout")
def logout():
    auth.end_session()
    return redirect(url_for("web.index"))
