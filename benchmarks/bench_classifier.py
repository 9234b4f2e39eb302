"""Query classifier ("Searching for Best Practices in RAG", section 3.1): stratified 5-fold
cross-validated accuracy (and leave-one-task-type-out) on the packaged labelled set.

    nice -n 10 python benchmarks/bench_classifier.py      # writes benchmarks/results/query_classifier.json
"""

from __future__ import annotations

from common import parser, write_json

from funnel_core.best_practices.classify import QueryClassifier, load_labelled_queries


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rows = load_labelled_queries()
    cv = QueryClassifier().cross_validate([r["query"] for r in rows], [r["label"] for r in rows],
                                          folds=args.folds, seed=args.seed, groups=[r["task"] for r in rows])
    write_json("query_classifier", {
        "command": "python benchmarks/bench_classifier.py", "n_examples": len(rows),
        "n_task_types": len({r["task"] for r in rows}),
        "labels": {lab: sum(r["label"] == lab for r in rows) for lab in ("retrieval", "sufficient")}, **cv},
        args.out)


if __name__ == "__main__":
    main()
