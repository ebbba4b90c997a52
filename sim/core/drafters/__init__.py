"""Drafters, one registry (registry.py): the exact n-gram lookup (ngram.py; its torch form ngram_torch.py), the model
drafter (a synthetic profile or recorded drafts, model.py), the suffix tree (suffix.py), their calibrators, settings
(settings.py) and the draft tables every engine step reads (tables.py, stream.py, cache.py)."""

# The drafters a run enables unless it says otherwise (--drafters), in registry order: the model drafter, then the
# n-gram lookup. Here, not in registry.py, so that a module that needs only the names (the vLLM plugin, through
# sim/core/policies/hybrid.py) loads none of the drafters.
DEFAULT_DRAFTERS = ("dspark", "ngram")
