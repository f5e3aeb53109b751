"""Rows for the gate's hostile-input tests (tests/test_gate_cli.py, tests/test_gate.py,
tests/test_aggregation.py): small stores of three memories, and one wide store of N memories."""


def rows(n, start=0):
    return [{"id": i, "query": f"is thing {i} safe?",
             "memories": [f"thing {i} is safe", f"thing {i} is not safe", f"thing {i} is blue"]}
            for i in range(start, start + n)]


def wide(n):
    return {"id": "wide", "query": "is the wide thing safe?",
            "memories": [f"wide thing {j} is {'not ' * (j % 2)}safe" for j in range(n)]}
