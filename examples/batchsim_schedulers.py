"""Simulate one generated batch workload under two schedulers and compare their metrics.

The workload comes from the Lublin-Feitelson model (``hpcnb.batchsim.lublin_feitelson``),
is turned into rigid jobs and replayed on a 128-node machine under first-come-first-served
and EASY backfilling. Run it with ``python examples/batchsim_schedulers.py``.
"""

from __future__ import annotations

import argparse

from hpcnb.batchsim import Platform, jobs_from_swf, lublin_feitelson, make_scheduler, simulate

#: Metrics printed for each scheduler, in this order.
METRICS = ("jobs", "completed", "makespan", "mean_wait", "mean_bounded_slowdown", "utilization")


def compare(num_jobs: int, num_nodes: int, seed: int, schedulers: tuple[str, ...]) -> dict:
    """Simulate the same generated workload under each scheduler.

    Args:
        num_jobs: Jobs to generate.
        num_nodes: Machine size in nodes.
        seed: Seed of the workload generator.
        schedulers: Registered scheduler names.

    Returns:
        Scheduler name -> its metrics (``SimulationResult.metrics()``).
    """
    trace = lublin_feitelson(num_jobs, num_nodes, seed=seed)
    jobs = jobs_from_swf(trace, num_nodes).jobs
    platform = Platform(num_nodes)
    return {name: simulate(jobs, platform, make_scheduler(name)).metrics() for name in schedulers}


def main() -> None:
    """Parse the options, run the comparison and print one line per scheduler."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs to generate")
    parser.add_argument("--nodes", type=int, default=128, help="machine size")
    parser.add_argument("--seed", type=int, default=1, help="workload seed")
    args = parser.parse_args()
    results = compare(args.jobs, args.nodes, args.seed, ("fcfs", "easy"))
    print(f"Lublin-Feitelson workload: {args.jobs} jobs on {args.nodes} nodes (seed {args.seed})")
    widths = [max(len(m), 10) + 2 for m in METRICS]
    print(f"{'scheduler':<10}" + "".join(f"{m:>{w}}" for m, w in zip(METRICS, widths, strict=True)))
    for name, metrics in results.items():
        cells = (f"{metrics[m]:>{w}.6g}" for m, w in zip(METRICS, widths, strict=True))
        print(f"{name:<10}" + "".join(cells))
    fcfs, easy = results["fcfs"]["mean_wait"], results["easy"]["mean_wait"]
    if fcfs > 0:
        print(f"EASY backfilling changes the mean wait by {100 * (easy - fcfs) / fcfs:+.1f} %")


if __name__ == "__main__":
    main()
