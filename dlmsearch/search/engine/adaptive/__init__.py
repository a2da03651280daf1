"""Adaptive KV caches as layerwise cache policies (``cache=dllm_cache|d2cache|elastic|dkv``): each
decides per layer and per row which columns to recompute (``layer_rules`` for what they share)."""

from dlmsearch.search.engine.adaptive.d2cache import D2Cache
from dlmsearch.search.engine.adaptive.dkv_cache import DKVCache
from dlmsearch.search.engine.adaptive.dllm_cache import DLLMCache
from dlmsearch.search.engine.adaptive.elastic_cache import ElasticCache

ADAPTIVE_POLICIES = (DLLMCache, D2Cache, ElasticCache, DKVCache)
