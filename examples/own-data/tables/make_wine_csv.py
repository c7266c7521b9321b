"""Write scikit-learn's bundled Wine data set (178 wines, 13 chemical measurements, 3 cultivars;
shipped with the package, no download) as one CSV file, the measurements as they are.

    python examples/own-data/tables/make_wine_csv.py runs/wine.csv [--json]

`dacflnode data split runs/wine.csv --label-column cultivar --format table ...` then cuts it into
one table per device (see README.md). The devices standardise the features themselves, with the
mean and standard deviation they agree on before the first round (the run setting ``scaling``):
nothing is scaled here.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from sklearn.datasets import load_wine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the CSV file to write")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    wine = load_wine()
    x = wine.data
    names = [n.replace("/", "_") for n in wine.feature_names]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*names, "cultivar"])
        for row, label in zip(x, wine.target, strict=True):
            writer.writerow([f"{v:g}" for v in row] + [wine.target_names[label]])
    if args.json:
        print(json.dumps({"path": str(args.out), "rows": len(x), "features": names,
                          "label_column": "cultivar", "classes": list(wine.target_names)}))
    else:
        print(f"{args.out}: {len(x)} rows, {len(names)} features, classes "
              f"{', '.join(wine.target_names)}")


if __name__ == "__main__":
    main()
