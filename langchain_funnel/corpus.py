"""The user's documents as index units: what every retriever's ``from_documents`` indexes."""

from __future__ import annotations

from typing import Iterable

from langchain_core.documents import Document

from funnel_core.units import Unit, check_unique_ids, split_metadata

__all__ = ["units_from_documents"]


def units_from_documents(documents: Iterable[Document], level: str) -> list[Unit]:
    """Documents -> index units: ``Document.id`` as the id (positional for documents without
    one, as :meth:`from_texts` does); a duplicate id raises, as it does for ``from_texts``."""
    if isinstance(documents, Document):
        raise TypeError("documents must be a list of Documents, got a single Document; wrap it "
                        "in a list.")
    units = []
    for i, d in enumerate(documents):
        if not isinstance(d, Document):
            raise TypeError(f"expected langchain Documents, got {type(d).__name__} at position {i}.")
        user = split_metadata(d.metadata)[0]
        units.append(Unit(id=str(d.id) if d.id else str(i), text=d.page_content, metadata=user,
                          level=level))
    check_unique_ids(units)
    return units
