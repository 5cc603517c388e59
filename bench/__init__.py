"""Every benchmark, sweep and random-weight model fixture of Infernix (`infernix bench ...`: each
writes JSON; docs/benchmarks.md holds results). It imports the product (services/, shared/,
kernels/); the product imports none of it, except services/cli.py adding the `infernix bench ...`
commands from bench/cli.py."""
