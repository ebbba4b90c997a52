"""Drafters, one registry (registry.py): the exact n-gram lookup (ngram.py; its torch form ngram_torch.py), the model
drafter (a synthetic profile or recorded drafts, model.py), the suffix tree (suffix.py), their calibrators, settings
(settings.py) and the draft tables every engine step reads (tables.py, stream.py, cache.py)."""
