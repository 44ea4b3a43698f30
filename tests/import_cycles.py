"""The cycle search the import-graph tests share (tests/accounting, tests/pipelines)."""


def find_cycle(edges):
    """One cycle of the graph {node: nodes it points to} as a list of nodes ending where it
    starts, or None (depth-first search, nodes in sorted order)."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None
