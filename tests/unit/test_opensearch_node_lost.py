"""Which failed requests met a lost node (and are tried again on the others) and which did not
(and fail at once): error bodies as OpenSearch 2.19 answered them on a 3-node cluster whose cluster
manager was SIGKILLed, and ordinary errors."""

from __future__ import annotations

from hybridsearch.engines.opensearch.engine import node_lost

# a kNN search whose fetch phase met the killed node (HTTP 500)
FETCH_MET_LOST_NODE = {"root_cause": [], "type": "search_phase_execution_exception", "reason": "", "phase": "fetch",
                       "grouped": True, "failed_shards": [],
                       "caused_by": {"type": "node_not_connected_exception",
                                     "reason": "[cl1.2][127.0.0.1:45663] Node not connected"}}
# a shard failure in the query phase, carried in failed_shards
SHARD_ON_LOST_NODE = {"type": "search_phase_execution_exception", "reason": "all shards failed", "phase": "query",
                      "root_cause": [{"type": "exception", "reason": "x"}],
                      "failed_shards": [{"shard": 0, "index": "i-v1", "reason": {
                          "type": "no_shard_available_action_exception", "reason": "No shard available"}}]}
BAD_QUERY = {"type": "search_phase_execution_exception", "reason": "all shards failed", "phase": "query",
             "root_cause": [{"type": "query_shard_exception", "reason": "failed to create query"}],
             "failed_shards": [{"shard": 0, "reason": {"type": "query_shard_exception", "reason": "failed"}}]}


def test_a_request_that_met_a_lost_node() -> None:
    assert node_lost(500, FETCH_MET_LOST_NODE)
    assert node_lost(503, SHARD_ON_LOST_NODE)
    assert node_lost(500, SHARD_ON_LOST_NODE)
    assert node_lost(503, {"type": "cluster_block_exception"})  # no cluster manager yet: by its status
    assert node_lost(503, "No connection")  # a status alone
    assert node_lost(500, {"type": "x", "caused_by": {"type": "y", "caused_by": {"type": "node_closed_exception"}}})


def test_other_failures_are_not_tried_again() -> None:
    assert not node_lost(400, BAD_QUERY)
    assert not node_lost(500, BAD_QUERY)
    assert not node_lost(404, {"type": "index_not_found_exception"})
    assert not node_lost(429, {"type": "rejected_execution_exception"})  # the bulk path's own backoff
    assert not node_lost(500, None) and not node_lost("N/A", {})
