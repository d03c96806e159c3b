"""The Searcher: the one orchestrator. It runs a profile's channels, fuses and explains."""

from __future__ import annotations

import logging
import math
import operator
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hybridsearch import plugins
from hybridsearch.analysis import default_analyzer
from hybridsearch.config import get_settings
from hybridsearch.embeddings import LEGACY_RECORD, Encoder, check_encoder, default_encoder
from hybridsearch.engines import VectorSampling, VectorSearch
from hybridsearch.errors import ConfigError, EngineUnavailableError, HybridSearchError, QueryError
from hybridsearch.models import ChannelScore, Filters, Hit, RankedList, SearchResult
from hybridsearch.scoring import minmax, top_k, unzip
from query_service.candidates import Candidates
from query_service.channels import Channel, QueryContext
from query_service.citation import expand as expand_citations
from query_service.diversity import diversify, mmr
from query_service.evidence import pack
from query_service.fusion import Fuser
from query_service.intent import Intent, given
from query_service.multi import MultiEngine
from query_service.profiles import ChannelSpec, DiversityConfig, Profile
from query_service.pruning import prune
from query_service.querylog import QueryLog, engine_fields, make_record
from query_service.rerank import Reranker
from query_service.stages import alias_variants, keyword_variant
from query_service.symbolic import expand as expand_symbolic

_log = logging.getLogger("hybridsearch.search")
DOMAIN_MIN_VECTORS = 50  # fewer vectors place no centroid: the domain check does not run
DOMAIN_RESAMPLE_S = 30.0  # a sample short of the index is taken again at most this often
DOMAIN_KEYS = 64  # measures kept, one per index and licence set (a request's licence filter makes its own)
TITLE_CHECK = 10  # a gated query naming a title among each list's top this many is in the domain


class _Domain(NamedTuple):
    """An index's place in vector space as the domain check last measured it: its chunks then,
    the vectors sampled of those asked, the centroid of the sample (None: too few vectors), the
    lowest cosine of a sampled vector with it (the edge), when (time.monotonic), and, after a
    measure failed, when the next may be taken."""

    chunks: int
    sampled: int
    asked: int
    centroid: np.ndarray | None
    edge: float
    at: float
    retry_at: float = 0.0


def _measure(engine: Any, licences: tuple[str, ...] | None, count: int) -> _Domain:
    """The domain check's measure of an index of `count` chunks, over the vectors of these licences
    (None: all): the centroid of HYBRIDSEARCH_DOMAIN_SAMPLE of them and their lowest cosine with it."""
    n = get_settings().domain_sample
    sample = engine.vector_sample(n, None if licences is None else Filters(license=list(licences)))
    centroid, edge = None, 0.0
    if len(sample) >= DOMAIN_MIN_VECTORS:
        mean = sample.mean(axis=0)
        norm = float(np.linalg.norm(mean))
        if norm > 0:
            centroid = mean / norm
            edge = float((sample @ centroid).min())
    return _Domain(count, len(sample), n, centroid, edge, time.monotonic())


def _voicevault_variants(query: str) -> list[str]:
    """VoiceVault's three query variants: the query, its keyword form, and an alias rewrite."""
    out = [v for v in [keyword_variant(query), *alias_variants(query)] if v and v != query.lower()]
    return list(dict.fromkeys(out))[:2]


# query expansion stages: query text -> other phrasings; "symbolic" (kb-thinkingdb) is the bounded
# symbolic closure over facts, a stage of its own after fusion (query_service.symbolic)
_EXPANSIONS: dict[str, Callable[[str], list[str]]] = {
    "aliases": lambda q: alias_variants(q),
    "voicevault": _voicevault_variants,
}


def visible(filters: Filters | None, rights: Collection[str] | None) -> Filters | None:
    """The filters with the caller's licence rights applied: without `restricted`, only documents
    whose licence is one of HYBRIDSEARCH_OPEN_LICENSES pass, in every channel (a pre-filter), so a
    restricted document is never a result, a seed, evidence or a snippet. None: no restriction."""
    if rights is None or "restricted" in rights:
        return filters
    allowed = list(get_settings().open_licenses) if "open" in rights else []
    f = filters or Filters()
    if f.license:
        wanted = {x.strip().lower() for x in f.license}
        allowed = [lic for lic in allowed if lic.strip().lower() in wanted]
    # an empty list would mean "no licence filter": a licence no document has stands for "none"
    return f.model_copy(update={"license": allowed or ["\x00no-licence-allowed"]})


def check_k(k: int) -> int:
    """A result count: a whole number between 1 and HYBRIDSEARCH_SEARCH_MAX_K, else one QueryError."""
    most = get_settings().search_max_k
    try:
        n = 0 if isinstance(k, bool) else operator.index(k)  # an int, numpy's included; never 2.5, "5" or True
    except TypeError:
        n = 0
    if not 1 <= n <= most:
        raise QueryError(f"k must be a whole number between 1 and {most} (HYBRIDSEARCH_SEARCH_MAX_K), got {k!r}")
    return n


def adhoc_profile(channels: Sequence[str], fuser: str = "rrf", k: int = 100) -> Profile:
    """A profile for an explicit channel list, named like eval runs: `bm25+dense:rrf`."""
    if not channels:
        raise QueryError(f"no channel named; valid: {', '.join(plugins.names('channels'))}")
    check_k(k)
    for c in channels:  # a misspelt name fails here, before an eval builds its index and runs
        plugins.require("channels", c)
    plugins.require("fusers", fuser)  # unused by one channel, but a misspelt one is still a mistake
    name = "+".join(channels) + (f":{fuser}" if len(channels) > 1 else "")
    return Profile(name=name, channels={c: ChannelSpec(k=k) for c in channels}, fuser=fuser,
                   max_results=k)


def get_profile(name: str) -> Profile:
    """A registered profile by name, or a YAML profile file by path."""
    if name.endswith((".yaml", ".yml")):
        return Profile.from_yaml(Path(name))
    prof = plugins.load("profiles", name)
    if not isinstance(prof, Profile):
        raise ConfigError(f"profile {name!r} is not a Profile")
    return prof


class Searcher:
    """Runs profiles over one engine, or over several named ones (knowledge bases): then
    `search(..., kb_names=[...])` picks which, all by default, and merges their candidates
    before fusion (ids become `<kb>:<id>`)."""

    def __init__(self, engine: Any, *, encoder: Encoder | None = None, query_log: QueryLog | None = None,
                 origin: str = "api") -> None:
        self.kbs: dict[str, Any] = dict(engine) if isinstance(engine, Mapping) else {}
        self.engine = MultiEngine(self.kbs) if self.kbs else engine
        self.encoder = encoder
        self.query_log, self.origin = query_log, origin
        self._log_fields = engine_fields(self.engine)
        self._plugins: dict[tuple[str, str, str], Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._domains: dict[Any, _Domain] = {}  # by index (a MultiEngine: by its bases) and licences
        self._domain_lock = threading.Lock()
        # keys being measured: a first measure (searches with the key wait for it), or a later one
        # in the background (they keep the last meanwhile)
        self._measuring: dict[Any, Future[_Domain]] = {}
        self._domain_pool: ThreadPoolExecutor | None = None
        self._closed = False  # under the domain lock: no background measure starts after close
        self._has_vectors = False  # the index was seen to hold a vector
        self._encoder_checked = False  # the query encoder is the one that made the index's vectors

    def holds_vectors(self, engine: Any | None = None) -> bool:
        """Whether the index (`engine`, default the Searcher's) holds any vector; once it has,
        that is not asked again."""
        engine = self.engine if engine is None else engine
        if not self._has_vectors:
            self._has_vectors = not isinstance(engine, VectorSearch) or engine.has_vectors()
        return self._has_vectors

    def _check_encoder(self) -> None:
        """Refuse, in one line naming both, to embed queries with another encoder than the one
        that made the index's vectors (once per Searcher: the record does not change)."""
        if self._encoder_checked:
            return
        encoder = self.encoder or default_encoder()
        for name, engine in (self.kbs or {"": self.engine}).items():
            stored = engine.get_meta("encoder") or LEGACY_RECORD  # an index from before the record: MiniLM's
            check_encoder(stored, encoder, f"the knowledge base {name!r}" if name else "the index")
        self._encoder_checked = True

    def _plugin(self, group: str, name: str, config: Mapping[str, Any]) -> Any:
        """One instance per plugin and config (channels, fusers, rerankers, intent classifiers);
        a config the plugin's Config refuses is one ConfigError naming the plugin."""
        key = (group, name, repr(sorted(config.items())))
        if key not in self._plugins:
            cls = plugins.load(group, name)
            try:
                self._plugins[key] = cls(cls.Config(**config))
            except ValueError as e:
                raise ConfigError(f"{group[:-1]} {name!r}: {e}") from e
        return self._plugins[key]

    def _channel(self, name: str, spec: ChannelSpec) -> Channel:
        channel: Channel = self._plugin("channels", name, spec.config)
        return channel

    def _fuser(self, profile: Profile) -> Fuser:
        fuser: Fuser = self._plugin("fusers", profile.fuser, profile.fuser_config)
        return fuser

    def search(self, query: str, profile: Profile | str = "hybrid", *, k: int | None = None,
               filters: Filters | None = None, with_documents: bool = False,
               overrides: Mapping[str, Any] | None = None,
               kb_names: Sequence[str] | None = None, log_extra: Mapping[str, Any] | None = None,
               rights: Collection[str] | None = None, intent: str | None = None) -> SearchResult:
        """Run a profile; with a query log, queue one record of the search (`log_extra` adds
        fields to it, e.g. the name of the caller's API key). With `rights` (licence classes),
        a document of a class not in it is invisible to every stage (fail closed). `intent`
        (lookup, survey, compare, prereq, related) overrides the classifier's."""
        result = self._search(query, profile, k=k, filters=visible(filters, rights), with_documents=with_documents,
                              overrides=overrides, kb_names=kb_names, intent=intent)
        if self.query_log is not None:
            self.query_log.put(make_record(query, result, **self._log_fields, origin=self.origin, extra=log_extra))
        return result

    def _search(self, query: str, profile: Profile | str, *, k: int | None, filters: Filters | None,
                with_documents: bool, overrides: Mapping[str, Any] | None,
                kb_names: Sequence[str] | None, intent: str | None = None) -> SearchResult:
        """The stages, in order, over one Candidates value: intent, channels, escalation, semantic
        floor and domain check, fuse, prune, expand (citation), symbolic expansion, rerank,
        diversity, then the explanation and the evidence pack. Each stage records its milliseconds
        and counts under diagnostics.stages."""
        if not isinstance(query, str):
            raise QueryError(f"the query must be text (str), got {type(query).__name__}")
        if not query.strip():
            raise QueryError("query text is empty")
        if self._closed:
            raise EngineUnavailableError("the searcher is closed")
        engine = self.engine
        if kb_names is not None:
            unknown = [n for n in kb_names if n not in self.kbs]
            if unknown:
                raise QueryError(f"unknown knowledge bases {unknown}; valid: {', '.join(self.kbs) or 'none'}")
            engine = MultiEngine({n: self.kbs[n] for n in kb_names})
        prof = get_profile(profile) if isinstance(profile, str) else profile
        if overrides:
            prof = prof.with_overrides(overrides)
        # a profile's max_results is a default, capped by HYBRIDSEARCH_SEARCH_MAX_K; a k asked for is checked
        limit = check_k(k) if k is not None else min(prof.max_results, get_settings().search_max_k)
        diag: dict[str, Any] = {"profile": prof.name, "k": limit, "stages": {}}
        stages = diag["stages"]
        t0 = time.perf_counter()
        understood = self._intent(query, intent)
        diag["intent"] = {"name": understood.name, "focus": understood.focus, "rule": understood.rule}
        if understood.recency is not None:
            diag["intent"]["recency"] = understood.recency
        # with citation or symbolic expansion the intent plans the search: prereq and related
        # queries find their seeds by their focus ("the Gauss-Bonnet theorem"), not by the framing words
        expands = prof.citation is not None or prof.expansion == "symbolic"
        text = understood.focus if expands and understood.name in ("prereq", "related") else query
        expand = _EXPANSIONS.get(prof.expansion or "")
        vectorless = prof.embeds_query() and not self.holds_vectors(engine)
        if prof.embeds_query() and not vectorless:
            self._check_encoder()
        if vectorless:
            diag["no_vectors"] = ("the index holds no vectors, so the hits were ranked without the dense channel and "
                                  "the semantic rules; `hybridsearch embed` adds them")
        ctx = QueryContext(text, filters, self.encoder, variants=expand(text) if expand else (), intent=understood,
                           vectorless=vectorless)
        if ctx.variants:
            diag["variants"] = ctx.variants
        fuser = self._fuser(prof) if len(prof.channels) > 1 or prof.escalation else None
        weight = getattr(fuser, "weight", None)
        skipped = [c for c in prof.channels if weight is not None and weight(c) == 0]
        if skipped and len(skipped) < len(prof.channels):
            # a channel the fuser weights 0 cannot change the ranking: it is not run
            prof = prof.model_copy(update={"channels": {c: s for c, s in prof.channels.items() if c not in skipped}})
            diag["skipped_channels"] = skipped
        t = time.perf_counter()
        lists = {c: _ties_by_id(rl) for c, rl in self._run_channels(prof, ctx, engine).items()}
        stages["channels"] = {"ms": _ms(t), "hits": {c: len(rl) for c, rl in lists.items()}}
        esc = prof.escalation
        if esc is not None:
            floor = esc.min_acceptable if esc.min_acceptable is not None else prof.max_results
            found = len(lists.get(esc.after, ()))
            diag["escalated"] = found < floor
            if found < floor:
                t = time.perf_counter()
                spec = ChannelSpec(k=esc.k, config=esc.config)
                lists[esc.channel] = _ties_by_id(self._channel(esc.channel, spec).retrieve(ctx, engine, esc.k))
                stages["escalation"] = {"ms": _ms(t), "channel": esc.channel, "hits": len(lists[esc.channel])}
        matched = any(len(rl) for rl in lists.values())
        cosines: dict[str, float] | None = None  # known cosines, when a semantic rule applies
        # nothing found is no out-of-domain query: there is no candidate for a semantic rule to judge
        semantic = prof.semantic_floor is not None or prof.min_semantic is not None or prof.domain_check is not None
        if matched and semantic:
            t = time.perf_counter()
            lists, reason, cosines, named = self._semantic_floor(prof, ctx, engine, lists)
            stages["semantic_floor"] = {"ms": _ms(t), "hits": {c: len(rl) for c, rl in lists.items()}}
            if named is not None:
                stages["semantic_floor"]["in_domain"] = named
            if reason is not None:
                diag["reason"] = reason
                _total(diag, t0, ctx)
                return SearchResult.model_construct(query=query, hits=[], diagnostics=diag, evidence=None)
        t = time.perf_counter()
        pool = limit * 3 if prof.diversity is not None else limit  # room for what diversity drops
        if prof.reranker is not None:
            pool = max(pool, prof.rerank_top)
        if fuser is None:
            (channel, rl), = lists.items()
            cands = Candidates.of(rl.ids[:pool], rl.scores[:pool], [{channel: s} for s in rl.scores[:pool]], lists)
        else:
            fused = fuser.fuse(lists, pool)
            cands = Candidates.of(fused.ids, fused.scores, fused.contributions, lists)
        cands.cosines.update(cosines or {})
        _check_finite(cands.scores, "fused")
        stages["fuse"] = {"ms": _ms(t), "hits": len(cands)}
        if (prof.min_score > 0 or prof.gap > 0) and cands.items:
            t = time.perf_counter()
            ceiling = fuser.max_score(lists) if fuser is not None else cands.items[0].score
            _check_finite([ceiling], "fused")  # the highest attainable: every score / inf would be 0
            cands = cands.keep(prune(cands.scores, ceiling=ceiling, min_score=prof.min_score, gap=prof.gap))
            stages["prune"] = {"ms": _ms(t), "hits": len(cands), "min_score": prof.min_score, "gap": prof.gap}
        fused_count = len(cands)
        if prof.citation is not None and cands.items:
            t = time.perf_counter()
            cands, info = expand_citations(cands, understood.name, engine, filters, prof.citation)
            stages["expand"] = {**info, "ms": _ms(t), "hits": len(cands)}
        if prof.expansion == "symbolic" and cands.items:
            t = time.perf_counter()
            cands, info = expand_symbolic(cands, ctx.text, engine, filters, prof.symbolic)
            stages["symbolic"] = {**info, "ms": _ms(t), "hits": len(cands)}
        if prof.reranker is not None and cands.items:
            t = time.perf_counter()
            # the reranker sees the top `rerank_top` fused candidates (at least as many as the
            # search keeps for k and diversity, so that no hit returned keeps a fused score, on
            # another scale, below reranked ones) and those expansion added; the fused ones below
            # keep their order after them
            seen = min(max(prof.rerank_top, pool), fused_count)
            top = list(range(seen)) + list(range(fused_count, len(cands)))
            reranked, info = self._reranker(prof).rerank(ctx, cands.keep(top), engine)
            rest = cands.items[seen:fused_count]
            cands = reranked.replace(reranked.items + rest)
            stages["rerank"] = {"ms": _ms(t), "reranker": prof.reranker, "hits": len(reranked), **info}
        if prof.diversity is not None and cands.items:
            t = time.perf_counter()
            cands, dropped = self._diversify(prof.diversity, cands, engine, limit)
            stages["diversity"] = {"ms": _ms(t), "hits": len(cands), "dropped": dropped}
        cands = cands.head(limit)
        if cosines is not None:
            unknown = [i for i in cands.ids if i not in cands.cosines]
            have = engine.vector_score(ctx.vector, unknown) if unknown else {}
            unvectored = [i for i in unknown if i not in have]
            if unvectored:
                diag["vectors_missing"] = (f"{len(unvectored)} results have no vector (e.g. {unvectored[0]}), so no "
                                           "semantic rule judged them; `hybridsearch embed` adds their vectors")
        hits = _explain(cands)
        _check_finite([x for h in hits for x in (h.score, *h.contributions.values(),
                                                 *(c.raw for c in h.channels.values()))], "final")
        if with_documents and hits:
            docs = engine.get([h.id for h in hits])
            for h in hits:
                h.document = docs.get(h.id)
        evidence = None
        if prof.evidence is not None and hits:
            t = time.perf_counter()
            evidence = pack(query, cands.ids, cands.scores, engine.get(cands.ids), prof.evidence)
            stages["evidence"] = {"ms": _ms(t), "items": len(evidence.items), "tokens": evidence.tokens}
        _total(diag, t0, ctx)
        if not hits:
            filtered = filters is not None and not filters.is_empty()
            diag["reason"] = ("every candidate fell below the score floors" if "prune" in stages
                              else "no channel returned a match" if matched
                              else f"nothing matched the query{' and the filters' if filtered else ''}")
        return SearchResult.model_construct(query=query, hits=hits, diagnostics=diag, evidence=evidence)

    def _intent(self, query: str, given_name: str | None) -> Intent:
        classifier = self._plugin("intents", get_settings().intent_classifier, {})
        return given(query, given_name, classifier) if given_name is not None else classifier.classify(query)

    def _reranker(self, prof: Profile) -> Reranker:
        reranker: Reranker = self._plugin("rerankers", prof.reranker or "", prof.reranker_config)
        return reranker

    @staticmethod
    def _diversify(dv: DiversityConfig, cands: Candidates, engine: Any, limit: int) -> tuple[Candidates, Any]:
        ids = cands.ids
        need_vecs = dv.near_duplicate is not None or dv.mmr_lambda is not None
        vecs = engine.vectors(ids) if need_vecs and isinstance(engine, VectorSearch) else {}
        keep, dropped = diversify(ids, cands.doc_info(engine), vectors=vecs, by_work=dv.by_work,
                                  near_duplicate=dv.near_duplicate, per_page=dv.per_page,
                                  per_author=dv.per_author, per_venue=dv.per_venue,
                                  limit=None if dv.mmr_lambda is not None else limit)
        if dv.mmr_lambda is not None:
            sub = [ids[i] for i in keep]
            scores = cands.scores
            keep = [keep[j] for j in mmr(sub, [scores[i] for i in keep], vecs.get, limit, dv.mmr_lambda)]
        return cands.keep(keep), dropped

    def _semantic_floor(self, prof: Profile, ctx: QueryContext, engine: Any, lists: dict[str, RankedList]
                        ) -> tuple[dict[str, RankedList], str | None, dict[str, float], str | None]:
        """Raw cosine of every candidate (dense scores, or `vector_score` for the others): the
        out-of-domain gates (the floor, then the domain check), then the per-candidate minimum. For
        the floor alone a non-empty dense list suffices: it holds the best cosines of the whole
        (filtered) index, so no other candidate can score above its top. A query whose words, as
        analysed, run inside the title of one of the top TITLE_CHECK candidates names something the
        index holds ("fixed point": "Brouwer fixed point theorem"): short queries like that embed
        far from any document, and no gate rejects them. A candidate without a vector is never
        judged by a cosine rule: it is kept whatever the floors say. Returns the lists, the
        out-of-domain reason (or None), the cosines it knows, and the title a rejected query names
        (or None)."""
        cos: dict[str, float] = dict(lists["dense"].items()) if "dense" in lists else {}
        others = list(dict.fromkeys(i for rl in lists.values() for i in rl.ids if i not in cos))
        filled = False
        if others and (prof.min_semantic is not None or not cos):
            cos.update(engine.vector_score(ctx.vector, others))
            filled = True
        best = max(cos.values(), default=float("-inf"))
        reason = None
        if prof.semantic_floor is not None and best < prof.semantic_floor:
            shown = "no candidate has a vector" if best == float("-inf") else f"best cosine {best:.3f}"
            reason = f"out of domain: no candidate reaches the semantic floor {prof.semantic_floor} ({shown})"
        elif prof.domain_check is not None and cos and best < prof.domain_check:
            outside = self._outside(engine, ctx.vector, ctx.filters)
            if outside is not None:
                reason = (f"out of domain: best cosine {best:.3f} is below {prof.domain_check} and the query "
                          f"lies farther from the index's centroid than any of its documents ({outside})")
        named = self._named_title(ctx.text, engine, lists) if reason is not None else None
        if named is not None:
            reason = None
        if reason is not None:
            if others and not filled:
                cos.update(engine.vector_score(ctx.vector, others))
            unvectored = [i for i in others if i not in cos]
            if not unvectored:
                return {c: RankedList.of(c, [], []) for c in lists}, reason, cos, None
            keep = set(unvectored)  # what no cosine can judge stays
            kept = {c: RankedList.of(c, *unzip([(i, x) for i, x in rl.items() if i in keep]))
                    for c, rl in lists.items()}
            return kept, None, cos, None
        if prof.min_semantic is not None:
            floor = prof.min_semantic
            lists = {c: RankedList.of(c, *unzip([(i, x) for i, x in rl.items() if cos.get(i, floor) >= floor]))
                     for c, rl in lists.items()}
        return lists, None, cos, named

    @staticmethod
    def _named_title(query: str, engine: Any, lists: Mapping[str, RankedList]) -> str | None:
        """The first title, among the top TITLE_CHECK candidates of each list, inside which the
        query's analysed words run in order (None: no such title)."""
        an = default_analyzer()
        words = an.analyze(query)
        if not words:
            return None
        ids = list(dict.fromkeys(i for rl in lists.values() for i in rl.ids[:TITLE_CHECK]))
        phrase = " " + " ".join(words) + " "
        infos = engine.doc_info(ids)
        for i in ids:
            if i in infos and phrase in " " + " ".join(an.analyze(infos[i].title)) + " ":
                return infos[i].title
        return None

    def _outside(self, engine: Any, vec: Any, filters: Filters | None) -> str | None:
        """Why the query vector lies outside the index (cosine with the centroid of its vectors
        below that of every sampled document), or None; None too for an index of fewer than
        DOMAIN_MIN_VECTORS vectors, too few to place a centroid. Only the documents of the licences
        the search may see count (the caller's rights, narrowed by a licence filter), so a
        document the caller may not see never decides whether a query is in the domain. The
        centroid and that edge come from HYBRIDSEARCH_DOMAIN_SAMPLE stored vectors: measured by
        the first search that needs them (or `measure_domain`), which searches with the same
        licences wait for; then measured again in the background, while searches use the last
        measure, once the index has grown or shrunk by a tenth, and every DOMAIN_RESAMPLE_S
        seconds while the sample falls short of the index (vectors still being embedded, or
        documents the search may not see); a measure that failed is tried again after
        DOMAIN_RESAMPLE_S."""
        if not isinstance(engine, VectorSampling):  # checked apart: `engine` stays a whole Reader
            return None
        known = self._domain(engine, filters)
        if known.centroid is None:
            return None
        at = float(np.asarray(vec) @ known.centroid)
        return f"cosine with the centroid {at:.3f} < {known.edge:.3f}" if at < known.edge else None

    def measure_domain(self, rights: Collection[str]) -> None:
        """Measure the domain check's centroid for a caller with `rights` over every knowledge
        base, so that no search waits for it (the service does this before it is ready). A measure
        that fails is logged, and the first search that needs it takes it."""
        if isinstance(self.engine, VectorSampling):
            try:
                self._domain(self.engine, visible(None, rights))
            except HybridSearchError as e:
                _log.warning("domain check: measuring the index failed (%s); the first search that needs it "
                             "measures it", e)

    def _domain(self, engine: Any, filters: Filters | None) -> _Domain:
        """The last measure of the index for these licences; the first is taken here (searches
        with the same key wait for it, others go on), later ones in the background when due (see
        `_outside`). At most DOMAIN_KEYS are kept, the one used longest ago dropped first."""
        count = int(engine.count())
        licences = tuple(sorted(filters.license)) if filters is not None and filters.license else None
        key = (tuple(sorted(engine.engines)) if isinstance(engine, MultiEngine) else id(engine), licences)
        mine: Future[_Domain] = Future()  # this search's first measure, if it takes it
        with self._domain_lock:
            known, pending = self._domains.get(key), self._measuring.get(key)
            now = time.monotonic()
            if known is None and pending is None:
                self._measuring[key] = mine
            elif known is not None and pending is None and not self._closed and now >= known.retry_at and (
                    abs(count - known.chunks) * 10 > known.chunks
                    or (known.sampled < min(count, known.asked) and now - known.at >= DOMAIN_RESAMPLE_S)):
                if self._domain_pool is None:
                    self._domain_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="domain")
                self._measuring[key] = self._domain_pool.submit(self._remeasure, key, engine, licences, count)
            if known is not None:
                self._domains[key] = self._domains.pop(key)  # used last: dropped last
                return known
        if pending is not None:
            try:
                return pending.result()
            except CancelledError:  # a background measure the closing searcher dropped
                raise EngineUnavailableError("the searcher is closing") from None
        try:
            known = _measure(engine, licences, count)
        except BaseException as e:
            with self._domain_lock:
                del self._measuring[key]
            mine.set_exception(e)
            raise
        with self._domain_lock:
            self._keep(key, known)
        mine.set_result(known)
        return known

    def _keep(self, key: Any, measure: _Domain) -> None:
        """Store the measure taken for `key` (under the lock) in place of the one under way, dropping
        the ones used longest ago beyond DOMAIN_KEYS."""
        del self._measuring[key]
        self._domains.pop(key, None)
        self._domains[key] = measure
        while len(self._domains) > DOMAIN_KEYS:
            del self._domains[next(iter(self._domains))]

    def _remeasure(self, key: Any, engine: Any, licences: tuple[str, ...] | None, count: int) -> _Domain:
        """A later measure, in the background. On failure the last one stays, to be tried again
        after DOMAIN_RESAMPLE_S; the failure is raised only to a search waiting for a key dropped
        meanwhile, which has no last measure."""
        try:
            fresh = _measure(engine, licences, count)
        except Exception as e:
            _log.warning("domain check: measuring the index again failed (%s); searches keep the last measure, "
                         "and it is tried again in %.0f s", e, DOMAIN_RESAMPLE_S)
            with self._domain_lock:
                del self._measuring[key]
                last = self._domains.get(key)
                if last is None:
                    raise
                last = self._domains[key] = last._replace(retry_at=time.monotonic() + DOMAIN_RESAMPLE_S)
            return last
        with self._domain_lock:
            self._keep(key, fresh)
        return fresh

    def _run_channels(self, prof: Profile, ctx: QueryContext, engine: Any) -> dict[str, RankedList]:
        specs = list(prof.channels.items())
        chans = [(name, self._channel(name, spec), spec.k) for name, spec in specs]
        try:
            if len(chans) == 1:
                name, ch, kk = chans[0]
                return {name: ch.retrieve(ctx, engine, kk)}
            if any(name == "dense" for name, _, _ in chans):
                _ = ctx.vector  # embed once, before the parallel calls
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="channel")
            futures = {name: self._pool.submit(ch.retrieve, ctx, engine, kk) for name, ch, kk in chans}
            return {name: f.result() for name, f in futures.items()}
        except HybridSearchError:
            raise
        except (ValueError, RuntimeError) as e:
            if self._closed:  # closed while this search ran: its pool is gone
                raise EngineUnavailableError("the searcher is closed") from e
            raise QueryError(f"search failed: {e}") from e

    def close(self) -> None:
        """Searches are refused from now on (EngineUnavailableError); a domain measure under way
        ends, and one not begun is dropped."""
        with self._domain_lock:
            self._closed, pool = True, self._domain_pool
        if self._pool is not None:
            self._pool.shutdown()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
            with self._domain_lock:
                self._measuring = {k: f for k, f in self._measuring.items() if not f.cancelled()}
        if self.query_log is not None:
            self.query_log.close()


def _explain(cands: Candidates) -> list[Hit]:
    """Per hit and channel: raw score, min-max normalised score and 1-based rank; its contributions
    and, after reranking, its components; the chain of facts that reached it, if symbolic expansion did."""
    per_channel: dict[str, dict[str, ChannelScore]] = {}
    for channel, rl in cands.lists.items():
        if not rl.scores:
            continue
        norm = minmax(dict(enumerate(rl.scores)))
        table: dict[str, ChannelScore] = {}
        for rank, (id_, s) in enumerate(rl.items(), 1):
            if id_ not in table:
                table[id_] = ChannelScore(s, norm[rank - 1], rank)
        per_channel[channel] = table
    return [Hit(c.id, c.score, rank, {ch: t[c.id] for ch, t in per_channel.items() if c.id in t}, c.contributions,
                components=c.components, via=cands.via.get(c.id, "")) for rank, c in enumerate(cands.items, 1)]


def _total(diag: dict[str, Any], t0: float, ctx: QueryContext) -> None:
    """The search's milliseconds, and those of embedding the query (inside the stage that first
    needed its vector), if it was embedded."""
    diag["ms"] = _ms(t0)
    if ctx.embed_ms is not None:
        diag["embed_ms"] = ctx.embed_ms


def _ties_by_id(rl: RankedList) -> RankedList:
    """A channel's list with equal scores ordered by id: engines order ties by where a document
    lies in the index, so the same content ingested in another order would rank otherwise."""
    return RankedList.of(rl.channel, *unzip(top_k(list(rl.items()), len(rl))))


def _ms(t: float) -> float:
    return round((time.perf_counter() - t) * 1000, 3)


def _check_finite(scores: Sequence[float], what: str) -> None:
    """Parameters that are finite but huge (bm25.k1 = 1e308, fuser weights of 1e308) can overflow
    a score: a search refuses to answer with one rather than rank by it."""
    if not all(math.isfinite(x) for x in scores):
        raise QueryError(f"these parameters make a {what} score overflow (not a finite number); use smaller "
                         "values (bm25.k1, role_boost, fuser weights)")
