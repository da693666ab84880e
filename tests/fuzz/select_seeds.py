#!/usr/bin/env python3
"""Picks a small seed corpus for tests/fuzz/corpus/ out of many candidate inputs.

    select_seeds.py CONTROL OUTCOMES COUNT

CONTROL is a libFuzzer merge control file (-merge=1 -merge_control_file=CONTROL): the candidate
files and, per file, the coverage edges it reaches ("COV <file> <pc> …"). OUTCOMES is the stderr of
`PHASEKV_FUZZ_STATS=each fuzz_cache <file> …`: per file, "Running: <file>" and then
"phasekv fuzz: input <combination> <count per outcome …>". Prints COUNT file names, one a line.

Edge coverage alone picks tiny inputs that each touch one more error path, and no input that
forks, fills a shared page and appends again. So the greedy cover first takes, for every stream
combination, every outcome the harness counts (copy on write, capacity_error, refused rollback,
top-k read …), preferring inputs that reach many of them; then it adds inputs by the edges they
add. Ties go to the shorter input.
"""
import os
import sys


def read_control(path):
    """The candidate files, and the edges each reaches."""
    lines = open(path).read().split("\n")
    count = int(lines[0])
    files = lines[2:2 + count]
    edges = {}
    for line in lines[2 + count:]:
        parts = line.split()
        if parts and parts[0] == "COV":
            edges[files[int(parts[1])]] = set(parts[2:])
    return files, edges


def read_outcomes(path):
    outcomes, current = {}, None
    for line in open(path, errors="replace"):
        if line.startswith("Running: "):
            current = line[len("Running: "):].strip()
        elif line.startswith("phasekv fuzz: input ") and current is not None:
            combination, *counts = line.split()[3:]
            outcomes[current] = {(combination, o) for o, n in enumerate(counts) if int(n) > 0}
            current = None
    return outcomes


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    files, edges = read_control(sys.argv[1])
    outcomes = read_outcomes(sys.argv[2])
    count = int(sys.argv[3])
    # Key candidates by base name: the two files may name one input through different directories.
    edges = {os.path.basename(f): e for f, e in edges.items()}
    outcomes = {os.path.basename(f): o for f, o in outcomes.items()}
    paths = {os.path.basename(f): f for f in files}
    candidates = sorted(set(edges) & set(outcomes))
    size = {f: os.path.getsize(paths[f]) for f in candidates}

    chosen, covered_outcomes, covered_edges = [], set(), set()
    while len(chosen) < count:
        def gain(f):
            return (len(outcomes[f] - covered_outcomes), len(edges[f] - covered_edges), -size[f])
        best = max((f for f in candidates if f not in chosen), key=gain, default=None)
        if best is None or gain(best)[:2] == (0, 0):
            break
        chosen.append(best)
        covered_outcomes |= outcomes[best]
        covered_edges |= edges[best]
    all_outcomes = set().union(*outcomes.values())
    all_edges = set().union(*edges.values())
    print(f"select_seeds: {len(chosen)} of {len(candidates)} inputs, {sum(size[f] for f in chosen)} bytes: "
          f"{len(covered_outcomes)}/{len(all_outcomes)} (combination, outcome) pairs, "
          f"{len(covered_edges)}/{len(all_edges)} edges", file=sys.stderr)
    for f in chosen:
        print(paths[f])


if __name__ == "__main__":
    main()
