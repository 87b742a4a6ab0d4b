"""The ``pyro-gpn compare`` subcommand: its options come from :class:`RouteBudget`'s fields."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..options import HelpFormatter, add_options, from_args, nonnegative_int, positive_int
from ..runs import machine_description, write_atomically
from .runners import compare_routes
from .settings import ROUTES, RouteBudget

__all__ = [
    "ROUTE_START_OPTIONS",
    "add_compare_parser",
    "add_route_start_arguments",
    "route_start_settings",
    "run_compare_cli",
]

#: the :class:`RouteBudget` fields that set how the gradient-trained routes start
ROUTE_START_OPTIONS = ("vgpn_lr_decay", "vgpn_targets_init", "targets_init")


def add_route_start_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of :data:`ROUTE_START_OPTIONS` (``--vgpn-lr-decay``,
    ``--vgpn-targets-init``, ``--targets-init``) with :class:`RouteBudget`'s defaults; read them
    back with :func:`route_start_settings`. Used by ``benchmarks/compare_routes.py``."""
    add_options(parser, RouteBudget, ROUTE_START_OPTIONS)


def route_start_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`RouteBudget` fields set by :func:`add_route_start_arguments`."""
    return {name: getattr(args, name) for name in ROUTE_START_OPTIONS}


def add_compare_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``compare`` subcommand (``func=run_compare_cli``) on ``subparsers``."""
    parser = subparsers.add_parser(
        "compare",
        help="fit one regression set with every inference route and compare them",
        description=(
            "Fit a regression data set with NUTS (non-parametric GPN and sampled-U GPN), SVI "
            "(parametric GPN), the central-limit GPN and the variational GPN (Trace_ELBO and "
            "closed-form ELBO); write a markdown table of test RMSE, log-likelihood, 90 % "
            "coverage and wall time (and NUTS diagnostics), their az.compare ranking and a plot."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--dataset", default="synthetic", help="'synthetic' (1-D sin with a gap) or a UCI name"
    )
    parser.add_argument("--split", type=nonnegative_int, default=0, help="UCI train/test split")
    parser.add_argument("--n-train", type=int, default=60, help="synthetic training rows")
    parser.add_argument("--n-test", type=int, default=100, help="synthetic test rows")
    parser.add_argument(
        "--routes", nargs="+", choices=ROUTES, default=list(ROUTES), help="routes to run"
    )
    parser.add_argument("--sizes", type=positive_int, nargs="*", default=[4], help="hidden widths")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="seed of every route")
    group = parser.add_argument_group("route budget (RouteBudget)")
    # the NUTS routes sample a single GPN layer unless --nuts-sizes / --sampled-u-sizes is given
    # (RouteBudget's None would give them the common --sizes)
    add_options(group, RouteBudget, defaults={"nuts_sizes": (), "sampled_u_sizes": ()})
    parser.add_argument("--grid-size", type=int, default=200, help="plot grid points (1-D data)")
    parser.add_argument("--out", default="pyro-gpn-compare", help="output folder")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.set_defaults(func=run_compare_cli)


def run_compare_cli(args: argparse.Namespace) -> int:
    """Run ``pyro-gpn compare``: writes ``<out>/compare.md`` (and ``compare.png``), returns 0."""
    from ...data import load_dataset, synthetic_1d

    if args.dataset == "synthetic":
        data = synthetic_1d(args.n_train, args.n_test, seed=args.seed)
    else:
        data = load_dataset(args.dataset, seed=args.seed, split=args.split)
    budget = from_args(RouteBudget, args)
    result = compare_routes(
        data, args.routes, args.sizes, args.seed, budget, args.grid_size, verbose=True
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = getattr(args, "command", None)
    text = [
        f"# Route comparison on {result.dataset}",
        "",
        f"- data: {result.description}",
        f"- command: `{command}`" if command else "- command: (library call)",
        f"- machine: {machine_description()}; seed {result.seed}; hidden widths "
        f"{list(result.sizes)}",
        f"- budget: `{asdict(budget)}`",
        "",
        result.to_markdown(),
        "",
    ]
    if sum(r.pointwise_log_lik is not None for r in result.routes) >= 2:
        table = result.elpd_comparison()
        text += [
            "Routes ranked by test elpd (`az.compare` of the pointwise test log predictive "
            "densities, original units; `dse`: standard error of the difference to the best "
            "route; `weight`: stacking):",
            "",
            "| route | rank | test elpd | elpd_diff | dse | weight |",
            "| --- | --- | --- | --- | --- | --- |",
            *(
                f"| {name} | {int(row['rank'])} | {row['elpd_loo']:.3f} | "
                f"{row['elpd_diff']:.3f} | {row['dse']:.3f} | {row['weight']:.3f} |"
                for name, row in table.iterrows()
            ),
            "",
        ]
    write_atomically(out / "compare.md", "\n".join(text))
    print(f"table: {out / 'compare.md'}")
    if not args.no_plot:
        import matplotlib

        matplotlib.use("Agg")
        from ...plotting import plot_comparison

        fig = plot_comparison(result)
        fig.savefig(out / "compare.png", dpi=110)
        print(f"plot: {out / 'compare.png'}")
    return 0
