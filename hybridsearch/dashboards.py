"""OpenSearch Dashboards saved objects for hybridsearch, and their import.

`opensearch_templates/dashboards/hybridsearch.ndjson` holds two index patterns (the query log
`hybridsearch-queries-*` on `@timestamp`, and the corpus `hybridsearch` with no time field, since most
works predate any range the time picker shows; `saved_objects` sets their titles to the deployment's
query-log prefix and the logical index the import names), the visualizations an analyst needs (query volume,
zero-result and out-of-domain rates, latency by profile, top zero-result queries, channel hits,
works by subject and year) and one dashboard with all of them. `visualization_request` builds the
`_search` body Dashboards sends for a visualization, so the saved objects can be checked against a
real cluster without running Dashboards.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from hybridsearch.config import Settings, get_settings
from hybridsearch.errors import ConfigError, EngineError, EngineUnavailableError, ValidationError

FILENAME = "hybridsearch.ndjson"
CORPUS_PATTERN = "hybridsearch-corpus-pattern"  # the ids of the two index patterns
QUERY_LOG_PATTERN = "hybridsearch-queries-pattern"
METRIC_AGGS = ("count", "sum", "avg", "max", "cardinality", "percentiles")
BUCKET_AGGS = ("terms", "date_histogram", "histogram", "filters")
# Dashboards writes a single calendar unit as calendar_interval and anything else as fixed_interval
_INTERVAL = re.compile(r"^(\d*)(ms|s|m|h|d|w|M|q|y)$")
_CALENDAR_UNITS = ("m", "h", "d", "w", "M", "q", "y")
_FIXED_UNITS = ("ms", "s", "m", "h", "d")


def saved_objects_path() -> Traversable:
    """The packaged ndjson file of saved objects."""
    return resources.files("opensearch_templates") / "dashboards" / FILENAME


def load_saved_objects(path: Path | Traversable | None = None) -> list[dict[str, Any]]:
    """The saved objects of the ndjson file (the packaged one by default), one per non-blank line.
    A line that is not a JSON object with a string `type` and `id` raises ValidationError naming it."""
    source = path if path is not None else saved_objects_path()
    objects: list[dict[str, Any]] = []
    for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ValidationError(f"not JSON: {e}", source=str(source), line=n) from e
        if not isinstance(obj, dict):
            raise ValidationError("a saved object must be a JSON object", source=str(source), line=n)
        for key in ("type", "id"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                raise ValidationError("a saved object needs a non-empty string", field=key, source=str(source),
                                      line=n)
        objects.append(obj)
    return objects


def saved_objects(corpus_index: str, query_log_prefix: str) -> list[dict[str, Any]]:
    """The packaged saved objects as a deployment imports them: the corpus index pattern's title is
    the logical index `corpus_index` (its read alias), the query log's `<query_log_prefix>*`.
    Objects refer to index patterns by id, so nothing else names them."""
    titles = {CORPUS_PATTERN: corpus_index, QUERY_LOG_PATTERN: f"{query_log_prefix}*"}
    objects = load_saved_objects()
    for obj in objects:
        if obj["id"] in titles:
            obj["attributes"]["title"] = titles[obj["id"]]
    return objects


# -- the search request of a visualization ----------------------------------------------------
def visualization_request(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The `_search` body Dashboards sends for a visualization saved object: size 0, the
    searchSource query, and the enabled aggs of `visState` with bucket aggs nested in their order and
    metric aggs inside the innermost bucket (`count` needs no agg: it is each bucket's doc_count).
    The time-picker range and the index are not part of it; the caller adds them. Raises ValueError
    naming the visualization and agg for anything this translation does not cover."""
    attrs = obj.get("attributes", {})
    title = str(attrs.get("title") or obj.get("id"))
    if obj.get("type") != "visualization":
        raise ValueError(f"{title!r} is a {obj.get('type')!r}, not a visualization")
    state = json.loads(attrs["visState"])
    search = json.loads(attrs.get("kibanaSavedObjectMeta", {}).get("searchSourceJSON") or "{}")
    if search.get("filter"):
        raise ValueError(f"visualization {title!r}: searchSource filters are not supported; use the query")
    aggs = [a for a in state.get("aggs", []) if a.get("enabled", True)]
    for a in aggs:
        if a["type"] not in METRIC_AGGS + BUCKET_AGGS:
            raise ValueError(f"visualization {title!r}: agg {a['id']} ({a['type']}) is not supported "
                             f"(supported: {', '.join(METRIC_AGGS + BUCKET_AGGS)})")
    metrics = {a["id"]: a for a in aggs if a["type"] in METRIC_AGGS}
    buckets = [a for a in aggs if a["type"] in BUCKET_AGGS]
    inner = {i: _metric(a) for i, a in metrics.items() if a["type"] != "count"}
    for b in reversed(buckets):
        node: dict[str, Any] = {b["type"]: _bucket(title, b, metrics)}
        sub = dict(inner)
        order_by = node[b["type"]].get("order", {})
        for key in order_by:  # ordering by a metric needs that metric under this bucket too
            if key in metrics and key not in sub:
                sub[key] = _metric(metrics[key])
        if sub:
            node["aggs"] = sub
        inner = {b["id"]: node}
    body: dict[str, Any] = {"size": 0, "track_total_hits": True, "query": kuery_query(search.get("query"), title)}
    if inner:
        body["aggs"] = inner
    return body


def kuery_query(query: Mapping[str, Any] | None, title: str = "") -> dict[str, Any]:
    """A searchSource query ({query, language}) as DSL: empty is match_all; text is a query_string
    query, which reads the simple `field:value` form (all our saved objects use) as kuery does."""
    if not query or not str(query.get("query", "")).strip():
        return {"match_all": {}}
    if query.get("language", "kuery") not in ("kuery", "lucene"):
        raise ValueError(f"visualization {title!r}: query language {query.get('language')!r} is not supported")
    return {"query_string": {"query": str(query["query"])}}


def _metric(agg: Mapping[str, Any]) -> dict[str, Any]:
    params = agg.get("params", {})
    if agg["type"] == "percentiles":
        return {"percentiles": {"field": params["field"], "percents": list(params.get("percents", [95]))}}
    return {agg["type"]: {"field": params["field"]}}


def _bucket(title: str, agg: Mapping[str, Any], metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    p = agg.get("params", {})
    where = f"visualization {title!r}: agg {agg['id']} ({agg['type']})"
    if agg["type"] == "terms":
        if p.get("otherBucket") or p.get("missingBucket"):
            raise ValueError(f"{where}: other/missing buckets are not supported")
        order_by, direction = str(p.get("orderBy", "_count")), p.get("order", "desc")
        if order_by in metrics:
            kind = metrics[order_by]["type"]
            if kind == "percentiles":
                raise ValueError(f"{where}: ordering by a percentiles agg is not supported")
            key = "_count" if kind == "count" else order_by
        elif order_by in ("_key", "_count"):
            key = order_by
        else:
            raise ValueError(f"{where}: orderBy {order_by!r} is not supported")
        return {"field": p["field"], "size": int(p.get("size", 5)), "order": {key: direction}}
    if agg["type"] == "date_histogram":
        m = _INTERVAL.match(str(p.get("interval", "auto")))
        if not m:
            raise ValueError(f"{where}: interval {p.get('interval')!r} is not supported (use e.g. h, d, 30m)")
        count, unit = int(m[1] or 1), m[2]
        if count == 1 and unit in _CALENDAR_UNITS:
            interval = {"calendar_interval": f"1{unit}"}
        elif unit in _FIXED_UNITS:
            interval = {"fixed_interval": f"{count}{unit}"}
        else:
            raise ValueError(f"{where}: interval {p['interval']!r} is not a valid OpenSearch interval")
        return {"field": p["field"], **interval, "time_zone": "UTC", "min_doc_count": int(p.get("min_doc_count", 1))}
    if agg["type"] == "histogram":
        try:
            interval_value = float(p["interval"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: interval {p.get('interval')!r} is not supported (use a number)") from e
        out: dict[str, Any] = {"field": p["field"],
                               "interval": int(interval_value) if interval_value.is_integer() else interval_value,
                               "min_doc_count": 0 if p.get("min_doc_count") else 1}
        bounds = p.get("extended_bounds") or {}
        if p.get("has_extended_bounds") and bounds.get("min") not in (None, "") and bounds.get("max") not in (None, ""):
            out["extended_bounds"] = {"min": bounds["min"], "max": bounds["max"]}
        return out
    # filters: one bucket per query, keyed by its label (Dashboards' key)
    filters = {}
    for f in p.get("filters", []):
        q = f.get("input", {})
        filters[f.get("label") or q.get("query") or "*"] = kuery_query(q, title)
    return {"filters": filters}


# -- import ------------------------------------------------------------------------------------
def import_saved_objects(dashboards_url: str, *, corpus_index: str | None = None, username: str | None = None,
                         password: str | None = None, tenant: str | None = None, overwrite: bool = True,
                         settings: Settings | None = None) -> dict[str, Any]:
    """Import the packaged saved objects into OpenSearch Dashboards (`POST /api/saved_objects/_import`),
    the corpus index pattern naming logical index `corpus_index` (default: the settings'
    opensearch_index) and the query-log one the indices of the settings' query_log_prefix; with
    `tenant`, into that tenant of the security plugin's multi-tenancy (`securitytenant` header:
    "global", "private" or a custom tenant's name), else the user's default tenant. Returns
    Dashboards' answer: `success`, `successCount` (objects written) and, on failure, `errors` (per
    object: id, type and error). Raises EngineUnavailableError when Dashboards does not answer,
    EngineError with the server's message on a non-2xx answer or `success: false`."""
    from hybridsearch.engines.opensearch.engine import check_index_name, check_url, display_url

    check_url(dashboards_url, "an OpenSearch Dashboards URL")
    s = settings or get_settings()  # timeout and TLS as for OpenSearch
    corpus = check_index_name(s.opensearch_index if corpus_index is None else corpus_index, "corpus_index")
    # a broken file fails here, with its line, not inside Dashboards
    objects = saved_objects(corpus, s.query_log_prefix)
    data = "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objects).encode()
    if tenant is not None and (not tenant.strip() or not tenant.isprintable() or not tenant.isascii()):
        raise ConfigError(f"tenant: {tenant!r} is not a tenant name this import can send (printable ASCII)")
    request = _import_request(dashboards_url, data, username=username, password=password, overwrite=overwrite)
    if tenant is not None:
        request.add_header("securitytenant", tenant)
    shown = display_url(dashboards_url)
    context = None
    if urlsplit(dashboards_url).scheme == "https":
        try:
            context = ssl.create_default_context(cafile=str(s.opensearch_ca_certs) if s.opensearch_ca_certs else None)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"HYBRIDSEARCH_OPENSEARCH_CA_CERTS: cannot load {s.opensearch_ca_certs}: "
                              f"{getattr(e, 'strerror', None) or getattr(e, 'reason', None) or e}") from e
        if not s.opensearch_verify_certs:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=s.opensearch_timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            raise EngineError(_one_line(
                f"OpenSearch Dashboards at {shown} answered the import with HTTP {e.code}, a redirect to "
                f"{display_url(e.headers.get('Location') or '(no Location)')} (a login page, or another base path?), "
                "which the import does not follow; give the URL that serves /api/saved_objects/_import")) from e
        raise EngineError(_one_line(f"OpenSearch Dashboards at {shown} refused the import: HTTP {e.code}: "
                                    f"{_refusal(e, request.has_header('Authorization'))}")) from e
    except OSError as e:  # URLError, refused connections, timeouts
        reason = getattr(e, "reason", None) or e
        raise EngineUnavailableError(_one_line(f"OpenSearch Dashboards at {shown} does not answer: {reason}")) from e
    try:
        answer: dict[str, Any] = json.loads(raw)
    except ValueError as e:
        raise EngineError(f"OpenSearch Dashboards at {shown} answered the import with something that is not "
                          f"JSON: {_one_line(raw[:200].decode('utf-8', 'replace'))}") from e
    if not answer.get("success", False):
        raise EngineError(_one_line(f"OpenSearch Dashboards at {shown} did not import every saved object: "
                                    f"{_import_errors(answer)}"))
    return answer


def _import_request(dashboards_url: str, data: bytes, *, username: str | None, password: str | None,
                    overwrite: bool) -> urllib.request.Request:
    """The import request: multipart upload with Dashboards' `osd-xsrf` header, basic auth from
    credentials in the URL (which never go into the URL sent), else from the arguments: the URL names
    the one Dashboards the caller means, the arguments (the settings) may be OpenSearch's."""
    parts = urlsplit(dashboards_url)
    if parts.username:
        username, password = unquote(parts.username), unquote(parts.password or "")
    base = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"), "", ""))
    url = f"{base}/api/saved_objects/_import" + ("?overwrite=true" if overwrite else "")
    content_type, body = _multipart(data)
    headers = {"Content-Type": content_type, "osd-xsrf": "true", "Accept": "application/json"}
    if username is not None:
        token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    return urllib.request.Request(url, data=body, headers=headers, method="POST")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are errors: urllib would follow a 302 to a POST with a GET (to a login page, say)."""

    def redirect_request(self, *args: Any) -> None:
        return None


def _refusal(e: urllib.error.HTTPError, authorized: bool) -> str:
    """The server's message for a refused import, with what to do where the cause is plain."""
    message = _server_message(e.read())
    if e.code == 401 and not authorized:
        return (f"{message}; set HYBRIDSEARCH_OPENSEARCH_USERNAME and HYBRIDSEARCH_OPENSEARCH_PASSWORD, or put "
                "them in the URL (http://USER:PASSWORD@host:5601)")
    if e.code == 400 and "no handler found for uri [/api/saved_objects/_import" in message:
        return (f"{message}; this looks like OpenSearch, not OpenSearch Dashboards: give the Dashboards URL "
                "(port 5601 by default)")
    return message


def _multipart(data: bytes, filename: str = FILENAME) -> tuple[str, bytes]:
    """A multipart/form-data body with one file field `file`: (content type, body)."""
    boundary = f"hybridsearch-{uuid.uuid4().hex}"
    while boundary.encode() in data:
        boundary = f"hybridsearch-{uuid.uuid4().hex}"
    body = (f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: application/ndjson\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", body


def _server_message(raw: bytes) -> str:
    try:
        answer = json.loads(raw)
    except ValueError:
        return _one_line(raw[:300].decode("utf-8", "replace")) or "(no body)"
    if isinstance(answer, dict):
        return _one_line(str(answer.get("message") or answer.get("error") or answer))
    return _one_line(str(answer))


def _import_errors(answer: Mapping[str, Any]) -> str:
    errors = answer.get("errors") or []
    shown = []
    for e in errors[:5]:
        err = e.get("error", {})
        detail = err.get("type", "error")
        if err.get("references"):
            detail += " " + ",".join(f"{r.get('type')}/{r.get('id')}" for r in err["references"])
        if err.get("message"):
            detail += f" ({err['message']})"
        shown.append(f"{e.get('type')}/{e.get('id')}: {detail}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(shown) + more if shown else "success is false and no errors were given"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
