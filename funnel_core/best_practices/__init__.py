"""Searching for Best Practices in Retrieval-Augmented Generation (Wang et al., 2024).

* :mod:`~funnel_core.best_practices.fusion`: hybrid search (section 3.4.3), alpha fusion and RRF;
* :mod:`~funnel_core.best_practices.hyde`: HyDE (Gao et al.), the dense side of "hybrid with HyDE";
* :mod:`~funnel_core.best_practices.repack`: repacking the final context (section 3.6);
* :mod:`~funnel_core.best_practices.compress`: extractive compression (section 3.7);
* :mod:`~funnel_core.best_practices.classify`: query classification, retrieve or not (section 3.1).
"""

from funnel_core.best_practices.classify import QueryClassifier, RetrievalGate
from funnel_core.best_practices.compress import ExtractiveCompressor
from funnel_core.best_practices.fusion import HybridRetrieve
from funnel_core.best_practices.hyde import HyDE, HyDERetrieve
from funnel_core.best_practices.repack import Repack

__all__ = ["ExtractiveCompressor", "HybridRetrieve", "HyDE", "HyDERetrieve", "QueryClassifier", "Repack", "RetrievalGate"]
