"""Shared set-up for the example notebooks: offline settings and a small real corpus.

The notebooks use a few articles of SQuAD v1.1 (``<repo>/../shared/data/squad``, or the folder
named by ``FUNNEL_DATA``) when that data folder exists, and otherwise fall back to the short
built-in corpus below, so they run anywhere without a download.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
REPO = EXAMPLES.parent

# Run against this checkout even when funnel-rag is not installed.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from funnel_core.testing import offline_env  # noqa: E402
from funnel_core.units import Unit  # noqa: E402

offline_env()


@dataclass
class Question:
    question: str
    answers: list[str]
    title: str


def data_dir() -> Path | None:
    """``$FUNNEL_DATA`` or ``<repo>/../shared/data``; ``None`` when neither exists."""
    for cand in (os.environ.get("FUNNEL_DATA"), REPO.parent / "shared" / "data"):
        if cand and Path(cand).is_dir():
            return Path(cand)
    return None


# A few paragraphs (adapted from Wikipedia, CC BY-SA) used when the SQuAD file is not there.
BUILTIN = {
    "Normans": [
        "The Normans were the people who in the 10th and 11th centuries gave their name to "
        "Normandy, a region in France. They were descended from Norse raiders and pirates from "
        "Denmark, Iceland and Norway who, under their leader Rollo, agreed to swear fealty to "
        "King Charles III of West Francia.",
        "The Norman dynasty had a major political, cultural and military impact on medieval "
        "Europe and even the Near East. The Normans were famed for their martial spirit and "
        "eventually for their Christian piety, becoming exponents of the Catholic orthodoxy.",
        "In 1066 William, Duke of Normandy, invaded England and won the Battle of Hastings. "
        "The Norman conquest of England brought a new ruling class and the Norman language, "
        "which later influenced the English language.",
        "Norman adventurers founded the Kingdom of Sicily under Roger II after conquering "
        "southern Italy and Malta from the Saracens and Byzantines.",
    ],
    "Amazon rainforest": [
        "The Amazon rainforest is a moist broadleaf forest that covers most of the Amazon "
        "basin of South America. This basin encompasses seven million square kilometres, of "
        "which five and a half million square kilometres are covered by the rainforest.",
        "The majority of the forest is contained within Brazil, with 60% of the rainforest, "
        "followed by Peru with 13%, Colombia with 10%, and with minor amounts in Venezuela, "
        "Ecuador, Bolivia, Guyana, Suriname and French Guiana.",
        "The rainforest likely formed during the Eocene era. It appeared following a global "
        "reduction of tropical temperatures when the Atlantic Ocean had widened sufficiently "
        "to provide a warm, moist climate to the Amazon basin.",
        "Deforestation is the conversion of forested areas to non-forested areas. The main "
        "sources of deforestation in the Amazon are human settlement and development of the "
        "land, especially cattle ranching and soybean farming.",
    ],
    "Oxygen": [
        "Oxygen is a chemical element with symbol O and atomic number 8. It is a member of "
        "the chalcogen group on the periodic table and is a highly reactive nonmetal and "
        "oxidizing agent that readily forms compounds with most elements.",
        "Oxygen was discovered independently by Carl Wilhelm Scheele, in Uppsala, in 1773 or "
        "earlier, and Joseph Priestley in Wiltshire, in 1774. Antoine Lavoisier named the "
        "element oxygen in 1777.",
        "Photosynthesis releases oxygen into the atmosphere, while respiration and decay "
        "remove it. Oxygen makes up almost half of the Earth's crust in the form of oxides.",
        "Liquid oxygen is pale blue and strongly paramagnetic. It is used as an oxidizer in "
        "rocket engines, for example in the Space Shuttle main engines.",
    ],
}

BUILTIN_QUESTIONS = [
    Question("Who was the leader of the Norse raiders who settled in Normandy?", ["Rollo"], "Normans"),
    Question("In what year did William invade England?", ["1066"], "Normans"),
    Question("Which country contains most of the Amazon rainforest?", ["Brazil"], "Amazon rainforest"),
    Question("What are the main causes of Amazon deforestation?", ["cattle ranching"], "Amazon rainforest"),
    Question("Who named the element oxygen?", ["Antoine Lavoisier", "Lavoisier"], "Oxygen"),
    Question("What color is liquid oxygen?", ["pale blue"], "Oxygen"),
]


def load_corpus(n_articles: int = 4, questions_per_article: int = 2) -> tuple[list[Unit], list[Question], str]:
    """Paragraph-level documents, a few questions with gold answers, and where they came from.

    Each document is a ``Unit`` with ``metadata["title"]`` (its article) and ``"paragraph"``.
    """
    root = data_dir()
    squad = root / "squad" / "squad-v1.1-dev-a.json" if root else None
    if squad is not None and squad.exists():
        from funnel_core.evaluation import load_squad

        articles = load_squad(squad)[:n_articles]
        units = [Unit(id=f"{a.title}/{i}", text=p, level="document",
                      metadata={"title": a.title, "paragraph": i})
                 for a in articles for i, p in enumerate(a.paragraphs)]
        questions = []
        for a in articles:  # spread the picks over the article, deterministically
            step = max(1, len(a.questions) // questions_per_article)
            questions += [Question(q.question, q.answers, a.title)
                          for q in a.questions[::step][:questions_per_article]]
        return units, questions, f"SQuAD v1.1 dev-a, first {len(articles)} articles ({squad})"
    titles = list(BUILTIN)[:n_articles]
    units = [Unit(id=f"{t}/{i}", text=p, level="document", metadata={"title": t, "paragraph": i})
             for t in titles for i, p in enumerate(BUILTIN[t])]
    questions = [q for q in BUILTIN_QUESTIONS if q.title in titles]
    return units, questions, "built-in corpus (SQuAD data folder not found)"


def show_table(rows: list[dict], floatfmt: str = ".3f", max_width: int = 90) -> None:
    """Print ``rows`` (dicts with the same keys) as a plain-text table, no pandas needed."""
    if not rows:
        print("(no rows)")
        return
    cols = list(rows[0])

    def cell(v: object) -> str:
        s = format(v, floatfmt) if isinstance(v, float) else str(v)
        s = " ".join(s.split())
        return s if len(s) <= max_width else s[: max_width - 3] + "..."

    cells = [[cell(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
