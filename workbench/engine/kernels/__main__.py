"""`python -m workbench.engine.kernels`: the probe, and the kernel each dtype picks."""

from workbench.engine.kernels.projections import main

main()
