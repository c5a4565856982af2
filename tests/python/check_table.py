"""The result table of the GPU check scripts (gpu_*.py): one row per check,
printed as it is added, rendered as markdown at the end, so that a run's log
and its summary say the same thing."""


class Table:
    def __init__(self, first="step"):
        self.head = (first, "check", "result", "detail")
        self.rows = []

    def add(self, what, check, ok, detail=""):
        """Records one check of `what` (a stage, step or model) and returns ok."""
        self.rows.append((what, check, "PASS" if ok else "FAIL", detail))
        print("%-4s %s: %s%s" % ("ok" if ok else "FAIL", what, check, (" (" + detail + ")") if detail else ""),
              flush=True)
        return ok

    def failed(self):
        return any(r[2] == "FAIL" for r in self.rows)

    def render(self):
        w = [max(len(r[i]) for r in self.rows + [self.head]) for i in range(4)]

        def line(r):
            return "| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |"

        return "\n".join([line(self.head), "|" + "|".join("-" * (x + 2) for x in w) + "|"] +
                         [line(r) for r in self.rows])

    def finish(self):
        """Prints the table and the run's RESULT line; returns the exit code (1: a check failed)."""
        print()
        print(self.render())
        print("\nRESULT: %s" % ("FAIL" if self.failed() else "PASS"))
        return 1 if self.failed() else 0
