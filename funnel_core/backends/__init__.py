"""Where an index can live besides memory: :mod:`funnel_core.backends.milvus` (Milvus Lite or a
Milvus server), with the same query interface and results as the in-memory indexes."""
