"""Write the Palmer penguins (344 penguins, 3 species; shipped offline by the `palmerpenguins`
package) as the tables of 3 devices, unequal in size and in their mix of islands, plus one test
table shared by every device.

    python examples/own-data/tables/penguins/make_devices.py runs/penguins [--json]

writes OUT/node-0/penguins.csv (mostly island Biscoe), OUT/node-1/penguins.csv (mostly Dream),
OUT/node-2/penguins.csv (mostly Torgersen) and OUT/test/penguins.csv (a fifth of the penguins,
drawn before the split). Every cell is written as the source has it: the text columns (island,
sex), the numbers, and the missing cells (NA), which the run leaves out (`missing: drop`).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import random
import sys
from collections import Counter
from pathlib import Path

#: The device each island's penguins mostly go to.
HOME = {"Biscoe": 0, "Dream": 1, "Torgersen": 2}
DEVICES = 3
#: The share of a device's penguins from its home island; the others go to another device.
AT_HOME = 0.8
#: The share of all penguins held out as the shared test table.
TEST = 0.2
FILE = "penguins.csv"


def source_csv() -> Path:
    """The package's penguins.csv, found without importing the package (which imports pandas)."""
    spec = importlib.util.find_spec("palmerpenguins")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("make_devices.py: the palmerpenguins package is not installed: "
                 "pip install palmerpenguins (or pass --source FILE)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / FILE


def split(rows: list[dict[str, str]], seed: int) -> tuple[list[list[dict[str, str]]],
                                                          list[dict[str, str]]]:
    """The devices' rows and the test rows: a seeded shuffle, the first fifth for the test, then
    each penguin to its island's device with probability AT_HOME, else to one of the others."""
    rng = random.Random(seed)
    shuffled = rows[:]
    rng.shuffle(shuffled)
    cut = round(TEST * len(shuffled))
    test, rest = shuffled[:cut], shuffled[cut:]
    devices: list[list[dict[str, str]]] = [[] for _ in range(DEVICES)]
    for row in rest:
        home = HOME[row["island"]]
        if rng.random() >= AT_HOME:
            home = rng.choice([d for d in range(DEVICES) if d != home])
        devices[home].append(row)
    return devices, test


def write(path: Path, header: list[str], rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write (OUT/node-<i>/, OUT/test/)")
    parser.add_argument("--source", type=Path, help="penguins.csv [the palmerpenguins package's]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split [0]")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    source = args.source or source_csv()
    with source.open(newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    devices, test = split(rows, args.seed)
    report = {"source": str(source), "rows": len(rows), "test": len(test), "devices": {}}
    for i, device in enumerate(devices):
        path = args.out / f"node-{i}" / FILE
        write(path, header, device)
        report["devices"][f"node-{i}"] = {
            "path": str(path), "rows": len(device),
            "islands": dict(sorted(Counter(r["island"] for r in device).items())),
            "species": dict(sorted(Counter(r["species"] for r in device).items())),
            "rows_with_na": sum(any(v == "NA" for v in r.values()) for r in device),
        }
    write(args.out / "test" / FILE, header, test)
    if args.json:
        print(json.dumps(report))
        return
    print(f"{source}: {len(rows)} penguins; {len(test)} in {args.out / 'test' / FILE}")
    for node, d in report["devices"].items():
        islands = ", ".join(f"{k} {v}" for k, v in d["islands"].items())
        species = ", ".join(f"{k} {v}" for k, v in d["species"].items())
        print(f"{node}: {d['rows']} rows ({islands}; {species}; {d['rows_with_na']} with NA)")


if __name__ == "__main__":
    main()
