"""Facts (subject, relation, object) for symbolic expansion, from a unit's own fields.

A unit's facts are those given explicitly under `metadata.facts`, and those these rules read:

- condition: every clause "<something> is/are [a|an|the] <phrase>" gives
  (title, requires, <phrase>): "X is a normal space" under Tietze's theorem gives
  (Tietze extension theorem, requires, normal space);
- procedure: every step "use|apply|compute|choose|take|find|construct [the|a|an] <phrase>" gives
  (title, uses, <phrase>), and the claim rules apply to each step;
- claim (the text): "<A> implies|is equivalent to|generalizes|is a special case of|follows from|
  depends on|requires|uses|applies|extends <B>" gives (A, relation, B) unless negated ("does not
  imply"), with "it", "this" or "the proof" as A meaning the title; and a definition,
  "<title> is a|an <B>", gives (title, is_a, B).

A phrase is at most MAX_WORDS words, cut where a clause or a prepositional phrase other than
"of" starts ("X is a vector space over R, equipped with ..." gives "vector space"). Phrases are
compared as analysed token sets (`node_key`), so notation and inflection variants meet.
"""

from __future__ import annotations

import re
from functools import lru_cache

from hybridsearch.analysis import default_analyzer
from hybridsearch.models import Document, Fact

MAX_WORDS = 6
# words that end a phrase: clause openers, conjunctions, and prepositions other than "of"
_STOP = frozenset({"to", "for", "in", "on", "with", "by", "from", "under", "over", "at", "into", "onto", "when",
    "if", "where", "which", "that", "whose", "who", "and", "or", "but", "so", "since", "because", "as", "via",
    "then", "than", "while", "such", "together", "equipped", "called", "satisfying", "obeying", "given", "using",
    "whenever", "provided", "unless", "is", "are", "was", "were", "be", "has", "have", "can", "may", "must"})
_NEGATIONS = frozenset(["not", "never", "no", "cannot"])
_DETERMINERS = frozenset(["a", "an", "the", "every", "each", "any", "all", "some", "its", "their", "this", "these"])
_SELF = frozenset({"it", "this", "proof", "result", "theorem", "lemma"})  # after determiners drop
_CLAIM = [
    (re.compile(r"\b(?:implies|imply|entails)\b", re.I), "implies"),
    (re.compile(r"\b(?:is|are) equivalent to\b", re.I), "equivalent_to"),
    (re.compile(r"\bgenerali[sz]es\b", re.I), "generalizes"),
    (re.compile(r"\b(?:is|are) (?:a |the )?special cases? of\b", re.I), "special_case_of"),
    (re.compile(r"\bfollows? from\b", re.I), "follows_from"),
    (re.compile(r"\bdepends? on\b", re.I), "depends_on"),
    (re.compile(r"\brequires?\b", re.I), "requires"),
    (re.compile(r"\b(?:uses|applies)\b", re.I), "uses"),
    (re.compile(r"\bextends\b", re.I), "extends"),
]
_DEFINITION = re.compile(r"\b(?:is|are) (?:an?|the) ", re.I)
_CONDITION = re.compile(r"\b(?:is|are) (?:an?\s+|the\s+)?", re.I)
_STEP = re.compile(r"\b(?:use|apply|compute|choose|take|find|construct)\s+(?:the\s+|an?\s+)?", re.I)
_SENTENCES = re.compile(r"(?<=[.;:!?])\s+|\n+")
_CLAUSES = re.compile(r";|\.\s|\band\b|\bthen\b", re.I)
_WORD = re.compile(r"[^\s,;:()\[\]]+")


@lru_cache(maxsize=100_000)
def node_key(phrase: str) -> frozenset[str]:
    """A phrase as the set of its analysed tokens of two or more characters (variables such as
    "X" drop out): the form facts, titles and queries are compared in. Memoised: the closure
    compares the same phrases at every hop."""
    return frozenset(t for t in default_analyzer().analyze(phrase) if len(t) > 1)


def facts_of(doc: Document) -> list[Fact]:
    """The unit's explicit facts, then those the rules above read, without repeats."""
    title = doc.title.strip()
    out = list(doc.facts)
    if title:
        for clause in _CLAUSES.split(doc.condition):
            m = _CONDITION.search(clause)
            if m:
                _add(out, title, "requires", _phrase(clause[m.end():]))
        for step in _SENTENCES.split(doc.procedure):
            for m in _STEP.finditer(step):
                _add(out, title, "uses", _phrase(step[m.end():]))
    for text in (doc.text, doc.procedure):
        for sentence in _SENTENCES.split(text):
            out.extend(_claim_facts(sentence, title))
    seen: set[tuple[frozenset[str], str, frozenset[str]]] = set()
    unique = []
    for f in out:
        key = (node_key(f.subject), f.relation, node_key(f.object))
        if key not in seen and key[0] and key[2] and key[0] != key[2]:
            seen.add(key)
            unique.append(f)
    return unique


def _claim_facts(sentence: str, title: str) -> list[Fact]:
    out: list[Fact] = []
    for pattern, relation in _CLAIM:
        for m in pattern.finditer(sentence):
            # the clause the verb is in: "Even when X is not compact, T requires Y" is T's claim
            clause = re.split(r"[,;:()]", sentence[:m.start()])[-1]
            words = re.findall(r"[\w']+", clause.lower().replace("\u2019", "'"))
            # "does not (necessarily) imply", "doesn't imply", "can't imply": a negated claim states no fact
            if _NEGATIONS.intersection(words[-6:]) or any(w.endswith("n't") for w in words[-6:]):
                continue
            subject = _phrase(sentence[:m.start()], backwards=True)
            if subject.lower() in _SELF or (words and all(w in _SELF or w in _DETERMINERS for w in words)):
                subject = title  # "it", "this", "the proof": the unit itself
            elif not subject and sentence[:m.start()].strip():
                continue  # the subject was cut away ("..., which implies", "does not, in general, imply")
            elif not subject:
                subject = title  # the verb opens the sentence: "Requires a normal space."
            _add(out, subject, relation, _phrase(sentence[m.end():]))
    d = _DEFINITION.search(sentence)
    if title and d and node_key(sentence[:d.start()]) == node_key(title):
        _add(out, title, "is_a", _phrase(sentence[d.end():]))
    return out


def _phrase(text: str, *, backwards: bool = False) -> str:
    """The noun phrase at the start of `text` (or at its end, backwards): words up to the first
    phrase-ending word or punctuation, at most MAX_WORDS, leading determiners dropped."""
    if backwards:
        words = _WORD.findall(re.split(r"[,;:()]", text)[-1])[::-1]
    else:
        words = _WORD.findall(re.split(r"[,;:()]|\.(?:\s|$)", text, maxsplit=1)[0])
    kept: list[str] = []
    for w in words:
        if w.lower() in _STOP or len(kept) == MAX_WORDS:
            break
        kept.append(w)
    if backwards:
        kept.reverse()
    while kept and kept[0].lower() in _DETERMINERS:
        kept.pop(0)
    return " ".join(kept).rstrip(".")


def _add(out: list[Fact], subject: str, relation: str, obj: str) -> None:
    if subject.strip() and obj.strip():
        out.append(Fact(subject.strip(), relation, obj.strip()))
