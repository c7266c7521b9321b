"""``dacflnode data``: look at a device's own data (``check``) and write per-device folders for
a rehearsal (``split``). See docs/data.md."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import yaml

from dacflnode.cli.errors import config_errors
from dacflnode.config.own_data import MISSING, parse_categories
from dacflnode.config.run_file import read_yaml_file
from dacflnode.errors import ConfigError

_OWN_DATASETS = ("folder", "table", "python")

# the settings `data check` reads from a --config file (top level, or a peers file's run: and
# node: sections); flags of the same names override them
_CHECK_KEYS = ("dataset", "classes", "label_column", "image_size", "channels", "resize",
               "holdout", "seed", "data_factory", "test_root", "bad_files", "categories",
               "other_category", "missing")
# without --config, the image shape comes from the first image, not from these defaults
_SHAPE_KEYS = ("image_size", "channels", "resize")


def _run_defaults(with_shape: bool) -> dict[str, Any]:
    """The run settings' defaults (those of _CHECK_KEYS the schema declares): what a setting
    left out is on a node (the holdout, the seed, ...); ``with_shape``: the image shape's too."""
    from dacflnode.config import RunConfig
    from dacflnode.config.schema import fields_of

    return {d.name: d.default for d in fields_of(RunConfig)
            if d.name in _CHECK_KEYS and d.name != "dataset" and d.default is not None
            and (with_shape or d.name not in _SHAPE_KEYS)}


def _split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def _read_config(path: str) -> dict[str, Any]:
    data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping of option: value")
    merged: dict[str, Any] = {}
    for section in (data, data.get("run"), data.get("node")):
        if isinstance(section, dict):
            merged.update({k: v for k, v in section.items() if k in _CHECK_KEYS})
    if isinstance(merged.get("classes"), str):
        merged["classes"] = _split_list(merged["classes"])
    return merged


@contextmanager
def _progress(enabled: bool, what: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while files are decoded or written (a terminal only)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@click.group("data")
def data_cmd() -> None:
    """Check a device's own data, or split a data set into per-device folders.

    \b
    Examples:
      dacflnode data check /data/images --classes cat,dog --dataset folder
      dacflnode data check /data/images --config run.yaml --json
      dacflnode data split fashion-mnist --nodes 3 --partition dirichlet --out devices
    """


@data_cmd.command("check")
@click.argument("path", metavar="PATH")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="Run config (or peers file) naming dataset, classes, label_column, "
                   "image_size, channels, resize, holdout, test_root; flags override it, "
                   "and what it leaves out takes the run's default.")
@click.option("--dataset", type=click.Choice(_OWN_DATASETS),
              help="The form of the data. [default: folder for a folder of class subfolders, "
                   "table for CSV/Parquet]")
@click.option("--classes", metavar="NAME,...",
              help="The run's ordered class list. [default: the folder names, or the table's "
                   "label values, sorted]")
@click.option("--label-column", metavar="NAME", help="A table's label column.")
@click.option("--missing", type=click.Choice(MISSING),
              help="A table's missing cells: fail, drop (leave the rows out) or mean (kept for "
                   "the network's mean). [default: fail]")
@click.option("--other-category/--no-other-category", default=None,
              help="Put a table's values that categories does not list into column=<other>.")
@click.option("--image-size", type=click.IntRange(min=1), help="Side images are resized to.")
@click.option("--channels", type=click.IntRange(1, 3), help="1 (grayscale) or 3 (RGB).")
@click.option("--resize/--no-resize", default=None,
              help="Resize images to image-size (off: another size is a problem).")
@click.option("--holdout", type=float, help="Fraction held out as test data without "
              "--test-root. [default: the run's, 0.2]")
@click.option("--seed", type=int, help="Seed of the held-out split.")
@click.option("--test-root", type=click.Path(), help="The device's test data, in PATH's form.")
@click.option("--data-factory", metavar="MODULE:FN", help="dataset python: the factory.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Cache the decoded images here (a node's state folder) [default: no cache].")
@click.option("--workers", type=click.IntRange(min=1), help="Decoding processes.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@config_errors
def check_cmd(path: str, config_file: str | None, as_json: bool, cache_dir: str | None,
              workers: int | None, **flags: Any) -> None:
    """Load PATH as a device would and report its shape, classes, counts and histogram; for a
    table, each column's type, range, missing cells and categories, and the categories block
    the run file needs.

    Every unreadable image is listed (not only the first five); a table's text column that
    categories does not list, and its missing cells under missing: fail, are reported as
    problems (a node refuses them). Exit code 1 when a problem is found, 2 for a setting or a
    file that stops the load (one line naming it).

    \b
    Examples:
      dacflnode data check devices/node-0 --config devices/run-data.yaml
      dacflnode data check data.csv --dataset table --label-column species --json
      dacflnode data check photos --classes cat,dog --channels 3 --image-size 64
    """
    from dacflnode.config import RunConfig
    from dacflnode.learning.owndata import load_local_data
    from dacflnode.learning.owndata.split import read_source
    from dacflnode.learning.owndata.tableprofile import check_plan
    from dacflnode.learning.owndata.tablescan import scan_table

    settings = _run_defaults(with_shape=bool(config_file))
    settings.update(_read_config(config_file) if config_file else {})
    settings.update({k: v for k, v in flags.items() if v is not None})
    if isinstance(settings.get("classes"), str):
        settings["classes"] = _split_list(settings["classes"])
    root = Path(path)
    dataset = settings.get("dataset") or ("folder" if root.is_dir() and not any(
        p.suffix.lower() in (".csv", ".parquet", ".pq") for p in root.iterdir()) else "table")
    if dataset not in _OWN_DATASETS:
        raise ConfigError("dataset", f"data check reads own data (folder, table or python), "
                                     f"got {dataset!r}")
    classes = settings.get("classes")
    inferred = not classes
    categories = parse_categories(settings.get("categories"))
    missing = str(settings.get("missing", "fail"))
    plan = None
    if dataset == "table":
        scan = scan_table(root, settings.get("label_column"), "data_root",
                          classes=None if inferred else classes, listed=categories or {})
        classes = list(scan.labels) if inferred else classes
        plan = check_plan(scan, categories, bool(settings.get("other_category")), missing)
        categories, missing = plan.categories, plan.missing
    elif inferred and dataset != "python":
        classes = list(read_source(str(root)).classes) if root.exists() else []
    shape = None  # without a run's settings: the first image's shape
    if dataset == "folder" and (settings.get("image_size") or settings.get("channels")):
        declared = RunConfig()  # what a run that leaves one out uses
        side = int(settings.get("image_size") or declared.image_size)
        shape = (int(settings.get("channels") or declared.channels), side, side)
    with _progress(not as_json, "decoding") as progress:
        data = load_local_data(
            dataset, root, classes=classes or [], input_shape=shape,
            resize=bool(settings.get("resize", True)),
            label_column=settings.get("label_column"), test_root=settings.get("test_root"),
            holdout=float(settings.get("holdout", 0.0) or 0.0), seed=int(settings.get("seed", 0)),
            cache_dir=cache_dir, on_bad="skip", workers=workers, progress=progress,
            factory=settings.get("data_factory"), categories=categories,
            other_category=bool(settings.get("other_category")), missing=missing,
        )
    problems = [f"{p}: {r}" for p, r in data.skipped_files]
    if data.skipped > len(problems):
        problems.append(f"... {data.skipped - len(problems)} more unreadable file(s)")
    problems += list(plan.problems) if plan is not None else []
    summary = data.summary()
    summary["classes_from"] = "data" if inferred else "settings"
    summary["problems"] = problems
    missing_classes = [c for c, n in data.histogram.items() if n == 0]
    summary["missing_classes"] = missing_classes
    if plan is not None:
        summary["columns"] = list(plan.columns)
        summary["categories"] = plan.suggested
    if as_json:
        click.echo(json.dumps(summary))
    else:
        _print_check(data, missing_classes, problems)
        _print_suggestions(data, inferred, plan, config_file)
    if problems:
        sys.exit(1)


def _flow(value: Any) -> str:
    """``value`` as one line of YAML (a list as ``[a, b]``)."""
    return str(yaml.safe_dump(value, default_flow_style=True, width=10**6)).strip()


def _print_check(data: Any, missing: list[str], problems: list[str]) -> None:
    shape = "x".join(str(s) for s in data.contract.input_shape)
    click.echo(f"{data.contract.form} {data.source}: {data.train_size} training samples, "
               f"input {shape}, {data.num_classes} classes")
    if data.contract.feature_names:
        names = list(data.contract.feature_names)
        from dacflnode.learning.owndata.tablescan import names_text

        click.echo(f"features ({len(names)}): {names_text(names, 12)}")
        click.echo(f"numeric features: {len(data.numeric_features)} of {len(names)} (the run's "
                   "scaling applies to them; one-hot features stay 0 or 1)")
    if data.dropped:
        click.echo(f"rows dropped for a missing cell: {data.dropped}")
    test = f"{data.test_size} test samples" + (f" ({data.test_source})" if data.test_source
                                               else "")
    click.echo(test)
    width = max(len("class"), *(len(c) for c in data.histogram))
    click.echo(f"{'class':<{width}}  {'train':>7}  {'test':>7}")
    for name, n in data.histogram.items():
        click.echo(f"{name:<{width}}  {n:>7}  {data.test_histogram[name]:>7}")
    if missing:
        click.echo(f"no samples of: {', '.join(missing)} (fine: a device may lack classes)")
    if data.from_cache:
        click.echo("decoded images read from the cache")
    for line in problems:
        click.echo(f"problem: {line}", err=True)
    if data.skipped:
        click.echo(f"{data.skipped} file(s) cannot be read; a node with bad_files: fail refuses "
                   "to start, with skip it leaves them out", err=True)


def _print_suggestions(data: Any, inferred: bool, plan: Any, config_file: str | None) -> None:
    """The table's columns, and the settings to give: the classes found (as the flag a flag
    user passes, as YAML for a run file) and the categories block (a mapping: no flag)."""
    if plan is not None:
        from dacflnode.learning.owndata.tableprofile import values_text

        rows = []
        for c in plan.columns:
            if c["type"] == "numeric":
                shown = "-" if c["min"] is None else f"{c['min']:.4g} .. {c['max']:.4g}"
            else:
                found = c["categories"] if c["type"] == "categorical" else c["values"]
                shown = f"{values_text(found)} ({len(found)})"
            rows.append((c["name"], c["type"], shown, str(c["missing"])))
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in
                  enumerate(("column", "type", "range / values found", "missing"))]
        for row in (("column", "type", "range / values found", "missing"), *rows):
            click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    if inferred:
        classes = list(data.contract.classes)
        how = (f"add to the run file: classes: {_flow(classes)}" if config_file else
               f"check against the run with --classes {','.join(classes)}")
        click.echo(f"classes from the data ({how})")
    if plan is not None and plan.suggested:
        where = (f"categories for {config_file}:" if config_file else
                 "categories has no flag (a mapping); add to the run file:")
        click.echo(where)
        click.echo("categories:")
        for name, values in plan.suggested.items():
            click.echo(f"  {_flow({name: values})[1:-1]}")


@data_cmd.command("split")
@click.argument("source", metavar="SOURCE")
@click.option("--nodes", type=click.IntRange(min=1), required=True, help="Number of devices.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="New (or empty) folder: OUT/<node-id>/ per node, OUT/test/ when SOURCE has a "
                   "test split.")
@click.option("--partition", "scheme", type=click.Choice(("iid", "shards", "dirichlet")),
              default="iid", show_default=True, help="How the samples are cut over the nodes.")
@click.option("--dirichlet-alpha", type=float, default=0.5, show_default=True,
              help="Concentration of --partition dirichlet (smaller: more skewed).")
@click.option("--shards-per-node", type=int, default=2, show_default=True,
              help="Label shards per node of --partition shards.")
@click.option("--format", "fmt", type=click.Choice(("folder", "table")), default="folder",
              show_default=True, help="folder: OUT/<node-id>/<class>/<n>.png; table: "
                                      "OUT/<node-id>/data.csv.")
@click.option("--table-format", type=click.Choice(("csv", "parquet")), default="csv",
              show_default=True, help="File type of --format table.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the partition.")
@click.option("--data-root", type=click.Path(),
              help="Where a built-in data set's files are (as the run setting data_root).")
@click.option("--classes", metavar="NAME,...",
              help="Class order of a folder or table SOURCE [default: sorted names].")
@click.option("--label-column", metavar="NAME", help="A table SOURCE's label column "
                                                     "[default: label].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@config_errors
def split_cmd(source: str, nodes: int, out_dir: str, scheme: str, dirichlet_alpha: float,
              shards_per_node: int, fmt: str, table_format: str, seed: int,
              data_root: str | None, classes: str | None, label_column: str | None,
              as_json: bool) -> None:
    """Write one device folder per node from SOURCE: a built-in data set (fashion-mnist,
    mnist, cifar10, synthetic), a folder of class subfolders, or a CSV/Parquet table.

    Nodes are node-0 ... node-{N-1}, as `dacflnode topology` names them, so
    `--data-root OUT` gives every node its folder. OUT/run-data.yaml holds the run settings
    (dataset, classes, ...) that read the result. OUT must be new or empty.

    \b
    Examples:
      dacflnode data split fashion-mnist --nodes 3 --partition dirichlet --out devices
      dacflnode data split photos --nodes 4 --partition shards --out lab --json
      dacflnode data split iris.csv --label-column species --nodes 3 --format table \\
          --out tables
    """
    from dacflnode.learning.owndata.split import split_data

    with _progress(not as_json, "writing") as progress:
        result = split_data(
            source, out_dir, nodes=nodes, scheme=scheme, seed=seed, alpha=dirichlet_alpha,
            shards_per_node=shards_per_node, fmt=fmt, table_format=table_format,
            data_root=data_root, classes=_split_list(classes), label_column=label_column,
            progress=progress,
        )
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    width = max(len(n) for n in result.nodes)
    for node, counts in zip(result.nodes, result.counts, strict=True):
        held = ", ".join(f"{c}:{n}" for c, n in counts.items() if n)
        click.echo(f"{node:<{width}}  {sum(counts.values()):>6}  {held}")
    if result.test_count:
        click.echo(f"{'test':<{width}}  {result.test_count:>6}")
    click.echo(f"wrote {len(result.nodes)} device folders to {result.out}; run settings in "
               f"{result.out / 'run-data.yaml'}", err=True)
