"""Hyperdimensional computing: 4096-bit hypervectors, per-field encoders, Hamming scoring."""

from hybridsearch.hdc.algebra import DIM, NBYTES, TIE_BREAK, bind, bundle, hamming, random_hv, similarity
from hybridsearch.hdc.encoder import FIELDS, HdcEncoder, HdcWeights, combine, field_score, index_options

__all__ = ["DIM", "FIELDS", "NBYTES", "TIE_BREAK", "HdcEncoder", "HdcWeights", "bind", "bundle", "combine",
           "field_score", "hamming", "index_options", "random_hv", "similarity"]
