"""Query understanding: the intent of a query (RFC-0003 §4) and its focus, the part that names
what the query is about. Classifiers are plugins (group `hybridsearch.intents`, chosen by
HYBRIDSEARCH_INTENT_CLASSIFIER); `rules` is the default, a model can take its place."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, get_args, runtime_checkable

from pydantic import BaseModel, ConfigDict

from hybridsearch.analysis.normalize import unify_dashes
from hybridsearch.errors import QueryError

IntentName = Literal["lookup", "survey", "compare", "prereq", "related"]
INTENTS: tuple[str, ...] = get_args(IntentName)


@dataclass(frozen=True, slots=True)
class Intent:
    """`name`: one of INTENTS (lookup when nothing else fits). `focus`: the query without the
    phrase that signalled the intent ("what to read before the Gauss-Bonnet theorem" -> "the
    Gauss-Bonnet theorem"), the text that finds the seeds of citation expansion. `rule`: what
    decided it (the matched rule, "default", or "given" for an intent the caller named).
    `recency`: the phrase that asks for recent work ("latest", "in the last five years"), None
    when the query does not; it is independent of the intent ("a survey of recent advances")."""

    name: str
    focus: str
    rule: str
    recency: str | None = None


@runtime_checkable
class IntentClassifier(Protocol):
    name: ClassVar[str]

    def classify(self, query: str) -> Intent: ...


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w-])(?:" + "|".join(alternatives) + r")(?![\w-])", re.IGNORECASE)


# ordered: the first rule whose pattern occurs decides; its match is cut from the focus
_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("prereq", "read-before", _rx(
        # "what should I know about X" asks about X itself, not what comes before it
        r"what (?:should i|do i need to|to|must i|one should) (?:read|learn|know|study|understand)(?! about)"
        r"(?: first)?(?: before| for| to understand)?",
        r"(?:read|learn|study|know) (?:first )?before", r"before (?:reading|learning|studying|tackling)",
        r"what do i need before")),
    ("prereq", "prerequisites", _rx(
        r"(?:the )?prerequisites? (?:for|of|to)", r"(?:the )?background (?:needed|required|necessary|knowledge)?"
        r" ?(?:for|to understand|on)", r"what is needed to understand", r"groundwork for",
        r"foundations needed for", r"preliminaries (?:for|to)")),
    ("related", "similar", _rx(
        r"(?:(?:the )?(?:papers|results|theorems|work|works|statements|articles) )?(?:similar|analogous|related) to",
        r"(?:results|theorems|statements) (?:like|resembling)", r"related (?:work|results|theorems) (?:on|to|for)",
        r"(?:consequences|corollaries|applications|generali[sz]ations|variants|analogues|extensions) of",
        r"(?:statements|results|theorems|conditions) equivalent to", r"what else is like")),
    ("compare", "versus", _rx(
        r"vs\.?", r"versus", r"compared (?:with|to)", r"comparison (?:of|between)", r"differences? between",
        r"how does .{1,200}? differ from", r"differs? from", r"contrast(?:ed|ing)? (?:with|between)?",
        r"distinguish(?:ing)? between", r"(?:pros and cons|trade-?offs?) of")),
    ("survey", "overview", _rx(
        r"(?:(?:an?|the)(?: brief| short| quick| gentle| general)? )?(?:overview of|survey of|introduction to|"
        r"history of|review of)", r"foundational (?:results|papers|works|references|theorems)"
        r"(?: in| on| of)?", r"classic(?:al)? (?:results|papers|references) (?:in|on|of)",
        r"(?:the )?main (?:results|theorems|tools|methods|ideas|techniques) (?:of|in|for)",
        r"key (?:results|theorems|ideas) (?:of|in)", r"(?:landmark|seminal) (?:papers|results|works) (?:in|on|of)",
        r"(?:the )?different (?:notions|kinds|types) of")),
)
# asking for recent work, anywhere in the query: a word of recency with a noun for literature or
# results ("recent advances", "the latest papers", "state-of-the-art methods", "current research",
# "work from the last ten years"). Alone such words are content ("patients with recent infarction",
# "latest start time", "in the last 20 years mortality fell", "most recent common ancestor"), and so
# is a date; "new" is left out ("new findings suggest ..." states a claim).
_LITERATURE = (r"(?:advances|results|work|works|papers|articles|publications|literature|material|research|"
               r"developments|progress|findings|approaches|methods|techniques|surveys?|overviews?|trends)")
_RECENCY = _rx(
    r"(?:(?:the|most) )?(?:recent|latest|newest|up[- ]?to[- ]?date|state[- ]of[- ]the[- ]art) " + _LITERATURE,
    r"current (?:research|literature|work|developments|trends)",
    r"(?:the )?state of the art (?:in|of|on|for)",
    _LITERATURE + r" (?:from|in|of|over|during) the (?:last|past) (?:(?:few|several|two|three|four|five|ten|"
    r"twenty|\d+) )?(?:years|decades?)")
# a framing phrase opens the query ("results similar to X", after a courtesy such as "please
# list" or a question such as "which papers are"); inside a statement ("A is related to B", "the
# variants of p18 raise the risk") it is content.
# Comparisons count anywhere.
_COURTESY = re.compile(r"^(?:(?:please|kindly|(?:find|list|show(?: me)?|give(?: me)?|i (?:need|want)|"
                       r"can you (?:find|list|give me|show me)|recommend)(?: the| some| a| an| all)?|"
                       r"(?:what|which)(?: (?:papers|results|theorems|works|articles))? (?:are|is)"
                       r"(?: the| some| a| an)?)\s+)*", re.IGNORECASE)
_EDGE = re.compile(r"^[\s,;:.?!]+|[\s,;:.?!]+$")


class RulesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuleIntentClassifier:
    """Phrase rules in a fixed order (prereq, related, compare, survey), each but compare at the
    opening of the query; lookup otherwise. Deterministic and cheap (microseconds)."""

    name: ClassVar[str] = "rules"
    Config = RulesConfig

    def __init__(self, config: RulesConfig | None = None) -> None:
        self.config = config or RulesConfig()

    def classify(self, query: str) -> Intent:
        text = " ".join(unicodedata.normalize("NFKC", query).split())  # "ｖｓ" is "vs", "ﬁnd" "find"
        plain = unify_dashes(text)  # matched on: as long as text, whose words make the focus
        recent = _RECENCY.search(plain)
        recency = recent.group(0).lower() if recent is not None else None
        lead = _COURTESY.match(plain)
        opening = lead.end() if lead is not None else 0
        for intent, rule, pattern in _RULES:
            m = pattern.search(plain)
            if m is None or (intent != "compare" and m.start() > opening):
                continue
            if intent == "compare":  # "A vs B" keeps both sides: the focus is the whole query
                return Intent(intent, text, rule, recency)
            focus = _EDGE.sub("", text[m.end():])
            return Intent(intent, " ".join(focus.split()) or text, rule, recency)
        return Intent("lookup", text, "default", recency)


def given(query: str, name: str, classifier: IntentClassifier) -> Intent:
    """The intent a caller named (the HTTP `mode`, `--intent`): the classifier still finds the focus
    and whether the query asks for recent work."""
    if name not in INTENTS:
        raise QueryError(f"intent must be one of {', '.join(INTENTS)}, got {name!r}")
    found = classifier.classify(query)
    return Intent(name, found.focus, "given", found.recency)
